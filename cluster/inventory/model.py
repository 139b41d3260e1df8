"""The inventory as pscluster sees it: hosts, their connection and tasks, and the words an inventory may use."""
from __future__ import annotations

import functools
from dataclasses import dataclass

from ..errors import InventoryError


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


PLANNED_PSCLUSTER_ENV = (   # cluster.plan._task_env, pscluster_*_op_threads, cluster.program.runspec.program_env
    "PSCLUSTER_CLUSTER", "PSCLUSTER_TASK", "PSCLUSTER_INTRA_OP_THREADS", "PSCLUSTER_INTER_OP_THREADS",
    "PSCLUSTER_TASK_TYPE", "PSCLUSTER_TASK_INDEX", "PSCLUSTER_NUM_WORKERS", "PSCLUSTER_NUM_PS",
    "PSCLUSTER_PS_HOSTS", "PSCLUSTER_WORKER_HOSTS", "PSCLUSTER_CHIEF_HOSTS", "PSCLUSTER_HOST", "PSCLUSTER_PORT")


# Hosts in one inventory, every pattern and file together (the range cap is per pattern: 30
# ranges of 10,000 in 640 bytes ran past 60 s). Tasks are capped in cluster.plan (MAX_TASKS).
MAX_HOSTS = 10_000
DOCKER_DEFAULT_USER = "pscluster"   # a container host's user without ansible_user (docker/Dockerfile's)
MAX_TASKS_PER_HOST = 64     # `<role>_tasks`, and a `--hosts-from` line's `host:N`


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
    connection: str                   # "ssh", "local", "slurm" or "docker"
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
    docker_args: tuple[str, ...] = ()     # ansible_docker_extra_args: the docker client's own arguments
    # A GPU with more memory in use than this (MiB) is busy at preflight (pscluster_gpu_busy_mib).
    gpu_busy_mib: int = 1024
    # Standing server roles that also get this host's secrets (pscluster_secret_env_roles).
    secret_env_roles: tuple[str, ...] = ()
    # pscluster_standby: `up` starts a standby (TensorFlow imported) for this host's training tasks.
    standby: bool = True
    # pscluster_sync_relay: at many hosts, this host fetches the code from peers and serves it to them.
    sync_relay: bool = True
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
    # pscluster_notify: URLs that train and run POST job state changes to (cluster.notify.notifier).
    notify: tuple[str, ...] = ()
    # The roles of the whole inventory when --limit selected a part: the default mode comes from
    # them (a limit that leaves out the chief must not turn async into sync-ps).
    unlimited_roles: tuple[str, ...] | None = None
    # pscluster_idle_ps (async): how many of the last ps tasks the chief keeps free of variables,
    # and where the inventory says so (a plan that cannot have them names it).
    idle_ps: int = 0
    idle_ps_origin: Origin | None = None

    def host(self, name: str) -> HostConfig:
        return self._by_name[name]

    @functools.cached_property
    def _by_name(self) -> dict[str, HostConfig]:
        return {host.name: host for host in self.hosts}

    def hosts_of(self, role: str) -> tuple[str, ...]:
        return dict(self.role_hosts).get(role, ())

    def roles(self) -> tuple[str, ...]:
        """The roles that have a host, in :data:`ROLES` order."""
        return tuple(role for role in ROLES if self.hosts_of(role))

    def mode_roles(self) -> tuple[str, ...]:
        """The roles the default mode is taken from (contracts.default_mode): the inventory's,
        before any --limit."""
        return self.roles() if self.unlimited_roles is None else self.unlimited_roles
