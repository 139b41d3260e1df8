"""cluster/transport/limits.py: the open files N hosts need, raised when the hard limit allows,
refused with the ulimit to set when it does not (issue 46); `check`/`up` (preflight), `status` and
`down` refuse before their first connection (the supervisor's check is in its executor's begin)."""
from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from cluster.contracts import Phase, ProcessKind
from cluster.errors import UsageError
from cluster.events import RecordingReporter
from cluster.hosts.preflight import run_preflight
from cluster.inventory import load_inventory
from cluster.lifecycle.status import cluster_status
from cluster.lifecycle.updown import bring_down
from cluster.plan import PlanOptions, plan_cluster
from cluster.state import ProcessRecord, RunState, StateStore
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


# ---------------------------------------------------------------- where each command checks it

HOSTS = 40           # 64 + 2 x 40 = 144 files needed; the fake limit below is 100, soft and hard


def _state_of_40_hosts(tmp_path):
    lines = ["all:", "  vars: {ansible_connection: local}", "  children:", "    ps:", "      hosts:", "        h0:",
             "    worker:", "      hosts:"] + [f"        h{i}: {{ansible_host: 127.0.1.{i + 1}}}" for i in range(HOSTS)]
    path = tmp_path / "forty.yaml"
    path.write_text("\n".join(lines) + "\n")
    plan = plan_cluster(load_inventory(str(path)), PlanOptions(local_python="/py", local_workdir="/wd", name="forty"))
    state = RunState(name="forty", plan=plan, phase="up")
    for number, task in enumerate(plan.tasks):
        record = ProcessRecord.for_task(task.name, task.host, ProcessKind.SERVER, 1, f"/wd/{task.name}.log")
        state.processes.append(ProcessRecord(**{**record.__dict__, "pid": 1000 + number, "started": 1.0}))
    return plan, state


class NoPool:
    def get(self, host):
        pytest.fail(f"connected to {host.name} past a file limit too low")

    def close(self):
        pass


@pytest.fixture
def low_limit(monkeypatch):
    monkeypatch.setattr(resource, "getrlimit", lambda which: (100, 100))
    monkeypatch.setattr(resource, "setrlimit", lambda *a: pytest.fail("raised past the hard limit"))


def _refused(error: UsageError) -> None:
    assert error.exit_code == 2
    assert f"{HOSTS} hosts need about {open_files_needed(HOSTS)} open files" in error.message
    assert f"ulimit -n {open_files_needed(HOSTS)}" in error.hint


def test_check_and_up_refuse_before_the_first_connection(tmp_path, low_limit):
    plan, _ = _state_of_40_hosts(tmp_path)
    with pytest.raises(UsageError) as err:
        run_preflight(plan, NoPool(), RecordingReporter())     # type: ignore[arg-type]
    _refused(err.value)


def test_status_refuses_before_asking_the_hosts(tmp_path, low_limit):
    _, state = _state_of_40_hosts(tmp_path)
    with pytest.raises(UsageError) as err:
        cluster_status(state, pool=NoPool())                    # type: ignore[arg-type]
    _refused(err.value)


def test_down_refuses_before_the_phase_changes(tmp_path, low_limit):
    _, state = _state_of_40_hosts(tmp_path)
    store = StateStore(tmp_path / "state")
    store.save(state)
    with pytest.raises(UsageError) as err:
        bring_down("forty", store=store, reporter=RecordingReporter(), pool=NoPool())   # type: ignore[arg-type]
    _refused(err.value)
    assert store.load("forty").phase == Phase.UP         # a later `down` with the ulimit raised finds it as it was
