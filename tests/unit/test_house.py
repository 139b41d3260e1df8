"""The house's rules that a reader relies on, checked on the tree itself: the repository stands
alone (no file cites documents outside it), docs/architecture.md's module map names every module,
and rich is imported at run time by cluster/console/ alone."""
from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCES = [p for folder in ("cluster", "roles", "testbed", "tests", "benchmarks", "examples", "scripts", "docker", "docs")
           for p in (REPO / folder).rglob("*") if p.is_file() and p.suffix in (".py", ".md", ".sh", ".yaml", ".cfg")
           and "__pycache__" not in p.parts] + [REPO / "README.md", REPO / "setup.cfg"]
# The documents of the machines this project is developed on: not in a clone of the repository.
OUTSIDE = re.compile(r"TF-NOTES|\bLAB\.md|\bSLURM\.md|\bSTYLE\.md|\bDOCKER\.md|ARCHITECTURE\.md|/work/shared|\.\./shared/[A-Za-z-]+\.md")


def test_no_file_cites_a_document_outside_the_repository():
    cited = [f"{path.relative_to(REPO)}:{number}" for path in SOURCES if path.name != "test_house.py"
             for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1) if OUTSIDE.search(line)]
    assert cited == []


def test_the_module_map_names_every_module():
    text = (REPO / "docs" / "architecture.md").read_text()
    modules = [p for folder in ("cluster", "roles") for p in (REPO / folder).rglob("*.py")
               if p.name != "__init__.py" and "__pycache__" not in p.parts]
    missing = []
    for path in modules:
        relative = path.relative_to(REPO).as_posix()
        # a subpackage (cluster/transport/) may be named as a whole
        folder_named = any(f"`{parent.relative_to(REPO).as_posix()}/`" in text for parent in path.parents
                           if REPO in parent.parents and len(parent.relative_to(REPO).parts) >= 2)
        driver = path.parent.name == "roles" and path.name.endswith("_driver.py") and "roles/*_driver.py" in text
        if relative not in text and not folder_named and not driver:
            missing.append(relative)
    assert missing == []


def _runtime_imports(tree: ast.Module) -> set[str]:
    """Top-level module names imported outside ``if TYPE_CHECKING:`` blocks."""
    names: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return names


def test_rich_is_the_console_s_alone():
    users = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "cluster").rglob("*.py")
                   if "rich" in _runtime_imports(ast.parse(p.read_text())))
    assert users and all(user.startswith("cluster/console/") for user in users), users


def test_the_inventory_and_the_plan_import_no_threads():
    """Loading an inventory or planning starts nothing: no module of theirs imports threading
    (URL checks and masking live in cluster/urls.py, not in the threaded notifier)."""
    import subprocess
    import sys
    code = ("import sys; import cluster.inventory, cluster.inventory.patterns, cluster.plan; "
            "print(sorted(m for m in ('threading', 'queue', 'cluster.notify.notifier') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert "cluster.notify.notifier" not in out and "queue" not in out


# The rooms of cluster/ in the order they may import one another (docs/architecture.md, "Module map"):
# a module imports only modules of its own room or of rooms above it, with no exception (issue 43: the last
# three, lifecycle/ finding a job's supervisor in supervision/daemon.py, went with cluster/liveness.py).
# A room names entries of cluster/ (a module, or a package with every module in it).
ROOMS = [["contracts", "errors", "layout", "names", "fanout", "urls"], ["inventory"],
         ["plan", "secrets", "slurm_layout", "export"], ["jobrecord", "liveness", "events", "state"], ["transport", "hosts"],
         ["program"], ["history", "logs"], ["lifecycle"], ["supervision"],
         ["console", "notify", "tensorboard", "bench"], ["cli", "__main__"]]


def _imported_modules(path: Path, module: str) -> set[str]:
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            if node.module:
                found.add(".".join(base + [node.module]))
            else:
                found.update(".".join(base + [alias.name]) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


ROOM_OF = {name: index for index, names in enumerate(ROOMS) for name in names}


def _room_of(module: str) -> int | None:
    """The room of ``cluster.X`` or ``cluster.X.Y``: X's."""
    parts = module.split(".")
    return ROOM_OF.get(parts[1]) if len(parts) > 1 else None


def test_rooms_import_only_rooms_above_them():
    paths = [p for p in (REPO / "cluster").rglob("*.py") if "__pycache__" not in p.parts]
    unplaced, upward = [], set()
    for path in paths:
        module = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        if module == "cluster":
            continue
        mine = _room_of(module)
        if mine is None:
            unplaced.append(module)
            continue
        for target in _imported_modules(path, module):
            parts = target.split(".")
            theirs = _room_of(target) if parts[0] == "cluster" else None
            if theirs is not None and theirs > mine:
                upward.add((module, ".".join(parts[:3]) if parts[1] in ("supervision", "lifecycle") else target))
    assert unplaced == []
    assert upward == set()
    entries = {p.stem for p in (REPO / "cluster").iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()}
    assert sorted(set(ROOM_OF) - entries) == []      # every entry a room names is there
