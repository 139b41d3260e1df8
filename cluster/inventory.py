"""Ansible-style inventory loading and validation (pure: reads files, touches no host).

:mod:`cluster.inventory_source` reads the file or folder, YAML or INI, and the group_vars/ and
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
import functools
import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Callable

from .contracts import MODE_ALIASES, MODE_NAMES, MODES, canonical_mode  # noqa: F401  (the inventory's words)
from .errors import InventoryError
from .hostnames import MAX_RANGE_HOSTS, check_host_name, expand_host_pattern, split_host_port  # noqa: F401
from .inventory_source import read_source
from .yamlsrc import KeyPath, SourceMap, display_path

ROLES = ("chief", "ps", "worker", "evaluator")
ROLE_SUFFIXES = ("tasks", "gpus", "ports")
HOST_KEY_POLICIES = ("reject", "accept-new")
# pscluster_keras / run --keras: which Keras a `run` program's `tf.keras` is. "legacy" sets
# TF_USE_LEGACY_KERAS=1 (tf-keras), under which Keras `fit` runs under the multi-worker
# strategies that Keras 3 fails in TensorFlow 2.21 (keras-team/keras#20585).
KERAS_CHOICES = ("keras3", "legacy")
DEFAULT_PORT_BASE = 2222
PASSWORD_KEYS = ("ansible_password", "ansible_ssh_pass", "ansible_ssh_password",
                 "ansible_become_password", "ansible_become_pass", "ansible_sudo_pass")
# Set by pscluster per task; a user value would silently break the cluster. (PSCLUSTER_* names
# pscluster does not set, such as PSCLUSTER_TRACE_STEPS, are settings the user may give.)
RESERVED_ENV = ("TF_CONFIG", "CUDA_VISIBLE_DEVICES")
PLANNED_PSCLUSTER_ENV = (   # cluster.plan._task_env, pscluster_*_op_threads, cluster.runspec.program_env
    "PSCLUSTER_CLUSTER", "PSCLUSTER_TASK", "PSCLUSTER_INTRA_OP_THREADS", "PSCLUSTER_INTER_OP_THREADS",
    "PSCLUSTER_TASK_TYPE", "PSCLUSTER_TASK_INDEX", "PSCLUSTER_NUM_WORKERS", "PSCLUSTER_NUM_PS",
    "PSCLUSTER_PS_HOSTS", "PSCLUSTER_WORKER_HOSTS", "PSCLUSTER_CHIEF_HOSTS", "PSCLUSTER_HOST", "PSCLUSTER_PORT")
_CONTROL_CHAR = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")     # C0 but tab, DEL, C1
# \Z, not $: "$" also matches before a final newline, which let "TF_CONFIG\n" through (N12).
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# Hosts in one inventory, every pattern and file together (the range cap is per pattern: 30
# ranges of 10,000 in 640 bytes ran past 60 s). Tasks are capped in cluster.plan (MAX_TASKS).
MAX_HOSTS = 10_000


@dataclass(frozen=True)
class Origin:
    """Where a value was written: for errors raised after loading (plan, preflight)."""

    file: str
    line: int | None
    key_path: str

    def error(self, message: str, hint: str | None = None) -> InventoryError:
        return InventoryError(self.file, self.line, self.key_path, message, hint=hint)


@dataclass(frozen=True)
class RoleSlots:
    """The tasks of one role on one host, as the inventory asks for them.

    ``gpus`` holds one CUDA_VISIBLE_DEVICES value per task ("" = CPU only), or None when the
    inventory sets no mask (the role's default applies). ``ports`` are explicit ports or None.
    """

    role: str
    count: int
    gpus: tuple[str, ...] | None
    ports: tuple[int, ...] | None
    origin: Origin
    # `<role>_gpus: auto`: one task per GPU that nvidia-smi lists on the host, known only at
    # preflight; until then ``count`` is 1 and ``gpus`` None (plan shows "auto").
    auto_gpus: bool = False


@dataclass(frozen=True)
class HostConfig:
    """One inventory host with its merged, validated variables."""

    name: str
    address: str
    connection: str                   # "ssh", "local" or "slurm"
    ssh_port: int | None
    user: str | None
    key_file: str | None
    python: str | None
    workdir: str | None
    port_base: int
    host_key_policy: str
    known_hosts: str | None
    connect_timeout: float
    env: tuple[tuple[str, str], ...]
    secret_env: tuple[str, ...]
    intra_op_threads: int | None
    inter_op_threads: int | None
    slots: tuple[RoleSlots, ...]
    origin: Origin
    # ansible_become: tasks run as this user through `sudo -n -H -u USER` (None: as the SSH user).
    become_user: str | None = None
    # ProxyJump hops ("[user@]host[:port]", first hop first) from ansible_ssh_common_args/extra_args.
    jump: tuple[str, ...] = ()
    # A GPU with more memory in use than this (MiB) is busy at preflight (pscluster_gpu_busy_mib).
    gpu_busy_mib: int = 1024
    # Standing server roles that also get this host's secrets (pscluster_secret_env_roles).
    secret_env_roles: tuple[str, ...] = ()
    # pscluster_standby: `up` starts a standby (TensorFlow imported) for this host's training tasks.
    standby: bool = True
    # pscluster_keras: the Keras of `run` programs on this host (KERAS_CHOICES).
    keras: str = "keras3"
    # Where each connection and placement setting of this host was written (ORIGIN_KEYS), for
    # `plan` and for errors found after loading (an SSH port a task would take).
    origins: tuple[tuple[str, Origin], ...] = ()

    def origin_of(self, key: str) -> Origin | None:
        return dict(self.origins).get(key)

    def slots_for(self, role: str) -> RoleSlots | None:
        return next((slot for slot in self.slots if slot.role == role), None)


@dataclass(frozen=True)
class Inventory:
    """A validated inventory: hosts in file order and, per role, its hosts in order."""

    path: str
    name: str
    hosts: tuple[HostConfig, ...]
    role_hosts: tuple[tuple[str, tuple[str, ...]], ...]
    mode: str | None
    mode_origin: Origin | None
    firewall: bool
    # "file:line: key: ... ignored" for ansible_* keys pscluster does not use (the CLI prints them).
    warnings: tuple[str, ...] = ()
    # Every group (roles and others, e.g. "gpu") with its hosts, for --limit patterns: as Ansible
    # holds them ("all", "ungrouped", then in definition order; hosts in Group.get_hosts order).
    groups: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # Host names in the order the files define them (Ansible's order when a pattern matches names).
    defined: tuple[str, ...] = ()
    # pscluster_notify: URLs that train and run POST job state changes to (cluster.notify).
    notify: tuple[str, ...] = ()

    def host(self, name: str) -> HostConfig:
        return self._by_name[name]

    @functools.cached_property
    def _by_name(self) -> dict[str, HostConfig]:
        return {host.name: host for host in self.hosts}

    def hosts_of(self, role: str) -> tuple[str, ...]:
        return dict(self.role_hosts).get(role, ())


# ----------------------------------------------------------------------------- raw structure

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
        host_path = path + ("hosts", pattern)
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


def _describe(value: Any) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, dict)):
        return f"a {type(value).__name__}"
    return repr(value)


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


# ----------------------------------------------------------------------------- validation

# Spaces and tabs only: \s also takes \x1c-\x1f, which int() refuses ("2222\x1d" was a ValueError
# traceback), and $ a final newline.
_INT_TEXT = re.compile(r"[ \t]*[+-]?[0-9]+[ \t]*\Z")


def _as_int(raw: _Raw, path: KeyPath, value: Any, low: int, high: int, what: str) -> int:
    """An integer, or a string of one: Ansible converts ``ansible_port: "2222"`` (or INI's
    ``ansible_port='2222'``) to 2222, so pscluster does too, for every integer setting."""
    if isinstance(value, str) and _INT_TEXT.match(value) and len(value) < 100:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _err(raw, path, f"expected {what}, got {_describe(value)}",
                   hint=f"write a whole number, e.g. {max(low, min(high, 22 if 'port' in what else 1))}")
    if not low <= value <= high:
        raise _err(raw, path, f"expected {what} between {low} and {high}, got {value}")
    return value


def _as_str(raw: _Raw, path: KeyPath, value: Any, what: str = "a string") -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise _err(raw, path, f"expected {what}, got {_describe(value)}")
    text = str(value)
    if not text.strip():
        raise _err(raw, path, f"expected {what}, got an empty value")
    bad = _CONTROL_CHAR.search(text)
    if bad:     # (issue 25: they reached argv, paths and the output; nothing needs them)
        raise _err(raw, path, f"expected {what}, got a control character ({bad.group()!r})")
    return text


def _gpu_mask(raw: _Raw, path: KeyPath, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, list)):
        raise _err(raw, path, f"expected a GPU index or a list of them, got {_describe(value)}",
                   hint="write 0, [0, 1], or [] for a CPU-only task")
    items = value if isinstance(value, list) else [value]
    for index, item in enumerate(items):
        item_path = path + (index,) if isinstance(value, list) else path
        if isinstance(item, bool) or not isinstance(item, int) or item < 0:
            raise _err(raw, item_path, f"expected a GPU index (0, 1, ...), got {_describe(item)}",
                       hint="GPU indices are the numbers 'nvidia-smi -L' prints")
    repeated = sorted({item for item in items if items.count(item) > 1})
    if repeated:
        raise _err(raw, path, f"GPU {', '.join(map(str, repeated))} listed twice in one mask")
    return ",".join(str(item) for item in items)


Validator = Callable[[_Raw, KeyPath, Any], Any]


def _env_map(raw: _Raw, path: KeyPath, value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict):
        raise _err(raw, path, f"expected a mapping NAME: value, got {_describe(value)}",
                   hint="e.g. pscluster_env: {OMP_NUM_THREADS: 2}")
    result = []
    for name, item in value.items():
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise _err(raw, path + (name,), f"{name!r} is not a valid environment variable name")
        if name in RESERVED_ENV or name in PLANNED_PSCLUSTER_ENV:
            raise _err(raw, path + (name,), f"{name} is set by pscluster for each task",
                       hint="use <role>_gpus for CUDA_VISIBLE_DEVICES, pscluster_intra_op_threads/"
                            "pscluster_inter_op_threads for the thread counts; TF_CONFIG and PSCLUSTER_TASK, "
                            "_CLUSTER... come from the plan")
        if item is None or isinstance(item, (dict, list)):
            raise _err(raw, path + (name,), f"expected a string or number, got {_describe(item)}")
        text = str(item).lower() if isinstance(item, bool) else str(item)
        if "\0" in text:      # the process could not start (Popen's ValueError): refuse it here, by name
            raise _err(raw, path + (name,), f"the value of {name} holds a NUL character",
                       hint="an environment value cannot hold \\0")
        result.append((name, text))
    return tuple(result)


def _name_list(raw: _Raw, path: KeyPath, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise _err(raw, path, f"expected a list of environment variable names, got {_describe(value)}",
                   hint="e.g. pscluster_secret_env: [WANDB_API_KEY]; values go in pscluster_env "
                        "or in this machine's environment")
    for index, item in enumerate(value):
        if not _ENV_NAME.match(item):
            raise _err(raw, path + (index,), f"{item!r} is not a valid environment variable name")
        if item in RESERVED_ENV or item.startswith("PSCLUSTER_"):
            raise _err(raw, path + (index,), f"{item} is set by pscluster for each task and cannot be a secret",
                       hint="TF_CONFIG, CUDA_VISIBLE_DEVICES and PSCLUSTER_* come from the plan")
    return tuple(value)


def _role_list(raw: _Raw, path: KeyPath, value: Any) -> tuple[str, ...]:
    standing = ("ps", "worker")
    if not isinstance(value, list) or not all(item in standing for item in value):
        raise _err(raw, path, f"expected a list of standing server roles, got {_describe(value)}",
                   hint="e.g. pscluster_secret_env_roles: [ps, worker] also gives the secrets to the servers "
                        "that up starts (whose environment anyone reaching their port can read)")
    return tuple(dict.fromkeys(value))


def _url_list(raw: _Raw, path: KeyPath, value: Any) -> tuple[str, ...]:
    """pscluster_notify: one http(s) URL or a list of them (shown masked in every message)."""
    from .notify import url_problem
    items = value if isinstance(value, list) else [value]
    if not items or not all(isinstance(item, str) for item in items):
        raise _err(raw, path, f"expected a URL or a list of URLs, got {_describe(value)}",
                   hint="e.g. pscluster_notify: https://hooks.example.com/T/B/KEY")
    for index, item in enumerate(items):
        problem = url_problem(item)
        if problem:
            raise _err(raw, path + (index,) if isinstance(value, list) else path, problem,
                       hint="notifications are POSTed to http:// or https:// URLs; for mail or a chat CLI use "
                            "train --notify-cmd")
    return tuple(dict.fromkeys(items))


def _choice(options: tuple[str, ...]) -> Validator:
    def check(raw: _Raw, path: KeyPath, value: Any) -> str:
        if value not in options:
            raise _err(raw, path, f"expected one of {', '.join(options)}, got {_describe(value)}")
        return value
    return check


def _boolean(raw: _Raw, path: KeyPath, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _err(raw, path, f"expected true or false, got {_describe(value)}")
    return value


PSCLUSTER_KEYS: dict[str, Validator] = {
    "pscluster_python": lambda raw, path, value: _as_str(raw, path, value, "an interpreter path"),
    "pscluster_workdir": lambda raw, path, value: _as_str(raw, path, value, "a directory path"),
    "pscluster_port_base": lambda raw, path, value: _as_int(raw, path, value, 1024, 65000, "a port number"),
    "pscluster_host_key_policy": _choice(HOST_KEY_POLICIES),
    # How pscluster reaches the host (issue 13's name); the same as ansible_connection's ssh/local/slurm.
    "pscluster_transport": _choice(("ssh", "local", "slurm")),
    "pscluster_known_hosts": lambda raw, path, value: _as_str(raw, path, value, "a known_hosts path"),
    "pscluster_env": _env_map,
    "pscluster_secret_env": _name_list,
    "pscluster_secret_env_roles": _role_list,
    "pscluster_mode": lambda raw, path, value: canonical_mode(_choice(MODE_NAMES)(raw, path, value)),
    "pscluster_firewall": _boolean,
    "pscluster_intra_op_threads": lambda raw, path, value: _as_int(raw, path, value, 0, 1024, "a thread count"),
    "pscluster_inter_op_threads": lambda raw, path, value: _as_int(raw, path, value, 0, 1024, "a thread count"),
    "pscluster_connect_timeout": lambda raw, path, value: _as_int(raw, path, value, 1, 600, "seconds"),
    "pscluster_gpu_busy_mib": lambda raw, path, value: _as_int(raw, path, value, 0, 10_000_000, "MiB"),
    "pscluster_standby": _boolean,
    "pscluster_notify": _url_list,
    "pscluster_keras": _choice(KERAS_CHOICES),
}
# Keys whose file and line `plan` shows for each host (how it is reached, where code runs).
ORIGIN_KEYS = ("ansible_host", "ansible_ssh_host", "ansible_port", "ansible_ssh_port", "ansible_user",
               "ansible_ssh_user", "ansible_ssh_private_key_file", "ansible_ssh_common_args",
               "ansible_ssh_extra_args", "ansible_become", "ansible_become_user", "ansible_connection",
               "pscluster_transport", "ansible_python_interpreter", "pscluster_python", "pscluster_workdir",
               "pscluster_port_base", "ansible_ssh_timeout", "pscluster_connect_timeout")
# Settings of the whole cluster: only `all.vars` may set them.
CLUSTER_WIDE_KEYS = ("pscluster_mode", "pscluster_firewall", "pscluster_notify")

CONNECTION_KEYS: dict[str, Validator] = {
    "ansible_host": lambda raw, path, value: _address(raw, path, value),
    "ansible_ssh_host": lambda raw, path, value: _address(raw, path, value),
    "ansible_port": lambda raw, path, value: _as_int(raw, path, value, 1, 65535, "an SSH port"),
    "ansible_ssh_port": lambda raw, path, value: _as_int(raw, path, value, 1, 65535, "an SSH port"),
    "ansible_user": lambda raw, path, value: _as_str(raw, path, value, "a user name"),
    "ansible_ssh_user": lambda raw, path, value: _as_str(raw, path, value, "a user name"),
    "ansible_ssh_timeout": lambda raw, path, value: _as_int(raw, path, value, 1, 600, "seconds"),
    "ansible_host_key_checking": lambda raw, path, value: _ansible_bool(raw, path, value),
    "ansible_ssh_private_key_file": lambda raw, path, value: _as_str(raw, path, value, "a key file path"),
    "ansible_connection": _choice(("ssh", "local", "paramiko", "smart", "slurm")),
    "ansible_python_interpreter": lambda raw, path, value: _as_str(raw, path, value, "an interpreter path"),
    "ansible_become": lambda raw, path, value: _ansible_bool(raw, path, value),
    "ansible_become_user": lambda raw, path, value: _as_str(raw, path, value, "a user name"),
    "ansible_become_method": _choice(("sudo",)),
    "ansible_group_priority": lambda raw, path, value: _as_int(raw, path, value, -1_000_000, 1_000_000, "a priority"),
    "ansible_ssh_common_args": lambda raw, path, value: _ssh_jumps(raw, path, value),
    "ansible_ssh_extra_args": lambda raw, path, value: _ssh_jumps(raw, path, value),
}


def _address(raw: _Raw, path: KeyPath, value: Any) -> str:
    text = _as_str(raw, path, value, "a host name or address")
    problem = check_host_name(text)
    if problem:
        raise _err(raw, path, problem, hint="ansible_host is a host name, IPv4 or IPv6 address")
    return text


def _ansible_bool(raw: _Raw, path: KeyPath, value: Any) -> bool:
    """Ansible's booleans: true/false, yes/no, on/off, 1/0 (as YAML or as INI strings)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("yes", "true", "on", "1", "y"):
        return True
    if text in ("no", "false", "off", "0", "n"):
        return False
    raise _err(raw, path, f"expected true or false, got {_describe(value)}")


# ssh's own option letters that take an argument (its getopt string), so "-i key" is one option.
_SSH_ARG_LETTERS = frozenset("bcDeEFiIJlLmOopPQRSwWB")


def _ssh_options(raw: _Raw, path: KeyPath, value: Any) -> list[tuple[str, str, str]]:
    """Split an ssh argument string into options: (as written, lower-case name, value).

    ``-o Key=Value``, ``-oKey=Value`` and ``-o "Key Value"`` give the option's name; a flag
    (``-C``, ``-vv``) or a letter with an argument (``-i FILE``, ``-J HOPS``) gives ``-X``.
    """
    text = _as_str(raw, path, value, "ssh arguments")
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise _err(raw, path, f"cannot split the ssh arguments: {exc}") from None
    options: list[tuple[str, str, str]] = []
    index = 0
    while index < len(words):
        word = words[index]
        index += 1
        if not word.startswith("-") or len(word) < 2:
            options.append((word, word.lower(), ""))        # a stray word: reported as it is
            continue
        letters = word[1:]
        while letters:
            letter, letters = letters[0], letters[1:]
            if letter not in _SSH_ARG_LETTERS:
                options.append((f"-{letter}", f"-{letter}", ""))
                continue
            argument = letters
            if not argument and index < len(words):
                argument = words[index]
                index += 1
            letters = ""
            if letter == "o":
                name, _, setting = argument.replace("=", " ", 1).partition(" ")
                options.append((f"-o {argument}", name.strip().lower(), setting.strip()))
            else:
                options.append((f"-{letter} {argument}", f"-{letter}", argument))
    return options


def _jump_hops(name: str, setting: str) -> tuple[str, ...] | None:
    """The hops of a ProxyJump option (None if the option is something else)."""
    if name not in ("proxyjump", "-J"):
        return None
    if setting.lower() == "none":
        return ("none",)        # said outright: no hop, not even ~/.ssh/config's (the transport reads it)
    return tuple(hop.strip() for hop in setting.split(",") if hop.strip())


def _ssh_jumps(raw: _Raw, path: KeyPath, value: Any) -> tuple[str, ...]:
    """The ProxyJump hops in an ssh argument string (-J HOPS, -o ProxyJump=HOPS)."""
    hops: list[str] = []
    for _, name, setting in _ssh_options(raw, path, value):
        hops.extend(_jump_hops(name, setting) or ())
    return tuple(hops)


# ssh options that turn host-key checking off: pscluster keeps it on whatever they say.
_HOST_KEY_OFF = {"stricthostkeychecking": ("no", "off", "false"),
                 "userknownhostsfile": ("/dev/null",)}


def _warn_ssh_options(raw: _Raw, path: KeyPath, value: Any) -> None:
    """Warn about every option of ansible_ssh_*_args that pscluster does not honour (all but ProxyJump)."""
    if not isinstance(value, str):
        return                                   # the validator names the wrong type
    try:
        options = _ssh_options(raw, path, value)
    except InventoryError:
        return                                   # the validator reports it as an error
    for written, name, setting in options:
        if _jump_hops(name, setting) is not None:
            continue
        if setting.lower() in _HOST_KEY_OFF.get(name, ()):
            _warn(raw, path, f"ssh option {written!r} ignored: pscluster keeps host-key checking on",
                  "set pscluster_host_key_policy: accept-new to trust a new host's key on first use")
        else:
            _warn(raw, path, f"ssh option {written!r} ignored: pscluster honours only ProxyJump (-J) here",
                  "pscluster connects with paramiko, not the ssh command; of ~/.ssh/config it reads "
                  "HostName, User, Port, IdentityFile and ProxyJump")


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


def _warn(raw: _Raw, path: KeyPath, message: str, hint: str | None = None) -> None:
    text = str(_err(raw, path, message, hint))
    raw.warnings.setdefault(text)


def _similar(left: str, right: str) -> bool:
    """Typo detector for setting names (a letter missing, added, swapped or wrong)."""
    return difflib.SequenceMatcher(None, left, right).ratio() >= 0.85 or right.startswith(left)


def _origin(raw: _Raw, path: KeyPath) -> Origin:
    return Origin(raw.source.file_of(path), raw.source.line(path), display_path(path))


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


def _role_slots(raw: _Raw, host: str, role: str, merged: dict[str, tuple[Any, KeyPath]]) -> RoleSlots:
    count_item = merged.get(f"{role}_tasks")
    gpus_item = merged.get(f"{role}_gpus")
    ports_item = merged.get(f"{role}_ports")
    origin_path = raw.host_first[host]
    count = None
    if count_item is not None:
        count = _as_int(raw, count_item[1], count_item[0], 1, 64, "a task count")
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
    source = inventory_source.source
    raw = _Raw(source)
    raw.warnings.update(dict.fromkeys(inventory_source.warnings))
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
    all_group = raw.groups.setdefault("all", _Group("all", ("all",)))
    explicit_all_children = list(all_group.children)
    for data, root in inventory_source.documents:
        for name in data or ():
            if name != "all" and name not in all_group.children:
                all_group.children.append(name)
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
    return Inventory(path=display_name or path, name=inventory_source.name, hosts=tuple(hosts), role_hosts=role_hosts,
                     mode=mode, mode_origin=mode_origin, firewall=firewall, warnings=tuple(raw.warnings),
                     groups=_ansible_groups(raw, explicit_all_children, groups_by_host), notify=notify,
                     defined=tuple(raw.host_first))


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


def _host_config(raw: _Raw, host: str, merged: dict[str, tuple[Any, KeyPath]], roles: list[str]) -> HostConfig:
    def get(key: str, validators: dict[str, Validator], default: Any = None) -> Any:
        item = merged.get(key)
        if item is None or item[0] is None:
            return default
        return validators[key](raw, item[1], item[0])

    connection = get("ansible_connection", CONNECTION_KEYS, "ssh")
    connection = connection if connection in ("local", "slurm") else "ssh"   # slurm: steps of a job
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
        user=get("ansible_user", CONNECTION_KEYS) or get("ansible_ssh_user", CONNECTION_KEYS),
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
        gpu_busy_mib=get("pscluster_gpu_busy_mib", PSCLUSTER_KEYS, 1024),
        standby=get("pscluster_standby", PSCLUSTER_KEYS, True),
        keras=get("pscluster_keras", PSCLUSTER_KEYS, "keras3"),
        origins=tuple((key, _origin(raw, merged[key][1])) for key in ORIGIN_KEYS
                      if merged.get(key) is not None and merged[key][0] is not None),
    )
