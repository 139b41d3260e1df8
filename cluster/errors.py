"""Error types of pscluster.

Every error the user can cause or meet derives from :class:`PsclusterError`. Each carries what
is needed to act on it (file and line, host, task, exit code, log tail) and renders it in
``__str__``, leading with the root cause. Only the CLI turns errors into exit codes (contracts.ExitStatus).
"""
from __future__ import annotations

import re

from dataclasses import dataclass
from typing import Sequence

from .contracts import ExitStatus


class PsclusterError(Exception):
    """Root of all pscluster errors. ``hint`` says what to do about it."""

    exit_code: int = ExitStatus.FAILURE

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        text = self.message
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text

    def __reduce__(self):
        # Subclasses take other constructor arguments than ``args`` holds, so pickle rebuilds
        # from the attributes: an error crosses from a helper process (transport/spread.py) whole.
        return _rebuilt, (type(self), self.args, dict(self.__dict__))


def _rebuilt(kind: type[PsclusterError], args: tuple, attributes: dict) -> PsclusterError:
    error = kind.__new__(kind)
    Exception.__init__(error, *args)
    error.__dict__.update(attributes)
    return error


class UsageError(PsclusterError):
    """A command-line request that cannot be honoured (unknown cluster, bad task name)."""

    exit_code = ExitStatus.BAD_INPUT


class InventoryError(PsclusterError):
    """An inventory that cannot be used. Names file, line and key path, e.g.

    ``lab.yaml:14: worker.hosts.node-b.worker_gpus[1]: expected a GPU index or a list of them, got "one"``
    """

    exit_code = ExitStatus.BAD_INPUT

    def __init__(self, file: str, line: int | None, key_path: str, message: str,
                 *, hint: str | None = None):
        self.file = file
        self.line = line
        self.key_path = key_path
        where = f"{file}:{line}" if line else file
        prefix = f"{where}: {key_path}: " if key_path else f"{where}: "
        super().__init__(prefix + message, hint=hint)


class PlanError(PsclusterError):
    """The inventory is valid YAML but describes a cluster that cannot run."""

    exit_code = ExitStatus.BAD_INPUT


class StateError(PsclusterError):
    """The cluster state on this machine is missing, locked or unreadable."""


class UntrustedStateError(StateError):
    """A state folder or file another user owns or can write to (issue 42, L1): bad input, exit 2."""

    exit_code = ExitStatus.BAD_INPUT


class Aborted(PsclusterError):
    """Another command (``down``) took the cluster over while this one was working."""


def tail_text(text: str, lines: int = 12) -> str:
    """The last ``lines`` non-empty lines of ``text``, for error messages."""
    kept = [line for line in text.splitlines() if line.strip()]
    return "\n".join(kept[-lines:])


_TRACEBACK = "Traceback (most recent call last):"
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)\b")


def failure_tail(text: str, lines: int = 12, *, frames: int = 6, after: int = 3) -> tuple[str, bool]:
    """What a failed task's log says about why, for error messages: from its last traceback
    (its last ``frames`` lines before the exception, the exception and ``after`` lines after
    it), or from its last ``...Error``/``...Exception`` line (with the line before it); else its
    last ``lines`` lines. A log that ends in pages of output after the exception (a printed
    array) still shows it. Returns (the excerpt, whether a failure was found)."""
    kept = [line for line in text.splitlines() if line.strip()]
    starts = [i for i, line in enumerate(kept) if line.strip() == _TRACEBACK]
    if not starts:
        errors = [i for i, line in enumerate(kept) if _EXCEPTION_LINE.match(line.strip())]
        if not errors:
            return "\n".join(kept[-lines:]), False
        first = max(0, errors[-1] - 1)
        rest = len(kept) - errors[-1] - 1 - after
        return "\n".join(kept[first:errors[-1] + 1 + after] + ([f"... ({rest} more line(s))"] if rest > 0 else [])), True
    block = kept[starts[-1]:]
    exception = next((i for i, line in enumerate(block[1:], 1) if not line[:1].isspace()), len(block) - 1)
    body = block[1:exception]
    shown = [block[0]] + (["  ..."] + body[-frames:] if len(body) > frames else body)
    shown += block[exception:exception + 1 + after]
    rest = len(block) - exception - 1 - after
    return "\n".join(shown + ([f"... ({rest} more line(s))"] if rest > 0 else [])), True


_LEGACY_KERAS = ("run the program with legacy Keras: 'pscluster run --keras legacy ...' or pscluster_keras: legacy "
                 "in the inventory (it needs tf-keras of the hosts' TensorFlow version, e.g. pip install "
                 "'pscluster[legacy-keras]'; preflight checks it)")

# Failures whose cause is known from what a task's log says, and what to do about each:
# (a pattern of the log, the hint). The first that matches gives the root cause's hint.
KNOWN_FAILURES: tuple[tuple[re.Pattern[str], str], ...] = (
    # Keras 3 `model.fit` under MultiWorkerMirroredStrategy in TensorFlow 2.21 (keras-team/keras#20585);
    # tf-keras' fit trains the same program unchanged.
    (re.compile(r"Attempt to convert a value \(PerReplica:|unsupported type \(<class "
                r"'tensorflow\.python\.distribute\.values\.PerReplica'>\)"),
     "Keras 3's fit does not work under TensorFlow's multi-worker strategies (keras-team/keras#20585); "
     + _LEGACY_KERAS),
    # tf.keras names Keras 3 removed that TensorFlow's distributed tutorials use, as TF 2.21 with
    # Keras 3.15 says them (checked): tf.keras.utils.experimental.DatasetCreator ("module
    # 'keras.utils' has no attribute 'experimental'"), tf.keras.layers.experimental.preprocessing
    # (module 'keras._tf_keras.keras.layers'), tf.keras.utils.SidecarEvaluator,
    # tf.keras.optimizers.experimental / .legacy, tf.keras.callbacks.experimental,
    # tf.keras.backend.get_session, and `from tensorflow.keras.X.experimental import ...`.
    (re.compile(r"AttributeError: module 'keras(?:\.[\w.]+)?' has no attribute '\w+'|"
                r"ModuleNotFoundError: No module named 'tensorflow\.keras\.[\w.]+'|"
                r"`keras\.[\w.]+` is not supported in Keras 3"),
     "a Keras 2 (tf.keras) name that Keras 3 removed, such as tf.keras.utils.experimental.DatasetCreator "
     "(model.fit under ParameterServerStrategy), tf.keras.layers.experimental.preprocessing, "
     "tf.keras.utils.SidecarEvaluator or tf.keras.optimizers.legacy; the program runs unchanged with Keras 2: "
     + _LEGACY_KERAS),
)


def known_failure_hint(log: str) -> str | None:
    """The hint for a failure :data:`KNOWN_FAILURES` recognises in a task's log, else None."""
    return next((hint for pattern, hint in KNOWN_FAILURES if pattern.search(log)), None)


class HostError(PsclusterError):
    """A command on a host failed or the host could not be reached."""

    def __init__(self, host: str, message: str, *, argv: Sequence[str] | None = None,
                 exit_code: int | None = None, stderr: str = "", hint: str | None = None):
        self.host = host
        self.argv = list(argv) if argv else None
        self.remote_exit_code = exit_code
        self.stderr = stderr
        text = f"{host}: {message}"
        if exit_code is not None:
            text += f" (exit code {exit_code})"
        if stderr.strip():
            text += "\n    " + tail_text(stderr, 8).replace("\n", "\n    ")
        super().__init__(text, hint=hint)


class UnreachableHostError(HostError):
    """SSH could not connect to the host (refused, timed out, authentication, host key)."""


class HostEndedError(HostError):
    """The host is gone with everything pscluster started there, and will not answer again:
    the Slurm job its tasks were steps of has ended (``whole_job``: every host of the job with
    it), or the node left the job's allocation (``--no-kill``: Slurm took a failed node out).
    Slurm ends what ran there; nothing is left for pscluster to stop, and waiting is pointless."""

    def __init__(self, host: str, message: str, *, whole_job: bool, hint: str | None = None):
        super().__init__(host, message, hint=hint)
        self.whole_job = whole_job


class TaskError(PsclusterError):
    """A task (one TF process) failed: exited, never became ready, or was lost."""

    def __init__(self, task: str, host: str, message: str, *, exit_code: int | None = None,
                 log_tail: str = "", log_path: str | None = None, hint: str | None = None):
        self.task = task
        self.host = host
        self.task_exit_code = exit_code
        self.log_tail = log_tail
        self.log_path = log_path
        text = f"{task}@{host}: {message}"
        if exit_code is not None and f"code {exit_code}" not in message:
            text += f" (exit code {exit_code})"
        if log_tail.strip():
            where = f" ({log_path})" if log_path else ""
            excerpt, at_failure = failure_tail(log_tail, 12)
            text += (f"\n  its log{where}, at the failure:" if at_failure else
                     f"\n  last lines of its log{where}:") + "\n    " + excerpt.replace("\n", "\n    ")
        super().__init__(text, hint=hint or known_failure_hint(log_tail))


@dataclass(frozen=True)
class Failure:
    """One failure among several, for multi-host operations."""

    where: str
    error: PsclusterError


class MultiHostError(PsclusterError):
    """Several hosts or tasks failed. Leads with the root cause (the first observed failure)."""

    def __init__(self, summary: str, failures: Sequence[Failure], *, hint: str | None = None):
        self.failures = list(failures)
        root = self.failures[0].error if self.failures else None
        lines = [summary]
        if root is not None:
            # The root cause's hint becomes this error's hint (printed once, last).
            lines.append(f"Root cause (first observed failure): {root.message if hint is None else root}")
        for other in self.failures[1:]:
            lines.append(f"Also: {other.error}")
        super().__init__("\n".join(lines), hint=hint or (root.hint if root else None))

    @property
    def root_cause(self) -> PsclusterError | None:
        return self.failures[0].error if self.failures else None


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP reached the command (a CI timeout, a service manager, a closed
    terminal). A :class:`KeyboardInterrupt`, so every Ctrl-C path (rollback of ``up``, stopping
    a job's processes, ``run``'s take-down) runs for it too; the CLI exits with 128 + signal."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    def __str__(self) -> str:
        import signal
        return f"terminated by {signal.Signals(self.signum).name}"
