"""The cluster-side event contract: every kind is a dataclass; emitting an unknown kind or a
wrong field fails loudly at the emitter; every emit in the code matches a declared event."""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from cluster.events import EVENT_TYPES, RecordingReporter, Reporter, TeeReporter, UnknownEvent, validated

CLUSTER = Path(__file__).resolve().parents[2] / "cluster"


def test_fields_are_checked_and_defaults_filled():
    assert validated("message", {"text": "hi"}) == {"text": "hi", "level": "info"}
    assert validated("phase", {"name": "sync"}) == {"name": "sync", "detail": ""}
    assert validated("job", {"step": 3, "worker_progress": ("worker:1", {})})["step"] == 3
    for kind, data, words in [("task-stated", {"task": "a", "host": "b", "pid": 1}, "unknown event kind 'task-stated'"),
                              ("task-started", {"task": "a", "host": "b"}, "pid"),
                              ("message", {"text": "x", "levle": "warning"}, "levle"),
                              ("job", {"stpe": 3}, "stpe")]:
        with pytest.raises(UnknownEvent, match=words):
            validated(kind, data)


def test_reporters_receive_validated_events_and_a_bad_one_reaches_none():
    first, second = RecordingReporter(), RecordingReporter()
    tee = TeeReporter(first, second)
    tee.emit("sync", host="h", files=2, bytes=10, unchanged=1, skipped=False)
    with pytest.raises(UnknownEvent):
        tee.emit("sync", host="h", files=2)
    assert [e.kind for e in first.events] == [e.kind for e in second.events] == ["sync"]
    assert first.events[0].data == {"host": "h", "files": 2, "bytes": 10, "unchanged": 1, "skipped": False,
                                    "shared_with": None, "relayed_from": None, "relay_error": None}
    with pytest.raises(UnknownEvent):
        Reporter().emit("nonsense")


def _emit_calls():
    for path in sorted(CLUSTER.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "emit"
                    and node.args and isinstance(node.args[0], ast.Constant)):
                yield f"{path.relative_to(CLUSTER.parent)}:{node.lineno}", node


def test_every_emit_in_the_code_matches_a_declared_event():
    calls = list(_emit_calls())
    assert len(calls) > 30
    for where, node in calls:
        kind = node.args[0].value
        assert kind == "job" or kind in EVENT_TYPES, f"{where}: undeclared event {kind!r}"
        if kind == "job" or any(k.arg is None for k in node.keywords):      # **fields: checked at run time
            continue
        fields = {f.name: f for f in dataclasses.fields(EVENT_TYPES[kind])}
        given = {k.arg for k in node.keywords}
        assert given <= set(fields), f"{where}: {kind} has no field(s) {given - set(fields)}"
        required = {name for name, f in fields.items()
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
        assert required <= given, f"{where}: {kind} lacks {required - given}"
