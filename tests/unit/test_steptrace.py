"""The sync-ps step profile: op categories, per-task spans and averages (pure)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from roles.steptrace import (CATEGORIES, OpTime, Profile, StepTracer, TracedStep, aggregate, category,
                             task_of, traced_step)


@pytest.mark.parametrize("op, expected", [
    ("_MklNativeFusedConv2D", "compute"), ("ReluGrad", "compute"), ("SparseSoftmaxCrossEntropyWithLogits", "compute"),
    ("RecvTensor", "transfer"), ("_Recv", "transfer"), ("_HostSend", "transfer"),
    ("QueueDequeueV2", "token queue"), ("QueueEnqueueManyV2", "token queue"),
    ("ResourceAccumulatorApplyGradient", "accumulator"), ("ResourceConditionalAccumulator", "accumulator"),
    ("ResourceApplyAdam", "apply"), ("AssignAddVariableOp", "apply"),
    ("Const", "other"), ("NoOp", "other"), ("ReadVariableOp", "other"),
])
def test_op_categories(op, expected):
    assert category(op) == expected


def test_task_names_from_devices():
    assert task_of("/job:ps/replica:0/task:1/device:CPU:0") == "ps:1"
    assert task_of("/job:worker/replica:0/task:0/device:CPU:0") == "worker:0"
    assert task_of("weird") == "weird"


def test_aggregate_averages_per_step_and_measures_each_tasks_span():
    steps = [
        TracedStep(wall_us=20_000, ops=(OpTime("worker:0", "Conv2D", 1_000, 8_000),
                                        OpTime("worker:0", "RecvTensor", 0, 2_000),
                                        OpTime("ps:0", "QueueDequeueV2", 500, 4_000))),
        TracedStep(wall_us=30_000, ops=(OpTime("worker:0", "Conv2D", 0, 12_000),
                                        OpTime("ps:0", "QueueDequeueV2", 0, 6_000))),
    ]
    profile = aggregate(steps)
    assert profile.steps == 2 and profile.wall_ms == pytest.approx(25.0)
    assert profile.span_ms["worker:0"] == pytest.approx((9.0 + 12.0) / 2)
    assert profile.by_category["worker:0"]["compute"] == pytest.approx(10.0)
    assert profile.by_category["worker:0"]["transfer"] == pytest.approx(1.0)
    assert profile.by_category["ps:0"]["token queue"] == pytest.approx(5.0)
    assert profile.counts["worker:0"]["transfer"] == pytest.approx(0.5)     # one RecvTensor in two steps
    assert profile.counts["worker:0"]["compute"] == pytest.approx(1.0)
    assert set(profile.by_category["ps:0"]) == set(CATEGORIES)
    assert profile.session_overhead_ms("worker:0") == pytest.approx(25.0 - 10.5)
    assert profile.top_ops[0] == ("worker:0", "Conv2D", pytest.approx(10.0))
    assert Profile.from_json(json.loads(json.dumps(profile.to_json()))).to_json() == profile.to_json()


def test_nothing_traced_is_an_empty_profile():
    assert aggregate([]).to_json()["steps"] == 0


def test_a_traced_step_from_tensorflows_step_stats():
    node = SimpleNamespace(timeline_label="gradients/conv = _MklNativeConv2DBackpropInput(a, b)",
                           node_name="gradients/conv", all_start_micros=5, all_end_rel_micros=7)
    recv = SimpleNamespace(timeline_label="", node_name="RecvTensor", all_start_micros=1, all_end_rel_micros=3)
    stats = SimpleNamespace(dev_stats=[SimpleNamespace(device="/job:worker/replica:0/task:1/device:CPU:0",
                                                       node_stats=[node, recv])])
    step = traced_step(0.012, stats)
    assert step.wall_us == 12_000
    assert [(o.task, o.op, o.start_us, o.duration_us) for o in step.ops] == [
        ("worker:1", "_MklNativeConv2DBackpropInput", 5, 7), ("worker:1", "RecvTensor", 1, 3)]


def test_the_tracer_is_off_by_default_and_traces_n_steps_after_the_warm_up(tmp_path):
    assert not StepTracer.from_env(str(tmp_path / "e.jsonl"), env={}).wants(100)
    assert StepTracer.from_env("e", env={"PSCLUSTER_TRACE_STEPS": "x"}).count == 0
    tracer = StepTracer.from_env(str(tmp_path / "e.jsonl"),
                                 env={"PSCLUSTER_TRACE_STEPS": "2", "PSCLUSTER_TRACE_AFTER": "10"})
    assert not tracer.wants(9) and tracer.wants(10)
    stats = SimpleNamespace(dev_stats=[])
    tracer.add(0.01, stats)
    assert tracer.wants(11) and not (tmp_path / "e.jsonl.trace.json").exists()
    tracer.add(0.03, stats)
    assert not tracer.wants(12)
    written = json.loads((tmp_path / "e.jsonl.trace.json").read_text())
    assert written["steps"] == 2 and written["wall_ms"] == pytest.approx(20.0)
