"""The seam between pscluster and hosts.

A :class:`Transport` runs argv lists on one host (with optional stdin) and copies files there.
The launcher, preflight, code sync and supervisor speak only to this interface; the local
implementation uses subprocess, the SSH one Fabric/paramiko. Higher-level host operations
(start a task, stop groups, read logs) are in :mod:`cluster.hostops`, built on ``run``.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Sequence

from ..errors import HostError
from ..plan import HostSpec


@dataclass(frozen=True)
class CommandResult:
    """Outcome of one command on one host."""

    host: str
    argv: tuple[str, ...]
    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def check(self, what: str) -> "CommandResult":
        """Raise :class:`HostError` (with stderr) unless the command succeeded."""
        if not self.ok:
            raise HostError(self.host, f"{what} failed", argv=self.argv, exit_code=self.exit_code,
                            stderr=self.stderr or self.stdout)
        return self


class Transport(abc.ABC):
    """Runs commands and copies files on one host."""

    def __init__(self, host: HostSpec):
        self.host = host

    @abc.abstractmethod
    def run(self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float = 60.0) -> CommandResult:
        """Run ``argv`` on the host (no shell semantics beyond one shlex-quoted command line).

        Raises:
            UnreachableHostError: the host cannot be reached.
            HostError: the command did not finish within ``timeout``.
        """

    @abc.abstractmethod
    def put_files(self, files: Sequence[tuple[str, str]], *, mode: int | None = None) -> None:
        """Copy local files to remote paths atomically (write a temporary, then rename)."""

    def connect(self) -> None:
        """Open the connection now (so preflight can time and report it)."""

    def close(self) -> None:
        """Release the connection; the transport may be used again (it reconnects)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.host.name})"
