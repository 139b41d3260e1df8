"""A fake multi-host lab built from Linux network namespaces.

Every fake host is a network namespace with its own 127.x address (on a
per-lab bridge) and its own real ``sshd``, started under ``unshare --uts`` so
that ``hostname`` answers the host's inventory name.  All hosts share this
machine's filesystem and PID space, so the project's virtualenv Python is
usable on every host by absolute path.

The recipe follows docs/platform-notes.md (L1-L6):

* addresses ``<subnet>.0/24``: bridge ``.1``, host *i* at ``.(first_host+i-1)``;
  ``route_localnet=1`` on the bridge and on each namespace's ``eth0`` plus a
  local-table route *with* ``src`` on both sides;
* the bridge MAC is pinned;
* ``/etc/netns/<ns>/hosts`` maps every host name to its address;
* a host is "cut" by setting its root-side veth down, "healed" by setting it up;
* teardown kills the recorded sshd PIDs and every process living in the lab's
  namespaces *before* ``ip netns del`` (zombies count as dead).

Plain library: standard library only (plus the ``ip``, ``sshd``, ``ssh-keygen``
and ``unshare`` programs).  No pytest import; benchmarks use it directly::

    with Lab(16, pathlib.Path("/tmp/mylab")) as lab:
        print(lab.run("node-1", "hostname").stdout)

CLI (for manual and benchmark use)::

    python -m testbed.netlab up 8 --dir /tmp/lab8      # prints JSON
    python -m testbed.netlab down --dir /tmp/lab8
    python -m testbed.netlab reap /tmp/labs [--force]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import ipaddress
import json
import os
import pathlib
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

__all__ = [
    "Lab",
    "LabError",
    "LabHost",
    "LabUnavailable",
    "check_available",
    "free_subnet",
    "reap_stale",
    "venv_python",
    "write_inventory",
]

IP = "ip"
SSHD = "/usr/sbin/sshd"
SSH = "ssh"
SSH_KEYGEN = "ssh-keygen"
UNSHARE = "unshare"
SFTP_SERVER = "/usr/lib/openssh/sftp-server"

STATE_FILE = "netlab-state.json"
STATE_VERSION = 1
NETNS_RUN_DIR = pathlib.Path("/run/netns")
ETC_NETNS = pathlib.Path("/etc/netns")
# Serialises subnet allocation and network set-up between concurrent
# processes (e.g. two pytest runs or a pytest run plus a benchmark).
LOCK_FILE = pathlib.Path(tempfile.gettempdir()) / "pscluster-netlab.lock"

_TAG_RE = re.compile(r"^[a-z0-9]{1,6}$")
_SUBNET_RE = re.compile(r"^127\.(\d{1,3})\.(\d{1,3})$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,40}$")


class LabError(RuntimeError):
    """The lab could not be started, used or cleaned up."""


class LabUnavailable(LabError):
    """This machine cannot run the lab (not root, no ip/sshd, ...).

    ``str(exc)`` is the reason, suitable for ``pytest.skip``.
    """

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class LabHost:
    name: str  # inventory name, e.g. "node-1"; also the host's `hostname`
    address: str  # e.g. "127.77.0.2"
    netns: str  # network namespace name
    veth_root: str  # root-side veth interface (cut/heal this)
    sshd_pid: int


# --------------------------------------------------------------------------
# small helpers


def _run(argv: Sequence[str], *, input: str | None = None, check: bool = True,
         timeout: float = 60) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        list(argv),
        input=input,
        stdin=None if input is not None else subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise LabError(
            f"command failed ({proc.returncode}): {' '.join(argv)}\n"
            f"{proc.stdout}{proc.stderr}".rstrip()
        )
    return proc


def _ip_batch(lines: Iterable[str], *, force: bool = False, netns: str | None = None,
              check: bool = True) -> subprocess.CompletedProcess:
    lines = list(lines)
    argv = [IP]
    if netns:
        argv += ["-n", netns]
    if force:
        argv.append("-force")
    argv += ["-batch", "-"]
    return _run(argv, input="\n".join(lines) + "\n", check=check)


def _link_names() -> set[str]:
    return set(os.listdir("/sys/class/net"))


def _netns_names() -> set[str]:
    try:
        return set(os.listdir(NETNS_RUN_DIR))
    except FileNotFoundError:
        return set()


def _proc_state(pid: int) -> str | None:
    """Process state letter, or None if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read().decode("utf-8", "replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return data.rsplit(")", 1)[1].split()[0]


def _proc_starttime(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read().decode("utf-8", "replace")
    except OSError:
        return None
    return int(data.rsplit(")", 1)[1].split()[19])


def _alive(pid: int) -> bool:
    """True if the process exists and is not a zombie (zombies count as dead)."""
    state = _proc_state(pid)
    return state is not None and state not in ("Z", "X")


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            raw = fh.read()
    except OSError:
        return []
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def _is_lab_sshd(pid: int, config: str) -> bool:
    """The PID is (still) an sshd started with that lab config file.

    The sshd listener rewrites its title to one string:
    ``sshd: /usr/sbin/sshd -D -f <config> -E <log> [listener] 0 of 10-100 startups``.
    """
    args = _cmdline(pid)
    if not args:
        return False
    first = args[0].split(" ", 1)[0]
    if first != "sshd:" and os.path.basename(first) != "sshd":
        return False
    return f" -f {config} " in " " + " ".join(args) + " "


def _netns_pids(names: Iterable[str]) -> dict[str, list[int]]:
    """PIDs living in each named namespace: what ``ip netns pids <ns>`` reports.

    Same method as iproute2 (compare /proc/<pid>/ns/net with /run/netns/<ns>),
    done for all namespaces in one /proc scan instead of one ``ip`` call each.
    Zombies are left out: they are already dead.
    """
    want: dict[tuple[int, int], str] = {}
    for name in names:
        try:
            st = os.stat(NETNS_RUN_DIR / name)
        except OSError:
            continue
        want[(st.st_dev, st.st_ino)] = name
    out: dict[str, list[int]] = {n: [] for n in want.values()}
    if not want:
        return out
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        if pid == me:
            continue
        try:
            st = os.stat(f"/proc/{pid}/ns/net")
        except OSError:
            continue
        owner = want.get((st.st_dev, st.st_ino))
        if owner is not None and _alive(pid):
            out[owner].append(pid)
    return out


def _kill(pid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _wait_dead(pids: Iterable[int], timeout: float) -> list[int]:
    pids = list(pids)
    deadline = time.monotonic() + timeout
    while True:
        pids = [p for p in pids if _alive(p)]
        if not pids or time.monotonic() > deadline:
            return pids
        time.sleep(0.02)


def _write_sysctl(path: str, value: str) -> None:
    with open(path, "w") as fh:
        fh.write(value)


# The kernel's IPv4 neighbour (ARP) table is one table for every network namespace, and
# its hard limit (gc_thresh3, 1024 by default) counts the entries of all of them. A lab of
# n hosts that all talk to each other (preflight's host-to-host reach check) needs about
# n * n entries: 64 hosts need 4,032, and past the limit the kernel drops the packets
# ("neighbour: arp_cache: neighbor table overflow!"), so three quarters of the connects
# timed out. A real host has its own table; the lab raises the shared limits to match.
NEIGH_SYSCTL = pathlib.Path("/proc/sys/net/ipv4/neigh/default")


def neighbour_limits(n_hosts: int) -> dict[str, int]:
    """The gc_thresh2/3 a lab of ``n_hosts`` needs (room for every pair, twice, plus the rest)."""
    pairs = n_hosts * (n_hosts + 1)
    return {"gc_thresh2": 2 * pairs, "gc_thresh3": 4 * pairs}


def _raise_neighbour_limits(n_hosts: int, folder: pathlib.Path = NEIGH_SYSCTL) -> None:
    """Raises (never lowers: other labs may be running) the shared neighbour-table limits."""
    for name, wanted in neighbour_limits(n_hosts).items():
        path = folder / name
        with contextlib.suppress(OSError, ValueError):
            if int(path.read_text()) < wanted:
                _write_sysctl(str(path), str(wanted))


@contextlib.contextmanager
def _global_lock():
    fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _subnet_in_use(subnet: str) -> bool:
    """Is <subnet>.0/24 already configured in the root namespace?"""
    net = ipaddress.ip_network(f"{subnet}.0/24")
    addrs = _run([IP, "-4", "-o", "addr", "show"], check=False).stdout
    for m in re.finditer(r"\binet (\d+\.\d+\.\d+\.\d+)/(\d+)", addrs):
        iface = ipaddress.ip_interface(f"{m.group(1)}/{m.group(2)}")
        if iface.ip in net or (iface.network.prefixlen > 8 and iface.network.overlaps(net)):
            return True
    routes = _run([IP, "-4", "-o", "route", "show", "table", "all"], check=False).stdout
    for line in routes.splitlines():
        first = line.split()
        if not first:
            continue
        dst = first[1] if first[0] in ("local", "broadcast", "unicast", "blackhole",
                                        "unreachable", "prohibit", "throw") else first[0]
        if dst == "default":
            continue
        try:
            rnet = ipaddress.ip_network(dst, strict=False)
        except ValueError:
            continue
        # The machine's own 127.0.0.0/8 on lo is expected; anything more
        # specific inside our /24 means another lab (or something else) uses it.
        if rnet.prefixlen > 8 and rnet.overlaps(net):
            return True
    return False


def free_subnet(prefix: str = "127.77", start: int = 0) -> str:
    """First ``<prefix>.<k>`` (k >= start) whose /24 is not in use here."""
    for k in range(start, 256):
        cand = f"{prefix}.{k}"
        if not _subnet_in_use(cand):
            return cand
    raise LabError(f"no free /24 under {prefix}.0.0/16")


def venv_python() -> str:
    """The Python of the running virtualenv, by its venv path (not resolved).

    The fake hosts share the filesystem, so this path works on every host.
    """
    if sys.prefix != sys.base_prefix:
        for cand in ("python", "python3"):
            p = pathlib.Path(sys.prefix) / "bin" / cand
            if p.exists():
                return str(p)
    return sys.executable


def check_available() -> None:
    """Raise LabUnavailable(reason) unless this machine can run a lab."""
    if sys.platform != "linux":
        raise LabUnavailable("the network-namespace lab needs Linux")
    if os.geteuid() != 0:
        raise LabUnavailable("the network-namespace lab needs root")
    for prog in (IP, SSH, SSH_KEYGEN, UNSHARE):
        if shutil.which(prog) is None:
            raise LabUnavailable(f"{prog!r} not found on PATH")
    if not os.access(SSHD, os.X_OK):
        raise LabUnavailable(f"{SSHD} not found (apt-get install openssh-server)")
    if not os.path.exists(SFTP_SERVER):
        raise LabUnavailable(f"{SFTP_SERVER} not found")
    if not os.path.exists("/proc/self/ns/net") or not os.path.exists("/proc/self/ns/uts"):
        raise LabUnavailable("kernel without network/UTS namespaces")


# --------------------------------------------------------------------------
# the lab


def cut_port(port: int) -> list[list[str]]:
    """Drop every packet to and from TCP ``port`` on this machine, IPv4 and IPv6: a link cut between
    the two ends of a loopback connection (neither end's kernel answers), for one port instead of
    a lab host. The commands that heal it, to run afterwards whatever happens. Needs root."""
    heal = []
    for tool in ("iptables", "ip6tables"):
        for match in ("--dport", "--sport"):
            rule = ["INPUT", "-p", "tcp", match, str(port), "-j", "DROP"]
            subprocess.run([tool, "-w", "-I", *rule], check=True, capture_output=True)
            heal.append([tool, "-w", "-D", *rule])
    return heal


def _host_from_dict(d: Mapping) -> LabHost:
    return LabHost(name=d["name"], address=d["address"], netns=d["netns"],
                   veth_root=d["veth_root"], sshd_pid=int(d.get("sshd_pid") or 0))


class Lab:
    """``n_hosts`` fake hosts, each a netns with its own address and sshd.

    Files live under ``root_dir``: the client key (``id_ed25519``),
    ``authorized_keys``, ``known_hosts``, an ``ssh_config`` for humans
    (``ssh -F DIR/ssh_config node-1``), ``netlab-state.json`` and one
    directory per host (``hosts/<name>/``: sshd_config, host key, logs).
    """

    def __init__(self, n_hosts: int, root_dir: pathlib.Path, *, tag: str | None = None,
                 subnet: str = "127.77.0", first_host: int = 2,
                 host_prefix: str = "node-", start_timeout: float = 60.0,
                 session_env: Mapping[str, str] | None = None,
                 sshd_options: Mapping[str, str] | None = None):
        if n_hosts < 1:
            raise ValueError("n_hosts must be >= 1")
        if tag is not None and not _TAG_RE.match(tag):
            raise ValueError("tag must be 1-6 characters [a-z0-9] (interface names are <= 15 chars)")
        if subnet != "auto" and not _SUBNET_RE.match(subnet):
            raise ValueError("subnet must look like '127.77.0' (a 127.x.y /24) or be 'auto'")
        if subnet != "auto":
            ipaddress.ip_network(f"{subnet}.0/24")  # octet range check
        if not (2 <= first_host and first_host + n_hosts - 1 <= 254):
            raise ValueError(f"{n_hosts} hosts from .{first_host} do not fit in a /24 (.2-.254)")
        if not _NAME_RE.match(f"{host_prefix}{n_hosts}"):
            raise ValueError(f"bad host_prefix {host_prefix!r}")
        self.n_hosts = n_hosts
        self.root_dir = pathlib.Path(root_dir).absolute()
        self.tag = tag
        self.subnet = subnet
        self.first_host = first_host
        self.host_prefix = host_prefix
        self.start_timeout = start_timeout
        # Extra variables every SSH session gets (sshd SetEnv; HOME too, e.g. one shared home).
        self.session_env = dict(session_env or {})
        for key, value in self.session_env.items():
            if not re.fullmatch(r"[A-Z_][A-Z0-9_]*", key) or any(c in value for c in " \t\n\"'\\"):
                raise ValueError(f"session_env {key}={value!r}: a plain name and a value without blanks or quotes")
        # sshd_config keywords in place of the lab's own (e.g. {"MaxSessions": "1"}): a host
        # configured as a site's may be (issue 46, "Bad input and edges").
        self.sshd_options = dict(sshd_options or {})
        for key, value in self.sshd_options.items():
            if not re.fullmatch(r"[A-Za-z]+", key) or not value or "\n" in value:
                raise ValueError(f"sshd_options {key}={value!r}: a keyword and a one-line value")
        self.hosts: list[LabHost] = []
        self.key_path = self.root_dir / "id_ed25519"
        self.known_hosts = self.root_dir / "known_hosts"
        self.authorized_keys = self.root_dir / "authorized_keys"
        self.ssh_config = self.root_dir / "ssh_config"
        self.state_file = self.root_dir / STATE_FILE
        self.bridge: str = ""
        self.timings: dict[str, float] = {}
        self._procs: dict[str, subprocess.Popen] = {}
        self._state: dict | None = None
        self._wrong_known_hosts: pathlib.Path | None = None
        self._cut: set[str] = set()

    # ---- naming -----------------------------------------------------------

    @property
    def bridge_address(self) -> str:
        return f"{self.subnet}.1"

    def _names(self, tag: str) -> tuple[str, list[dict]]:
        bridge = f"pslb-{tag}"  # "pslb-" / "psl-": no clash between labs' names
        hosts = []
        for i in range(1, self.n_hosts + 1):
            name = f"{self.host_prefix}{i}"
            hosts.append({
                "name": name,
                "address": f"{self.subnet}.{self.first_host + i - 1}",
                "netns": f"pslab-{tag}-{name}",
                "veth_root": f"psl-{tag}-{i}",  # <= 14 chars (IFNAMSIZ 16)
                "sshd_pid": 0,
                "sshd_config": str(self.root_dir / "hosts" / name / "sshd_config"),
            })
        return bridge, hosts

    def _pick_tag(self) -> str:
        links, nss = _link_names(), _netns_names()
        for _ in range(100):
            tag = self.tag or secrets.token_hex(2)
            bridge, hosts = self._names(tag)
            clash = bridge in links or any(
                h["veth_root"] in links or h["netns"] in nss for h in hosts)
            if not clash:
                return tag
            if self.tag:
                raise LabError(f"lab tag {tag!r} is already in use (bridge/veth/netns exists)")
        raise LabError("could not find a free lab tag")

    # ---- state file ---------------------------------------------------------

    def _write_state(self) -> None:
        assert self._state is not None
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._state, indent=2) + "\n")
        os.replace(tmp, self.state_file)

    @classmethod
    def load(cls, root_dir: pathlib.Path) -> "Lab":
        """Attach to a lab started elsewhere (e.g. by the CLI) from its state file."""
        root_dir = pathlib.Path(root_dir).absolute()
        state = json.loads((root_dir / STATE_FILE).read_text())
        if state.get("version") != STATE_VERSION:
            raise LabError(f"unknown lab state version in {root_dir / STATE_FILE}")
        lab = cls(len(state["hosts"]), root_dir, tag=state["tag"], subnet=state["subnet"],
                  first_host=state["first_host"], host_prefix=state["host_prefix"])
        lab._state = state
        lab.bridge = state["bridge"]
        lab.hosts = [_host_from_dict(h) for h in state["hosts"]]
        return lab

    # ---- start --------------------------------------------------------------

    def __enter__(self) -> "Lab":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> "Lab":
        if self._state is not None:
            raise LabError("lab already started")
        check_available()
        t0 = time.monotonic()
        self.root_dir.mkdir(parents=True, exist_ok=True)
        if self.state_file.exists():
            raise LabError(f"{self.state_file} exists: a lab is (or was) running from this "
                           f"directory; stop it or call reap_stale({str(self.root_dir)!r}) first")
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd privsep dir
        try:
            self._make_keys()
            self.timings["keys"] = time.monotonic() - t0
            with _global_lock():
                if self.subnet == "auto":
                    self.subnet = free_subnet()
                elif _subnet_in_use(self.subnet):
                    raise LabError(f"subnet {self.subnet}.0/24 is already in use on this machine "
                                   f"(another lab?); pass a different subnet= or 'auto'")
                tag = self._pick_tag()
                self.tag = tag
                self.bridge, hosts = self._names(tag)
                self._state = {
                    "version": STATE_VERSION,
                    "tag": tag,
                    "subnet": self.subnet,
                    "first_host": self.first_host,
                    "host_prefix": self.host_prefix,
                    "bridge": self.bridge,
                    "root_dir": str(self.root_dir),
                    "owner_pid": os.getpid(),
                    "owner_starttime": _proc_starttime(os.getpid()),
                    "detached": False,
                    "created": time.time(),
                    "hosts": hosts,
                }
                # Recorded before anything is created, so a crash at any
                # point below leaves something reap_stale() can clean.
                self._write_state()
                self._write_host_files(hosts)
                t1 = time.monotonic()
                self._make_network(hosts)
                self.timings["network"] = time.monotonic() - t1
            t2 = time.monotonic()
            self._launch_sshds(hosts)
            self._write_state()
            self._wait_ready(hosts)
            self.timings["sshd"] = time.monotonic() - t2
            self.hosts = [_host_from_dict(h) for h in hosts]
            self._write_state()
        except BaseException:
            with contextlib.suppress(Exception):
                self.stop()
            raise
        self.timings["start"] = time.monotonic() - t0
        return self

    def _make_keys(self) -> None:
        keygens = []
        if not self.key_path.exists():
            keygens.append([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", "pscluster-lab-client",
                            "-f", str(self.key_path)])
        for i in range(1, self.n_hosts + 1):
            hdir = self.root_dir / "hosts" / f"{self.host_prefix}{i}"
            hdir.mkdir(parents=True, exist_ok=True)
            key = hdir / "ssh_host_ed25519_key"
            if not key.exists():
                keygens.append([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C",
                                f"{self.host_prefix}{i}", "-f", str(key)])
        _run_many(keygens)

    def _write_host_files(self, hosts: list[dict]) -> None:
        pub = (self.key_path.with_suffix(".pub")).read_text().strip()
        self.authorized_keys.write_text(pub + "\n")
        kh_lines, hosts_lines, cfg_lines = [], [], []
        for h in hosts:
            hpub = (self.root_dir / "hosts" / h["name"] / "ssh_host_ed25519_key.pub").read_text().split()
            kh_lines.append(f"{h['address']},{h['name']} {hpub[0]} {hpub[1]}")
            hosts_lines.append(f"{h['address']}\t{h['name']}")
            cfg_lines += [f"Host {h['name']}", f"    HostName {h['address']}"]
        self.known_hosts.write_text("\n".join(kh_lines) + "\n")
        cfg_lines += [
            "Host *",
            "    User root",
            f"    IdentityFile {self.key_path}",
            "    IdentitiesOnly yes",
            f"    UserKnownHostsFile {self.known_hosts}",
            "    GlobalKnownHostsFile /dev/null",
            "    StrictHostKeyChecking yes",
            "    UpdateHostKeys no",
            "    BatchMode yes",
            "    ConnectTimeout 5",
            "    ServerAliveInterval 1",
            "    ServerAliveCountMax 2",
            "    LogLevel ERROR",
        ]
        self.ssh_config.write_text("\n".join(cfg_lines) + "\n")
        etc_hosts = ("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
                     + "\n".join(hosts_lines) + "\n")
        for h in hosts:
            hdir = self.root_dir / "hosts" / h["name"]
            (hdir / "sshd_config").write_text(self._sshd_config(h, hdir))
            (hdir / "net.batch").write_text("\n".join([
                "link set lo up",
                "link set eth0 up",
                f"addr add {h['address']}/24 dev eth0",
                f"route add {self.subnet}.0/24 dev eth0 table local src {h['address']}",
            ]) + "\n")
            nsdir = ETC_NETNS / h["netns"]
            nsdir.mkdir(parents=True, exist_ok=True)
            (nsdir / "hosts").write_text(etc_hosts)

    def _sshd_config(self, h: dict, hdir: pathlib.Path) -> str:
        lines = self._sshd_lines(h, hdir)
        if self.sshd_options:     # sshd takes a keyword's first value: replace the lab's in place
            lines = [line for line in lines if line.split(" ", 1)[0] not in self.sshd_options]
            lines[1:1] = [f"{key} {value}" for key, value in self.sshd_options.items()]
        return "\n".join(lines) + "\n"

    def _sshd_lines(self, h: dict, hdir: pathlib.Path) -> list[str]:
        return [
            f"# pscluster netlab {self.tag} host {h['name']}",
            f"ListenAddress {h['address']}:22",
            f"PidFile {hdir / 'sshd.pid'}",
            f"HostKey {hdir / 'ssh_host_ed25519_key'}",
            f"AuthorizedKeysFile {self.authorized_keys}",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "HostbasedAuthentication no",
            "UsePAM no",
            "UseDNS no",
            "StrictModes no",
            "MaxStartups 200",
            "MaxSessions 100",
            "ClientAliveInterval 5",
            "ClientAliveCountMax 3",
            # Debian's bash sources root's slow .bashrc for every ssh command
            # unless SHLVL is set (docs/platform-notes.md L4).
            "SetEnv " + " ".join(f"{key}={value}" for key, value in {"SHLVL": "1", **self.session_env}.items()),
            "PrintMotd no",
            "PrintLastLog no",
            "X11Forwarding no",
            "LogLevel INFO",
            f"Subsystem sftp {SFTP_SERVER}",
        ]

    def _make_network(self, hosts: list[dict]) -> None:
        s, br = self.subnet, self.bridge
        if self.tag is None:        # set by start() before the network is made
            raise LabError("the lab's network is made before its tag is chosen")
        t = bytes.fromhex(f"{int(self.tag, 36) & 0xffffff:06x}")
        mac = "02:70:%02x:%02x:%02x:%02x" % (t[0], t[1], t[2], int(s.split(".")[2]))
        lines = [
            f"link add {br} type bridge",
            f"link set {br} address {mac}",  # pinned (docs/platform-notes.md L3)
            f"link set {br} up",
            f"addr add {s}.1/24 dev {br}",
            f"route add {s}.0/24 dev {br} table local src {s}.1",
        ]
        for h in hosts:
            lines += [
                f"netns add {h['netns']}",
                f"link add {h['veth_root']} type veth peer name eth0 netns {h['netns']}",
                f"link set {h['veth_root']} master {br} up",
            ]
        _raise_neighbour_limits(len(hosts))
        _ip_batch(lines)
        _write_sysctl(f"/proc/sys/net/ipv4/conf/{br}/route_localnet", "1")
        with contextlib.suppress(OSError):  # no IPv6 chatter on the lab bridge
            _write_sysctl(f"/proc/sys/net/ipv6/conf/{br}/disable_ipv6", "1")

    # Runs as: ip netns exec <ns> unshare --uts sh -c SCRIPT sh <batch> <name> <sshd> <cfg> <log>
    # so the Popen PID becomes the sshd PID (every step execs, none forks the PID away).
    _LAUNCH = (
        "set -e\n"
        'ip -batch "$1"\n'
        "echo 1 > /proc/sys/net/ipv4/conf/eth0/route_localnet\n"
        "echo 1 2>/dev/null > /proc/sys/net/ipv6/conf/eth0/disable_ipv6 || true\n"
        'printf "%s" "$2" > /proc/sys/kernel/hostname\n'
        'exec "$3" -D -f "$4" -E "$5"\n'
    )

    def _launch_sshds(self, hosts: list[dict]) -> None:
        for h in hosts:
            hdir = self.root_dir / "hosts" / h["name"]
            with contextlib.suppress(FileNotFoundError):
                (hdir / "sshd.pid").unlink()
            with open(hdir / "launch.log", "wb") as log:
                proc = subprocess.Popen(
                    [IP, "netns", "exec", h["netns"], UNSHARE, "--uts",
                     "sh", "-c", self._LAUNCH, "sh", str(hdir / "net.batch"), h["name"],
                     SSHD, h["sshd_config"], str(hdir / "sshd.log")],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                    close_fds=True, start_new_session=True,
                )
            self._procs[h["name"]] = proc
            h["sshd_pid"] = proc.pid

    def _wait_ready(self, hosts: list[dict]) -> None:
        pending = {h["name"]: h for h in hosts}
        deadline = time.monotonic() + self.start_timeout
        while pending:
            for name, h in list(pending.items()):
                proc = self._procs[name]
                if proc.poll() is not None:
                    hdir = self.root_dir / "hosts" / name
                    logs = "".join(
                        p.read_text(errors="replace") for p in (hdir / "launch.log", hdir / "sshd.log")
                        if p.exists())
                    raise LabError(f"sshd for {name} exited with {proc.returncode}:\n{logs[-2000:]}")
                # sshd writes its PidFile right after it starts listening; probing
                # earlier would make the root side ARP for an address not yet
                # configured, and a failed ARP costs a second.
                if not (self.root_dir / "hosts" / name / "sshd.pid").exists():
                    continue
                try:
                    with socket.create_connection((h["address"], 22), timeout=2):
                        pass
                except OSError:
                    continue
                # Accepting on :22 means the shell has exec'd sshd already.
                if not _is_lab_sshd(proc.pid, h["sshd_config"]):
                    raise LabError(f"PID {proc.pid} listening for {name} is not the lab sshd")
                del pending[name]
            if pending:
                if time.monotonic() > deadline:
                    raise LabError(f"sshd not accepting on :22 after {self.start_timeout}s: "
                                   f"{sorted(pending)}")
                time.sleep(0.005)

    # ---- stop ---------------------------------------------------------------

    def stop(self) -> None:
        """Kill sshds and everything in the lab's namespaces, delete it all.

        Idempotent.  Raises LabError if something could not be removed.
        """
        state = self._state
        if state is None:
            return
        t0 = time.monotonic()
        _teardown(state, self._procs)
        self._procs.clear()
        left = _leftovers(state)
        self.timings["stop"] = time.monotonic() - t0
        if left:
            raise LabError(f"lab {state['tag']} not fully removed: {left}")
        with contextlib.suppress(FileNotFoundError):
            self.state_file.unlink()
        self._state = None
        self._cut.clear()

    def leftovers(self) -> list[str]:
        """What of this lab still exists (empty after a clean stop)."""
        if self._state is None and self.bridge:
            # stopped: rebuild names so tests can assert nothing is left
            return _leftovers(self._last_state_for_check())
        return _leftovers(self._state) if self._state else []

    def _last_state_for_check(self) -> dict:
        return {
            "bridge": self.bridge,
            "hosts": [dict(dataclasses.asdict(h),
                           sshd_config=str(self.root_dir / "hosts" / h.name / "sshd_config"))
                      for h in self.hosts],
        }

    @property
    def running(self) -> bool:
        return self._state is not None

    # ---- use ----------------------------------------------------------------

    def host(self, name: str) -> LabHost:
        for h in self.hosts:
            if h.name == name or h.address == name:
                return h
        raise KeyError(f"no lab host {name!r} (have {[h.name for h in self.hosts]})")

    def __getitem__(self, name: str) -> LabHost:
        return self.host(name)

    @property
    def names(self) -> list[str]:
        return [h.name for h in self.hosts]

    def cut(self, name: str) -> None:
        """Host down / partitioned: its traffic is silently dropped."""
        h = self.host(name)
        _run([IP, "link", "set", h.veth_root, "down"])
        self._cut.add(h.name)

    def heal(self, name: str) -> None:
        h = self.host(name)
        _run([IP, "link", "set", h.veth_root, "up"])
        self._cut.discard(h.name)

    def throttle(self, name: str, rate: str = "4mbit") -> None:
        """Slow link to the host (tbf on its root-side veth: traffic towards the host)."""
        h = self.host(name)
        _run(["tc", "qdisc", "replace", "dev", h.veth_root, "root", "tbf", "rate", rate,
              "burst", "32kbit", "latency", "400ms"])

    def unthrottle(self, name: str) -> None:
        _run(["tc", "qdisc", "del", "dev", self.host(name).veth_root, "root"], check=False)

    def heal_all(self) -> None:
        for name in list(self._cut):
            self.heal(name)

    def is_cut(self, name: str) -> bool:
        return self.host(name).name in self._cut

    def ssh_options(self, *, known_hosts: pathlib.Path | None = None,
                    connect_timeout: int = 5) -> list[str]:
        kh = known_hosts if known_hosts is not None else self.known_hosts
        return [
            "-F", "/dev/null",  # ignore ~/.ssh/config (and never create ~/.ssh)
            "-i", str(self.key_path),
            "-o", "IdentitiesOnly=yes",
            "-o", f"UserKnownHostsFile={kh}",
            "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "StrictHostKeyChecking=yes",
            "-o", "UpdateHostKeys=no",
            "-o", "BatchMode=yes",
            "-o", f"ConnectTimeout={connect_timeout}",
            "-o", "ServerAliveInterval=1",
            "-o", "ServerAliveCountMax=2",
            "-o", "LogLevel=ERROR",
            "-l", "root",
        ]

    def ssh_argv(self, name: str, *command: str, known_hosts: pathlib.Path | None = None,
                 connect_timeout: int = 5) -> list[str]:
        """Plain OpenSSH client argv reaching that host as root.

        The remote side joins ``command`` with spaces and runs it with the
        login shell, as ssh always does: quote accordingly.
        """
        argv = [SSH, *self.ssh_options(known_hosts=known_hosts, connect_timeout=connect_timeout),
                "-T", self.host(name).address]
        if command:
            argv += ["--", *command]
        return argv

    def run(self, name: str, *command: str, timeout: float = 30,
            known_hosts: pathlib.Path | None = None, check: bool = False,
            input: str | None = None) -> subprocess.CompletedProcess:
        """Run a command on that host over ssh (stdin /dev/null unless input)."""
        return subprocess.run(
            self.ssh_argv(name, *command, known_hosts=known_hosts),
            input=input, stdin=None if input is not None else subprocess.DEVNULL,
            capture_output=True, text=True, timeout=timeout, check=check,
        )

    def hide_behind(self, name: str, bastion: str) -> None:
        """Make ``name`` reachable from the control side only through ``bastion``: an nftables
        table in its namespace drops packets from the bridge address (the control machine);
        the bastion and the other hosts still reach it. Undone by :meth:`unhide`."""
        rules = (f"table inet netlab_hide {{\n chain input {{\n type filter hook input priority 0; policy accept;\n"
                 f" ip saddr {self.bridge_address} drop\n }}\n}}\n")
        self.exec_in_netns(name, ["nft", "-f", "-"], check=True, input=rules)

    def block(self, source: str, target: str) -> None:
        """Drop every packet from ``source`` arriving at ``target`` (a one-way path cut between two
        hosts; the control machine still reaches both). Undone by :meth:`unhide`."""
        rules = (f"table inet netlab_block {{\n chain input {{\n type filter hook input priority 0; policy accept;\n"
                 f" ip saddr {self.host(source).address} drop\n }}\n}}\n")
        self.exec_in_netns(target, ["nft", "-f", "-"], check=True, input=rules)

    def unhide(self, name: str) -> None:
        for table in ("netlab_hide", "netlab_block"):
            self.exec_in_netns(name, ["nft", "delete", "table", "inet", table])

    def forget_connections(self, name: str, peer: str) -> None:
        """``name``'s kernel forgets its TCP connections to ``peer`` (``ss -K``) while ``peer``
        drops whatever comes from ``name``, so the resets never arrive: ``peer`` is left holding
        half-open connections, as after ``name`` rebooted or gave up on a connection while its
        link was down. ``peer`` learns of it only when it next sends on one of them."""
        self.block(name, peer)
        try:
            self.exec_in_netns(name, ["ss", "-K", "dst", self.host(peer).address], check=True)
        finally:
            self.unhide(peer)

    def exec_in_netns(self, name: str, argv: Sequence[str], *, timeout: float = 30,
                      check: bool = False, input: str | None = None) -> subprocess.CompletedProcess:
        """Run ``argv`` inside that host's namespace via ``ip netns exec`` (no ssh)."""
        return subprocess.run(
            [IP, "netns", "exec", self.host(name).netns, *argv],
            stdin=None if input is not None else subprocess.DEVNULL, input=input, capture_output=True, text=True,
            timeout=timeout, check=check,
        )

    def wrong_known_hosts(self) -> pathlib.Path:
        """known_hosts listing every host (address and name) with a DIFFERENT key."""
        if self._wrong_known_hosts is None:
            wdir = self.root_dir / "wrong-keys"
            wdir.mkdir(exist_ok=True)
            jobs = []
            for h in self.hosts:
                key = wdir / h.name
                if not key.exists():
                    jobs.append([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", "wrong",
                                 "-f", str(key)])
            _run_many(jobs)
            lines = []
            for h in self.hosts:
                kt, kb = (wdir / f"{h.name}.pub").read_text().split()[:2]
                lines.append(f"{h.address},{h.name} {kt} {kb}")
            path = self.root_dir / "known_hosts.wrong"
            path.write_text("\n".join(lines) + "\n")
            self._wrong_known_hosts = path
        return self._wrong_known_hosts

    def empty_known_hosts(self) -> pathlib.Path:
        path = self.root_dir / "known_hosts.empty"
        path.write_text("")
        return path

    def describe(self) -> dict:
        """JSON-able summary (what the CLI prints)."""
        return {
            "tag": self.tag,
            "subnet": self.subnet,
            "bridge": self.bridge,
            "root_dir": str(self.root_dir),
            "key": str(self.key_path),
            "known_hosts": str(self.known_hosts),
            "ssh_config": str(self.ssh_config),
            "state_file": str(self.state_file),
            "python": venv_python(),
            "hosts": [dataclasses.asdict(h) for h in self.hosts],
        }

    def __repr__(self) -> str:
        return (f"<Lab tag={self.tag} subnet={self.subnet} hosts={len(self.hosts)} "
                f"running={self.running}>")


# --------------------------------------------------------------------------
# teardown shared by Lab.stop, reap_stale and the CLI


def _run_many(jobs: list[list[str]], parallel: int = 16) -> None:
    """Run independent short commands, several at a time."""
    pending = list(jobs)
    running: list[tuple[list[str], subprocess.Popen]] = []
    errors = []
    while pending or running:
        while pending and len(running) < parallel:
            argv = pending.pop()
            running.append((argv, subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                                   stdout=subprocess.PIPE,
                                                   stderr=subprocess.STDOUT)))
        argv, proc = running.pop(0)
        out, _ = proc.communicate(timeout=60)
        if proc.returncode != 0:
            errors.append(f"{' '.join(argv)}: {out.decode(errors='replace')}")
    if errors:
        raise LabError("; ".join(errors))


def _teardown(state: Mapping, procs: Mapping[str, subprocess.Popen] | None = None) -> None:
    procs = procs or {}
    hosts = state.get("hosts", [])
    nsnames = [h["netns"] for h in hosts]
    # 1. recorded sshd PIDs: ours (Popen) or verified to be that lab's sshd.
    for h in hosts:
        proc = procs.get(h["name"])
        if proc is not None:
            if proc.poll() is None:
                _kill(proc.pid)
        elif h.get("sshd_pid") and _is_lab_sshd(int(h["sshd_pid"]), h["sshd_config"]):
            _kill(int(h["sshd_pid"]))
    # 2. everything still living in the lab's namespaces (ssh sessions,
    #    processes the tests launched with setsid/nohup, ...), until none is left.
    deadline = time.monotonic() + 10
    while True:
        pids = [p for ps in _netns_pids(nsnames).values() for p in ps]
        if not pids:
            break
        for p in pids:
            _kill(p)
        survivors = _wait_dead(pids, 2.0)
        if time.monotonic() > deadline:
            raise LabError(f"processes in lab namespaces would not die: {survivors}")
    for proc in procs.values():  # reap our own children (no zombies left behind)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
    # 3. namespaces, then the bridge and any veth still there.  Deleting the
    #    namespaces first lets the kernel destroy all their veth pairs in one
    #    batch (one `link del` per veth costs ~20 ms each); it is asynchronous,
    #    so wait for the root-side veths to go before deleting leftovers.
    existing = _netns_names()
    lines = [f"netns del {n}" for n in nsnames if n in existing]
    if lines:
        _ip_batch(lines, force=True, check=False)
    vnames = {h["veth_root"] for h in hosts}
    deadline = time.monotonic() + 5
    while vnames & _link_names() and time.monotonic() < deadline:
        time.sleep(0.01)
    links = _link_names()
    lines = [f"link del {v}" for v in sorted(vnames & links)]
    if state.get("bridge") and state["bridge"] in links:
        lines.append(f"link del {state['bridge']}")
    if lines:
        _ip_batch(lines, force=True, check=False)
    for n in nsnames:
        shutil.rmtree(ETC_NETNS / n, ignore_errors=True)
    # veth peers / bridge can take a moment to disappear
    deadline = time.monotonic() + 5
    while _leftovers(state, procs_too=False) and time.monotonic() < deadline:
        time.sleep(0.05)


def _leftovers(state: Mapping, procs_too: bool = True) -> list[str]:
    hosts = state.get("hosts", [])
    left = []
    links = _link_names()
    nss = _netns_names()
    if state.get("bridge") in links:
        left.append(f"link {state['bridge']}")
    for h in hosts:
        if h["veth_root"] in links:
            left.append(f"link {h['veth_root']}")
        if h["netns"] in nss:
            left.append(f"netns {h['netns']}")
        if (ETC_NETNS / h["netns"]).exists():
            left.append(f"dir {ETC_NETNS / h['netns']}")
        if procs_too and h.get("sshd_pid") and _alive(int(h["sshd_pid"])) \
                and _is_lab_sshd(int(h["sshd_pid"]), h["sshd_config"]):
            left.append(f"sshd pid {h['sshd_pid']}")
    if procs_too:
        for ns, pids in _netns_pids([h["netns"] for h in hosts]).items():
            if pids:
                left.append(f"pids in {ns}: {pids}")
    return left


def _owner_alive(state: Mapping) -> bool:
    pid = state.get("owner_pid")
    if not pid or not _alive(int(pid)):
        return False
    return _proc_starttime(int(pid)) == state.get("owner_starttime")


def reap_stale(state_dir: pathlib.Path, *, force: bool = False) -> list[str]:
    """Clean labs left behind under ``state_dir`` (its state file or its subdirs').

    Uses only the names and PIDs recorded in each ``netlab-state.json``; a PID
    is killed only if it still is an sshd whose command line names that lab's
    config.  Labs whose owning process is still running, and labs started
    detached (CLI ``up``), are skipped unless ``force``.  Returns the root
    dirs of the labs cleaned.
    """
    state_dir = pathlib.Path(state_dir)
    files = [state_dir / STATE_FILE, *sorted(state_dir.glob(f"*/{STATE_FILE}"))]
    cleaned = []
    for sf in files:
        try:
            state = json.loads(sf.read_text())
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as e:
            raise LabError(f"unreadable lab state {sf}: {e}") from e
        if not force and (state.get("detached") or _owner_alive(state)):
            continue
        _teardown(state)
        left = _leftovers(state)
        if left:
            raise LabError(f"could not reap lab in {sf.parent}: {left}")
        sf.unlink()
        cleaned.append(str(sf.parent))
    return cleaned


Lab.reap_stale = staticmethod(reap_stale)  # type: ignore[attr-defined]


# --------------------------------------------------------------------------
# inventory


_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
_PLAIN_STR = re.compile(r"^[A-Za-z_/][A-Za-z0-9_./+-]*$")
_IPV4 = re.compile(r"^\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}$")
_YAML_WORDS = {"true", "false", "yes", "no", "on", "off", "y", "n", "null", "none", "~"}


def _yaml_scalar(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (pathlib.PurePath,)):
        v = str(v)
    if isinstance(v, str):
        if (_PLAIN_STR.match(v) or _IPV4.match(v)) and v.lower() not in _YAML_WORDS:
            return v
        return json.dumps(v)  # a JSON string is a valid YAML double-quoted scalar
    return json.dumps(v)  # lists / dicts as JSON flow collections (valid YAML)


def _yaml_key(k: str) -> str:
    return k if _PLAIN_KEY.match(k) else json.dumps(k)


def write_inventory(lab: Lab, path: pathlib.Path, groups: Mapping | None = None,
                    extra_vars: Mapping | None = None) -> pathlib.Path:
    """Write an Ansible-style YAML inventory pointing at the lab hosts.

    ``groups`` maps a group name (``ps``, ``worker``, ...) to host names (a
    list) or to ``{host name: {host vars}}``.  Default: first host ``ps``, the
    others ``worker`` (a 1-host lab gets the host in both).  ``ansible_host``
    is written at every occurrence of a host.  ``extra_vars`` are merged
    into ``all.vars`` (overriding the defaults).
    """
    if groups is None:
        names = lab.names
        groups = {"ps": names[:1], "worker": names[1:] or names[:1]}
    all_vars = {
        "ansible_user": "root",
        "ansible_ssh_private_key_file": str(lab.key_path),
        "pscluster_known_hosts": str(lab.known_hosts),
        "pscluster_python": venv_python(),
    }
    all_vars.update(extra_vars or {})
    out = ["all:", "  vars:"]
    for k, v in all_vars.items():
        out.append(f"    {_yaml_key(k)}: {_yaml_scalar(v)}")
    out.append("  children:")
    for group, members in groups.items():
        out.append(f"    {_yaml_key(group)}:")
        if isinstance(members, Mapping):
            items = list(members.items())
        else:
            items = [(m, None) for m in members]
        if not items:
            out.append("      hosts: {}")
            continue
        out.append("      hosts:")
        for member, hvars in items:
            h = lab.host(member.name if isinstance(member, LabHost) else member)
            hv = {"ansible_host": h.address}
            hv.update(hvars or {})
            out.append(f"        {_yaml_key(h.name)}:")
            for k, v in hv.items():
                out.append(f"          {_yaml_key(k)}: {_yaml_scalar(v)}")
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(out) + "\n")
    return path


# --------------------------------------------------------------------------
# CLI


def _main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m testbed.netlab",
                                 description="network-namespace SSH lab")
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start N hosts, print JSON, leave them running")
    up.add_argument("n", type=int)
    up.add_argument("--dir", required=True, type=pathlib.Path)
    up.add_argument("--subnet", default="127.77.0", help="e.g. 127.78.0, or 'auto'")
    up.add_argument("--tag")
    up.add_argument("--first-host", type=int, default=2)
    up.add_argument("--host-prefix", default="node-")
    up.add_argument("--inventory", type=pathlib.Path,
                    help="also write an inventory (first host ps, others worker)")
    down = sub.add_parser("down", help="stop the lab started with up --dir DIR")
    down.add_argument("--dir", required=True, type=pathlib.Path)
    reap = sub.add_parser("reap", help="clean labs left behind under STATE_DIR")
    reap.add_argument("state_dir", type=pathlib.Path)
    reap.add_argument("--force", action="store_true",
                      help="also labs whose owner is alive or that were started detached")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "up":
            lab = Lab(args.n, args.dir, tag=args.tag, subnet=args.subnet,
                      first_host=args.first_host, host_prefix=args.host_prefix)
            lab.start()
            assert lab._state is not None
            lab._state["detached"] = True
            lab._state["owner_pid"] = None
            lab._write_state()
            info = lab.describe()
            info["timings"] = lab.timings
            if args.inventory:
                info["inventory"] = str(write_inventory(lab, args.inventory))
            print(json.dumps(info, indent=2))
        elif args.cmd == "down":
            if not (args.dir / STATE_FILE).exists():
                print(json.dumps({"stopped": False, "reason": "no lab state file"}))
                return 0
            lab = Lab.load(args.dir)
            t0 = time.monotonic()
            lab.stop()
            print(json.dumps({"stopped": True, "seconds": round(time.monotonic() - t0, 3)}))
        elif args.cmd == "reap":
            print(json.dumps({"reaped": reap_stale(args.state_dir, force=args.force)}))
    except LabUnavailable as e:
        print(f"lab unavailable: {e.reason}", file=sys.stderr)
        return 2
    except LabError as e:
        print(f"lab error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main())
