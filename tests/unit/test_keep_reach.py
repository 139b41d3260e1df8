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


def test_stop_counts_the_records_of_a_host_whose_slurm_job_ended_as_stopped():
    """`down` after Slurm ended the allocation (NODE_FAIL, scancel, time limit): Slurm killed the
    steps, our processes in them; `down` finishes instead of failing on every host (seen: "srun:
    error: Slurm job 1 has expired" from each, exit 1, "when the host is reachable again...")."""
    from cluster.errors import HostEndedError
    from cluster.transport.base import Transport

    class Ended(Transport):
        def run(self, argv, *, stdin=None, timeout=60.0):
            raise HostEndedError(self.host.name, "Slurm job 7 has ended (NODE_FAIL, reason NodeDown): Slurm ends "
                                                 "its steps, and every task pscluster started there with them",
                                 whole_job=True)

        def stream(self, argv, *, stdin=None):
            raise AssertionError("not used")

        def _put_files(self, files, *, mode=None):
            raise AssertionError("not used")

    plan = lab_plan()
    host = plan.hosts[-1].name
    events = []
    reporter = Reporter()
    reporter.emit = lambda kind, **fields: events.append((kind, fields))
    records = [record(host, "worker:2"), replace(record(host, "ps:1"), key="ps:1#1")]
    stopped, errors = stop_records(plan, records, TransportPool(Ended), reporter, grace=1)
    assert errors == {} and sorted(r.task for r in stopped) == ["ps:1", "worker:2"]
    assert all(r.stopped for r in stopped)
    assert ("message", {"text": f"{host}: Slurm job 7 has ended (NODE_FAIL, reason NodeDown): Slurm ends its "
                                "steps, and every task pscluster started there with them"}) in events
    assert sum(kind == "task-stopped" for kind, _ in events) == 2
