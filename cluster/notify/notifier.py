"""Notifications of a job's state changes: ``--notify URL``, ``--notify-cmd CMD``, ``pscluster_notify``.

The executor emits a typed ``job-state`` event (:class:`cluster.events.JobStateChange`) when a
job starts, restarts a task, fails, finishes, reaches ``--deadline`` or is stopped;
:class:`Notifier`, a :class:`~cluster.events.Reporter`, turns it into one JSON document::

    {"cluster": "lab", "job": "distributed_mnist", "event": "finished",
     "time": "2026-11-24T20:31:05Z", "report": {...}}

and hands it to one background thread per target (a URL it POSTs to, or a command it runs with
the document on stdin), so a slow or dead endpoint never delays training, nor another target.
Each delivery has a timeout (:data:`DELIVERY_TIMEOUT`) and is retried a bounded number of times
with backoff (:data:`RETRY_DELAYS`); a target that cannot be reached is reported once, as a
warning with its URL masked. :meth:`Notifier.close` waits at most :data:`FLUSH_SECONDS` for the
last events (the final one is sent after training ended), then gives up.

Secrets in URLs (:func:`mask_url`) are masked in every output: the user and password, every
query value and the fragment, and each path segment that looks like a token (16 characters or
more, or 8 or more with a digit: Slack's ``/services/T0.../B0.../xxxx``, Discord's
``/api/webhooks/ID/TOKEN``). A command is shown by its program name only.
"""
from __future__ import annotations

import json
import os
import queue
import select
import shlex
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from ..errors import UsageError
from ..events import Reporter
from ..transport.local import kill_group
from ..urls import mask_url, url_problem

EVENTS = ("started", "restarted", "resized", "failed", "finished", "deadline", "stopped")
DELIVERY_TIMEOUT = 5.0             # seconds for one POST or one command run
RETRY_DELAYS = (1.0, 4.0)          # backoff before the 2nd and 3rd attempt
FLUSH_SECONDS = 8.0                # close(): longest wait for events still queued


# ----------------------------------------------------------------------------- pure parts

@dataclass(frozen=True)
class Target:
    """Where notifications go: a URL (POST) or a command (argv, the event on stdin)."""

    url: str | None = None
    argv: tuple[str, ...] = ()

    @property
    def shown(self) -> str:
        """The target as every output shows it: a masked URL, or the command's program only."""
        return mask_url(self.url) if self.url is not None else f"command {self.argv[0]!r}"


def parse_targets(urls: Sequence[str], commands: Sequence[str]) -> tuple[Target, ...]:
    """The targets of ``--notify`` (and ``pscluster_notify``) URLs and ``--notify-cmd`` commands,
    duplicates dropped, in order.

    Raises:
        UsageError: a URL that is not http(s), or a command that is empty or cannot be split.
    """
    targets: list[Target] = []
    for url in urls:
        problem = url_problem(url)
        if problem:
            raise UsageError(f"--notify: {problem}", hint="e.g. --notify https://hooks.example.com/T/B/KEY")
        targets.append(Target(url=url))
    for command in commands:
        targets.append(Target(argv=split_command(command, "--notify-cmd", "'mail -s pscluster me@example.com'")))
    return tuple(dict.fromkeys(targets))


def split_command(command: str, option: str, example: str) -> tuple[str, ...]:
    """The words of a command given as ``option`` (``--notify-cmd``, ``train --hosts-from``),
    split like a shell line: it runs with no shell.

    Raises:
        UsageError: it cannot be split (an unclosed quote), or it is empty (the hint: ``example``).
    """
    try:
        argv = tuple(shlex.split(command))
    except ValueError as exc:
        raise UsageError(f"{option}: cannot split the command: {exc}") from None
    if not argv:
        raise UsageError(f"{option}: the command is empty", hint=f"e.g. {option} {example}")
    return argv


def iso_time(seconds: float) -> str:
    """Wall-clock seconds as ISO 8601 UTC to the second: ``2026-11-24T20:31:05Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def event_document(*, cluster: str, job: str, event: str, time: float, report: Mapping[str, Any]) -> dict:
    """The JSON object a target receives."""
    if event not in EVENTS:
        raise ValueError(f"unknown notification event {event!r}")
    return {"cluster": cluster, "job": job, "event": event, "time": iso_time(time), "report": dict(report)}


# ----------------------------------------------------------------------------- delivery

class DeliveryError(Exception):
    """One attempt failed; ``retry`` says whether another could succeed."""

    def __init__(self, message: str, *, retry: bool = True):
        super().__init__(message)
        self.retry = retry


def post_json(url: str, body: bytes, timeout: float) -> None:
    """POST ``body`` as JSON. A 4xx answer (but 408 and 429) is final; anything else is retried."""
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json", "User-Agent": "pscluster"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read(65536)
    except urllib.error.HTTPError as exc:
        raise DeliveryError(f"HTTP {exc.code}", retry=exc.code >= 500 or exc.code in (408, 429)) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise DeliveryError(str(reason).replace(url, mask_url(url))) from None


STDERR_TAIL = 4096      # bytes of a --notify-cmd's stderr kept (the last ones), as --hosts-from keeps


def run_command(argv: Sequence[str], body: bytes, timeout: float) -> None:
    """Run ``argv`` with ``body`` on stdin; a non-zero exit or the timeout is a failed attempt.
    It runs in a process group of its own: past the timeout the whole group is stopped (a
    script's children too, e.g. the ``sendmail`` a ``mail`` left behind), not only its leader.
    Only the last :data:`STDERR_TAIL` bytes of its stderr are kept (all of it was: issue 42, L9)."""
    try:
        proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                start_new_session=True)
    except OSError as exc:
        raise DeliveryError(exc.strerror or str(exc), retry=False) from None
    try:
        tail = _stderr_tail(proc, body, time.monotonic() + timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)     # its leader is not reaped yet: the group is its own
        raise DeliveryError(f"did not finish within {timeout:g} s") from None
    finally:
        for stream in (proc.stdin, proc.stderr):
            if stream is not None:
                stream.close()
    if proc.returncode != 0:
        last = tail.decode(errors="replace").strip().splitlines()[-1:] or [""]
        raise DeliveryError(f"exit code {proc.returncode}" + (f": {last[0][:200]}" if last[0] else ""))


def _stderr_tail(proc: subprocess.Popen, body: bytes, deadline: float) -> bytes:
    """Feed ``body`` (a thread: a command that does not read it must not block us), read stderr
    keeping its tail, until the command has exited and its stderr ended (or a child of it holds
    stderr open: then what is there once the leader exited).

    Raises:
        subprocess.TimeoutExpired: past ``deadline``; the leader is left unreaped.
    """
    def feed() -> None:
        try:
            assert proc.stdin is not None
            proc.stdin.write(body)
            proc.stdin.close()
        except (BrokenPipeError, OSError, ValueError):
            pass

    threading.Thread(target=feed, daemon=True).start()
    assert proc.stderr is not None
    fd = proc.stderr.fileno()
    tail = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise subprocess.TimeoutExpired(proc.args, 0)
        ready, _, _ = select.select([fd], [], [], min(left, 0.1))
        if ready:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            tail = (tail + chunk)[-STDERR_TAIL:]
        elif proc.poll() is not None:
            break
    left = deadline - time.monotonic()
    if left <= 0:
        raise subprocess.TimeoutExpired(proc.args, 0)
    proc.wait(timeout=left)
    return tail


def deliver(target: Target, body: bytes, *, timeout: float = DELIVERY_TIMEOUT,
            delays: Sequence[float] = RETRY_DELAYS, sleep: Callable[[float], None] = time.sleep,
            post: Callable[[str, bytes, float], None] = post_json,
            command: Callable[[Sequence[str], bytes, float], None] = run_command) -> str | None:
    """Send one document to ``target``: 1 + len(delays) attempts at most. Returns None when
    delivered, else why the last attempt failed."""
    why = None
    for attempt in range(1 + len(delays)):
        if attempt:
            sleep(delays[attempt - 1])
        try:
            if target.url is not None:
                post(target.url, body, timeout)
            else:
                command(target.argv, body, timeout)
            return None
        except DeliveryError as exc:
            why = str(exc)
            if not exc.retry:
                break
    return why


@dataclass
class _Channel:
    """One target's queue and worker thread."""

    target: Target
    queue: "queue.Queue[bytes | None]" = field(default_factory=queue.Queue)
    thread: threading.Thread | None = None
    failed: int = 0
    warned: bool = False


class Notifier(Reporter):
    """Delivers ``job-state`` events to every target in the background (see the module docstring).

    Warnings (a target that failed) go to ``warn`` on the thread that emits the next event or
    closes the notifier, never from a delivery thread: the console is the main thread's.
    """

    def __init__(self, targets: Sequence[Target], *, warn: Callable[[str], None],
                 send: Callable[[Target, bytes], str | None] = deliver, flush_seconds: float = FLUSH_SECONDS):
        self.targets = tuple(targets)
        self.warn = warn
        self.send = send
        self.flush_seconds = flush_seconds
        self.sent: list[dict] = []           # every document handed to the targets, in order
        self._channels = [_Channel(target) for target in self.targets]
        self._lock = threading.Lock()
        self._pending_warnings: list[str] = []
        for channel in self._channels:
            channel.thread = threading.Thread(target=self._work, args=(channel,), daemon=True,
                                              name=f"notify {channel.target.shown}")
            channel.thread.start()

    def handle(self, kind: str, **data: Any) -> None:
        if threading.current_thread() is threading.main_thread():    # launches emit from a thread pool
            self._flush_warnings()
        if kind != "job-state" or not self._channels:
            return
        document = event_document(cluster=data["cluster"], job=data["job"], event=data["event"], time=data["time"],
                                  report=data["report"])
        self.sent.append(document)
        body = json.dumps(document, default=str).encode()
        for channel in self._channels:
            channel.queue.put(body)

    def _work(self, channel: _Channel) -> None:
        while True:
            body = channel.queue.get()
            try:
                if body is None:
                    return
                why = self.send(channel.target, body)
                if why is not None:
                    with self._lock:
                        channel.failed += 1
                        if not channel.warned:
                            channel.warned = True
                            self._pending_warnings.append(
                                f"notification to {channel.target.shown} failed: {why} (further failures of this "
                                "target are counted, not shown; training is not affected)")
            finally:
                channel.queue.task_done()

    def _flush_warnings(self) -> None:
        with self._lock:
            pending, self._pending_warnings = self._pending_warnings, []
        for text in pending:
            self.warn(text)

    def close(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        """Wait up to ``flush_seconds`` in all for the queued events, then stop waiting (the
        delivery threads are daemons: a hung endpoint cannot keep pscluster alive)."""
        for channel in self._channels:
            channel.queue.put(None)
        deadline = clock() + self.flush_seconds
        late = []
        for channel in self._channels:
            if channel.thread is not None:
                channel.thread.join(max(0.0, deadline - clock()))
                if channel.thread.is_alive():
                    late.append(channel.target.shown)
        self._flush_warnings()
        if late:
            self.warn(f"gave up waiting for notifications to {', '.join(late)} after {self.flush_seconds:g} s")
        for channel in self._channels:
            if channel.failed > 1:
                self.warn(f"{channel.failed} notifications to {channel.target.shown} failed")
        self._channels = []
