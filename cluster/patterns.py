"""Ansible host patterns for ``--limit`` (pure: an inventory in, a smaller inventory out).

Syntax as ``ansible --limit`` takes it: terms separated by ``,`` (or ``:`` when there is no
comma); a term is ``all``/``*``, a group or host name, a glob (``node-*``), or a regex
(``~node-[ab]``); ``!term`` removes hosts, ``&term`` keeps only hosts also in the term. As in
Ansible, plain terms are applied first, then ``&`` terms, then ``!`` terms, whatever their
order in the pattern; a pattern of only ``&``/``!`` terms starts from ``all``.
"""
from __future__ import annotations

import fnmatch
import re
from typing import Callable
from dataclasses import replace

from .errors import UsageError
from .inventory import Inventory
from .plan import MODE_ROLES


def split_pattern(pattern: str) -> list[str]:
    """``"a,b"`` / ``"a:b"`` -> ``["a", "b"]`` (a ``~regex`` term may contain ``:`` only with commas)."""
    separator = "," if "," in pattern else ":"
    return [term.strip() for term in pattern.split(separator) if term.strip()]


def select_hosts(inventory: Inventory, pattern: str) -> list[str]:
    """The inventory's hosts that ``pattern`` selects, in inventory order.

    Raises:
        UsageError: an empty pattern or a bad regex.
    """
    terms = split_pattern(pattern)
    if not terms:
        raise UsageError(f"--limit {pattern!r}: empty pattern", hint="e.g. --limit 'all:!node-c'")
    plain = [term for term in terms if term[0] not in "!&"]
    both = [term[1:] for term in terms if term[0] == "&"]
    without = [term[1:] for term in terms if term[0] == "!"]
    chosen: set[str] = set()
    for term in plain or ["all"]:
        chosen |= _match(inventory, term, pattern)
    for term in both:
        chosen &= _match(inventory, term, pattern)
    for term in without:
        chosen -= _match(inventory, term, pattern)
    return [host.name for host in inventory.hosts if host.name in chosen]


def _match(inventory: Inventory, term: str, pattern: str) -> set[str]:
    """Hosts of every group and every host whose name the term matches."""
    hosts = [host.name for host in inventory.hosts]
    groups = dict(inventory.groups)
    if term in ("all", "*"):
        return set(hosts)
    matches: Callable[[str], object]
    if term.startswith("~"):
        try:
            regex = re.compile(term[1:])
        except re.error as exc:
            raise UsageError(f"--limit {pattern!r}: bad regex {term[1:]!r}: {exc}") from None
        matches = regex.match
    elif any(char in term for char in "*?["):
        matches = re.compile(fnmatch.translate(term)).match
    else:
        matches = term.__eq__
    result = {name for name in hosts if matches(name)}
    for group, members in groups.items():
        if matches(group):
            result |= set(members)
    return result


def required_roles(mode: str | None, inventory: Inventory, roles: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """Roles that must keep a host: those the mode runs (or the roles a program runs on)."""
    if roles is not None:
        return roles
    return tuple(role for role, _ in MODE_ROLES.get(mode or inventory.mode or "async", ()))


def apply_limit(inventory: Inventory, pattern: str | None, required: tuple[str, ...] = ("worker",)) -> Inventory:
    """The inventory restricted to the hosts ``pattern`` selects (None: unchanged).

    Raises:
        UsageError: the pattern selects no host, or leaves a role in ``required`` without a host
            (exit 2, naming the pattern and the role).
    """
    if pattern is None:
        return inventory
    kept = set(select_hosts(inventory, pattern))
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
    )
