"""Read-only views of the processes of a cluster, for tests and benchmarks: which survive, and in
which lab host (network namespace) they live. Used only to assert and measure, never to kill."""
from __future__ import annotations

import os
import subprocess


def cluster_pids(name: str) -> list[int]:
    """Live processes started for cluster ``name`` (read-only scan of /proc environments).

    Every task pscluster starts carries ``PSCLUSTER_CLUSTER=<name>``; the fake hosts share this
    machine's PID space, so this sees every host. Used only to assert, never to kill.
    """
    marker = f"PSCLUSTER_CLUSTER={name}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                environ = handle.read().split(b"\0")
            with open(f"/proc/{entry}/stat") as handle:
                state = handle.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in environ and state not in ("Z", "X"):
            found.append(int(entry))
    return found


def netns_of(pid: int) -> str | None:
    """The named network namespace a process lives in (``ip netns identify``)."""
    proc = subprocess.run(["ip", "netns", "identify", str(pid)], capture_output=True, text=True)
    return proc.stdout.strip() or None


def socket_inodes(pid: int | str = "self") -> set[str]:
    """The inodes of the sockets a process holds open (as /proc/<pid>/net/tcp names them)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes
