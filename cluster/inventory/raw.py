"""The raw structure an inventory is read into (groups with their hosts, children and vars, each value
with its key path), and the errors and warnings that name a value's file:line."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import InventoryError
from .yamlsrc import KeyPath, SourceMap, display_path
from .model import Origin


@dataclass
class _Group:
    name: str
    path: KeyPath
    hosts: list[str] = field(default_factory=list)
    vars: dict[str, tuple[Any, KeyPath]] = field(default_factory=dict)
    children: list[str] = field(default_factory=list)
    known: set[str] = field(default_factory=set)      # hosts, as a set (was rebuilt per pattern: O(N^2))


@dataclass
class _Raw:
    source: SourceMap
    groups: dict[str, _Group] = field(default_factory=dict)
    # host -> [(key, value, path)] in file order
    host_vars: dict[str, list[tuple[str, Any, KeyPath]]] = field(default_factory=dict)
    host_first: dict[str, KeyPath] = field(default_factory=dict)
    warnings: dict[str, None] = field(default_factory=dict)
    # From group_vars/ and host_vars/ files: name -> {key: (value, path)}, later files already applied.
    group_file_vars: dict[str, dict[str, tuple[Any, KeyPath]]] = field(default_factory=dict)
    host_file_vars: dict[str, dict[str, tuple[Any, KeyPath]]] = field(default_factory=dict)


def _err(raw: _Raw, path: KeyPath, message: str, hint: str | None = None) -> InventoryError:
    return InventoryError(raw.source.file_of(path), raw.source.line(path), display_path(path), message, hint=hint)


def _describe(value: Any) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, dict)):
        return f"a {type(value).__name__}"
    return repr(value)


def _warn(raw: _Raw, path: KeyPath, message: str, hint: str | None = None) -> None:
    text = str(_err(raw, path, message, hint))
    raw.warnings.setdefault(text)


def _origin(raw: _Raw, path: KeyPath) -> Origin:
    return Origin(raw.source.file_of(path), raw.source.line(path), display_path(path))
