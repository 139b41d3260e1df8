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
from typing import Mapping, Sequence

from .errors import PsclusterError

_BRACKET = re.compile(r"([^,\[]*)\[([^\]]*)\]([^,\[]*)")


class SlurmLayoutError(PsclusterError):
    """The allocation cannot hold the requested layout, or its variables are unreadable."""

    exit_code = 2


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
class Layout:
    """Role options of ``up --slurm``; None means the documented default."""

    ps: int | None = None
    chief: bool = True
    workers_per_node: int | None = None
    evaluator: bool = False
    gpus_per_worker: int = 0


def layout_inventory(alloc: Allocation, layout: Layout, *, python: str, workdir: str,
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


def sbatch_script(*, nodes: int, workers_per_node: int, mode: str, job: str, python: str, checkout: str,
                  steps: int | None = None, time_limit: str | None = None, partition: str | None = None,
                  gres: str | None = None, name: str = "pscluster") -> str:
    """A batch script that brings a cluster up inside its allocation, trains ``job``, takes it down.

    ``down`` runs from an EXIT trap, so a failed ``train`` still ends the steps (and the job's end
    would kill them anyway). pscluster is imported from the shared ``checkout`` with ``python``;
    the layout is written to the submit directory.
    """
    import shlex
    lines = ["#!/bin/bash", f"#SBATCH --job-name={name}", f"#SBATCH --nodes={nodes}",
             f"#SBATCH --ntasks-per-node={workers_per_node}"]
    lines += [f"#SBATCH --time={time_limit}"] * bool(time_limit)
    lines += [f"#SBATCH --partition={partition}"] * bool(partition)
    lines += [f"#SBATCH --gres={gres}"] * bool(gres)
    pscluster = f"{shlex.quote(python)} -m cluster"
    inventory = '"${SLURM_SUBMIT_DIR:-.}/slurm-$SLURM_JOB_ID.yaml"'
    train = f"{pscluster} train {shlex.quote(job)} --name {shlex.quote(name)}" + (f" --steps {steps}" if steps else "")
    lines += ["set -euo pipefail",
              f"export PYTHONPATH={shlex.quote(checkout)}${{PYTHONPATH:+:$PYTHONPATH}}",
              f"trap '{pscluster} down --name {shlex.quote(name)} || true' EXIT",
              f"{pscluster} up --slurm {inventory} --name {shlex.quote(name)} --mode {shlex.quote(mode)}",
              train, ""]
    return "\n".join(lines)
