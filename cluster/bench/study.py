"""``pscluster bench``: the scale-up / scale-out study, one configuration after another.

A study trains one job for a fixed step budget on clusters of 1, 2, 4 ... workers, per mode
and placement, and records bring-up time, training time, throughput, accuracy and scaling
efficiency. Planning is pure (:func:`plan_study`): each configuration is the inventory's own
cluster with a subset of its worker slots, planned by :func:`~cluster.plan.plan_cluster`, so
ports, masks and TF_CONFIG are exactly what ``up`` would use. Placement:

* ``spread``: one worker per worker host, hosts in inventory order;
* ``pack``: fill each worker host up to its slots before the next. A host's slots are its
  ``worker_gpus`` masks, else its ``worker_tasks``, else its CPU count (from the host facts).

:class:`Study` then brings each configuration up, trains, and always brings it down again;
a failed configuration is recorded and the study goes on; Ctrl-C stops the study after taking
the current cluster down. Besides lifecycle's and supervision's events, it emits
``bench-config`` (index, total, mode, workers, placement, repeat, name) before a configuration
and ``bench-result`` (result: :class:`BenchResult`) after it. Where and how the study ran (this
machine, the hosts' facts, the command line) is :mod:`cluster.bench.environment`'s.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..contracts import MODE_NAMES, canonical_mode, resolve_mode
from ..errors import PlanError, PsclusterError, UsageError
from ..events import Reporter, TeeReporter
from ..inventory import MODES, Inventory
from ..plan import ClusterPlan, HostSpec, PlanOptions, plan_cluster
from ..secrets import Secrets
from ..state import StateStore
from ..supervision.train_spec import JobRef, JobOptions
from ..transport import TransportPool

PLACEMENTS = ("spread", "pack")


def comma_list(text: str, what: str, choices: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """``a,b,c`` as its distinct items, each one of ``choices`` when given (``what``: the option)."""
    items = tuple(dict.fromkeys(item.strip() for item in text.split(",") if item.strip()))
    if not items:
        raise UsageError(f"{what}: give at least one value")
    wrong = [item for item in items if choices is not None and item not in choices]
    if wrong and choices is not None:
        raise UsageError(f"{what}: {', '.join(wrong)} is not one of {', '.join(choices)}",
                         hint=f"e.g. {what} {','.join(choices)}")
    return items


@dataclass(frozen=True)
class StudySpec:
    """What to measure: modes x worker counts x placements, each ``repeat`` times."""

    modes: tuple[str, ...]
    workers: tuple[int, ...]
    placements: tuple[str, ...]
    steps: int
    repeat: int = 1
    target_accuracy: float | None = None
    eval_every: int | None = None
    batch_size: int | None = None
    steps_per_execution: int | None = None
    port_base: int | None = None          # overrides every host's pscluster_port_base
    ready_timeout: float = 120.0

    def __post_init__(self) -> None:
        bad = [mode for mode in self.modes if mode not in MODES] + \
              [placement for placement in self.placements if placement not in PLACEMENTS]
        if bad or not self.modes or not self.placements or not self.workers or min(self.workers) < 1:
            raise ValueError(f"invalid study: {self}")

    @classmethod
    def from_command_line(cls, inventory: Inventory, *, workers: str, modes: str | None, placements: str,
                          **settings: Any) -> StudySpec:
        """The study ``pscluster bench`` asks for: comma-separated ``--workers``, ``--mode`` (default:
        the inventory's mode) and ``--placement``, on an inventory whose GPU slots are known up front.

        Raises:
            UsageError: what the command line got wrong, naming the option.
        """
        auto = [host.name for host in inventory.hosts if any(slot.auto_gpus for slot in host.slots)]
        if auto:
            raise UsageError(f"<role>_gpus: auto on {', '.join(auto)}: bench needs each host's GPU slots up front",
                             hint="list the masks (worker_gpus: [[0], [1]]) for bench")
        try:
            counts = tuple(sorted({int(item) for item in comma_list(workers, "--workers")}))
        except ValueError:
            raise UsageError(f"--workers: expected whole numbers, got {workers!r}", hint="e.g. --workers 1,2,4") from None
        if counts[0] < 1:
            raise UsageError("--workers: a configuration needs at least 1 worker")
        chosen = comma_list(modes or resolve_mode(inventory.mode, roles=inventory.mode_roles()), "--mode", MODE_NAMES)
        return cls(modes=tuple(dict.fromkeys(canonical_mode(mode) for mode in chosen)), workers=counts,
                   placements=comma_list(placements, "--placement", PLACEMENTS), **settings)

    def train_options(self) -> JobOptions:
        """A benchmark measures one clean run: a restart would be timed as training."""
        eval_every = self.eval_every
        if self.target_accuracy is not None and eval_every is None:
            eval_every = max(1, self.steps // 10)
        return JobOptions(steps=self.steps, batch_size=self.batch_size, eval_every=eval_every,
                            steps_per_execution=self.steps_per_execution, restart_policy="never",
                            max_restarts=0, grace=5.0)


@dataclass(frozen=True)
class HostSlots:
    """How many workers a host can take when packing, and where that number comes from."""

    host: str
    slots: int
    source: str           # "worker_gpus" | "worker_tasks" | "cpus"


@dataclass(frozen=True)
class HostUse:
    """The workers one configuration places on a host."""

    host: str
    workers: int
    slots: int
    source: str


@dataclass(frozen=True)
class BenchConfig:
    """One cluster of the study; ``plan`` is None when it cannot be built (``impossible``)."""

    mode: str
    workers: int
    placement: str
    repeat: int
    name: str
    hosts: tuple[HostUse, ...]
    plan: ClusterPlan | None
    impossible: str | None = None


def config_name(mode: str, workers: int, placement: str, repeat: int) -> str:
    return f"bench-{mode}-{workers}w-{placement}-r{repeat}"


def worker_slots(inventory: Inventory, cpus: Mapping[str, int]) -> tuple[HostSlots, ...]:
    """Each worker host's slots, in inventory order.

    Args:
        cpus: CPU count per host (from host facts); a host missing here counts one CPU.
    """
    result = []
    for name in inventory.hosts_of("worker"):
        slots = inventory.host(name).slots_for("worker")
        if slots is None:
            continue
        if slots.gpus is not None:
            result.append(HostSlots(name, len(slots.gpus), "worker_gpus"))
        elif slots.origin.key_path.rsplit(".", 1)[-1] in ("worker_tasks", "worker_ports"):
            # The origin names the key that fixed the count; otherwise the count is the default 1.
            result.append(HostSlots(name, slots.count, "worker_tasks"))
        else:
            result.append(HostSlots(name, max(1, cpus.get(name, 1)), "cpus"))
    return tuple(result)


def assign_workers(slots: Sequence[HostSlots], workers: int, placement: str) -> tuple[HostUse, ...]:
    """Place ``workers`` workers on the hosts (pure, like Horovod's slot assignment).

    Raises:
        PlanError: the hosts cannot take that many workers with this placement.
    """
    if placement == "spread":
        if workers > len(slots):
            raise PlanError(f"spread places one worker per host: {workers} workers need {workers} worker hosts, "
                            f"the inventory has {len(slots)} ({', '.join(s.host for s in slots) or 'none'})")
        return tuple(HostUse(s.host, 1, s.slots, s.source) for s in slots[:workers])
    total = sum(s.slots for s in slots)
    if workers > total:
        shown = ", ".join(f"{s.host}: {s.slots} from {s.source}" for s in slots)
        raise PlanError(f"pack: {workers} workers need {workers} slots, the worker hosts have {total} ({shown})")
    uses, left = [], workers
    for s in slots:
        if left == 0:
            break
        take = min(left, s.slots)
        uses.append(HostUse(s.host, take, s.slots, s.source))
        left -= take
    return tuple(uses)


def subset_inventory(inventory: Inventory, uses: Sequence[HostUse], *, port_shift: int,
                     port_base: int | None = None) -> Inventory:
    """The inventory with only the chosen worker slots, every host's port base moved by
    ``port_shift`` (from ``port_base`` when given). Explicit ports are kept as written."""
    counts = {use.host: use.workers for use in uses}
    hosts = []
    for host in inventory.hosts:
        slots = []
        for role_slots in host.slots:
            if role_slots.role == "worker":
                if host.name not in counts:
                    continue
                n = counts[host.name]
                role_slots = replace(role_slots, count=n,
                                     gpus=role_slots.gpus[:n] if role_slots.gpus is not None else None,
                                     ports=role_slots.ports[:n] if role_slots.ports is not None else None)
            slots.append(role_slots)
        base = port_base if port_base is not None else host.port_base
        hosts.append(replace(host, slots=tuple(slots), port_base=base + port_shift))
    role_hosts = tuple((role, tuple(h for h in names if role != "worker" or h in counts))
                       for role, names in inventory.role_hosts)
    return replace(inventory, hosts=tuple(hosts), role_hosts=tuple((r, n) for r, n in role_hosts if n))


def plan_study(inventory: Inventory, spec: StudySpec, options: PlanOptions,
               cpus: Mapping[str, int]) -> tuple[BenchConfig, ...]:
    """Every configuration of the study, in the order it runs: repeat, mode, placement, workers.

    Repeats run as rounds, so an interrupted study has a whole first round. Each configuration
    gets its own cluster name and port range, so a leftover of one never collides with another.
    Configurations that cannot be built carry the reason instead of a plan.
    """
    slots = worker_slots(inventory, cpus)
    # The planner gives a port to every task of the inventory (unused roles too), so no address
    # holds more than this many ports of one configuration.
    stride = sum(s.count for h in inventory.hosts for s in h.slots if s.role != "worker") + max(spec.workers)
    configs = []
    index = 0
    for repeat in range(1, spec.repeat + 1):
        for mode in spec.modes:
            for placement in spec.placements:
                for workers in spec.workers:
                    name = config_name(mode, workers, placement, repeat)
                    uses: tuple[HostUse, ...] = ()
                    try:
                        uses = assign_workers(slots, workers, placement)
                        subset = subset_inventory(inventory, uses, port_shift=index * stride,
                                                  port_base=spec.port_base)
                        plan = plan_cluster(subset, replace(options, name=name, mode=mode, port_base=None))
                        configs.append(BenchConfig(mode, workers, placement, repeat, name, uses, plan))
                    except PsclusterError as exc:
                        configs.append(BenchConfig(mode, workers, placement, repeat, name, uses, None,
                                                   impossible=exc.message))
                    index += 1
    return tuple(configs)


def study_hosts(inventory: Inventory, spec: StudySpec, options: PlanOptions) -> tuple[HostSpec, ...]:
    """The hosts any configuration may use (every host of the full cluster in each mode)."""
    hosts: dict[str, HostSpec] = {}
    for mode in spec.modes:
        try:
            plan = plan_cluster(inventory, replace(options, mode=mode))
        except PsclusterError:
            continue        # reported per configuration by plan_study
        hosts.update((host.name, host) for host in plan.hosts)
    return tuple(hosts.values())


# ----------------------------------------------------------------------------- results

@dataclass(frozen=True)
class BenchResult:
    """One configuration, one repeat. ``status``: ok | failed | impossible | interrupted."""

    mode: str
    workers: int
    placement: str
    repeat: int
    name: str
    status: str
    hosts: tuple[HostUse, ...] = ()
    bringup_seconds: float | None = None
    train_seconds: float | None = None
    global_step: int | None = None
    steps_per_second: float | None = None
    examples_per_second: float | None = None
    per_worker_examples_per_second: tuple[tuple[str, float], ...] | None = None
    val_accuracy: float | None = None
    val_loss: float | None = None
    efficiency: float | None = None
    time_to_target_seconds: float | None = None
    error: str | None = None
    down_error: str | None = None

    def to_json(self) -> dict:
        document = asdict(self)
        document["hosts"] = [{"host": u.host, "workers": u.workers, "slots": u.slots, "slots_from": u.source}
                             for u in self.hosts]
        document["per_worker_examples_per_second"] = \
            dict(self.per_worker_examples_per_second) if self.per_worker_examples_per_second else None
        return document


def _round(value: Any, digits: int) -> float | None:
    return round(float(value), digits) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def time_to_target(report: Mapping[str, Any], target: float | None) -> float | None:
    """Seconds from the start of ``train`` to the first evaluation at or above ``target``.

    The final evaluation counts too, at the report's wall time. None: no target, or never reached.
    """
    if target is None:
        return None
    for item in report.get("evals") or []:
        if isinstance(item.get("val_accuracy"), (int, float)) and item["val_accuracy"] >= target:
            return item.get("seconds")
    final = report.get("val_accuracy")
    if isinstance(final, (int, float)) and final >= target:
        return report.get("wall_seconds")
    return None


def measured(config: BenchConfig, *, bringup_seconds: float, report: Mapping[str, Any],
             global_batch_size: int | None, per_worker: Mapping[str, float] | None,
             target: float | None) -> BenchResult:
    """A result from the training executor's report (``train_executor(...).run()``; pure).

    steps/s is the report's examples/s over the global batch: both are measured by the driver
    after the first step (so tracing and start-up are not counted). A run too short for a
    second step (or scheduled closure, in async mode) has neither.
    """
    eps = _round(report.get("examples_per_second"), 1)
    wall = _round(report.get("wall_seconds"), 2)
    sps = _round(eps / global_batch_size, 2) if eps is not None and global_batch_size else None
    return BenchResult(
        config.mode, config.workers, config.placement, config.repeat, config.name, "ok", config.hosts,
        bringup_seconds=round(bringup_seconds, 2), train_seconds=wall, global_step=report.get("global_step"),
        steps_per_second=sps, examples_per_second=eps,
        per_worker_examples_per_second=tuple((k, round(v, 1)) for k, v in sorted(per_worker.items()))
        if per_worker else None,
        val_accuracy=_round(report.get("val_accuracy"), 4), val_loss=_round(report.get("val_loss"), 4),
        time_to_target_seconds=time_to_target(report, target))


def with_efficiency(results: Sequence[BenchResult]) -> tuple[BenchResult, ...]:
    """Fill ``efficiency`` = throughput_N / (N x throughput_1), against the median 1-worker
    throughput of the same mode and placement (None without one)."""
    base = baselines(results)
    out = []
    for result in results:
        one = base.get((result.mode, result.placement))
        eff = None
        if one and result.examples_per_second is not None:
            eff = round(result.examples_per_second / (result.workers * one), 3)
        out.append(replace(result, efficiency=eff))
    return tuple(out)


def baselines(results: Sequence[BenchResult]) -> dict[tuple[str, str], float]:
    groups: dict[tuple[str, str], list[float]] = {}
    for r in results:
        if r.workers == 1 and r.status == "ok" and r.examples_per_second:
            groups.setdefault((r.mode, r.placement), []).append(r.examples_per_second)
    return {key: statistics.median(values) for key, values in groups.items()}


@dataclass(frozen=True)
class Spread:
    """Median and range of one measure over the repeats that produced it."""

    median: float
    low: float
    high: float
    count: int

    @staticmethod
    def of(values: Sequence[float | None]) -> "Spread | None":
        present = [v for v in values if v is not None]
        if not present:
            return None
        return Spread(statistics.median(present), min(present), max(present), len(present))


@dataclass(frozen=True)
class BenchSummary:
    """One configuration over its repeats (what the table and the plot show)."""

    mode: str
    placement: str
    workers: int
    hosts: tuple[HostUse, ...]
    runs: int
    ok: int
    bringup_seconds: Spread | None
    train_seconds: Spread | None
    steps_per_second: Spread | None
    examples_per_second: Spread | None
    efficiency: Spread | None
    val_accuracy: Spread | None
    time_to_target_seconds: Spread | None
    impossible: str | None = None

    def to_json(self) -> dict:
        document = asdict(self)
        document["hosts"] = [{"host": u.host, "workers": u.workers} for u in self.hosts]
        return document


def summarize(results: Sequence[BenchResult]) -> tuple[BenchSummary, ...]:
    """Medians with min-max per (mode, placement, workers), in study order.

    The median efficiency is the median throughput over N x the 1-worker median, so the
    1-worker row reads exactly 1.0; its spread is that of the single results.
    """
    groups: dict[tuple[str, str, int], list[BenchResult]] = {}
    for result in results:
        groups.setdefault((result.mode, result.placement, result.workers), []).append(result)
    base = baselines(results)
    rows = []
    for (mode, placement, workers), items in groups.items():
        ok = [r for r in items if r.status == "ok"]
        eps = Spread.of([r.examples_per_second for r in ok])
        efficiency = Spread.of([r.efficiency for r in ok])
        if efficiency and eps and base.get((mode, placement)):
            efficiency = replace(efficiency, median=round(eps.median / (workers * base[(mode, placement)]), 3))
        impossible = next((r.error for r in items if r.status == "impossible"), None)
        rows.append(BenchSummary(
            mode, placement, workers, items[0].hosts, len(items), len(ok),
            Spread.of([r.bringup_seconds for r in ok]), Spread.of([r.train_seconds for r in ok]),
            Spread.of([r.steps_per_second for r in ok]), eps, efficiency,
            Spread.of([r.val_accuracy for r in ok]), Spread.of([r.time_to_target_seconds for r in ok]),
            impossible=impossible))
    return tuple(rows)


# ----------------------------------------------------------------------------- running

class _Collector(Reporter):
    """Keeps what the report lacks: the global batch size and the per-worker split."""

    def __init__(self):
        self.global_batch_size: int | None = None
        self.windows: dict[int, dict[str, float]] = {}    # step -> per-worker examples/s

    def handle(self, kind: str, **data: Any) -> None:
        if kind != "job":
            return
        if data.get("global_batch_size"):
            self.global_batch_size = data["global_batch_size"]
        if data.get("per_worker") and data.get("step") is not None:
            self.windows[data["step"]] = dict(data["per_worker"])

    def per_worker(self, expected: Sequence[str] = (), overall: Mapping[str, float] | None = None
                   ) -> dict[str, float] | None:
        """Examples/s of each worker: over the whole loop when the leader reported it
        (``overall``, from its ``done`` event), else the mean over the progress windows, a worker
        missing from a window having done no work in it. ``expected`` names workers to show even
        if never seen (async: the chief attributes every closure; a sync leader only knows itself)."""
        if overall:
            return {name: float(overall.get(name, 0.0)) for name in sorted(set(expected).union(overall))}
        if not self.windows:
            return None
        names = sorted(set(expected).union(*self.windows.values()))
        return {name: statistics.fmean(window.get(name, 0.0) for window in self.windows.values())
                for name in names}


@dataclass
class StudyOutcome:
    results: list[BenchResult] = field(default_factory=list)
    interrupted: bool = False


def _failed(config: BenchConfig, status: str, error: str, bringup: float | None = None) -> BenchResult:
    return BenchResult(config.mode, config.workers, config.placement, config.repeat, config.name, status,
                       config.hosts, bringup_seconds=None if bringup is None else round(bringup, 2), error=error)


class Study:
    """Runs configurations one after another with the collaborators passed in (tests may
    replace the clock)."""

    def __init__(self, spec: StudySpec, *, store: StateStore, pool: TransportPool, job: JobRef,
                 reporter: Reporter, root: Path, secrets: Secrets | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.spec = spec
        self.store = store
        self.pool = pool
        self.job = job
        self.reporter = reporter
        self.root = root
        self.secrets = secrets
        self.clock = clock
        self.options = spec.train_options()

    def run(self, configs: Sequence[BenchConfig]) -> StudyOutcome:
        """Each configuration: up, train, always down. Failures are recorded and the study goes
        on; Ctrl-C ends it once the current cluster is down (``interrupted``). Efficiency is
        filled in at the end, over what was measured."""
        outcome = StudyOutcome()
        try:
            for index, config in enumerate(configs, 1):
                self.reporter.emit("bench-config", index=index, total=len(configs), mode=config.mode,
                                   workers=config.workers, placement=config.placement, repeat=config.repeat,
                                   name=config.name)
                result = self._one(config)
                outcome.results.append(result)
                self.reporter.emit("bench-result", result=result)
                if result.status == "interrupted":
                    outcome.interrupted = True
                    break
        except KeyboardInterrupt:      # between configurations: no cluster of ours is up
            outcome.interrupted = True
        outcome.results = list(with_efficiency(outcome.results))
        return outcome

    def _one(self, config: BenchConfig) -> BenchResult:
        from ..lifecycle.updown import bring_up
        from ..supervision.jobkind import JobInterrupted
        from ..supervision.train_job import train_executor
        if config.plan is None:
            return _failed(config, "impossible", config.impossible or "cannot be planned")
        existing = self.store.load(config.name)
        if existing is not None and (not existing.phase.ended or existing.live_records()):
            # Not ours to stop: a leftover of an earlier study, or someone else's cluster.
            return _failed(config, "failed", f"a cluster named {config.name!r} already exists ({existing.phase}); "
                                             f"run 'pscluster down --name {config.name}' first")
        collector = _Collector()
        reporter = TeeReporter(collector, self.reporter)
        began = self.clock()
        bringup = None
        try:
            bring_up(config.plan, store=self.store, reporter=reporter, timeout=self.spec.ready_timeout,
                     root=self.root, pool=self.pool, secrets=self.secrets)
            bringup = self.clock() - began
            report = train_executor(store=self.store, name=config.name, job=self.job, options=self.options,
                                    reporter=reporter, pool=self.pool, root=self.root, secrets=self.secrets).run()
            result = measured(config, bringup_seconds=bringup, report=report,
                              global_batch_size=collector.global_batch_size,
                              per_worker=collector.per_worker(
                                  [f"worker:{i}" for i in range(config.workers)] if config.mode == "async" else (),
                                  overall=report.get("per_worker_examples_per_second")),
                              target=self.spec.target_accuracy)
        except (KeyboardInterrupt, JobInterrupted):
            result = _failed(config, "interrupted", "interrupted by the user", bringup)
        except PsclusterError as exc:
            result = _failed(config, "failed", str(exc), bringup)
        finally:
            down_error = _down(config.name, store=self.store, pool=self.pool, reporter=reporter)
        return replace(result, down_error=down_error) if down_error else result


def _down(name: str, *, store: StateStore, pool: TransportPool, reporter: Reporter) -> str | None:
    """Bring a study cluster down if it has state; a Ctrl-C during it retries once, faster."""
    from ..lifecycle.updown import bring_down
    for grace in (5.0, 1.0):
        if store.load(name) is None:
            return None
        try:
            bring_down(name, store=store, reporter=reporter, grace=grace, pool=pool)
            return None
        except KeyboardInterrupt:
            continue
        except PsclusterError as exc:
            return str(exc)
    return f"interrupted while stopping; run 'pscluster down --name {name}'"


def document(results: Sequence[BenchResult], environment: dict) -> dict:
    """The ``--json`` / ``--out`` document."""
    return {"environment": environment, "results": [r.to_json() for r in results],
            "summary": [s.to_json() for s in summarize(results)]}
