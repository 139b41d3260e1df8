"""Notices from where they come (issue 44, item 2): a host told to go is drained before its deadline.

Two sources, one road:

* ``train --notices-from COMMAND`` runs in the background of the supervisor's loop every
  ``--notices-every`` seconds, by the rules of ``--hosts-from``
  (:class:`~cluster.supervision.elastic.BackgroundCommand`). It prints ``HOST [DEADLINE]`` lines
  (:func:`parse_notices`): a cloud's metadata endpoint read for each host (examples/notices/), a
  scheduler's list of nodes to leave (Slurm: ``sinfo -h -N -t drain,draining -o '%N'``);
* a host's own watch stream says it was told to go (SIGTERM: the host shuts down; SIGUSR1:
  Slurm's ``scancel --signal=USR1`` to the node's watch step): cluster/supervision/links.py.

Each host noticed that is in the cluster and not drained already is drained **once**
(:class:`NoticeBoard`, pure): the supervisor starts, as a child process, exactly what a user
would type, ``python -m cluster --state-dir ROOT drain HOST --deadline Ns --name NAME``
(:class:`DrainChild`). A separate process, because ``drain`` asks this very supervisor (a
request and SIGUSR2) and waits for its answer, which an in-process call would never get. One
drain at a time: the next notice waits, and its deadline keeps counting from when it was
noticed. The child's output goes to ``<state dir>/<name>.drains.log``; when it ends, a message
gives its exit code (0 drained, 1 checkpointed instead, 2 refused) and its last line. A drain
still running when the job ends is given a moment to finish (it waits on this job) and is then
stopped with its process group.
"""
from __future__ import annotations

import datetime
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Collection, Iterable, Sequence

from ..errors import UsageError
from ..events import Reporter
from ..transport.local import kill_group
from ..lifecycle.drain import parse_deadline
from .elastic import BackgroundCommand

NOTICES_OPTION = "--notices-from"
CHILD_END_GRACE = 5.0       # a drain still running when the job ends: its time to see that and end
MAX_NOTICE_SECONDS = 24 * 3600.0


@dataclass(frozen=True)
class Notice:
    """A host told to go: within ``seconds`` of when it was noticed, or by ``at`` (epoch
    seconds, UTC), or (both None) within the job's ``--notice-deadline``."""

    host: str
    seconds: float | None = None
    at: float | None = None
    source: str = NOTICES_OPTION

    def remaining(self, *, wall: float, default: float) -> float:
        """Seconds left at wall time ``wall`` (may be 0 or less: the deadline passed)."""
        if self.seconds is not None:
            return self.seconds
        if self.at is not None:
            return self.at - wall
        return default


def _iso_time(text: str) -> float | None:
    """Epoch seconds of an ISO-8601 time (``2026-12-02T19:00:00Z``, as AWS's instance-action
    gives; no offset: UTC), None if ``text`` is not one."""
    if "T" not in text and " " not in text:
        return None
    try:
        when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return when.timestamp()


def parse_notices(text: str, *, source: str = NOTICES_OPTION) -> tuple[Notice, ...]:
    """A notice command's output: one ``HOST [DEADLINE]`` per line; DEADLINE a duration (``30s``,
    ``2m``, ``45``: seconds) or an ISO-8601 time (``2026-12-02T19:00:00Z``); none: the job's
    ``--notice-deadline``. Blank lines and ``#`` comments are skipped; a host named twice keeps
    its earliest deadline (a time and a duration compare once the time is known: the first).

    Raises:
        UsageError: a line that is not that (the whole output is refused: nothing is drained).
    """
    found: dict[str, Notice] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        host = words[0]
        bad = len(words) > 2 or any(not c.isprintable() for c in host) or host.startswith("-")
        notice = Notice(host, source=source)
        if not bad and len(words) == 2:
            at = _iso_time(words[1])
            if at is not None:
                notice = Notice(host, at=at, source=source)
            else:
                try:
                    notice = Notice(host, seconds=parse_deadline(words[1]), source=source)
                except UsageError:
                    bad = True
        if bad:
            raise UsageError(f"{source}, line {number}: expected 'HOST' or 'HOST DEADLINE' (a duration such as 30s, "
                             f"or an ISO-8601 time such as 2026-12-02T19:00:00Z), got {raw[:80]!r}")
        earlier = found.get(host)
        if earlier is None or (notice.seconds is not None and earlier.seconds is not None
                               and notice.seconds < earlier.seconds) or \
                (notice.at is not None and earlier.at is not None and notice.at < earlier.at):
            found[host] = notice
    return tuple(found.values())


class NoticeSource(BackgroundCommand[tuple[Notice, ...]]):
    """``--notices-from``'s command, by ``--hosts-from``'s rules; nothing is drained when it fails."""

    def __init__(self, command: str, every: float, **limits: Any):
        super().__init__(command, every, option=NOTICES_OPTION, unchanged="no host drained",
                         parse=lambda text: parse_notices(text), **limits)


@dataclass(frozen=True)
class DueDrain:
    """A drain to start: ``host`` by ``due`` (the supervisor's clock), for ``why``."""

    host: str
    due: float
    why: str


@dataclass
class NoticeBoard:
    """Which hosts were noticed, and the drains still to start, one host once (pure: the clock
    and the cluster's hosts are passed in)."""

    default_deadline: float
    noticed: set[str] = field(default_factory=set)       # drained, draining, or queued: never again
    strangers: set[str] = field(default_factory=set)     # named but not in the cluster: warned once
    queue: list[DueDrain] = field(default_factory=list)

    def take(self, notices: Iterable[Notice], *, now: float, wall: float, hosts: Collection[str],
             drained: Collection[str]) -> list[str]:
        """Queue a drain for each host of ``notices`` in ``hosts`` (the cluster's, with tasks) not
        ``drained`` and not noticed before; warnings for the hosts not in the cluster (once each)."""
        warnings = []
        for notice in notices:
            host = notice.host
            if host in self.noticed or host in drained:
                continue
            if host not in hosts:
                if host not in self.strangers:
                    self.strangers.add(host)
                    warnings.append(f"{notice.source}: {host} is not a host of this cluster: no drain "
                                    f"(its hosts: {', '.join(sorted(hosts)) or 'none'})")
                continue
            self.noticed.add(host)
            left = min(notice.remaining(wall=wall, default=self.default_deadline), MAX_NOTICE_SECONDS)
            when = f"within {left:.0f} s" if notice.seconds is not None or notice.at is None else \
                f"by {datetime.datetime.fromtimestamp(notice.at, datetime.timezone.utc):%H:%M:%SZ}"
            self.queue.append(DueDrain(host, now + left, f"{notice.source}: {when}"))
        return warnings

    def next_due(self) -> DueDrain | None:
        """The drain to start next (the earliest deadline first), taken off the queue."""
        if not self.queue:
            return None
        self.queue.sort(key=lambda item: item.due)
        return self.queue.pop(0)


MIN_CHILD_DEADLINE = 1.0    # a deadline that passed while another drain ran: the drain still runs, at once


def drain_argv(*, state_dir: Path, name: str, host: str, seconds: float) -> list[str]:
    """What a user would type to drain ``host`` within ``seconds``."""
    return [sys.executable, "-m", "cluster", "--state-dir", str(state_dir), "drain", host,
            "--deadline", f"{max(seconds, MIN_CHILD_DEADLINE):.1f}s", "--name", name]


class DrainChild:
    """One ``pscluster drain`` run as a child process in its own process group, its output
    appended to ``log``; polled, never waited on."""

    def __init__(self, host: str, why: str, argv: Sequence[str], log: Path):
        self.host, self.why, self.argv, self.log = host, why, list(argv), log
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as handle:
            handle.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} drain {host} ({why}): "
                         f"{' '.join(self.argv[1:])}\n".encode())
            self.offset = handle.tell()
        package_root = str(Path(__file__).resolve().parents[2])      # `-m cluster` imports from here
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH"))
                                                           if p)}
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True, close_fds=True, env=env)

    def poll(self) -> int | None:
        return self.proc.poll()

    def last_line(self) -> str:
        """The last line the drain printed (what it did, or why not), hints passed over: the last
        line of a refusal is its hint, which says what to do, not what happened."""
        try:
            with open(self.log, "rb") as handle:
                handle.seek(self.offset)
                text = handle.read()[-8192:].decode(errors="replace")
        except OSError:
            return ""
        lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("hint:")]
        return lines[-1] if lines else ""

    def stop(self, grace: float, sleep: Callable[[float], None] = time.sleep) -> None:
        """Give it ``grace`` seconds to end by itself, then stop its whole process group."""
        end = time.monotonic() + grace
        while self.proc.poll() is None and time.monotonic() < end:
            sleep(0.1)
        if self.proc.poll() is None:
            kill_group(self.proc)


class NoticeDrains:
    """The supervisor's side (module docstring): each turn, the notice command's output and the
    hosts' watch notices become queued drains, and one drain child runs at a time."""

    def __init__(self, *, state_dir: Path, name: str, default_deadline: float, source: NoticeSource | None = None,
                 start: Callable[[str, str, Sequence[str], Path], DrainChild] = DrainChild):
        self.state_dir, self.name, self.source = state_dir, name, source
        self.board = NoticeBoard(default_deadline)
        self.start = start
        self.child: DrainChild | None = None
        self.log = state_dir / f"{name}.drains.log"

    def turn(self, *, now: float, wall: float, reporter: Reporter, hosts: Collection[str],
             drained: Collection[str], watch_notices: dict[str, dict[str, str]]) -> None:
        notices = [Notice(host, source=f"{host}'s watch got {said.get('signal', 'a notice')}")
                   for host, said in watch_notices.items()]
        if self.source is not None:
            notices += self.source.poll(now, reporter) or ()
        for text in self.board.take(notices, now=now, wall=wall, hosts=hosts, drained=drained):
            reporter.emit("message", level="warning", text=text)
        if self.child is not None:
            code = self.child.poll()
            if code is None:
                return
            child, self.child = self.child, None
            what = {0: "drained", 1: "checkpointed instead", 2: "refused"}.get(code, "failed")
            reporter.emit("message", level="info" if code == 0 else "warning",
                          text=f"drain {child.host} ({child.why}) ended with exit code {code} ({what}): "
                               f"{child.last_line() or 'no output'} (log: {self.log})")
        due = self.board.next_due()
        if due is None:
            return
        seconds = due.due - now
        argv = drain_argv(state_dir=self.state_dir, name=self.name, host=due.host, seconds=seconds)
        reporter.emit("message", level="warning",
                      text=f"notice for {due.host} ({due.why}): draining it within {max(seconds, 0):.0f} s "
                           f"(pscluster drain {due.host}; log: {self.log})")
        try:
            self.child = self.start(due.host, due.why, argv, self.log)
        except OSError as exc:
            reporter.emit("message", level="warning", text=f"could not start the drain of {due.host}: {exc}")

    def close(self) -> None:
        """When the job ends: the notice command and a drain still running are stopped."""
        if self.source is not None:
            self.source.close()
        child, self.child = self.child, None
        if child is not None:
            child.stop(CHILD_END_GRACE)
