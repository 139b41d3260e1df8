"""A real Docker engine for tests and benchmarks, that leaves the machine as it found it.

:class:`Engine` starts its own ``dockerd`` (own data root, exec root, pid file and socket), so it
never touches a daemon the machine already runs, and on :meth:`Engine.stop` it

* removes every container and user network it made (``docker rm -f``, ``docker network rm``),
* stops dockerd by its recorded pid (never by name),
* deletes the iptables rules and chains dockerd added (filter and nat: ``DOCKER*`` chains, the
  rules naming ``docker0``/``br-*``/its address pools) and restores the FORWARD policy,
* deletes ``docker0`` and the ``br-*`` bridges it left behind,
* restores ``net.ipv4.ip_forward``.

Platform facts it is built on (docs/platform-notes.md, D1-D6): ``ip_forward`` must be 1 *before*
dockerd starts (otherwise dockerd sets the FORWARD policy to DROP, which also drops our
network-namespace labs' bridged traffic); the Debian client ``/usr/bin/docker`` and
``docker-compose`` v1 are used (a newer client earlier on PATH may lack the compose and buildx
plugins); no registry is reachable, so the base image is made with debootstrap
(:func:`ensure_base_image`, the same recipe as scripts/docker-base.sh).

Addresses: docker0 and every network dockerd allocates live in 198.18.0.0/15 (RFC 2544's
benchmarking range), never in 172.16/12, the default that our machines must not target.

The data root (images and the build cache) is kept between runs under
``/var/cache/pscluster-dockerlab`` (``PSCLUSTER_DOCKER_CACHE``), so the base and node images are
built once per machine; ``python -m testbed.dockerlab purge`` removes it. Only one engine runs
per machine at a time (a lock file): two dockerds would fight over the same iptables chains.

CLI::

    python -m testbed.dockerlab up --dir /tmp/dock     # prints JSON (DOCKER_HOST ...); stays up
    python -m testbed.dockerlab down --dir /tmp/dock
    python -m testbed.dockerlab image                  # start, build the node image, report, stop
    python -m testbed.dockerlab purge
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import pathlib
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import IO, Iterator, Mapping, Sequence

__all__ = ["DockerUnavailable", "Engine", "wait_for", "ensure_base_image", "build_node_image", "extra_ca_bundle",
           "check_available", "DOCKER", "COMPOSE", "BASE_IMAGE", "NODE_IMAGE"]

DOCKER = "/usr/bin/docker"
COMPOSE = "docker-compose"
DOCKERD = "dockerd"
BASE_IMAGE = "local/debian:bookworm"
NODE_IMAGE = "pscluster-node:tf2.21.0-cpu"
BRIDGE_IP = "198.18.100.1/24"
ADDRESS_POOL = "base=198.18.128.0/17,size=24"
CACHE = pathlib.Path(os.environ.get("PSCLUSTER_DOCKER_CACHE", "/var/cache/pscluster-dockerlab"))
MACHINE_LOCK = pathlib.Path("/run/pscluster-dockerlab.lock")
REPO = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("docker.io", "docker-compose", "debootstrap", "iptables")


class DockerUnavailable(RuntimeError):
    """Docker cannot be run here (not root, packages missing, no iptables); tests skip with this."""


def _run(argv: Sequence[str], *, check: bool = True, env: Mapping[str, str] | None = None,
         timeout: float = 120, input: bytes | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(argv), capture_output=True, env=dict(env) if env is not None else None,
                          timeout=timeout, input=input)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): "
                           f"{(proc.stderr or proc.stdout).decode('utf-8', 'replace').strip()[-2000:]}")
    return proc


def check_available(*, install: bool = True) -> None:
    """Raise :class:`DockerUnavailable` with the reason unless an engine can be started here.

    As root with apt-get, missing packages are installed (what scripts/bootstrap.sh installs).
    """
    if os.geteuid() != 0:
        raise DockerUnavailable("not root: starting dockerd and changing iptables needs root")
    missing = [package for package, binary in zip(PACKAGES, (DOCKER, COMPOSE, "debootstrap", "iptables"))
               if not (os.path.isfile(binary) or shutil.which(binary))]
    if shutil.which(DOCKERD) is None and "docker.io" not in missing:
        missing.append("docker.io")
    if missing and install and shutil.which("apt-get"):
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        _run(["apt-get", "update", "-qq"], check=False, env=env, timeout=600)
        proc = _run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], check=False,
                    env=env, timeout=900)
        if proc.returncode != 0:
            raise DockerUnavailable(f"could not install {' '.join(missing)}: "
                                    f"{proc.stderr.decode('utf-8', 'replace').strip()[-300:]}")
        return check_available(install=False)
    if missing:
        raise DockerUnavailable(f"missing Debian packages: {' '.join(missing)} (apt-get install {' '.join(missing)})")
    if not os.path.exists("/proc/sys/net/ipv4/ip_forward"):
        raise DockerUnavailable("no /proc/sys/net/ipv4/ip_forward: not a Linux network stack dockerd can use")


def _read(path: str) -> str:
    with open(path) as handle:
        return handle.read().strip()


def _write(path: str, value: str) -> None:
    with open(path, "w") as handle:
        handle.write(value)


def _links() -> set[str]:
    out = _run(["ip", "-o", "link", "show"], check=False).stdout.decode()
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line}


def _rules(table: str) -> list[str]:
    return _run(["iptables", "-t", table, "-S"], check=False).stdout.decode().splitlines()


def _ours(rule: str) -> bool:
    """A rule dockerd adds: it names a DOCKER chain, docker0, a br-* bridge, or its address pools."""
    return bool(re.search(r"DOCKER|docker0|\bbr-[0-9a-f]{12}\b|198\.18\.(100|1[2-9]\d|2[0-5]\d)\.", rule))


def _dockerd_running() -> bool:
    """Whether any dockerd runs on this machine (read from /proc; nothing is signalled)."""
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "dockerd" and _alive(int(entry.name)):
                    return True     # (a killed one not yet waited for is a zombie: not running)
            except OSError:
                continue
    return False


def reap_leftovers() -> list[str]:
    """Undo what a dockerd of an earlier run left on the machine when it was killed with that run
    (CI's time limit ends the suite wherever it is; the next run then found dockerd's rules and a
    bridge of the killed run, took them for the machine's own, and its engine test failed): the
    iptables rules and DOCKER chains dockerd adds, docker0 and br-* bridges. Only while no dockerd
    runs at all (a running one, the system's, owns them). What was removed, for the log."""
    if _dockerd_running():
        return []
    removed = []
    for table in ("filter", "nat"):
        for rule in _rules(table):
            if rule.startswith("-A ") and _ours(rule):
                _run(["iptables", "-t", table, *shlex.split(rule.replace("-A ", "-D ", 1))], check=False)
                removed.append(f"{table}: {rule}")
        chains = [rule.split()[1] for rule in _rules(table) if rule.startswith("-N ") and "DOCKER" in rule]
        for chain in chains:
            _run(["iptables", "-t", table, "-F", chain], check=False)
        for chain in chains:
            _run(["iptables", "-t", table, "-X", chain], check=False)
            removed.append(f"{table}: chain {chain}")
    for link in sorted(_links()):
        if link == "docker0" or re.fullmatch(r"br-[0-9a-f]{12}", link):
            _run(["ip", "link", "delete", link], check=False)
            removed.append(f"link {link}")
    return removed


@dataclass
class Engine:
    """One dockerd of our own; use as a context manager or call :meth:`start`/:meth:`stop`."""

    state_dir: pathlib.Path
    data_root: pathlib.Path = CACHE / "data"
    socket: pathlib.Path = field(init=False)
    pid: int | None = None
    _saved: dict = field(default_factory=dict)
    _lock: IO[str] | None = None
    lock_timeout: float = 1800.0

    def __post_init__(self) -> None:
        self.state_dir = pathlib.Path(self.state_dir)
        self.socket = self.state_dir / "docker.sock"

    # -- what clients need
    @property
    def host(self) -> str:
        return f"unix://{self.socket}"

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """An environment for ``docker``/``docker-compose`` (and pscluster) that reaches this engine."""
        env = dict(os.environ if base is None else base)
        env.update(DOCKER_HOST=self.host, DOCKER_BUILDKIT="1", COMPOSE_DOCKER_CLI_BUILD="1")
        return env

    def docker(self, *args: str, check: bool = True, timeout: float = 120,
               input: bytes | None = None) -> subprocess.CompletedProcess:
        return _run([DOCKER, *args], check=check, env=self.env(), timeout=timeout, input=input)

    # -- lifecycle
    def start(self, timeout: float = 60.0) -> "Engine":
        check_available()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.data_root.mkdir(parents=True, exist_ok=True)
        MACHINE_LOCK.parent.mkdir(parents=True, exist_ok=True)
        self._lock = open(MACHINE_LOCK, "a+")
        deadline = time.monotonic() + self.lock_timeout
        while True:
            try:
                fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    self._lock.close()
                    self._lock = None
                    raise DockerUnavailable(f"another test engine holds {MACHINE_LOCK} (one dockerd per machine)")
                time.sleep(1.0)
        self._lock.seek(0)
        self._lock.truncate()
        self._lock.write(f"{os.getpid()} {self.state_dir}\n")
        self._lock.flush()
        left = reap_leftovers()      # under the lock: no engine of ours runs
        if left:
            (self.state_dir / "reaped.txt").write_text("\n".join(left) + "\n")
        self._saved = {
            "ip_forward": _read("/proc/sys/net/ipv4/ip_forward"),
            "forward_policy": next((r.split()[2] for r in _rules("filter") if r.startswith("-P FORWARD")), "ACCEPT"),
            "rules": {table: set(_rules(table)) for table in ("filter", "nat")},
            "links": _links(),
        }
        try:
            _write("/proc/sys/net/ipv4/ip_forward", "1")     # before dockerd: see the module docstring
            log = open(self.state_dir / "dockerd.log", "ab")
            proc = subprocess.Popen(
                [DOCKERD, "--data-root", str(self.data_root), "--exec-root", str(self.state_dir / "exec"),
                 "--pidfile", str(self.state_dir / "dockerd.pid"), "--host", self.host,
                 "--bip", BRIDGE_IP, "--default-address-pool", ADDRESS_POOL, "--userland-proxy=false"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
            log.close()
            self.pid = proc.pid
            (self.state_dir / "engine.json").write_text(json.dumps({"pid": self.pid, "saved": self._jsonable()}))
            end = time.monotonic() + timeout
            while True:
                if proc.poll() is not None:
                    raise DockerUnavailable(f"dockerd exited ({proc.returncode}): "
                                            f"{(self.state_dir / 'dockerd.log').read_text()[-1500:]}")
                if self.socket.exists() and self._answers():
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        # Best effort: a container whose containerd was killed with its run can
                        # hang `docker rm` (measured); the compose lab names its own anew.
                        self._remove_containers(timeout=30)
                    return self
                if time.monotonic() > end:
                    raise DockerUnavailable(f"dockerd did not answer within {timeout:.0f} s "
                                            f"(log: {self.state_dir / 'dockerd.log'})")
                time.sleep(0.2)
        except BaseException:
            self.stop()
            raise

    def _answers(self) -> bool:
        """dockerd answers ``docker version`` (after a killed run's engine it took over 10 s once)."""
        try:
            return self.docker("version", check=False, timeout=10).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def _remove_containers(self, timeout: float = 120) -> None:
        """Every container and custom network of this engine: at start, what an earlier run killed
        before its engine stopped left in the data root (kept between runs for its images; once, a
        compose control container whose name the next run's compose lab could not take); at stop,
        what the tests ran."""
        ids = self.docker("ps", "-aq", check=False, timeout=timeout).stdout.decode().split()
        if ids:
            self.docker("rm", "-f", "-v", *ids, check=False, timeout=timeout)
        nets = self.docker("network", "ls", "-q", "--filter", "type=custom", check=False,
                           timeout=timeout).stdout.decode().split()
        if nets:
            self.docker("network", "rm", *nets, check=False, timeout=timeout)

    def _jsonable(self) -> dict:
        return {"ip_forward": self._saved["ip_forward"], "forward_policy": self._saved["forward_policy"],
                "rules": {t: sorted(r) for t, r in self._saved["rules"].items()}, "links": sorted(self._saved["links"])}

    @classmethod
    def attach(cls, state_dir: pathlib.Path) -> "Engine":
        """The engine a previous ``up`` left running in ``state_dir`` (for ``down``)."""
        record = json.loads((pathlib.Path(state_dir) / "engine.json").read_text())
        engine = cls(pathlib.Path(state_dir))
        engine.pid = record["pid"]
        saved = record["saved"]
        engine._saved = {"ip_forward": saved["ip_forward"], "forward_policy": saved["forward_policy"],
                         "rules": {t: set(r) for t, r in saved["rules"].items()}, "links": set(saved["links"])}
        return engine

    def stop(self) -> None:
        """Remove what the engine made, stop it by pid, then undo its network changes."""
        if self.pid is not None and self.socket.exists():
            self._remove_containers()
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            end = time.monotonic() + 30
            while time.monotonic() < end and _alive(self.pid):
                time.sleep(0.1)
            if _alive(self.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pid, signal.SIGKILL)
                while _alive(self.pid):
                    time.sleep(0.1)
            self.pid = None
        if self._saved:
            self._undo_network()
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def kill(self, new_state_dir: pathlib.Path) -> None:
        """End the engine as a run killed mid-way does (SIGKILL to its process group, nothing
        undone): its rules, bridges and containers stay behind, for a test of :func:`reap_leftovers`.
        The next start is in ``new_state_dir``, as a new run's would be (dockerd's containerd does
        not start again in the killed one's exec root)."""
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            while _alive(self.pid):
                time.sleep(0.1)
        self.pid, self._saved = None, {}
        if self._lock is not None:
            self._lock.close()
            self._lock = None
        self.state_dir = pathlib.Path(new_state_dir)
        self.socket = self.state_dir / "docker.sock"

    def _undo_network(self) -> None:
        saved = self._saved
        for table in ("filter", "nat"):
            before = saved["rules"].get(table, set())
            rules = _rules(table)
            for rule in rules:     # rules in chains (ours or built-in) that dockerd added
                if rule.startswith("-A ") and rule not in before and _ours(rule):
                    _run(["iptables", "-t", table, *shlex.split(rule.replace("-A ", "-D ", 1))], check=False)
            for rule in _rules(table):   # then its chains, emptied first
                if rule.startswith("-N ") and rule not in before and "DOCKER" in rule:
                    chain = rule.split()[1]
                    _run(["iptables", "-t", table, "-F", chain], check=False)
            for rule in _rules(table):
                if rule.startswith("-N ") and rule not in before and "DOCKER" in rule:
                    _run(["iptables", "-t", table, "-X", rule.split()[1]], check=False)
        _run(["iptables", "-P", "FORWARD", saved["forward_policy"]], check=False)
        for link in sorted(_links() - saved["links"]):
            if link == "docker0" or re.fullmatch(r"br-[0-9a-f]{12}", link) or link.startswith("veth"):
                _run(["ip", "link", "delete", link], check=False)
        _write("/proc/sys/net/ipv4/ip_forward", saved["ip_forward"])
        self._saved = {}

    def __enter__(self) -> "Engine":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- what tests ask
    def image_exists(self, name: str) -> bool:
        return self.docker("image", "inspect", name, check=False).returncode == 0

    def image_size(self, name: str) -> int:
        return int(self.docker("image", "inspect", "--format", "{{.Size}}", name).stdout.decode().strip())

    def containers(self) -> list[str]:
        return self.docker("ps", "-aq", check=False).stdout.decode().split()


def _alive(pid: int) -> bool:
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def wait_for(what: str, condition, timeout: float = 120.0, interval: float = 0.3):
    """Poll ``condition`` until it returns something true, and return that value; AssertionError
    naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def apt_mirror() -> str:
    """The Debian mirror apt already uses (deb822 ``URIs:`` or a sources.list ``deb`` line)."""
    for path in sorted(pathlib.Path("/etc/apt/sources.list.d").glob("*.sources")):
        for line in path.read_text().splitlines():
            if line.startswith("URIs:") and "security" not in line:
                return line.split()[1]
    with contextlib.suppress(OSError):
        for line in pathlib.Path("/etc/apt/sources.list").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[0] == "deb" and "security" not in parts[1]:
                return parts[1]
    return "http://deb.debian.org/debian"


def ensure_base_image(engine: Engine, *, name: str = BASE_IMAGE, log=print) -> float:
    """Build the registry-free Debian base with scripts/docker-base.sh unless present; seconds taken."""
    if engine.image_exists(name):
        return 0.0
    start = time.monotonic()
    proc = subprocess.run(["bash", str(REPO / "scripts" / "docker-base.sh"), name], env=engine.env(),
                          capture_output=True, timeout=1200)
    if proc.returncode != 0:
        raise RuntimeError(f"scripts/docker-base.sh failed: {(proc.stderr or proc.stdout).decode()[-2000:]}")
    took = time.monotonic() - start
    log(f"dockerlab: base image {name} built in {took:.0f} s")
    return took


def extra_ca_bundle(directory: pathlib.Path) -> pathlib.Path | None:
    """This machine's extra CA certificates (``/usr/local/share/ca-certificates/*.crt``) in one
    file, for the image build's ``extra_ca`` secret; None when there are none."""
    certs = sorted(pathlib.Path("/usr/local/share/ca-certificates").glob("**/*.crt"))
    if not certs:
        return None
    bundle = directory / "extra-ca.pem"
    bundle.write_text("".join(cert.read_text().rstrip() + "\n" for cert in certs))
    return bundle


def build_node_image(engine: Engine, *, tag: str = NODE_IMAGE, base: str = BASE_IMAGE,
                     extra_args: Sequence[str] = (), context: pathlib.Path = REPO, log=print) -> dict:
    """``docker build`` of docker/Dockerfile from this checkout (BuildKit, the extra CAs as a secret).

    Returns ``{"seconds", "size_bytes", "tag"}``.
    """
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        argv = [DOCKER, "build", "-f", str(context / "docker" / "Dockerfile"), "-t", tag,
                "--build-arg", f"BASE_IMAGE={base}", *extra_args]
        bundle = extra_ca_bundle(pathlib.Path(tmp))
        if bundle is not None:
            argv += ["--secret", f"id=extra_ca,src={bundle}"]
        proc = subprocess.run([*argv, str(context)], env=engine.env(), capture_output=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"docker build failed: {proc.stderr.decode('utf-8', 'replace')[-3000:]}")
    took = time.monotonic() - start
    size = engine.image_size(tag)
    log(f"dockerlab: {tag} built in {took:.0f} s, {size / 1e6:.0f} MB")
    return {"seconds": took, "size_bytes": size, "tag": tag}


@contextlib.contextmanager
def running_engine(state_dir: pathlib.Path | None = None) -> Iterator[Engine]:
    with tempfile.TemporaryDirectory(prefix="pscluster-dock-") as tmp:
        with Engine(pathlib.Path(state_dir or tmp)) as engine:
            yield engine


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.dockerlab")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up")
    up.add_argument("--dir", required=True, type=pathlib.Path)
    up.add_argument("--image", action="store_true", help="also build the base and node images")
    down = sub.add_parser("down")
    down.add_argument("--dir", required=True, type=pathlib.Path)
    image = sub.add_parser("image")
    image.add_argument("--no-cache", action="store_true")
    sub.add_parser("purge")
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            engine = Engine(args.dir).start()
            if args.image:
                ensure_base_image(engine, log=lambda m: print(m, file=sys.stderr))
                build_node_image(engine, log=lambda m: print(m, file=sys.stderr))
            # The lock is released at exit; `down` (run later) takes the engine from engine.json.
            print(json.dumps({"DOCKER_HOST": engine.host, "pid": engine.pid, "dir": str(args.dir)}))
            return 0
        if args.command == "down":
            Engine.attach(args.dir).stop()
            return 0
        if args.command == "image":
            with running_engine() as engine:
                base = ensure_base_image(engine)
                report = build_node_image(engine, extra_args=["--no-cache"] if args.no_cache else [])
                report["base_seconds"] = base
                print(json.dumps(report))
            return 0
        if args.command == "purge":
            shutil.rmtree(CACHE, ignore_errors=True)
            return 0
    except DockerUnavailable as exc:
        print(f"dockerlab: {exc}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
