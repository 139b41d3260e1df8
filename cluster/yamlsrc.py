"""YAML loading that remembers where every value came from.

Inventory errors must name the file, the line and the key path. PyYAML's plain loaders drop
positions, so this module composes the node tree and converts it to plain Python values plus
a map from key path (a tuple of str keys and int indexes) to 1-based line number.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from .errors import InventoryError

KeyPath = tuple  # tuple[str | int, ...]


@dataclass
class SourceMap:
    """Line numbers by key path for one YAML document."""

    file: str
    lines: dict[KeyPath, int] = field(default_factory=dict)

    def line(self, path: KeyPath) -> int | None:
        """The line of ``path``, or of its nearest ancestor that has one."""
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return self.lines.get((), None)


def render_path(path: KeyPath) -> str:
    """``("worker", "hosts", "node-b", "worker_gpus", 1)`` -> ``worker.hosts.node-b.worker_gpus[1]``."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += ("." if text else "") + str(part)
    return text


def display_path(path: KeyPath) -> str:
    """Key path as users read it: from the innermost inventory group, e.g.
    ``("all", "children", "worker", "hosts", "node-b", "worker_gpus", 1)`` ->
    ``worker.hosts.node-b.worker_gpus[1]``."""
    parts = list(path)
    for index in range(len(parts) - 1, -1, -1):
        if parts[index] == "children" and index + 1 < len(parts):
            parts = parts[index + 1:]
            break
    return render_path(tuple(parts))


def load_yaml_with_lines(path: str, display_name: str | None = None) -> tuple[Any, SourceMap]:
    """Parse one YAML file into plain values and a :class:`SourceMap`.

    Raises:
        InventoryError: the file is missing, unreadable or not valid YAML (with its line).
    """
    name = display_name or path
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        raise InventoryError(name, None, "", "no such file",
                             hint="pass the path of an inventory YAML, e.g. inventories/local.yaml") from None
    except OSError as exc:
        raise InventoryError(name, None, "", f"cannot read: {exc.strerror}") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        raise InventoryError(name, line, "", f"invalid YAML: {exc.problem or exc}",
                             hint="check indentation and that every 'key: value' has a space after the colon") from None
    source = SourceMap(name)
    if node is None:
        return None, source
    return _convert(node, (), source), source


def _convert(node: yaml.Node, path: KeyPath, source: SourceMap) -> Any:
    source.lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise InventoryError(source.file, key_node.start_mark.line + 1, display_path(path),
                                     "YAML merge keys (<<) are not supported in inventories")
            key = _LOADER.construct_object(key_node, deep=True)
            if not isinstance(key, (str, int)):
                raise InventoryError(source.file, key_node.start_mark.line + 1, display_path(path),
                                     f"keys must be strings, got {type(key).__name__}")
            key = str(key)
            if key in result:
                raise InventoryError(source.file, key_node.start_mark.line + 1,
                                     display_path(path + (key,)),
                                     f"duplicate key (first defined on line {source.lines[path + (key,)]})")
            source.lines[path + (key,)] = key_node.start_mark.line + 1
            result[key] = _convert(value_node, path + (key,), source)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_convert(item, path + (index,), source) for index, item in enumerate(node.value)]
    return _LOADER.construct_object(node, deep=True)


# A loader instance only for its scalar constructors (no stream is read through it).
_LOADER = yaml.SafeLoader("")
