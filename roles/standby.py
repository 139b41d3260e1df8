"""A training process started before its job: TensorFlow is imported when ``train`` comes.

``python -m roles.standby --fifo PATH [--ready PATH]``. ``pscluster up`` starts one per training task (async:
the chief; sync and sync-ps: each worker) unless the host says ``pscluster_standby: false``,
and ``train`` starts a new one after each finished job. Importing TensorFlow is 3-5 s of
every training process's start on a 2-core host (docs/platform-notes.md TF1: 3.4 s idle, more beside busy
servers); a standby has paid it before anyone asks for a job.

How a job reaches it (``roles/hostctl.py``, operation ``adopt``):

1. At start the standby forks (``guardian.fork_trainer``, before TensorFlow is imported):
   the recorded PID stays small and becomes the trainer's guardian, the child imports
   TensorFlow and waits on a pipe. Until a job comes, a termination signal ends both.
2. hostctl opens the FIFO for writing (nobody reading means no standby: it starts the trainer
   afresh) and writes one JSON request: the trainer's argv, its whole environment, working
   directory, log, and the file to answer in. The request travels in kernel memory only, so
   secrets in the environment never touch a disk.
3. The standby checks the request (:func:`verdict`) and answers. It declines, and exits, when
   its interpreter or folder is not the request's, when a variable TensorFlow reads while it is
   imported differs (:func:`import_time_env`; e.g. ``OMP_NUM_THREADS`` or a thread count
   changed in the inventory), or when a module of ``roles/`` it loaded changed on disk since it
   started (a code sync in between); hostctl then starts the trainer afresh.
4. Accepted: both processes take the request's environment, folder and log (stdout and
   stderr); the parent becomes the guardian and the child runs ``roles.train`` from the split
   on, so the trainer is the one a fresh start gives (events, exit codes, signals, stop on
   SIGTERM), minus the import.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import signal
import sys
import time
from typing import Any, Mapping, NoReturn, Sequence

from roles import guardian, train
from roles.tfconfig import threads_from_env
from roles.tfruntime import import_tensorflow

log = logging.getLogger("pscluster.standby")

# Variables read while TensorFlow is imported or its runtime is set up (oneDNN, CUDA, logging,
# OpenMP/MKL pools, roles.tfruntime's thread counts from PSCLUSTER_*, Keras' config under
# HOME/KERAS_HOME, the interpreter's own): a standby runs a job only if they are the job's.
IMPORT_TIME_PREFIXES = ("TF_", "CUDA", "OMP_", "KMP_", "MKL", "XLA_", "KERAS", "PYTHON", "LD_",
                        "GRPC_", "NVIDIA", "ONEDNN", "DNNL", "PSCLUSTER_")
IMPORT_TIME_NAMES = frozenset({"HOME"})
# Read when the job runs, not at import: a standby of worker:2 may become worker:1 on the same
# host (a sync resize that renumbers: cluster/lifecycle/resize.py ``match_standbys``).
READ_LATER = frozenset({"TF_CONFIG", "PSCLUSTER_DATA", "PSCLUSTER_TASK"})
TRAIN_MODULE = "roles.train"
MAX_REQUEST = 16 << 20


def import_time_env(env: Mapping[str, str]) -> dict[str, str]:
    """The part of ``env`` that TensorFlow's import and runtime set-up may read."""
    return {name: value for name, value in env.items()
            if name not in READ_LATER and (name in IMPORT_TIME_NAMES or name.startswith(IMPORT_TIME_PREFIXES))}


def project_sources(modules: Mapping[str, Any]) -> dict[str, str]:
    """{module name: source path} of the loaded modules of this project's ``roles`` package."""
    found = {}
    for name, module in list(modules.items()):
        path = getattr(module, "__file__", None)
        if path and (name == "roles" or name.startswith("roles.")):
            found[name] = path
    return found


def digests(sources: Mapping[str, str]) -> dict[str, str | None]:
    """sha256 of each source file (None: unreadable, e.g. removed)."""
    out: dict[str, str | None] = {}
    for name, path in sources.items():
        try:
            with open(path, "rb") as handle:
                out[name] = hashlib.sha256(handle.read()).hexdigest()
        except OSError:
            out[name] = None
    return out


def verdict(request: Any, *, interpreter: str, cwd: str, env: Mapping[str, str],
            sources: Mapping[str, str], loaded: Mapping[str, str | None]) -> str | None:
    """Why this standby cannot run ``request`` (None: it can). Names variables, never values
    (the request's environment may hold secrets)."""
    if not isinstance(request, dict):
        return "the request is not a JSON object"
    argv, their_env, their_cwd = request.get("argv"), request.get("env"), request.get("cwd")
    if (not isinstance(argv, list) or len(argv) < 3 or not all(isinstance(a, str) for a in argv)
            or argv[1:3] != ["-m", TRAIN_MODULE]):
        return f"not a '-m {TRAIN_MODULE}' command line"
    if argv[0] != interpreter:
        return f"the interpreter is {argv[0]}, the standby's is {interpreter}"
    if not isinstance(their_cwd, str) or os.path.realpath(os.path.expanduser(their_cwd)) != os.path.realpath(cwd):
        return f"the folder is {their_cwd}, the standby's is {cwd}"
    if not isinstance(their_env, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                  for k, v in their_env.items()):
        return "the environment is not a map of strings"
    if not isinstance(request.get("log"), str) or not isinstance(request.get("reply"), str):
        return "the request names no log or reply file"
    mine, theirs = import_time_env(env), import_time_env(their_env)
    changed = sorted(name for name in mine.keys() | theirs.keys() if mine.get(name) != theirs.get(name))
    if changed:
        more = f" and {len(changed) - 4} more" if len(changed) > 4 else ""
        return f"the environment TensorFlow reads at import differs in {', '.join(changed[:4])}{more}"
    now = digests(sources)
    stale = sorted(name for name, digest in loaded.items() if now.get(name) != digest)
    if stale:
        return f"code changed on disk since the standby started: {', '.join(stale[:3])}"
    return None


def _read_all(fd: int) -> bytes:
    chunks, size = [], 0
    while size <= MAX_REQUEST:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _next_request(fifo: str) -> tuple[Any, bytes]:
    """Blocks until a writer opens the FIFO; (parsed request or None, raw bytes)."""
    fd = os.open(fifo, os.O_RDONLY)
    try:
        data = _read_all(fd)
    finally:
        os.close(fd)
    try:
        return json.loads(data.decode()), data
    except (UnicodeDecodeError, ValueError):
        return None, data


def _answer(path: str, **fields: Any) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as handle:
        json.dump(fields, handle)
    os.replace(tmp, path)


def _take(request: Mapping[str, Any]) -> None:
    """Become the request's process: its environment, folder, and its log as stdout/stderr."""
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(os.path.expanduser(request["cwd"]))
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(os.path.expanduser(request["log"]), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _visible_gpus(tf: Any) -> int | None:
    """The GPUs this process sees (None: unknown). Listing the physical devices leaves
    TensorFlow's context uninitialised, as a standby must (it is how one sets memory growth before
    the first op). The orchestrator starts a sync resize's next workers beside the running ones
    only without GPUs or with memory growth (cluster/lifecycle/resize.py ``gpus_allow_overlap``)."""
    try:
        return len(tf.config.list_physical_devices("GPU"))
    except Exception:  # noqa: BLE001 - only a hint for the orchestrator
        return None


def _trainer(link_fd: int, request_fd: int, ready: str | None) -> NoReturn:
    """The child: import TensorFlow, say so in ``ready``, wait for the request, run it as
    roles.train does."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, guardian.TERMINATION_SIGNALS)   # a stop stops
    began = time.monotonic()
    tf = import_tensorflow(threads_from_env())
    seconds = time.monotonic() - began
    log.info("TensorFlow %s imported in %.1f s; waiting for a job", tf.__version__, seconds)
    if ready:
        _answer(ready, tensorflow=tf.__version__, import_seconds=round(seconds, 2), gpus=_visible_gpus(tf))
    data = _read_all(request_fd)
    os.close(request_fd)
    if not data:        # declined, or the guardian-to-be is gone
        os._exit(0)
    request = json.loads(data.decode())
    _take(request)
    started = time.time()
    argv = request["argv"][3:]
    sys.argv = [TRAIN_MODULE, *argv]
    log.info("standby pid %d runs this job (TensorFlow imported %.1f s before it came)",
             os.getppid(), time.monotonic() - began)
    prepared = train.prepare(argv)
    if isinstance(prepared, int):       # the guardian-to-be checked it: not expected
        os._exit(prepared)
    options, task = prepared
    link = guardian.become_trainer(link_fd, train.stop_grace_of(options))
    train.exit_trainer(options.mode, train.run_trainer(options, task, link, started))


def _make_fifo(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    os.mkfifo(path, 0o600)


def main(argv: Sequence[str] | None = None) -> NoReturn:
    parser = argparse.ArgumentParser(prog="python -m roles.standby",
                                     description="Import TensorFlow now; run one roles.train job later.")
    parser.add_argument("--fifo", required=True, help="the FIFO the job's request comes through")
    parser.add_argument("--ready", help="a file written once TensorFlow is imported (`pscluster status` reads it)")
    args = parser.parse_args(argv)
    train.configure_logging()
    fifo = os.path.abspath(os.path.expanduser(args.fifo))
    interpreter = sys.orig_argv[0] if getattr(sys, "orig_argv", None) else sys.executable
    cwd = os.getcwd()
    env = dict(os.environ)
    sources = project_sources(sys.modules)
    loaded = digests(sources)
    _make_fifo(fifo)
    request_r, request_w = os.pipe()
    child, link_fd = guardian.fork_trainer()
    if child == 0:
        os.close(request_w)
        _trainer(link_fd, request_r, os.path.abspath(os.path.expanduser(args.ready)) if args.ready else None)
    os.close(request_r)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, guardian.TERMINATION_SIGNALS)
    while True:
        request, raw = _next_request(fifo)
        if request is None and not raw:
            continue        # a writer that opened and closed: nothing asked
        if isinstance(request, dict) and isinstance(request.get("reply"), str):
            break
        log.warning("ignored a malformed request (%d bytes)", len(raw))
    reason = verdict(request, interpreter=interpreter, cwd=cwd, env=env, sources=sources, loaded=loaded)
    if reason is None:
        ended, status = os.waitpid(child, os.WNOHANG)
        if ended:       # e.g. TensorFlow failed to import: a fresh start reports that properly
            how = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit code {os.WEXITSTATUS(status)}"
            reason = f"its TensorFlow process ended ({how}) before the job came"
    os.unlink(fifo)     # one job per standby
    _answer(request["reply"], accepted=reason is None, reason=reason, pid=os.getpid())
    if reason is not None:
        log.warning("declined a job: %s", reason)
        os.close(request_w)
        try:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
        except (ProcessLookupError, ChildProcessError):
            pass        # reaped above
        os._exit(0)
    _take(request)
    prepared = train.prepare(request["argv"][3:])
    if isinstance(prepared, int):       # a bad command line: reported like a fresh start's
        os.close(request_w)
        os.waitpid(child, 0)
        os._exit(prepared)
    options, task = prepared
    view = memoryview(json.dumps(request).encode())
    try:
        while view:
            view = view[os.write(request_w, view):]
    except BrokenPipeError:
        pass    # the child died meanwhile: the guardian reports its exit like a fresh start's
    os.close(request_w)
    guardian.become_guardian(child, link_fd, options.start_timeout, train.FIRST_STEP,
                              train.guardian_report(options, task), train.stop_grace_of(options))


if __name__ == "__main__":
    main()
