"""Where pscluster keeps its files: on every host (:class:`HostLayout`) and, for a detached
supervisor, in the state directory on this machine (:class:`DaemonLayout`).

Pure: these build path strings and touch no file or host. Every other module asks here, so the
layout is spelled once; the paths are those pscluster has always used (users' run folders and
running clusters' state files hold them), so they change only with a migration.

A cluster's run folder on a host is ``<workdir>/.pscluster/<cluster>/``::

    <role>-<index>.log                   a standing server (attempt 1); <role>-<index>.<N>.log for attempt N
    <role>-<index>.events.jsonl          the plan's per-task events file
    standby/<role>-<index>.<N>.log       the N-th standby of a training task (roles/standby.py), and
    standby/<role>-<index>.<N>.log.fifo  the FIFO its job comes through (.ready: TensorFlow imported)
    job-<id>/<role>-<index>.<N>.log      attempt N of a job process (train or run)
    job-<id>/<role>-<index>.<N>.events.jsonl
    jobs/<job>/<job.py or job folder>    a user's job, copied to hosts that do not share this checkout
    checkpoints/<job>/                   the default checkpoint folder (on the leader's host)
    tensorboard/<job>/                   the leader's TensorBoard summaries; tensorboard.<N>.log its server

Next to every process log, ``roles/hostctl.py`` (which cannot import this module: it is shipped
alone to hosts) keeps ``<log>.pid``, ``<log>.exit``, ``<log>.cancel``, ``<log>.lock`` (and ``<log>.adopt``, a
standby's answer when a job process is handed to it); these
suffixes and ``.pscluster`` (under which hostctl also keeps ``fsid``, the id of the filesystem
holding a workdir) are checked against hostctl's own in tests/unit/test_layout.py. The workdir
may start with ``~`` (the host's home, expanded there) and is taken as given: a relative one is
relative to the login folder, as the processes' working directory is.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .names import is_cluster_name

RUN_ROOT = ".pscluster"          # under a host's workdir: one folder per cluster below it
LOG_SUFFIX = ".log"
EVENTS_SUFFIX = ".events.jsonl"
PID_SUFFIX = ".pid"              # roles/hostctl.py writes <log>.pid (the monitor's record)
EXIT_SUFFIX = ".exit"            # ... <log>.exit (the task's exit status)
CANCEL_SUFFIX = ".cancel"        # ... <log>.cancel (a stop that came before the start)
LOCK_SUFFIX = ".lock"            # ... <log>.lock (a start's lock)
REPLY_SUFFIX = ".adopt"          # ... <log>.adopt (a standby's answer to the start it was handed)
FIFO_SUFFIX = ".fifo"            # roles/standby.py listens on <its log>.fifo
READY_SUFFIX = ".ready"          # ... and writes <its log>.ready once TensorFlow is imported


def _check_name(what: str, value: str) -> str:
    # a name becomes one path component: nothing that climbs, nests or hides a separator
    if not value or value in (".", "..") or "/" in value or "\0" in value:
        raise ValueError(f"{what} {value!r} cannot be a folder or file name on a host")
    return value


def _check_number(what: str, value: int, lowest: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
        raise ValueError(f"{what} must be an integer >= {lowest}, not {value!r}")
    return value


def attempt_log(first: str, attempt: int) -> str:
    """The log of attempt ``attempt`` of a process whose first attempt logs to ``first``:
    ``x/worker-0.log`` -> ``x/worker-0.3.log``. Only the file name's ``.log`` suffix changes,
    never a ``.log`` elsewhere in the path (a workdir ``/srv/app.log/`` or a cluster
    ``exp.log``)."""
    _check_number("attempt", attempt, 1)
    if attempt == 1:
        return first
    stem = first[:-len(LOG_SUFFIX)] if first.endswith(LOG_SUFFIX) else first
    return f"{stem}.{attempt}{LOG_SUFFIX}"


def pid_file(log: str) -> str:
    """The monitor's pid file of the process logging to ``log`` (written by hostctl)."""
    return log + PID_SUFFIX


def exit_file(log: str) -> str:
    """Where hostctl's monitor writes the exit status of the process logging to ``log``."""
    return log + EXIT_SUFFIX


def fifo_file(log: str) -> str:
    """The FIFO of the standby logging to ``log``."""
    return log + FIFO_SUFFIX


def ready_file(log: str) -> str:
    """Written by the standby logging to ``log`` once it has imported TensorFlow."""
    return log + READY_SUFFIX


def gate_file(events: str) -> str:
    """Written by a sync worker of a resize's next incarnation (``--gate``), beside its events
    file, once it waits for the previous workers to stop (roles/handover.py)."""
    return events + ".gate"


def job_code_dir(cluster: str, job: str) -> str:
    """Where a user's job is copied, relative to every host's workdir (the processes' working
    directory), so the same on every host: ``.pscluster/<cluster>/jobs/<job>``."""
    return f"{HostLayout.relative_run_dir(cluster)}/jobs/{_check_name('job name', job)}"


@dataclass(frozen=True)
class HostLayout:
    """The files of cluster ``cluster`` under one host's ``workdir`` (see the module docstring).

    Raises:
        ValueError: ``cluster`` is not a valid cluster name (names.py; the plan checks user
            input first, with a hint), or a job/role name or number that cannot be a path part.
    """

    workdir: str
    cluster: str

    def __post_init__(self) -> None:
        if not is_cluster_name(self.cluster):
            raise ValueError(f"{self.cluster!r} is not a valid cluster name")
        if not self.workdir:
            raise ValueError("a host's workdir cannot be empty")

    @staticmethod
    def relative_run_dir(cluster: str) -> str:
        """The run folder relative to a workdir: ``.pscluster/<cluster>``."""
        if not is_cluster_name(cluster):
            raise ValueError(f"{cluster!r} is not a valid cluster name")
        return f"{RUN_ROOT}/{cluster}"

    @property
    def run_dir(self) -> str:
        """``<workdir>/.pscluster/<cluster>``: everything below is the cluster's (``down`` may
        delete it); its folders are owner-only (hostctl makes every folder from ``.pscluster``
        down 0700)."""
        return f"{self.workdir.rstrip('/')}/{self.relative_run_dir(self.cluster)}"

    def _task(self, role: str, index: int) -> str:
        return f"{_check_name('role', role)}-{_check_number('task index', index, 0)}"

    # -- standing servers (and the plan's per-task files)
    def server_log(self, role: str, index: int, attempt: int = 1) -> str:
        """The log of a task's standing server (``TaskSpec.log_path`` is attempt 1)."""
        return attempt_log(f"{self.run_dir}/{self._task(role, index)}{LOG_SUFFIX}", attempt)

    def task_events(self, role: str, index: int) -> str:
        """The plan's per-task events file (``TaskSpec.events_path``)."""
        return f"{self.run_dir}/{self._task(role, index)}{EVENTS_SUFFIX}"

    # -- standbys: a training process started before its job (roles/standby.py)
    def standby_log(self, role: str, index: int, attempt: int) -> str:
        """The log of the ``attempt``-th standby of task ``role:index``."""
        return f"{self.run_dir}/standby/{self._task(role, index)}.{_check_number('attempt', attempt, 1)}{LOG_SUFFIX}"

    # -- job processes (`train`, `run`): a folder per job, a pair of files per attempt
    def job_dir(self, job_id: int) -> str:
        return f"{self.run_dir}/job-{_check_number('job id', job_id, 1)}"

    def job_paths(self, job_id: int, role: str, index: int, attempt: int) -> tuple[str, str]:
        """(log, events) of attempt ``attempt`` of task ``role:index`` in job ``job_id``."""
        base = f"{self.job_dir(job_id)}/{self._task(role, index)}.{_check_number('attempt', attempt, 1)}"
        return base + LOG_SUFFIX, base + EVENTS_SUFFIX

    # -- on the job leader's host
    def checkpoint_dir(self, job: str) -> str:
        """The default checkpoint folder of job ``job`` (``--checkpoint-dir`` overrides it)."""
        return f"{self.run_dir}/checkpoints/{_check_name('job name', job)}"

    @property
    def tensorboard_root(self) -> str:
        """Every job's TensorBoard summaries (one run per job): what ``pscluster tensorboard`` serves."""
        return f"{self.run_dir}/tensorboard"

    def summary_dir(self, job: str) -> str:
        """Where job ``job``'s leader writes its TensorBoard summaries."""
        return f"{self.tensorboard_root}/{_check_name('job name', job)}"

    def tensorboard_log(self, attempt: int) -> str:
        """The log of the ``attempt``-th TensorBoard server started for this cluster."""
        return f"{self.run_dir}/tensorboard.{_check_number('attempt', attempt, 1)}{LOG_SUFFIX}"


class Placed(Protocol):
    """A task as the layout needs it (:class:`cluster.plan.TaskSpec` is one; the plan sits in a
    room below this module, which therefore names only what it reads)."""

    @property
    def workdir(self) -> str: ...


class Planned(Protocol):
    """A plan as the layout needs it (:class:`cluster.plan.ClusterPlan` is one)."""

    @property
    def name(self) -> str: ...

    @property
    def leader(self) -> Placed: ...


def host_layout(task: Placed, plan: Planned) -> HostLayout:
    """The cluster's files under ``task``'s workdir on its host."""
    return HostLayout(task.workdir, plan.name)


def leader_layout(plan: Planned) -> HostLayout:
    """The files on the job leader's host: the default checkpoint folder and the TensorBoard
    summaries (``tensorboard_root``, what ``pscluster tensorboard`` serves)."""
    return host_layout(plan.leader, plan)


@dataclass(frozen=True)
class DaemonLayout:
    """A detached supervisor's files in the state directory ``root`` on this machine: one text
    log per cluster (appended by every daemon, kept after ``down`` for the post-mortem) and one
    JSON-lines events file per daemon (removed with the cluster)."""

    root: Path
    cluster: str

    def __post_init__(self) -> None:
        if not is_cluster_name(self.cluster):
            raise ValueError(f"{self.cluster!r} is not a valid cluster name")

    @property
    def log(self) -> Path:
        return self.root / f"{self.cluster}.supervisor.log"

    def events(self, pid: int) -> Path:
        return self.root / f"{self.cluster}.supervisor-{_check_number('pid', pid, 1)}.events"

    @property
    def events_glob(self) -> str:
        """Matches every daemon's events file of this cluster, relative to ``root``."""
        return f"{self.cluster}.supervisor-*.events"
