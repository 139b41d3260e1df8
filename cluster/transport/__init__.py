"""Transports to hosts: :class:`LocalTransport` (subprocess), ``SSHTransport`` (Fabric),
``SlurmTransport`` (job steps) and ``DockerTransport`` (docker exec)."""
from __future__ import annotations

import threading
from typing import Callable

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
    """One transport per host for the length of a command, so connections are reused."""

    def __init__(self, factory: Callable[[HostSpec], Transport] = open_transport) -> None:
        self._factory = factory
        self._transports: dict[str, Transport] = {}
        self._lock = threading.Lock()

    def get(self, host: HostSpec) -> Transport:
        with self._lock:
            if host.name not in self._transports:
                self._transports[host.name] = self._factory(host)
            return self._transports[host.name]

    def close(self) -> None:
        with self._lock:
            for transport in self._transports.values():
                transport.close()
            self._transports.clear()

    def __enter__(self) -> "TransportPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
