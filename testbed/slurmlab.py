"""A real Slurm 22.05 on this machine: munged, slurmctld and N slurmd, each node in its own netns.

Follows the fact sheet of a real Slurm 22.05 on network namespaces (its traps T1-T13): nodes ``<tag>n1..N`` at 127.<a>.<b>.2.., the
controller at .1 on a bridge; own munged socket, own ports, own temp dir, private /etc/hosts
bind-mounted only inside the daemons' mount namespaces; fake GPUs as GRES (char devices).
Every daemon is our child (Popen) and is stopped by PID; namespaces, links, the local-table route
and the freezer cgroups are removed at :meth:`SlurmLab.stop`.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time

PACKAGES = ("slurmctld", "slurmd", "srun", "munged", "mungekey", "sinfo", "salloc", "scontrol", "nsenter", "unshare")


def missing_tools() -> list[str]:
    return [tool for tool in PACKAGES if shutil.which(tool) is None]


class SlurmLab:
    def __init__(self, nodes: int = 2, gpus: int = 2):
        self.count = nodes
        self.gpus = gpus
        unique = os.getpid() % 200 + 20
        self.tag = f"ps{os.getpid() % 100000}"
        self.subnet = f"127.89.{unique}"
        self.bridge = f"{self.tag}br"[:15]
        self.port = 17000 + unique * 2
        self.dir = tempfile.mkdtemp(prefix="pscluster-slurm-")
        os.chmod(self.dir, 0o755)
        self.nodes = [f"{self.tag}n{k}" for k in range(1, nodes + 1)]
        self.procs: list[subprocess.Popen] = []
        self.netns: list[str] = []
        self.cut_nodes: set[str] = set()
        self.env = dict(os.environ, SLURM_CONF=self._p("etc/slurm.conf"))

    def _p(self, rel: str) -> str:
        return os.path.join(self.dir, rel)

    def addr(self, k: int) -> str:
        return f"{self.subnet}.{k + 1}"

    def _sh(self, *argv: str) -> None:
        subprocess.run(list(argv), check=True, capture_output=True)

    # ------------------------------------------------------------------ start
    def start(self) -> "SlurmLab":
        for sub in ("etc", "log", "run", "state", "spool", "dev", "munge", "munge-run"):
            os.makedirs(self._p(sub), exist_ok=True)
        os.chmod(self._p("munge"), 0o700)
        os.chmod(self._p("munge-run"), 0o755)   # T1: the socket dir must be a+x
        self._net_up()
        with open(self._p("etc/hosts"), "w") as handle:
            handle.write(f"127.0.0.1 localhost\n{self.addr(0)} {self.tag}ctl\n")
            handle.writelines(f"{self.addr(k)} {node}\n" for k, node in enumerate(self.nodes, 1))
        for index in range(self.gpus):
            os.mknod(self._p(f"dev/nvidia{index}"), 0o666 | 0o020000, os.makedev(1, 3))
        self._write_conf()
        self._sh("mungekey", "-c", "-k", self._p("munge/munge.key"))
        os.chmod(self._p("munge/munge.key"), 0o400)
        # In the foreground, as our child: stopped by PID and reaped by us (docs/platform-notes.md S2).
        self._daemon("munged", ["munged", "--foreground", f"--key-file={self._p('munge/munge.key')}",
                                f"--socket={self._p('munge-run/munge.sock')}", f"--log-file={self._p('log/munged.log')}",
                                f"--pid-file={self._p('munge-run/munged.pid')}",
                                f"--seed-file={self._p('munge/munged.seed')}"])
        deadline = time.monotonic() + 10
        while not os.path.exists(self._p("munge-run/munged.pid")):
            if time.monotonic() > deadline or self.procs[-1].poll() is not None:
                raise RuntimeError(f"munged did not start; see {self._p('log/munged.out')}")
            time.sleep(0.05)
        hosts = self._p("etc/hosts")
        self._daemon("ctld", ["unshare", "--uts", "--mount", "sh", "-c",
                              f"mount --bind {hosts} /etc/hosts && hostname {self.tag}ctl && exec slurmctld -D -i"])
        for k, node in enumerate(self.nodes, 1):
            os.makedirs(self._p(f"spool/{node}"), exist_ok=True)
            self._daemon(node, ["nsenter", f"--net=/run/netns/{node}", "unshare", "--uts", "--mount", "sh", "-c",
                                f"mount --bind {hosts} /etc/hosts && hostname {node} && exec slurmd -D -N {node}"])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            out = subprocess.run(["sinfo", "-h", "-N", "-t", "idle", "-o", "%N"], env=self.env,
                                 capture_output=True, text=True).stdout.split()
            if len(set(out)) >= self.count:
                return self
            time.sleep(0.2)
        raise RuntimeError(f"slurm nodes not idle after 30 s; logs in {self._p('log')}")

    def _daemon(self, name: str, argv: list[str]) -> None:
        log = open(self._p(f"log/{name}.out"), "wb")
        self.procs.append(subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, start_new_session=True))

    def _net_up(self) -> None:
        net = f"{self.subnet}.0/24"
        self._sh("ip", "link", "add", self.bridge, "type", "bridge")
        self.netns.append("bridge")
        self._sh("ip", "addr", "add", f"{self.addr(0)}/24", "dev", self.bridge)
        self._sh("sysctl", "-qw", f"net.ipv4.conf.{self.bridge}.route_localnet=1")
        self._sh("ip", "link", "set", self.bridge, "up")
        self._sh("ip", "route", "replace", "table", "local", net, "dev", self.bridge, "scope", "link",
                 "src", self.addr(0))   # T4: 127/8 belongs to lo unless a more specific route says otherwise
        for k, node in enumerate(self.nodes, 1):
            self._sh("ip", "netns", "add", node)
            self.netns.append(node)
            veth = f"{self.tag}v{k}"[:15]
            self._sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", node)
            self._sh("ip", "link", "set", veth, "master", self.bridge, "up")
            self._sh("ip", "-n", node, "link", "set", "lo", "up")
            self._sh("ip", "-n", node, "addr", "add", f"{self.addr(k)}/24", "dev", "eth0")
            self._sh("ip", "-n", node, "link", "set", "eth0", "up")
            self._sh("nsenter", f"--net=/run/netns/{node}", "sysctl", "-qw", "net.ipv4.conf.eth0.route_localnet=1")
            self._sh("ip", "-n", node, "route", "replace", "table", "local", net, "dev", "eth0", "scope", "link",
                     "src", self.addr(k))

    def _write_conf(self) -> None:
        p = self._p
        nodes = "\n".join(f"NodeName={node} NodeAddr={self.addr(k)} CPUs=4 RealMemory=4096 Gres=gpu:{self.gpus} "
                          f"State=UNKNOWN" for k, node in enumerate(self.nodes, 1))
        with open(p("etc/slurm.conf"), "w") as handle:
            handle.write(f"""ClusterName={self.tag}
SlurmctldHost={self.tag}ctl({self.addr(0)})
SlurmctldPort={self.port}
SlurmdPort={self.port + 1}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={p('munge-run/munge.sock')}
SlurmUser=root
SlurmdUser=root
StateSaveLocation={p('state')}
SlurmdSpoolDir={p('spool')}/%n
SlurmctldPidFile={p('run')}/slurmctld.pid
SlurmdPidFile={p('run')}/slurmd-%n.pid
SlurmctldLogFile={p('log')}/slurmctld.log
SlurmdLogFile={p('log')}/slurmd-%n.log
ProctrackType=proctrack/cgroup
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
JobRequeue=0
EnforcePartLimits=ALL
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SlurmdParameters=config_overrides
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=60
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
        with open(p("etc/gres.conf"), "w") as handle:
            handle.write("AutoDetect=off\n" + "".join(
                f"NodeName={node} Name=gpu File={p('dev')}/nvidia[0-{self.gpus - 1}]\n" for node in self.nodes))
        with open(p("etc/cgroup.conf"), "w") as handle:
            handle.write("CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\nCgroupAutomount=no\n")

    # ------------------------------------------------------------------ jobs
    def salloc(self, *args: str) -> dict[str, str]:
        """An allocation with no shell; returns the SLURM_* variables its shell would have."""
        out = subprocess.run(["salloc", "--no-shell", *args], env=self.env, capture_output=True, text=True,
                             timeout=60)
        match = re.search(r"Granted job allocation (\d+)", out.stderr + out.stdout)
        if not match:
            raise RuntimeError(f"salloc failed: {out.stderr}")
        job = match.group(1)
        detail = subprocess.run(["scontrol", "show", "job", job], env=self.env, capture_output=True,
                                text=True).stdout
        listed = re.search(r"\bNodeList=(\S+)", detail)
        if not listed:
            raise RuntimeError(f"scontrol show job {job} names no NodeList: {detail}")
        nodelist = listed.group(1)
        env = {"SLURM_JOB_ID": job, "SLURM_JOBID": job, "SLURM_JOB_NODELIST": nodelist, "SLURM_NODELIST": nodelist}
        tasks = re.search(r"--ntasks-per-node[= ](\d+)", " ".join(args))
        if tasks:
            env["SLURM_TASKS_PER_NODE"] = f"{tasks.group(1)}(x{len(self.expand(nodelist))})"
        return env

    def expand(self, nodelist: str) -> list[str]:
        return subprocess.run(["scontrol", "show", "hostnames", nodelist], env=self.env, capture_output=True,
                              text=True).stdout.split()

    def login_shell(self) -> list[str]:
        """argv prefix: run a command like a login node that resolves the compute nodes' names (T11)."""
        return ["unshare", "--mount", "sh", "-c", f'mount --bind {self._p("etc/hosts")} /etc/hosts && exec "$@"', "sh"]

    def cgroup_pids(self) -> list[int]:
        """PIDs Slurm still tracks in our nodes' freezer cgroups (empty once a job is fully gone)."""
        pids: list[int] = []
        for node in self.nodes:
            root = f"/sys/fs/cgroup/freezer/slurm_{node}"
            for dirpath, _, files in os.walk(root):
                if "cgroup.procs" in files and "/job_" in dirpath:
                    with open(os.path.join(dirpath, "cgroup.procs")) as handle:
                        pids.extend(int(line) for line in handle if line.strip())
        return pids

    # ------------------------------------------------------------------ faults
    def _veth(self, node: str) -> str:
        return f"{self.tag}v{self.nodes.index(node) + 1}"[:15]

    def cut(self, node: str) -> None:
        """``node`` stops answering: its link down (slurmctld, srun and its peers lose it; its
        processes and its slurmd go on)."""
        self._sh("ip", "link", "set", self._veth(node), "down")
        self.cut_nodes.add(node)

    def heal(self, node: str) -> None:
        self._sh("ip", "link", "set", self._veth(node), "up")
        self.cut_nodes.discard(node)

    # ------------------------------------------------------------------ stop
    def stop(self) -> None:
        for node in list(self.cut_nodes):     # Slurm ends a job's steps on a node it can reach
            self.heal(node)
        if self.procs:   # end our jobs first, so every step's processes go through Slurm's own cleanup
            subprocess.run(["scancel", "--user=root", "--full"], env=self.env, capture_output=True, timeout=30)
            deadline = time.monotonic() + 15
            while self.cgroup_pids() and time.monotonic() < deadline:
                time.sleep(0.2)
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for pid in self.cgroup_pids():        # what the jobs left that Slurm did not end (a cut node's
            try:                              # steps outlive its slurmd): ours, found by our cgroups
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + 10      # gone from their cgroups, so that the folders can go
        while self.cgroup_pids() and time.monotonic() < deadline:
            time.sleep(0.1)
        for node in self.nodes:
            root = f"/sys/fs/cgroup/freezer/slurm_{node}"
            for dirpath, _, _ in sorted(os.walk(root), key=lambda item: -len(item[0])):
                try:
                    os.rmdir(dirpath)
                except OSError:
                    pass
        for k, node in enumerate(self.nodes, 1):
            if node in self.netns:
                subprocess.run(["ip", "netns", "del", node], capture_output=True)
                subprocess.run(["ip", "link", "del", f"{self.tag}v{k}"[:15]], capture_output=True)
        if "bridge" in self.netns:
            subprocess.run(["ip", "route", "del", "table", "local", f"{self.subnet}.0/24", "dev", self.bridge],
                           capture_output=True)
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        self.netns.clear()
        time.sleep(0.2)
        shutil.rmtree(self.dir, ignore_errors=True)
