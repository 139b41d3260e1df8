"""Transport for ``ansible_connection: slurm`` hosts: every command is a step of the Slurm job.

``run`` becomes ``srun --jobid J --nodelist NODE --nodes 1 --ntasks 1 --overlap ... ARGV``, so
host operations (roles/hostctl.py) and the tasks they start stay inside the job: accounted,
confined to its cgroup, and killed by Slurm at ``scancel`` or job end. The job is
``$SLURM_JOB_ID`` of the calling shell (run pscluster inside ``salloc``/``sbatch``, or export it).

Why starts need a long-lived step (measured on Slurm 22.05, proctrack/cgroup): when a step's
task exits, slurmstepd kills every process left in the step's cgroup, so hostctl's detached
monitor would die with the ``srun`` that started it. A ``start``/``start_many`` call therefore
runs under a keeper (``_KEEPER``): it runs hostctl, prints hostctl's answer as one marked line,
then stays alive while any monitor it started lives. This transport reads up to the marked line
and returns, leaving that ``srun`` client running in its own session (it survives the CLI; it
ends when the monitor ends: ``down`` stops the task, or Slurm cancels the step). Every other
operation (status, stop, read, watch) is a short step of its own, on any node, from anywhere the
job id is known. Files are written through a step too (no shared file system assumed).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import select
import subprocess
import tempfile
import time
from typing import Sequence

from ..errors import HostEndedError, HostError, UnreachableHostError
from .base import CommandResult, Stream
from .local import LocalTransport

MARK = "@@pscluster-step@@"
# Runs ARGV with our stdin, prints {rc, stdout, stderr} after MARK, then (for starts) waits while
# any started monitor ("pgid" of each record) is alive: the step must outlive the monitors.
_KEEPER = r"""
import json, os, subprocess, sys, time
hold = sys.argv[1] == "hold"
p = subprocess.run(sys.argv[2:], input=sys.stdin.buffer.read(), capture_output=True)
out = p.stdout.decode("utf-8", "replace")
sys.stdout.write("%s%s\n" % (MARK, json.dumps({"rc": p.returncode, "stdout": out,
                                               "stderr": p.stderr.decode("utf-8", "replace"),
                                               "granted": os.environ.get("CUDA_VISIBLE_DEVICES")})))
sys.stdout.flush()
pids = []
if hold and p.returncode == 0:
    try:
        answer = json.loads(out)
        records = answer.get("started", [answer]) if isinstance(answer, dict) else []
        pids = [r["pgid"] for r in records if isinstance(r, dict) and r.get("pgid")]
    except ValueError:
        pass
while any(os.path.exists("/proc/%d" % pid) for pid in pids):
    time.sleep(1.0)
""".replace("MARK", repr(MARK))
_WRITER = ("import os,sys;t=os.path.expanduser(sys.argv[1]);os.makedirs(os.path.dirname(t) or '.',exist_ok=True);"
           "p=t+'.pscluster-tmp%d'%os.getpid();open(p,'wb').write(sys.stdin.buffer.read());"
           "os.chmod(p,int(sys.argv[2],8));os.replace(p,t)")
HOLDING_OPERATIONS = ("start", "start_many")
# What srun says when its job is gone (then scontrol says how it ended).
_ENDED_SRUN = re.compile(r"has expired|Invalid job id|already completing or completed|Job has already finished|"
                         r"Requested node configuration is not available")


def _granted_gpus(facts_json: str, granted: str) -> str:
    """Without nvidia-smi in the step, the GPUs Slurm granted there (its CUDA_VISIBLE_DEVICES) are
    what preflight counts: one entry per id up to the highest (GRES on nodes without the NVIDIA
    tools, as in tests/slurm). With nvidia-smi, its own answer stands."""
    from ..slurm_layout import parse_gpu_ids
    try:
        facts = json.loads(facts_json)
    except ValueError:
        return facts_json
    ids = [int(gpu) for gpu in parse_gpu_ids(granted) if gpu.isdigit()]
    if not isinstance(facts, dict) or facts.get("gpu_error") != "nvidia-smi not found" or not ids:
        return facts_json
    facts["gpus"] = [f"GPU {index}: granted by Slurm" + ("" if index in ids else " (not granted)")
                     for index in range(max(ids) + 1)]
    facts["gpu_error"] = None
    return json.dumps(facts)


# A job in one of these states holds its nodes. Any other (COMPLETED, CANCELLED, NODE_FAIL,
# TIMEOUT, PREEMPTED, FAILED, a requeued PENDING...) has ended: Slurm killed its steps with it.
LIVE_STATES = frozenset({"RUNNING", "SUSPENDED", "CONFIGURING", "RESIZING", "SIGNALING", "STAGE_OUT"})
_RESUME = "checkpoints stay in the job's checkpoint folder: 'train --resume' in a new allocation goes on from the newest"
ENDED_HINTS = {
    "NODE_FAIL": "a node of the allocation stopped answering for Slurm's SlurmdTimeout, and Slurm ends the whole "
                 "job then; allocate with --no-kill (salloc -k, sbatch -k) to keep the allocation when a node "
                 "fails: pscluster then goes on without that node (train --min-workers); " + _RESUME,
    "TIMEOUT": "the allocation reached its time limit (--time); " + _RESUME,
    "CANCELLED": "the job was cancelled (scancel); " + _RESUME,
    "PREEMPTED": "a job of higher priority took the nodes; " + _RESUME,
}


def allocation_end(job: str, host: str, *, timeout: float = 10.0) -> HostEndedError | None:
    """Why ``host`` of Slurm job ``job`` is gone for good with what ran there: the job ended, or
    the node left its allocation (a job allocated with ``--no-kill`` loses a failed node and goes
    on). None while the job holds the node, or when ``scontrol`` cannot tell (not installed, no
    answer): the host may answer again."""
    try:
        out = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True,
                             timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return ended_error(host, job, "no longer known to Slurm") if "Invalid job id" in out.stderr else None
    how = job_end(out.stdout)
    if how is not None:
        return ended_error(host, job, how)
    nodes = re.search(r"\bNodeList=(\S+)", out.stdout)
    if nodes is None or nodes.group(1) == "(null)":
        return None
    from ..slurm_layout import SlurmLayoutError, expand_nodelist
    try:
        held = expand_nodelist(nodes.group(1))
    except SlurmLayoutError:
        return None
    return None if host in held else left_error(host, job, nodes.group(1))


def job_end(detail: str) -> str | None:
    """How a job ended, from ``scontrol show job``'s text (``NODE_FAIL, reason NodeDown``); None
    while it holds its nodes."""
    state = re.search(r"\bJobState=(\S+)", detail)
    if state is None or state.group(1) in LIVE_STATES:
        return None
    reason = re.search(r"\bReason=(\S+)", detail)
    why = reason.group(1) if reason and reason.group(1) not in ("None", "(null)") else None
    return state.group(1) + (f", reason {why}" if why else "")


def ended_error(host: str, job: str, how: str) -> HostEndedError:
    """The error of every host of Slurm job ``job``, which ended ``how`` (:func:`job_end`). The
    hint follows the state, or the reason while the job is still COMPLETING (NodeDown: a node
    failed)."""
    state, _, reason = how.partition(", reason ")
    key = "NODE_FAIL" if reason == "NodeDown" else state
    return HostEndedError(host, f"Slurm job {job} has ended ({how}): Slurm ends its steps, and every task "
                                f"pscluster started there with them (on a node that stopped answering, when "
                                f"it answers again)", whole_job=True, hint=ENDED_HINTS.get(key, _RESUME))


def left_error(host: str, job: str, held: str) -> HostEndedError:
    return HostEndedError(host, f"{host} is not in Slurm job {job}'s allocation ({held}): Slurm takes a node "
                                f"that stops answering out of a job allocated with --no-kill, and ends the "
                                f"steps there when it answers again", whole_job=False,
                          hint="the job goes on without the node where it can (train --min-workers); a new "
                               "allocation is needed to use the node again")


def job_id() -> str:
    job = os.environ.get("SLURM_JOB_ID") or os.environ.get("SLURM_JOBID")
    if not job:
        raise HostError("slurm", "SLURM_JOB_ID is not set: slurm hosts are steps of a job",
                        hint="run pscluster inside salloc/sbatch, or export SLURM_JOB_ID=<job id>")
    return job


class SlurmTransport(LocalTransport):   # reuses its subprocess stream; run and put_files are steps
    """Runs argv lists as job steps on one node of the allocation."""

    def ended(self) -> HostEndedError | None:
        return allocation_end(job_id(), self.host.name)

    def _srun(self, *extra: str) -> list[str]:
        return ["srun", f"--jobid={job_id()}", f"--nodelist={self.host.name}", "--nodes=1", "--ntasks=1",
                "--overlap", "--quiet", "--kill-on-bad-exit=0", "--export=ALL", *extra]

    def run(self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float = 60.0) -> CommandResult:
        hold = bool(argv) and argv[-1] in HOLDING_OPERATIONS
        python = self.host.python
        command = self._srun() + [python, "-I", "-S", "-c", _KEEPER, "hold" if hold else "wait", *argv]
        with tempfile.TemporaryFile() as err:
            try:
                proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                        start_new_session=True)
            except FileNotFoundError:
                raise UnreachableHostError(self.host.name, "srun not found: Slurm's client is not installed here",
                                           argv=command[:1]) from None
            assert proc.stdin is not None and proc.stdout is not None
            # srun of a job that ended exits at once: a write after it broke the pipe (down then
            # died on the BrokenPipeError); its answer below says why.
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.write(stdin or b"")
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.close()
            answer = self._read_answer(proc, timeout, argv)
            if not hold or answer is None:
                proc.wait()
            proc.stdout.close()
            if answer is None:
                err.seek(0)
                message = err.read().decode("utf-8", "replace")
                ended = self.ended() if _ENDED_SRUN.search(message) else None
                if ended is not None:
                    raise ended
                if "Unable to" in message or "Invalid job id" in message or "Communication" in message:
                    raise UnreachableHostError(self.host.name, f"job {job_id()}: {message.strip()}", argv=command[:8])
                return CommandResult(self.host.name, tuple(argv), proc.returncode or 1, "", message)
        stdout = answer["stdout"]
        if argv and argv[-1] == "facts" and answer["rc"] == 0 and answer.get("granted"):
            stdout = _granted_gpus(stdout, answer["granted"])
        return CommandResult(self.host.name, tuple(argv), answer["rc"], stdout, answer["stderr"])

    def _read_answer(self, proc: subprocess.Popen, timeout: float, argv: Sequence[str]) -> dict | None:
        """The keeper's marked line; None if srun ended without one. Never blocks past ``timeout``
        (a step that cannot start, e.g. a pending job, would otherwise hang the CLI)."""
        deadline = time.monotonic() + timeout
        assert proc.stdout is not None
        fd, buffer = proc.stdout.fileno(), b""
        while True:
            left = deadline - time.monotonic()
            ready = select.select([fd], [], [], max(0.0, left))[0] if left > 0 else []
            if not ready:
                proc.terminate()     # SIGTERM to srun cancels the step
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                raise HostError(self.host.name, f"job step timed out after {timeout:.0f} s", argv=argv,
                                hint=f"is job {job_id()} running? (squeue -j {job_id()})")
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            buffer += chunk
            for raw in buffer.split(b"\n")[:-1]:
                line = raw.decode("utf-8", "replace")
                if line.startswith(MARK):
                    return json.loads(line[len(MARK):])

    def stream(self, argv: Sequence[str], *, stdin: bytes | None = None) -> Stream:
        # The local subprocess stream around srun: closing it SIGTERMs srun, which cancels the step
        # (a single SIGINT would not: srun asks for a second one).
        return super().stream(self._srun() + list(argv), stdin=stdin)

    def _put_files(self, files: Sequence[tuple[str, str]], *, mode: int | None = None) -> None:
        for local, remote in files:
            with open(local, "rb") as handle:
                data = handle.read()
            bits = mode if mode is not None else (os.stat(local).st_mode & 0o777)
            self.run([self.host.python, "-I", "-S", "-c", _WRITER, remote, oct(bits)[2:]],
                     stdin=data).check(f"copy {local} to {remote}")


def read_allocation(env: dict[str, str]):
    """The calling job's :class:`~cluster.slurm_layout.Allocation`, asking ``scontrol`` where it can.

    ``scontrol show hostnames`` expands the node list exactly as Slurm does and ``scontrol show job
    -d`` gives the GPUs granted per node; without scontrol the pure parsers of the variables serve.
    """
    from ..slurm_layout import allocation_from_env, parse_job_gpus, expand_nodelist
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or ""
    nodelist = env.get("SLURM_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
    hostnames = node_gpus = None
    try:
        if nodelist:
            names = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                                   text=True, timeout=30)
            if names.returncode == 0 and names.stdout.split():
                hostnames = names.stdout.split()
        if job:
            detail = subprocess.run(["scontrol", "show", "job", "-d", job], capture_output=True, text=True,
                                    timeout=30)
            if detail.returncode == 0 and "GRES=" in detail.stdout:
                node_gpus = parse_job_gpus(detail.stdout)
                if node_gpus and not any(node_gpus.values()):
                    node_gpus = None
    except (OSError, subprocess.TimeoutExpired):
        pass
    if hostnames is None and nodelist:
        hostnames = expand_nodelist(nodelist)
    if job and hostnames:
        seen = _step_gpus(job, hostnames, env)
        node_gpus = seen if seen is not None else node_gpus
    return allocation_from_env(env, hostnames=hostnames, node_gpus=node_gpus)


def _step_gpus(job: str, nodes, env) -> dict[str, tuple[str, ...]] | None:
    """What a step sees on each node (its CUDA_VISIBLE_DEVICES): the ids a task's mask must use.

    Under ConstrainDevices these are 0-based, without it the node's global ids; asking a step
    is right in both cases (~0.1 s per node).
    """
    from ..slurm_layout import parse_gpu_ids
    found = {}
    for node in nodes:
        try:
            out = subprocess.run(["srun", f"--jobid={job}", f"--nodelist={node}", "--nodes=1", "--ntasks=1",
                                  "--overlap", "--quiet", "printenv", "CUDA_VISIBLE_DEVICES"],
                                 capture_output=True, text=True, timeout=60, env=env)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if out.returncode not in (0, 1):     # printenv exits 1 when the variable is unset: no GPUs
            return None
        found[node] = parse_gpu_ids(out.stdout.strip())
    return found
