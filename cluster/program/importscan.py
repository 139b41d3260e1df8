"""The modules a ``python SCRIPT`` program imports, read from its source (``ast``), never run.

``run`` uses it to name, before anything starts, a module that a host cannot import: the
program would otherwise fail there with ``ModuleNotFoundError`` after TensorFlow loaded (and
after its peers had started and begun to wait for it). The scan is static and partial by
design: it reads the script and, recursively, the modules of its own folder that it imports
(``mnist_setup.py`` beside ``main.py``), and it reports the top-level names of every other
module (``tensorflow`` for ``import tensorflow.keras``), each marked *required* or not:

* required: an import that runs whenever the script runs: at module level, or under
  ``if __name__ == "__main__":``, outside any ``try``;
* not required (a host that lacks it gets a warning, not an error): an import inside a
  function or class, under another ``if``, or inside a ``try`` (``try: import ujson`` /
  ``except ImportError``: a fallback). ``if TYPE_CHECKING:`` blocks are skipped.

What it cannot see (``importlib.import_module(name)``, ``__import__``, a ``-m`` module, a
shell script) is not checked. Relative imports and ``__future__`` are local by definition.
"""
from __future__ import annotations

import ast
import os
from dataclasses import dataclass
from pathlib import Path

MAX_SOURCE_BYTES = 4 << 20       # a "module" larger than this is not read (generated code, data)
MAX_LOCAL_MODULES = 200          # local modules followed from one script


@dataclass(frozen=True)
class ImportedModule:
    """A top-level module name the program imports from outside its own folder."""

    name: str
    required: bool          # imported whenever the script runs (see the module docstring)
    where: str              # "main.py:3", the first import that made it required (or the first one)


def scan_program(script: Path) -> tuple[ImportedModule, ...]:
    """The non-local modules ``script`` imports, directly or through modules of its folder
    (``script``'s folder is ``sys.path[0]`` when it runs, so what lies there is local).

    A file that cannot be read or parsed contributes nothing (the program's own error will
    say more than a guess here); names come out in the order first seen.
    """
    folder = script.parent
    found: dict[str, ImportedModule] = {}
    visited: dict[Path, bool] = {}           # local file -> read as required
    queue: list[tuple[Path, bool]] = [(script, True)]
    while queue:
        path, required_path = queue.pop(0)
        if path in visited and (visited[path] or not required_path):
            continue                          # read already, at least as required as now
        if path not in visited and len(visited) >= MAX_LOCAL_MODULES:
            continue
        visited[path] = required_path
        for name, required, line in _imports_of(path):
            needed = required and required_path
            local = _local_module(folder, name)
            if local is not None:
                queue.append((local, needed))
                continue
            known = found.get(name)
            if known is None or (needed and not known.required):
                found[name] = ImportedModule(name, needed, f"{os.path.relpath(path, folder)}:{line}")
    return tuple(found.values())


def _local_module(folder: Path, name: str) -> Path | None:
    """The file of ``name`` when it lies in ``folder`` (a module or a package); else None.
    A package's ``__init__.py`` stands for it; a namespace folder or an extension module is
    local too but has nothing to read (the folder itself is returned: no imports)."""
    if (folder / f"{name}.py").is_file():
        return folder / f"{name}.py"
    if (folder / name / "__init__.py").is_file():
        return folder / name / "__init__.py"
    if (folder / name).is_dir() or any(entry.startswith(name + ".") and entry.endswith((".so", ".pyd"))
                                       for entry in _listing(folder)):
        return folder / name
    return None


def _listing(folder: Path) -> list[str]:
    try:
        return os.listdir(folder)
    except OSError:
        return []


def _imports_of(path: Path) -> list[tuple[str, bool, int]]:
    """(top-level name, required, line) of each absolute import in ``path``."""
    try:
        if not path.is_file() or path.stat().st_size > MAX_SOURCE_BYTES:
            return []
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return []
    found: list[tuple[str, bool, int]] = []
    _visit(tree.body, True, found)
    return found


def _visit(body: list[ast.stmt], required: bool, found: list[tuple[str, bool, int]]) -> None:
    for node in body:
        if isinstance(node, ast.Import):
            found.extend((alias.name.split(".")[0], required, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module and node.module != "__future__":
                found.append((node.module.split(".")[0], required, node.lineno))
        elif isinstance(node, ast.If):
            if _is_type_checking(node.test):
                _visit(node.orelse, required, found)
                continue
            _visit(node.body, required and _is_main_guard(node.test), found)
            _visit(node.orelse, False, found)
        elif isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            for part in (node.body, node.orelse, node.finalbody):    # type: ignore[attr-defined]
                _visit(part, False, found)
            for handler in node.handlers:                             # type: ignore[attr-defined]
                _visit(handler.body, False, found)
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            _visit(node.body, required, found)
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            _visit(node.body, False, found)
            _visit(node.orelse, False, found)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            _visit(node.body, False, found)


def _is_main_guard(test: ast.expr) -> bool:
    """``__name__ == "__main__"`` (either way round)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    return (any(isinstance(side, ast.Name) and side.id == "__name__" for side in sides)
            and any(isinstance(side, ast.Constant) and side.value == "__main__" for side in sides))


def _is_type_checking(test: ast.expr) -> bool:
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))
