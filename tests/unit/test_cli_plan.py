"""The CLI on commands that touch no host: ``plan``, and ``status`` and ``down`` without a cluster.

``cluster.cli.run`` returns the exit code; an ``Env`` with consoles writing to StringIO
captures what the user would see.
"""
from __future__ import annotations

import io
import json
import sys

import jsonschema
from rich.console import Console

from cluster.cli import Env, run
from cluster.hosts.codesync import project_root
from cluster.state import StateStore

from .conftest import INVENTORIES, PLAN_SCHEMA


class Captured:
    def __init__(self, state_dir):
        self.stdout, self.stderr = io.StringIO(), io.StringIO()
        # Wide and colourless, so that nothing wraps or carries escape codes.
        self.env = Env(out=Console(file=self.stdout, width=500, color_system=None),
                       err=Console(file=self.stderr, width=500, color_system=None),
                       store=StateStore(state_dir))

    def run(self, *argv: str) -> int:
        return run(list(argv), env=self.env)


def test_plan_json_of_the_lab_inventory(tmp_path):
    cli = Captured(tmp_path / "state")
    assert cli.run("plan", str(INVENTORIES / "lab.yaml"), "--json") == 0
    document = json.loads(cli.stdout.getvalue())
    jsonschema.validate(document, PLAN_SCHEMA)
    assert document["cluster"] == {
        "chief": ["198.51.100.10:2222"],
        "ps": ["198.51.100.10:2223", "198.51.100.11:2222"],
        "worker": ["198.51.100.10:2224", "198.51.100.11:2223", "198.51.100.11:2224"],
    }
    assert [(task["role"], task["index"], task["host"], task["address"], task["port"], task["cuda_visible_devices"])
            for task in document["tasks"]] == [
        ("chief", 0, "node-a", "198.51.100.10", 2222, None),
        ("ps", 0, "node-a", "198.51.100.10", 2223, ""),
        ("ps", 1, "node-b", "198.51.100.11", 2222, ""),
        ("worker", 0, "node-a", "198.51.100.10", 2224, "0"),
        ("worker", 1, "node-b", "198.51.100.11", 2223, "0"),
        ("worker", 2, "node-b", "198.51.100.11", 2224, "1"),
    ]
    for task in document["tasks"]:
        assert task["tf_config"] == {"cluster": document["cluster"],
                                     "task": {"type": task["role"], "index": task["index"]}}
    assert document["tasks"][1]["argv"] == ["/opt/pscluster/venv/bin/python", "-m", "roles.server"]
    assert cli.stderr.getvalue() == ""
    assert not (tmp_path / "state").exists()            # planning writes no state


def test_plan_json_of_the_local_inventory_with_options(tmp_path):
    cli = Captured(tmp_path)
    assert cli.run("plan", str(INVENTORIES / "local.yaml"), "--json", "--mode", "sync-ps",
                   "--port-base", "3000", "--name", "exp1") == 0
    document = json.loads(cli.stdout.getvalue())
    jsonschema.validate(document, PLAN_SCHEMA)
    assert document["cluster"] == {"ps": ["localhost:3001", "localhost:3002"],
                                   "worker": ["localhost:3003", "localhost:3004"]}
    assert document["tasks"][0]["argv"] == [sys.executable, "-m", "roles.server"]
    assert document["tasks"][0]["env"]["PSCLUSTER_CLUSTER"] == "exp1"
    assert document["tasks"][0]["workdir"] == str(project_root())


def test_plan_table(tmp_path):
    cli = Captured(tmp_path)
    assert cli.run("plan", str(INVENTORIES / "lab.yaml")) == 0
    text = cli.stdout.getvalue()
    for target in ("198.51.100.10:2222", "198.51.100.11:2224"):
        assert target in text


def test_plan_of_a_bad_inventory(tmp_path, write_inventory):
    write_inventory("""\
        all:
          children:
            chief:  {hosts: {node-a: }}
            ps:     {hosts: {node-a: , node-b: }}
            worker:
              hosts:
                node-a:
                node-b: {worker_gpus: [[0], one]}
        """)
    cli = Captured(tmp_path / "state")
    assert cli.run("plan", "lab.yaml", "--json") == 2
    assert cli.stdout.getvalue() == ""
    lines = cli.stderr.getvalue().splitlines()
    assert lines[0] == 'error: lab.yaml:8: worker.hosts.node-b.worker_gpus[1]: ' \
                       'expected a GPU index or a list of them, got "one"'
    assert lines[1].startswith("  hint: ")


def test_plan_of_a_missing_inventory(tmp_path, write_inventory):   # write_inventory: cwd is tmp_path
    cli = Captured(tmp_path)
    assert cli.run("plan", "missing.yaml") == 2
    assert cli.stderr.getvalue().splitlines()[0] == "error: missing.yaml: no such file"


def test_plan_that_cannot_run(tmp_path, write_inventory):
    write_inventory("all:\n  children:\n    ps: {hosts: {a: }}\n    worker: {hosts: {a: }}\n")
    cli = Captured(tmp_path)
    assert cli.run("plan", "lab.yaml", "--mode", "async") == 2
    assert cli.stderr.getvalue().splitlines()[0] == \
        "error: lab.yaml: mode async needs a chief task to run the ClusterCoordinator"


def test_plan_and_a_dry_run_agree_without_a_mode(tmp_path, write_inventory):
    """Issue 45 item 6: a workers-only inventory without pscluster_mode: `plan` refused it
    (async needs a chief) while `run --dry-run` planned both workers."""
    write_inventory("all:\n  children:\n    worker: {hosts: {a: {worker_tasks: 2}}}\n")
    cli = Captured(tmp_path)
    assert cli.run("plan", "lab.yaml") == 0, cli.stderr.getvalue()
    assert "mode sync: the default for an inventory with worker (no --mode, no pscluster_mode; " \
           "async with a chief, else sync-ps with ps, else sync); 'pscluster run' without --mode starts " \
           "every role it defines (worker)" in cli.stdout.getvalue().splitlines()
    as_json = Captured(tmp_path)
    assert as_json.run("plan", "lab.yaml", "--json") == 0
    document = json.loads(as_json.stdout.getvalue())
    assert (document["mode"], document["mode_from"]) == ("sync", "default")
    assert [(task["role"], task["index"]) for task in document["tasks"]] == [("worker", 0), ("worker", 1)]
    dry = Captured(tmp_path)
    assert dry.run("run", "lab.yaml", "--dry-run", "--json", "--", "python", "p.py") == 0, dry.stderr.getvalue()
    run_document = json.loads(dry.stdout.getvalue())
    assert [task["task"] for task in run_document["tasks"]] == ["worker:0", "worker:1"]
    assert run_document["tasks"][0]["tf_config"]["cluster"] == document["cluster"] == {"worker": ["a:2222", "a:2223"]}


def test_status_without_a_cluster(tmp_path):
    cli = Captured(tmp_path / "state")
    assert cli.run("status") == 2
    assert cli.stdout.getvalue() == ""
    assert cli.stderr.getvalue().splitlines() == [
        "error: no cluster is up",
        "  hint: start one with 'pscluster up inventories/local.yaml'",
    ]


def test_status_of_an_unknown_cluster(tmp_path):
    cli = Captured(tmp_path)
    assert cli.run("status", "--name", "nope") == 2
    assert cli.stderr.getvalue().splitlines()[0] == "error: no cluster named 'nope' (known: none)"


def test_down_of_an_unknown_cluster_lists_clusters_not_resize_files(tmp_path):
    """Issue 45 item 3: `down --name X` said `known: bar23s.resize-result, barlab23.resize-result`."""
    from cluster.lifecycle.resize_request import post_result
    for name in ("bar23s", "barlab23"):             # answers of resizes that outlived their clusters
        post_result(StateStore(tmp_path), name, ok=True, message="resized")
    cli = Captured(tmp_path)
    assert cli.run("down", "--name", "X") == 2
    assert cli.stderr.getvalue().splitlines()[0] == "error: no cluster named 'X' (known: none)"
    assert cli.run("down") == 2                     # nor is any of them the one cluster that is up
    assert cli.stderr.getvalue().splitlines()[2] == "error: no cluster is up"
