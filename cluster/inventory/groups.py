"""Ansible's group semantics: group trees, membership, depth, and the precedence of variables
between groups (``_merged_vars``)."""
from __future__ import annotations

from typing import Any

from .hostnames import MAX_RANGE_HOSTS, check_host_name, expand_host_pattern, split_host_port
from .yamlsrc import KeyPath
from .model import MAX_HOSTS
from .raw import _Group, _Raw, _describe, _err
from .values import _as_int


def _parse_group(raw: _Raw, name: str, data: Any, path: KeyPath) -> None:
    group = raw.groups.setdefault(name, _Group(name, path))
    if data is None:
        return
    if not isinstance(data, dict):
        raise _err(raw, path, f"a group must be a mapping with hosts/vars/children, got {_describe(data)}")
    for key in data:
        if key not in ("hosts", "vars", "children"):
            raise _err(raw, path + (key,), f"unknown group key {key!r}",
                       hint="a group holds only 'hosts', 'vars' and 'children'; "
                            "is this host or group indented one level too deep?")
    hosts = data.get("hosts")
    if hosts is not None and not isinstance(hosts, dict):
        raise _err(raw, path + ("hosts",), f"expected a mapping of host names, got {_describe(hosts)}",
                   hint="write hosts as 'hosts: {node-a: , node-b: }' or one 'name:' per line")
    for pattern, host_vars in (hosts or {}).items():
        _parse_host_entry(raw, group, pattern, host_vars, path + ("hosts", pattern))
    group_vars = data.get("vars")
    if group_vars is not None and not isinstance(group_vars, dict):
        raise _err(raw, path + ("vars",), f"expected a mapping of variables, got {_describe(group_vars)}")
    for key, value in (group_vars or {}).items():
        if key in group.vars and group.vars[key][0] != value:
            raise _err(raw, path + ("vars", key), f"set twice for group {name!r} with different values")
        group.vars[key] = (value, path + ("vars", key))
    children = data.get("children")
    if children is not None and not isinstance(children, dict):
        raise _err(raw, path + ("children",), f"expected a mapping of groups, got {_describe(children)}")
    for child, child_data in (children or {}).items():
        if child not in group.children:
            group.children.append(child)
        _parse_group(raw, child, child_data, path + ("children", child))


def _host_names(raw: _Raw, pattern: Any, host_path: KeyPath) -> tuple[list[str], int | None]:
    """The host names one ``hosts:`` key stands for (``node-[01:04]``, ``node-a:2200``) and the
    port it carries, each name checked."""
    if host_path in raw.source.key_types:
        raise _err(raw, host_path, f"host name {pattern!r} is read by YAML as "
                                   f"{raw.source.key_types[host_path]}, not text",
                   hint=f"quote it: \"{pattern}\": (as Ansible requires)")
    name_pattern, port = split_host_port(pattern)       # "node-a:2200" as Ansible reads it
    try:
        names = expand_host_pattern(name_pattern)
    except ValueError as exc:
        raise _err(raw, host_path, str(exc), hint="ranges are [01:04], [:4], [a:d] or [0:10:2], at most "
                                                  f"{MAX_RANGE_HOSTS} hosts in all") from None
    for host in names:
        problem = check_host_name(host)
        if problem:
            raise _err(raw, host_path, problem, hint="a host name is letters, digits, '-', '_' and '.'; "
                                                     "set the address with ansible_host")
    return names, port


def _parse_host_entry(raw: _Raw, group: _Group, pattern: Any, host_vars: Any, host_path: KeyPath) -> None:
    """One key of a group's ``hosts:``: its hosts join the group, with their variables."""
    names, port = _host_names(raw, pattern, host_path)
    if host_vars is not None and not isinstance(host_vars, dict):
        raise _err(raw, host_path, f"host variables must be a mapping, got {_describe(host_vars)}")
    for host in names:
        raw.host_first.setdefault(host, host_path)
    if len(raw.host_first) > MAX_HOSTS:
        raise _err(raw, host_path, f"the inventory names more than {MAX_HOSTS} hosts",
                   hint=f"pscluster plans at most {MAX_HOSTS} hosts from one inventory; split it")
    known = group.known
    for host in names:
        if host not in known:
            known.add(host)
            group.hosts.append(host)
        if port is not None and "ansible_port" not in (host_vars or {}):
            raw.host_vars.setdefault(host, []).append(("ansible_port", port, host_path))
        for key, value in (host_vars or {}).items():
            raw.host_vars.setdefault(host, []).append((key, value, host_path + (key,)))
        raw.host_vars.setdefault(host, [])


def _members(raw: _Raw, name: str, seen: tuple[str, ...] = (),
             memo: dict[str, list[str]] | None = None) -> list[str]:
    """Hosts of a group, including its descendants, in file order."""
    memo = {} if memo is None else memo
    if name in seen:
        raise _err(raw, raw.groups[name].path, f"group {name!r} contains itself via {' -> '.join(seen)}")
    if name in memo:
        return memo[name]
    group = raw.groups.get(name)
    if group is None:
        return []
    result = dict.fromkeys(group.hosts)
    for child in group.children:
        result.update(dict.fromkeys(_members(raw, child, seen + (name,), memo)))
    memo[name] = list(result)
    return memo[name]


def _depths(raw: _Raw) -> dict[str, int]:
    """Longest distance of each group from ``all`` (Ansible applies deeper groups later)."""
    depth = {name: 0 if name == "all" else 1 for name in raw.groups}
    for _ in range(len(raw.groups)):
        changed = False
        for group in raw.groups.values():
            for child in group.children:
                if child in depth and depth[child] < depth[group.name] + 1:
                    depth[child] = depth[group.name] + 1
                    changed = True
        if not changed:
            break
    return depth


def _merged_vars(raw: _Raw, host: str, groups_of_host: list[str], depth: dict[str, int]
                 ) -> dict[str, tuple[Any, KeyPath]]:
    """Ansible's order (its documented variable precedence, checked with ansible-inventory):
    inventory-file group vars (all, then other groups) < group_vars/all < group_vars/<group>
    < inventory-file host vars < host_vars/<host>; groups by (depth, ansible_group_priority, name)."""
    merged: dict[str, tuple[Any, KeyPath]] = dict(raw.groups["all"].vars)
    ordered = sorted((name for name in groups_of_host if name != "all"),
                     key=lambda name: (depth.get(name, 1), _priority(raw, name), name))
    for group in ordered:
        merged.update(raw.groups[group].vars)
    merged.update(raw.group_file_vars.get("all", {}))
    for group in ordered:
        merged.update(raw.group_file_vars.get(group, {}))
    seen: dict[str, tuple[Any, KeyPath]] = {}
    for key, value, path in raw.host_vars.get(host, []):
        if key in seen and seen[key][0] != value:
            raise _err(raw, path, f"host {host!r} sets {key} twice with different values "
                                  f"(also on line {raw.source.line(seen[key][1])})",
                       hint="set each host variable in one place")
        seen[key] = (value, path)
    merged.update(seen)
    merged.update(raw.host_file_vars.get(host, {}))
    return merged


def _priority(raw: _Raw, group: str) -> int:
    item = raw.groups[group].vars.get("ansible_group_priority")
    return 1 if item is None else _as_int(raw, item[1], item[0], -1_000_000, 1_000_000, "a priority")


def _ansible_groups(raw: _Raw, all_children: list[str], groups_by_host: dict[str, list[str]]
                    ) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Groups and their hosts in the order Ansible's InventoryManager holds them, for ``--limit``
    subscripts (``worker[0]``): ``all`` and ``ungrouped`` first, the others in definition order; a
    group's hosts as its Group.get_hosts() lists them: its own, then its children's, level by level
    (Ansible walks the third level and deeper in set order: there pscluster takes definition order)."""
    names = ["all", "ungrouped"] + [name for name in raw.groups if name not in ("all", "ungrouped")]
    has_parent = {child for group in raw.groups.values() for child in group.children if group.name != "all"}
    children = {name: list(raw.groups[name].children) if name in raw.groups else [] for name in names}
    children["all"] = list(dict.fromkeys(
        ["ungrouped"] + all_children + [name for name in names[2:] if name not in has_parent]))
    own = {name: list(raw.groups[name].hosts) if name in raw.groups else [] for name in names}
    # Ansible puts a host that is in no group but all (and ungrouped) into ungrouped, and takes
    # ungrouped away from a host that is in another group.
    lone = [host for host in raw.host_first if set(groups_by_host.get(host, ())) <= {"all", "ungrouped"}]
    own["ungrouped"] = list(dict.fromkeys([host for host in own["ungrouped"] if host in lone] + lone))
    result = []
    for name in names:
        ordered, level, seen = [name, *children[name]], [name, *children[name]], set()
        while level:
            seen.update(level)
            following: list[str] = []
            for group in level:
                for child in children.get(group, ()):
                    if child not in following:
                        following.append(child)
                    if child not in seen and child not in ordered:
                        ordered.append(child)
            level = [group for group in following if group not in seen]
        hosts = dict.fromkeys(host for group in ordered for host in own.get(group, ()))
        result.append((name, tuple(hosts)))
    return tuple(result)
