"""The async chief's side of a change in place (roles/membership.py): which requests it takes,
and how it reads them. The TensorFlow part runs in tests/local/test_resize.py."""
from __future__ import annotations

import json
import os

import pytest

from roles.membership import MembershipRefused, Requests, control_path, plan_change

OLD = {"chief": ["h1:2222"], "ps": ["h1:2223"], "worker": ["h1:2224", "h2:2222"]}


def test_workers_added_after_the_last_or_the_last_removed():
    assert plan_change(OLD, dict(OLD, worker=[*OLD["worker"], "h3:2222", "h4:2222"])) == (["h3:2222", "h4:2222"], 0)
    assert plan_change(OLD, dict(OLD, worker=OLD["worker"][:1])) == ([], 1)
    assert plan_change(OLD, dict(OLD)) == ([], 0)


@pytest.mark.parametrize("new, why", [
    (dict(OLD, worker=["h2:2222", "h1:2224"]), "other than the last"),
    (dict(OLD, worker=["h1:2224", "h3:2222"]), "other than the last"),
    (dict(OLD, worker=[]), "no worker"),
    (dict(OLD, ps=["h1:2223", "h2:2223"]), "'ps' tasks"),
    (dict(OLD, chief=["h9:1"]), "'chief' tasks"),
    ({"worker": ["h1:2224"]}, "'chief' tasks"),
    (["not", "a", "cluster"], "no cluster"),
    ({"worker": [1, 2]}, "no cluster"),
])
def test_anything_else_is_refused_with_the_reason(new, why):
    with pytest.raises(MembershipRefused, match=why):
        plan_change(OLD, new)


def test_requests_are_read_once_and_in_order(tmp_path):
    path = control_path(str(tmp_path / "chief-0.1.events.jsonl"))
    requests = Requests(path)
    assert requests.poll() is None                        # no file yet
    (tmp_path / os.path.basename(path)).write_text(json.dumps({"seq": 1, "cluster": OLD}))
    assert requests.poll() == {"seq": 1, "cluster": OLD}
    assert requests.poll() is None                        # the same request is not taken twice
    with open(path, "w") as handle:
        handle.write("{torn")                             # never half a request (hostctl replaces it whole)
    assert requests.poll() is None
    with open(path, "w") as handle:
        json.dump({"seq": 1, "cluster": {}}, handle)      # an old sequence number again
    assert requests.poll() is None
    with open(path, "w") as handle:
        json.dump({"seq": 2, "cluster": OLD, "padding": "x"}, handle)
    assert requests.poll()["seq"] == 2
    assert Requests(None).poll() is None
    assert Requests(path).poll() is None and not os.path.exists(path)   # an earlier trainer's request is gone
