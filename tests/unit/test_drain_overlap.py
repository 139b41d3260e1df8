"""A sync drain's overlap against its budget (cluster/supervision/train_resize.py): how long the
resize waits for standbys still importing, and new workers that are not at their gates when
the budget ends go on their way instead of being stopped (benchmarks.drain --at 0.2)."""
from __future__ import annotations

import os
from dataclasses import replace
from types import SimpleNamespace

import pytest

from cluster.errors import PsclusterError
from cluster.layout import gate_file
from cluster.supervision import train_resize
from cluster.supervision.train_resize import (OVERLAP_NEEDS, RESIZE_RESERVE, STANDBY_WAIT, Resizer,
                                              drain_standby_wait)


def test_a_drain_waits_for_standbys_until_its_overlap_would_no_longer_fit():
    assert drain_standby_wait(None, overlap=True) == STANDBY_WAIT            # a scale: the usual wait
    assert drain_standby_wait(None, overlap=False) == STANDBY_WAIT
    # a 30-s deadline's budget (20 s): sync waits until 6 + 1.5 s before its end, async a third
    assert drain_standby_wait(20.0, overlap=True) == pytest.approx(20.0 - RESIZE_RESERVE - OVERLAP_NEEDS)
    assert drain_standby_wait(20.0, overlap=False) == pytest.approx(20.0 / 3)
    # a short budget: never less than a third; a long one: never more than STANDBY_WAIT
    assert drain_standby_wait(12.0, overlap=True) == pytest.approx(4.5)
    assert drain_standby_wait(9.0, overlap=True) == pytest.approx(3.0)
    assert drain_standby_wait(600.0, overlap=True) == STANDBY_WAIT


class _Ex:
    """What wait_at_gates touches of the executor: a clock that each sleep moves on."""

    def __init__(self) -> None:
        self.now = 100.0
        self.plan = SimpleNamespace(host=lambda name: name)
        self.pool = SimpleNamespace(get=lambda host: host)

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def gates(tmp_path, monkeypatch):
    """Two new workers' events files; hostops.read reads this machine's files."""
    def read(transport, path, limit=0, offset=0):
        return SimpleNamespace(exists=os.path.exists(path))
    monkeypatch.setattr(train_resize.hostops, "read", read)
    following = {}
    for index in range(2):
        events = str(tmp_path / f"worker-{index}.events.jsonl")
        record = SimpleNamespace(exit_file=str(tmp_path / f"worker-{index}.exit"), log="log")
        following[f"worker:{index}"] = (SimpleNamespace(host="w1"), record, events)
    resizer = Resizer.__new__(Resizer)
    resizer.pump = lambda ex: None
    return resizer, following


def test_new_workers_late_for_a_drains_budget_go_on_their_way(gates):
    resizer, following = gates
    open(gate_file(following["worker:0"][2]), "w").close()      # worker:0 waits at its gate, worker:1 not yet
    ex = _Ex()
    late = resizer.wait_at_gates(ex, ex.plan, following, by=ex.now + 2.0)
    assert late == ["worker:1"]
    assert ex.now >= 102.0                                       # it waited out the budget first


def test_all_at_their_gates_is_no_one_late(gates):
    resizer, following = gates
    for _, _, events in following.values():
        open(gate_file(events), "w").close()
    ex = _Ex()
    assert resizer.wait_at_gates(ex, ex.plan, following, by=ex.now + 2.0) == []
    assert ex.now == 100.0


def test_without_a_budget_or_with_one_ended_a_late_worker_is_an_error(gates):
    resizer, following = gates
    ex = _Ex()
    with pytest.raises(PsclusterError, match="not ready in time"):       # a scale: STANDBY_WAIT, then an error
        resizer.wait_at_gates(ex, ex.plan, following, by=None)
    assert ex.now >= 100.0 + STANDBY_WAIT
    open(following["worker:1"][1].exit_file, "w").close()
    with pytest.raises(PsclusterError, match="worker:1 ended before it was ready"):
        resizer.wait_at_gates(_Ex(), ex.plan, following, by=200.0)


def test_the_standbys_of_a_host_left_without_training_tasks_stop_before_the_wait(monkeypatch):
    """A drained host's standby can serve no task of the new plan: it is stopped before the
    resize waits for the others, not in the pause (it imported beside them: benchmarks.drain)."""
    from cluster.state import ProcessKind, ProcessRecord
    def record(task, host, kind, attempt=1):
        return ProcessRecord.for_task(task, host, kind, attempt, f"/tmp/{task}-{host}-{kind.value}.log",
                                      job=1 if kind == ProcessKind.TRAIN else None)
    kept = record("worker:0", "w1", ProcessKind.STANDBY)
    renumbered = record("worker:2", "w3", ProcessKind.STANDBY)       # worker:1@w3 takes it
    drained = record("worker:1", "w2", ProcessKind.STANDBY)
    trainer = record("worker:1", "w2", ProcessKind.TRAIN)            # the job's: stopped by the resize itself
    state = SimpleNamespace(processes=[kept, renumbered, drained, trainer])
    state.live_records = lambda: [r for r in state.processes if not r.stopped]

    def replace_records(records):
        by_key = {r.key: r for r in records}
        state.processes = [by_key.get(r.key, r) for r in state.processes]
    state.replace_records = replace_records
    asked = []

    def stop_records(plan, records, pool, reporter, *, grace):
        asked.extend(r.key for r in records)
        return [replace(r, stopped=True) for r in records], {}
    monkeypatch.setattr(train_resize, "stop_records", stop_records)
    monkeypatch.setattr(train_resize.resize, "knowing_hosts", lambda old, new: new)
    new = SimpleNamespace(training_tasks=[SimpleNamespace(name="worker:0", host="w1"),
                                          SimpleNamespace(name="worker:1", host="w3")])
    lost = record("worker:3", "w4", ProcessKind.STANDBY)             # its host does not answer: left to apply_plan
    state.processes.append(lost)
    ex = SimpleNamespace(state=state, plan=None, pool=None, reporter=None,
                         lost_hosts=lambda: {"w4"},
                         writer=SimpleNamespace(change=lambda fn: fn(state)))
    Resizer.stop_idle_standbys(ex, new)
    assert asked == [drained.key]
    assert [r.stopped for r in state.processes] == [False, False, True, False, False]
    asked.clear()
    Resizer.stop_idle_standbys(ex, new)           # nothing left to stop: no call
    assert asked == []
