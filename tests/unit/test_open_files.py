"""cluster/transport/limits.py: the open files N hosts need, raised when the hard limit allows,
refused with the ulimit to set when it does not (issue 46)."""
from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from cluster.errors import UsageError
from cluster.transport.limits import ensure_open_files, open_files_needed
from tests.helpers import REPO


def test_enough_already_changes_nothing():
    calls = []
    assert ensure_open_files(16, limits=(1024, 4096), raise_to=lambda *a: calls.append(a)) == 1024
    assert ensure_open_files(10_000, limits=(resource.RLIM_INFINITY, resource.RLIM_INFINITY),
                             raise_to=lambda *a: calls.append(a)) == resource.RLIM_INFINITY
    assert calls == []


def test_a_thousand_hosts_raise_the_soft_limit_up_to_what_they_need():
    calls = []
    needed = open_files_needed(1000)
    assert needed == 2064
    assert ensure_open_files(1000, limits=(1024, 524288), raise_to=lambda *a: calls.append(a)) == needed
    assert calls == [(resource.RLIMIT_NOFILE, (needed, 524288))]
    calls.clear()
    ensure_open_files(1000, limits=(1024, resource.RLIM_INFINITY), raise_to=lambda *a: calls.append(a))
    assert calls == [(resource.RLIMIT_NOFILE, (needed, resource.RLIM_INFINITY))]


def test_a_hard_limit_too_low_is_refused_with_the_ulimit_to_set():
    with pytest.raises(UsageError) as err:
        ensure_open_files(1000, limits=(1024, 1024), raise_to=lambda *a: pytest.fail("raised"))
    assert err.value.exit_code == 2
    assert "1000 hosts need about 2064 open files" in err.value.message and "(hard limit 1024)" in err.value.message
    assert "ulimit -n 2064" in err.value.hint


def test_the_real_limit_is_raised_in_a_process_of_its_own():
    # setrlimit for real, in a child (a soft limit lowered to 256, then 200 hosts' worth asked for)
    code = ("import resource\n"
            "from cluster.transport.limits import ensure_open_files\n"
            "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
            "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))\n"
            "print(ensure_open_files(200), resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 464:
        pytest.skip(f"this machine's hard limit ({hard}) is below 464")
    assert out.stdout.split() == ["464", "464"]
