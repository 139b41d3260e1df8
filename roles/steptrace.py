"""Where a graph-mode (sync-ps) step spends its time: TensorFlow's full trace of a few steps.

Set ``PSCLUSTER_TRACE_STEPS=N`` (inventory ``pscluster_env``) and each sync-ps worker
traces N steps once ``PSCLUSTER_TRACE_AFTER`` steps (default 50) have run: every op on
every task it touched (this worker, the ps tasks), with its start and duration. The
aggregate is written next to the worker's events file (``<events>.trace.json``) and is what
``python -m benchmarks.syncps_profile`` prints. Tracing slows the traced steps a little;
the other steps are untouched.

The categories a step's time falls into (:func:`category`):

* ``compute``: the model's forward and backward ops on the worker;
* ``transfer``: ``RecvTensor``/``_Recv`` ops, the time a task waits for a tensor from
  another task (the worker: variables read from the ps and the token; a ps: the
  gradients from the workers): gRPC plus waiting for the sender;
* ``token queue``: ``QueueDequeue``/``QueueEnqueue``, the worker blocking on the sync
  token until the chief has applied the step (so it also holds the wait for the slower
  worker and for the chief's apply);
* ``accumulator``: the conditional accumulators that collect gradients on the ps;
* ``apply``: optimizer updates and the global step on the ps (run by the chief's queue
  runner, so they show in its own trace only when that thread is traced; here they
  appear inside the token wait);
* ``other``: constants, identities, no-ops, casts of bookkeeping.

``session overhead`` is the client's wall time of ``session.run`` minus the span of the
worker's own ops: feeding, the master's bookkeeping, starting and ending the step.
This module is pure except for :class:`StepTracer`, which takes TensorFlow's protos.
"""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

TRACE_ENV = "PSCLUSTER_TRACE_STEPS"
AFTER_ENV = "PSCLUSTER_TRACE_AFTER"
DEFAULT_AFTER = 50

CATEGORIES = ("compute", "transfer", "token queue", "accumulator", "apply", "other")
_TRANSFER = re.compile(r"^(RecvTensor|_Recv|_HostRecv|_Send|_HostSend)$")
_QUEUE = re.compile(r"^Queue(Dequeue|Enqueue)")
_ACCUMULATOR = re.compile(r"Accumulator")
_APPLY = re.compile(r"^(Resource)?(Apply|SparseApply|ScatterAdd|AssignAdd|AssignVariable|Assign$)")
_OTHER = {"Const", "Identity", "IdentityN", "NoOp", "_Arg", "_Retval", "ReadVariableOp",
          "VarHandleOp", "Placeholder", "StopGradient", "Shape", "Reshape", "Pack", "Unpack"}


def category(op: str) -> str:
    """The category of a TensorFlow op type (see the module docstring)."""
    if _TRANSFER.match(op):
        return "transfer"
    if _QUEUE.match(op):
        return "token queue"
    if _ACCUMULATOR.search(op):
        return "accumulator"
    if _APPLY.match(op):
        return "apply"
    if op in _OTHER:
        return "other"
    return "compute"


def task_of(device: str) -> str:
    """``/job:ps/replica:0/task:1/device:CPU:0`` -> ``ps:1``."""
    job = re.search(r"/job:([^/]+)", device)
    task = re.search(r"/task:(\d+)", device)
    return f"{job.group(1)}:{task.group(1)}" if job and task else device


@dataclass(frozen=True)
class OpTime:
    """One op execution in a traced step."""

    task: str
    op: str
    start_us: int
    duration_us: int


@dataclass(frozen=True)
class TracedStep:
    wall_us: int          # the client's session.run
    ops: tuple[OpTime, ...]


@dataclass
class Profile:
    """Milliseconds per step, averaged over the traced steps."""

    steps: int = 0
    wall_ms: float = 0.0
    span_ms: dict[str, float] = field(default_factory=dict)                    # per task
    by_category: dict[str, dict[str, float]] = field(default_factory=dict)     # task -> category -> ms
    counts: dict[str, dict[str, float]] = field(default_factory=dict)          # task -> category -> ops
    top_ops: list[tuple[str, str, float]] = field(default_factory=list)        # (task, op, ms)

    def session_overhead_ms(self, task: str) -> float:
        return max(0.0, self.wall_ms - self.span_ms.get(task, 0.0))

    def to_json(self) -> dict[str, Any]:
        return {"steps": self.steps, "wall_ms": round(self.wall_ms, 3),
                "span_ms": {k: round(v, 3) for k, v in self.span_ms.items()},
                "by_category": {t: {c: round(v, 3) for c, v in cats.items()} for t, cats in self.by_category.items()},
                "counts": {t: {c: round(v, 2) for c, v in cats.items()} for t, cats in self.counts.items()},
                "top_ops": [[t, o, round(ms, 3)] for t, o, ms in self.top_ops]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Profile":
        return cls(steps=int(data["steps"]), wall_ms=float(data["wall_ms"]), span_ms=dict(data["span_ms"]),
                   by_category={t: dict(c) for t, c in data["by_category"].items()},
                   counts={t: dict(c) for t, c in data.get("counts", {}).items()},
                   top_ops=[(str(t), str(o), float(ms)) for t, o, ms in data["top_ops"]])


def aggregate(steps: Iterable[TracedStep], top: int = 12) -> Profile:
    """Averages traced steps into a :class:`Profile` (pure)."""
    steps = list(steps)
    profile = Profile(steps=len(steps))
    if not steps:
        return profile
    n = len(steps)
    per_op: dict[tuple[str, str], float] = defaultdict(float)
    for step in steps:
        profile.wall_ms += step.wall_us / 1000 / n
        bounds: dict[str, tuple[int, int]] = {}
        for op in step.ops:
            low, high = bounds.get(op.task, (op.start_us, op.start_us + op.duration_us))
            bounds[op.task] = (min(low, op.start_us), max(high, op.start_us + op.duration_us))
            cats = profile.by_category.setdefault(op.task, {c: 0.0 for c in CATEGORIES})
            cats[category(op.op)] += op.duration_us / 1000 / n
            counts = profile.counts.setdefault(op.task, {c: 0.0 for c in CATEGORIES})
            counts[category(op.op)] += 1 / n
            per_op[(op.task, op.op)] += op.duration_us / 1000 / n
        for task, (low, high) in bounds.items():
            profile.span_ms[task] = profile.span_ms.get(task, 0.0) + (high - low) / 1000 / n
    profile.top_ops = sorted(((t, o, ms) for (t, o), ms in per_op.items()), key=lambda r: -r[2])[:top]
    return profile


def _op_type(node: Any) -> str:
    # timeline_label: "name = OpType(inputs)"; node_name alone for ops without one (RecvTensor)
    label = getattr(node, "timeline_label", "") or ""
    if " = " in label:
        return label.split(" = ", 1)[1].split("(", 1)[0].strip()
    return str(node.node_name).split(":")[0]


def traced_step(wall_seconds: float, step_stats: Any) -> TracedStep:
    """A :class:`TracedStep` from ``RunMetadata.step_stats``."""
    ops = tuple(OpTime(task=task_of(dev.device), op=_op_type(node), start_us=int(node.all_start_micros),
                       duration_us=int(node.all_end_rel_micros))
                for dev in step_stats.dev_stats for node in dev.node_stats)
    return TracedStep(wall_us=int(wall_seconds * 1e6), ops=ops)


class StepTracer:
    """Decides which steps to trace (from the environment) and writes the aggregate."""

    def __init__(self, out_path: str | None, count: int, after: int) -> None:
        self.out_path = out_path
        self.count = count
        self.after = after
        self.steps: list[TracedStep] = []
        self.written = False

    @classmethod
    def from_env(cls, events_path: str | None, env: Mapping[str, str] = os.environ) -> "StepTracer":
        def number(key: str, default: int) -> int:
            try:
                return max(0, int(env.get(key, default)))
            except ValueError:
                return default
        out = f"{events_path}.trace.json" if events_path else None
        return cls(out, number(TRACE_ENV, 0), number(AFTER_ENV, DEFAULT_AFTER))

    def wants(self, step: int) -> bool:
        return bool(self.count) and not self.written and step >= self.after and len(self.steps) < self.count

    def add(self, wall_seconds: float, step_stats: Any) -> None:
        self.steps.append(traced_step(wall_seconds, step_stats))
        if len(self.steps) >= self.count:
            self.write()

    def write(self) -> None:
        if self.written or not self.steps or not self.out_path:
            return
        self.written = True
        with open(self.out_path, "w", encoding="utf-8") as f:
            json.dump(aggregate(self.steps).to_json(), f, indent=1)
