"""How a training process ends when nobody lets it finish: signals and deadlines.

Two facts checked on TF 2.21 make in-process handling unreliable:

* while ``MultiWorkerMirroredStrategy()`` waits for a peer that never starts,
  TensorFlow blocks in C++ *holding the GIL*: no Python code runs in that process
  any more, in any thread (no ``signal.signal`` handler, no timer thread);
* MultiWorkerMirroredStrategy's coordination service installs its own C++ SIGTERM
  handler (``preemption_notifier.cc: SIGTERM caught``) that records the signal and
  does *not* end the process.

So ``roles.train`` splits itself in two, before TensorFlow is imported:

* the original process -- the PID the orchestrator recorded -- becomes the
  :class:`Guardian`: a few MB of plain Python that never imports TensorFlow;
* a forked child does the training and tells the guardian through a pipe when the
  first step has run (``disarm``) and when it has written its own final event
  (``finished``).

Checkpoint on stop (``stop_grace`` > 0, every mode): once the first step has run, a
SIGTERM is a request, not a kill. The guardian forwards it to the trainer as
:data:`STOP_SIGNAL` (SIGUSR1): sync mode's coordination service replaces the trainer's
SIGTERM handler with its own C++ one, but leaves SIGUSR1 to Python. The trainer's handler
(for both signals) sets :attr:`TrainerLink.stop_requested`; the drivers check it at each
unit of work, save a checkpoint and end (sync workers first agree on the step: one
all-reduce of the flag per unit, roles/sync_driver.py). The guardian SIGKILLs the trainer
only if it is still running ``stop_grace`` seconds later (or on a second signal, or on
SIGINT/SIGHUP). Before the first step, SIGTERM kills at once as before.

Otherwise the guardian turns SIGTERM/SIGINT/SIGHUP into SIGKILL for the trainer, enforces
``--start-timeout``, writes the ``error`` event when the trainer could not, and exits
with the trainer's exit code (or 128+signal, or :data:`EXIT_START_TIMEOUT`). The
trainer gets ``PR_SET_PDEATHSIG`` so it cannot outlive a SIGKILLed guardian.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
import time
from typing import Callable, NoReturn

TERMINATION_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# How the guardian asks the trainer to checkpoint and stop (module docstring: not SIGTERM,
# which sync mode's coordination service takes over in C++).
STOP_SIGNAL = signal.SIGUSR1
EXIT_START_TIMEOUT = 3
WAKE_SECONDS = 0.5

_DISARM = b"d"
_FINISHED = b"f"
_PR_SET_PDEATHSIG = 1

Report = Callable[[str, str], None]  # (message, exception) -> writes an error event


class TrainerLink:
    """The trainer's end of the pipe to the guardian."""

    def __init__(self, write_fd: int) -> None:
        self._fd: int | None = write_fd
        self.stop_requested = False   # set by SIGTERM when checkpoint-on-stop is on
        self.stop_reason = ""

    def request_stop(self, reason: str) -> None:
        """Ask the driver to checkpoint and end at its next unit of work."""
        if not self.stop_requested:
            self.stop_requested, self.stop_reason = True, reason

    def disarm(self) -> None:
        """The first step ran: the start deadline no longer applies."""
        self._send(_DISARM)

    def finished(self) -> None:
        """The trainer has written its final event (done or error) itself."""
        self._send(_FINISHED)

    def _send(self, message: bytes) -> None:
        if self._fd is None:
            return
        try:
            os.write(self._fd, message)
        except OSError:
            self._fd = None  # the guardian is gone; PDEATHSIG will follow


def _die_with_parent(parent: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the orchestrator's process-group kill still reaches us
    if os.getppid() != parent:  # the guardian died before prctl took effect
        os._exit(1)


def fork_trainer() -> tuple[int, int]:
    """The fork behind :func:`split`: ``(0, write end)`` in the trainer, ``(trainer pid, read
    end)`` in the guardian. Termination signals stay blocked on both sides until the caller
    finishes with :func:`become_trainer` / :func:`become_guardian` (or unblocks them itself,
    as a standby that waits for its job does: roles/standby.py).

    Call before importing TensorFlow: ``fork`` is only safe without threads.
    """
    read_fd, write_fd = os.pipe()
    parent = os.getpid()
    # Block termination signals across the fork so none is lost in between; each
    # side then installs what it needs and unblocks.
    signal.pthread_sigmask(signal.SIG_BLOCK, TERMINATION_SIGNALS)
    sys.stdout.flush()
    sys.stderr.flush()
    child = os.fork()
    if child == 0:
        os.close(read_fd)
        for sig in TERMINATION_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        _die_with_parent(parent)
        return 0, write_fd
    os.close(write_fd)
    return child, read_fd


def become_trainer(write_fd: int, stop_grace: float = 0.0) -> TrainerLink:
    """The trainer's side after :func:`fork_trainer`: its link, with checkpoint-on-stop when
    ``stop_grace`` > 0; termination signals are unblocked."""
    link = TrainerLink(write_fd)
    if stop_grace > 0:
        for sig in (signal.SIGTERM, STOP_SIGNAL):
            signal.signal(sig, lambda _s, _f: link.request_stop("SIGTERM"))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, TERMINATION_SIGNALS)
    return link


def become_guardian(child: int, read_fd: int, start_timeout: float, what: str, report: Report,
                    stop_grace: float = 0.0) -> NoReturn:
    """The guardian's side after :func:`fork_trainer`: supervise, then exit with the outcome."""
    code = 1
    try:
        code = Guardian(child, read_fd, start_timeout, what, report, stop_grace).supervise()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def split(start_timeout: float, what: str, report: Report, stop_grace: float = 0.0) -> TrainerLink:
    """Forks; returns a :class:`TrainerLink` in the trainer and never returns in the
    guardian (which exits with the trainer's outcome). ``stop_grace`` > 0 turns on
    checkpoint-on-stop (module docstring).

    Call before importing TensorFlow: ``fork`` is only safe without threads.
    """
    child, fd = fork_trainer()
    if child == 0:
        return become_trainer(fd, stop_grace)
    become_guardian(child, fd, start_timeout, what, report, stop_grace)


class Guardian:
    """The supervising side; see the module docstring."""

    def __init__(self, child: int, read_fd: int, start_timeout: float, what: str,
                 report: Report, stop_grace: float = 0.0) -> None:
        self._child = child
        self._stop_grace = stop_grace
        self._armed = True           # the start deadline applies (no step has run yet)
        self._kill_at: float | None = None
        self._fd = read_fd
        self._start_timeout = start_timeout
        self._what = what
        self._report = report
        self._signal: int | None = None
        self._finished = False       # the trainer wrote its own final event
        self._eof = False            # the trainer closed its end of the pipe

    def _on_signal(self, signum: int, _frame: object) -> None:
        # A disarm the trainer sent just before the signal counts (a stop right after the first
        # step is still a stop request): read what the pipe holds before deciding.
        self._drain()
        first = self._signal is None
        if first:
            self._signal = signum
        graceful = first and signum == signal.SIGTERM and self._stop_grace > 0 and not self._armed
        if graceful:
            self._kill_at = time.monotonic() + self._stop_grace
        try:
            os.kill(self._child, STOP_SIGNAL if graceful else signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _drain(self) -> None:
        """Read what the trainer has written (the pipe is non-blocking)."""
        try:
            data = os.read(self._fd, 64)
        except BlockingIOError:
            return
        if _DISARM in data:
            self._armed = False
        if _FINISHED in data:
            self._finished = True
        if not data:
            self._eof = True

    def supervise(self) -> int:
        os.set_blocking(self._fd, False)
        for sig in TERMINATION_SIGNALS:
            signal.signal(sig, self._on_signal)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, TERMINATION_SIGNALS)
        deadline = time.monotonic() + self._start_timeout
        timed_out = False
        while not self._eof:
            ends = [t for t in (deadline if self._armed else None, self._kill_at) if t is not None]
            # At most WAKE_SECONDS: select is retried on EINTR with its original timeout, so a
            # stop grace that a signal handler set would otherwise never be looked at.
            timeout = min([WAKE_SECONDS] + [max(0.0, t - time.monotonic()) for t in ends])
            ready, _, _ = select.select([self._fd], [], [], timeout)
            if not ready:
                now = time.monotonic()
                if self._kill_at is not None and now >= self._kill_at:
                    self._kill_at = None   # the stop grace is over: the checkpoint did not make it
                elif self._armed and now >= deadline:
                    timed_out, self._armed = True, False
                else:
                    continue
                try:
                    os.kill(self._child, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                continue
            self._drain()       # at EOF the trainer closed the pipe: it is exiting or dead
        _, status = os.waitpid(self._child, 0)
        return self._outcome(status, self._finished, timed_out)

    def _outcome(self, status: int, finished: bool, timed_out: bool) -> int:
        if self._signal is not None:
            name = signal.Signals(self._signal).name
            if not finished:
                self._report(f"terminated by {name}", "Terminated")
            return 128 + self._signal
        if timed_out and not finished:
            self._report(f"{self._what} did not happen within {self._start_timeout:g} s "
                         f"(--start-timeout); a peer task is probably not running",
                         "StartTimeout")
            return EXIT_START_TIMEOUT
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            if not finished:
                self._report(f"the training process was killed by "
                             f"{signal.Signals(sig).name}", "Terminated")
            return 128 + sig
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1
        if code != 0 and not finished:
            self._report(f"the training process exited with code {code} without "
                         f"reporting why (see its log)", "Crashed")
        return code
