"""Code sync: put ``roles/`` and ``examples/`` (and a user's job) into each host's workdir.

Only files whose sha256 differs from the host's copy travel (SFTP over the host's existing SSH
connection, or a local copy), each written to a temporary name and renamed into place. At
many hosts most hosts fetch them from hosts already synced instead (cluster/hosts/relay.py). A host
whose ``pscluster_workdir`` is this machine's checkout is assumed to see it already (a shared
filesystem, or this machine itself) and is skipped.
"""
from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from . import hostops, relay
from ..errors import HostError, MultiHostError
from ..events import Reporter
from ..fanout import fan_out
from ..layout import RUN_ROOT
from ..plan import DEFAULT_REMOTE_WORKDIR, ClusterPlan, HostSpec
from ..transport import TransportPool

if TYPE_CHECKING:
    from ..state import RunState, StateWriter

SYNC_DIRS = ("roles", "examples")
_SKIP_DIRS = {"__pycache__", RUN_ROOT, ".git", ".pytest_cache"}
_SKIP_SUFFIXES = (".pyc", ".pyo", ".log")


@dataclass(frozen=True)
class LocalFile:
    rel: str          # path relative to the destination root, with "/" separators
    path: str         # absolute local path
    sha256: str
    size: int
    mode: int | None = None   # None: the transport's 0755/0644; a private file's 0600/0700 (run's files)


def project_root() -> Path:
    """This installation's root: the folder holding ``roles/`` and ``examples/``.

    In a checkout (also an editable install) that is the checkout. A wheel installs
    ``cluster/`` and ``roles/`` as packages and ships ``roles/`` and ``examples/`` again
    under ``<prefix>/share/pscluster`` (setup.cfg's data_files): that folder is the root.
    """
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "examples").is_dir():
        return checkout
    shipped = Path(sys.prefix) / "share" / "pscluster"
    return shipped if (shipped / "roles").is_dir() else checkout


def local_workdir() -> str:
    """Where tasks on this machine run by default: the checkout itself (nothing to sync), or,
    for an installed wheel, the same ``~/pscluster`` as on other hosts (the installation's
    own folder may be read-only, and run folders and checkpoints do not belong there)."""
    root = project_root()
    return str(root) if root == Path(__file__).resolve().parents[2] else DEFAULT_REMOTE_WORKDIR


def _digest(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def private_mode(path: str) -> int | None:
    """0600 (0700 if executable) for a file without group or other bits here, else None: a file
    kept private on this machine stays private on the hosts (issue 42, M1)."""
    bits = os.stat(path).st_mode
    if bits & 0o077:
        return None
    return 0o700 if bits & 0o100 else 0o600


def collect(root: Path, entries: tuple[str, ...], *, prefix: str = "", keep_private: bool = False) -> list[LocalFile]:
    """Files under ``root/entry`` for each entry (a folder or a file), skipping caches; with
    ``keep_private``, a private file here gets :func:`private_mode` there (``run``'s files; the
    installation's ``roles/`` stay readable to a task user whatever this machine's umask)."""
    files = []
    for entry in entries:
        base = root / entry
        if base.is_file():
            files.append(LocalFile(prefix + entry, str(base), _digest(str(base)), base.stat().st_size,
                                   private_mode(str(base)) if keep_private else None))
            continue
        for folder, dirs, names in os.walk(base):
            dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
            for name in sorted(names):
                if name.endswith(_SKIP_SUFFIXES):
                    continue
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                files.append(LocalFile(prefix + rel, path, _digest(path), os.path.getsize(path)))
    return files


def needs_sync(host: HostSpec, root: Path) -> bool:
    workdir = os.path.expanduser(host.workdir) if host.is_local else host.workdir
    return os.path.normpath(workdir) != os.path.normpath(str(root))


@dataclass(frozen=True)
class SyncResult:
    host: str
    sent: int
    bytes: int
    unchanged: int
    skipped: bool
    relayed_from: str | None = None     # the peer host it fetched from (cluster/hosts/relay.py)
    relay_error: str | None = None      # why a relay failed and this host was synced directly


def sync_files(plan: ClusterPlan, pool: TransportPool, reporter: Reporter, files: list[LocalFile],
               root: Path) -> list[SyncResult]:
    """Bring ``files`` up to date on every host that needs them, in parallel.

    Hosts whose workdirs are one folder on a shared filesystem (an NFS home, this lab's
    namespaces) are synced once: each host reports the folder's marker id (hostctl ``fsid``),
    and one host per (folder, id) copies; the others are reported as sharing its copy. Several
    hosts writing the same files at once made all but one fail with "No such file".

    Raises:
        MultiHostError: copying failed on some hosts (each named, with the cause).
    """
    targets: dict[tuple[str, str], HostSpec] = {}
    for host in plan.hosts:
        targets.setdefault((host.address, host.workdir), host)
    syncing = [host for host in targets.values() if needs_sync(host, root)]
    located = fan_out(syncing, lambda host: hostops.fsid(pool.get(host), host.workdir), name="sync locate",
                      catch=HostError)
    failures = located.failures
    writers: dict[tuple[str, str], HostSpec] = {}
    shared_with: dict[str, str] = {}
    destination: dict[str, str] = {}
    for host, where in located.succeeded:
        writer = writers.setdefault(where, host)
        destination[host.name] = where[0]
        if writer is not host:
            shared_with[host.name] = writer.name

    def one(host: HostSpec) -> SyncResult:
        workdir = destination[host.name]
        transport = pool.get(host)
        remote = hostops.hashes(transport, workdir, [f.rel for f in files])
        # A private file whose copy there is open to others travels again, same content or not.
        changed = [f for f in files if remote.hashes.get(f.rel) != f.sha256 or (f.mode is not None and f.rel in remote.open)]
        for mode in sorted({f.mode for f in changed}, key=lambda m: m or 0):
            transport.put_files([(f.path, f"{workdir.rstrip('/')}/{f.rel}") for f in changed if f.mode == mode],
                                root=workdir, mode=mode)
        return SyncResult(host.name, len(changed), sum(f.size for f in changed), len(files) - len(changed), False)

    if relay.use_relay(list(writers.values())):
        copied = relay.RelaySync(plan, pool, files, destination, one).run(list(writers.values()))
    else:
        copied = fan_out(list(writers.values()), one, name="sync copy", catch=HostError)
    failures += copied.failures
    by_name = copied.ok
    results = []
    for host in targets.values():
        if host.name in by_name:
            result = by_name[host.name]
        elif not needs_sync(host, root):
            result = SyncResult(host.name, 0, 0, len(files), True)
        elif shared_with.get(host.name) in by_name:
            result = SyncResult(host.name, 0, 0, len(files), True)
        else:
            continue
        results.append(result)
        reporter.emit("sync", host=host.name, files=result.sent, bytes=result.bytes,
                      unchanged=result.unchanged, skipped=result.skipped, shared_with=shared_with.get(host.name),
                      relayed_from=result.relayed_from, relay_error=result.relay_error)
    if failures:
        raise MultiHostError(f"code sync failed on {len(failures)} host(s)", failures)
    return results


def code_files(root: Path | None = None) -> list[LocalFile]:
    """What :func:`sync_code` sends: ``roles/`` and ``examples/`` of this installation."""
    return collect(root or project_root(), SYNC_DIRS)


def manifest_digest(files: list[LocalFile]) -> str:
    """One sha256 over the files' paths, contents and modes: equal digests, equal trees."""
    digest = hashlib.sha256()
    for file in sorted(files, key=lambda f: f.rel):
        digest.update(f"{file.rel}\0{file.sha256}\0{file.mode}\n".encode())
    return digest.hexdigest()


def sync_code(plan: ClusterPlan, pool: TransportPool, reporter: Reporter, root: Path | None = None,
              files: list[LocalFile] | None = None) -> list[SyncResult]:
    """Sync ``roles/`` and ``examples/`` of this installation (``files``: :func:`code_files`,
    read already) to the hosts."""
    root = root or project_root()
    reporter.emit("phase", name="sync", detail="roles/ and examples/")
    return sync_files(plan, pool, reporter, files if files is not None else code_files(root), root)


def record_sync(state: "RunState", results: list[SyncResult], digest: str) -> None:
    """What a code sync put where, in the cluster's state: the hosts that have ``digest``'s
    tree (another tree's hosts are forgotten: they need a sync again)."""
    if state.code_digest != digest:
        state.synced = {}
    state.synced.update({r.host: "synced" if not r.skipped else "shared" for r in results})
    state.code_digest = digest


def sync_and_record(writer: "StateWriter", plan: ClusterPlan, pool: TransportPool, reporter: Reporter,
                    root: Path | None = None) -> list[SyncResult]:
    """:func:`sync_code` to every host of ``plan``, recorded in the cluster's state (``up``, a job's start)."""
    files = code_files(root)
    results = sync_code(plan, pool, reporter, root, files)
    writer.change(lambda s: record_sync(s, results, manifest_digest(files)))
    return results


def sync_new_hosts(writer: "StateWriter", plan: ClusterPlan, pool: TransportPool, reporter: Reporter,
                   root: Path | None = None) -> list[SyncResult]:
    """A resize's code sync: while this machine's code is the tree the state records as synced,
    only the hosts of ``plan`` that never got it (a scale by one host touched every host
    before: 0.01 CPU-s a host, 10 s at 1,000); a changed tree goes to every host as before."""
    files = code_files(root)
    digest = manifest_digest(files)
    state = writer.state
    fresh = (tuple(h for h in plan.hosts if h.name not in state.synced) if state.code_digest == digest
             else plan.hosts)
    if not fresh:
        reporter.emit("phase", name="sync", detail="roles/ and examples/: every host has them (unchanged)")
        return []
    results = sync_code(replace(plan, hosts=fresh), pool, reporter, root, files)
    writer.change(lambda s: record_sync(s, results, digest))
    return results
