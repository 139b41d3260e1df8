"""Where, when and how a ``pscluster bench`` study ran, for its ``--json`` / ``--out`` document:
this machine, each host's facts (CPUs, GPUs, TensorFlow) and the study as one explicit command
line (:mod:`cluster.bench.study` runs the study itself)."""
from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import shlex
import socket
from typing import Mapping, Sequence

from ..fanout import fan_out
from ..hosts import hostops
from ..plan import HostSpec
from ..transport import TransportPool
from .study import StudySpec


def gather_facts(hosts: Sequence[HostSpec], pool: TransportPool) -> dict[str, hostops.HostFacts | str]:
    """CPU count, GPUs and TensorFlow of each host, in parallel; an error text for a host
    that could not be asked (its configurations will then fail at preflight)."""
    asked = fan_out(hosts, lambda host: hostops.facts(pool.get(host), ports=[], gpus=True, workdir=None),
                    name="bench facts")
    return {o.key: o.error.message if o.error is not None else o.result() for o in asked}


def host_environment(facts: Mapping[str, hostops.HostFacts | str]) -> list[dict]:
    rows: list[dict[str, object]] = []
    for host, item in facts.items():
        if isinstance(item, str):
            rows.append({"host": host, "error": item})
            continue
        rows.append({"host": host, "hostname": item.hostname, "python": item.python, "executable": item.executable,
                     "cpus": item.cpus, "tf_dist": item.tf_dist, "tf_version": item.tf_version,
                     "gpus": list(item.gpus or ()), "gpu_error": item.gpu_error})
    return rows


def command_line(job: str, inventory: str, spec: StudySpec) -> str:
    """The study as one explicit command line (every default spelled out), to rerun it."""
    argv = ["pscluster", "bench", job, inventory, "--workers", ",".join(map(str, spec.workers)),
            "--mode", ",".join(spec.modes), "--placement", ",".join(spec.placements),
            "--steps", str(spec.steps), "--repeat", str(spec.repeat)]
    for flag, value in (("--target-accuracy", spec.target_accuracy), ("--eval-every", spec.eval_every),
                        ("--batch-size", spec.batch_size), ("--steps-per-execution", spec.steps_per_execution),
                        ("--port-base", spec.port_base)):
        if value is not None:
            argv += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    return shlex.join(argv)


def environment(facts: Mapping[str, hostops.HostFacts | str], *, job: str, inventory: str,
                spec: StudySpec) -> dict:
    """Where, when and how the study ran: this machine, each host's facts, the command."""
    try:
        version = importlib.metadata.version("pscluster")
    except importlib.metadata.PackageNotFoundError:
        version = None
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command_line(job, inventory, spec),
        "pscluster": version, "job": job, "inventory": inventory,
        "control": {"hostname": socket.gethostname(), "python": platform.python_version(),
                    "platform": platform.platform(), "cpus": os.cpu_count()},
        "hosts": host_environment(facts),
        "study": {"modes": list(spec.modes), "workers": list(spec.workers), "placements": list(spec.placements),
                  "steps": spec.steps, "repeat": spec.repeat, "target_accuracy": spec.target_accuracy,
                  "eval_every": spec.train_options().eval_every, "batch_size": spec.batch_size,
                  "steps_per_execution": spec.steps_per_execution, "restart_policy": "never"},
    }
