"""``pscluster tensorboard``: TensorBoard on the host that owns the jobs' summaries, reached from here.

The leader of a job (async: the chief; sync, sync-ps: worker 0) writes TensorBoard summaries
under ``<workdir>/.pscluster/<name>/tensorboard/<job>/`` on its own host (roles/summaries.py),
so TensorBoard runs there, on the whole ``tensorboard/`` folder (one run per job):

* bound to the host's loopback: TensorBoard has no authentication, and nothing but this
  machine needs to reach it;
* started through ``hostctl start`` and recorded in the state (kind ``tensorboard``) before it
  runs, like a task: this command stops it by process group on Ctrl-C/SIGTERM, and ``down``
  stops it if this command was killed;
* reached through a local port forwarded over the host's SSH connection (a direct-tcpip
  channel per connection, as ``ssh -L``); a local host needs no forward.
"""
from __future__ import annotations

import time
import urllib.error
import urllib.request
from dataclasses import dataclass, replace
from typing import Callable

from .hosts import hostops
from .contracts import Phase, ProcessKind
from .errors import HostError, PsclusterError, UsageError
from .plan import ClusterPlan, TaskSpec
from .layout import leader_layout
from .state import ProcessRecord, RunState, StateStore, StateWriter
from .transport import TransportPool

DEFAULT_PORT = 6006           # TensorBoard's own default
HOST_PORT_CANDIDATES = 20     # on an SSH host, the first free port from --port on
READY_TIMEOUT = 120.0         # TensorBoard imports TensorFlow: ~6 s on a quiet 2-core machine
TASK = "tensorboard"          # the records' task name: not a plan task, so status rows ignore it


@dataclass(frozen=True)
class BoardSpec:
    """Where and how TensorBoard runs for one cluster (pure: from the state alone)."""

    owner: TaskSpec           # the leader whose host holds the summaries
    logdir: str
    record: ProcessRecord

    def argv(self, python: str, port: int) -> list[str]:
        return [python, "-m", "tensorboard.main", "--logdir", self.logdir, "--host", "127.0.0.1", "--port", str(port)]

    def env(self, cluster: str) -> dict[str, str]:
        """The leader's environment (pscluster_env included) without its TF_CONFIG: TensorBoard is
        no cluster member. It gets no GPU (it imports TensorFlow when it can)."""
        env = {key: value for key, value in self.owner.env if key != "TF_CONFIG"}
        env.update(PSCLUSTER_CLUSTER=cluster, PSCLUSTER_TASK=TASK, CUDA_VISIBLE_DEVICES="")
        return env


def board_spec(state: RunState) -> BoardSpec:
    """TensorBoard's host, folder and the record of its next start (logs numbered per start)."""
    plan: ClusterPlan = state.plan
    owner = plan.leader
    attempt = state.next_attempt(TASK, ProcessKind.TENSORBOARD)
    layout = leader_layout(plan)
    log = layout.tensorboard_log(attempt)
    record = ProcessRecord.for_task(TASK, owner.host, ProcessKind.TENSORBOARD, attempt, log)
    return BoardSpec(owner=owner, logdir=layout.tensorboard_root, record=record)


def host_ports(port: int, *, local: bool) -> list[int]:
    """Ports to try for TensorBoard on its host: a local host serves the URL itself, so only
    ``port``; an SSH host any free one from ``port`` on (the forward listens on ``port`` here)."""
    return [port] if local else [p for p in range(port, port + HOST_PORT_CANDIDATES) if p <= 65535]


class TensorBoardRun:
    """One TensorBoard for one cluster: :meth:`start` (returns the URL), :meth:`check`, :meth:`stop`."""

    def __init__(self, *, store: StateStore, name: str, pool: TransportPool, port: int = DEFAULT_PORT,
                 timeout: float = READY_TIMEOUT, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.store, self.name, self.pool, self.port, self.timeout = store, name, pool, port, timeout
        self.clock, self.sleep = clock, sleep
        self.record: ProcessRecord | None = None
        self.url: str | None = None

    def start(self) -> str:
        """Start TensorBoard on the leader's host, forward a port, wait until it answers HTTP.

        Raises:
            UsageError: the cluster is not up, has no summaries yet, or the port is taken.
            HostError: TensorBoard did not start (not installed there?) or never answered.
        """
        state = self.store.load(self.name)
        if state is None:
            raise UsageError(f"no cluster named {self.name!r}", hint="'pscluster status' lists the clusters that are up")
        if state.phase != Phase.UP:
            raise UsageError(f"cluster {self.name!r} is {state.phase}, not up")
        self.state, self.spec = state, board_spec(state)
        host = state.plan.host(self.spec.owner.host)
        self.transport = self.pool.get(host)
        found = hostops.find(self.transport, self.spec.logdir, contains="tfevents")
        if not found.files:
            raise UsageError(f"no TensorBoard summaries yet on {host.name} in {self.spec.logdir}",
                             hint="train a job first ('pscluster train JOB'): its leader writes them every "
                                  "--summary-every steps")
        port = self._free_port(host.is_local)
        # The local end first: a taken --port fails before anything starts on the host.
        address = self.transport.forward("127.0.0.1", port, local_port=self.port) or f"127.0.0.1:{port}"
        self.url = f"http://{address}/"
        self.writer = StateWriter(self.store, state, expect_phase=Phase.UP)
        self.writer.change(lambda s: s.processes.append(self.spec.record))
        self.record = self.spec.record
        try:
            self.record = hostops.start(self.transport, self.spec.owner, self.spec.record,
                                        argv=self.spec.argv(host.python, port), env=self.spec.env(self.name))
            started = self.record
            self.writer.change(lambda s: s.replace_record(started))
            self._wait_ready(self.url)
        except BaseException:
            self.stop()
            raise
        return self.url

    @property
    def host(self) -> str:
        return self.spec.owner.host

    def _free_port(self, local: bool) -> int:
        candidates = host_ports(self.port, local=local)
        facts = hostops.facts(self.transport, ports=candidates, gpus=False, workdir=None)
        busy = dict(facts.busy_ports)
        free = [port for port in candidates if port not in busy]
        if not free:
            where = "here" if local else f"on {self.host}"
            raise UsageError(f"port {self.port} is in use {where}" + ("" if local else f" (and the {len(candidates) - 1} "
                                                                                     "after it)"),
                             hint="choose another with --port")
        return free[0]

    def _wait_ready(self, url: str) -> None:
        deadline = self.clock() + self.timeout
        next_check = self.clock()
        while True:
            if answers(url):
                return
            if self.clock() >= next_check:      # a host call per check: not at every HTTP try
                self.check()
                next_check = self.clock() + 2.0
            if self.clock() > deadline:
                raise HostError(self.host, f"TensorBoard did not answer on {url} within {self.timeout:.0f} s",
                                stderr=self._log_tail(), hint=f"its log on {self.host}: {self.spec.record.log}")
            self.sleep(0.5)

    def check(self) -> None:
        """Raises HostError (with the log's tail) if TensorBoard is no longer running."""
        if self.record is None:
            return
        status = hostops.status(self.transport, [self.record]).get(self.record.key)
        if status is not None and status.state in ("running", "frozen"):
            return
        detail = status.describe() if status is not None else "gone"
        tail = self._log_tail()
        missing = "No module named" in tail and "tensorboard" in tail
        raise HostError(self.host, f"TensorBoard {detail}", stderr=tail,
                        hint="install it for the host's pscluster_python: pip install 'pscluster[tensorboard]'"
                        if missing else f"its log on {self.host}: {self.record.log}")

    def _log_tail(self) -> str:
        return hostops.log_tail(self.transport, self.spec.record.log, limit=2000)

    def stop(self, grace: float = 5.0) -> None:
        """Stop TensorBoard's process group on its host and mark its record stopped (if the
        cluster is still there: ``down`` may have stopped it meanwhile)."""
        record, self.record = self.record, None
        if record is None:
            return
        hostops.stop(self.transport, [record], grace=grace)
        try:
            self.writer.change(lambda s: s.replace_record(replace(record, stopped=True)))
        except PsclusterError:
            pass      # the cluster went down meanwhile: nothing left to record


def answers(url: str, timeout: float = 3.0) -> bool:
    """True when ``url`` answers HTTP 200."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False

