"""GPUs of a host from ``nvidia-smi`` output (pure parsing and rules; the query runs in preflight).

Two queries, both ``--format=csv,noheader,nounits`` (roles/hostctl.py runs them on the host):

* ``--query-gpu=index,uuid,memory.total,memory.used,name`` -> one line per GPU:
  ``0, GPU-xxxx, 81559, 312, NVIDIA H100 80GB HBM3`` (the name last: it is the one free-text field)
* ``--query-compute-apps=gpu_uuid,pid,used_memory``         -> one line per process using a GPU

What current drivers print besides plain numbers (580.x): ``[N/A]`` for the memory of a GPU
without its own framebuffer (GB10's unified memory reports every memory field so) and for a
process's memory under MIG, ``[Not Supported]``, ``[Unknown Error]`` or ``[GPU requires reset]``
for a GPU in trouble; a bracketed value is "not reported", never a parse error. MIG instances
add lines to ``-L`` only (indented ``  MIG 1g.10gb Device 0: ...``, not counted as GPUs), not
to ``--query-gpu``.

``worker_gpus: auto`` becomes one task per listed GPU. A GPU is busy when a process uses it or
its used memory exceeds the host's ``pscluster_gpu_busy_mib`` (default 1024): lab GPUs are shared.
A GPU whose used memory is not reported is busy only when a process is listed on it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from ..errors import InventoryError
from ..inventory import Inventory

GPU_FIELDS = ("index", "uuid", "memory.total", "memory.used", "name")
APP_FIELDS = ("gpu_uuid", "pid", "used_memory")
QUERY_GPUS = ("nvidia-smi", "--query-gpu=" + ",".join(GPU_FIELDS), "--format=csv,noheader,nounits")
QUERY_APPS = ("nvidia-smi", "--query-compute-apps=" + ",".join(APP_FIELDS), "--format=csv,noheader,nounits")
# Lines some drivers print instead of (or before) the rows; nothing to read in them.
NOT_ROWS = ("No running processes found", "No devices were found")


class GpuQueryError(ValueError):
    """nvidia-smi printed something this module cannot read; the message names the host."""


@dataclass(frozen=True)
class GpuApp:
    pid: int
    used_mib: int | None           # None: not reported (MIG, some drivers)
    user: str | None = None        # filled in on the host from /proc, when known


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    used_mib: int | None           # None: not reported ([N/A] on unified-memory GPUs such as GB10)
    apps: tuple[GpuApp, ...] = ()
    name: str = ""
    total_mib: int | None = None

    def busy(self, threshold_mib: int) -> bool:
        return bool(self.apps) or (self.used_mib is not None and self.used_mib > threshold_mib)

    def describe(self) -> str:
        users = ", ".join(f"{app.user or '?'}/pid {app.pid}" for app in self.apps)
        used = "memory use not reported" if self.used_mib is None else f"{self.used_mib} MiB used"
        return f"GPU {self.index}: {used}" + (f" by {users}" if users else "")


def _rows(host: str, text: str, columns: int, what: str) -> list[list[str]]:
    """The cells of each row; the last column keeps any commas (a GPU's name may hold one)."""
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.strip().startswith(NOT_ROWS):
            continue
        cells = [cell.strip() for cell in line.split(",", columns - 1)]
        if len(cells) != columns:
            raise GpuQueryError(f"{host}: nvidia-smi {what} line {number} has {len(cells)} field(s), "
                                f"expected {columns}: {line.strip()!r}")
        rows.append(cells)
    return rows


def _int(host: str, value: str, what: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise GpuQueryError(f"{host}: nvidia-smi gave {value!r} for {what}, expected a number") from None


def _mib(host: str, value: str, what: str) -> int | None:
    """MiB, or None where the driver does not report it (``[N/A]``, ``[Not Supported]``, ...)."""
    if (value.startswith("[") and value.endswith("]")) or value in ("N/A", "Not Supported"):
        return None
    if value.endswith("MiB"):           # the same query without nounits
        value = value[:-3].strip()
    return _int(host, value, what)


def parse(host: str, gpus_csv: str, apps_csv: str, users: dict[int, str] | None = None) -> tuple[Gpu, ...]:
    """The host's GPUs with the processes using each, from the two queries' outputs.

    Raises:
        GpuQueryError: malformed output (names the host and the line).
    """
    users = users or {}
    apps: dict[str, list[GpuApp]] = {}
    for uuid, pid, used in _rows(host, apps_csv, len(APP_FIELDS), "--query-compute-apps"):
        pid_number = _int(host, pid, "a pid")
        apps.setdefault(uuid, []).append(GpuApp(pid_number, _mib(host, used, "used_memory"), users.get(pid_number)))
    found = []
    for index, uuid, total, used, name in _rows(host, gpus_csv, len(GPU_FIELDS), "--query-gpu"):
        found.append(Gpu(_int(host, index, "index"), uuid, _mib(host, used, "memory.used"),
                         tuple(apps.get(uuid, ())), name=name, total_mib=_mib(host, total, "memory.total")))
    return tuple(sorted(found, key=lambda gpu: gpu.index))


def busy_gpus(gpus: tuple[Gpu, ...], threshold_mib: int) -> tuple[Gpu, ...]:
    return tuple(gpu for gpu in gpus if gpu.busy(threshold_mib))


def busy_message(host: str, busy: tuple[Gpu, ...]) -> str:
    """The error for busy GPUs: host, GPU index, and who uses them."""
    return f"{host}: GPU(s) already in use: " + "; ".join(gpu.describe() for gpu in busy)


def from_query(host: str, query: Mapping[str, Any] | None) -> tuple[Gpu, ...] | None:
    """The GPUs hostctl's ``facts`` reported (None: not asked, or no GPU listed).

    Raises:
        GpuQueryError: nvidia-smi failed or printed something unreadable (names the host).
    """
    if not query:
        return None
    if query.get("error"):
        raise GpuQueryError(f"{host}: {query['error']}")
    users = {int(pid): user for pid, user in (query.get("users") or {}).items() if str(pid).isdigit()}
    return parse(host, query.get("gpus") or "", query.get("apps") or "", users)


def resolve_auto(inventory: Inventory, counts: Mapping[str, int]) -> Inventory:
    """``<role>_gpus: auto`` made concrete: one task per GPU that the host lists, GPU i alone
    for task i (``counts``: GPUs per host, as nvidia-smi listed them at preflight).

    Raises:
        InventoryError: a host with ``auto`` lists no GPU (names the file, line and key).
    """
    hosts = []
    for host in inventory.hosts:
        slots = []
        for slot in host.slots:
            if slot.auto_gpus:
                found = counts.get(host.name, 0)
                if found == 0:
                    raise InventoryError(slot.origin.file, slot.origin.line, slot.origin.key_path,
                                         f"{slot.role}_gpus: auto, but nvidia-smi lists no GPU on {host.name}",
                                         hint=f"list masks for {host.name} ({slot.role}_gpus: [[]] for one CPU task), "
                                              "or leave it out with --limit")
                slot = replace(slot, count=found, gpus=tuple(str(index) for index in range(found)), auto_gpus=False)
            slots.append(slot)
        hosts.append(replace(host, slots=tuple(slots)))
    return replace(inventory, hosts=tuple(hosts))
