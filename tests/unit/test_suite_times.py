"""scripts/suite_times.py: minutes and the machine's CPU minutes per area and file from JUnit
reports, and tests/conftest.py's per-test CPU property that feeds it."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import time

from tests.conftest import machine_busy_seconds
from tests.helpers import REPO

REPORT = textwrap.dedent("""\
    <?xml version="1.0" encoding="utf-8"?>
    <testsuites><testsuite name="pytest" tests="3" time="100.0">
    <testcase classname="tests.local.test_a" name="t1" time="60.0">
      <properties><property name="machine_cpu_seconds" value="90.5"/></properties></testcase>
    <testcase classname="tests.local.test_b" name="t2" time="30.0">
      <properties><property name="machine_cpu_seconds" value="29.5"/></properties></testcase>
    <testcase classname="tests.unit.test_c" name="t3" time="6.0"><skipped message="x"/></testcase>
    </testsuite></testsuites>
    """)


def _run(*args):
    return subprocess.run([sys.executable, str(REPO / "scripts/suite_times.py"), *args], capture_output=True,
                          text=True, timeout=60)


def test_cpu_minutes_are_summed_per_area_and_file_beside_the_minutes(tmp_path):
    report = tmp_path / "suite-local.xml"
    report.write_text(REPORT)
    out = _run(str(report))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    local = next(line for line in lines if line.strip().startswith("local"))
    assert "1.5 / 14 min" in local and "(CPU 2.0 min)" in local, local      # 90 s; 120 CPU-s
    unit = next(line for line in lines if line.strip().startswith("unit"))
    assert "(CPU - min)" in unit                        # no property: no figure, not zero
    assert "1.0 min  CPU   1.5  tests/local/test_a.py" in out.stdout
    markdown = _run(str(report), "--markdown").stdout
    assert "| local | 2 | 1.5 | 2.0 | 14 | 94 % |" in markdown
    assert _run(str(report), "--summary").stdout.strip() == "suite: 2 passed, 0 failed, 1 skipped"


def test_the_machines_busy_seconds_grow_with_work():
    before = machine_busy_seconds()
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
    after = machine_busy_seconds()
    assert before is not None and after is not None
    assert after - before >= 0.25          # at least this process's own 0.3 CPU-s (clock ticks: 0.01 s)
