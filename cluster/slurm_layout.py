"""Slurm as an inventory source (pure: reads a dict of ``SLURM_*`` variables, touches no host).

Inside an allocation (``salloc``/``sbatch``), :func:`allocation_from_env` reads the job's
variables into an :class:`Allocation` and :func:`layout_inventory` lays out pscluster's roles on
its nodes, as an inventory document (the same YAML format as a hand-written one, with
``ansible_connection: slurm``), so plan/status/logs/train/down read it like any other inventory.

Defaults (``pscluster up --slurm``):

* workers per node: the job's tasks per node (``SLURM_NTASKS_PER_NODE``/``SLURM_TASKS_PER_NODE``),
  else 1;
* one ps per node beside the workers (``--ps N`` puts N ps on the first nodes, round robin);
* a chief on the first node (async training needs one; ``--no-chief`` for a chief-less sync run);
* no evaluator (``--evaluator`` puts one on the last node).

GPUs: a worker's mask is one of the GPUs *Slurm granted on that node*, as a step of the job sees
them there (its ``CUDA_VISIBLE_DEVICES``: global ids, or 0-based ones under ConstrainDevices;
``SLURM_STEP_GPUS``/``SLURM_JOB_GPUS`` of the caller, or ``scontrol show job -d`` IDX, as
fallbacks), never a physical index chosen by pscluster. Asking for more GPUs than
granted is a :class:`SlurmLayoutError`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence

from .contracts import DEFAULT_STOP_GRACE, ExitStatus
from .errors import PsclusterError

if TYPE_CHECKING:
    from .plan import ClusterPlan

_BRACKET = re.compile(r"([^,\[]*)\[([^\]]*)\]([^,\[]*)")


class SlurmLayoutError(PsclusterError):
    """The allocation cannot hold the requested layout, or its variables are unreadable."""

    exit_code = ExitStatus.BAD_INPUT


def _split_top(text: str) -> list[str]:
    """Split at commas outside brackets: ``a[1,2],b`` -> ``['a[1,2]', 'b']``."""
    parts, depth, current = [], 0, ""
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise SlurmLayoutError(f"unbalanced ']' in node list {text!r}")
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    if depth:
        raise SlurmLayoutError(f"unbalanced '[' in node list {text!r}")
    parts.append(current)
    return [part for part in parts if part]


def _expand_ranges(body: str, text: str) -> list[str]:
    values = []
    for item in body.split(","):
        low, sep, high = item.partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise SlurmLayoutError(f"bad range {item!r} in node list {text!r}",
                                   hint="Slurm ranges look like node[01-03,07]")
        if not sep:
            values.append(low)
            continue
        if int(high) < int(low):
            raise SlurmLayoutError(f"descending range {item!r} in node list {text!r}")
        width = len(low)   # zero padding follows the lower bound, as Slurm does ("01-10")
        values.extend(str(number).zfill(width) for number in range(int(low), int(high) + 1))
    return values


def expand_nodelist(text: str) -> list[str]:
    """Expand a Slurm host list (``node[01-03,07],gpu-a[1-2]``) the way ``scontrol show hostnames`` does."""
    names: list[str] = []
    for part in _split_top(text.strip()):
        match = _BRACKET.search(part)
        if match is None:
            names.append(part)
            continue
        prefix, body = part[:match.start(2) - 1], match.group(2)
        rest = part[match.end(2) + 1:]
        for value in _expand_ranges(body, text):
            names.extend(expand_nodelist(prefix + value + rest) if "[" in rest else [prefix + value + rest])
    return names


def expand_counts(text: str) -> list[int]:
    """Expand Slurm's per-node counts: ``2(x3),1`` -> ``[2, 2, 2, 1]``."""
    counts = []
    for item in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", item)
        if match is None:
            raise SlurmLayoutError(f"bad per-node count {item!r} in {text!r}", hint="expected e.g. 2(x3),1")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def parse_gpu_ids(text: str | None) -> tuple[str, ...]:
    """GPU ids from ``SLURM_STEP_GPUS``/``CUDA_VISIBLE_DEVICES`` (``0,1``; ``gpu:a100:2(IDX:0-1)``)."""
    if not text:
        return ()
    idx = re.search(r"IDX:([^)]*)\)", text)
    if idx:
        text = idx.group(1)
    ids: list[str] = []
    for item in text.split(","):
        item = item.strip()
        if re.fullmatch(r"\d+-\d+", item):
            low, high = (int(part) for part in item.split("-"))
            ids.extend(str(number) for number in range(low, high + 1))
        elif item and item != "N/A":
            ids.append(item)
    return tuple(ids)


@dataclass(frozen=True)
class Allocation:
    """What a Slurm job grants: its nodes in order, tasks and GPUs per node."""

    job_id: str
    nodes: tuple[str, ...]
    tasks_per_node: tuple[int, ...]
    gpus: tuple[tuple[str, ...], ...]     # granted GPU ids per node ("" none)


def allocation_from_env(env: Mapping[str, str], *, hostnames: Sequence[str] | None = None,
                        node_gpus: Mapping[str, Sequence[str]] | None = None) -> Allocation:
    """Read an allocation from ``SLURM_*`` variables.

    ``hostnames`` is ``scontrol show hostnames`` output when available (preferred to the pure
    expander); ``node_gpus`` maps node -> granted GPU ids (from ``scontrol show job -d``); without
    it, every node gets the GPUs the calling step sees (a homogeneous allocation).
    """
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if not job_id:
        raise SlurmLayoutError("not inside a Slurm allocation (SLURM_JOB_ID is not set)",
                               hint="run inside salloc/sbatch, or export SLURM_JOB_ID=<job> SLURM_JOB_NODELIST=...")
    # In a step launched from outside, SLURM_JOB_NODELIST is the step's: SLURM_NODELIST is the job's.
    nodelist = env.get("SLURM_NODELIST") or env.get("SLURM_JOB_NODELIST")
    if not nodelist:
        raise SlurmLayoutError(f"job {job_id}: SLURM_JOB_NODELIST is not set")
    nodes = tuple(hostnames) if hostnames else tuple(expand_nodelist(nodelist))
    per_node_text = env.get("SLURM_TASKS_PER_NODE") or env.get("SLURM_NTASKS_PER_NODE")
    if per_node_text and "(" not in per_node_text and "," not in per_node_text:
        per_node_text = f"{per_node_text}(x{len(nodes)})"
    tasks = tuple(expand_counts(per_node_text)) if per_node_text else (1,) * len(nodes)
    if len(tasks) != len(nodes):
        raise SlurmLayoutError(f"job {job_id}: {len(tasks)} task counts for {len(nodes)} nodes "
                               f"(SLURM_TASKS_PER_NODE={per_node_text})")
    seen = parse_gpu_ids(env.get("SLURM_STEP_GPUS") or env.get("SLURM_JOB_GPUS") or env.get("CUDA_VISIBLE_DEVICES"))
    gpus = tuple(tuple(node_gpus.get(node, ())) if node_gpus is not None else seen for node in nodes)
    return Allocation(job_id, nodes, tasks, gpus)


def parse_job_gpus(scontrol_job_detail: str) -> dict[str, tuple[str, ...]]:
    """Granted GPU ids per node from ``scontrol show job -d J`` (``Nodes=n[1-2] ... GRES=gpu:2(IDX:0-1)``)."""
    found: dict[str, tuple[str, ...]] = {}
    for match in re.finditer(r"(?<![A-Za-z])Nodes=(\S+)\s.*?GRES=(\S*)", scontrol_job_detail):
        ids = parse_gpu_ids(match.group(2)) if "IDX" in match.group(2) else ()
        for node in expand_nodelist(match.group(1)):
            found[node] = ids
    return found


@dataclass(frozen=True)
class SlurmLayout:
    """Role options of ``up --slurm``; None means the documented default."""

    ps: int | None = None
    chief: bool = True
    workers_per_node: int | None = None
    evaluator: bool = False
    gpus_per_worker: int = 0


def layout_inventory(alloc: Allocation, layout: SlurmLayout, *, python: str, workdir: str,
                     mode: str | None = None, port_base: int | None = None) -> dict:
    """The inventory document for ``layout`` on ``alloc`` (raises :class:`SlurmLayoutError`)."""
    count = len(alloc.nodes)
    ps_total = count if layout.ps is None else layout.ps
    if ps_total < 0 or (layout.workers_per_node is not None and layout.workers_per_node < 1):
        raise SlurmLayoutError("--ps must be >= 0 and --workers-per-node >= 1")
    hosts: dict[str, dict] = {node: {"ansible_connection": "slurm"} for node in alloc.nodes}
    groups: dict[str, dict] = {"chief": {}, "ps": {}, "worker": {}, "evaluator": {}}
    for index, node in enumerate(alloc.nodes):
        workers = layout.workers_per_node or alloc.tasks_per_node[index]
        groups["worker"][node] = {"worker_tasks": workers}
        if layout.gpus_per_worker:
            need = workers * layout.gpus_per_worker
            granted = alloc.gpus[index]
            if need > len(granted):
                raise SlurmLayoutError(
                    f"node {node}: {workers} worker(s) x {layout.gpus_per_worker} GPU(s) need {need} GPUs, "
                    f"but job {alloc.job_id} was granted {len(granted)} there ({','.join(granted) or 'none'})",
                    hint="ask Slurm for more (--gres=gpu:N / --gpus-per-node) or lower --workers-per-node")
            step = layout.gpus_per_worker
            groups["worker"][node]["worker_gpus"] = [[int(gpu) if gpu.isdigit() else gpu
                                                      for gpu in granted[i * step:(i + 1) * step]]
                                                     for i in range(workers)]
        else:
            groups["worker"][node]["worker_gpus"] = [[] for _ in range(workers)]
    for index in range(ps_total):
        node = alloc.nodes[index % count]
        entry = groups["ps"].setdefault(node, {"ps_tasks": 0})
        entry["ps_tasks"] += 1
    if layout.chief:
        groups["chief"][alloc.nodes[0]] = {}
    if layout.evaluator:
        groups["evaluator"][alloc.nodes[-1]] = {}
    all_vars: dict = {"pscluster_python": python, "pscluster_workdir": workdir}
    if mode:
        all_vars["pscluster_mode"] = mode
    if port_base:
        all_vars["pscluster_port_base"] = port_base
    children = {role: {"hosts": members} for role, members in groups.items() if members}
    return {"all": {"vars": all_vars, "hosts": hosts, "children": children}}


def tf_resolver_jobs(inventory_doc: dict) -> dict[str, int]:
    """Task counts per TF job in a layout, for ``SlurmClusterResolver(jobs=...)`` cross-checks."""
    children = inventory_doc["all"]["children"]
    counts = {}
    for role, key in (("chief", None), ("worker", "worker_tasks"), ("ps", "ps_tasks"), ("evaluator", None)):
        members = children.get(role, {}).get("hosts", {})
        if members:
            counts[role] = sum(values.get(key, 1) if key else 1 for values in members.values())
    return counts


@dataclass(frozen=True)
class BatchJob:
    """What ``export --format sbatch`` writes: the allocation to ask for, the layout to lay on it,
    and what to do there (train ``job``, or run ``program``).

    Resubmission: the script always trains with ``--resume`` from a fixed ``checkpoint_dir``
    (default under the submit directory, which a requeued job keeps), so a second run of the
    same script (``sbatch`` again, ``scontrol requeue``, or Slurm requeueing it after a
    preemption) continues from the last checkpoint; a first run starts at step 0.
    """

    nodes: int
    workers_per_node: int
    mode: str
    python: str
    checkout: str
    name: str = "pscluster"
    job: str = "distributed_mnist"
    program: tuple[str, ...] = ()          # `pscluster run` this instead of training
    steps: int | None = None
    layout: SlurmLayout = SlurmLayout()
    time_limit: str | None = None
    partition: str | None = None
    gres: str | None = None
    checkpoint_dir: str | None = None      # default: $SLURM_SUBMIT_DIR/pscluster-checkpoints/<name>/<job>
    checkpoint_every: int = 500
    stop_grace: float = DEFAULT_STOP_GRACE
    warn_seconds: int = 120                # USR1 this long before the time limit (--signal=B:USR1@N)
    requeue: bool = True                   # on that warning: checkpoint, down, `scontrol requeue` itself
    max_nodes: int | None = None           # `--nodes=N-MAX`: a run (a requeued one too) takes what Slurm grants


def batch_shape(cluster: "ClusterPlan") -> dict:
    """Nodes, workers per node and the ``up --slurm`` layout that reproduce ``cluster``'s roles.

    Nodes: the inventory's hosts; workers per node: the most any host has (``up --slurm`` gives
    every node as many); ps count, chief, evaluator and GPUs per worker as planned.
    """
    workers = [task for task in cluster.tasks if task.role == "worker"]
    per_host = max((sum(task.host == host for task in workers) for host in {task.host for task in workers}),
                   default=1)
    roles = [task.role for task in cluster.tasks]
    gpus = max((len([gpu for gpu in (task.cuda_visible_devices or "").split(",") if gpu.strip()])
                for task in workers), default=0)
    layout = SlurmLayout(ps=roles.count("ps"), chief="chief" in roles, workers_per_node=per_host,
                    evaluator="evaluator" in roles, gpus_per_worker=gpus)
    return {"nodes": len(cluster.hosts), "workers_per_node": per_host, "layout": layout}


def layout_options(layout: SlurmLayout) -> list[str]:
    """``up --slurm`` options for ``layout`` (only what differs from the defaults)."""
    options: list[str] = []
    if layout.ps is not None:
        options += ["--ps", str(layout.ps)]
    if not layout.chief:
        options.append("--no-chief")
    if layout.workers_per_node is not None:
        options += ["--workers-per-node", str(layout.workers_per_node)]
    if layout.evaluator:
        options.append("--evaluator")
    if layout.gpus_per_worker:
        options += ["--gpus-per-worker", str(layout.gpus_per_worker)]
    return options


# What each #SBATCH value may be (N8: a newline in --time ended the directive block with a
# shell line of its own, and sbatch then ignored the --signal and --requeue after it). Slurm's
# time formats: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, or UNLIMITED.
SBATCH_VALUES = {
    "time": (re.compile(r"(\d{1,7}-)?\d{1,7}(:\d{1,2}){0,2}|unlimited|infinite", re.IGNORECASE), "1:00:00 or 2-12:00:00"),
    "partition": (re.compile(r"[A-Za-z0-9_.-]{1,64}(,[A-Za-z0-9_.-]{1,64}){0,15}"), "gpu or short,long"),
    "gres": (re.compile(r"[A-Za-z0-9_.:,()=/-]{1,200}"), "gpu:2 or gpu:a100:1"),
}


def check_sbatch_value(option: str, value: str) -> str:
    """``value`` for ``#SBATCH --OPTION=``, or a SlurmLayoutError naming it (no space, newline or
    other control character reaches the script)."""
    pattern, example = SBATCH_VALUES[option]
    if not pattern.fullmatch(value):
        raise SlurmLayoutError(f"--{option} {value!r} is not a Slurm {option} value", hint=f"e.g. --{option} {example}")
    return value


def sbatch_script(batch: BatchJob) -> str:
    """A batch script that brings a cluster up inside its allocation, trains (or runs a program), takes it down.

    * ``down`` runs from an EXIT trap, so a failed ``train`` still ends the steps (and the job's
      end would kill them anyway); a state a killed earlier run left is taken down first.
    * ``train``/``run`` runs in the background while the script waits, so a signal reaches the
      script's trap at once (bash defers traps until a foreground child exits) and is passed on
      as SIGTERM: ``train`` treats it like Ctrl-C, the job checkpoints (every mode) within
      ``--stop-grace``.
    * ``#SBATCH --signal=B:USR1@N`` asks Slurm for USR1 N seconds before the time limit; on it the
      script stops training as above and, with ``requeue``, requeues itself after ``down``. A plain
      SIGTERM (``scancel``, a preemption, which Slurm requeues itself under ``--requeue``) stops
      the same way without a self-requeue.
    * ``#SBATCH --requeue --open-mode=append``: a requeued run appends to the same output file.
    """
    import shlex
    quote = shlex.quote
    if batch.nodes < 1 or batch.workers_per_node < 1:
        raise SlurmLayoutError("a batch job needs at least one node and one worker per node")
    if not batch.program and batch.warn_seconds <= batch.stop_grace:
        raise SlurmLayoutError(f"--warn-before {batch.warn_seconds} s leaves no time for the checkpoint on stop "
                               f"(up to {batch.stop_grace:g} s) and down before the time limit",
                               hint=f"give --warn-before more than {batch.stop_grace:g} s (default 120)")
    if batch.max_nodes is not None and batch.max_nodes < batch.nodes:
        raise SlurmLayoutError(f"--max-nodes {batch.max_nodes} is fewer than the inventory's {batch.nodes} node(s)",
                               hint=f"give --max-nodes {batch.nodes} or more")
    nodes = f"{batch.nodes}-{batch.max_nodes}" if batch.max_nodes and batch.max_nodes > batch.nodes else str(batch.nodes)
    lines = ["#!/bin/bash", f"#SBATCH --job-name={batch.name}", f"#SBATCH --nodes={nodes}",
             f"#SBATCH --ntasks-per-node={batch.workers_per_node}"]
    for option, value in (("time", batch.time_limit), ("partition", batch.partition), ("gres", batch.gres)):
        if value:
            lines.append(f"#SBATCH --{option}={check_sbatch_value(option, value)}")
    lines += [f"#SBATCH --signal=B:USR1@{batch.warn_seconds}", "#SBATCH --requeue", "#SBATCH --open-mode=append"]
    pscluster = f"{quote(batch.python)} -m cluster"
    name = quote(batch.name)
    checkpoints = (quote(batch.checkpoint_dir) if batch.checkpoint_dir else
                   f'"${{SLURM_SUBMIT_DIR:-$PWD}}/pscluster-checkpoints/"{name}/{quote(_job_name(batch.job))}')
    up = " ".join([f"{pscluster} up --slurm \"$inventory\" --name {name} --mode {quote(batch.mode)}",
                   *map(quote, layout_options(batch.layout))])
    if batch.program:
        work = f"{pscluster} run --name {name} -- " + " ".join(quote(arg) for arg in batch.program)
        what = "the program"
    else:
        work = (f"{pscluster} train {quote(batch.job)} --name {name}"
                + (f" --steps {batch.steps}" if batch.steps else "")
                + f' --checkpoint-dir "$checkpoints" --checkpoint-every {batch.checkpoint_every} --resume'
                + f" --stop-grace {batch.stop_grace:g}")
        what = "training"
    requeue = 'scontrol requeue "$SLURM_JOB_ID"' if batch.requeue else ":"
    lines += [
        "# Written by `pscluster export --format sbatch`. Training resumes from the last checkpoint in",
        "# $checkpoints: submitting this script again (sbatch), `scontrol requeue JOB`, or Slurm's own",
        "# requeue after a preemption continues there (delete that folder to start over).",
        "set -euo pipefail",
        f"export PYTHONPATH={quote(batch.checkout)}${{PYTHONPATH:+:$PYTHONPATH}}",
        'inventory="${SLURM_SUBMIT_DIR:-$PWD}/slurm-$SLURM_JOB_ID.yaml"',
        f"checkpoints={checkpoints}",
        'stopped="" child=""',
        "stop() { stopped=$1; if [ -n \"$child\" ]; then kill -TERM \"$child\" 2>/dev/null || true; fi; }",
        "trap 'stop timelimit' USR1",
        "trap 'stop TERM' TERM",
        "finish() {",
        f"  {pscluster} down --name {name} || true",
        '  if [ "$stopped" = timelimit ]; then',
        f'    echo "pscluster: time limit near: {what} stopped, requeueing job $SLURM_JOB_ID" >&2',
        f"    {requeue}",
        "  fi",
        "}",
        "trap finish EXIT",
        'echo "pscluster: job $SLURM_JOB_ID, run $((${SLURM_RESTART_COUNT:-0} + 1)), checkpoints in $checkpoints" >&2',
        'if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then   # a requeued run: what a killed earlier run left',
        f"  {pscluster} down --name {name} --now --grace 1 >/dev/null 2>&1 || true",
        "fi",
        up,
        'if [ -n "$stopped" ]; then exit 143; fi',
        f"{work} &",
        "child=$!",
        'while :; do status=0; wait "$child" || status=$?; kill -0 "$child" 2>/dev/null || break; done',
        'exit "$status"', ""]
    return "\n".join(lines)


def _job_name(job: str) -> str:
    """The folder name of a job reference (``distributed_mnist``, ``path/to/job.py`` -> ``job``)."""
    base = job.rstrip("/").rsplit("/", 1)[-1]
    return base[:-3] if base.endswith(".py") else (base or "job")
