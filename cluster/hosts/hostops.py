"""Host operations, built on :class:`~cluster.transport.Transport` and ``roles/hostctl.py``.

The host-side program travels with each call (compressed, on stdin, behind a one-line
``python -c`` bootstrap) followed by its request as JSON, so it works before any code is synced, and secret environment values never
appear on a command line. One call per host per operation: ``stop`` does the whole
TERM -> grace -> KILL -> verify sequence on the host itself.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import zlib
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..errors import HostError
from ..contracts import ProcessKind
from ..layout import fifo_file, gate_file, ready_file
from ..plan import TaskSpec
from ..state import ProcessRecord
from ..transport import Transport


@functools.lru_cache(maxsize=1)
def hostctl_source() -> str:
    """The host program's source (found without importing ``roles``)."""
    spec = importlib.util.find_spec("roles.hostctl")
    if spec is None or spec.origin is None:
        raise HostError("localhost", "roles/hostctl.py is missing from this installation")
    with open(spec.origin, encoding="utf-8") as handle:
        return handle.read()


@functools.lru_cache(maxsize=1)
def packed_source() -> bytes:
    return zlib.compress(hostctl_source().encode(), 9)


# Reads the compressed program from stdin (its size is argv[1]); the JSON request follows it.
# The interpreter runs with -I -S: no site-packages or environment hooks are needed by the host
# program, and skipping them cuts its start-up from ~50 ms to ~17 ms of CPU per call.
BOOTSTRAP = "import sys,zlib;exec(zlib.decompress(sys.stdin.buffer.read(int(sys.argv[1]))))"


def hostctl_argv(transport: Transport, operation: str, program: bytes) -> list[str]:
    """The command that runs hostctl's ``operation``: as the become user when the host has one
    (ansible_become: every host operation, so every task and the watch stream, runs as that user)."""
    argv = [transport.host.python, "-I", "-S", "-c", BOOTSTRAP, str(len(program)), operation]
    become = getattr(transport.host, "become_user", None)
    return ["sudo", "-n", "-H", "-u", become, *argv] if become else argv


def call(transport: Transport, operation: str, request: dict | bytes, *, timeout: float = 60.0) -> dict:
    """Run one hostctl operation on the transport's host and return its JSON answer
    (``request``: a JSON object, or its encoded text when the caller built it).

    Raises:
        HostError: the interpreter is missing, the program failed, or it reported an error.
        UnreachableHostError: the host cannot be reached.
    """
    python = transport.host.python
    program = packed_source()
    argv = hostctl_argv(transport, operation, program)
    body = request if isinstance(request, bytes) else json.dumps(request).encode()
    result = transport.run(argv, stdin=program + body, timeout=timeout)
    shown = [python, "-c", "<pscluster hostctl>", operation]
    if result.exit_code == 127 or "No such file or directory" in result.stderr and not result.stdout:
        raise HostError(transport.host.name, f"interpreter {python!r} not found", argv=shown,
                        exit_code=result.exit_code, stderr=result.stderr,
                        hint="set pscluster_python to the host's Python that has TensorFlow installed")
    if result.exit_code != 0:
        raise HostError(transport.host.name, f"host operation {operation!r} failed with {python}",
                        argv=shown, exit_code=result.exit_code, stderr=result.stderr or result.stdout)
    try:
        answer = json.loads(result.stdout)
    except ValueError:
        raise HostError(transport.host.name, f"host operation {operation!r} printed no JSON", argv=shown,
                        stderr=result.stdout + result.stderr) from None
    if isinstance(answer, dict) and answer.get("error") and operation not in ("start", "adopt"):
        raise HostError(transport.host.name, f"host operation {operation!r}: {answer['error']}", argv=shown)
    return answer


@dataclass(frozen=True)
class HostFacts:
    """What preflight learns about a host in one call."""

    host: str
    python: str
    executable: str
    hostname: str
    cpus: int
    tf_dist: str | None
    tf_version: str | None
    tf_importable: bool
    busy_ports: tuple[tuple[int, str], ...]
    gpus: tuple[str, ...] | None
    gpu_error: str | None
    workdir_error: str | None
    tools: tuple[tuple[str, bool], ...]
    uid: int
    ssh_client: str | None = None
    root: bool | None = None
    # nvidia-smi's per-GPU memory and compute-apps queries (CSV) and the user of each app's pid,
    # or {"error": ...}: parsed by cluster/hosts/gpus.py (None when GPUs were not asked for or none).
    gpu_query: Mapping[str, Any] | None = None
    # tf-keras (asked only for legacy Keras): its version and whether ``tf_keras`` imports; None
    # for the version when it is not installed or was not asked for.
    tf_keras_version: str | None = None
    tf_keras_importable: bool = False
    # Why the workdir is refused though writable: another user's, or writable by others (issue 42, L2).
    workdir_unsafe: str | None = None


def facts(transport: Transport, *, ports: Sequence[int], gpus: bool, workdir: str | None,
          tools: Sequence[str] = (), need_root: bool = False, tf_keras: bool = False,
          timeout: float = 30.0) -> HostFacts:
    answer = call(transport, "facts", {"ports": list(ports), "gpus": gpus, "workdir": workdir,
                                       "tools": list(tools), "need_root": need_root, "tf_keras": tf_keras},
                  timeout=timeout)
    tf = answer.get("tensorflow") or {}
    legacy = answer.get("tf_keras") or {}
    return HostFacts(
        host=transport.host.name, python=answer["python"], executable=answer["executable"],
        hostname=answer["hostname"], cpus=answer.get("cpus") or 0, tf_dist=tf.get("dist"),
        tf_version=tf.get("version"), tf_importable=bool(tf.get("importable")),
        busy_ports=tuple((item["port"], item["error"]) for item in answer.get("busy_ports", [])),
        gpus=tuple(answer["gpus"]) if answer.get("gpus") is not None else None,
        gpu_error=answer.get("gpu_error"), workdir_error=answer.get("workdir_error"),
        tools=tuple(sorted((answer.get("tools") or {}).items())), uid=answer.get("uid", -1),
        ssh_client=answer.get("ssh_client"), root=answer.get("root"), gpu_query=answer.get("gpu_query"),
        tf_keras_version=legacy.get("version"), tf_keras_importable=bool(legacy.get("importable")),
        workdir_unsafe=answer.get("workdir_unsafe"))


@dataclass(frozen=True)
class ProgramFacts:
    """What a host says about a ``run`` program before it starts (hostctl ``program``)."""

    missing: tuple[str, ...]                      # paths the command needs that are not there
    tools: tuple[tuple[str, bool], ...]           # program name -> found on the PATH
    modules: tuple[tuple[str, bool], ...]         # imported module -> resolves there
    modules_error: str | None = None              # the module check itself failed (its stderr)
    tf_dist: str | None = None                    # asked with tf_keras only
    tf_version: str | None = None
    tf_keras_version: str | None = None
    tf_keras_importable: bool = False


def program(transport: Transport, *, cwd: str, paths: Sequence[str] = (), tools: Sequence[str] = (),
            modules: Sequence[str] = (), script_dir: str = ".", pythonpath: str | None = None,
            tf_keras: bool = False, timeout: float = 90.0) -> ProgramFacts:
    """Check a program's needs on the host in one call (see :class:`ProgramFacts`)."""
    answer = call(transport, "program", {"cwd": cwd, "paths": list(paths), "tools": list(tools),
                                         "modules": list(modules), "script_dir": script_dir,
                                         "pythonpath": pythonpath, "tf_keras": tf_keras}, timeout=timeout)
    tf = answer.get("tensorflow") or {}
    legacy = answer.get("tf_keras") or {}
    return ProgramFacts(
        missing=tuple(answer.get("missing") or ()), tools=tuple(sorted((answer.get("tools") or {}).items())),
        modules=tuple((name, bool(ok)) for name, ok in (answer.get("modules") or {}).items()),
        modules_error=answer.get("modules_error"), tf_dist=tf.get("dist"), tf_version=tf.get("version"),
        tf_keras_version=legacy.get("version"), tf_keras_importable=bool(legacy.get("importable")))


def start(transport: Transport, task: TaskSpec, record: ProcessRecord, *, argv: Sequence[str],
          env: dict[str, str], timeout: float = 30.0) -> ProcessRecord:
    """Start one task detached on its host; returns the record with pid/pgid filled in.

    Raises:
        HostError: the process could not be started (e.g. its interpreter is missing).
    """
    result = start_many(transport, [(task, record, argv, env)], timeout=timeout)[0]
    if isinstance(result, HostError):
        raise result
    return result


def _start_request(task: TaskSpec, record: ProcessRecord, argv: Sequence[str], env: dict[str, str]) -> dict:
    # Files the process will write, removed before it starts: an earlier cluster or job of the
    # same name left its own (a standby's ready file would claim an import not yet done).
    # And a request to change in place (``tell``) left beside the events file, and a sync worker's
    # gate (a resize's successor would look ready before it is: roles/handover.py).
    fresh = [record.events, record.events + ".membership", gate_file(record.events)] if record.events else []
    if record.kind == ProcessKind.STANDBY:
        fresh.append(ready_file(record.log))
    return {"argv": list(argv), "env": env, "cwd": task.workdir, "log": record.log, "token": record.token,
            "fresh": fresh}


def _started(transport: Transport, task: TaskSpec, record: ProcessRecord, argv: Sequence[str],
             started: dict) -> ProcessRecord | HostError:
    """One start's answer from hostctl: the record with its pid filled in, or the error."""
    if started.get("cancelled"):
        return StartCancelled(transport.host.name, f"{task.name}: {started['error']}", argv=argv)
    if started.get("error"):
        return HostError(transport.host.name, f"{task.name}: {started['error']}", argv=argv,
                         hint="check pscluster_python and pscluster_workdir for this host")
    return ProcessRecord(**{**record.__dict__, "pid": started["pid"], "pgid": started["pgid"],
                            "starttime": started["starttime"],
                            "task_starttime": started["task_starttime"], "started": started["started"],
                            "log": started["log"], "exit_file": started["exit_file"]})


def start_many(transport: Transport, items: Sequence[tuple[TaskSpec, ProcessRecord, Sequence[str], dict[str, str]]],
               *, timeout: float = 30.0) -> list[ProcessRecord | HostError]:
    """Start several tasks on one host in one call; per task its record (pid filled) or error."""
    answer = call(transport, "start_many", {"tasks": [_start_request(task, record, argv, env)
                                                      for task, record, argv, env in items]}, timeout=timeout)
    return [_started(transport, task, record, argv, started)
            for (task, record, argv, _), started in zip(items, answer["started"])]


def adopt(transport: Transport, standby: ProcessRecord, task: TaskSpec, record: ProcessRecord, *,
          argv: Sequence[str], env: dict[str, str], timeout: float = 30.0) -> ProcessRecord | str:
    """Hand one start to ``standby`` (roles/standby.py: TensorFlow already imported there).

    Returns the record with the standby's process in it, or why the standby did not take it
    (nothing was started then: start the task as usual).

    Raises:
        HostError: the host could not be asked, or the start was cancelled by a ``stop``.
    """
    request = dict(_start_request(task, record, argv, env),
                   standby=dict(standby.to_hostctl(), fifo=fifo_file(standby.log)))
    answer = call(transport, "adopt", request, timeout=timeout)
    if "declined" in answer:
        return str(answer["declined"])
    result = _started(transport, task, record, argv, answer)
    if isinstance(result, HostError):
        raise result
    return result


class StartCancelled(HostError):
    """A ``stop`` (``down``) reached the host before this start: nothing was started."""


@dataclass(frozen=True)
class TaskStatus:
    key: str
    state: str                  # "running" | "frozen" (SIGSTOP) | "exited" | "gone"
    exit_code: int | None = None
    signal: int | None = None
    uptime: float | None = None
    never_started: bool = False
    listening: bool | None = None       # its port listens on its host (a watch asked with ports)

    def describe(self) -> str:
        if self.state == "exited":
            return f"exited with code {self.exit_code}" if self.signal is None else f"killed by signal {self.signal}"
        return self.state


def status(transport: Transport, records: Sequence[ProcessRecord], *, timeout: float = 20.0) -> dict[str, TaskStatus]:
    if not records:
        return {}
    return status_and_read(transport, records, (), timeout=timeout)[0]


def status_and_read(transport: Transport, records: Sequence[ProcessRecord], reads: Sequence[tuple[str, int]], *,
                    timeout: float = 20.0) -> tuple[dict[str, TaskStatus], list["FileChunk"]]:
    """Task states and new bytes of files (path, offset) in one round trip."""
    answer = call(transport, "status", {"tasks": [record.to_hostctl() for record in records],
                                        "reads": [{"path": path, "offset": offset, "max": 1 << 20}
                                                  for path, offset in reads]}, timeout=timeout)
    states = {item["key"]: TaskStatus(key=item["key"], state=item["state"], exit_code=item.get("exit_code"),
                                      signal=item.get("signal"), uptime=item.get("uptime"),
                                      never_started=bool(item.get("never_started")))
              for item in answer["tasks"]}
    chunks = [FileChunk(r["exists"], r["size"], r["offset"], r["end"], r["data"], r["path"])
              for r in answer.get("reads", [])]
    return states, chunks


@dataclass(frozen=True)
class StopResult:
    key: str
    found: bool
    signals: tuple[str, ...]
    survivors: tuple[int, ...]
    cancelled: bool = False     # not started yet: its start will not spawn anything


def stop(transport: Transport, records: Sequence[ProcessRecord], *, grace: float,
         first_signal: str = "TERM") -> dict[str, StopResult]:
    """Stop recorded process groups on one host: TERM, wait ``grace``, KILL, verify."""
    if not records:
        return {}
    answer = call(transport, "stop", {"tasks": [record.to_hostctl() for record in records],
                                      "grace": grace, "signal": first_signal}, timeout=grace + 30)
    return {item["key"]: StopResult(item["key"], item["found"], tuple(item["signals"]),
                                    tuple(item["survivors"]), bool(item.get("cancelled")))
            for item in answer["tasks"]}


def send_signal(transport: Transport, records: Sequence[ProcessRecord], signal_name: str, *,
                task_only: bool = False) -> list[str]:
    """Send one signal (e.g. ``KILL``, ``STOP``) to recorded tasks; returns the keys signalled."""
    answer = call(transport, "signal", {"tasks": [record.to_hostctl() for record in records],
                                        "signal": signal_name, "task_only": task_only})
    return list(answer["sent"])


@dataclass(frozen=True)
class FileChunk:
    exists: bool
    size: int
    offset: int
    end: int          # offset of the byte after this chunk (where the next read starts)
    data: str
    path: str = ""


def read(transport: Transport, path: str, *, offset: int = 0, limit: int = 1 << 20) -> FileChunk:
    """Read part of a file on the host; a negative offset reads from the end."""
    answer = call(transport, "read", {"path": path, "offset": offset, "max": limit})
    return FileChunk(answer["exists"], answer["size"], answer["offset"], answer["end"], answer["data"],
                     answer["path"])


def log_tail(transport: Transport, path: str, *, limit: int = 4000) -> str:
    """The end of a log (best effort: an unreachable host gives an empty tail)."""
    try:
        return read(transport, path, offset=-limit, limit=limit).data
    except HostError:
        return ""


@dataclass(frozen=True)
class Found:
    """Files found under a folder on a host (paths relative to ``root``, which the host expanded)."""

    root: str
    exists: bool
    files: tuple[str, ...]


def find(transport: Transport, root: str, *, contains: str, depth: int = 2) -> Found:
    """Files under ``root`` on the host whose name contains ``contains``."""
    answer = call(transport, "find", {"root": root, "contains": contains, "depth": depth})
    return Found(answer["root"], answer["exists"], tuple(answer["files"]))


@dataclass(frozen=True)
class RemoteCopies:
    """What a host holds of files below its workdir (hostctl ``hashes``)."""

    hashes: Mapping[str, str | None]      # relative name -> sha256, None where there is none
    open: frozenset[str] = frozenset()    # those group or others may read or write there


def hashes(transport: Transport, root: str, files: Sequence[str]) -> RemoteCopies:
    answer = call(transport, "hashes", {"root": root, "files": list(files)})
    return RemoteCopies(answer["hashes"], frozenset(answer.get("open") or ()))


def fsid(transport: Transport, root: str) -> tuple[str, str]:
    """(absolute workdir as the host expands it, id of the filesystem holding it); hosts that
    report the same pair share one copy of the workdir."""
    answer = call(transport, "fsid", {"root": root})
    return answer["root"], answer["fsid"]


def tell(transport: Transport, events: str, data: dict) -> None:
    """Write ``data`` for the trainer whose events file is ``events`` (roles/membership.py)."""
    call(transport, "tell", {"events": events, "data": data})


def remove(transport: Transport, paths: Sequence[str]) -> list[str]:
    return call(transport, "remove", {"paths": list(paths)})["removed"]


def remove_job_dirs(transport: Transport, paths: Sequence[str]) -> list[str]:
    """Remove job folders (``.../.pscluster/<cluster>/job-<N>``) with their files; hostctl
    refuses any other path."""
    answer = call(transport, "remove_job_dirs", {"paths": list(paths)})
    if answer.get("refused"):
        raise HostError(transport.host.name, f"refused to remove {answer['refused'][0]}: not a job folder")
    return answer["removed"]


@dataclass(frozen=True)
class WatchUpdate:
    """One line of a host's ``watch`` stream. ``notice``: the host is told to go (its watch got
    SIGTERM or SIGUSR1: ``{"signal": "SIGTERM"}``); ``pid``: the watch process's, on its host."""

    ts: float
    states: dict[str, TaskStatus]
    reads: tuple[FileChunk, ...]
    notice: Mapping[str, str] | None = None
    pid: int | None = None


def watch(transport: Transport, records: Sequence[ProcessRecord], files: Sequence[tuple[str, int]], *,
          interval: float = 0.25, heartbeat: float = 1.0, ports: Mapping[str, int] | None = None):
    """Start the host-side watch loop; returns a :class:`~cluster.transport.base.Stream`.
    ``ports`` (record key -> port): each state says whether that port listens yet."""
    program = packed_source()
    request: dict = {"tasks": [record.to_hostctl() for record in records],
                     "files": [{"path": path, "offset": offset} for path, offset in files],
                     "interval": interval, "heartbeat": heartbeat}
    if ports:
        request["ports"] = dict(ports)
    # As the become user too: it reads that user's 0700 run folders (N14: without the prefix,
    # become clusters could not be supervised).
    return transport.stream(hostctl_argv(transport, "watch", program), stdin=program + json.dumps(request).encode())


def parse_watch_line(line: str) -> WatchUpdate | None:
    try:
        data = json.loads(line)
    except ValueError:
        return None
    if not isinstance(data, dict) or "tasks" not in data:
        return None
    states = {item["key"]: TaskStatus(key=item["key"], state=item["state"], exit_code=item.get("exit_code"),
                                      signal=item.get("signal"), never_started=bool(item.get("never_started")),
                                      listening=item.get("listening") if isinstance(item.get("listening"), bool)
                                      else None)
              for item in data["tasks"]}
    reads = tuple(FileChunk(r["exists"], r["size"], r["offset"], r["end"], r["data"], r["path"])
                  for r in data["reads"])
    notice = data.get("notice")
    notice = {str(k): str(v) for k, v in notice.items()} if isinstance(notice, dict) else None
    pid = data.get("pid")
    return WatchUpdate(data["ts"], states, reads, notice, pid if isinstance(pid, int) and not isinstance(pid, bool)
                       else None)


def interface_addresses(transport: Transport) -> tuple[str, ...]:
    """The addresses of the host's own interfaces, loopback excepted (a multi-homed member
    may connect from any of them)."""
    return tuple(call(transport, "addresses", {})["addresses"])


def resolve(transport: Transport, names: Sequence[str]) -> dict[str, tuple[str, ...] | str]:
    """Every address of each name as the host resolves it; an error text for a name it cannot."""
    answer = call(transport, "resolve", {"names": list(names)})
    return {name: tuple(item["addresses"]) if "addresses" in item else item["error"]
            for name, item in answer["resolved"].items()}


def nft_apply(transport: Transport, ruleset: str) -> list[str]:
    """Apply an nftables ruleset on the host; returns the host's tables afterwards.

    Raises:
        HostError: nft refused the ruleset (its stderr is in the error).
    """
    answer = call(transport, "nft", {"ruleset": ruleset})
    if answer["exit_code"] != 0:
        raise HostError(transport.host.name, "nft refused the firewall rules", exit_code=answer["exit_code"],
                        stderr=answer["stderr"], hint="pscluster needs root or passwordless sudo and nftables there")
    return [line for line in (answer["tables"] or []) if line.strip()]
