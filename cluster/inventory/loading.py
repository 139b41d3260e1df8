"""Ansible-style inventory loading and validation (pure: reads files, touches no host).

:mod:`.source` reads the file or folder, YAML or INI, and the group_vars/ and
host_vars/ beside it; this module merges variables with Ansible's precedence (see
``_merged_vars``) and validates them. pscluster reads four role groups (``chief``, ``ps``,
``worker``, ``evaluator``) and these host variables:

* connection: ``ansible_host``, ``ansible_port``, ``ansible_user`` (and their ``ansible_ssh_*``
  aliases), ``ansible_ssh_private_key_file``, ``ansible_connection`` (``local`` runs without
  SSH, ``slurm`` runs every command as a step of ``$SLURM_JOB_ID``; ``pscluster_transport`` says the
  same), become, ProxyJump and the others in ``CONNECTION_KEYS``; any other ``ansible_*`` key is
  a warning (``Inventory.warnings``), passwords are errors;
* tasks, per role (``<role>_tasks``, ``<role>_gpus``, ``<role>_ports``);
* ``pscluster_*`` settings (see ``PSCLUSTER_KEYS``). Unknown ``pscluster_*`` keys and
  unknown ``<role>_*`` suffixes are errors: a typo must not be silently ignored.

Every error names file, line and key path (:class:`~cluster.errors.InventoryError`).
"""
from __future__ import annotations

import difflib
from typing import Any

from ..errors import InventoryError
from .source import InventorySource, read_source
from .yamlsrc import KeyPath
from .connection import CONNECTION_KEYS, ORIGIN_KEYS, _ansible_bool, _warn_ssh_options
from .groups import _ansible_groups, _depths, _members, _merged_vars, _parse_group
from .model import (DEFAULT_PORT_BASE, DOCKER_DEFAULT_USER, MAX_TASKS_PER_HOST, HostConfig, Inventory, PASSWORD_KEYS, ROLES, ROLE_SUFFIXES,
                    RoleSlots)
from .raw import _Group, _Raw, _describe, _err, _origin, _warn
from .values import PSCLUSTER_KEYS, Validator, _as_int, _boolean, _gpu_mask, _url_list


# Settings of the whole cluster: only `all.vars` may set them.
CLUSTER_WIDE_KEYS = ("pscluster_mode", "pscluster_firewall", "pscluster_notify", "pscluster_idle_ps")


def _check_key(raw: _Raw, key: str, path: KeyPath, value: Any = None) -> None:
    """Reject keys pscluster would otherwise ignore by mistake; warn about ignored ansible_* keys."""
    if key.startswith("ansible_") and key not in CONNECTION_KEYS and key not in PASSWORD_KEYS:
        _warn(raw, path, "ignored by pscluster (an Ansible setting it does not use)")
    if key == "ansible_host_key_checking" and not _ansible_bool(raw, path, value):
        _warn(raw, path, "ignored: pscluster still checks host keys",
              "set pscluster_host_key_policy: accept-new to trust a new host's key on first use")
    if key in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
        _warn_ssh_options(raw, path, value)
    if key in PASSWORD_KEYS:
        raise _err(raw, path, "passwords are not accepted in inventories",
                   hint="use key authentication (ansible_ssh_private_key_file) or an SSH agent")
    if key.startswith("pscluster_") and key not in PSCLUSTER_KEYS:
        close = [known for known in PSCLUSTER_KEYS if _similar(key, known)]
        hint = f"did you mean {close[0]}?" if close else \
            "known settings: " + ", ".join(sorted(PSCLUSTER_KEYS))
        raise _err(raw, path, f"unknown setting {key!r}", hint=hint)
    role, _, suffix = key.partition("_")
    if role in ROLES and suffix and suffix not in ROLE_SUFFIXES:
        raise _err(raw, path, f"unknown task setting {key!r}",
                   hint=f"per-role settings are {', '.join(role + '_' + s for s in ROLE_SUFFIXES)}")


def _similar(left: str, right: str) -> bool:
    """Typo detector for setting names (a letter missing, added, swapped or wrong)."""
    return difflib.SequenceMatcher(None, left, right).ratio() >= 0.85 or right.startswith(left)


def _role_slots(raw: _Raw, host: str, role: str, merged: dict[str, tuple[Any, KeyPath]]) -> RoleSlots:
    count_item = merged.get(f"{role}_tasks")
    gpus_item = merged.get(f"{role}_gpus")
    ports_item = merged.get(f"{role}_ports")
    origin_path = raw.host_first[host]
    count = None
    if count_item is not None:
        count = _as_int(raw, count_item[1], count_item[0], 1, MAX_TASKS_PER_HOST, "a task count")
        origin_path = count_item[1]
    gpus = None
    auto = False
    if gpus_item is not None and gpus_item[0] == "auto":
        if count is not None:
            raise _err(raw, gpus_item[1], f"{role}_gpus: auto sets one task per GPU, but {role}_tasks is set too",
                       hint=f"drop {role}_tasks, or list the masks instead of auto")
        auto, gpus_item = True, None
        origin_path = merged[f"{role}_gpus"][1]
    if gpus_item is not None:
        value, path = gpus_item
        if not isinstance(value, list) or not value:
            got = "an empty list" if value == [] else _describe(value)
            raise _err(raw, path, f"expected a list with one GPU mask per task, got {got}",
                       hint="e.g. [[0], [1]] for two tasks with one GPU each, [[]] for one CPU-only task, "
                                 "or auto (one task per GPU found at preflight)")
        gpus = tuple(_gpu_mask(raw, path + (index,), item) for index, item in enumerate(value))
        if count is not None and count != len(gpus):
            raise _err(raw, path, f"lists {len(gpus)} GPU masks but {role}_tasks is {count}",
                       hint=f"give one mask per task, or drop {role}_tasks (the list fixes the count)")
        count = len(gpus)
        origin_path = path
    if count is None:
        count = 1
    ports = None
    if ports_item is not None:
        value, path = ports_item
        values = value if isinstance(value, list) else [value]
        ports = tuple(_as_int(raw, path + ((index,) if isinstance(value, list) else ()), port, 1, 65535,
                              "a port number") for index, port in enumerate(values))
        if len(ports) != count:
            raise _err(raw, path, f"lists {len(ports)} ports for {count} {role} task(s) on {host}",
                       hint="give one port per task")
        if len(set(ports)) != len(ports):
            raise _err(raw, path, "lists the same port twice")
        origin_path = path
    origin = _origin(raw, origin_path)
    return RoleSlots(role, count, gpus, ports, origin, auto_gpus=auto)


def load_inventory(path: str, *, display_name: str | None = None) -> Inventory:
    """Load and validate an inventory file.

    Args:
        path: the YAML file.
        display_name: how to name the file in errors (default: the path as given).

    Raises:
        InventoryError: with file, line, key path and a hint.
    """
    inventory_source = read_source(path, display_name)
    raw = _Raw(inventory_source.source)
    raw.warnings.update(dict.fromkeys(inventory_source.warnings))
    _parse_documents(raw, inventory_source)
    all_group = raw.groups.setdefault("all", _Group("all", ("all",)))
    explicit_all_children = list(all_group.children)
    for data, root in inventory_source.documents:
        for name in data or ():
            if name != "all" and name not in all_group.children:
                all_group.children.append(name)
    _check_variables(raw, inventory_source)

    depth = _depths(raw)
    membership = {name: _members(raw, name) for name in raw.groups}
    all_hosts = list(dict.fromkeys([*membership["all"], *raw.host_first]))    # (a set: N4, was O(N^2))
    role_hosts = tuple((role, tuple(membership[role])) for role in ROLES if membership.get(role))
    groups_by_host: dict[str, list[str]] = {host: [] for host in all_hosts}
    for name, members in membership.items():
        for host in members:
            groups_by_host[host].append(name)

    hosts = []
    for host in all_hosts:
        groups_of_host = groups_by_host[host]
        if "all" not in groups_of_host:
            groups_of_host.append("all")
        merged = _merged_vars(raw, host, groups_of_host, depth)
        hosts.append(_host_config(raw, host, merged, [r for r in ROLES if r in groups_of_host]))

    cluster_vars = {**all_group.vars, **raw.group_file_vars.get("all", {})}
    mode_item = cluster_vars.get("pscluster_mode")
    firewall_item = cluster_vars.get("pscluster_firewall")
    mode = PSCLUSTER_KEYS["pscluster_mode"](raw, mode_item[1], mode_item[0]) if mode_item else None
    mode_origin = _origin(raw, mode_item[1]) if mode_item else None
    firewall = _boolean(raw, firewall_item[1], firewall_item[0]) if firewall_item else False
    notify_item = cluster_vars.get("pscluster_notify")
    notify = _url_list(raw, notify_item[1], notify_item[0]) if notify_item and notify_item[0] is not None else ()
    idle_item = cluster_vars.get("pscluster_idle_ps")
    idle_ps = PSCLUSTER_KEYS["pscluster_idle_ps"](raw, idle_item[1], idle_item[0]) \
        if idle_item and idle_item[0] is not None else 0
    return Inventory(path=display_name or path, name=inventory_source.name, hosts=tuple(hosts), role_hosts=role_hosts,
                     mode=mode, mode_origin=mode_origin, firewall=firewall, warnings=tuple(raw.warnings),
                     groups=_ansible_groups(raw, explicit_all_children, groups_by_host), notify=notify,
                     defined=tuple(raw.host_first), idle_ps=idle_ps,
                     idle_ps_origin=_origin(raw, idle_item[1]) if idle_item else None)


def _parse_documents(raw: _Raw, inventory_source: InventorySource) -> None:
    """Every group of every YAML document (an inventory may be several), into ``raw``."""
    source = raw.source
    for data, root in inventory_source.documents:
        if data is None:
            continue
        if not isinstance(data, dict):
            raise InventoryError(source.file_of(root), source.line(root), "",
                                 f"expected a mapping of groups, got {_describe(data)}",
                                 hint="an inventory starts with 'all:' (see inventories/local.yaml)")
        for name, group_data in data.items():
            if root + (name,) in source.key_types:
                raise _err(raw, root + (name,), f"group name {name!r} is read by YAML as "
                                                f"{source.key_types[root + (name,)]}, not text",
                           hint=f'quote it: "{name}":')
            _parse_group(raw, name, group_data, root + (name,))
    if not raw.groups:
        raise InventoryError(source.file, None, "", "the inventory is empty",
                             hint="see inventories/local.yaml for the format")


def _check_variables(raw: _Raw, inventory_source: InventorySource) -> None:
    """Every variable (group_vars/ and host_vars/ files, groups' vars, hosts' own) checked, and
    the cluster-wide ones only where they apply to the whole cluster; the files' values are
    kept in ``raw``."""
    for kind, items, target in (
            ("group", inventory_source.vars_of(inventory_source.group_vars, raw.groups), raw.group_file_vars),
            ("host", inventory_source.vars_of(inventory_source.host_vars, raw.host_first), raw.host_file_vars)):
        for owner, values, root in items:
            for key, value in values.items():
                _check_key(raw, key, root + (key,), value)
                if key in CLUSTER_WIDE_KEYS and not (kind == "group" and owner == "all"):
                    raise _err(raw, root + (key,), f"{key} applies to the whole cluster",
                               hint="set it in group_vars/all or under all.vars")
                target.setdefault(owner, {})[key] = (value, root + (key,))
    for name, group in raw.groups.items():
        for key, (_, key_path) in group.vars.items():
            _check_key(raw, key, key_path, group.vars[key][0])
            if key in CLUSTER_WIDE_KEYS and name != "all":
                raise _err(raw, key_path, f"{key} applies to the whole cluster",
                           hint="set it under all.vars")
    for host, items in raw.host_vars.items():
        for key, value, key_path in items:
            _check_key(raw, key, key_path, value)
            if key in CLUSTER_WIDE_KEYS:
                raise _err(raw, key_path, f"{key} applies to the whole cluster", hint="set it under all.vars")

def _host_config(raw: _Raw, host: str, merged: dict[str, tuple[Any, KeyPath]], roles: list[str]) -> HostConfig:
    def get(key: str, validators: dict[str, Validator], default: Any = None) -> Any:
        item = merged.get(key)
        if item is None or item[0] is None:
            return default
        return validators[key](raw, item[1], item[0])

    connection = get("ansible_connection", CONNECTION_KEYS, "ssh")
    # slurm: steps of a job; docker: docker exec into a container (Ansible's community.docker.docker).
    connection = "docker" if connection == "community.docker.docker" else connection
    connection = connection if connection in ("local", "slurm", "docker") else "ssh"
    transport = get("pscluster_transport", PSCLUSTER_KEYS)
    if transport is not None:
        if merged.get("ansible_connection") is not None and transport != connection:
            raise _err(raw, merged["pscluster_transport"][1],
                       f"pscluster_transport: {transport} contradicts ansible_connection: "
                       f"{merged['ansible_connection'][0]} for host {host}",
                       hint="set one of the two (they mean the same)")
        connection = transport
    address = get("ansible_host", CONNECTION_KEYS) or get("ansible_ssh_host", CONNECTION_KEYS) or host
    python = get("pscluster_python", PSCLUSTER_KEYS) or get("ansible_python_interpreter", CONNECTION_KEYS)
    env = get("pscluster_env", PSCLUSTER_KEYS, ())
    secret_env = get("pscluster_secret_env", PSCLUSTER_KEYS, ())
    exposed = [name for name, _ in env if name in secret_env]
    if exposed:
        raise _err(raw, merged["pscluster_env"][1] + (exposed[0],),
                   f"{exposed[0]} is listed in pscluster_secret_env but has a plain value here",
                   hint="a secret's value comes from this machine's environment at up; "
                        "keep it out of the inventory")
    slots = tuple(_role_slots(raw, host, role, merged) for role in roles)
    first = raw.host_first[host]
    get("ansible_become_method", CONNECTION_KEYS)     # only sudo: anything else is an error, not ignored
    become_user = None
    if get("ansible_become", CONNECTION_KEYS, False):
        become_user = get("ansible_become_user", CONNECTION_KEYS, "root")
    jump = get("ansible_ssh_common_args", CONNECTION_KEYS, ()) + get("ansible_ssh_extra_args", CONNECTION_KEYS, ())
    return HostConfig(
        name=host,
        address=address,
        connection=connection,
        ssh_port=get("ansible_port", CONNECTION_KEYS) or get("ansible_ssh_port", CONNECTION_KEYS),
        # A container without ansible_user ran its TF servers as root, silently (issue 42, L10): the
        # image's own user, as docker/Dockerfile makes it; `ansible_user: root` says root on purpose.
        user=(get("ansible_user", CONNECTION_KEYS) or get("ansible_ssh_user", CONNECTION_KEYS)
              or (DOCKER_DEFAULT_USER if connection == "docker" else None)),
        key_file=get("ansible_ssh_private_key_file", CONNECTION_KEYS),
        python=python,
        workdir=get("pscluster_workdir", PSCLUSTER_KEYS),
        port_base=get("pscluster_port_base", PSCLUSTER_KEYS, DEFAULT_PORT_BASE),
        host_key_policy=get("pscluster_host_key_policy", PSCLUSTER_KEYS, "reject"),
        known_hosts=get("pscluster_known_hosts", PSCLUSTER_KEYS),
        connect_timeout=float(get("pscluster_connect_timeout", PSCLUSTER_KEYS)
                              or get("ansible_ssh_timeout", CONNECTION_KEYS, 10)),
        env=env,
        secret_env=secret_env,
        secret_env_roles=get("pscluster_secret_env_roles", PSCLUSTER_KEYS, ()),
        intra_op_threads=get("pscluster_intra_op_threads", PSCLUSTER_KEYS),
        inter_op_threads=get("pscluster_inter_op_threads", PSCLUSTER_KEYS),
        slots=slots,
        origin=_origin(raw, first),
        become_user=become_user,
        jump=jump,
        docker_args=get("ansible_docker_extra_args", CONNECTION_KEYS, ()),
        gpu_busy_mib=get("pscluster_gpu_busy_mib", PSCLUSTER_KEYS, 1024),
        standby=get("pscluster_standby", PSCLUSTER_KEYS, True),
        sync_relay=get("pscluster_sync_relay", PSCLUSTER_KEYS, True),
        keras=get("pscluster_keras", PSCLUSTER_KEYS, "keras3"),
        origins=tuple((key, _origin(raw, merged[key][1])) for key in ORIGIN_KEYS
                      if merged.get(key) is not None and merged[key][0] is not None),
    )
