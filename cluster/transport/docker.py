"""Transport for ``ansible_connection: docker`` hosts: commands run through ``docker exec -i``.

As Ansible's ``community.docker.docker`` connection plugin: ``ansible_host`` names the container
(default: the inventory host name), ``ansible_user`` the user inside it (``docker exec --user``;
default ``pscluster``, the node image's user, never the image's root unless asked for),
``ansible_docker_extra_args`` extra arguments for the docker client itself (``-H tcp://...``,
``--context``...), placed before ``exec``. No sshd is needed in the container.

* ``run``: ``docker [extra] exec -i [--user U] CONTAINER GUARD ARGV``, stdin sent, output captured.
  Killing a ``docker exec`` client does not end what it started in the container, so ARGV runs
  under a guard (``_GUARD``, as streams do) that ends it when our side of its stdin closes: at
  the operation's timeout, or when this process dies. Processes hostctl starts detached (setsid)
  outlive the ``docker exec`` that started them: they are re-parented to the container's init
  (the node image runs tini as PID 1).
* ``put_files``: one ``docker exec`` per call that unpacks a tar stream, each file written to a
  temporary and renamed (as the other transports do), with its mode.
* ``tunnel``: task addresses are container names, which Docker's DNS resolves inside a
  user-defined network but not on the control machine; probes go to the container's address on
  that network, asked with ``docker inspect``.

Why a container cannot be used is said once, precisely (:func:`diagnose`): no docker client, no
daemon, no such container, or a stopped one.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import shlex
import shutil
import subprocess
import tarfile
import threading
from typing import IO, Sequence, cast

from ..errors import HostError, UnreachableHostError
from ..plan import HostSpec
from .base import CommandResult, Stream, file_mode
from .local import LocalTransport, end_process

# Unpacks a tar from stdin: each member is written beside its target and renamed into place.
_UNTAR = ("import io,os,sys,tarfile,uuid\n"
          "t=tarfile.open(fileobj=io.BytesIO(sys.stdin.buffer.read()))\n"
          "for m in t.getmembers():\n"
          " p=os.path.expanduser(m.name) if m.name.startswith('~') else '/'+m.name.lstrip('/')\n"
          " os.makedirs(os.path.dirname(p) or '.',exist_ok=True)\n"
          " q=p+'.pscluster-tmp-'+uuid.uuid4().hex\n"
          " f=t.extractfile(m)\n"
          " open(q,'wb').write(f.read() if f else b'')\n"
          " os.chmod(q,m.mode)\n"
          " os.replace(q,p)\n")


# Runs ARGV with the first N bytes of stdin as its input, then waits for the rest of stdin to end
# (our pipe closed, or our process gone) and ends ARGV's process group: see DockerTransport.run and
# .stream. It exits as docker exec would: ARGV's status, 128+N after signal N, 127 when ARGV
# cannot start.
_GUARD = ("import os,signal,subprocess,sys,threading\n"
          "n=int(sys.argv[1]);d=b''\n"
          "while len(d)<n:\n"
          " c=os.read(0,n-len(d))\n"
          " if not c: break\n"
          " d+=c\n"
          "try: p=subprocess.Popen(sys.argv[2:],stdin=subprocess.PIPE,start_new_session=True)\n"
          "except OSError as e:\n"
          " sys.stderr.write(sys.argv[2]+': '+str(e.strerror)+'\\n');sys.exit(127)\n"
          "def w():\n"
          " while os.read(0,65536): pass\n"
          " try: os.killpg(p.pid,signal.SIGTERM)\n"
          " except OSError: pass\n"
          "threading.Thread(target=w,daemon=True).start()\n"
          "try: p.stdin.write(d);p.stdin.close()\n"
          "except OSError: pass\n"
          "r=p.wait()\n"
          "sys.exit(128-r if r<0 else r)\n")


def docker_client() -> str | None:
    """The docker CLI: ``PSCLUSTER_DOCKER`` if set, else Debian's ``/usr/bin/docker``, else PATH's."""
    chosen = os.environ.get("PSCLUSTER_DOCKER")
    if chosen:
        return chosen if shutil.which(chosen) else None
    if os.access("/usr/bin/docker", os.X_OK):
        return "/usr/bin/docker"
    return shutil.which("docker")


def container_of(host: HostSpec) -> str:
    return host.address


def diagnose(host: HostSpec, *, timeout: float = 20.0) -> str | None:
    """Why ``host``'s container cannot run commands (None: it can): the client, the daemon, the
    container's existence and state, each named with what to do."""
    client = docker_client()
    if client is None:
        return "the docker CLI is not installed on this machine (apt-get install docker.io, or set PSCLUSTER_DOCKER)"
    argv = [client, *host.docker_args, "inspect", "--type", "container", "--format",
            "{{json .State}}", container_of(host)]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"the docker daemon did not answer within {timeout:.0f} s"
    if proc.returncode != 0:
        message = (proc.stderr or proc.stdout).strip()
        if "Cannot connect to the Docker daemon" in message or "Is the docker daemon running" in message \
                or "connect: " in message or "error during connect" in message:
            return f"the docker daemon is not reachable: {message.splitlines()[-1] if message else ''}"
        if "No such container" in message or "No such object" in message:
            return f"no container named {container_of(host)!r} (docker ps -a lists them)"
        return message.splitlines()[-1] if message else f"docker inspect exited {proc.returncode}"
    try:
        state = json.loads(proc.stdout)
    except ValueError:
        return f"docker inspect printed no JSON: {proc.stdout.strip()[:200]}"
    if not state.get("Running"):
        return f"container {container_of(host)!r} is {state.get('Status', 'not running')} " \
               f"(start it: docker start {container_of(host)})"
    if state.get("Paused"):
        return f"container {container_of(host)!r} is paused (docker unpause {container_of(host)})"
    return None


class DockerTransport(LocalTransport):   # its subprocess stream serves; run and put_files go through docker exec
    """Runs argv lists in one container with ``docker exec``."""

    def __init__(self, host: HostSpec):
        super().__init__(host)
        self._addresses: dict[str, str] = {}
        self._lock = threading.Lock()

    def _client(self) -> str:
        client = docker_client()
        if client is None:
            raise UnreachableHostError(self.host.name, "the docker CLI is not installed on this machine",
                                       hint="apt-get install docker.io (or set PSCLUSTER_DOCKER to the client)")
        return client

    def _exec(self, argv: Sequence[str]) -> list[str]:
        user = ["--user", self.host.user] if self.host.user else []
        return [self._client(), *self.host.docker_args, "exec", "-i", *user, container_of(self.host), *argv]

    def connect(self) -> None:
        why = diagnose(self.host, timeout=max(5.0, self.host.connect_timeout * 2))
        if why is not None:
            raise UnreachableHostError(self.host.name, why, hint="ansible_host names the container "
                                       "(ansible_connection: docker)")

    def describe(self) -> str | None:
        client = docker_client()
        image = None
        if client is not None:
            proc = subprocess.run([client, *self.host.docker_args, "inspect", "--type", "container", "--format",
                                   "{{.Config.Image}}", container_of(self.host)], capture_output=True, text=True,
                                  timeout=20)
            image = proc.stdout.strip() if proc.returncode == 0 else None
        return f"container {container_of(self.host)}" + (f", image {image}" if image else "")

    def _start_guarded(self, argv: Sequence[str], data: bytes, *, stderr: int) -> tuple[list[str], subprocess.Popen]:
        """``docker exec`` of ``argv`` under ``_GUARD``, which hands it the first ``len(data)``
        bytes of stdin and ends it once the rest of stdin ends; started, stdin and stdout pipes."""
        command = self._exec([self.host.python, "-I", "-S", "-c", _GUARD, str(len(data)), *argv])
        try:
            return command, subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr)
        except OSError as exc:
            raise HostError(self.host.name, f"cannot start {command[0]}: {exc.strerror}", argv=argv) from None

    def run(self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float = 60.0) -> CommandResult:
        """Our side of the guard's stdin stays open while ``argv`` runs and closes at the
        timeout (with the client): the guard then ends ``argv`` in the container."""
        data = stdin or b""
        command, proc = self._start_guarded(argv, data, stderr=subprocess.PIPE)
        pipe_in = cast(IO[bytes], proc.stdin)
        output: dict[str, bytes] = {}
        threads = [threading.Thread(target=_read_all, args=(pipe, output, key), daemon=True)
                   for key, pipe in (("out", proc.stdout), ("err", proc.stderr))]
        threads.append(threading.Thread(target=_write_open, args=(pipe_in, data), daemon=True))
        for thread in threads:
            thread.start()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            end_process(proc)            # its stdin closes: the guard ends the command in the container
            raise HostError(self.host.name, f"command timed out after {timeout:.0f} s", argv=argv) from None
        finally:
            with contextlib.suppress(OSError):
                pipe_in.close()
        for thread in threads[:2]:
            thread.join()
        code, out = proc.returncode, output.get("out", b"")
        stderr = output.get("err", b"").decode("utf-8", "replace")
        # docker exec's own failures (not the command's): 125 from the client, 126/127 when the
        # runtime cannot start the program (Docker 20.10 says why on stdout), or the daemon's message.
        if code in (126, 127):
            said = out.decode("utf-8", "replace") + stderr
            if "unable to find user" in said:
                raise UnreachableHostError(self.host.name, f"no user {self.host.user!r} in {self.describe()}",
                                           hint="ansible_user must be a user of the container's image")
            if "OCI runtime exec failed" in said or "executable file not found" in said:
                return CommandResult(self.host.name, tuple(argv), 127, "", said)   # the program is missing
        if code in (1, 125) and not out and _docker_failed(stderr):
            why = diagnose(self.host) or stderr.strip()
            raise UnreachableHostError(self.host.name, why, argv=command[:command.index("exec") + 1])
        return CommandResult(self.host.name, tuple(argv), code,
                             out.decode("utf-8", "replace"), stderr)

    def stream(self, argv: Sequence[str], *, stdin: bytes | None = None) -> Stream:
        """Killing a ``docker exec`` client does not end the process it started in the container,
        so the command runs under a guard (``_GUARD``) that ends it when our side of stdin closes:
        at :meth:`Stream.close`, or when this process dies."""
        data = stdin or b""
        _, proc = self._start_guarded(argv, data, stderr=subprocess.DEVNULL)
        pipe_in, pipe_out = cast(IO[bytes], proc.stdin), cast(io.BufferedReader, proc.stdout)
        pipe_in.write(data)
        pipe_in.flush()

        def close() -> None:
            with contextlib.suppress(OSError):
                pipe_in.close()          # the guard sees EOF and ends the command in the container
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)     # the client ends with the command
            end_process(proc)
            pipe_out.close()

        return Stream(lambda: pipe_out.read1(65536), close)

    def _put_files(self, files: Sequence[tuple[str, str]], *, mode: int | None = None) -> None:
        if not files:
            return
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for local, remote in files:
                with open(local, "rb") as handle:
                    # From the open file (fstat), not the name: a symlink travels as its content,
                    # as SFTP put and the local copy send it, never as a link (issue 42, M2).
                    info = tar.gettarinfo(arcname=remote, fileobj=handle)
                    info.mode = mode if mode is not None else file_mode(local)
                    info.uid = info.gid = 0
                    info.uname = info.gname = ""
                    tar.addfile(info, handle)
        self.run([self.host.python, "-I", "-S", "-c", _UNTAR], stdin=buffer.getvalue(),
                 timeout=max(60.0, len(buffer.getvalue()) / 5e6)).check(f"copy {len(files)} file(s)")

    def tunnel(self, address: str, port: int) -> str | None:
        """The container's own address for ``address`` when that is a container name (the control
        machine cannot resolve it); None for an address it can reach as written."""
        with self._lock:
            known = self._addresses.get(address)
        if known is None:
            known = self._inspect_address(address)
            if known is None:
                return None
            with self._lock:
                self._addresses[address] = known
        return f"[{known}]:{port}" if ":" in known else f"{known}:{port}"

    def _inspect_address(self, name: str) -> str | None:
        client = docker_client()
        if client is None:
            return None
        proc = subprocess.run([client, *self.host.docker_args, "inspect", "--type", "container", "--format",
                               "{{json .NetworkSettings.Networks}}", name], capture_output=True, text=True, timeout=20)
        if proc.returncode != 0:
            return None
        try:
            networks = json.loads(proc.stdout) or {}
        except ValueError:
            return None
        for network in sorted(networks):     # a user-defined network first: its names resolve
            found = networks[network].get("IPAddress")
            if found and network != "bridge":
                return found
        return next((n.get("IPAddress") for n in networks.values() if n.get("IPAddress")), None)

    def forward(self, address: str, port: int, *, local_port: int = 0) -> str | None:
        raise HostError(self.host.name, "cannot forward a port into a container reached with docker exec",
                        hint=f"publish the port (docker run -p) or connect to {self.tunnel(address, port)}")


def _read_all(pipe: IO[bytes], into: dict[str, bytes], key: str) -> None:
    with pipe:
        into[key] = pipe.read()


def _write_open(pipe: IO[bytes], data: bytes) -> None:
    """Send ``data`` and leave the pipe open (the guard's signal to go on); a command that ended
    without reading it all closed the other end."""
    with contextlib.suppress(OSError):
        pipe.write(data)
        pipe.flush()


def _docker_failed(stderr: str) -> bool:
    return any(text in stderr for text in (
        "Error response from daemon", "Cannot connect to the Docker daemon", "No such container",
        "is not running", "is paused", "error during connect", "OCI runtime exec failed"))


def docker_args(value: str | None) -> tuple[str, ...]:
    """``ansible_docker_extra_args`` as argv words (Ansible splits it with shlex too)."""
    return tuple(shlex.split(value)) if value else ()
