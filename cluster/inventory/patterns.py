"""Ansible host patterns for ``--limit`` (pure: an inventory in, a smaller inventory out).

The grammar and its quirks are ansible-core's (``inventory/manager.py``, checked against
``ansible all --list-hosts --limit`` by tests/unit/test_ansible_styles.py):

* Parts are split on ``,``; without a comma on ``:`` (unless the whole pattern reads as one host
  address, such as ``node-a:22``, ``fe80::1`` or ``node[1:3]``), never inside ``[...]``.
* A part is ``all``/``*``, a group or host name, a glob (``*``, ``?``, ``[abc]``) or a regex
  (``~node-[ab]``); ``&part`` keeps only hosts also in the part, ``!part`` removes hosts. Plain
  parts are applied first, then ``&`` parts, then ``!`` parts, whatever their order; a pattern of
  only ``&``/``!`` parts starts from ``all``.
* A part matches every group whose name it matches (all of the group's hosts) and, when it
  matched no group or is a glob or regex (or holds a ``.``), every host whose name it matches.
* A subscript selects from what a (non-regex) part matched: ``[i]``, ``[-i]``, ``[i:j]``
  (inclusive), ``[i:]``. So ``gpu0[12]`` is the 13th host of ``gpu0``, never a character class.
  ``[i-j]`` works as ``[i:j]`` with Ansible's warning; a ``[i]`` past the end is an error.
* A part that matches no group and no host is ignored with Ansible's warning, word for word:
  ``Could not match supplied host pattern, ignoring: NAME``.
"""
from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, replace
from typing import Callable

from ..errors import UsageError
from .hostnames import check_host_name, split_host_port
from ..contracts import MODE_ROLES, resolve_mode
from .model import Inventory

# Ansible's PATTERN_WITH_SUBSCRIPT: a pattern ending in [i], [-i], [i:j], [i:] or [i-j].
_SUBSCRIPT = re.compile(r"^(.+)\[(?:(-?[0-9]+)|([0-9]+)([:-])([0-9]*))\]$")
# Without commas, ':' separates parts, except inside a complete [...] (Ansible's split_host_pattern).
_COLON_PARTS = re.compile(r"(?:[^\s:\[\]]|\[[^\]]*\])+")
_VALID_RANGE = re.compile(r"\[(?:[0-9]+:[0-9]+|[a-z]:[a-z])(?::[0-9]+)?\]", re.I)
LOCALHOST = ("127.0.0.1", "localhost", "::1")     # Ansible's implicit localhost: never in an inventory's all
NO_MATCH = "Could not match supplied host pattern, ignoring: {}"
DASH_SUBSCRIPT = "Use [x:y] inclusive subscripts instead of [x-y] which has been removed"


@dataclass(frozen=True)
class Selection:
    """What a ``--limit`` pattern selects: hosts in inventory order, and Ansible's warnings."""

    hosts: tuple[str, ...]
    warnings: tuple[str, ...] = ()


def split_pattern(pattern: str) -> list[str]:
    """``"a,b"`` / ``"a:b"`` -> ``["a", "b"]``, as Ansible's split_host_pattern splits."""
    if "," in pattern:
        parts = pattern.split(",")
    elif _is_one_address(pattern):
        parts = [pattern]
    else:
        parts = _COLON_PARTS.findall(pattern)
    return [part.strip() for part in parts if part.strip()]


def _is_one_address(pattern: str) -> bool:
    """Whether Ansible's parse_address (ranges allowed) reads the whole pattern as one host[:port]."""
    host, _ = split_host_port(pattern)
    return check_host_name(_VALID_RANGE.sub("0", host)) is None


def select(inventory: Inventory, pattern: str) -> Selection:
    """The hosts ``pattern`` selects, and the warnings Ansible prints for it.

    Raises:
        UsageError: an empty pattern, a bad regex, ``@file``, or an ``[i]`` past a group's end.
    """
    parts = split_pattern(pattern)
    if not parts:
        raise UsageError(f"--limit {pattern!r}: empty pattern", hint="e.g. --limit 'all:!node-c'")
    for part in parts:
        if part.startswith("@"):
            raise UsageError(f"--limit {pattern!r}: limit files ({part}) are not supported",
                             hint="write the hosts into the pattern, e.g. --limit 'node-a,node-b'")
    plain = [part for part in parts if part[0] not in "!&"] or ["all"]
    ordered = plain + [part for part in parts if part[0] == "&"] + [part for part in parts if part[0] == "!"]
    warnings: dict[str, None] = {}
    hosts: dict[str, None] = {}
    defined = set(inventory.defined or (host.name for host in inventory.hosts))
    for part in ordered:
        if part in defined:
            hosts.setdefault(part)
            continue
        matched = _match_part(inventory, part[1:] if part[0] in "!&" else part, pattern, warnings)
        if part[0] == "!":
            hosts = {host: None for host in hosts if host not in matched}
        elif part[0] == "&":
            hosts = {host: None for host in hosts if host in matched}
        else:
            hosts.update(dict.fromkeys(matched))
    return Selection(tuple(host.name for host in inventory.hosts if host.name in hosts), tuple(warnings))


def select_hosts(inventory: Inventory, pattern: str) -> list[str]:
    """The inventory's hosts that ``pattern`` selects, in inventory order (see :func:`select`)."""
    return list(select(inventory, pattern).hosts)


def _match_part(inventory: Inventory, part: str, pattern: str, warnings: dict[str, None]) -> list[str]:
    """Ansible's _match_one_pattern: the hosts one part (without & or !) matches, subscript applied."""
    expression = part
    subscript: tuple[int, int | None] | None = None
    match = None if part.startswith("~") else _SUBSCRIPT.match(part)
    if match:
        expression, index, start, separator, end = match.groups()
        if index:
            subscript = (int(index), None)
        else:
            subscript = (int(start), int(end) if end else -1)
            if separator == "-":
                warnings.setdefault(DASH_SUBSCRIPT)
    hosts = _enumerate(inventory, expression, pattern, warnings)
    if not hosts or subscript is None:
        return hosts
    first, last = subscript
    if last:                                      # as Ansible: [i:0] is [i], [i:] runs to the end
        return hosts[first:(len(hosts) - 1 if last == -1 else last) + 1]
    try:
        return [hosts[first]]
    except IndexError:
        raise UsageError(f"--limit {pattern!r}: No hosts matched the subscripted pattern '{part}'",
                         hint=f"{expression} has {len(hosts)} host(s): [0] to [{len(hosts) - 1}], "
                              f"or [-1] for the last") from None


def _enumerate(inventory: Inventory, expression: str, pattern: str, warnings: dict[str, None]) -> list[str]:
    """Ansible's _enumerate_matches: hosts of every matching group, then (if no group matched, or
    for globs and regexes) every matching host; duplicates kept, as subscripts count them."""
    matches: Callable[[str], object]
    try:
        matches = re.compile(expression[1:] if expression.startswith("~") else fnmatch.translate(expression)).match
    except re.error as exc:
        raise UsageError(f"--limit {pattern!r}: Invalid host list pattern: {expression} (bad regex: {exc})") from None
    results: list[str] = []
    groups = [name for name, _ in inventory.groups if matches(name)]
    for name, members in inventory.groups:
        if name in groups:
            results.extend(members)
    if not groups or expression.startswith("~") or any(char in expression for char in ".?*["):
        results.extend(name for name in inventory.defined or (host.name for host in inventory.hosts)
                       if matches(name))
    if not results and not groups and expression != "all" and expression not in LOCALHOST:
        warnings.setdefault(NO_MATCH.format(expression))
    return results


def required_roles(mode: str | None, inventory: Inventory, roles: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """Roles that must keep a host: those the mode runs (or the roles a program runs on)."""
    if roles is not None:
        return roles
    return tuple(role for role, _ in MODE_ROLES.get(resolve_mode(mode, inventory.mode, roles=inventory.mode_roles()), ()))


def apply_limit(inventory: Inventory, pattern: str | None, required: tuple[str, ...] = ("worker",),
                warn: Callable[[str], None] | None = None) -> Inventory:
    """The inventory restricted to the hosts ``pattern`` selects (None: unchanged).

    ``warn`` gets Ansible's warnings for the pattern (a part that matches nothing, ``[x-y]``)
    before any error is raised.

    Raises:
        UsageError: the pattern selects no host, or leaves a role in ``required`` without a host
            (exit 2, naming the pattern and the role).
    """
    if pattern is None:
        return inventory
    selection = select(inventory, pattern)
    for warning in selection.warnings:
        if warn is not None:
            warn(f"--limit {pattern!r}: {warning}")
    kept = set(selection.hosts)
    if not kept:
        raise UsageError(f"--limit {pattern!r} matches no host of {inventory.path}",
                         hint="hosts: " + ", ".join(host.name for host in inventory.hosts[:20]))
    role_hosts = tuple((role, tuple(host for host in members if host in kept))
                       for role, members in inventory.role_hosts)
    for role, members in role_hosts:
        if role in required and not members:
            raise UsageError(f"--limit {pattern!r} leaves no {role} host",
                             hint=f"the {role} hosts are {', '.join(inventory.hosts_of(role))}; "
                                  "keep at least one of them")
    return replace(
        inventory,
        hosts=tuple(host for host in inventory.hosts if host.name in kept),
        role_hosts=tuple((role, members) for role, members in role_hosts if members),
        groups=tuple((group, tuple(host for host in members if host in kept))
                     for group, members in inventory.groups),
        defined=tuple(host for host in inventory.defined if host in kept),
        unlimited_roles=inventory.mode_roles(),
    )
