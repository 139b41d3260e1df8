"""YAML loading that remembers where every value came from.

Inventory errors must name the file, the line and the key path. PyYAML's plain loaders drop
positions, so this module composes the node tree and converts it to plain Python values plus
a map from key path (a tuple of str keys and int indexes) to 1-based line number.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from typing import Any

import yaml

from ..errors import InventoryError

KeyPath = tuple[str | int, ...]   # str keys and int indexes; a FileRoot (a str) first for another file

# Bounds for hostile input (issue 16 item 13). A 400-byte alias bomb expands to ~10^9 values
# without them (14 s, 1.3 GB measured); real inventories are a few KiB with < 1000 values.
MAX_FILE_BYTES = 4 * 1024 * 1024
MAX_NODES = 100_000          # values after alias expansion
MAX_DEPTH = 64               # nesting of mappings/sequences


class FileRoot(str):
    """First element of the key paths of values from another file (a vars file, the second file of
    an inventory folder): keeps paths apart, and is left out when a path is shown."""


@dataclass
class SourceMap:
    """Line numbers by key path for one YAML document."""

    file: str
    lines: dict[KeyPath, int] = field(default_factory=dict)
    # Keys that YAML resolved to something other than a string (``yes:`` -> bool): path -> type.
    key_types: dict[KeyPath, str] = field(default_factory=dict)
    nodes: int = 0
    # Files other than ``file``, by the root of their key paths.
    files: dict[KeyPath, str] = field(default_factory=dict)

    def file_of(self, path: KeyPath) -> str:
        """The file a value at ``path`` was written in."""
        if path and isinstance(path[0], FileRoot):
            return self.files.get(path[:1], self.file)
        return self.file

    def add(self, other: "SourceMap", root: KeyPath) -> None:
        """Take in another file's lines under ``root`` (``(FileRoot(name),)``)."""
        self.files[root] = other.file
        for path, line in other.lines.items():
            self.lines[root + path] = line
        for path, kind in other.key_types.items():
            self.key_types[root + path] = kind

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
        if isinstance(part, FileRoot):
            continue
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            shown = str(part) if str(part).isprintable() else repr(str(part))   # no raw newlines in errors
            text += ("." if text else "") + shown
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
    text = read_text(path, name, hint="pass the path of an inventory YAML, e.g. inventories/local.yaml")
    try:
        node = yaml.compose(text, Loader=_DepthLimitedLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        raise InventoryError(name, line, "", f"invalid YAML: {exc.problem or exc}",
                             hint="check indentation and that every 'key: value' has a space after the colon") from None
    except yaml.YAMLError as exc:
        raise InventoryError(name, None, "", f"invalid YAML: {exc}") from None
    except RecursionError:
        raise InventoryError(name, None, "", "invalid YAML: nested too deeply",
                             hint=f"an inventory nests a few levels; at most {MAX_DEPTH} are accepted") from None
    source = SourceMap(name)
    if node is None:
        return None, source
    return _convert(node, (), source, 0), source


class _DepthLimitedLoader(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML ships no stubs: SafeLoader is Any
    """SafeLoader whose composer stops at MAX_DEPTH levels (naming the line) instead of recursing
    until RecursionError: 5000 nested '[' took 0.5 s to fail, 20 s under tracemalloc."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"nested more than {MAX_DEPTH} levels deep",
                                                  self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def read_text(path: str, name: str, *, hint: str) -> str:
    """The text of an inventory or vars file: UTF-8, at most MAX_FILE_BYTES.

    Only a regular file is read: the open does not block (a FIFO given as the inventory, or in
    host_vars/, hung every command until killed), and anything else (FIFO, device, socket) is
    refused before a byte is read.

    Raises:
        InventoryError: missing, unreadable, not a regular file, too big, or not UTF-8 (UTF-16
        named as such).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise InventoryError(name, None, "", "no such file", hint=hint) from None
    except OSError as exc:
        raise InventoryError(name, None, "", f"cannot read: {exc.strerror}") from None
    with open(fd, "rb") as handle:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode) else \
                "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else \
                "not a plain file"
            raise InventoryError(name, None, "", f"not a regular file ({kind})",
                                 hint="an inventory and its vars files are plain files")
        try:
            data = handle.read(MAX_FILE_BYTES + 1)
        except OSError as exc:
            raise InventoryError(name, None, "", f"cannot read: {exc.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise InventoryError(name, None, "", f"file larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB",
                             hint="is this really an inventory? real ones are a few KiB")
    if data[:2] in (b"\xff\xfe", b"\xfe\xff") or (len(data) > 1 and (data[0] == 0 or data[1] == 0)):
        raise InventoryError(name, 1, "", "the file is UTF-16, not UTF-8",
                             hint="save it as UTF-8 (e.g. iconv -f UTF-16 -t UTF-8)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise InventoryError(name, line, "", f"not valid UTF-8 (byte 0x{data[exc.start]:02x})",
                             hint="save the file as UTF-8") from None
    return text.removeprefix("\ufeff")


def _convert(node: yaml.Node, path: KeyPath, source: SourceMap, depth: int) -> Any:
    line = node.start_mark.line + 1
    source.nodes += 1
    if source.nodes > MAX_NODES:
        raise InventoryError(source.file, line, display_path(path),
                             f"more than {MAX_NODES} values (after expanding aliases)",
                             hint="is an alias (*name) repeated many times over? inventories need few")
    if depth > MAX_DEPTH:
        raise InventoryError(source.file, line, display_path(path),
                             f"nested more than {MAX_DEPTH} levels deep (a recursive alias?)",
                             hint="an alias (*name) must not refer to a value that contains it")
    source.lines.setdefault(path, line)
    if not isinstance(node, yaml.ScalarNode) and node.tag not in _PLAIN_TAGS:
        raise InventoryError(source.file, line, display_path(path), f"unsupported tag {node.tag}",
                             hint="drop the tag (!...): inventories hold plain strings, numbers, lists "
                                  "and mappings")
    if isinstance(node, yaml.MappingNode):
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise InventoryError(source.file, key_node.start_mark.line + 1, display_path(path),
                                     "YAML merge keys (<<) are not supported in inventories")
            key = _scalar(key_node, path, source)
            if not isinstance(key, (str, int, float)) and key is not None:
                raise InventoryError(source.file, key_node.start_mark.line + 1, display_path(path),
                                     f"keys must be strings, got {type(key).__name__}")
            if not isinstance(key, str):
                source.key_types[path + (str(key),)] = type(key).__name__
            key = str(key)
            if key in result:
                raise InventoryError(source.file, key_node.start_mark.line + 1,
                                     display_path(path + (key,)),
                                     f"duplicate key (first defined on line {source.lines[path + (key,)]})")
            source.lines[path + (key,)] = key_node.start_mark.line + 1
            result[key] = _convert(value_node, path + (key,), source, depth + 1)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_convert(item, path + (index,), source, depth + 1) for index, item in enumerate(node.value)]
    return _scalar(node, path, source)


def _scalar(node: yaml.Node, path: KeyPath, source: SourceMap) -> Any:
    """A scalar's value; unknown or malformed tags (``!foo``, ``!!int abc``) are errors."""
    if not isinstance(node, yaml.ScalarNode):
        raise InventoryError(source.file, node.start_mark.line + 1, display_path(path),
                             "keys must be strings, got a list or mapping")
    try:
        return _LOADER.construct_object(node, deep=True)
    except (yaml.YAMLError, ValueError, TypeError, OverflowError) as exc:
        problem = getattr(exc, "problem", None) or str(exc)
        raise InventoryError(source.file, node.start_mark.line + 1, display_path(path),
                             f"cannot read the value {node.value[:40]!r} tagged {node.tag}: {problem}",
                             hint="drop the tag (!...): inventories hold plain strings, numbers, lists "
                                  "and mappings") from None


_PLAIN_TAGS = ("tag:yaml.org,2002:map", "tag:yaml.org,2002:seq")
# A loader instance only for its scalar constructors (no stream is read through it).
_LOADER = yaml.SafeLoader("")
