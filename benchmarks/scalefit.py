"""The pure part of ``python -m benchmarks.scale``: fit how a measured figure grows with the
number of hosts, project it to sizes this machine cannot hold, find where it meets a limit, and
lay the measurements out as a table. No clock, no host, no process: unit-tested by hand
(tests/unit/test_scalefit.py).

Two models are fitted to each figure: a line ``a + b·N`` (fixed cost plus a cost per host) and
a power ``c·N^k`` (``k`` says how the growth bends: 1 linear, 2 quadratic, below 1 a cost that
levels off). The projection uses whichever fits the measured points with the smaller relative
error, so a figure that is flat at small N is not projected as a power law through noise, and
one that grows as N² is not drawn as a line.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

PHASES = ("check", "up", "status", "watch", "scale", "down")
METRICS = ("wall_s", "cpu_s", "cores", "rss_mb", "threads", "fds", "conns")


@dataclass(frozen=True)
class Fit:
    """``kind`` "linear" (``y = a + b·N``) or "power" (``y = a·N^b``), fitted on ``sizes``."""
    kind: str
    a: float
    b: float
    error: float            # root mean square of the relative residuals on the measured points

    def at(self, n: float) -> float:
        return self.a + self.b * n if self.kind == "linear" else self.a * n ** self.b

    def reaches(self, limit: float) -> float | None:
        """The smallest N >= 1 at which the fit reaches ``limit`` (None: it never does)."""
        if self.at(1) >= limit:
            return 1.0
        if self.kind == "linear":
            return (limit - self.a) / self.b if self.b > 0 else None
        if self.b <= 0 or self.a <= 0:
            return None
        return (limit / self.a) ** (1 / self.b)

    def describe(self) -> str:
        if self.kind == "linear":
            return f"{self.a:.3g} + {self.b:.3g}·N"
        return f"{self.a:.3g}·N^{self.b:.2f}"


def _relative_error(kind: str, a: float, b: float, sizes: Sequence[float], values: Sequence[float]) -> float:
    fit = Fit(kind, a, b, 0.0)
    residuals = [(fit.at(n) - y) / y if y else fit.at(n) for n, y in zip(sizes, values)]
    return math.sqrt(sum(r * r for r in residuals) / len(residuals))


def fit_linear(sizes: Sequence[float], values: Sequence[float]) -> Fit:
    """Least squares line through (N, y); needs two different sizes."""
    if len(sizes) != len(values) or len(set(sizes)) < 2:
        raise ValueError("a fit needs values at two or more different sizes")
    mean_n, mean_y = sum(sizes) / len(sizes), sum(values) / len(values)
    spread = sum((n - mean_n) ** 2 for n in sizes)
    b = sum((n - mean_n) * (y - mean_y) for n, y in zip(sizes, values)) / spread
    a = mean_y - b * mean_n
    return Fit("linear", a, b, _relative_error("linear", a, b, sizes, values))


def fit_power(sizes: Sequence[float], values: Sequence[float]) -> Fit | None:
    """Least squares line through (log N, log y); None when a value is not positive."""
    if any(y <= 0 for y in values) or any(n <= 0 for n in sizes):
        return None
    line = fit_linear([math.log(n) for n in sizes], [math.log(y) for y in values])
    a, b = math.exp(line.a), line.b
    return Fit("power", a, b, _relative_error("power", a, b, sizes, values))


def best_fit(sizes: Sequence[float], values: Sequence[float]) -> Fit:
    """The model with the smaller relative error (the line when they tie)."""
    line, power = fit_linear(sizes, values), fit_power(sizes, values)
    if power is not None and power.error < line.error - 1e-9:
        return power
    return line


@dataclass(frozen=True)
class Limit:
    """A figure's ceiling: ``value`` in the figure's unit, ``what`` names it (e.g. "ulimit -n")."""
    phase: str
    metric: str
    value: float
    what: str


@dataclass(frozen=True)
class Exhaustion:
    limit: Limit
    fit: Fit
    hosts: float | None     # N at which the fit reaches the limit; None: never


def projections(rows: Sequence[Mapping], phase: str, metric: str) -> Fit | None:
    """The best fit of ``metric`` over the sizes measured for ``phase`` (None: fewer than two)."""
    points = [(row["hosts"], row[metric]) for row in rows
              if row["phase"] == phase and row.get(metric) is not None]
    if len({n for n, _ in points}) < 2:
        return None
    return best_fit([float(n) for n, _ in points], [float(y) for _, y in points])


def first_exhausted(rows: Sequence[Mapping], limits: Sequence[Limit]) -> list[Exhaustion]:
    """Each limit with the N at which its figure's fit reaches it, soonest first (never last)."""
    found = []
    for limit in limits:
        fit = projections(rows, limit.phase, limit.metric)
        if fit is not None:
            found.append(Exhaustion(limit, fit, fit.reaches(limit.value)))
    return sorted(found, key=lambda e: (e.hosts is None, e.hosts or 0.0))


def _cell(value: float | None) -> str:
    if value is None:
        return "-"
    if float(value).is_integer():
        return f"{value:.0f}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}"


def table(rows: Sequence[Mapping]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the measurements: one row per size and phase, in PHASES order."""
    header = ["hosts", "phase", *METRICS, "left"]
    order = {phase: i for i, phase in enumerate(PHASES)}
    body = []
    for row in sorted(rows, key=lambda r: (r["hosts"], order.get(r["phase"], len(order)))):
        left = row.get("left")
        body.append([str(row["hosts"]), row["phase"], *(_cell(row.get(m)) for m in METRICS),
                     "-" if left is None else str(left)])
    return header, body


def projection_table(rows: Sequence[Mapping], targets: Sequence[int] = (1000, 10000)) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the fits: per phase and metric, the model and its value at ``targets``."""
    header = ["phase", "metric", "fit", *(f"N={n}" for n in targets)]
    body = []
    for phase in PHASES:
        for metric in METRICS:
            fit = projections(rows, phase, metric)
            if fit is not None:
                body.append([phase, metric, fit.describe(), *(_cell(fit.at(n)) for n in targets)])
    return header, body


@dataclass(frozen=True)
class UpProjection:
    """``up`` at ``hosts`` real hosts against ``base`` hosts (issue 46's "≤ 3× the 16-host time")."""
    hosts: int
    base: int
    base_wall: float        # s: the measured ``up`` of ``base`` hosts
    per_host: float         # control CPU-s a host of work (the wait's share taken out)
    wall: float             # s: projected
    ratio: float


def project_up(rows: Sequence[Mapping], idle_us: float, *, hosts: int = 1000, base: int = 16) -> UpProjection | None:
    """``up`` of ``hosts`` real hosts, from the measured sizes: each host's own work runs on that
    host, so what grows is this machine's CPU. A phase's CPU is its work plus what its open
    connections cost while it waits (``idle_us`` CPU-µs per host and second: keepalives,
    paramiko's readers; benchmarks.up_cost --idle); on this lab the wait is the lab's own (all
    hosts on this machine's cores), so it is taken out: work(N) = CPU(N) - idle·N·wall(N), fitted
    by a line from ``base`` hosts up. The projected time W holds its own wait's cost:
    W = wall(base) + slope·(hosts - base) + idle·hosts·W. None without ``base`` and a larger size."""
    points = {row["hosts"]: row for row in rows if row["phase"] == "up" and row.get("cpu_s") is not None}
    if base not in points or not any(n > base for n in points):
        return None
    idle = idle_us / 1e6
    sizes = sorted(n for n in points if n >= base)
    work = [points[n]["cpu_s"] - idle * n * points[n]["wall_s"] for n in sizes]
    slope = fit_linear([float(n) for n in sizes], work).b if len(sizes) > 1 else 0.0
    base_wall = points[base]["wall_s"]
    share = idle * hosts
    if share >= 1:
        return UpProjection(hosts, base, base_wall, slope, math.inf, math.inf)
    wall = (base_wall + slope * (hosts - base)) / (1 - share)
    return UpProjection(hosts, base, base_wall, slope, wall, wall / base_wall)


@dataclass(frozen=True)
class SpreadProjection:
    """``up`` of ``hosts`` real hosts with the SSH connections in ``helpers`` helper processes
    (cluster/transport/spread.py): ``parent_slope`` and ``helper_slope`` are CPU seconds per
    host of the control process and of the helpers (their waiting taken out), ``parent_s`` the
    control process's CPU beyond the base size's, ``helper_s`` the busiest helper's time for its
    share, ``wall_s`` the projected time and ``ratio`` it over ``base_wall``."""
    hosts: int
    helpers: int
    base: int
    base_wall: float
    parent_slope: float
    helper_slope: float
    parent_s: float
    helper_s: float
    wall_s: float
    ratio: float


def project_spread_up(base_wall: float, parent: Mapping[int, float], helpers: Mapping[int, tuple[float, float]],
                      idle_us: float, *, hosts: int = 1000, helper_count: int = 8, base: int = 16) -> SpreadProjection:
    """``up`` of ``hosts`` real hosts when ``helper_count`` helpers (each on a core of its own)
    hold the connections, from ``base_wall`` (``up`` of ``base`` hosts, all in one process, as
    below 128 hosts by default), ``parent`` (hosts -> the control process's CPU seconds in ``up``
    with helpers) and ``helpers`` (hosts -> (the helpers' CPU seconds together, ``up``'s wall
    seconds)), at two sizes or more each.

    Each line is fitted over the sizes given. The helpers' connections cost ``idle_us`` while
    they wait, as in :func:`project_up`, so that part is taken out of their measured CPU and
    paid again for the projected wait. The control process's own idle cost is small (it holds
    pipes, not connections) and stays in its slope. The two run at once, so the projected time
    is the base time plus the longer of the two: the control process's work for the added
    hosts, or the busiest helper's for its share (``hosts / helper_count`` hosts, all of its
    work counted, not only the added hosts': on the safe side).

    Raises:
        ValueError: fewer than two sizes for either line, or ``helper_count`` below 1.
    """
    if len(parent) < 2 or len(helpers) < 2 or helper_count < 1:
        raise ValueError("two sizes or more of each, and at least one helper")
    idle = idle_us / 1e6
    parent_fit = fit_linear([float(n) for n in sorted(parent)], [parent[n] for n in sorted(parent)])
    helper_work = [helpers[n][0] - idle * n * helpers[n][1] for n in sorted(helpers)]
    helper_fit = fit_linear([float(n) for n in sorted(helpers)], helper_work)
    share = hosts / helper_count
    parent_s = max(0.0, parent_fit.b) * (hosts - base)
    waiting = idle * share
    helper_s = math.inf if waiting >= 1 else max(0.0, helper_fit.b) * share / (1 - waiting)
    wall = base_wall + max(parent_s, helper_s)
    return SpreadProjection(hosts, helper_count, base, base_wall, parent_fit.b, helper_fit.b, parent_s, helper_s,
                            wall, wall / base_wall)
