"""SSH transport: the only module of pscluster that imports Fabric or paramiko.

Fabric gives us the connection (``~/.ssh/config`` is honoured, keys, agent) and SFTP. Two of
its defaults are replaced on purpose:

* Host keys: Fabric 3 sets paramiko's ``AutoAddPolicy`` and loads no known_hosts file, i.e. it
  trusts any server. We load the inventory's known_hosts (default ``~/.ssh/known_hosts``) and
  reject unknown keys, or accept and remember them on first contact with
  ``pscluster_host_key_policy: accept-new`` (like OpenSSH's ``StrictHostKeyChecking=accept-new``);
  a changed key is refused either way.
* Commands run on raw exec channels rather than Invoke runners, so stdin can be fed and closed
  at once and a deadline bounds every call (``run``: its timeout; channel opening and SFTP: the
  host's connect timeout).
* A dead host is detected by this process's one watchdog (cluster/transport/keepalive.py), not
  by paramiko's keepalive (which sends requests that want no reply, so it never notices
  silence): every 2 s it asks each connection for a reply to ``keepalive@openssh.com`` and closes
  one that has not answered for 10 s; whatever waits on it (a command, SFTP, a stream) then fails
  at once with "connection lost" naming the host. One thread and a fixed pool for every host,
  where each connection had two threads of its own before.
* paramiko's reader thread wakes every 0.1 s (its socket timeout) to see whether the connection
  was closed; once the connection is open it wakes every ``IDLE_WAKEUP_SECONDS`` instead. With
  one connection per host that is 10 wake-ups a second per host for nothing: at 1,000 hosts
  10,000 a second on the supervisor's one interpreter (docs/benchmarks.md, "Scale").
* sshd's ``MaxSessions`` (default 10) caps the session channels of one connection: a command,
  SFTP and a ``hostctl watch`` stream each take one while open. When sshd refuses one, the
  connection is healthy (it was dropped as "lost" before, taking the job's watch with it): the
  session is opened on a further connection to the host instead, up to
  ``MAX_CONNECTIONS_PER_HOST``, and only then refused with the host and the setting to raise.
  A further connection rather than waiting for a channel to close, because the channel holding
  the slot may be a watch stream that closes only when the job ends (MaxSessions 1 on the SSH
  lab: every command of a job waited for nothing). SFTP is closed after each copy, so a code
  sync holds no session after it ends.
"""
from __future__ import annotations

import logging
import os
import random
import re
import shlex
import shutil
import socket
import stat as stat_module
import tempfile
import threading
import time
from typing import Any, Callable, Sequence

import fabric
import paramiko

from ..errors import HostError, UnreachableHostError, UsageError
from .base import CommandResult, Stream, Transport, file_mode, temp_name
from .keepalive import KEEPALIVES, heard

# paramiko logs a refused channel ("Secsh channel 7 open FAILED: open failed: Connect failed") at
# ERROR with no handler of ours, so Python's last-resort handler printed it amid the CLI's output;
# what went wrong reaches the user as pscluster's own error instead.
logging.getLogger("paramiko.transport").addHandler(logging.NullHandler())

# Connections to one host when its sshd refuses sessions (MaxSessions): one session each at
# MaxSessions 1 is a watch stream, a command and a copy at once, with one to spare.
MAX_CONNECTIONS_PER_HOST = 4
# sshd answers a session it will not open with SSH2_OPEN_CONNECT_FAILED ("open failed"): a session
# connects to nothing, so on a session open that reason can only be a refusal.
_SESSION_REFUSED = paramiko.common.OPEN_FAILED_CONNECT_FAILED
SESSION_RETRY_PAUSES = (0.0, 0.02, 0.05, 0.1, 0.2)

# Backoff while sshd closes new connections before its banner (MaxStartups): 0.1 s doubling, for
# the host's connect timeout and at least STARTUP_MIN_PATIENCE seconds.
STARTUP_FIRST_DELAY = 0.1
STARTUP_MIN_PATIENCE = 10.0

# How often an open connection's reader thread wakes when nothing arrives. It only delays the end
# of a thread whose connection is closed (data wakes it at once; keepalives are the watchdog's).
IDLE_WAKEUP_SECONDS = 1.0
_KNOWN_HOSTS_LOCK = threading.Lock()
_CONFIG_LOCK = threading.Lock()
_SSH_CONFIG: paramiko.SSHConfig | None = None


def _fabric_config() -> fabric.Config:
    """A Fabric configuration of its own for each connection, over one parsed ~/.ssh/config
    shared by all (parsing it per connection cost more CPU than the SSH handshake). One Config
    object shared by the fan-out's threads was seen empty in a connection's constructor
    ("No attribute or config key found for 'port'", 2 runs in ~40 of the SSH lab); a fresh one
    costs 0.2 ms."""
    return fabric.Config(ssh_config=_ssh_config())


def _ssh_config() -> paramiko.SSHConfig:
    """~/.ssh/config as Fabric loads it, parsed once per process (a lookup needs no Config)."""
    global _SSH_CONFIG
    with _CONFIG_LOCK:
        if _SSH_CONFIG is None:
            _SSH_CONFIG = fabric.Config().base_ssh_config
        return _SSH_CONFIG


_LOOKUPS: dict[tuple[int, str], tuple[paramiko.SSHConfig, dict]] = {}


def _config_lookup(address: str, config_path: str | None) -> dict:
    """What ``config_path``'s ssh config (None: the one Fabric loaded) says for ``address``;
    the loaded config's answers are kept per address (a lookup matched every Host pattern and
    was asked 3 times a connection: 6 % of a connection's CPU, issue 46)."""
    if config_path is not None:
        return dict(paramiko.SSHConfig.from_path(config_path).lookup(address))
    config = _ssh_config()
    with _CONFIG_LOCK:
        kept = _LOOKUPS.get((id(config), address))
    if kept is not None and kept[0] is config:
        return dict(kept[1])
    found = dict(config.lookup(address))
    with _CONFIG_LOCK:
        _LOOKUPS[(id(config), address)] = (config, found)
    return dict(found)


def _per_version(cache: dict, lock: threading.Lock, path: str, load: Callable[[str], Any]) -> Any:
    """``load(path)``, kept in ``cache`` while the file keeps its mtime and size; None when there
    is no such file."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    stamp = (found.st_mtime_ns, found.st_size)
    with lock:
        kept = cache.get(path)
        if kept is None or kept[0] != stamp:
            kept = cache[path] = (stamp, load(path))
        return kept[1]


_KEYS: dict[str, tuple[tuple[int, int], paramiko.PKey | None]] = {}
_KEYS_LOCK = threading.Lock()


def _load_key(path: str) -> paramiko.PKey | None:
    try:
        return paramiko.PKey.from_path(path)
    except Exception:   # encrypted, or a format only paramiko's own file loading knows: let it
        return None


def _private_key(path: str) -> paramiko.PKey | None:
    """The key in ``path``, read once per file version and process (reading and parsing it was
    8 % of a connection's CPU, issue 46); None for a key this cannot read without help (a
    passphrase): paramiko then reads the file itself, as before."""
    return _per_version(_KEYS, _KEYS_LOCK, path, _load_key)


_HOST_KEYS: dict[str, tuple[tuple[int, int], paramiko.HostKeys]] = {}


def _known_host_keys(path: str) -> paramiko.HostKeys | None:
    """known_hosts parsed once per file version and shared by every connection of this process:
    parsing it per connection made a fan-out to N hosts parse N x N keys."""
    return _per_version(_HOST_KEYS, _KNOWN_HOSTS_LOCK, path, paramiko.HostKeys)


# One known_hosts line: [@marker] hostnames keytype base64-key [comment] (sshd(8), "SSH_KNOWN_HOSTS
# FILE FORMAT"). /etc/passwd or /etc/shadow matches none of its lines.
_KNOWN_HOSTS_LINE = re.compile(r"(@(cert-authority|revoked)\s+)?\S+\s+[a-z][a-z0-9@.+-]*\s+[A-Za-z0-9+/]+={0,3}(\s.*)?")
_KNOWN_HOSTS_CHECKED: dict[str, tuple[tuple[int, int], str | None]] = {}


def known_hosts_problem(path: str) -> str | None:
    """Why ``path`` is not a known-hosts file (None: it is one, or it does not exist yet).

    With ``accept-new`` the file is appended to, as root too: ``pscluster_known_hosts:
    /etc/passwd`` was accepted and would have been written (issue 25, "Also")."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot read it: {exc.strerror}"
    with open(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat_module.S_ISREG(info.st_mode):
            return "not a regular file"
        stamp = (info.st_mtime_ns, info.st_size)
        cached = _KNOWN_HOSTS_CHECKED.get(path)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        problem = None
        for number, raw in enumerate(handle, 1):
            line = raw.decode("utf-8", "replace").strip()
            if line and not line.startswith("#") and not _KNOWN_HOSTS_LINE.fullmatch(line):
                problem = f"line {number} is not a known-hosts entry"
                break
        _KNOWN_HOSTS_CHECKED[path] = (stamp, problem)
        return problem


class AcceptNewPolicy(paramiko.MissingHostKeyPolicy):
    """Trust an unknown host key on first contact and append it to known_hosts.

    Only called for hosts that have no key on record; paramiko raises ``BadHostKeyException``
    itself when a recorded key differs, so a changed key is never accepted.
    """

    def __init__(self, known_hosts_path: str):
        self.path = known_hosts_path

    def missing_host_key(self, client, hostname, key):
        client.get_host_keys().add(hostname, key.get_name(), key)
        with _KNOWN_HOSTS_LOCK:
            os.makedirs(os.path.dirname(self.path) or ".", mode=0o700, exist_ok=True)
            with open(self.path, "a", encoding="ascii") as handle:
                handle.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


class _Tunnel(threading.Thread):
    """A local listener whose connections are carried to ``address:port`` over the transport's
    SSH connection (like ``ssh -L``), two pump threads per connection.

    ``unix=True`` (the probes of TF ports behind a bastion): a Unix socket, 0600 in a 0700
    folder of its own, so no other local user can reach the task's gRPC through it. A TCP
    listener on 127.0.0.1 let anyone on a shared login node who found it with ``ss -ltn`` reach
    the task from a member address, past ``--firewall``, and run graphs as the task's user (N1).
    ``unix=False``: 127.0.0.1 (``forward``, for a port the user asks for, e.g. TensorBoard)."""

    def __init__(self, owner: "SSHTransport", address: str, port: int, local_port: int = 0, *, unix: bool = False):
        super().__init__(name=f"ssh-tunnel-{owner.host.name}-{port}", daemon=True)
        self.owner, self.target = owner, (address, port)
        self.folder: str | None = None
        if unix:
            self.folder = tempfile.mkdtemp(prefix="pscluster-tunnel-")      # 0700
            path = os.path.join(self.folder, "s")
            self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            # No umask around bind: it is process-wide, and two tunnels opening at once left the
            # whole process at 0177 (issue 42, L6). The folder is 0700, so the socket is nobody
            # else's to reach between bind and chmod.
            self.listener.bind(path)
            os.chmod(path, 0o600)
            self.listener.listen(64)
            self.port = 0
            self.address = f"unix:{path}"
        else:
            self.listener = socket.create_server(("127.0.0.1", local_port))
            self.port = self.listener.getsockname()[1]
            self.address = f"127.0.0.1:{self.port}"

    def run(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:          # stopped
                return
            try:
                self.owner.connect()
                channel = self.owner._connected().transport.open_channel(
                    "direct-tcpip", self.target, ("127.0.0.1", 0), timeout=self.owner.host.connect_timeout)
            except (paramiko.SSHException, OSError, EOFError, HostError):
                client.close()       # the probe sees a closed connection: "not ready"
                continue
            for source, sink in ((client.recv, channel.sendall), (channel.recv, client.sendall)):
                threading.Thread(target=_pump, args=(source, sink, client, channel), daemon=True).start()

    def stop(self) -> None:
        self.listener.close()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


def _pump(source, sink, client: socket.socket, channel) -> None:
    try:
        while True:
            data = source(65536)
            if not data:
                break
            sink(data)
    except (OSError, EOFError, paramiko.SSHException):
        pass
    client.close()
    channel.close()


def lost_reason(exc: BaseException, *, timeout: float) -> str:
    """What was seen when a connection went, for "connection to ... lost: REASON" (and a failed
    SSH handshake or file copy, which paramiko ends the same ways).

    paramiko raises ``EOFError()`` or a timeout with no text when a peer goes away, and an
    exception object is true even when its text is empty: say what its type means instead.
    """
    text = str(exc).strip()
    if text:
        return text
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return f"no answer for {timeout:.0f} s"
    if isinstance(exc, EOFError):
        return "the connection closed"
    if isinstance(exc, ConnectionResetError):
        return "connection reset"
    return f"{type(exc).__name__} (no message)"


def config_jumps(address: str, config_path: str | None = None) -> tuple[str, ...]:
    """The ProxyJump hops an ssh config gives ``address`` (first hop first; ``none`` is none).

    ``config_path`` None reads the config Fabric loaded (``~/.ssh/config``)."""
    found = _config_lookup(address, config_path).get("proxyjump", "")
    return tuple(hop.strip() for hop in found.split(",") if hop.strip() and hop.strip().lower() != "none")


def parse_hop(hop: str, default_user: str | None) -> tuple[str, int | None, str | None]:
    """``[user@]host[:port]`` (``[v6]:port`` too) -> (address, port or None, user or the default)."""
    user, _, rest = hop.rpartition("@")
    if rest.startswith("["):
        address, _, tail = rest[1:].partition("]")
        port = tail[1:] if tail.startswith(":") else ""
    elif rest.count(":") == 1:
        address, _, port = rest.partition(":")
    else:
        address, port = rest, ""
    return address, int(port) if port.isdigit() else None, user or default_user


def _try_session(conn: fabric.Connection, timeout: float) -> paramiko.Channel | None:
    """A session channel on ``conn``, or None where sshd refused it (MaxSessions)."""
    try:
        return conn.client.get_transport().open_session(timeout=timeout)
    except paramiko.ChannelException as exc:
        if exc.code != _SESSION_REFUSED:
            raise
        return None


class _NoBanner(Exception):
    """sshd closed a new connection before its banner (past MaxStartups, or overloaded)."""


def _open_channels(conn: fabric.Connection) -> int:
    """Channels open on a connection (sessions and forwards alike), for the MaxSessions guess in a
    refusal. paramiko keeps them in ``Transport._channels`` and offers no public count."""
    channels: Any = getattr(conn.transport, "_channels", None)
    try:
        return sum(1 for channel in channels.values() if not channel.closed)
    except (AttributeError, TypeError):
        return 0


class SSHTransport(Transport):
    """Runs commands on a host over one persistent SSH connection."""

    def __init__(self, host, *, ssh_config: str | None = None):
        super().__init__(host)
        self.ssh_config = ssh_config      # an ssh config file instead of the one Fabric loads (tests)
        self._conn: fabric.Connection | None = None
        self._more: list[fabric.Connection] = []     # opened when sshd refused a session on the others
        self._tunnels: dict[tuple[str, int, bool], _Tunnel] = {}
        self._lock = threading.Lock()
        self._sftp_lock = threading.Lock()

    @property
    def where(self) -> str:
        user = f"{self.host.user}@" if self.host.user else ""
        port = f":{self.host.ssh_port}" if self.host.ssh_port else ""
        return f"{user}{self.host.address}{port}"

    def known_hosts_path(self) -> str:
        return os.path.expanduser(self.host.known_hosts or "~/.ssh/known_hosts")

    def connect(self) -> None:
        self._connected()

    def _connected(self) -> fabric.Connection:
        """The open connection, opened (again) if needed."""
        with self._lock:
            if self._conn is None or not self._conn.is_connected:
                self._conn = self._open()
            return self._conn

    def _session(self, timeout: float) -> paramiko.Channel:
        """A new session channel on the first of this host's connections whose sshd accepts one,
        on a connection opened for it if none does (see the module's docstring, MaxSessions).

        Raises:
            HostError: sshd refused it on ``MAX_CONNECTIONS_PER_HOST`` connections, or on a new one.
        """
        first = self._connected()
        with self._lock:
            self._more = [conn for conn in self._more if conn.is_connected]
            connections = [first, *self._more]
        held = 0
        # sshd frees a session's slot only once it has handled the close of the last one: a
        # command right after another was refused with no other channel open (MaxSessions 1 on
        # the SSH lab, the code sync after preflight's last command). So a few short tries first.
        for pause in SESSION_RETRY_PAUSES:
            time.sleep(pause)
            for conn in connections:
                channel = _try_session(conn, timeout)
                if channel is not None:
                    return channel
                held = max(held, _open_channels(conn))
            if held:         # a slot is taken for real (a stream): another connection, not waiting
                break
        if held == 0 or len(connections) >= MAX_CONNECTIONS_PER_HOST:     # 0: no connection would do
            raise self._refused(held, len(connections))
        conn = self._open()
        with self._lock:
            self._more.append(conn)
        channel = _try_session(conn, timeout)
        if channel is None:
            raise self._refused(0, 1)
        return channel

    def _refused(self, held: int, connections: int) -> HostError:
        where = "a connection with no other session" if held == 0 else f"each of {connections} connection(s) holding {held}"
        return HostError(self.host.name, f"sshd refused a session (MaxSessions {held}?) on {where} to {self.where}",
                         hint=f"raise MaxSessions in {self.host.name}'s sshd_config (pscluster holds up to 3 "
                              "sessions at once per host: a watch, a command and a copy; sshd's default is 10), "
                              "or check the sshd log there for why it refused")

    def _config_entry(self, address: str) -> dict:
        """What the ssh config (this transport's, else the one Fabric loaded) says for ``address``."""
        return _config_lookup(address, self.ssh_config)

    def _connection(self, address: str, port: int | None, user: str | None,
                    gateway: fabric.Connection | bool | None) -> fabric.Connection:
        """An unopened connection to one hop (or the host itself) with our host-key policy:
        every hop is checked against known_hosts like the target, never auto-added."""
        timeout = self.host.connect_timeout
        connect_kwargs: dict = {"banner_timeout": timeout, "auth_timeout": timeout,
                                "allow_agent": True, "look_for_keys": True}
        if self.host.key_file:
            path = os.path.expanduser(self.host.key_file)
            key = _private_key(path)
            if key is not None:
                connect_kwargs["pkey"] = key
            else:
                connect_kwargs["key_filename"] = [path]
            connect_kwargs["look_for_keys"] = False
        if gateway is None and "proxyjump" in self._config_entry(address):
            # Fabric would build this hop's ProxyJump itself, with AutoAddPolicy (N10): jumps()
            # already put those hops first, built here with our policy; False: no gateway of Fabric's.
            gateway = False
        conn = fabric.Connection(host=address, user=user, port=port, connect_timeout=timeout,
                                 connect_kwargs=connect_kwargs, config=_fabric_config(), gateway=gateway)
        known_hosts = self.known_hosts_path()
        recorded = _known_host_keys(known_hosts)
        if recorded is not None:     # only this host's entries, under the name paramiko looks up
            name = conn.host if conn.port == 22 else f"[{conn.host}]:{conn.port}"
            for keytype, key in (recorded.lookup(name) or {}).items():
                conn.client.get_host_keys().add(name, keytype, key)
        if self.host.host_key_policy == "accept-new":
            conn.client.set_missing_host_key_policy(AcceptNewPolicy(known_hosts))
        else:
            conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
        return conn

    def jumps(self) -> tuple[str, ...]:
        """ProxyJump hops: the inventory's, else the ssh config's for this host (~/.ssh/config;
        Fabric would follow the latter itself, but with AutoAddPolicy on the hop)."""
        if self.host.jump:      # the inventory's; ProxyJump=none: no hop, not even ~/.ssh/config's (N10)
            hops = tuple(hop for hop in self.host.jump if hop.lower() != "none")
        else:
            hops = config_jumps(self.host.address, self.ssh_config)
        # The first hop's own ProxyJump (~/.ssh/config), recursively: Fabric would otherwise open
        # those hops itself, trusting any host key (N10).
        seen: set[str] = set()
        while hops and len(hops) < 16:
            first = parse_hop(hops[0], self.host.user)[0]
            before = config_jumps(first, self.ssh_config)
            if first in seen or not before:
                break
            seen.add(first)
            hops = before + hops
        return hops

    def _open(self) -> fabric.Connection:
        """A new connection to the host (through its jump hosts), again with backoff while sshd
        closes it before its banner: what sshd does past ``MaxStartups`` (default 10:30:100, and
        every name of one machine, every host behind one bastion and every ``scale`` beside a
        supervisor connects to it at once)."""
        known_hosts = self.known_hosts_path()
        problem = known_hosts_problem(known_hosts)
        if problem:
            raise UnreachableHostError(self.host.name, f"{known_hosts} is not a known-hosts file: {problem}",
                                       hint="pscluster_known_hosts names a file of 'host keytype key' lines "
                                            "(default ~/.ssh/known_hosts)")
        began, delay, tries = time.monotonic(), STARTUP_FIRST_DELAY, 0
        while True:
            tries += 1
            try:
                return self._open_once(known_hosts)
            except _NoBanner:
                waited = time.monotonic() - began
                if waited + delay > max(self.host.connect_timeout, STARTUP_MIN_PATIENCE):
                    raise UnreachableHostError(
                        self.host.name, f"sshd at {self.where} closed {tries} connection(s) over {waited:.1f} s "
                        "before its banner (MaxStartups?)",
                        hint=f"sshd drops new connections past MaxStartups (default 10:30:100): raise it in "
                             f"{self.host.name}'s sshd_config (or its bastion's), or see the sshd log there; "
                             "or ansible_port is not an SSH server's") from None
            # Jitter: the hosts of a fan-out refused together must not come back together.
            time.sleep(delay * random.uniform(0.5, 1.5))
            delay *= 2

    def _open_once(self, known_hosts: str) -> fabric.Connection:
        timeout = self.host.connect_timeout
        gateway: fabric.Connection | bool | None = None
        for hop in self.jumps():
            address, port, user = parse_hop(hop, self.host.user)
            gateway = self._connection(address, port, user, gateway)
        if gateway is None and any(hop.lower() == "none" for hop in self.host.jump):
            gateway = False      # ProxyJump=none in the inventory: not ~/.ssh/config's hops either
        conn = self._connection(self.host.address, self.host.ssh_port, self.host.user, gateway)
        try:
            conn.open()
        except paramiko.BadHostKeyException as exc:
            raise UnreachableHostError(
                self.host.name, f"host key of {self.where} does not match {known_hosts} "
                f"(got {exc.key.get_name()} {exc.key.get_fingerprint().hex()})",
                hint="if the host was reinstalled, remove its old line with "
                     f"'ssh-keygen -R {self.host.address} -f {known_hosts}' after checking the new key") from None
        except paramiko.AuthenticationException as exc:
            raise UnreachableHostError(
                self.host.name, f"authentication failed for {self.where}: {exc}",
                hint="check ansible_user and ansible_ssh_private_key_file (key authentication only)") from None
        except paramiko.SSHException as exc:
            text = str(exc)
            if text.startswith("Error reading SSH protocol banner"):
                raise _NoBanner() from None
            if "not found in known_hosts" in text:
                raise UnreachableHostError(
                    self.host.name, f"unknown host key for {self.where} (not in {known_hosts})",
                    hint=f"check the host's fingerprint, then add it: 'ssh-keyscan {self.host.address} "
                         f">> {known_hosts}'; or set pscluster_host_key_policy: accept-new") from None
            raise UnreachableHostError(self.host.name, f"SSH to {self.where} failed: {lost_reason(exc, timeout=timeout)}",
                                       hint="is sshd running there?") from None
        except (socket.timeout, TimeoutError) as exc:
            raise UnreachableHostError(
                self.host.name, f"cannot reach {self.where}: timed out after {timeout:.0f} s",
                hint="is the host up and on the network? check ansible_host / ansible_port") from exc
        except (OSError, EOFError) as exc:
            reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            raise UnreachableHostError(self.host.name, f"cannot reach {self.where}: {reason}",
                                       hint="is the host up and sshd listening? check ansible_host / ansible_port") from None
        conn.transport.sock.settimeout(IDLE_WAKEUP_SECONDS)
        KEEPALIVES.watch(conn.transport)
        return conn

    def run(self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float = 60.0) -> CommandResult:
        self.connect()
        command = shlex.join(argv)
        deadline = time.monotonic() + timeout
        try:
            channel = self._session(timeout)
            channel.settimeout(timeout)
            channel.exec_command(command)
            if stdin:
                channel.sendall(stdin)
            channel.shutdown_write()
            out, err = bytearray(), bytearray()
            # Block on stdout until EOF (the server sends EOF once stdout and stderr are both
            # closed, so stderr is complete then), then wait for the exit status: no polling.
            while True:
                channel.settimeout(max(0.01, deadline - time.monotonic()))
                try:
                    chunk = channel.recv(65536)
                except socket.timeout:
                    channel.close()
                    raise HostError(self.host.name, f"command timed out after {timeout:.0f} s", argv=argv,
                                    stderr=err.decode("utf-8", "replace")) from None
                if not chunk:
                    break
                out += chunk
                while channel.recv_stderr_ready():
                    err += channel.recv_stderr(65536)
            while channel.recv_stderr_ready():
                err += channel.recv_stderr(65536)
            if not channel.status_event.wait(max(0.01, deadline - time.monotonic())):
                channel.close()
                raise HostError(self.host.name, f"command timed out after {timeout:.0f} s", argv=argv,
                                stderr=err.decode("utf-8", "replace"))
            code = channel.recv_exit_status()
            channel.close()
            if code == -1 and not channel.get_transport().is_active():   # closed under us: no real status
                raise EOFError("the connection closed")
        except (paramiko.SSHException, EOFError, OSError) as exc:
            self._drop()
            raise UnreachableHostError(self.host.name, f"connection to {self.where} lost: {lost_reason(exc, timeout=timeout)}",
                                       argv=argv) from None
        return CommandResult(self.host.name, tuple(argv), code, out.decode("utf-8", "replace"),
                             err.decode("utf-8", "replace"))

    def stream(self, argv: Sequence[str], *, stdin: bytes | None = None) -> Stream:
        self.connect()
        try:
            channel = self._session(self.host.connect_timeout)
            channel.exec_command(shlex.join(argv))
            if stdin:
                channel.sendall(stdin)
            channel.shutdown_write()
        except (paramiko.SSHException, EOFError, OSError) as exc:
            self._drop()
            raise UnreachableHostError(self.host.name,
                                       f"connection to {self.where} lost: {lost_reason(exc, timeout=self.host.connect_timeout)}",
                                       argv=argv) from None
        channel.settimeout(None)
        transport = channel.get_transport()

        def read() -> bytes:
            chunk = channel.recv(65536)
            if chunk:
                heard(transport, time.monotonic())     # the watchdog asks it nothing meanwhile
            return chunk

        def ready() -> bool:        # read() would not wait: data, its end, or the channel closed
            return bool(channel.recv_ready() or channel.eof_received or channel.closed)
        # Pulled by the supervisor's turns (every 0.1 s), not pumped by a thread per host (issue 46).
        return Stream(read, channel.close, ready=ready)

    def tunnel(self, address: str, port: int) -> str | None:
        """Behind a jump host, TF ports are probed through this SSH connection (a direct-tcpip
        channel per probe connection), so the control machine needs to reach only the bastion."""
        if not self.jumps():
            return None
        return self._listen(address, port, unix=True)      # a 0600 Unix socket, never a TCP port (N1)

    def forward(self, address: str, port: int, *, local_port: int = 0) -> str | None:
        """A direct-tcpip channel over this connection per accepted local connection."""
        return self._listen(address, port, local_port=local_port)

    def _listen(self, address: str, port: int, *, local_port: int = 0, unix: bool = False) -> str:
        key = (address, port, unix)
        with self._lock:
            tunnel = self._tunnels.get(key)
            if tunnel is None or not tunnel.is_alive() or (local_port and tunnel.port != local_port):
                try:
                    tunnel = _Tunnel(self, address, port, local_port, unix=unix)
                except OSError as exc:
                    raise UsageError(f"cannot listen on 127.0.0.1:{local_port} here: {exc.strerror or exc}",
                                     hint="choose another local port (--port)") from None
                old, self._tunnels[key] = self._tunnels.get(key), tunnel
                if old is not None:
                    old.stop()
                tunnel.start()
        return tunnel.address

    def _put_files(self, files: Sequence[tuple[str, str]], *, mode: int | None = None) -> None:
        self.connect()
        limit = max(30.0, self.host.connect_timeout * 3)
        with self._sftp_lock:
            try:
                # A client of its own, closed after: Fabric's cached one kept a session open for
                # the connection's life (with MaxSessions 1, no command ran after a code sync).
                channel = self._session(limit)
                channel.invoke_subsystem("sftp")
                with paramiko.SFTPClient(channel) as sftp:
                    sftp.get_channel().settimeout(limit)
                    made: set[str] = set()
                    for local, remote in files:
                        path = remote[2:] if remote.startswith("~/") else remote   # SFTP starts in $HOME
                        self._makedirs(sftp, os.path.dirname(path), made)
                        tmp = temp_name(path)
                        sftp.put(local, tmp)
                        sftp.chmod(tmp, mode if mode is not None else file_mode(local))
                        sftp.posix_rename(tmp, path)
            except (paramiko.SSHException, EOFError, OSError) as exc:
                self._drop()
                raise HostError(self.host.name,
                                f"copying files to {self.where} failed: {lost_reason(exc, timeout=limit)}") from None

    @staticmethod
    def _makedirs(sftp, directory: str, made: set[str]) -> None:
        if not directory or directory in made:
            return
        parts = directory.split("/")
        for end in range(1, len(parts) + 1):
            partial = "/".join(parts[:end]) or "/"
            if partial in made or partial in ("", "/"):
                continue
            try:
                sftp.stat(partial)
            except FileNotFoundError:
                try:
                    sftp.mkdir(partial)
                except OSError:        # another host sharing this filesystem made it meanwhile
                    sftp.stat(partial)
            made.add(partial)

    def _drop(self) -> None:
        with self._lock:
            connections, self._more = [self._conn, *self._more], []
            self._conn = None
        for conn in connections:
            if conn is not None:
                try:
                    conn.close()
                except Exception:   # closing a broken connection may raise anything
                    pass

    def reset(self) -> None:
        self._drop()

    def close(self) -> None:
        with self._lock:
            tunnels, self._tunnels = list(self._tunnels.values()), {}
        for tunnel in tunnels:
            tunnel.stop()
        self._drop()
