"""Cluster planning: from an :class:`~cluster.inventory.Inventory` to a :class:`ClusterPlan`.

Pure: no host, clock or environment is read, so ``plan --json``, ``up`` and the tests agree on
every port, mask and TF_CONFIG. What each mode runs:

========  =======================================  ==========================================
mode      standing servers (started by ``up``)     training processes (started by ``train``)
========  =======================================  ==========================================
async     every ps and worker task                 the chief (ClusterCoordinator)
sync      none                                     one per worker (worker 0 acts as chief)
sync-ps   every ps task                            one per worker (worker 0 acts as chief)
========  =======================================  ==========================================

In every mode an ``evaluator`` task, when the inventory has one (at most one), is a job process
too: ``python -m roles.evaluate`` evaluates each checkpoint the leader writes (side-car
evaluation). As TensorFlow expects, it is not part of the cluster spec; its TF_CONFIG names the
cluster and ``{"type": "evaluator", "index": 0}``.
"""
from __future__ import annotations

import functools
import ipaddress
import json
from dataclasses import dataclass, replace
from typing import Any, cast

from .errors import PlanError
from .contracts import MODE_NAMES, MODE_ROLES, MODES, resolve_mode
from .inventory import ROLES, HostConfig, Inventory, RoleSlots
from .layout import HostLayout
from .names import check_cluster_name
from .urls import mask_url

UNUSED_REASONS = {
    ("sync", "chief"): "sync mode: worker 0 acts as chief",
    ("sync", "ps"): "sync mode (MultiWorkerMirroredStrategy) uses no parameter servers",
    ("sync-ps", "chief"): "sync-ps mode: worker 0 acts as chief",
}
EVALUATOR = "evaluator"     # a job process in every mode, outside the cluster spec
LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")
DEFAULT_REMOTE_WORKDIR = "~/pscluster"
AUTO_GPUS = "auto"          # a task's mask until preflight counts the host's GPUs (plan shows it)
DEFAULT_REMOTE_PYTHON = "python3"
# Defaults every task gets; a host's pscluster_env overrides any of them. TF logging
# is quieted. oneDNN's CPU kernels are turned on: TensorFlow enables them by itself
# only on CPUs with AVX-512 VNNI/AMX-class features; on this project's AMD test machine
# they make distributed_mnist train 1.4-3x faster (CNN) and 1.05-1.5x (MLP) in every mode
# (benchmarks/onednn.py). pscluster_env: {TF_ENABLE_ONEDNN_OPTS: 0} turns them off.
BASE_ENV = (("GRPC_FAIL_FAST", "use_caller"), ("TF_CPP_MIN_LOG_LEVEL", "1"), ("PYTHONUNBUFFERED", "1"),
            ("TF_ENABLE_ONEDNN_OPTS", "1"))
# Every TF_CONFIG holds the whole cluster, so N tasks' TF_CONFIGs are O(N^2): 10,000 tasks
# made 1.3 GB of `plan` text and a 23 GB `plan --json`. A task's TF_CONFIG is therefore not
# stored in its TaskSpec (ClusterPlan.tf_config builds it from the one cluster spec when a
# process starts), and `plan` shows it in full per task only up to this many tasks.
INLINE_TF_CONFIG_TASKS = 100
MAX_TASKS = 20_000      # a cluster's tasks, all roles (caps what one inventory can ask for)


def machine_address(address: str) -> str:
    """One spelling per machine for ``address``, for ports that must not collide on one machine:
    a DNS name is case-blind, an IPv6 address has many spellings. Two
    inventory hosts ``Node1.example`` and ``node1.example`` were planned the same port (issue 46,
    "a 1,000-host inventory with duplicate addresses"). A name and the IP it resolves to stay
    two keys: planning resolves no names."""
    try:
        return ipaddress.ip_address(address.split("%", 1)[0]).compressed + \
            ("%" + address.split("%", 1)[1] if "%" in address else "")
    except ValueError:
        return address.lower()


def host_port(address: str, port: int) -> str:
    """``host:port``, with IPv6 addresses in brackets as gRPC and TF_CONFIG expect."""
    if ":" in address and not address.startswith("["):
        return f"[{address}]:{port}"
    return f"{address}:{port}"


@dataclass(frozen=True)
class HostSpec:
    """How to reach one host and run things there."""

    name: str
    address: str
    connection: str            # "ssh" | "local" | "slurm" | "docker"
    ssh_port: int | None
    user: str | None
    key_file: str | None
    python: str
    workdir: str
    host_key_policy: str
    known_hosts: str | None
    connect_timeout: float
    secret_env: tuple[str, ...] = ()
    secret_env_roles: tuple[str, ...] = ()     # standing roles that also get the secrets
    jump: tuple[str, ...] = ()                 # ProxyJump hops "[user@]host[:port]", first hop first
    docker_args: tuple[str, ...] = ()          # ansible_docker_extra_args (connection docker)
    become_user: str | None = None             # tasks run as this user (sudo -n -H -u)
    gpu_busy_mib: int = 1024                   # a GPU using more memory is busy at preflight
    # A standby (roles/standby.py) for this host's training tasks: pscluster_standby, never on
    # Slurm (a step's cgroup and GPUs are fixed when it starts, before the job is known).
    standby: bool = True
    sync_relay: bool = True       # pscluster_sync_relay: fetch the code from peers (cluster/hosts/relay.py)
    # pscluster_keras: "legacy" gives `run` programs here TF_USE_LEGACY_KERAS=1 (cluster.program.runspec);
    # `train` and the standing servers keep Keras 3 (roles/ is written for it).
    keras: str = "keras3"
    # (inventory key, "file:line") for each connection and placement setting the inventory wrote.
    origins: tuple[tuple[str, str], ...] = ()

    @property
    def is_local(self) -> bool:
        return self.connection == "local"


@dataclass(frozen=True)
class TaskSpec:
    """One TensorFlow process of the cluster."""

    role: str
    index: int
    host: str
    address: str
    port: int
    cuda_visible_devices: str | None
    standing: bool
    env: tuple[tuple[str, str], ...]      # planned variables but TF_CONFIG (ClusterPlan.task_env adds it)
    argv: tuple[str, ...]
    workdir: str
    log_path: str
    events_path: str

    @property
    def name(self) -> str:
        return f"{self.role}:{self.index}"

    @property
    def target(self) -> str:
        return host_port(self.address, self.port)


@dataclass(frozen=True)
class ClusterPlan:
    """Everything ``up``, ``train`` and ``down`` need to know about a cluster."""

    name: str
    mode: str
    inventory_path: str
    cluster: tuple[tuple[str, tuple[str, ...]], ...]
    tasks: tuple[TaskSpec, ...]
    hosts: tuple[HostSpec, ...]
    unused: tuple[tuple[str, str], ...] = ()
    firewall: bool = False
    notify: tuple[str, ...] = ()      # pscluster_notify URLs (secrets inside: shown masked)
    # sha256 of the inventory (cluster.inventory.source.inventory_digest) when `up`/`scale` pinned it,
    # with inventory_path made absolute: re-plans refuse another content (issue 42, M3).
    inventory_sha256: str | None = None
    # pscluster_idle_ps (async): the chief keeps the last ``idle_ps`` ps tasks free of variables
    # (its PSCLUSTER_IDLE_PS), so that a drain can move the only other ps onto one in place.
    idle_ps: int = 0

    @property
    def auto_gpu_hosts(self) -> tuple[str, ...]:
        """Hosts with `<role>_gpus: auto` tasks not yet resolved against their GPUs."""
        return tuple(dict.fromkeys(t.host for t in self.tasks if t.cuda_visible_devices == AUTO_GPUS))

    def host(self, name: str) -> HostSpec:
        return self._hosts_by_name[name]

    def task(self, name: str) -> TaskSpec:
        return self._tasks_by_name[name]

    def tasks_on(self, host: str) -> tuple[TaskSpec, ...]:
        """The tasks placed on ``host``, in plan order (an index: not a scan of every task per host)."""
        return self._tasks_by_host.get(host, ())

    @property
    def leader(self) -> TaskSpec:
        """The task that drives a training job and keeps its checkpoints: the chief in async mode,
        else worker 0."""
        return self.task("chief:0") if self.mode == "async" else self.task("worker:0")

    # Indexes built on first use (a frozen dataclass may cache in its __dict__): a lookup per
    # task must not scan every task (10,000 tasks made `plan` quadratic).
    @functools.cached_property
    def _hosts_by_name(self) -> dict[str, HostSpec]:
        return {host.name: host for host in self.hosts}

    @functools.cached_property
    def _tasks_by_name(self) -> dict[str, TaskSpec]:
        return {task.name: task for task in self.tasks}

    @functools.cached_property
    def _tasks_by_host(self) -> dict[str, tuple[TaskSpec, ...]]:
        grouped: dict[str, list[TaskSpec]] = {}
        for task in self.tasks:
            grouped.setdefault(task.host, []).append(task)
        return {host: tuple(tasks) for host, tasks in grouped.items()}

    @functools.cached_property
    def _cluster_json(self) -> str:
        return _compact_json(self.cluster_spec)

    @property
    def cluster_spec(self) -> dict[str, list[str]]:
        return {job: list(addresses) for job, addresses in self.cluster}

    def tf_config_text(self, task: TaskSpec) -> str:
        """``task``'s TF_CONFIG: the cluster spec and its own type and index (an evaluator's
        names the cluster it is not part of, as TensorFlow expects)."""
        return f'{{"cluster":{self._cluster_json},"task":{_compact_json({"type": task.role, "index": task.index})}}}'

    def tf_config(self, task: TaskSpec) -> dict[str, Any]:
        return cast(dict[str, Any], json.loads(self.tf_config_text(task)))

    def task_env(self, task: TaskSpec) -> dict[str, str]:
        """``task``'s planned environment, TF_CONFIG included (secrets are added at start)."""
        env = {key: value for key, value in task.env if key != "TF_CONFIG"}   # (a state of an older version)
        env["TF_CONFIG"] = self.tf_config_text(task)
        return env

    @property
    def inline_tf_config(self) -> bool:
        """Whether ``plan`` shows each task's TF_CONFIG in full (see INLINE_TF_CONFIG_TASKS)."""
        return len(self.tasks) <= INLINE_TF_CONFIG_TASKS

    def tasks_of(self, role: str) -> tuple[TaskSpec, ...]:
        return tuple(task for task in self.tasks if task.role == role)

    @property
    def standing_tasks(self) -> tuple[TaskSpec, ...]:
        return tuple(task for task in self.tasks if task.standing)

    @property
    def training_tasks(self) -> tuple[TaskSpec, ...]:
        """The tasks ``train`` starts ``roles.train`` on (not the evaluator)."""
        return tuple(task for task in self.tasks if not task.standing and task.role != EVALUATOR)

    @property
    def evaluator_tasks(self) -> tuple[TaskSpec, ...]:
        """The side-car evaluator ``train`` starts beside the trainers (none or one)."""
        return self.tasks_of(EVALUATOR)

    @property
    def is_multi_host(self) -> bool:
        return len({task.address for task in self.tasks}) > 1

    def to_json(self) -> dict[str, Any]:
        """The ``plan --json`` document. Beyond INLINE_TF_CONFIG_TASKS tasks, a task's
        ``tf_config`` holds only its ``task`` (its cluster is the document's ``cluster``) and its
        ``env`` no TF_CONFIG; ``tf_config_inline`` says which."""
        inline = self.inline_tf_config
        return {
            "name": self.name,
            "mode": self.mode,
            "inventory": self.inventory_path,
            "cluster": self.cluster_spec,
            "tf_config_inline": inline,
            "tasks": [{
                "role": task.role, "index": task.index, "host": task.host,
                "address": task.address, "port": task.port,
                "cuda_visible_devices": task.cuda_visible_devices,
                "tf_config": self.tf_config(task) if inline else {"task": {"type": task.role, "index": task.index}},
                "argv": list(task.argv),
                "standing": task.standing, "env": self.task_env(task) if inline else dict(task.env),
                "workdir": task.workdir, "log_path": task.log_path,
            } for task in self.tasks],
            "hosts": [{
                "name": host.name, "address": host.address, "transport": host.connection,
                "ssh_port": host.ssh_port, "user": host.user, "key_file": host.key_file,
                "jump": list(host.jump), "become_user": host.become_user, "python": host.python,
                "workdir": host.workdir, "sources": dict(host.origins),
                **({"docker_args": list(host.docker_args)} if host.connection == "docker" else {}),
            } for host in self.hosts],
            "unused": [{"role": role, "reason": reason} for role, reason in self.unused],
            "notify": [mask_url(url) for url in self.notify],
            "idle_ps": self.idle_ps,
        }


@dataclass(frozen=True)
class PlanOptions:
    """Choices that do not come from the inventory.

    ``local_python`` and ``local_workdir`` are the interpreter and checkout of this machine,
    used for ``ansible_connection: local`` hosts that do not set their own.
    """

    local_python: str
    local_workdir: str
    name: str | None = None
    mode: str | None = None
    port_base: int | None = None
    # `pscluster run` (one shot): every task of these roles runs the user's program (none
    # stands); the cluster spec holds these roles, the evaluator excepted (TensorFlow's
    # convention: an evaluator is not part of the cluster). None: the mode decides.
    roles: tuple[str, ...] | None = None


@dataclass(frozen=True)
class _Slot:
    role: str
    index: int
    host: HostConfig
    gpus: str | None
    explicit_port: int | None
    slots: RoleSlots


def plan_cluster(inventory: Inventory, options: PlanOptions) -> ClusterPlan:
    """Plan the cluster an inventory describes.

    Raises:
        PlanError: the mode cannot run on these groups, or ports collide.
        InventoryError: an explicit setting conflicts (named by file and line).
    """
    mode = resolve_mode(options.mode, inventory.mode, roles=inventory.mode_roles())
    if mode not in MODES:
        raise PlanError(f"unknown mode {mode!r}", hint=f"choose one of {', '.join(MODE_NAMES)}")
    name = check_cluster_name(options.name) if options.name else \
        check_cluster_name(inventory.name, source=inventory.path)
    slots = _slots(inventory)
    _check_auto_gpus_per_machine(slots)
    ports = _assign_ports(slots, options.port_base,
                          [host for host in inventory.hosts if host.connection == "ssh"])
    host_specs = {host.name: _host_spec(host, options) for host in inventory.hosts}

    role_table = MODE_ROLES[mode] + ((EVALUATOR, False),) if options.roles is None else \
        tuple((role, False) for role in ROLES if role in options.roles)
    used_roles = dict(role_table)
    _check_counts(inventory, slots, mode, program_roles=options.roles,
                  mode_given=bool(options.mode or inventory.mode))
    cluster = tuple(
        (role, tuple(host_port(slot.host.address, ports[(slot.role, slot.index)])
                     for slot in slots if slot.role == role))
        for role, _ in role_table if role != EVALUATOR
    )
    idle_ps = _idle_ps(inventory, slots, mode) if options.roles is None else 0
    tasks = []
    for slot in slots:
        if slot.role not in used_roles:
            continue
        host = host_specs[slot.host.name]
        port = ports[(slot.role, slot.index)]
        standing = used_roles[slot.role]
        layout = HostLayout(host.workdir, name)
        env = _task_env(slot.role, slot.index, slot.gpus, slot.host, name)
        if idle_ps and slot.role == "chief":
            env += (("PSCLUSTER_IDLE_PS", str(idle_ps)),)
        if options.roles is not None:
            argv: tuple[str, ...] = ()        # the user's program, given to `run`
        elif standing:
            argv = (host.python, "-m", "roles.server")
        elif slot.role == EVALUATOR:
            argv = (host.python, "-m", "roles.evaluate", "--mode", mode)
        else:
            argv = (host.python, "-m", "roles.train", "--mode", mode)
        tasks.append(TaskSpec(
            role=slot.role, index=slot.index, host=slot.host.name, address=slot.host.address,
            port=port, cuda_visible_devices=slot.gpus, standing=standing, env=env, argv=argv,
            workdir=host.workdir, log_path=layout.server_log(slot.role, slot.index),
            events_path=layout.task_events(slot.role, slot.index)))
    used_hosts = {task.host for task in tasks}
    def why_unused(role: str) -> str:
        if options.roles is not None:
            return f"not among the roles that run the program ({', '.join(used_roles)})"
        return UNUSED_REASONS.get((mode, role), f"{role} tasks are not used in {mode} mode")

    unused = tuple((role, why_unused(role))
                   for role in ROLES if role not in used_roles and any(s.role == role for s in slots))
    return ClusterPlan(
        name=name, mode=mode, inventory_path=inventory.path, cluster=cluster, tasks=tuple(tasks),
        hosts=tuple(spec for host_name, spec in host_specs.items() if host_name in used_hosts),
        unused=unused, firewall=inventory.firewall, notify=inventory.notify, idle_ps=idle_ps)


def _idle_ps(inventory: Inventory, slots: list[_Slot], mode: str) -> int:
    """``pscluster_idle_ps`` checked against the cluster: async only, and some ps left for the
    variables.

    Raises:
        InventoryError: another mode, or as many idle ps as ps tasks (named by file and line).
    """
    if not inventory.idle_ps or inventory.idle_ps_origin is None:
        return 0
    origin = inventory.idle_ps_origin
    if mode != "async":
        raise origin.error(f"idle ps tasks are for mode async (ParameterServerStrategy); this cluster runs {mode}",
                           hint="remove pscluster_idle_ps, or run the cluster in mode async")
    ps = sum(1 for slot in slots if slot.role == "ps")
    if inventory.idle_ps >= ps:
        raise origin.error(f"{inventory.idle_ps} idle ps of {ps} ps task(s) leave none for the variables",
                           hint=f"add a ps host (the idle ones are the last {inventory.idle_ps} of the ps group), "
                                f"or set it below {ps}")
    return inventory.idle_ps


def _host_spec(host: HostConfig, options: PlanOptions) -> HostSpec:
    local = host.connection == "local"
    python = host.python or (options.local_python if local else DEFAULT_REMOTE_PYTHON)
    workdir = host.workdir or (options.local_workdir if local else DEFAULT_REMOTE_WORKDIR)
    return HostSpec(name=host.name, address=host.address, connection=host.connection,
                    ssh_port=host.ssh_port, user=host.user, key_file=host.key_file, python=python,
                    workdir=workdir, host_key_policy=host.host_key_policy, known_hosts=host.known_hosts,
                    connect_timeout=host.connect_timeout, secret_env=host.secret_env,
                    secret_env_roles=host.secret_env_roles, jump=host.jump, become_user=host.become_user,
                    docker_args=host.docker_args,
                    gpu_busy_mib=host.gpu_busy_mib, standby=host.standby and host.connection != "slurm",
                    sync_relay=host.sync_relay,
                    keras=host.keras,
                    origins=tuple((key, f"{origin.file}:{origin.line}" if origin.line else origin.file)
                                  for key, origin in host.origins))


def _slots(inventory: Inventory) -> list[_Slot]:
    """Every task the inventory asks for, indexed per role in host order."""
    result: list[_Slot] = []
    hosts = {host.name: host for host in inventory.hosts}
    for role in ROLES:
        index = 0
        for host_name in inventory.hosts_of(role):
            host = hosts[host_name]
            role_slots = host.slots_for(role)
            if role_slots is None:
                continue
            if len(result) + role_slots.count > MAX_TASKS:
                raise role_slots.origin.error(
                    f"the inventory asks for more than {MAX_TASKS} tasks",
                    hint=f"pscluster plans at most {MAX_TASKS} tasks in one cluster; split it, or use --limit")
            for local_index in range(role_slots.count):
                gpus: str | None
                if role_slots.auto_gpus:
                    gpus = AUTO_GPUS          # resolved at preflight (cluster/hosts/gpus.py resolve_auto)
                elif role_slots.gpus is not None:
                    gpus = role_slots.gpus[local_index]
                else:
                    gpus = "" if role == "ps" else None   # a ps must not grab GPU memory
                port = role_slots.ports[local_index] if role_slots.ports else None
                result.append(_Slot(role, index, host, gpus, port, role_slots))
                index += 1
    return result


def _assign_ports(slots: list[_Slot], port_base: int | None,
                  ssh_hosts: list[HostConfig]) -> dict[tuple[str, int], int]:
    """Ports per (role, index): explicit ones first, then the next free port from the host's base.

    Deterministic in (host, role, index) and never colliding on one address.

    Raises:
        InventoryError: two tasks given one port, or a task on a port SSH uses at its address
            (``ssh_hosts``: the SSH hosts of the inventory), named by the inventory line.
    """
    by_address: dict[str, list[_Slot]] = {}
    for slot in slots:
        by_address.setdefault(machine_address(slot.host.address), []).append(slot)
    ssh_by_address: dict[str, list[HostConfig]] = {}      # (each task scanned every host: O(N^2), N4)
    for host in ssh_hosts:
        ssh_by_address.setdefault(machine_address(host.address), []).append(host)
    ports: dict[tuple[str, int], int] = {}
    for address, address_slots in by_address.items():
        ssh_hosts = ssh_by_address.get(address, [])
        taken: dict[int, _Slot] = {}
        for slot in address_slots:
            if slot.explicit_port is None:
                continue
            _check_ssh_port(slot, slot.explicit_port, ssh_hosts)
            if slot.explicit_port in taken:
                other = taken[slot.explicit_port]
                raise slot.slots.origin.error(
                    f"port {slot.explicit_port} is given to both {other.role}:{other.index} and "
                    f"{slot.role}:{slot.index} on {address}",
                    hint=f"see also {other.slots.origin.file}:{other.slots.origin.line}")
            taken[slot.explicit_port] = slot
            ports[(slot.role, slot.index)] = slot.explicit_port
        next_port = port_base or address_slots[0].host.port_base
        for slot in address_slots:
            if slot.explicit_port is not None:
                continue
            while next_port in taken:
                next_port += 1
            if next_port > 65535:
                raise PlanError(f"ran out of ports on {address}", hint="lower pscluster_port_base")
            _check_ssh_port(slot, next_port, ssh_hosts)
            taken[next_port] = slot
            ports[(slot.role, slot.index)] = next_port
    return ports


def _check_auto_gpus_per_machine(slots: list[_Slot]) -> None:
    """``<role>_gpus: auto`` on two inventory names of one machine would give both names' tasks
    the same GPUs (each name resolves its GPUs alone, from the first): refused, naming both."""
    first: dict[str, _Slot] = {}
    for slot in slots:
        if not slot.slots.auto_gpus or slot.host.connection not in ("ssh", "local"):
            continue          # (a Slurm or docker host's GPUs are its allocation's or container's)
        machine = "this machine" if slot.host.connection == "local" else machine_address(slot.host.address)
        other = first.setdefault(machine, slot)
        if other.host.name != slot.host.name:
            raise slot.slots.origin.error(
                f"{slot.role}_gpus: auto on host {slot.host.name} and {other.role}_gpus: auto on host "
                f"{other.host.name}, one machine ({machine}): both would take its GPUs from 0",
                hint=f"list each name's GPUs ({slot.role}_gpus: [[0]] on one, [[1]] on the other), or "
                     f"give the machine one inventory name (see also {other.slots.origin.file}:{other.slots.origin.line})")


def _check_ssh_port(slot: _Slot, port: int, ssh_hosts: list[HostConfig]) -> None:
    """A task must not be planned on the port SSH answers on at its address (pi-cluster's tunnel:
    ansible_port=2222 on a shared VPS address, and pscluster_port_base 2222)."""
    for host in ssh_hosts:
        if (host.ssh_port or 22) == port and machine_address(host.address) == machine_address(slot.host.address):
            origin = host.origin_of("ansible_port") or host.origin_of("ansible_ssh_port") or slot.slots.origin
            fixed = slot.explicit_port is not None
            raise origin.error(
                f"{slot.role}:{slot.index} would listen on {host_port(slot.host.address, port)}, the SSH port "
                f"of host {host.name}",
                hint=(f"give {slot.role}:{slot.index} another port in {slot.role}_ports" if fixed else
                      f"set pscluster_port_base (now {slot.host.port_base}) or {slot.role}_ports so that no "
                      f"task takes port {port}, e.g. pscluster_port_base: {port + 100}"))


def _check_counts(inventory: Inventory, slots: list[_Slot], mode: str,
                  program_roles: tuple[str, ...] | None = None, mode_given: bool = True) -> None:
    counts = {role: sum(1 for slot in slots if slot.role == role) for role in ROLES}
    if counts["chief"] > 1:
        chief = next(slot for slot in slots if slot.role == "chief")
        raise chief.slots.origin.error(f"the chief group holds {counts['chief']} tasks; a cluster has at most one",
                                       hint="put one host in 'chief' with chief_tasks: 1")
    if program_roles is None and counts[EVALUATOR] > 1:
        evaluator = next(slot for slot in slots if slot.role == EVALUATOR)
        raise evaluator.slots.origin.error(
            f"the evaluator group holds {counts[EVALUATOR]} tasks; 'train' runs at most one (it evaluates every "
            "checkpoint the leader writes)", hint="put one host in 'evaluator' with evaluator_tasks: 1")
    if program_roles is not None:
        unknown = [role for role in program_roles if role not in ROLES]
        if unknown:
            raise PlanError(f"unknown role {unknown[0]!r}", hint=f"roles are {', '.join(ROLES)}")
        empty = [role for role in program_roles if counts[role] == 0]
        if empty:
            defined = [role for role in ROLES if counts[role]]
            raise PlanError(f"{inventory.path} defines no {empty[0]} task",
                            hint=f"it defines: {', '.join(defined) or 'no task at all'}")
        if not program_roles:
            raise PlanError(f"{inventory.path} defines no task", hint="add hosts to chief, ps, worker or evaluator")
    if program_roles is None or mode_given:
        check_mode_roles(inventory.path, counts, mode)


def check_mode_roles(path: str, counts: dict[str, int], mode: str) -> None:
    """Whether ``mode`` can run on an inventory with ``counts`` tasks per role: the one place
    that decides it, for ``plan``, ``up``, ``train`` and a one-shot ``run`` that names a mode
    (``--mode`` or ``pscluster_mode``; without one, a run takes every role the inventory
    defines, and no mode is checked).

    Raises:
        PlanError: a role the mode needs has no task (async: a chief, ps and workers; sync:
            workers; sync-ps: ps and workers).
    """
    where = f"{path}: mode {mode}"
    for role, _ in MODE_ROLES[mode]:
        if role == "chief" and counts.get("chief", 0) == 0:
            raise PlanError(f"{where} needs a chief task to run the ClusterCoordinator",
                            hint="add a 'chief' group with one host, or use --mode sync or --mode between-graph "
                                 "(sync-ps: ps and workers, e.g. a TF1 program, sync or async)")
        if counts.get(role, 0) == 0:
            raise PlanError(f"{where} needs at least one {role} task",
                            hint=f"add a '{role}' group with at least one host")


def _compact_json(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _task_env(role: str, index: int, gpus: str | None, host: HostConfig, name: str) -> tuple[tuple[str, str], ...]:
    env = dict(BASE_ENV)
    env["PSCLUSTER_CLUSTER"] = name
    env["PSCLUSTER_TASK"] = f"{role}:{index}"
    if gpus is not None and gpus != AUTO_GPUS:
        env["CUDA_VISIBLE_DEVICES"] = gpus
    if host.intra_op_threads is not None:
        env["PSCLUSTER_INTRA_OP_THREADS"] = str(host.intra_op_threads)
    if host.inter_op_threads is not None:
        env["PSCLUSTER_INTER_OP_THREADS"] = str(host.inter_op_threads)
    env.update(dict(host.env))
    return tuple(env.items())


def move_task(plan: ClusterPlan, name: str, host: HostConfig, options: PlanOptions,
              port: int | None = None) -> ClusterPlan:
    """``plan`` with its standing task ``name`` (a ps) on inventory host ``host`` instead: on
    ``port`` if no other task holds it at that address, else on the lowest port from the port
    base (``options.port_base`` or the host's) that none holds and SSH does not use there.
    Every other task keeps its host, port and name; the cluster spec names the new address.
    Pure, as :func:`plan_cluster`: a lost ps host's tasks moved by the supervisor
    (cluster/supervision/train_resize.py) keep their place across later re-plans.

    Raises:
        PlanError: no free port at ``host``'s address.
    """
    old = plan.task(name)
    spec = next((h for h in plan.hosts if h.name == host.name), None) or _host_spec(host, options)
    taken = {t.port for t in plan.tasks if t.address == host.address and t.name != name}
    if host.connection == "ssh":
        taken.add(host.ssh_port or 22)
    if port is None or port in taken:
        port = options.port_base or host.port_base
        while port in taken:
            port += 1
    if port > 65535:
        raise PlanError(f"ran out of ports on {host.address} for {name}", hint="lower pscluster_port_base")
    layout = HostLayout(spec.workdir, plan.name)
    gpus = "" if old.role == "ps" else None          # a ps must not grab GPU memory
    moved = replace(old, host=host.name, address=host.address, port=port, cuda_visible_devices=gpus,
                    env=_task_env(old.role, old.index, gpus, host, plan.name), argv=(spec.python, *old.argv[1:]),
                    workdir=spec.workdir, log_path=layout.server_log(old.role, old.index),
                    events_path=layout.task_events(old.role, old.index))
    tasks = tuple(moved if t.name == name else t for t in plan.tasks)
    cluster = tuple((role, tuple(moved.target if role == old.role and i == old.index else address
                                 for i, address in enumerate(addresses)))
                    for role, addresses in plan.cluster)
    hosts = {h.name: h for h in (*plan.hosts, spec)}
    used = dict.fromkeys(t.host for t in tasks)
    ordered = tuple(h for h in hosts.values() if h.name in used)
    return replace(plan, tasks=tasks, cluster=cluster, hosts=ordered)


def loopback_addresses(plan: ClusterPlan) -> list[TaskSpec]:
    """Tasks whose address is loopback in a multi-host cluster (other hosts cannot reach them)."""
    if not plan.is_multi_host:
        return []
    bad = []
    for task in plan.tasks:
        address = task.address.lower()
        if address in LOOPBACK_NAMES:
            bad.append(task)
            continue
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            continue
        if ip == ipaddress.ip_address("127.0.0.1") or ip == ipaddress.ip_address("::1"):
            bad.append(task)
    return bad

