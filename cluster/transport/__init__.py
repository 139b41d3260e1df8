"""Transports to hosts: :class:`LocalTransport` (subprocess), ``SSHTransport`` (Fabric),
``SlurmTransport`` (job steps) and ``DockerTransport`` (docker exec)."""
from __future__ import annotations

import threading
from typing import Callable, Sequence

from ..plan import HostSpec
from .base import CommandResult, Transport
from .local import LocalTransport

__all__ = ["CommandResult", "Transport", "LocalTransport", "TransportPool", "open_transport"]


def open_transport(host: HostSpec) -> Transport:
    """The transport for a host (not connected yet)."""
    if host.is_local:
        return LocalTransport(host)
    if host.connection == "slurm":
        from .slurm import SlurmTransport   # steps of $SLURM_JOB_ID (srun), see transport/slurm.py
        return SlurmTransport(host)
    if host.connection == "docker":
        from .docker import DockerTransport   # docker exec into a container, see transport/docker.py
        return DockerTransport(host)
    from .ssh import SSHTransport   # Fabric and paramiko load only when a host needs SSH
    return SSHTransport(host)


class TransportPool:
    """One transport per host for the length of a command, so connections are reused.

    :meth:`spread` puts the SSH connections of many hosts in helper processes (transport/spread.py)."""

    def __init__(self, factory: Callable[[HostSpec], Transport] = open_transport) -> None:
        self._factory = factory
        self._transports: dict[str, Transport] = {}
        self._lock = threading.Lock()
        self._helpers: list = []            # spread.Helper
        self._helper_of: dict[str, object] = {}

    def spread(self, hosts: Sequence[HostSpec], *, helpers: int | None = None) -> int:
        """Before a command talks to ``hosts``: hold the connections of their SSH hosts that have
        none yet in helper processes, when there are many (``spread.helpers_for``; ``helpers``: so
        many instead). Returns how many helpers this pool has.

        Raises:
            UsageError: a bad ``PSCLUSTER_CONTROL_PROCESSES``.
        """
        from . import spread
        with self._lock:
            fresh = [host for host in hosts if host.connection == "ssh" and self._factory is open_transport
                     and host.name not in self._transports and host.name not in self._helper_of]
            count = helpers if helpers is not None else spread.helpers_for(len(fresh))
            if not fresh or count <= 0:
                return len(self._helpers)
            while len(self._helpers) < count:
                self._helpers.append(spread.Helper(len(self._helpers)))
            for index, host in enumerate(fresh):
                self._helper_of[host.name] = self._helpers[index % count]
            return len(self._helpers)

    def get(self, host: HostSpec) -> Transport:
        with self._lock:
            if host.name not in self._transports:
                helper = self._helper_of.get(host.name)
                if helper is not None:
                    from .spread import SpreadTransport
                    self._transports[host.name] = SpreadTransport(host, helper)     # type: ignore[arg-type]
                else:
                    self._transports[host.name] = self._factory(host)
            return self._transports[host.name]

    def helper_pids(self) -> list[int]:
        """The helper processes' PIDs (benchmarks read their CPU)."""
        return [helper.process.pid for helper in self._helpers]

    def close(self) -> None:
        with self._lock:
            transports, self._transports = list(self._transports.values()), {}
            helpers, self._helpers = self._helpers, []
            spread_here, self._helper_of = set(self._helper_of), {}
        for transport in transports:
            if transport.host.name not in spread_here:
                transport.close()
        for helper in helpers:       # each closes its own hosts' connections as it ends, all at once
            helper.end()
        for helper in helpers:
            helper.close()

    def __enter__(self) -> "TransportPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
