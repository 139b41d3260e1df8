"""The house's rules that a reader relies on, checked on the tree itself: the repository stands
alone (no file cites documents outside it), docs/architecture.md's module map names every module,
and rich is imported at run time by cluster/console.py alone."""
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


def test_rich_is_console_s_alone():
    users = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "cluster").rglob("*.py")
                   if "rich" in _runtime_imports(ast.parse(p.read_text())))
    assert users == ["cluster/console.py"]
