"""A host that leaves the plan while its processes could not be stopped (lost, elastic drop-out)
stays known to the recorded plan, so `down` can still reach it; one with nothing left is forgotten.
Found by tests/docker/test_compose_lab.py: `down` after a worker container was killed failed with
a KeyError on the host the plan no longer knew."""
from __future__ import annotations

from dataclasses import replace

from cluster.lifecycle.resize import keep_reach
from cluster.lifecycle.tasks import stop_records
from cluster.events import Reporter
from cluster.state import ProcessRecord, RunState
from cluster.transport import TransportPool
from tests.unit.test_plan import lab_plan


def record(host: str, task: str, *, stopped: bool = False) -> ProcessRecord:
    return ProcessRecord(key=f"{task}#1", task=task, host=host, kind="server", attempt=1, log="x.log",
                         exit_file="x.exit", pid=4242, stopped=stopped)


def without(plan, host: str):
    return replace(plan, tasks=tuple(t for t in plan.tasks if t.host != host),
                   hosts=tuple(h for h in plan.hosts if h.name != host))


def test_a_host_with_live_records_stays_known_with_no_tasks():
    old = lab_plan()
    lost = old.hosts[-1].name
    new = without(old, lost)
    state = RunState(name=old.name, plan=old, processes=[record(lost, "worker:2"), record(old.hosts[0].name, "ps:0")])
    kept = keep_reach(new, state, old)
    assert kept.host(lost) == old.host(lost)
    assert kept.tasks == new.tasks                 # known, not planned: no task runs there


def test_a_host_with_nothing_left_is_forgotten():
    old = lab_plan()
    gone = old.hosts[-1].name
    new = without(old, gone)
    state = RunState(name=old.name, plan=old, processes=[record(gone, "worker:2", stopped=True)])
    assert keep_reach(new, state, old) is new


def test_stop_names_a_host_the_plan_does_not_know_instead_of_failing():
    old = lab_plan()
    lost = old.hosts[-1].name
    stopped, errors = stop_records(without(old, lost), [record(lost, "worker:2")], TransportPool(), Reporter(), grace=1)
    assert stopped == [] and "no longer says how to reach" in errors[lost].message
    assert "4242" in errors[lost].hint
