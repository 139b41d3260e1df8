"""cluster/fanout.py: per-host results in input order, the ok/failed split, one root cause,
and errors it must not swallow."""
from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest

from cluster.errors import HostError, MultiHostError, PsclusterError, Terminated, UnreachableHostError
from cluster.fanout import fan_out


@dataclass(frozen=True)
class Host:
    name: str


HOSTS = [Host(f"node-{c}") for c in "abcde"]


def finish_in_reverse(items, work):
    """``work`` for every item, each call waiting until every later item's call has finished,
    so completion order is the reverse of input order (with enough workers)."""
    done = {item.name: threading.Event() for item in items}
    names = [item.name for item in items]

    def fn(item):
        for later in names[names.index(item.name) + 1:]:
            assert done[later].wait(10), f"{later} never finished"
        try:
            return work(item)
        finally:
            done[item.name].set()
    return fn


def test_outcomes_follow_input_order_not_completion_order():
    result = fan_out(HOSTS, finish_in_reverse(HOSTS, lambda host: host.name.upper()), name="test")
    assert [o.key for o in result] == [h.name for h in HOSTS]
    assert [o.item for o in result] == HOSTS
    assert list(result.ok) == [h.name for h in HOSTS]
    assert result.ok["node-c"] == "NODE-C"
    assert result.failed == {} and result.failures == [] and result.root_cause() is None
    result.raise_for_failures()     # nothing failed: no error


def test_ok_and_failed_split_keeps_each_exception():
    errors = {"node-b": HostError("node-b", "no route"), "node-d": UnreachableHostError("node-d", "refused")}

    def fn(host):
        if host.name in errors:
            raise errors[host.name]
        return len(host.name)

    result = fan_out(HOSTS, fn, name="test")
    assert list(result.ok) == ["node-a", "node-c", "node-e"]
    assert result.failed == errors and list(result.failed) == ["node-b", "node-d"]
    assert result.failed["node-d"] is errors["node-d"]
    assert type(result.failed["node-d"]) is UnreachableHostError
    assert not result["node-b"].ok and result["node-b"].error is errors["node-b"] and result["node-b"].value is None
    assert result["node-a"].ok and result["node-a"].value == 6
    with pytest.raises(KeyError):
        result["node-z"]


def test_root_cause_is_the_first_failure_in_input_order_whatever_finishes_first():
    def work(host):
        raise PsclusterError(f"{host.name} broke", hint=f"fix {host.name}")

    failing = HOSTS[1:4]
    result = fan_out(failing, finish_in_reverse(failing, work), name="firewall installation")
    assert [f.where for f in result.failures] == ["node-b", "node-c", "node-d"]
    root = result.root_cause()
    assert root is not None and root.where == "node-b" and root.error.message == "node-b broke"
    with pytest.raises(MultiHostError) as raised:
        result.raise_for_failures()
    error = raised.value
    assert error.root_cause is result.failed["node-b"]
    assert error.message.splitlines()[0] == "firewall installation failed on 3 host(s)"
    assert error.message.splitlines()[1] == "Root cause (first observed failure): node-b broke"
    assert error.hint == "fix node-b"          # the root cause's hint
    assert error.exit_code == 1


def test_raise_for_failures_takes_summary_and_hint():
    def fn(name):
        raise PsclusterError(f"{name} down")

    result = fan_out(["x", "y"], fn, name="stop")
    with pytest.raises(MultiHostError) as raised:
        result.raise_for_failures("down could not finish on 2 host(s)", hint="run down again")
    assert raised.value.message.splitlines()[0] == "down could not finish on 2 host(s)"
    assert raised.value.hint == "run down again"
    assert [f.where for f in raised.value.failures] == ["x", "y"]


def test_catch_narrows_which_errors_are_failures():
    def fn(name):
        if name == "b":
            raise PsclusterError("not a host error")
        raise HostError(name, "unreachable")

    with pytest.raises(PsclusterError, match="not a host error"):
        fan_out(["a", "b", "c"], fn, name="test", catch=HostError)
    result = fan_out(["a", "c"], fn, name="test", catch=HostError)
    assert list(result.failed) == ["a", "c"]


def test_catch_nothing_reraises_the_first_error_in_input_order_after_all_calls_ended():
    ended = []

    def work(name):
        ended.append(name)
        raise PsclusterError(name)

    items = [Host("a"), Host("b"), Host("c")]
    with pytest.raises(PsclusterError) as raised:
        fan_out(items, finish_in_reverse(items, lambda host: work(host.name)), name="launch", catch=())
    assert raised.value.message == "a"
    assert sorted(ended) == ["a", "b", "c"]


def test_a_bug_is_not_turned_into_a_failure():
    with pytest.raises(ZeroDivisionError):
        fan_out(["a", "b"], lambda name: 1 / 0 if name == "b" else 1, name="test")


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt(), Terminated(15)])
def test_keyboard_interrupt_in_a_call_is_not_swallowed(interrupt):
    calls = []

    def fn(name):
        calls.append(name)
        if name == "b":
            raise interrupt
        return name

    with pytest.raises(KeyboardInterrupt) as raised:
        fan_out(["a", "b", "c"], fn, name="test", catch=PsclusterError)
    assert raised.value is interrupt
    assert sorted(calls) == ["a", "b", "c"]


def test_empty_input_gives_an_empty_result_without_threads(monkeypatch):
    import cluster.fanout as fanout

    def no_executor(*args, **kwargs):
        raise AssertionError("an executor for no item")

    monkeypatch.setattr(fanout, "ThreadPoolExecutor", no_executor)
    result = fan_out([], lambda item: item, name="nothing")
    assert len(result) == 0 and result.ok == {} and result.failed == {} and result.root_cause() is None
    result.raise_for_failures()


@pytest.mark.parametrize("max_workers, items, expected", [(3, 10, 3), (32, 2, 2), (1, 4, 1)])
def test_max_workers_caps_the_threads(monkeypatch, max_workers, items, expected):
    import cluster.fanout as fanout
    asked = []
    real = fanout.ThreadPoolExecutor

    def recording(*args, **kwargs):
        asked.append(kwargs["max_workers"])
        return real(*args, **kwargs)

    monkeypatch.setattr(fanout, "ThreadPoolExecutor", recording)
    threads = set()
    lock = threading.Lock()
    running = [0]
    most = [0]

    def fn(index):
        with lock:
            threads.add(threading.current_thread().name)
            running[0] += 1
            most[0] = max(most[0], running[0])
        try:
            return index
        finally:
            with lock:
                running[0] -= 1

    result = fan_out([str(i) for i in range(items)], fn, name="cap", max_workers=max_workers)
    assert asked == [expected]
    assert len(threads) <= expected and most[0] <= expected
    assert list(result.ok.values()) == [str(i) for i in range(items)]


def test_calls_do_run_in_parallel():
    barrier = threading.Barrier(4, timeout=10)      # breaks (and fails the test) unless 4 calls run at once
    result = fan_out([str(i) for i in range(4)], lambda name: barrier.wait() is not None, name="parallel")
    assert list(result.ok.values()) == [True] * 4


def test_keys_come_from_key_or_name_and_must_be_unique():
    result = fan_out([("a", 1), ("b", 2)], lambda pair: pair[1] * 10, name="pairs", key=lambda pair: pair[0])
    assert result.ok == {"a": 10, "b": 20}
    with pytest.raises(ValueError, match="duplicate keys"):
        fan_out([Host("a"), Host("a")], lambda host: None, name="dup")
    with pytest.raises(TypeError, match="pass key="):
        fan_out([1, 2], lambda item: item, name="ints")
    with pytest.raises(ValueError, match="max_workers"):
        fan_out(["a"], lambda item: item, name="zero", max_workers=0)


def test_ctrl_c_while_waiting_lets_the_calls_under_way_end_first(monkeypatch):
    import cluster.fanout as fanout
    release = threading.Event()
    ended = []

    def interrupted_wait(futures):
        release.set()           # the calls may end now, but only after the interrupt was raised
        raise KeyboardInterrupt

    def fn(name):
        assert release.wait(10)
        ended.append(name)

    monkeypatch.setattr(fanout, "wait", interrupted_wait)
    with pytest.raises(KeyboardInterrupt):
        fan_out(["a", "b", "c"], fn, name="stop")
    assert sorted(ended) == ["a", "b", "c"]


def test_tick_runs_in_the_callers_thread_while_calls_are_under_way_and_not_after():
    release = threading.Event()
    ticks: list[str] = []

    def tick():
        ticks.append(threading.current_thread().name)
        if len(ticks) == 3:
            release.set()          # the calls end only once the caller ticked three times

    result = fan_out(["a", "b"], lambda name: release.wait(10) and name, name="ticking", tick=tick, tick_every=0.01)
    assert list(result.ok.values()) == ["a", "b"]
    assert len(ticks) == 3 and set(ticks) == {threading.current_thread().name}


def test_what_a_tick_raises_waits_for_the_calls_under_way_then_propagates():
    ended = []

    def fn(name):
        threading.Event().wait(0.1)
        ended.append(name)

    def tick():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fan_out(["a", "b"], fn, name="ticking", tick=tick, tick_every=0.01)
    assert sorted(ended) == ["a", "b"]      # nothing left half-done
