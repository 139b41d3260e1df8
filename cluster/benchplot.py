"""The ``bench --plot`` figure: throughput and scaling efficiency against the number of workers.

matplotlib is imported only inside :func:`write_plot` (and is an optional dependency), so
importing this module costs nothing and other commands never load it. The figure is drawn
on an Agg canvas directly, without pyplot's global state.
"""
from __future__ import annotations

import importlib.util
from typing import Sequence

from .bench import BenchSummary
from .errors import UsageError

# One colour per mode, one line style per placement: the two can be told apart in print.
MODE_COLORS = {"async": "#1f77b4", "sync": "#d62728", "sync-ps": "#2ca02c"}
PLACEMENT_STYLES = {"pack": ("-", "o"), "spread": ("--", "s")}


def require_matplotlib() -> None:
    """Fail before a study starts, not after it ran, when the plot cannot be drawn.

    Raises:
        UsageError: matplotlib is not installed.
    """
    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--plot needs matplotlib, which is not installed",
                         hint="pip install matplotlib (or pip install -e '.[test]'), or drop --plot")


def write_plot(summaries: Sequence[BenchSummary], path: str, *, title: str, subtitle: str = "") -> None:
    """Write a PNG with two panels: examples/s vs workers (with the ideal linear scaling
    from the 1-worker median, dashed) and efficiency vs workers (1.0 = linear scaling).
    Markers are medians over repeats; bars show min-max.

    Raises:
        UsageError: the file cannot be written.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    lines: dict[tuple[str, str], list[BenchSummary]] = {}
    for row in summaries:
        if row.examples_per_second is not None:
            lines.setdefault((row.mode, row.placement), []).append(row)
    workers = sorted({row.workers for row in summaries})

    figure = Figure(figsize=(12, 5.2), dpi=110, layout="constrained")
    FigureCanvasAgg(figure)
    throughput, efficiency = figure.subplots(1, 2)
    for (mode, placement), rows in lines.items():
        rows = sorted(rows, key=lambda r: r.workers)
        color = MODE_COLORS.get(mode, "#555555")
        style, marker = PLACEMENT_STYLES.get(placement, ("-", "o"))
        label = f"{mode}, {placement}"
        xs = [r.workers for r in rows]
        eps = [r.examples_per_second for r in rows]
        throughput.errorbar(xs, [s.median for s in eps],
                            yerr=[[s.median - s.low for s in eps], [s.high - s.median for s in eps]],
                            color=color, linestyle=style, marker=marker, markersize=7, linewidth=2,
                            capsize=4, label=label)
        one = next((r for r in rows if r.workers == 1), None)
        if one is not None:
            throughput.plot(workers, [one.examples_per_second.median * n for n in workers], color=color,
                            linestyle=":", linewidth=1.2, alpha=0.7, label=f"{label}: linear scaling")
        effs = [(r.workers, r.efficiency) for r in rows if r.efficiency is not None]
        if effs:
            efficiency.errorbar([x for x, _ in effs], [e.median for _, e in effs],
                                yerr=[[e.median - e.low for _, e in effs], [e.high - e.median for _, e in effs]],
                                color=color, linestyle=style, marker=marker, markersize=7, linewidth=2,
                                capsize=4, label=label)
            for x, e in effs:
                efficiency.annotate(f"{e.median:.2f}", (x, e.median), textcoords="offset points", xytext=(0, 9),
                                    ha="center", fontsize=9, color=color)

    throughput.set_title("Throughput", fontsize=12)
    throughput.set_ylabel("examples per second (median)")
    throughput.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))
    throughput.set_ylim(bottom=0)
    efficiency.set_title("Scaling efficiency = throughput(N) / (N × throughput(1))", fontsize=12)
    efficiency.set_ylabel("efficiency (1.0 = linear scaling)")
    efficiency.axhline(1.0, color="#888888", linestyle=":", linewidth=1.2)
    top = max([1.2] + [r.efficiency.high * 1.15 for rows in lines.values() for r in rows if r.efficiency])
    efficiency.set_ylim(0, top)
    for axes in (throughput, efficiency):
        axes.set_xlabel("workers")
        axes.set_xticks(workers or [1])
        axes.grid(True, alpha=0.3)
        if axes.get_legend_handles_labels()[0]:
            axes.legend(fontsize=9, loc="best")
    if not lines:
        throughput.text(0.5, 0.5, "no configuration produced a throughput", ha="center", va="center",
                        transform=throughput.transAxes)
    figure.suptitle(title + (f"\n{subtitle}" if subtitle else ""), fontsize=13)
    try:
        figure.savefig(path, format="png")
    except OSError as exc:
        raise UsageError(f"cannot write the plot to {path}: {exc.strerror or exc}") from None
