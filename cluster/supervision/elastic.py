"""Elastic membership's inputs: ``train --min-workers``, ``--hosts-from`` and ``--notices-from``.

:class:`Elastic` is what ``train`` asks for; :func:`parse_host_list` reads a discovery command's
host list; :class:`BackgroundCommand` runs a command of the user's in the background of the
supervisor's loop, by the same rules for every option that takes one (``--hosts-from``:
:class:`Discovery`; ``--notices-from``: cluster/supervision/notices.py): what it prints that
does not parse is a warning and changes nothing, one that hangs is stopped after a timeout, one
that floods is stopped at a limit, and one still running when the job ends is stopped with what
it started.
"""
from __future__ import annotations

import os
import shlex
import subprocess
from dataclasses import dataclass
from typing import Callable, Generic, TypeVar

from ..errors import UsageError
from ..events import Reporter
from ..transport.local import kill_group
from ..inventory.model import MAX_TASKS_PER_HOST

T = TypeVar("T")

DISCOVERY_TIMEOUT = 30.0            # seconds a --hosts-from command may run before it is stopped
DISCOVERY_OUTPUT_LIMIT = 1 << 20    # bytes of host list read at most (more: refused, with a warning)
DEFAULT_NOTICE_DEADLINE = 30.0      # a notice that names no deadline: GCE's preemption notice


@dataclass(frozen=True)
class Elastic:
    """``train --min-workers N`` and ``--hosts-from CMD`` (every ``--hosts-every`` seconds);
    ``--notices-from CMD`` (every ``--notices-every`` seconds; ``--notice-deadline`` for a notice
    that names none, and for a host's own shutdown seen by its watch)."""

    min_workers: int | None = None
    hosts_from: str | None = None
    hosts_every: float = 10.0
    notices_from: str | None = None
    notices_every: float = 5.0
    notice_deadline: float = DEFAULT_NOTICE_DEADLINE

    @property
    def follows_membership(self) -> bool:
        """Whether the job's membership is elastic (--min-workers, --hosts-from): notices alone
        drain hosts, as ``pscluster drain`` does, and change nothing else."""
        return self.min_workers is not None or bool(self.hosts_from)


def parse_host_list(text: str, *, source: str) -> dict[str, int | None]:
    """A discovery command's output (``--hosts-from``): one ``host`` or ``host:workers`` per line,
    as horovodrun's ``--host-discovery-script`` prints them; blank lines and ``#`` comments are
    skipped. ``None``: the inventory's count for that host. ``workers`` is capped as the
    inventory caps ``worker_tasks`` (:data:`MAX_TASKS_PER_HOST`; 0 leaves the host out, as
    not naming it does).

    Raises:
        UsageError: a line that is neither, or a count past the cap.
    """
    hosts: dict[str, int | None] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, count = line.rpartition(":")
        if not sep:
            name, count = line, ""
        bad = (not name or any(c.isspace() or not c.isprintable() for c in name)
               or (sep and not (count.isdigit() and len(count) <= 6)))
        if bad:
            raise UsageError(f"{source}, line {number}: expected 'host' or 'host:workers', got {raw[:80]!r}")
        if sep and int(count) > MAX_TASKS_PER_HOST:
            raise UsageError(f"{source}, line {number}: {name}:{count}: at most {MAX_TASKS_PER_HOST} workers per "
                             "host, as worker_tasks in an inventory")
        hosts[name] = int(count) if sep else None
    return hosts


class BackgroundCommand(Generic[T]):
    """A user's command (``option``: the flag that gave it, which every warning names), run in
    the background every ``every`` seconds, never waited on: the supervisor's loop goes on while
    it runs (``--hosts-from`` was run in the loop, and a slow command held back every turn:
    exits, stop requests and the job's events waited up to 30 s).

    Run on this machine, split like a shell line but with no shell (as ``--notify-cmd``), in a
    process group of its own. :meth:`poll`, once per turn, starts it when it is due and none runs,
    reads what it printed so far (pipes read without blocking: at most ``limit`` bytes of output
    are kept, and the last 4 KiB of its stderr), and gives ``parse(output)`` once it ended well;
    None otherwise (not due, still running, or failed: a warning says why and ends with
    ``unchanged``). A command that prints more than ``limit``, or still runs after ``timeout``
    seconds, is stopped with what it started (a script's children too), and so is one still
    running when the job ends (:meth:`close`). ``parse`` raises :class:`UsageError` for output
    it refuses (a warning, nothing changes)."""

    def __init__(self, command: str, every: float, *, option: str, parse: Callable[[str], T], unchanged: str,
                 timeout: float = DISCOVERY_TIMEOUT, limit: int = DISCOVERY_OUTPUT_LIMIT):
        self.command, self.every, self.timeout, self.limit = command, every, timeout, limit
        self.option, self.parse, self.unchanged = option, parse, unchanged
        self.proc: subprocess.Popen[bytes] | None = None
        self.out, self.err = bytearray(), bytearray()
        self.started = 0.0
        self.next_run: float | None = None      # None: at the first poll

    def _warn(self, reporter: Reporter, text: str) -> None:
        reporter.emit("message", level="warning", text=f"{text}; {self.unchanged}")

    def poll(self, now: float, reporter: Reporter) -> T | None:
        if self.proc is None:
            if self.next_run is None or now >= self.next_run:
                self.next_run = now + self.every
                self._start(now, reporter)
            return None
        code = self._exit_code()        # before reading: all it printed before it ended is then read below
        if not self._read():
            self.close()
            self._warn(reporter, f"{self.option} printed more than {self.limit >> 20} MiB: stopped")
            return None
        if code is None:
            if now - self.started > self.timeout:
                self.close()
                self._warn(reporter, f"{self.option}: still running after {self.timeout:g} s: stopped, with what it "
                                     "started")
            return None
        out, err = bytes(self.out), bytes(self.err)
        self.close()
        if code != 0:
            tail = err.decode(errors="replace").strip()[-200:]
            self._warn(reporter, f"{self.option} exited with {code}: {tail!r}")
            return None
        try:
            return self.parse(out.decode())
        except UnicodeDecodeError:
            self._warn(reporter, f"{self.option} printed bytes that are not UTF-8")
        except UsageError as exc:
            self._warn(reporter, exc.message)
        return None

    def close(self) -> None:
        """Stop every process of the command's group, whether its leader still runs or exited (a
        ``sh -c 'sleep 123 & echo h1'`` that exited 0 left one ``sleep`` per poll: issue 42, L8),
        then reap the leader; close its pipes. The leader is reaped only here, so until then its
        pid is still the group's and cannot name another process's."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.returncode is None:
            kill_group(proc)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        self.out, self.err = bytearray(), bytearray()

    def _exit_code(self) -> int | None:
        """The leader's exit status once it ended, None while it runs; left unreaped (WNOWAIT)."""
        assert self.proc is not None
        try:
            info = os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:        # reaped already (not by us): Popen knows
            return self.proc.poll()
        if info is None:
            return None
        return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status

    def _start(self, now: float, reporter: Reporter) -> None:
        try:
            argv = shlex.split(self.command)
            if not argv:        # the command line refuses it (cli/options.py): not expected
                raise ValueError("the command is empty")
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, start_new_session=True, close_fds=True)
        except (OSError, ValueError) as exc:
            self._warn(reporter, f"{self.option}: {exc}")
            return
        for stream in (self.proc.stdout, self.proc.stderr):
            assert stream is not None
            os.set_blocking(stream.fileno(), False)
        self.started = now

    def _read(self) -> bool:
        """Read what the pipes hold now, at most ``limit`` bytes of each per call (a command that
        floods its stderr would otherwise keep this turn reading); False once stdout passed the
        limit."""
        assert self.proc is not None and self.proc.stdout is not None and self.proc.stderr is not None
        for stream, kept in ((self.proc.stdout, self.out), (self.proc.stderr, self.err)):
            read = 0
            while read <= self.limit:
                try:
                    chunk = os.read(stream.fileno(), 1 << 16)
                except BlockingIOError:
                    break
                if not chunk:
                    break
                read += len(chunk)
                kept += chunk
                if kept is self.err:
                    del kept[:-4096]
                elif len(kept) > self.limit:
                    return False
        return True


class Discovery(BackgroundCommand[dict[str, int | None]]):
    """``--hosts-from``'s command (:class:`BackgroundCommand`): its host list, and membership
    unchanged when it fails."""

    def __init__(self, command: str, every: float, *, timeout: float = DISCOVERY_TIMEOUT,
                 limit: int = DISCOVERY_OUTPUT_LIMIT):
        super().__init__(command, every, option="--hosts-from", unchanged="membership unchanged",
                         parse=lambda text: parse_host_list(text, source="--hosts-from"), timeout=timeout, limit=limit)
