"""Cluster state on the control machine: one JSON file per cluster name.

``status`` and ``down`` read nothing else, so the file must say, at every moment, what runs
where: a process is recorded before anyone waits on it, every write is atomic (temporary file +
rename) and happens under an exclusive lock, and the state holds the whole plan (hosts and
connection settings), so ``down`` works without the inventory and after the orchestrator died.

The state directory is ``$PSCLUSTER_STATE_DIR``, else ``$XDG_STATE_HOME/pscluster``, else
``~/.local/state/pscluster``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from .contracts import Phase, ProcessKind
from .errors import Aborted, StateError, UntrustedStateError, UsageError
from .layout import exit_file
from .names import check_cluster_name, is_cluster_name
from .plan import ClusterPlan, HostSpec, TaskSpec
from .jobrecord import JobProgress

@dataclass(frozen=True)
class ProcessRecord:
    """A process pscluster started: enough to find, probe and stop it on its host later.

    ``pgid`` is the session/process-group leader (pscluster's monitor on the host), ``pid`` the
    task itself; the start times guard against PID reuse.
    """

    key: str                 # unique within the cluster: "worker:1#2" (task, attempt); the grammar: for_task
    task: str                # "worker:1"
    host: str
    kind: ProcessKind
    attempt: int
    log: str
    exit_file: str
    events: str | None = None
    pid: int | None = None
    pgid: int | None = None
    starttime: str | None = None
    task_starttime: str | None = None
    started: float | None = None
    stopped: bool = False
    # Names this start on the host: a ``stop`` that arrives before the start wrote its pid file
    # cancels the token, and the start then spawns nothing (hostctl ``start``/``stop``).
    token: str = field(default_factory=lambda: os.urandom(8).hex())

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", ProcessKind(self.kind))     # read from JSON as its string

    @classmethod
    def for_task(cls, task: str, host: str, kind: ProcessKind, attempt: int, log: str, *,
                 job: int | None = None, events: str | None = None) -> "ProcessRecord":
        """The record of attempt ``attempt`` of ``task``'s process of ``kind`` on ``host``, before it
        starts; its exit file lies beside ``log``. The key is the one grammar of keys: ``ps:0#2`` a
        standing server (``tensorboard#1`` TensorBoard), ``worker:1#s2`` a standby, ``worker:1#j3.2``
        a process of job 3 (``train`` or ``run``: ``job`` is required for those).

        Raises:
            ValueError: a job's process without its job.
        """
        return cls(key=_key_prefix(task, kind, job) + str(attempt), task=task, host=host, kind=kind,
                   attempt=attempt, log=log, exit_file=exit_file(log), events=events)

    def in_job(self, job: int) -> bool:
        """Whether this is a process of job ``job`` (its key says so: :meth:`for_task`)."""
        return f"#j{job}." in self.key

    def to_hostctl(self) -> dict:
        return {"key": self.key, "pid": self.pid, "pgid": self.pgid, "starttime": self.starttime,
                "task_starttime": self.task_starttime, "started": self.started, "log": self.log,
                "exit_file": self.exit_file, "token": self.token}


def _key_prefix(task: str, kind: ProcessKind, job: int | None) -> str:
    """A record's key without its attempt number (:meth:`ProcessRecord.for_task`)."""
    kind = ProcessKind(kind)      # a caller that gave the string gets the same key
    if kind is ProcessKind.STANDBY:
        return f"{task}#s"
    if kind in (ProcessKind.TRAIN, ProcessKind.PROGRAM):
        if job is None:
            raise ValueError(f"a {kind} process of {task} belongs to a job: its number is missing")
        return f"{task}#j{job}."
    return f"{task}#"


@dataclass
class RunState:
    """Everything known about one cluster on this machine."""

    name: str
    plan: ClusterPlan
    phase: Phase = Phase.STARTING
    processes: list[ProcessRecord] = field(default_factory=list)
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    message: str | None = None
    job: JobProgress | None = None
    restarts: dict[str, int] = field(default_factory=dict)
    synced: dict[str, str] = field(default_factory=dict)
    # The sha256 of what the last code sync put on the hosts of ``synced`` (codesync.manifest_digest):
    # a resize syncs only its new hosts while this machine's code is still that (issue 46).
    code_digest: str | None = None
    firewall: dict[str, str] = field(default_factory=dict)
    port_base: int | None = None      # `up --port-base`, which `scale` plans the edited inventory with
    limit: str | None = None          # `up --limit`, likewise (and an elastic job's re-plans)
    # Where `up` took the mode: "option" (`up --mode`, which `scale` keeps) or "inventory" (then an
    # edited inventory that asks for another mode is refused by `scale`); None: a state written
    # before it was recorded, or a cluster `up` did not start (`run`'s one-shot cluster).
    mode_from: str | None = None
    # Hosts `pscluster drain` took tasks off (host -> "draining" | "drained"; cluster/lifecycle/drain.py);
    # `undrain`, or a `scale` that gives the host tasks again, clears them.
    drained: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.phase = Phase(self.phase)     # given as its string (a test, an old caller): the enum

    @property
    def mode(self) -> str:
        return self.plan.mode

    def live_records(self) -> list[ProcessRecord]:
        return [record for record in self.processes if not record.stopped]

    def latest(self, task: str) -> ProcessRecord | None:
        """The newest process of ``task`` (a standby is not one yet: :meth:`standby`)."""
        found = [record for record in self.processes if record.task == task and record.kind != ProcessKind.STANDBY]
        return found[-1] if found else None

    def standby(self, task: str) -> ProcessRecord | None:
        """The live standby waiting to become ``task``'s next training process, if any."""
        found = [record for record in self.processes
                 if record.task == task and record.kind == ProcessKind.STANDBY and not record.stopped]
        return found[-1] if found else None

    def next_attempt(self, task: str, kind: ProcessKind, job: int | None = None) -> int:
        """The attempt number of ``task``'s next process of ``kind``: one more than it has had (of
        job ``job``: each job counts its processes from 1, a server or standby counts across them)."""
        return 1 + sum(1 for record in self.processes if record.task == task and record.kind == kind
                       and (job is None or record.in_job(job)))

    def replace_record(self, record: ProcessRecord) -> None:
        self.processes = [record if r.key == record.key else r for r in self.processes]

    def replace_records(self, records: Iterable[ProcessRecord]) -> None:
        for record in records:
            self.replace_record(record)

    def to_json_text(self) -> str:
        """``json.dumps(self.to_json())``, byte for byte, from the kept texts of the plan and of
        the records that did not change since the last save: ``up`` saves as each host's start is
        recorded, and encoding the whole state each time (2.7 KB a host) took a quarter of
        ``up``'s CPU at 128 hosts once the connections moved to helper processes (issue 46)."""
        head = self.to_json(body=False)
        return (json.dumps(head)[:-1] + ', "plan": ' + _plan_text(self.plan) + ', "processes": ['
                + ", ".join(_records_text(self.processes)) + "]}")

    def to_json(self, *, body: bool = True) -> dict:
        """The state as JSON data; ``body=False``: without the plan and the records."""
        head: dict[str, Any] = {
            "version": 1, "name": self.name, "phase": self.phase, "created": self.created,
            "updated": self.updated, "message": self.message,
            "job": self.job.to_json() if self.job is not None else None,
            "restarts": self.restarts, "synced": self.synced, "firewall": self.firewall, "port_base": self.port_base,
            "limit": self.limit, "mode_from": self.mode_from,
            **({"drained": self.drained} if self.drained else {}),     # an older state is written again unchanged
            **({"code_digest": self.code_digest} if self.code_digest else {}),
        }
        if body:        # last, as to_json_text writes them
            head["plan"] = plan_to_json(self.plan)
            head["processes"] = records_to_json(self.processes)
        return head

    @classmethod
    def from_json(cls, data: dict) -> "RunState":
        return cls(name=data["name"], plan=plan_from_json(data["plan"]), phase=Phase(data["phase"]),
                   processes=[ProcessRecord(**record) for record in data["processes"]],
                   created=data["created"], updated=data["updated"], message=data.get("message"),
                   job=JobProgress.from_json(data["job"]) if data.get("job") else None, restarts=data.get("restarts", {}), synced=data.get("synced", {}),
                   firewall=data.get("firewall", {}), port_base=data.get("port_base"),
                   limit=data.get("limit"), mode_from=data.get("mode_from"),
                   drained=dict(data.get("drained") or {}), code_digest=data.get("code_digest"))


_last_plan: list[tuple[ClusterPlan, dict]] = []      # the last plan written, and its JSON form


def plan_to_json(plan: ClusterPlan) -> dict:
    """The plan's JSON form (the caller must not change it). A supervisor writes the state once a
    second with the same plan: its form is kept (the plan is frozen), not rebuilt by
    ``dataclasses.asdict`` each time (the most of the main thread's CPU in a profile of the
    64-host watch, issue 46)."""
    if _last_plan and _last_plan[0][0] is plan:
        return _last_plan[0][1]
    data = dataclasses.asdict(plan)
    if not data["idle_ps"]:
        del data["idle_ps"]         # as the states of earlier versions, which had no idle ps
    for host in data["hosts"]:
        host_json_defaults(host)
    _last_plan[:] = [(plan, data)]
    return data


_record_json: dict[int, tuple[ProcessRecord, dict]] = {}    # id -> (record, its JSON form), the last written


def records_to_json(records: list[ProcessRecord]) -> list[dict]:
    """The records' JSON forms (the caller must not change them). A record is frozen, so its form
    is kept from the last write while the same object is in the state: a supervisor writes every
    record once a second, and ``dataclasses.asdict`` of 2,000 of them took 39 ms (issue 46)."""
    kept: dict[int, tuple[ProcessRecord, dict]] = {}
    forms = []
    for record in records:
        found = _record_json.get(id(record))
        form = found[1] if found is not None and found[0] is record else dataclasses.asdict(record)
        kept[id(record)] = (record, form)
        forms.append(form)
    _record_json.clear()
    _record_json.update(kept)
    return forms


_plan_texts: list[tuple[ClusterPlan, str]] = []               # the last plan written, as JSON text
_record_texts: dict[int, tuple[ProcessRecord, str]] = {}       # id -> (record, its JSON text), the last written


def _plan_text(plan: ClusterPlan) -> str:
    if not (_plan_texts and _plan_texts[0][0] is plan):
        _plan_texts[:] = [(plan, json.dumps(plan_to_json(plan)))]
    return _plan_texts[0][1]


def _records_text(records: list[ProcessRecord]) -> list[str]:
    """As :func:`records_to_json`, the texts: kept while the same (frozen) record is in the state."""
    kept: dict[int, tuple[ProcessRecord, str]] = {}
    texts = []
    for record in records:
        found = _record_texts.get(id(record))
        text = found[1] if found is not None and found[0] is record else json.dumps(dataclasses.asdict(record))
        kept[id(record)] = (record, text)
        texts.append(text)
    _record_texts.clear()
    _record_texts.update(kept)
    return texts


def plan_from_json(data: dict) -> ClusterPlan:
    def tuples(value):
        return tuple(tuple(item) if isinstance(item, list) else item for item in value)

    tasks = tuple(TaskSpec(**dict(task, env=tuples(task["env"]), argv=tuple(task["argv"])))
                  for task in data["tasks"])
    hosts = tuple(host_from_json(host) for host in data["hosts"])
    cluster = tuple((job, tuple(addresses)) for job, addresses in data["cluster"])
    unused = tuple((role, reason) for role, reason in data.get("unused", ()))
    return ClusterPlan(name=data["name"], mode=data["mode"], inventory_path=data["inventory_path"],
                       cluster=cluster, tasks=tasks, hosts=hosts, unused=unused,
                       firewall=data.get("firewall", False), notify=tuple(data.get("notify", ())),
                       inventory_sha256=data.get("inventory_sha256"), idle_ps=int(data.get("idle_ps", 0)))


def host_json_defaults(host: dict) -> dict:
    """A host's ``dataclasses.asdict`` form without the fields that earlier versions' states did
    not have, where they hold their default: an old state is written again byte for byte."""
    if host.get("sync_relay") is True:
        del host["sync_relay"]
    return host


def host_from_json(host: dict) -> HostSpec:
    """A :class:`HostSpec` from its ``dataclasses.asdict`` form (fields added later default)."""
    return HostSpec(**dict(host, secret_env=tuple(host.get("secret_env", ())),
                           secret_env_roles=tuple(host.get("secret_env_roles", ())),
                           jump=tuple(host.get("jump", ())), docker_args=tuple(host.get("docker_args", ())),
                           become_user=host.get("become_user"),
                           gpu_busy_mib=host.get("gpu_busy_mib", 1024),
                           origins=tuple(tuple(item) for item in host.get("origins", ()))))


def private_dir(path: Path) -> None:
    """Create ``path`` 0700, and make an existing one of this user 0700 (N11: the state directory
    was 0755; its supervisor logs and event files hold the tails of tasks' 0600 logs).

    Raises:
        StateError: :func:`check_trusted_dir` refuses the folder (another user's, or one that
            others can write to, such as a shared sticky /tmp/x).
    """
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = check_trusted_dir(path)
    if stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(path, stat.S_IMODE(info.st_mode) & 0o700)


def check_trusted_dir(path: Path) -> os.stat_result:
    """``path``'s stat, if it is a folder of this effective user that nobody else can write to,
    as ssh's StrictModes asks of ``~/.ssh``: a ``<name>.json`` planted there is read as a state
    and its commands run as whoever runs ``pscluster`` (issue 42, L1).

    Raises:
        StateError: naming the folder, its owner or its mode.
    """
    info = path.stat()
    hint = ("use a folder of your own that only you can write to (PSCLUSTER_STATE_DIR, or the default "
            "~/.local/state/pscluster)")
    if not stat.S_ISDIR(info.st_mode):
        raise UntrustedStateError(f"state directory {path} is not a folder", hint=hint)
    if info.st_uid != os.geteuid():
        raise UntrustedStateError(f"state directory {path} belongs to uid {info.st_uid}, not to you (uid {os.geteuid()}): "
                         "refused", hint=hint)
    if stat.S_IMODE(info.st_mode) & 0o022:
        raise UntrustedStateError(f"state directory {path} is writable by others (mode {stat.S_IMODE(info.st_mode):04o}): "
                         "refused", hint=hint + f"; or chmod go-w {path} if nobody else wrote to it")
    return info


def read_owned(path: Path) -> str:
    """The text of a state, history or request file, if this effective user owns it (a link is
    not followed, a FIFO not waited on).

    Raises:
        FileNotFoundError: there is none.
        StateError: another user's file, or not a regular file, named.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise UntrustedStateError(f"{path}: cannot read it ({exc.strerror}): refused",
                         hint="pscluster writes its state files itself; remove what you did not put there") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            raise UntrustedStateError(f"{path} is not a file of yours (uid {info.st_uid}): refused",
                             hint="pscluster writes its state files itself; remove what you did not put there")
        return handle.read().decode("utf-8", "replace")


def open_private(path: str | Path, flags: int = os.O_WRONLY | os.O_CREAT | os.O_APPEND) -> int:
    """A descriptor on ``path``, created 0600 (an existing file of this user is made 0600 too);
    a symlink there is refused (O_NOFOLLOW)."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        info = os.fstat(fd)
        if info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) & 0o077:
            os.fchmod(fd, 0o600)
    except OSError:
        os.close(fd)
        raise
    return fd


def write_private_json(path: Path, data: Any, *, indent: int | None = None) -> None:
    """Replace ``path`` with ``data`` as JSON, atomically (a temporary file beside it, synced, then
    renamed over it) and 0600: the one writer of the state, the run history and the resize
    requests, which all hold a plan (its notification URLs may carry tokens: pscluster_notify)."""
    write_private_text(path, json.dumps(data, indent=indent))     # one string: json.dump writes piece by piece


def write_private_text(path: Path, text: str) -> None:
    """As :func:`write_private_json`, ``text`` that is JSON already."""
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    with os.fdopen(open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


@contextlib.contextmanager
def file_lock(path: Path, *, wait: float | None = None,
              busy: Callable[[], Exception] | None = None) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (created 0600) for the body, released if this process
    dies: the one lock of the state, the run history and ``scale``. ``wait`` None waits until it is
    free; else ``busy()`` is raised once ``wait`` seconds passed (0: after one try). The lock file
    stays: deleting it while another command holds or waits for it would let two commands in."""
    fd = open_private(path, os.O_RDWR | os.O_CREAT)
    try:
        deadline = None if wait is None else time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX if deadline is None else fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise (busy() if busy else StateError(f"{path} is locked by another pscluster command")) from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)


def default_state_dir() -> Path:
    if os.environ.get("PSCLUSTER_STATE_DIR"):
        return Path(os.environ["PSCLUSTER_STATE_DIR"])
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "pscluster"


class StateStore:
    """Reads and writes cluster states in one directory."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root else default_state_dir()

    def path(self, name: str) -> Path:
        return self.root / f"{check_cluster_name(name)}.json"

    def names(self) -> list[str]:
        """The clusters that have a state (not the resize files beside them)."""
        if not self.root.is_dir():
            return []
        return sorted(path.stem for path in self.root.glob("*.json") if is_cluster_name(path.stem))

    def load(self, name: str) -> RunState | None:
        path = self.path(name)
        try:
            check_trusted_dir(self.root)
            return RunState.from_json(json.loads(read_owned(path)))
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as exc:
            raise StateError(f"cluster state {path} is unreadable: {exc}",
                             hint="inspect it; 'pscluster down' needs it to find the processes") from None

    def save(self, state: RunState) -> None:
        state.updated = time.time()
        private_dir(self.root)
        # Compact: json's C encoder (indent=1 took its pure-Python one: 56 ms for a 1,000-host
        # state against 18, once a second in a supervisor; issue 46). `python -m json.tool` reads it.
        write_private_text(self.path(state.name), state.to_json_text())

    def delete(self, name: str) -> None:
        """Remove the state. The lock file stays: deleting it while another command holds
        or waits for it would let two commands lock the same cluster at once."""
        with contextlib.suppress(FileNotFoundError):
            self.path(name).unlink()

    @contextlib.contextmanager
    def lock(self, name: str, *, wait: float = 10.0) -> Iterator[None]:
        """Exclusive lock on one cluster's state (released if this process dies)."""
        private_dir(self.root)
        with file_lock(self.root / f"{check_cluster_name(name)}.lock", wait=wait,
                       busy=lambda: StateError(f"cluster {name!r} is locked by another pscluster command",
                                               hint="wait for it to finish")):
            yield

    def update(self, state: RunState) -> None:
        """Save under the lock (the usual way to record progress)."""
        with self.lock(state.name):
            self.save(state)

    def resolve_name(self, name: str | None) -> str:
        """The cluster a command means: the given name, or the only one that has a state.

        Raises:
            UsageError: no cluster, or several and no name given.
        """
        if name:
            if not self.path(name).exists():
                known = ", ".join(self.names()) or "none"
                raise UsageError(f"no cluster named {name!r} (known: {known})",
                                 hint="'pscluster up INVENTORY' creates one")
            return name
        names = self.names()
        if not names:
            raise UsageError("no cluster is up", hint="start one with 'pscluster up inventories/local.yaml'")
        if len(names) > 1:
            raise UsageError(f"several clusters are up ({', '.join(names)})", hint="pick one with --name")
        return names[0]


# A save that follows the last one within COMMIT_BURST seconds waits COMMIT_DELAY first, so the
# changes of a fan-out's other threads join it: in a burst, saves take at most a save's time /
# (COMMIT_DELAY + a save's time) of a core, whatever the number of hosts (a save of a 1,000-host
# state writes 1.6 MB; issue 46), at the price of 20 ms on a change made in a burst.
COMMIT_BURST = 0.05
COMMIT_DELAY = 0.02


def _commit_pause() -> None:
    time.sleep(COMMIT_DELAY)


class StateWriter:
    """Serialises changes to one :class:`RunState` from several threads; each :meth:`change`
    returns once a save that holds it is on disk.

    Saves are group commits: changes made while another thread waited for its turn to save (or
    wrote its save) go to disk together in the next save, not one save each (32 threads making 8
    changes each, 3 ms apart: 75-79 saves for 256 changes). A fan-out's threads recorded each
    host's start in a save of its own, the whole state each time: O(N²) bytes for N hosts, 2N
    saves of up to 2.4 MB (44 ms each) at 1,000 hosts (issue 46). A save that comes within
    COMMIT_BURST of the last one first waits COMMIT_DELAY, for the changes of a burst to join it."""

    def __init__(self, store: StateStore, state: RunState, *, expect_phase: Phase | None = None):
        self.store = store
        self.state = state
        self.expect_phase = expect_phase
        self._lock = threading.Lock()       # the state in memory, and the file
        self._saving = threading.Lock()     # one saver at a time; the others' changes wait for it
        self._changed = 0                   # changes made in memory
        self._on_disk = 0                   # of those, the ones the file holds
        self._saved: tuple[int, int, int] | None = None     # the file as this writer last left it
        self._last_save = float("-inf")     # when the last save ended (monotonic)
        self.saves = 0

    def _check(self) -> None:
        # Skip reading the state back when the file is still the one this writer saved (no
        # other command wrote it since): a supervisor writes once a second, and re-reading
        # the whole state each time grew with the cluster (issue 46).
        if self.expect_phase is not None and (self._saved is None or self._file_id() != self._saved):
            on_disk = self.store.load(self.state.name)
            # A later `up` of the same name has a new state: this command's cluster is gone too.
            if on_disk is None or on_disk.phase != self.expect_phase or on_disk.created != self.state.created:
                raise Aborted(f"cluster {self.state.name!r} was taken down by another command")
            self._saved = self._file_id()       # read and found ours: no need to read it again

    def change(self, mutate: Callable[[RunState], None]) -> None:
        with self._lock, self.store.lock(self.state.name):
            self._check()
            mutate(self.state)
            self._changed += 1
            mine = self._changed
        with self._saving:
            if self._on_disk >= mine:
                return          # a save that began after this change held it
            if time.monotonic() - self._last_save < COMMIT_BURST:
                _commit_pause()         # a burst: the changes under way join this save
            with self._lock, self.store.lock(self.state.name):
                self._check()
                self.store.save(self.state)
                self._saved = self._file_id()
                self._on_disk = self._changed
                self.saves += 1
            self._last_save = time.monotonic()

    def _file_id(self) -> tuple[int, int, int] | None:
        try:
            found = os.stat(self.store.path(self.state.name))
        except OSError:
            return None
        return (found.st_ino, found.st_mtime_ns, found.st_size)
