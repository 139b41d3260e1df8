"""Host-side control program of pscluster (standard library only; never imports TensorFlow).

The orchestrator does not install this file on hosts before using it: a one-line ``python -c``
bootstrap reads this source, compressed, from stdin, and the JSON request follows it there (so
nothing secret is on a command line); the answer is one JSON object on stdout. Operations:

``facts``   interpreter, TensorFlow distribution and version (from package metadata, without the
            3 s import), busy ports, GPUs (``nvidia-smi -L``), workdir writability.
``start``   start one task detached: a monitor process becomes session and group leader
            (pgid = its pid), starts the task in its group with output to the log file, and
            writes the task's exit status to ``<log>.exit`` when it ends.
``status``  per recorded task: running / frozen / exited (with code or signal) / gone.
``watch``   the same, streamed as JSON lines with new bytes of event files (supervision).
``stop``    SIGTERM each recorded process group, wait up to a grace period, SIGKILL what is
            left, verify; only groups whose leader's start time matches the record.
``read``    bytes of a file from an offset (logs, event files).
``hashes``  sha256 of files under a directory (code sync sends only what changed).
``nft``     apply or delete an nftables ruleset (the firewall feature).
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


def _session_members(sid):
    """Live processes of a session (used when its leader is gone but members remain)."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _proc_stat(int(entry))
            if stat and stat[2] == sid and stat[0] not in ("Z", "X"):
                members.append(int(entry))
    return members


TF_DISTS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tf-nightly", "tf-nightly-cpu",
            "tensorflow-intel", "tensorflow-macos")


def _tensorflow_dist():
    """(distribution, version, importable) of TensorFlow for this interpreter, without importing it.

    Scans the interpreter's site-packages for ``*.dist-info`` first (a millisecond); only if
    that finds nothing does it load ``site`` and ask ``importlib.metadata`` (tens of ms).
    """
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
    wanted = {name.replace("-", "_") for name in TF_DISTS}
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
                importable = any(os.path.exists(os.path.join(f, "tensorflow", "__init__.py")) for f in folders)
                return {"dist": name.lower().replace("_", "-"), "version": version, "importable": importable}
    import site
    site.main()
    try:
        from importlib import metadata
        import importlib.util
    except ImportError:  # pragma: no cover - Python < 3.8
        return None
    for dist in TF_DISTS:
        try:
            version = metadata.version(dist)
        except Exception:  # PackageNotFoundError
            continue
        return {"dist": dist, "version": version,
                "importable": importlib.util.find_spec("tensorflow") is not None}
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


def op_facts(req):
    import socket
    result = {"python": sys.version.split()[0], "executable": sys.executable,
              "hostname": socket.gethostname(), "cpus": os.cpu_count()}
    tf = _tensorflow_dist()
    result["tensorflow"] = tf
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
    workdir = req.get("workdir")
    if workdir:
        path = _expand(workdir)
        try:
            os.makedirs(path, exist_ok=True)
            probe = os.path.join(path, ".pscluster-write-test-%d" % os.getpid())
            with open(probe, "w") as handle:
                handle.write("ok")
            os.unlink(probe)
            result["workdir_error"] = None
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


def op_start(req):
    cwd = _expand(req["cwd"])
    log = _expand(req["log"])
    exit_file = log + ".exit"
    os.makedirs(os.path.dirname(log), exist_ok=True)
    # Each attempt starts clean: a name reused by a later cluster or job must not show old lines.
    for stale in [exit_file, log + ".pid"] + [_expand(path) for path in req.get("fresh", [])]:
        if os.path.exists(stale):
            os.unlink(stale)
    env = dict(os.environ) if req.get("inherit_env", True) else {}
    env.update(req.get("env", {}))   # arrives on stdin: secret values never touch argv
    import subprocess
    read_end, write_end = os.pipe()
    monitor = os.fork()
    if monitor == 0:  # monitor: session leader, parent of the task
        try:
            os.close(read_end)
            os.setsid()
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
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
                      "started": time.time(), "log": log, "exit_file": exit_file}
            # Written before anyone is told: an orchestrator killed right now still finds it.
            _write_json(log + ".pid", record)
            os.write(write_end, json.dumps(record).encode())
            os.close(write_end)
            code = task.wait()
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


def op_start_many(req):
    """Start several tasks in one call (one per host and ``up``, not one per task)."""
    return {"started": [op_start(item) for item in req["tasks"]]}


def _write_json(path, data):
    tmp = path + ".tmp%d" % os.getpid()
    with open(tmp, "w") as handle:
        json.dump(data, handle)
    os.replace(tmp, path)


def _read_exit(path):
    try:
        with open(_expand(path)) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def _resolve(rec):
    """Fill pid/pgid from the pid file when the orchestrator died before recording them."""
    if rec.get("pgid") is None and rec.get("log"):
        found = _read_exit(rec["log"] + ".pid")
        if found:
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


def op_watch(req):
    """Stream task states and new file bytes as JSON lines until the reader goes away.

    A line goes out when a state changes, a watched file grew, or ``heartbeat`` seconds
    passed; the orchestrator treats a silent channel as a lost host. Ends when stdout is
    closed (EPIPE), so it never outlives the orchestrator's connection by more than a beat.
    """
    interval = float(req.get("interval", 0.5))
    heartbeat = float(req.get("heartbeat", 1.0))
    offsets = {item["path"]: int(item.get("offset", 0)) for item in req.get("files", [])}
    previous = None
    last_sent = 0.0
    while True:
        now = time.time()
        states = [dict(_task_state(rec, now), key=rec["key"]) for rec in req.get("tasks", [])]
        for item in states:
            item.pop("uptime", None)      # changes every beat: not a reason to send
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
        if reads or states != previous or now - last_sent >= heartbeat:
            line = json.dumps({"ts": now, "tasks": states, "reads": reads}) + "\n"
            try:
                sys.stdout.write(line)
                sys.stdout.flush()
            except (BrokenPipeError, OSError):
                return None
            previous, last_sent = states, now
        time.sleep(interval)


def _group_members(rec):
    """Live processes in the recorded group, checking the leader is the one we started."""
    rec = _resolve(rec)
    if rec.get("pgid") is None:
        return []
    leader_ok = _alive(rec["pgid"], rec.get("starttime"))
    stat = _proc_stat(rec["pgid"])
    if stat is not None and not leader_ok and stat[0] not in ("Z", "X"):
        return []   # the PID was reused by an unrelated process: never touch it
    # Linux does not reuse a PID while it names a live session, so members are ours.
    return _session_members(rec["pgid"])


def op_stop(req):
    grace = float(req.get("grace", 10))
    records = [_resolve(rec) for rec in req["tasks"]]
    first_signal = getattr(signal, "SIG" + req.get("signal", "TERM"))
    results = {rec["key"]: {"key": rec["key"], "signals": [], "found": False} for rec in records}
    for rec in records:
        members = _group_members(rec)
        if members:
            results[rec["key"]]["found"] = True
            _kill_group(rec["pgid"], members, first_signal)
            results[rec["key"]]["signals"].append(first_signal.name)
    deadline = time.time() + grace
    pending = [rec for rec in records if results[rec["key"]]["found"]]
    while pending and time.time() < deadline:
        time.sleep(0.05)
        pending = [rec for rec in pending if _group_members(rec)]
    for rec in pending:
        members = _group_members(rec)
        if members:
            _kill_group(rec["pgid"], members, signal.SIGKILL)
            results[rec["key"]]["signals"].append("SIGKILL")
    deadline = time.time() + 5
    while pending and time.time() < deadline:
        pending = [rec for rec in pending if _group_members(rec)]
        if pending:
            time.sleep(0.05)
    for rec in records:
        survivors = _group_members(rec)
        results[rec["key"]]["survivors"] = survivors
        results[rec["key"]]["exit"] = _read_exit(rec["exit_file"]) if rec.get("exit_file") else None
    return {"tasks": list(results.values())}


def _kill_group(pgid, members, sig):
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        for pid in members:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


def op_signal(req):
    """Send one signal to recorded groups or single task processes (fault tests, Ctrl-C)."""
    sig = getattr(signal, "SIG" + req["signal"])
    sent = []
    for rec in map(_resolve, req["tasks"]):
        if req.get("task_only"):
            if rec.get("pid") and _alive(rec["pid"], rec.get("task_starttime")):
                os.kill(rec["pid"], sig)
                sent.append(rec["key"])
        elif _group_members(rec):
            _kill_group(rec["pgid"], _group_members(rec), sig)
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
    import hashlib
    root = _expand(req["root"])
    result = {}
    for rel in req["files"]:
        path = os.path.join(root, rel)
        try:
            with open(path, "rb") as handle:
                result[rel] = hashlib.sha256(handle.read()).hexdigest()
        except OSError:
            result[rel] = None
    return {"root": root, "hashes": result}


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


OPERATIONS = {"facts": op_facts, "start": op_start, "start_many": op_start_many, "status": op_status, "stop": op_stop,
              "signal": op_signal, "read": op_read, "hashes": op_hashes, "remove": op_remove,
              "nft": op_nft, "watch": op_watch}


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
