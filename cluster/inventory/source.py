"""Reading an inventory as ``ansible-inventory -i`` does: a file or a folder, YAML or INI, plus the
``group_vars/`` and ``host_vars/`` folders beside it (pure: reads files, touches no host).

Everything becomes the YAML inventory's structure (``{group: {hosts, vars, children}}``) with a
:class:`~cluster.inventory.yamlsrc.SourceMap` of lines, so validation has one code path. Values from files
other than the first are keyed under a :class:`~cluster.inventory.yamlsrc.FileRoot`, so errors name their file.

Detection follows Ansible's plugin order: ``.yaml``/``.yml``/``.json`` files are YAML; a file
without one of those extensions is YAML when it parses to a mapping, else INI. A folder loads its
files in name order, skipping hidden files, ``group_vars``/``host_vars`` and the extensions
Ansible ignores (INVENTORY_IGNORE_EXTS).
"""
from __future__ import annotations

import ast
import hashlib
import os
import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Container

from ..errors import InventoryError
from .hostnames import split_host_port
from .yamlsrc import FileRoot, KeyPath, SourceMap, load_yaml_with_lines, read_text

YAML_EXTENSIONS = (".yaml", ".yml", ".json")
# Ansible's INVENTORY_IGNORE_EXTS (REJECT_EXTS + .orig, .cfg, .retry).
IGNORED_EXTENSIONS = (".pyc", ".pyo", ".swp", ".bak", "~", ".rpm", ".md", ".txt", ".rst", ".orig", ".cfg", ".retry")
VARS_EXTENSIONS = ("", ".yml", ".yaml", ".json")
MAX_FILES = 1000
_SECTION = re.compile(r"^\[([^\]:\s]+)(?::(vars|children))?\]\s*$")
_HINT = "pass an inventory file (YAML or INI) or a folder of them, e.g. inventories/local.yaml"


@dataclass
class InventorySource:
    """Every inventory document with the root of its key paths, and the vars files beside it."""

    source: SourceMap
    name: str                                              # display name: file stem or folder name
    documents: list[tuple[Any, KeyPath]] = field(default_factory=list)
    # (group or host name, file path, display name) in Ansible's load order (later files win);
    # read by vars_of() only for groups and hosts the inventory has, as Ansible does.
    group_vars: list[tuple[str, str, str]] = field(default_factory=list)
    host_vars: list[tuple[str, str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)      # shown like Inventory.warnings

    def vars_of(self, files: list[tuple[str, str, str]], owners: Container[str]) -> list[tuple[str, dict[str, Any], KeyPath]]:
        """(owner, mapping, key-path root) of each vars file whose owner is in ``owners``.

        Raises:
            InventoryError: a vars file that is not YAML/JSON or not a mapping.
        """
        result: list[tuple[str, dict[str, Any], KeyPath]] = []
        for owner, full, file_name in files:
            if owner not in owners:
                continue
            data, source = load_yaml_with_lines(full, file_name)
            if data is None:
                continue
            if not isinstance(data, dict):
                raise InventoryError(file_name, source.line(()), "", "a vars file must be a mapping of variables",
                                     hint="e.g. pscluster_workdir: /srv/pscluster")
            root = (FileRoot(f"{len(self.source.files) + 1}:{file_name}"),)
            self.source.add(source, root)
            result.append((owner, data, root))
        return result


def read_source(path: str, display_name: str | None = None) -> InventorySource:
    """Read an inventory file or folder and the group_vars/host_vars beside it.

    Raises:
        InventoryError: a missing path, an unreadable or invalid file (named with its line).
    """
    name = display_name or path
    if os.path.isdir(path):
        files = _folder_files(path, name)
        if not files:
            raise InventoryError(name, None, "", "the folder holds no inventory file", hint=_HINT)
        basedir = path
        stem = os.path.basename(os.path.normpath(os.path.abspath(path)))
    else:
        files = [(path, name)]
        basedir = os.path.dirname(path) or "."
        stem = os.path.splitext(os.path.basename(path))[0]
    first: InventorySource | None = None
    for index, (file_path, file_name) in enumerate(files):
        data, source = _read_inventory_file(file_path, file_name)
        if first is None:
            first = InventorySource(source, stem)
            first.documents.append((data, ()))
        else:
            root = (FileRoot(f"{index}:{file_name}"),)
            first.source.add(source, root)
            first.documents.append((data, root))
    assert first is not None
    display_base = name if os.path.isdir(path) else os.path.dirname(name)
    for kind, target in (("group_vars", first.group_vars), ("host_vars", first.host_vars)):
        _read_vars_folder(first, os.path.join(basedir, kind), os.path.join(display_base, kind), target)
    inside = os.path.realpath(basedir)
    for _, full, shown in first.group_vars + first.host_vars:
        target_path = os.path.realpath(full)
        if os.path.commonpath([inside, target_path]) != inside:
            # (a symlinked group_vars/all.yml -> /etc/shadow was read and parsed without a word)
            first.warnings.append(f"{shown}: read from {target_path}, outside the inventory folder {inside} "
                                  "(a symlink)")
    return first


def _folder_files(folder: str, name: str, scripts_refused: bool = True) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for entry in sorted(os.listdir(folder)):
        if entry.startswith(".") or entry in ("group_vars", "host_vars", "vars_plugins") \
                or entry.endswith(IGNORED_EXTENSIONS):
            continue
        full, shown = os.path.join(folder, entry), os.path.join(name, entry)
        if os.path.isdir(full):
            found.extend(_folder_files(full, shown, scripts_refused))
        elif scripts_refused and os.access(full, os.X_OK):
            raise InventoryError(shown, None, "", "executable files (dynamic inventory scripts) are not supported",
                                 hint="write the hosts in YAML or INI, or chmod -x it if it is one")
        else:
            found.append((full, shown))
        if len(found) > MAX_FILES:
            raise InventoryError(name, None, "", f"more than {MAX_FILES} files in the inventory folder")
    return found


def _read_inventory_file(path: str, name: str) -> tuple[Any, SourceMap]:
    extension = os.path.splitext(path)[1].lower()
    if extension in YAML_EXTENSIONS:
        return load_yaml_with_lines(path, name)
    text = read_text(path, name, hint=_HINT)
    if extension == "":
        try:
            data, source = load_yaml_with_lines(path, name)
        except InventoryError:
            data, source = None, None
        if isinstance(data, dict) and source is not None:
            return data, source
    return parse_ini(text, name)


def parse_ini(text: str, name: str) -> tuple[dict[str, Any], SourceMap]:
    """Ansible's INI inventory as the YAML structure: ``[g]`` host lines ``name key=value ...``,
    ``[g:vars]`` lines ``key=value``, ``[g:children]`` group names; values as Python literals
    when they parse as one (``2222`` is a number, ``yes`` stays a string), as Ansible reads them."""
    source = SourceMap(name)
    data: dict[str, dict[str, Any]] = {}
    group, kind = "ungrouped", "hosts"
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped[0] in "#;":
            continue
        section = _SECTION.match(stripped)
        if section:
            group, kind = section.group(1), {"vars": "vars", "children": "children"}.get(section.group(2), "hosts")
            source.lines.setdefault((group,), number)
            data.setdefault(group, {})
            continue
        if stripped.startswith("["):
            raise InventoryError(name, number, "", f"invalid section header {stripped!r}",
                                 hint="write [group], [group:vars] or [group:children]")
        body = data.setdefault(group, {}).setdefault(kind, {})
        source.lines.setdefault((group,), number)
        source.lines.setdefault((group, kind), number)
        if kind == "vars":
            key, equals, value = stripped.partition("=")
            if not equals or not key.strip():
                raise InventoryError(name, number, group + ".vars", f"expected key=value, got {stripped!r}")
            _ini_set(body, source, (group, kind, key.strip()), _ini_value(value.strip()), number, name)
        elif kind == "children":
            body.setdefault(stripped, None)
            source.lines.setdefault((group, kind, stripped), number)
        else:
            _ini_host(body, source, group, stripped, number, name)
    return data, source


def _ini_host(body: dict[str, Any], source: SourceMap, group: str, line: str, number: int, name: str) -> None:
    try:
        words = shlex.split(line, comments=True)
    except ValueError as exc:
        raise InventoryError(name, number, group + ".hosts", f"cannot split the line: {exc}",
                             hint="check the quotes") from None
    host, port = split_host_port(words[0])
    path = (group, "hosts", host)
    source.lines.setdefault(path, number)
    host_vars = body.setdefault(host, None) or {}
    if port is not None:
        _ini_set(host_vars, source, path + ("ansible_port",), port, number, name)
    for word in words[1:]:
        key, equals, value = word.partition("=")
        if not equals or not key:
            raise InventoryError(name, number, f"{group}.hosts.{host}", f"expected key=value, got {word!r}",
                                 hint="host lines are: NAME key=value key=value ...")
        _ini_set(host_vars, source, path + (key,), _ini_value(value), number, name)
    body[host] = host_vars or None


def _ini_set(target: dict[str, Any], source: SourceMap, path: tuple[str, ...], value: Any, number: int, name: str) -> None:
    key = path[-1]
    if key in target and target[key] != value:
        raise InventoryError(name, number, ".".join(map(str, path)),
                             f"set twice with different values (first on line {source.lines[path]})")
    target[key] = value
    source.lines.setdefault(path, number)


def _ini_value(text: str) -> Any:
    try:
        return ast.literal_eval(text) if len(text) < 10_000 else text
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


def _read_vars_folder(inventory: InventorySource, folder: str, shown: str,
                      target: list[tuple[str, str, str]]) -> None:
    """``group_vars/NAME``, ``NAME.yml``, ``NAME.yaml``, ``NAME.json`` and ``NAME/*`` files."""
    if not os.path.isdir(folder):
        return
    names = sorted({os.path.splitext(entry)[0] if os.path.splitext(entry)[1] in VARS_EXTENSIONS[1:] else entry
                    for entry in os.listdir(folder) if not entry.startswith(".")})
    for owner in names:
        files: list[tuple[str, str]] = []
        for extension in VARS_EXTENSIONS:
            full = os.path.join(folder, owner + extension)
            if os.path.lexists(full) and not os.path.isdir(full):   # a FIFO too: read_text refuses it
                files.append((full, os.path.join(shown, owner + extension)))
        if os.path.isdir(os.path.join(folder, owner)):
            files.extend(_folder_files(os.path.join(folder, owner), os.path.join(shown, owner), False))
        target.extend((owner, full, file_name) for full, file_name in files)


def inventory_digest(path: str) -> str:
    """sha256 over what :func:`read_source` may read for ``path``: the file (or every file of the
    folder) and the ``group_vars``/``host_vars`` beside it, each with its name, in sorted order.
    An elastic re-plan compares it with the one recorded at ``up``/``scale`` (issue 42, M3).

    Raises:
        OSError: ``path`` cannot be read.
    """
    base = path if os.path.isdir(path) else os.path.dirname(path) or "."
    found = set() if os.path.isdir(path) else {os.path.abspath(path)}
    folders = ([path] if os.path.isdir(path) else []) + [os.path.join(base, "group_vars"), os.path.join(base, "host_vars")]
    for folder in folders:
        for top, dirs, names in os.walk(folder):
            dirs.sort()
            found.update(os.path.abspath(os.path.join(top, name)) for name in names)
    digest = hashlib.sha256()
    for full in sorted(found):
        if not os.path.isfile(full):         # a FIFO or a dangling link: named, never read
            digest.update(f"{os.path.relpath(full, base)}\0-\0".encode())
            continue
        with open(full, "rb") as handle:
            digest.update(f"{os.path.relpath(full, base)}\0".encode() + handle.read() + b"\0")
    return digest.hexdigest()
