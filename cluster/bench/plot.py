"""The ``bench --plot`` figure: throughput and scaling efficiency against the number of workers.

matplotlib is imported only inside :func:`write_plot` (and is an optional dependency), so
importing this module costs nothing and other commands never load it. The figure is drawn
on an Agg canvas directly, without pyplot's global state.
"""
from __future__ import annotations

import importlib.util
from typing import Any, Sequence

from .study import BenchSummary
from ..errors import UsageError

# One colour per mode, one line style per placement: the two can be told apart in print.
MODE_COLORS = {"async": "#1f77b4", "sync": "#d62728", "sync-ps": "#2ca02c"}
PLACEMENT_STYLES: dict[str, tuple[Any, str]] = {"pack": ("-", "o"), "spread": ("--", "s")}


def require_matplotlib() -> None:
    """Fail before a study starts, not after it ran, when the plot cannot be drawn.

    Raises:
        UsageError: matplotlib is not installed.
    """
    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--plot needs matplotlib, which is not installed",
                         hint="pip install matplotlib (or pip install -e '.[test]'), or drop --plot")


def describe_environment(environment: dict) -> str:
    """One line under the title: TensorFlow, hosts with their CPUs and GPUs, date."""
    hosts = [host for host in environment.get("hosts", []) if "error" not in host]
    tf = sorted({f"{h['tf_dist']} {h['tf_version']}" for h in hosts if h.get("tf_version")})
    cpus = sorted({h.get("cpus") or 0 for h in hosts})
    gpus = sorted({len(h.get("gpus") or []) for h in hosts})
    each = " each" if len(hosts) > 1 else ""
    date = str(environment.get("date", ""))[:16].replace("T", " ")
    return (f"{', '.join(tf) or 'TensorFlow ?'} · {len(hosts)} host(s), "
            f"{'/'.join(map(str, cpus))} CPU(s) and {'/'.join(map(str, gpus))} GPU(s){each} · {date} UTC")


def write_plot(summaries: Sequence[BenchSummary], path: str, *, title: str, subtitle: str = "") -> None:
    """Write a PNG with two panels: examples/s vs workers (dotted: linear scaling from the
    1-worker median) and efficiency vs workers (1.0 = linear scaling). One line per mode and
    placement; markers are medians over repeats, bars the min-max range.

    Raises:
        UsageError: the file cannot be written.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter

    lines: dict[tuple[str, str], list[BenchSummary]] = {}
    for row in summaries:
        if row.examples_per_second is not None:
            lines.setdefault((row.mode, row.placement), []).append(row)
    workers = sorted({row.workers for row in summaries}) or [1]
    span = max(1, workers[-1] - workers[0])
    label_points = len(lines) <= 2          # numbers next to markers only while they stay legible

    figure = Figure(figsize=(12, 5.6), dpi=110, layout="constrained")
    FigureCanvasAgg(figure)
    throughput, efficiency = figure.subplots(1, 2)
    handles = []
    for number, ((mode, placement), rows) in enumerate(lines.items()):
        rows = sorted(rows, key=lambda r: r.workers)
        color = MODE_COLORS.get(mode, "#555555")
        style, marker = PLACEMENT_STYLES.get(placement, ("-", "o"))
        # Lines side by side, so that their range bars do not hide each other.
        shift = (number - (len(lines) - 1) / 2) * 0.012 * span
        look = dict(color=color, linestyle=style, marker=marker, markersize=7, linewidth=2, capsize=4, zorder=3)
        eps = [(r.workers, r.examples_per_second) for r in rows if r.examples_per_second is not None]
        effs = [(r.workers, r.efficiency) for r in rows if r.efficiency is not None]
        for axes, points, fmt in ((throughput, eps, ",.0f"), (efficiency, effs, ".2f")):
            if not points:
                continue
            axes.errorbar([x + shift for x, _ in points], [v.median for _, v in points],
                          yerr=[[v.median - v.low for _, v in points], [v.high - v.median for _, v in points]],
                          **look)
            for x, v in points if label_points else ():
                axes.annotate(format(v.median, fmt), (x + shift, v.median), textcoords="offset points",
                              xytext=(0, 9 if number == 0 else -16), ha="center", fontsize=9, color=color)
        one = next((r for r in rows if r.workers == 1), None)
        if one is not None and one.examples_per_second is not None:
            throughput.plot(workers, [one.examples_per_second.median * n for n in workers], color=color,
                            linestyle=":", linewidth=1.2, alpha=0.8)
        handles.append(Line2D([], [], color=color, linestyle=style, marker=marker, linewidth=2,
                              label=f"{mode}, {placement}"))
    if handles:
        handles.append(Line2D([], [], color="#666666", linestyle=":", linewidth=1.2,
                              label="linear scaling from 1 worker"))
        figure.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 4), fontsize=10,
                      frameon=False)
    else:
        throughput.text(0.5, 0.5, "no configuration produced a throughput", ha="center", va="center",
                        transform=throughput.transAxes)

    throughput.set_title("Throughput", fontsize=12)
    throughput.set_ylabel("examples per second")
    throughput.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))
    # The linear-scaling lines may leave the chart: they must not squash the measured ones.
    highest = max([r.examples_per_second.high for rows in lines.values() for r in rows
                   if r.examples_per_second is not None] or [1.0])
    throughput.set_ylim(0, min(throughput.get_ylim()[1] * 1.08, highest * 1.6))
    efficiency.set_title("Scaling efficiency = throughput(N) / (N × throughput(1))", fontsize=12)
    efficiency.set_ylabel("efficiency (1.0 = linear scaling)")
    efficiency.axhline(1.0, color="#666666", linestyle=":", linewidth=1.2)
    top = max([1.2] + [r.efficiency.high * 1.12 for rows in lines.values() for r in rows if r.efficiency])
    efficiency.set_ylim(0, top)
    pad = max(0.3, span * 0.06)
    for axes in (throughput, efficiency):
        axes.set_xlabel("workers")
        axes.set_xticks(workers)
        axes.set_xlim(workers[0] - pad, workers[-1] + pad)
        axes.grid(True, alpha=0.3)
    figure.suptitle(title + (f"\n{subtitle}" if subtitle else ""), fontsize=13)
    try:
        figure.savefig(path, format="png")
    except OSError as exc:
        raise UsageError(f"cannot write the plot to {path}: {exc.strerror or exc}") from None
