"""Open files: what one control process needs for N hosts, checked before anything starts.

The control process holds about one descriptor per host it talks to (its SSH socket; a local
host's pipes instead) and a few dozen of its own: measured with ``python -m benchmarks.scale``,
67 at 64 hosts while a job is watched, 94 at the peak of ``up`` (docs/benchmarks.md, "Scale").
A soft limit of 1,024 (the usual default) then runs out near 1,000 hosts, in the middle of an
``up`` or a job. So before connecting, :func:`ensure_open_files` raises this process's soft limit
as far as needed when the hard limit allows (the supervisor it starts inherits it), and
otherwise refuses with the ``ulimit -n`` to set.
"""
from __future__ import annotations

import resource
from typing import Callable

from ..errors import UsageError

PER_HOST = 2          # the measured peak is ~1.4 a host (up at 64 hosts), with room for a reconnect
BASE = 64             # the process's own files, logs and pipes (19-27 measured at 4-16 hosts)


def open_files_needed(hosts: int) -> int:
    return BASE + PER_HOST * hosts


def ensure_open_files(hosts: int, *, limits: tuple[int, int] | None = None,
                      raise_to: Callable[[int, tuple[int, int]], None] = resource.setrlimit) -> int:
    """Makes sure this process may open the files ``hosts`` hosts need; returns the soft limit
    in force after.

    Args:
        limits: (soft, hard) as ``getrlimit`` gives them (tests pass their own).
        raise_to: ``setrlimit``, called only when the soft limit must grow.

    Raises:
        UsageError: the hard limit is below what is needed, naming both and the ``ulimit`` to set.
    """
    soft, hard = limits if limits is not None else resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = open_files_needed(hosts)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return soft
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise UsageError(
            f"{hosts} hosts need about {needed} open files in this process; its limit is {soft} "
            f"(hard limit {hard})",
            hint=f"raise it before running pscluster: ulimit -n {needed} (as root, or in "
                 "/etc/security/limits.conf: nofile), or run on fewer hosts")
    raise_to(resource.RLIMIT_NOFILE, (needed, hard))
    return needed
