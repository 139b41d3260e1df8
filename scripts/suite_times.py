"""Where the suite's time goes: per area and per file, from a pytest JUnit XML report.

    python scripts/suite_times.py runs/suite-*.xml [--markdown] [--summary]

``scripts/test.sh`` writes one report per lane (``runs/suite-local.xml``, ``runs/suite-hosts.xml``)
on every full run and calls this at the end, so each run prints its own table; docs/testing.md
keeps the table of a clean-clone run with its budget per area. A test's time is its setup, call
and teardown together (a module's shared cluster is paid by the test that first asks for it).
The lanes run at once, so the areas' sum is more than the wall time. Where the report carries
tests/conftest.py's ``machine_cpu_seconds`` (the machine's busy CPU over each test), the CPU
minutes per area and file are shown too: on 2 cores the suite is bound by CPU, so that is a
test's cost (measured on a machine running nothing else; with the two lanes at once each lane's
figures include the other's, so read them from a run with ``PSCLUSTER_TEST_LANES=1``). ``--summary`` prints only
the whole suite's count, as one line: ``suite: N passed, N failed, N skipped``.
"""
from __future__ import annotations

import argparse
import collections
import sys
import xml.etree.ElementTree as ET

# Minutes of test time (summed over workers) that each area may take; docs/testing.md explains.
BUDGET_MINUTES = {"unit": 3.0, "local": 14.0, "lab": 9.0, "faults": 5.0, "slurm": 6.0, "docker": 5.0}


def area_and_file(classname: str, file: str | None) -> tuple[str, str]:
    """``tests.local.test_resize`` -> ("local", "tests/local/test_resize.py")."""
    if file:
        parts = file.split("/")
        return (parts[1] if len(parts) > 2 else "?"), file
    parts = classname.split(".")
    path = "/".join(parts[:3]) + ".py" if len(parts) >= 3 else classname
    return (parts[1] if len(parts) > 1 else "?"), path


class Report:
    """Seconds per area and per file, tests per area, outcomes, and the longest lane's time."""

    def __init__(self) -> None:
        self.areas: dict[str, float] = collections.defaultdict(float)
        self.files: dict[str, float] = collections.defaultdict(float)
        self.counts: dict[str, int] = collections.defaultdict(int)
        self.cpu_areas: dict[str, float] = collections.defaultdict(float)
        self.cpu_files: dict[str, float] = collections.defaultdict(float)
        self.outcomes: dict[str, int] = collections.defaultdict(int)
        self.wall = 0.0

    def add(self, path: str) -> None:
        root = ET.parse(path).getroot()
        suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
        for case in root.iter("testcase"):
            area, file = area_and_file(case.get("classname", ""), case.get("file"))
            seconds = float(case.get("time") or 0.0)
            self.areas[area] += seconds
            self.files[file] += seconds
            self.counts[area] += 1
            cpu = next((float(prop.get("value") or 0.0) for prop in case.iter("property")
                        if prop.get("name") == "machine_cpu_seconds"), None)
            if cpu is not None:
                self.cpu_areas[area] += cpu
                self.cpu_files[file] += cpu
            kinds = {child.tag for child in case}
            self.outcomes["failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds
                          else "passed"] += 1
        self.wall = max(self.wall, sum(float(s.get("time") or 0.0) for s in suites))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+", metavar="report")
    parser.add_argument("--markdown", action="store_true", help="markdown tables (for docs/testing.md)")
    parser.add_argument("--summary", action="store_true", help="only the line 'suite: N passed, N failed, N skipped'")
    parser.add_argument("--files", type=int, default=15, help="how many of the slowest files to list")
    args = parser.parse_args(argv)
    report = Report()
    for path in args.reports:
        try:
            report.add(path)
        except (OSError, ET.ParseError) as exc:
            print(f"suite_times: cannot read {path}: {exc}", file=sys.stderr)
            return 2
    if args.summary:
        print(f"suite: {report.outcomes['passed']} passed, {report.outcomes['failed']} failed, "
              f"{report.outcomes['skipped']} skipped")
        return 0
    areas, files, counts = report.areas, report.files, report.counts
    summed = sum(areas.values())

    def cpu(minutes_of: dict[str, float], key: str) -> str:
        return f"{minutes_of[key] / 60:.1f}" if key in minutes_of else "-"

    if args.markdown:
        print("| area | tests | minutes | CPU minutes | budget | share |\n|---|---|---|---|---|---|")
        for area, seconds in sorted(areas.items(), key=lambda kv: -kv[1]):
            budget = BUDGET_MINUTES.get(area)
            print(f"| {area} | {counts[area]} | {seconds / 60:.1f} | {cpu(report.cpu_areas, area)} "
                  f"| {'' if budget is None else f'{budget:.0f}'} | {100 * seconds / summed:.0f} % |")
        print(f"| all | {sum(counts.values())} | {summed / 60:.1f} | {sum(report.cpu_areas.values()) / 60:.1f} "
              f"| {sum(BUDGET_MINUTES.values()):.0f} | |")
        print("\n| file | minutes | CPU minutes |\n|---|---|---|")
        for file, seconds in sorted(files.items(), key=lambda kv: -kv[1])[:args.files]:
            print(f"| {file} | {seconds / 60:.1f} | {cpu(report.cpu_files, file)} |")
        return 0
    print(f"suite time by area (test minutes; the longest lane took {report.wall / 60:.1f} min):")
    for area, seconds in sorted(areas.items(), key=lambda kv: -kv[1]):
        budget = BUDGET_MINUTES.get(area)
        over = "  OVER BUDGET" if budget is not None and seconds / 60 > budget else ""
        shown = "" if budget is None else f" / {budget:.0f}"
        print(f"  {area:8} {counts[area]:5d} tests  {seconds / 60:6.1f}{shown} min{over}  "
              f"(CPU {cpu(report.cpu_areas, area)} min)")
    print("slowest files (CPU minutes: the machine's, over the file's tests):")
    for file, seconds in sorted(files.items(), key=lambda kv: -kv[1])[:args.files]:
        print(f"  {seconds / 60:6.1f} min  CPU {cpu(report.cpu_files, file):>5}  {file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
