"""Host-side control program of pscluster (standard library only; never imports TensorFlow).

The orchestrator does not install this file on hosts before using it: a one-line ``python -c``
bootstrap reads this source, compressed, from stdin, and the JSON request follows it there (so
nothing secret is on a command line); the answer is one JSON object on stdout. Operations:

``facts``   interpreter, TensorFlow distribution and version (from package metadata, without the
            3 s import; tf-keras' too when asked), busy ports, GPUs (``nvidia-smi -L``), workdir writability.
``start``   start one task detached: a monitor process becomes session and group leader
            (pgid = its pid) and a child subreaper, starts the task in its group with output to
            the log file (0600, in 0700 ``.pscluster`` folders), writes the task's exit status
            to ``<log>.exit`` when it ends, and stays until every descendant is gone (so a
            descendant that left the session is still found by ``stop``). A start whose token a
            ``stop`` cancelled first (``<log>.cancel``) does not start anything.
``start_many``  several ``start``s in one call (one call per host and ``up``, not one per task).
``adopt``   a ``start`` handed to a standby (roles/standby.py) that already imported TensorFlow:
            its request goes through the standby's FIFO, and the standby's process becomes the
            task; or "declined", and the caller starts the task afresh.
``status``  per recorded task: running / frozen / exited (with code or signal) / gone.
``watch``   the same, streamed as JSON lines with new bytes of event files (supervision).
``stop``    SIGTERM every process of each recorded task (its session, and every descendant of
            it, found in /proc, whatever group or session it moved to), wait up to a grace
            period, freeze and SIGKILL what is left, verify; each (pid, start time) is checked
            before it is signalled. A record whose start has not written its pid file yet is
            cancelled under the start's lock instead, so that start never spawns.
``signal``  one signal to recorded tasks (every process of each) or to single task processes
            (fault tests, Ctrl-C).
``tell``    hand a running trainer a request (roles/membership.py): JSON in ``<events>.membership``.
``read``    bytes of a file from an offset (logs, event files).
``find``    files under a folder whose name contains a string (a run's TensorBoard event files).
``hashes``  sha256 of files under a directory (code sync sends only what changed).
``remove``  unlink files (the pid files of stopped tasks); ``remove_job_dirs``: a finished job's folders, nothing else.
``fsid``    the id of the filesystem under the workdir (which hosts share a home).
``listen``, ``connect``, ``unlisten``  the host-to-host reach check: short-lived listeners on the
            planned ports, TCP connections to others', the listeners ended.
``addresses``  this host's interface addresses but loopback (firewall members).
``program`` what ``run`` checks before a program starts: its files, its PATH, the modules it
            imports (``importlib.util.find_spec`` from its folder), tf-keras for legacy Keras.
``nft``     apply or delete an nftables ruleset (the firewall feature).
``resolve`` every address of host names, as this host resolves them (firewall members).
``relay``   code sync through peers: fetch the files that differ from hosts already synced
            (sha256-checked), then serve this host's copies to others while the reader stays.
"""
import json
import os
import signal
import sys
import time

# subprocess and socket are imported where needed: every millisecond of start-up counts when
# 64 hosts answer at once, and while TensorFlow servers start on the same cores.


def _expand(path):
    return os.path.abspath(os.path.expanduser(path)) if path else path


def _proc_stat(pid):
    """(state, pgrp, session, starttime) of a process, or None if there is no such process."""
    try:
        with open("/proc/%d/stat" % pid) as handle:
            text = handle.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = text[text.rindex(")") + 2:].split()
    return fields[0], int(fields[2]), int(fields[3]), fields[19]


def _alive(pid, starttime=None):
    stat = _proc_stat(pid)
    if stat is None or stat[0] in ("Z", "X"):
        return False
    return starttime is None or stat[3] == starttime


RUN_ROOT = ".pscluster"      # the folder under a workdir that holds the run folders (and fsid)
# Files beside each task's log (cluster/layout.py names the same suffixes; a unit test checks).
PID_SUFFIX = ".pid"          # the monitor's record of the task: pid, pgid, start times
EXIT_SUFFIX = ".exit"        # the task's exit status, written when it ends
CANCEL_SUFFIX = ".cancel"    # tokens of starts that a stop overtook
LOCK_SUFFIX = ".lock"        # held by a start (or a cancel) until the pid file exists
FIFO_SUFFIX = ".fifo"        # a standby's FIFO, beside the standby's log (roles/standby.py)
REPLY_SUFFIX = ".adopt"      # a standby's answer to ``adopt``, beside the new process's log
ADOPT_REPLY_SECONDS = 10.0   # a standby answers at once (its parent never imports TensorFlow)

TF_DISTS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tf-nightly", "tf-nightly-cpu",
            "tensorflow-intel", "tensorflow-macos")


def _tensorflow_dist():
    """(distribution, version, importable) of TensorFlow for this interpreter, without importing it.

    Scans the interpreter's site-packages for ``*.dist-info`` first (a millisecond); only if
    that finds nothing does it load ``site`` and ask ``importlib.metadata`` (tens of ms).
    """
    return _find_dist(TF_DISTS, "tensorflow")


def _find_dist(dists, package):
    """{"dist", "version", "importable"} of the first of ``dists`` installed for this interpreter
    (``package``: the import name whose ``__init__.py`` makes it importable), or None."""
    import sysconfig
    # Run with -S, a virtualenv's prefix is not applied (site.py does that): find it ourselves.
    roots = []
    venv = os.path.dirname(os.path.dirname(os.path.abspath(sys.executable)))
    if os.path.exists(os.path.join(venv, "pyvenv.cfg")):
        roots.append(venv)
    roots.append(None)
    folders = []
    for root in roots:
        paths = sysconfig.get_paths(vars={"base": root, "platbase": root}) if root else sysconfig.get_paths()
        for key in ("purelib", "platlib"):
            if paths.get(key) and paths[key] not in folders:
                folders.append(paths[key])
    wanted = {name.replace("-", "_") for name in dists}
    for folder in folders:
        try:
            entries = os.listdir(folder)
        except OSError:
            continue
        for entry in entries:
            if not entry.endswith(".dist-info"):
                continue
            name, _, version = entry[:-len(".dist-info")].partition("-")
            if name.lower() in wanted:
                importable = any(os.path.exists(os.path.join(f, package, "__init__.py")) for f in folders)
                return {"dist": name.lower().replace("_", "-"), "version": version, "importable": importable}
    import site
    site.main()
    try:
        from importlib import metadata
        import importlib.util
    except ImportError:  # pragma: no cover - Python < 3.8
        return None
    for dist in dists:
        try:
            version = metadata.version(dist)
        except Exception:  # PackageNotFoundError
            continue
        return {"dist": dist, "version": version,
                "importable": importlib.util.find_spec(package) is not None}
    return None


def _port_busy(socket, port):
    """Why ``port`` cannot be served on every interface, or None. TF servers bind [::] (dual
    stack), so a listener on an IPv4 or an IPv6 address takes the port: both families are tried,
    IPv6 alone (V6ONLY) so that a listener on ::1 or an IPv6-only [::] is not missed."""
    for family, address in ((socket.AF_INET, "0.0.0.0"), (getattr(socket, "AF_INET6", None), "::")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except (OSError, TypeError):       # no IPv6 on this host: nothing can listen there
            continue
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family != socket.AF_INET:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((address, port))
        except OSError as exc:
            return "{} (on {})".format(exc.strerror, "IPv4" if family == socket.AF_INET else "IPv6")
        finally:
            sock.close()
    return None


# The two queries cluster/hosts/gpus.py parses (QUERY_GPUS, QUERY_APPS there; a unit test keeps them equal).
GPU_QUERY = "--query-gpu=index,uuid,memory.total,memory.used,name"
APPS_QUERY = "--query-compute-apps=gpu_uuid,pid,used_memory"


def _gpu_query(subprocess):
    """Per-GPU name and memory and the processes using each GPU (cluster/hosts/gpus.py parses them), with
    the user owning each of those processes: lab GPUs are shared, and a busy one is named with who."""
    out = {}
    for key, query in (("gpus", GPU_QUERY), ("apps", APPS_QUERY)):
        try:
            done = subprocess.run(["nvidia-smi", query, "--format=csv,noheader,nounits"], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, timeout=20, universal_newlines=True)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return {"error": "nvidia-smi %s: %s" % (query, exc)}
        if done.returncode:
            return {"error": "nvidia-smi %s: %s" % (query, done.stderr.strip() or "exit %d" % done.returncode)}
        out[key] = done.stdout
    users = {}
    for line in out["apps"].splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) == 3 and cells[1].isdigit():
            try:
                import pwd
                users[cells[1]] = pwd.getpwuid(os.stat("/proc/" + cells[1]).st_uid).pw_name
            except (OSError, KeyError, ImportError):
                pass
    out["users"] = users
    return out


def op_facts(req):
    import socket
    result = {"python": sys.version.split()[0], "executable": sys.executable,
              "hostname": socket.gethostname(), "cpus": os.cpu_count()}
    tf = _tensorflow_dist()
    result["tensorflow"] = tf
    if req.get("tf_keras"):     # run --keras legacy / pscluster_keras: legacy: tf-keras must match TF
        result["tf_keras"] = _find_dist(("tf-keras", "tf_keras"), "tf_keras")
    result["busy_ports"] = [{"port": port, "error": error} for port in req.get("ports", [])
                            for error in [_port_busy(socket, port)] if error]
    if req.get("gpus"):
        import subprocess
        try:
            out = subprocess.run(["nvidia-smi", "-L"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 timeout=20, universal_newlines=True)
            result["gpus"] = [line for line in out.stdout.splitlines() if line.startswith("GPU ")]
            result["gpu_error"] = out.stderr.strip() if out.returncode else None
        except FileNotFoundError:
            result["gpus"], result["gpu_error"] = [], "nvidia-smi not found"
        except subprocess.TimeoutExpired:
            result["gpus"], result["gpu_error"] = [], "nvidia-smi -L timed out"
        if result["gpus"]:
            result["gpu_query"] = _gpu_query(subprocess)
    workdir = req.get("workdir")
    if workdir:
        path = _expand(workdir)
        try:
            os.makedirs(path, exist_ok=True)
            # Tasks write under the run root only (a container's workdir is root's, 0755: the
            # node image); code sync reports its own failure where the workdir itself is not writable.
            run_root = os.path.join(path, RUN_ROOT)
            try:
                os.mkdir(run_root, 0o700)
            except FileExistsError:
                pass
            probe = os.path.join(run_root, ".write-test-%d" % os.getpid())
            with open(probe, "w") as handle:
                handle.write("ok")
            os.unlink(probe)
            result["workdir_error"] = None
            result["workdir_unsafe"] = _workdir_unsafe(path)
        except OSError as exc:
            result["workdir_error"] = "%s: %s" % (path, exc.strerror)
    for tool in req.get("tools", []):
        result.setdefault("tools", {})[tool] = any(
            os.access(os.path.join(d, tool), os.X_OK) for d in
            os.environ.get("PATH", "").split(os.pathsep) + ["/usr/sbin", "/sbin"])
    result["uid"] = os.getuid()
    # The address this machine's SSH client connects from, as this host sees it.
    ssh = os.environ.get("SSH_CONNECTION", "").split()
    result["ssh_client"] = ssh[0] if ssh else None
    if req.get("need_root"):
        import subprocess
        result["root"] = os.getuid() == 0 or subprocess.run(
            ["sudo", "-n", "true"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
    return result


def _workdir_unsafe(workdir):
    """Why tasks must not run from ``workdir``, or None: it must belong to this user or root and
    be writable by nobody else (issue 42, L2). A sticky bit does not make it safe: another user
    can create ``roles/`` or ``.pscluster`` there first and own what pscluster then writes into,
    or puts beside the code the tasks import."""
    import stat
    info = os.stat(workdir)
    if info.st_uid not in (os.geteuid(), 0):
        return ("the workdir %s belongs to uid %d, not to this user (uid %d) or root"
                % (workdir, info.st_uid, os.geteuid()))
    if stat.S_IMODE(info.st_mode) & 0o022:
        return ("the workdir %s is writable by group or others (mode %04o): anyone there can replace the code "
                "the tasks run" % (workdir, stat.S_IMODE(info.st_mode)))
    return None


def _private_dirs(path):
    """Create ``path`` and make every folder from ``.pscluster`` down owner-only (0700): they
    hold logs (which may show data or tracebacks), pid files and events.

    In a shared workdir another user could plant a symlink where a task's log goes, or own the
    ``.pscluster`` folder: so each folder from ``.pscluster`` down must be a real folder of this
    user, and the workdir one of this user or root (a workdir someone else owns can have its
    ``.pscluster`` swapped); files inside are opened O_NOFOLLOW (first round, item 17)."""
    import stat
    parts = path.split(os.sep)
    if RUN_ROOT not in parts:
        os.makedirs(path, mode=0o700, exist_ok=True)
        return
    top = parts.index(RUN_ROOT)
    workdir = os.sep.join(parts[:top]) or os.sep
    os.makedirs(workdir, exist_ok=True)
    unsafe = _workdir_unsafe(workdir)
    if unsafe:
        raise PermissionError(unsafe + ": its owner or others could redirect the tasks' logs or replace their code; "
                              "use a workdir of your own, writable only by you")
    for end in range(top + 1, len(parts) + 1):    # one level at a time, never through a symlink
        folder = os.sep.join(parts[:end])
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass
        info = os.lstat(folder)
        if not stat.S_ISDIR(info.st_mode):
            raise PermissionError("%s is not a folder (a symlink?): refusing to write logs through it" % folder)
        if info.st_uid != os.geteuid():
            raise PermissionError("%s belongs to uid %d, not to this user (uid %d): refusing to write logs in it"
                                  % (folder, info.st_uid, os.geteuid()))
        if stat.S_IMODE(info.st_mode) != 0o700:
            os.chmod(folder, 0o700)


_PRIVATE = os.O_NOFOLLOW | os.O_CLOEXEC     # a symlink planted where a log or pid file goes is refused


def _start_lock(log):
    """Exclusive lock of one log's start/cancel (held by a start until its pid file exists)."""
    import fcntl
    fd = os.open(log + LOCK_SUFFIX, os.O_WRONLY | os.O_CREAT | _PRIVATE, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _cancelled(log, token):
    try:
        with open(log + CANCEL_SUFFIX) as handle:
            return token in handle.read().split()
    except OSError:
        return False


def _wait_status(status):
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _under_start_lock(req, start):
    """``start(log, lock_fd)`` under the start's lock, unless a stop cancelled this start first."""
    log = _expand(req["log"])
    token = req.get("token")
    _private_dirs(os.path.dirname(log))
    if os.path.islink(log):
        raise PermissionError("%s is a symlink: refusing to write the task's log through it" % log)
    lock_fd = _start_lock(log)
    try:
        # A stop that came first (the orchestrator's record was saved, then `down` ran before
        # this start arrived) left this start's token: starting now would leave a server
        # nobody records.
        if token and _cancelled(log, token):
            return {"error": "cancelled: the cluster was stopped before this task started", "cancelled": True}
        return start(log, lock_fd)
    finally:
        os.close(lock_fd)


def _remove_stale(req, log, *more):
    """Each attempt starts clean: a name reused by a later cluster or job must not show old lines."""
    for stale in [log + EXIT_SUFFIX, log + PID_SUFFIX, log + CANCEL_SUFFIX, *more] + [
            _expand(path) for path in req.get("fresh", [])]:
        if os.path.exists(stale):
            os.unlink(stale)


def _start_env(req, log=None):
    """The started process's environment: this one's (unless ``inherit_env`` is false) plus the
    request's, which arrives on stdin: secret values never touch argv. A ``python -m roles.X``
    task also gets :func:`_safe_path`."""
    env = dict(os.environ) if req.get("inherit_env", True) else {}
    env.update(req.get("env", {}))
    argv = req.get("argv") or []
    if log is not None and len(argv) >= 3 and argv[1] == "-m" and str(argv[2]).startswith("roles."):
        _safe_path(env, log)
    return env


def _safe_path(env, log):
    """``python -m`` puts its folder, the workdir, first on ``sys.path``: a ``json.py`` or
    ``typing.py`` a ``run`` program left there shadowed the standard library in pscluster's own
    servers and trainers (issue 42, L3). So they get ``PYTHONSAFEPATH=1`` (Python 3.11+; older ones
    ignore it), and ``roles`` alone is importable, through ``.pscluster/path/roles``, a link to
    the workdir's ``roles/`` in the run root (0700, this user's: :func:`_private_dirs`)."""
    parts = log.split(os.sep)
    if RUN_ROOT not in parts:
        return
    run_root = os.sep.join(parts[:parts.index(RUN_ROOT) + 1])
    folder = os.path.join(run_root, "path")
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    if not os.path.isdir(folder) or os.path.islink(folder):
        raise PermissionError("%s is not a folder (a symlink?): refusing to import roles through it" % folder)
    link = os.path.join(folder, "roles")
    target = os.path.join(os.pardir, os.pardir, "roles")
    if not (os.path.islink(link) and os.readlink(link) == target):
        tmp = "%s.%d.tmp" % (link, os.getpid())
        os.symlink(target, tmp)
        os.replace(tmp, link)          # atomic: a task starting beside this one sees one or the other
    env["PYTHONSAFEPATH"] = "1"
    env["PYTHONPATH"] = folder + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")


def op_start(req):
    return _under_start_lock(req, lambda log, lock_fd: _spawn(req, _expand(req["cwd"]), log, log + EXIT_SUFFIX,
                                                              req.get("token"), lock_fd))


def _spawn(req, cwd, log, exit_file, token, lock_fd):
    _remove_stale(req, log)
    env = _start_env(req, log)
    import subprocess
    read_end, write_end = os.pipe()
    monitor = os.fork()
    if monitor == 0:  # monitor: session leader, parent of the task
        try:
            os.close(lock_fd)    # the lock is the starting call's, not the monitor's lifetime
            os.close(read_end)
            os.setsid()
            try:    # PR_SET_CHILD_SUBREAPER: orphaned descendants become our children, not init's
                import ctypes
                ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)
            except Exception:
                pass
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | _PRIVATE, 0o600)
            os.fchmod(log_fd, 0o600)     # an older log of the same name may have been 0644
            os.write(log_fd, ("pscluster: %s starting %s\n" % (
                time.strftime("%Y-%m-%d %H:%M:%S"), " ".join(req["argv"]))).encode())
            try:
                task = subprocess.Popen(req["argv"], cwd=cwd, env=env, stdin=devnull,
                                        stdout=log_fd, stderr=log_fd, close_fds=True)
            except OSError as exc:
                message = "cannot start %s: %s" % (req["argv"][0], exc.strerror)
                os.write(log_fd, ("pscluster: %s\n" % message).encode())
                _write_json(exit_file, {"exit_code": 127, "signal": None, "ended": time.time(),
                                        "error": message})
                os.write(write_end, json.dumps({"error": message}).encode())
                os._exit(0)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(sig, signal.SIG_IGN)   # outlive the task to record its exit
            me = os.getpid()
            record = {"pid": task.pid, "pgid": me, "starttime": _proc_stat(me)[3],
                      "task_starttime": (_proc_stat(task.pid) or [None] * 4)[3],
                      "started": time.time(), "log": log, "exit_file": exit_file, "token": token}
            # Written before anyone is told: an orchestrator killed right now still finds it.
            _write_json(log + PID_SUFFIX, record)
            os.write(write_end, json.dumps(record).encode())
            os.close(write_end)
            # Reap every child (the task, and orphans adopted as subreaper) until none is left.
            while True:
                try:
                    pid, status = os.waitpid(-1, 0)
                except ChildProcessError:
                    break
                except InterruptedError:
                    continue
                if pid != task.pid:
                    continue
                code = _wait_status(status)
                _write_json(exit_file, {"exit_code": code if code >= 0 else None,
                                        "signal": -code if code < 0 else None, "ended": time.time()})
                os.write(log_fd, ("pscluster: %s task ended with %s\n" % (
                    time.strftime("%Y-%m-%d %H:%M:%S"),
                    "exit code %d" % code if code >= 0 else "signal %d" % -code)).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    chunks = []
    while True:
        chunk = os.read(read_end, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.waitpid(monitor, os.WNOHANG)
    data = b"".join(chunks)
    if not data:
        return {"error": "the monitor process died before starting the task"}
    return json.loads(data.decode())


def op_adopt(req):
    """``start``, handed to a standby that already imported TensorFlow (roles/standby.py).

    ``req`` is a ``start`` request plus ``standby``: the standby's record (its log, pid file and
    token) and ``fifo``. Answers the new process's record, or ``{"declined": reason}`` when the
    standby did not take it: then nothing runs for this start, the standby is gone (a standby
    that is alive but did not answer -- frozen, or not listening yet -- is killed, so it never
    takes the request later), and the caller starts the task afresh. The record is the
    standby's process (pid, group, start times, exit file) under the new log and token, with
    ``adopted`` set to its pid.
    """
    return _under_start_lock(req, lambda log, _lock_fd: _adopt(req, log))


def _adopt(req, log):
    found = _resolve(req["standby"])
    if found.get("pgid") is None or not _alive(found["pid"], found.get("task_starttime")):
        return {"declined": "the standby is not running"}
    answer = _hand_over(req, found, log)
    if not answer.get("accepted"):
        _freeze_and_kill(found, {})
        return {"declined": answer.get("reason") or "declined"}
    record = {"pid": found["pid"], "pgid": found["pgid"], "starttime": found["starttime"],
              "task_starttime": found["task_starttime"], "started": time.time(), "log": log,
              "exit_file": found["exit_file"], "token": req.get("token"), "adopted": found["pid"]}
    _write_json(log + PID_SUFFIX, record)
    return record


def _hand_over(req, standby, log):
    """Write the start request into the standby's FIFO; its answer ({"accepted", "reason"})."""
    try:
        fd = os.open(_expand(req["standby"]["fifo"]), os.O_WRONLY | os.O_NONBLOCK)
    except OSError:     # ENXIO: nobody reads it (not listening yet, frozen, or gone)
        return {"reason": "the standby is not listening"}
    reply = log + REPLY_SUFFIX
    try:
        _remove_stale(req, log, reply)
        env = _start_env(req, log)      # leaves through the FIFO: never on disk
        log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | _PRIVATE, 0o600)
        os.fchmod(log_fd, 0o600)
        os.write(log_fd, ("pscluster: %s starting %s (standby pid %d: TensorFlow already imported)\n" % (
            time.strftime("%Y-%m-%d %H:%M:%S"), " ".join(req["argv"]), standby["pid"])).encode())
        os.close(log_fd)
        payload = json.dumps({"argv": req["argv"], "env": env, "cwd": req["cwd"], "log": log,
                              "reply": reply}).encode()
        os.set_blocking(fd, True)
        view = memoryview(payload)
        while view:
            view = view[os.write(fd, view):]
    except BrokenPipeError:
        return {"reason": "the standby went away"}
    finally:
        os.close(fd)
    answer = None
    deadline = time.time() + ADOPT_REPLY_SECONDS
    while answer is None and time.time() < deadline and _alive(standby["pid"], standby.get("task_starttime")):
        answer = _read_exit(reply)
        if answer is None:
            time.sleep(0.01)
    answer = answer or _read_exit(reply)
    if os.path.exists(reply):
        os.unlink(reply)
    return answer or {"reason": "the standby did not answer"}


def op_start_many(req):
    """Start several tasks in one call (one per host and ``up``, not one per task)."""
    return {"started": [op_start(item) for item in req["tasks"]]}


def _write_json(path, data):
    tmp = path + ".tmp%d" % os.getpid()
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _PRIVATE, 0o600), "w") as handle:
        json.dump(data, handle)
    os.replace(tmp, path)


def _read_exit(path):
    try:
        with open(_expand(path)) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def _resolve(rec):
    """Fill pid/pgid from the pid file when the orchestrator died before recording them.

    Only a pid file written for this record's start (same token) counts: the file of an
    earlier cluster or job of the same name names processes that are not this record's.
    """
    if rec.get("pgid") is None and rec.get("log"):
        found = _read_exit(rec["log"] + PID_SUFFIX)
        if found and (found.get("token") in (None, rec.get("token")) or rec.get("token") is None):
            rec = dict(rec, **{k: found[k] for k in ("pid", "pgid", "starttime", "task_starttime",
                                                      "started", "exit_file")})
    return rec


def _task_state(rec, now):
    rec = _resolve(rec)
    if rec.get("pgid") is None:
        return {"state": "gone", "never_started": True}
    exit_info = _read_exit(rec["exit_file"]) if rec.get("exit_file") else None
    if _alive(rec["pid"], rec.get("task_starttime")):
        stopped = _proc_stat(rec["pid"])[0] in ("T", "t")     # SIGSTOP or a tracer: frozen
        return {"state": "frozen" if stopped else "running", "uptime": now - rec.get("started", now)}
    if exit_info is not None:
        return dict(exit_info, state="exited")
    if _alive(rec["pgid"], rec.get("starttime")):
        # The task is gone and the monitor has not written yet: about to be "exited".
        return {"state": "running", "uptime": now - rec.get("started", now)}
    return {"state": "gone"}


def op_status(req):
    """Task states, plus (optionally) new bytes of files: one round trip per host per poll."""
    now = time.time()
    result = {"tasks": [dict(_task_state(rec, now), key=rec["key"]) for rec in req["tasks"]]}
    if req.get("reads"):
        result["reads"] = [op_read(read) for read in req["reads"]]
    return result


def _listening_ports():
    """The TCP ports something listens on in this host's network namespace (/proc/net/tcp and
    tcp6, state 0A): a watch says when a task's port opened, so the orchestrator's readiness
    probes go to servers that listen rather than round after round to all (issue 46)."""
    found = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as handle:
                next(handle, None)
                for line in handle:
                    fields = line.split()
                    if len(fields) > 3 and fields[3] == "0A":
                        found.add(int(fields[1].rsplit(":", 1)[1], 16))
        except (OSError, ValueError):
            continue
    return found


def _mark_listening(states, ports, heard):
    """``listening`` in each state whose key has a port (``heard``: the keys seen so far)."""
    if not ports:
        return
    if len(heard) < len(ports):
        open_ports = _listening_ports()
        heard.update(key for key, port in ports.items() if port in open_ports)
    for item in states:
        if item["key"] in ports:
            item["listening"] = item["key"] in heard


def op_watch(req):
    """Stream task states and new file bytes as JSON lines until the reader goes away.

    A line goes out when a state changes, a watched file grew, or ``heartbeat`` seconds
    passed; the orchestrator treats a silent channel as a lost host. Ends when stdout is
    closed (EPIPE), so it never outlives the orchestrator's connection by more than a beat.
    With ``ports`` (key -> port), each task's state says whether its port listens yet
    (``listening``): `up` probes a server once it does.

    The host's own shutdown (SIGTERM) and Slurm's usual ``--signal`` (SIGUSR1, e.g. ``scancel
    --signal=USR1`` to this step) are notices: one line with ``"notice": {"signal": NAME}`` goes
    out at once (between two lines, never inside one), and the orchestrator drains this host.
    After SIGTERM the watch then ends, as the signal ended it before (pscluster's own closers of a
    stream send it one: the local transport, and Slurm's srun); after SIGUSR1 it goes on. Each
    line carries this process's pid, which the job record keeps (``watch_pids``).
    """
    import select
    interval = float(req.get("interval", 0.5))
    heartbeat = float(req.get("heartbeat", 1.0))
    ports = {str(key): int(port) for key, port in (req.get("ports") or {}).items()}
    heard = set()           # keys whose port was seen listening (stays so: the server's probe says more)
    offsets = {item["path"]: int(item.get("offset", 0)) for item in req.get("files", [])}
    previous = None
    last_sent = 0.0
    pending = []
    wake_r, wake_w = os.pipe()
    for fd in (wake_r, wake_w):
        os.set_blocking(fd, False)
    signal.set_wakeup_fd(wake_w)        # a signal ends the wait below at once
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, lambda number, frame: pending.append(number))
    while True:
        now = time.time()
        states = [dict(_task_state(rec, now), key=rec["key"]) for rec in req.get("tasks", [])]
        for item in states:
            item.pop("uptime", None)      # changes every beat: not a reason to send
        _mark_listening(states, ports, heard)
        reads = []
        for path, offset in offsets.items():
            try:
                size = os.path.getsize(_expand(path))
            except OSError:
                continue
            if size > offset:
                chunk = op_read({"path": path, "offset": offset, "max": 1 << 20})
                offsets[path] = chunk["end"]
                reads.append(chunk)
        noticed, pending[:] = list(pending), []
        if noticed or reads or states != previous or now - last_sent >= heartbeat:
            data = {"ts": now, "tasks": states, "reads": reads, "pid": os.getpid()}
            if noticed:
                data["notice"] = {"signal": signal.Signals(noticed[0]).name}
            try:
                sys.stdout.write(json.dumps(data) + "\n")
                sys.stdout.flush()
            except (BrokenPipeError, OSError):
                return None
            previous, last_sent = states, now
            if signal.SIGTERM in noticed:
                os._exit(0)
        try:
            select.select([wake_r], [], [], interval)
            os.read(wake_r, 64)
        except (BlockingIOError, InterruptedError):
            pass
        if signal.SIGTERM in pending:
            # At once, as the signal's default did, with the states last sent (no new scan): the
            # scan and the interpreter's teardown took a close of a local stream (pscluster's own
            # SIGTERM) from 4 to 21 ms, median of 20.
            line = {"ts": time.time(), "tasks": previous or [], "reads": [], "pid": os.getpid(),
                    "notice": {"signal": "SIGTERM"}}
            try:
                sys.stdout.write(json.dumps(line) + "\n")
                sys.stdout.flush()
            finally:
                os._exit(0)


def _proc_table():
    """{pid: (state, ppid, session, starttime)} of every live process (one /proc scan)."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/stat" % entry) as handle:
                    text = handle.read()
            except OSError:
                continue
            fields = text[text.rindex(")") + 2:].split()
            if fields[0] not in ("Z", "X"):
                table[int(entry)] = (fields[0], int(fields[1]), int(fields[3]), fields[19])
    return table


def _task_processes(rec, known=None):
    """{pid: starttime} of every live process of one recorded task.

    That is the monitor's session (the task and whatever it started that stayed there, in any
    process group), every descendant of those (a child that called setsid() or setpgid() is
    still one: the monitor is their subreaper), the task itself, and processes seen by an
    earlier scan (``known``) that still have the same start time. Empty if the recorded
    leader's PID now belongs to an unrelated process.
    """
    rec = _resolve(rec)
    if rec.get("pgid") is None:
        return {}
    table = _proc_table()
    leader = table.get(rec["pgid"])
    found = {}
    if leader is None or rec.get("starttime") is None or leader[3] == rec["starttime"]:
        # Linux does not reuse a PID while it names a live session, so its members are ours.
        found.update((pid, info[3]) for pid, info in table.items() if info[2] == rec["pgid"])
    task = table.get(rec.get("pid"))
    if task is not None and task[3] == rec.get("task_starttime"):
        found[rec["pid"]] = task[3]
    for pid, starttime in (known or {}).items():
        if pid in table and table[pid][3] == starttime:
            found[pid] = starttime
    children = {}
    for pid, info in table.items():
        children.setdefault(info[1], []).append(pid)
    stack = list(found)
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found:
                found[child] = table[child][3]
                stack.append(child)
    return found


def _signal_all(processes, sig):
    """Signal each (pid, start time) that is still that process."""
    for pid, starttime in processes.items():
        stat = _proc_stat(pid)
        if stat is not None and stat[3] == starttime:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


def _freeze_and_kill(rec, known):
    """SIGKILL every process of a task, frozen first (SIGSTOP) so none forks away meanwhile."""
    frozen = {}
    for _ in range(20):     # until a scan finds nothing new (a fork in flight adds one more round)
        fresh = {pid: st for pid, st in _task_processes(rec, {**known, **frozen}).items() if pid not in frozen}
        if not fresh:
            break
        _signal_all(fresh, signal.SIGSTOP)
        frozen.update(fresh)
    _signal_all(frozen, signal.SIGKILL)
    return frozen


def _cancel_start(rec):
    """For a record whose start has not written its pid file: make that start never spawn.

    Under the start's lock: either the start already finished (its pid file is there now and
    the record resolves), or the token goes into ``<log>.cancel``, which the start checks.
    """
    log = _expand(rec["log"])
    _private_dirs(os.path.dirname(log))
    lock_fd = _start_lock(log)
    try:
        resolved = _resolve(dict(rec, log=log))
        if resolved.get("pgid") is not None:
            return resolved, False
        with os.fdopen(os.open(log + CANCEL_SUFFIX, os.O_WRONLY | os.O_CREAT | os.O_APPEND | _PRIVATE, 0o600),
                       "a") as handle:
            handle.write(rec["token"] + "\n")
        return rec, True
    finally:
        os.close(lock_fd)


def op_stop(req):
    grace = float(req.get("grace", 10))
    records = []
    results = {}
    for rec in req["tasks"]:
        rec = _resolve(rec)
        cancelled = False
        if rec.get("pgid") is None and rec.get("token") and rec.get("log"):
            rec, cancelled = _cancel_start(rec)
        records.append(rec)
        results[rec["key"]] = {"key": rec["key"], "signals": [], "found": False, "cancelled": cancelled}
    first_signal = getattr(signal, "SIG" + req.get("signal", "TERM"))
    known = {}
    for rec in records:
        known[rec["key"]] = _task_processes(rec)
        if known[rec["key"]]:
            results[rec["key"]]["found"] = True
            _signal_all(known[rec["key"]], first_signal)
            results[rec["key"]]["signals"].append(first_signal.name)
    deadline = time.time() + grace
    pending = [rec for rec in records if results[rec["key"]]["found"]]
    while pending and time.time() < deadline:
        time.sleep(0.05)
        still = []
        for rec in pending:
            now = _task_processes(rec, known[rec["key"]])
            if now:
                if first_signal != signal.SIGKILL:
                    _signal_all({p: s for p, s in now.items() if p not in known[rec["key"]]}, first_signal)
                known[rec["key"]].update(now)
                still.append(rec)
        pending = still
    for rec in pending:
        if _task_processes(rec, known[rec["key"]]):
            known[rec["key"]].update(_freeze_and_kill(rec, known[rec["key"]]))
            results[rec["key"]]["signals"].append("SIGKILL")
    deadline = time.time() + 5
    while pending and time.time() < deadline:
        pending = [rec for rec in pending if _task_processes(rec, known[rec["key"]])]
        if pending:
            time.sleep(0.05)
    for rec in records:
        results[rec["key"]]["survivors"] = sorted(_task_processes(rec, known[rec["key"]]))
        results[rec["key"]]["exit"] = _read_exit(rec["exit_file"]) if rec.get("exit_file") else None
    return {"tasks": list(results.values())}


def op_signal(req):
    """Send one signal to recorded tasks (every process of each) or to single task processes
    (fault tests, Ctrl-C)."""
    sig = getattr(signal, "SIG" + req["signal"])
    sent = []
    for rec in map(_resolve, req["tasks"]):
        if req.get("task_only"):
            if rec.get("pid") and _alive(rec["pid"], rec.get("task_starttime")):
                os.kill(rec["pid"], sig)
                sent.append(rec["key"])
        else:
            processes = _task_processes(rec)
            if processes:
                _signal_all(processes, sig)
                sent.append(rec["key"])
    return {"sent": sent}


def op_read(req):
    path = _expand(req["path"])
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            offset = req.get("offset", 0)
            if offset < 0:
                offset = max(0, size + offset)
            handle.seek(offset)
            data = handle.read(req.get("max", 1 << 20))
    except FileNotFoundError:
        return {"path": req["path"], "exists": False, "size": 0, "offset": 0, "end": 0, "data": ""}
    return {"path": req["path"], "exists": True, "size": size, "offset": offset, "end": offset + len(data),
            "data": data.decode("utf-8", "replace")}


def op_hashes(req):
    """Each file's sha256 below ``root`` (None: not there), and the files group or others may
    read or write (``open``): a file kept private on the control machine is sent again when its
    copy here is not (issue 42, M1: a copy made 0644 before stays 0644 while its content is the same)."""
    import hashlib
    import stat
    root = _expand(req["root"])
    result = {}
    shared = []
    for rel in req["files"]:
        path = _below(root, rel)     # ../x or /etc/x is refused, never read (issue 42, M2)
        try:
            with open(path, "rb") as handle:
                result[rel] = hashlib.sha256(handle.read()).hexdigest()
                if stat.S_IMODE(os.fstat(handle.fileno()).st_mode) & 0o077:
                    shared.append(rel)
        except OSError:
            result[rel] = None
    return {"root": root, "hashes": result, "open": shared}


def op_fsid(req):
    """The id of the filesystem holding ``root``: a random id in ``root/.pscluster/fsid``, written
    by the first host that looks (hard link of a private temp file: exactly one writer wins) and
    read by every other host that shares the folder (NFS home, or the control machine's disk)."""
    import uuid
    root = _expand(req["root"])
    folder = os.path.join(root, RUN_ROOT)
    os.makedirs(folder, exist_ok=True)
    marker = os.path.join(folder, "fsid")
    if not os.path.exists(marker):
        tmp = "%s.%s.tmp" % (marker, uuid.uuid4().hex)
        with open(tmp, "w") as handle:
            handle.write(uuid.uuid4().hex)
        try:
            os.link(tmp, marker)
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    with open(marker) as handle:
        return {"root": root, "fsid": handle.read().strip()}


RELAY_BEAT = 1.0              # seconds between a relay's lines: a closed reader ends it within one
RELAY_NOT_HERE = (1 << 64) - 1   # the length a relay sends for a digest it does not serve


def _below(root, rel):
    """``root/rel`` for a name that stays below ``root`` (issue 42, M2); ValueError otherwise."""
    normal = os.path.normpath(rel) if isinstance(rel, str) and rel else ".."
    if os.path.isabs(normal) or normal == ".." or normal.startswith("../") or "\0" in normal:
        raise ValueError("refusing %r: not below the workdir %s" % (rel, root))
    return os.path.join(root, normal)


def _file_digest(path):
    import hashlib
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _recv_exact(sock, size):
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(min(size - len(data), 1 << 20))
        if not chunk:
            raise EOFError("the peer closed the connection")
        data += chunk
    return bytes(data)


def _relay_fetch(sock, sha, size, path):
    """One file from a relay peer into ``path`` (a temporary name, then renamed): the peer's
    bytes are kept only when they are exactly ``size`` bytes with the manifest's sha256."""
    import hashlib
    import struct
    sock.sendall(sha.encode())
    (length,) = struct.unpack(">Q", _recv_exact(sock, 8))
    if length == RELAY_NOT_HERE:
        raise LookupError("the peer does not have it")
    if length != size:
        raise ValueError("the peer offered %d bytes, the manifest says %d" % (length, size))
    digest = hashlib.sha256()
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    tmp = "%s.pscluster-tmp-%d" % (path, os.getpid())
    try:
        with open(tmp, "wb") as handle:
            left = length
            while left:
                chunk = sock.recv(min(left, 1 << 20))
                if not chunk:
                    raise EOFError("the peer closed the connection")
                digest.update(chunk)
                handle.write(chunk)
                left -= len(chunk)
        if digest.hexdigest() != sha:
            raise ValueError("the peer's bytes do not match the manifest's sha256")
        return tmp
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _relay_connect(address, port, token, timeout):
    """A connection to a relay peer, authenticated: its nonce answered with HMAC-SHA256(token)."""
    import hashlib
    import hmac
    import socket
    sock = socket.create_connection((address, port), timeout=timeout)
    try:
        nonce = _recv_exact(sock, 16)
        sock.sendall(hmac.new(token, nonce, hashlib.sha256).digest())
        return sock
    except BaseException:
        sock.close()
        raise


def _relay_serve(listener, token, served):
    """Accept relay peers until the process ends: each connection must answer a nonce with
    HMAC-SHA256(token) and then asks for files by their sha256; only the digests of ``served``
    (this host's verified copies) are answered."""
    import hashlib
    import hmac
    import struct
    import threading

    def handle(conn):
        try:
            conn.settimeout(60)
            nonce = os.urandom(16)
            conn.sendall(nonce)
            if not hmac.compare_digest(_recv_exact(conn, 32), hmac.new(token, nonce, hashlib.sha256).digest()):
                return
            while True:
                try:
                    wanted = _recv_exact(conn, 64).decode("ascii", "replace")
                except EOFError:
                    return
                path = served.get(wanted)
                if path is None:
                    conn.sendall(struct.pack(">Q", RELAY_NOT_HERE))
                    continue
                with open(path, "rb") as handle:
                    size = os.fstat(handle.fileno()).st_size
                    conn.sendall(struct.pack(">Q", size))
                    conn.sendfile(handle)
        except (OSError, EOFError):
            pass
        finally:
            conn.close()

    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


def op_relay(req):
    """Code sync through peers (issue 46): bring ``files`` (``[rel, sha256, size, mode]``) up to
    date under ``root`` from the relay ``peers`` (``[address, port]``, tried in order; none: the
    files must be here already, a seed the orchestrator copied to), then, with ``serve``, serve
    this host's verified copies to other hosts on an ephemeral port. One JSON line says what
    happened (``fetched``, ``bytes``, ``unchanged``, ``port``; or ``error``); then it serves until
    the reader goes away (the orchestrator closed the channel, or its connection broke: the
    pipe's hang-up ends it at once, a failed heartbeat line every ``RELAY_BEAT`` at the latest)
    or ``seconds`` passed. A peer is trusted with nothing: its
    bytes are kept only with the manifest's size and sha256, and a peer that fails is left for
    the next. Only a client that proves the ``token`` (HMAC of a nonce) is served."""
    try:
        result, listener = _relay_fetch_all(req)
    except Exception as exc:  # one line the orchestrator reads, never a traceback
        result, listener = {"error": "%s: %s" % (type(exc).__name__, exc)}, None
    deadline = time.monotonic() + float(req.get("seconds", 600))
    line = json.dumps(result)
    while True:
        try:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
        except (BrokenPipeError, OSError):
            os._exit(0)
        if listener is None or time.monotonic() >= deadline or _reader_gone(RELAY_BEAT):
            os._exit(0)
        line = json.dumps({"beat": time.time()})


def _reader_gone(seconds):
    """Whether stdout's reader went away, waiting up to ``seconds`` for it to (a closed pipe or
    socket shows as an error or hang-up at once, not at the next write)."""
    import select
    poller = select.poll()
    poller.register(sys.stdout.fileno(), select.POLLERR | select.POLLHUP)
    try:
        return any(events & (select.POLLERR | select.POLLHUP | select.POLLNVAL)
                   for _, events in poller.poll(seconds * 1000))
    except InterruptedError:
        return False


def _relay_fetch_all(req):
    """``op_relay``'s fetch, and its listener when it serves: (the result line, the listener)."""
    import socket
    import threading
    root = _expand(req["root"])
    token = bytes.fromhex(req["token"])
    timeout = float(req.get("timeout", 5))
    wanted, served, unchanged = [], {}, 0
    for rel, sha, size, mode in req["files"]:
        path = _below(root, rel)
        try:
            same = os.path.getsize(path) == size and _file_digest(path) == sha
        except OSError:
            same = False
        if same:
            unchanged += 1
            if mode is not None and _stat_mode(path) != mode:
                os.chmod(path, mode)
            served[sha] = path
        else:
            wanted.append((rel, sha, int(size), mode, path))
    fetched, moved, used, errors = 0, 0, None, []
    peers = [tuple(peer) for peer in req.get("peers", [])]
    if wanted and not peers:
        return {"error": "%d file(s) missing or different here, and no peer to fetch them from" % len(wanted)}, None
    sock = None
    for rel, sha, size, mode, path in wanted:
        while True:
            if sock is None:
                if not peers:
                    return {"error": "no relay peer could send %s: %s" % (rel, "; ".join(errors[-3:]))}, None
                address, port = peers[0]
                try:
                    sock = _relay_connect(address, port, token, timeout)
                    used = "%s:%d" % (address, port)
                except (OSError, EOFError) as exc:
                    errors.append("%s:%d %s" % (address, port, exc))
                    peers.pop(0)
                    continue
            try:
                tmp = _relay_fetch(sock, sha, size, path)
            except (OSError, EOFError, LookupError, ValueError) as exc:
                errors.append("%s %s: %s" % (used, rel, exc))
                sock.close()
                sock = None
                peers.pop(0)
                continue
            os.chmod(tmp, mode if mode is not None else 0o644)
            os.rename(tmp, path)
            served[sha] = path
            fetched += 1
            moved += size
            break
    if sock is not None:
        sock.close()
    result = {"fetched": fetched, "bytes": moved, "unchanged": unchanged, "peer": used, "skipped_peers": errors}
    listener = None
    if req.get("serve"):
        bind = req.get("bind", "")
        listener = socket.socket(socket.AF_INET6 if ":" in bind else socket.AF_INET)
        listener.bind((bind, 0))
        listener.listen(64)
        result["port"] = listener.getsockname()[1]
        threading.Thread(target=_relay_serve, args=(listener, token, served), daemon=True).start()
    return result, listener


def _stat_mode(path):
    import stat
    return stat.S_IMODE(os.stat(path).st_mode)


# Run by the host's interpreter with its site-packages (hostctl itself runs with -I -S) in the
# program's folder, which is sys.path[0] for ``python -c`` as for ``python SCRIPT``.
_FIND_SPECS = """import importlib.util, json, sys
found = {}
for name in json.loads(sys.argv[1]):
    try:
        found[name] = importlib.util.find_spec(name) is not None
    except Exception:  # a parent that fails to import: the program would fail too, but say found
        found[name] = True
sys.stdout.write(json.dumps(found))
"""


def op_program(req):
    """What ``run`` checks on each host before its program starts, in one call: the paths the
    command needs exist (relative to ``cwd``), its program is on the PATH (``tools``), the
    modules it imports resolve for this interpreter from the script's folder (with the task's
    ``PYTHONPATH``), and, for legacy Keras, TensorFlow's and tf-keras' versions."""
    cwd = _expand(req.get("cwd") or ".")
    result = {"missing": [path for path in req.get("paths", [])
                          if not os.path.exists(os.path.join(cwd, os.path.expanduser(path)))]}
    result["tools"] = {tool: any(os.access(os.path.join(d, tool), os.X_OK) for d in
                                 os.environ.get("PATH", "").split(os.pathsep))
                       for tool in req.get("tools", [])}
    modules = req.get("modules") or []
    if modules:
        import subprocess
        env = dict(os.environ)
        if req.get("pythonpath") is not None:
            env["PYTHONPATH"] = req["pythonpath"]
        folder = os.path.join(cwd, os.path.expanduser(req.get("script_dir") or "."))
        try:
            out = subprocess.run([sys.executable, "-c", _FIND_SPECS, json.dumps(modules)],
                                 cwd=folder if os.path.isdir(folder) else cwd, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
            result["modules"] = json.loads(out.stdout.decode() or "{}")
            if out.returncode:
                result["modules_error"] = out.stderr.decode(errors="replace")[-2000:]
        except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
            result["modules"], result["modules_error"] = {}, "%s: %s" % (type(exc).__name__, exc)
    if req.get("tf_keras"):
        result["tensorflow"] = _tensorflow_dist()
        result["tf_keras"] = _find_dist(("tf-keras", "tf_keras"), "tf_keras")
    return result


def op_listen(req):
    """Short-lived listeners on the planned ports, for the host-to-host reach check: a detached
    child binds them, accepts and drops connections for ``seconds``, then exits; this call
    returns once they are bound. Ports that cannot be bound (in use) are reported, not checked."""
    import socket
    bound, failed, sockets = [], {}, []
    for port in req["ports"]:
        try:
            sock = socket.socket(socket.AF_INET6 if ":" in req.get("address", "") else socket.AF_INET)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((req.get("bind", ""), port))
            sock.listen(64)
            sockets.append(sock)
            bound.append(port)
        except OSError as exc:
            failed[str(port)] = exc.strerror or str(exc)
    child = os.fork() if sockets else None
    if child == 0:
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        import select
        deadline = time.monotonic() + float(req.get("seconds", 15))
        while time.monotonic() < deadline:
            ready, _, _ = select.select(sockets, [], [], max(0.0, deadline - time.monotonic()))
            for sock in ready:
                try:
                    sock.accept()[0].close()
                except OSError:
                    pass
        os._exit(0)
    for sock in sockets:
        sock.close()
    stat = _proc_stat(child) if child else None
    return {"bound": bound, "failed": failed, "pid": child, "starttime": stat[3] if stat else None}


def op_unlisten(req):
    """End the listeners of ``listen`` (pid and its start time checked), ports free on return."""
    import signal
    pid = req.get("pid")
    if not pid or not _alive(pid, req.get("starttime")):
        return {"stopped": False}
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return {"stopped": True}


def op_connect(req):
    """TCP connections from this host to each ``[address, port]`` but those in ``skip``: "ok",
    "refused", "timed out" (``failed_only``: only the others, and how many were "ok")."""
    import socket
    import threading
    results = {}

    def one(address, port):
        try:
            socket.create_connection((address, port), timeout=float(req.get("timeout", 3))).close()
            results["%s:%d" % (address, port)] = "ok"
        except socket.timeout:
            results["%s:%d" % (address, port)] = "timed out"
        except ConnectionRefusedError:
            results["%s:%d" % (address, port)] = "refused"
        except OSError as exc:
            results["%s:%d" % (address, port)] = exc.strerror or str(exc)

    skip = set((address, port) for address, port in req.get("skip", ()))      # its own ports
    threads = [threading.Thread(target=one, args=(address, port)) for address, port in req["targets"]
               if (address, port) not in skip]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if req.get("failed_only"):      # the "ok"s counted, not listed: N hosts would send N² of them
        failed = {target: outcome for target, outcome in results.items() if outcome != "ok"}
        return {"results": failed, "ok": len(results) - len(failed)}
    return {"results": results}


def op_find(req):
    """Files under ``root`` (at most ``depth`` folders down) whose name contains ``contains``:
    e.g. the TensorBoard event files of a run folder, before TensorBoard is started on it."""
    root = _expand(req["root"])
    depth, found = req.get("depth", 2), []
    if not os.path.isdir(root):
        return {"root": root, "exists": False, "files": []}
    for folder, subfolders, files in os.walk(root):
        level = os.path.relpath(folder, root).count(os.sep) + (folder != root)
        if level >= depth:
            subfolders[:] = []
        found.extend(os.path.relpath(os.path.join(folder, name), root)
                     for name in files if req.get("contains", "") in name)
        if len(found) >= req.get("max", 1000):
            break
    return {"root": root, "exists": True, "files": sorted(found)[:req.get("max", 1000)]}


def op_remove(req):
    removed = []
    for path in req["paths"]:
        path = _expand(path)
        try:
            os.unlink(path)
            removed.append(path)
        except FileNotFoundError:
            pass
    return {"removed": removed}


def op_tell(req):
    """Hand a running trainer a request (roles/membership.py): ``data`` as JSON in the file
    beside its events file, ``<events>.membership``, replaced at once (the trainer reads it whole
    or not at all)."""
    events = _expand(req["events"])
    _write_json(events + ".membership", req["data"])
    return {"told": events + ".membership"}

def op_remove_job_dirs(req):
    """Remove job folders (``<workdir>/.pscluster/<cluster>/job-<N>``, a finished run's logs) and
    everything in them. Anything else is refused: this deletes trees, so it takes only paths of
    that one shape, and never follows a symbolic link out of them."""
    import re
    import shutil
    removed, refused = [], []
    for path in req["paths"]:
        path = _expand(path)
        parts = path.split(os.sep)
        if len(parts) < 4 or parts[-3] != RUN_ROOT or not re.match(r"^job-[0-9]+$", parts[-1]) \
                or parts[-2] in ("", ".", ".."):
            refused.append(path)
            continue
        run_dir = os.path.dirname(path)
        if os.path.islink(run_dir) or os.path.islink(os.path.dirname(run_dir)):
            refused.append(path)            # .pscluster or the cluster's folder swapped for a link
            continue
        if os.path.islink(path) or not os.path.isdir(path):
            continue
        shutil.rmtree(path)
        removed.append(path)
    return {"removed": removed, "refused": refused}


def op_nft(req):
    """Apply an nftables ruleset (one atomic transaction), as root or through ``sudo -n``."""
    import subprocess
    prefix = [] if os.getuid() == 0 else ["sudo", "-n"]
    proc = subprocess.run(prefix + ["nft", "-f", "-"], input=req["ruleset"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True)
    tables = subprocess.run(prefix + ["nft", "list", "tables"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, universal_newlines=True)
    return {"exit_code": proc.returncode, "stderr": proc.stderr,
            "tables": tables.stdout.split("\n") if tables.returncode == 0 else None}


def op_resolve(req):
    """Every address (all A and AAAA results) of each name, as this host resolves it, each name
    in a thread of its own and all within ``timeout`` seconds (getaddrinfo has no timeout: a dead
    DNS server held ``up`` for minutes); a name without an answer by then is an error."""
    import socket
    import threading
    resolved = {}
    timeout = float(req.get("timeout", 5.0))

    todo = list(req["names"])

    def worker():
        while True:
            try:
                name = todo.pop()
            except IndexError:
                return
            try:
                infos = socket.getaddrinfo(name, None, 0, socket.SOCK_STREAM)
            except (socket.gaierror, UnicodeError, OSError) as exc:
                resolved[name] = {"error": getattr(exc, "strerror", None) or str(exc)}
                continue
            resolved[name] = {"addresses": sorted({info[4][0].split("%")[0] for info in infos})}

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(32, len(todo)))]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    answers = dict(resolved)       # a late answer must not change the dict while it is copied
    return {"resolved": {name: answers.get(name, {"error": "no answer within %g s" % timeout})
                         for name in req["names"]}}


def op_addresses(req):
    """The addresses of this host's interfaces but loopback: ``ip -o addr`` (every address, the
    secondary ones too), else /proc/net/if_inet6 and the interfaces' primary IPv4 addresses."""
    import ipaddress
    import subprocess
    found = set()
    try:
        out = subprocess.run(["ip", "-o", "addr", "show"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             universal_newlines=True, timeout=10).stdout
        for line in out.splitlines():
            words = line.split()
            found.update(words[i + 1].split("/")[0] for i, word in enumerate(words[:-1]) if word in ("inet", "inet6"))
    except (OSError, subprocess.SubprocessError):
        pass
    if not found:
        try:
            with open("/proc/net/if_inet6") as handle:
                for line in handle:
                    raw = line.split()[0]
                    found.add(":".join(raw[i:i + 4] for i in range(0, 32, 4)))
        except OSError:
            pass
        import fcntl
        import socket
        import struct
        for _, name in socket.if_nameindex():
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                try:
                    packed = fcntl.ioctl(sock.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
                except OSError:
                    continue
                found.add(socket.inet_ntoa(packed[20:24]))
    addresses = set()
    for text in found:
        try:
            address = ipaddress.ip_address(text.split("%")[0])
        except ValueError:
            continue
        if not address.is_loopback:
            addresses.add(str(address))
    return {"addresses": sorted(addresses)}


OPERATIONS = {"facts": op_facts, "program": op_program, "start": op_start, "adopt": op_adopt, "start_many": op_start_many,
              "status": op_status, "stop": op_stop,
              "signal": op_signal, "read": op_read, "find": op_find, "hashes": op_hashes, "remove": op_remove,
              "remove_job_dirs": op_remove_job_dirs, "fsid": op_fsid, "listen": op_listen,
              "connect": op_connect, "unlisten": op_unlisten, "tell": op_tell,
              "nft": op_nft, "watch": op_watch, "relay": op_relay, "resolve": op_resolve, "addresses": op_addresses}


def main():
    request = json.loads(sys.stdin.buffer.read().decode() or "{}")
    operation = OPERATIONS[sys.argv[-1]]
    try:
        result = operation(request)
    except Exception as exc:  # report, never a traceback the orchestrator cannot parse
        result = {"error": "%s: %s" % (type(exc).__name__, exc)}
    if result is None:        # a streaming operation that already wrote its output
        return
    sys.stdout.write(json.dumps(result))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
