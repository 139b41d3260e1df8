"""--limit on plan, check, up, run and bench, and inventory warnings on stderr (issue 12 items 2-3).

plan runs for real; check, up and run stop at their first side effect (preflight, bring-up, the
one-shot run), replaced here by a recorder, so the test sees the plan each command made."""
from __future__ import annotations

import json

import pytest

from cluster.errors import PsclusterError

from .test_cli_plan import Captured
from .test_inventory_sources import FIXTURES

FOLDER = str(FIXTURES / "hosts.ini")      # node-a: chief, ps, 2 workers; node-b: ps, 2 workers; node-c: worker


class Stop(PsclusterError):
    exit_code = 7


@pytest.fixture
def recorder(monkeypatch):
    seen = []

    def record(cluster, *args, **kwargs):
        seen.append(cluster)
        raise Stop("recorded")
    import cluster.lifecycle.updown
    import cluster.hosts.preflight
    import cluster.supervision.program_job
    for module, name in ((cluster.hosts.preflight, "run_preflight"), (cluster.lifecycle.updown, "bring_up"),
                         (cluster.supervision.program_job, "run_one_shot")):
        monkeypatch.setattr(module, name, record)
    return seen


def test_plan_limit(tmp_path):
    cli = Captured(tmp_path)
    assert cli.run("plan", FOLDER, "--json", "--limit", "node-a") == 0
    tasks = json.loads(cli.stdout.getvalue())["tasks"]
    assert {task["host"] for task in tasks} == {"node-a"}
    assert sorted(task["role"] for task in tasks) == ["chief", "ps", "worker", "worker"]
    assert json.loads(cli.stdout.getvalue())["limit"] == {"pattern": "node-a", "selected": ["node-a"]}


def test_plan_says_what_the_limit_selected(tmp_path):
    cli = Captured(tmp_path)
    assert cli.run("plan", FOLDER, "--limit", "all:!node-c") == 0
    assert "--limit all:!node-c selected 2 host(s): node-a, node-b" in " ".join(cli.stdout.getvalue().split())
    cli = Captured(tmp_path)
    assert cli.run("plan", FOLDER, "--json") == 0
    assert "limit" not in json.loads(cli.stdout.getvalue())


@pytest.mark.parametrize("argv", [["check"], ["up"], ["run", "--on", "worker"]])
def test_commands_plan_for_the_limited_hosts(tmp_path, recorder, argv):
    cli = Captured(tmp_path)
    extra = ["--", "python", "-c", "pass"] if argv[0] == "run" else []
    assert cli.run(*argv[:1], FOLDER, *argv[1:], "--limit", "all:!node-a", *(["--mode", "sync"]
                                                                             if argv[0] != "run" else []), *extra) == 7
    assert {task.host for task in recorder[0].tasks} == {"node-b", "node-c"}


@pytest.mark.parametrize("command", ["plan", "check", "up", "run", "bench"])
def test_limit_leaving_a_role_empty_is_exit_2(tmp_path, recorder, command):
    cli = Captured(tmp_path)
    argv = {"bench": ["bench", "distributed_mnist", FOLDER, "--workers", "1"],
            "run": ["run", FOLDER]}.get(command, [command, FOLDER])
    tail = ["--", "python", "-c", "pass"] if command == "run" else []
    assert cli.run(*argv, "--limit", "nothing*", *tail) == 2
    assert "--limit 'nothing*' matches no host" in cli.stderr.getvalue()
    assert cli.run(*argv, "--limit", "node-b", *tail) == 2 or command == "bench"
    assert recorder == []


def test_limit_without_inventory_in_run_is_refused(tmp_path):
    cli = Captured(tmp_path)
    assert cli.run("run", "--limit", "node-a", "--", "python", "-c", "pass") == 2
    assert "--limit apply to a one-shot run" in cli.stderr.getvalue()


def test_warnings_are_printed_once_on_stderr(tmp_path):
    path = tmp_path / "warn.yaml"
    path.write_text("all:\n  vars:\n    ansible_connection: local\n    ansible_ssh_pipelining: true\n"
                    "  children:\n    worker:\n      hosts:\n        localhost:\n")
    cli = Captured(tmp_path)
    assert cli.run("plan", str(path), "--mode", "sync") == 0, cli.stderr.getvalue()
    err = cli.stderr.getvalue()
    assert err.count("ansible_ssh_pipelining") == 1
    assert f"warning: {path}:4: all.vars.ansible_ssh_pipelining: ignored by pscluster" in err
    assert "ansible_ssh_pipelining" not in cli.stdout.getvalue()


def test_limit_warns_as_ansible_does(tmp_path):
    """Issue 29 item 5: a part that matches nothing is ignored with Ansible's warning, on stderr."""
    cli = Captured(tmp_path)
    assert cli.run("plan", FOLDER, "--json", "--mode", "sync", "--limit", "nosuchhost:node-c") == 0
    assert "Could not match supplied host pattern, ignoring: nosuchhost" in cli.stderr.getvalue()
    assert {task["host"] for task in json.loads(cli.stdout.getvalue())["tasks"]} == {"node-c"}


def test_run_dry_run_shows_each_task_and_starts_nothing(tmp_path, recorder, write_inventory):
    """Issue 24 item 6: run --dry-run prints each task's filled command line, mask, TF_CONFIG and
    environment, secrets masked, and starts nothing; the duplicate task index is warned."""
    write_inventory("""
        all:
          vars: {pscluster_port_base: 2222, pscluster_secret_env: [WANDB_API_KEY]}
          children:
            chief: {hosts: {localhost: {ansible_connection: local}}}
            ps: {hosts: {localhost: {ansible_connection: local}}}
            worker: {hosts: {localhost: {ansible_connection: local, worker_tasks: 2, worker_gpus: [[0], [1]]}}}
    """)
    cli = Captured(tmp_path / "state")
    code = cli.run("run", "lab.yaml", "--on", "worker", "--dry-run", "--json", "--",
                   "python", "train.py", "--task_index=0", "--job_name={job_name}")
    assert code == 0, cli.stderr.getvalue()
    document = json.loads(cli.stdout.getvalue())
    rows = {row["task"]: row for row in document["tasks"]}
    assert sorted(rows) == ["worker:0", "worker:1"]
    assert rows["worker:1"]["argv"][1:] == ["train.py", "--task_index=0", "--job_name=worker"]
    assert rows["worker:1"]["cuda_visible_devices"] == "1"
    assert rows["worker:1"]["tf_config"]["task"] == {"type": "worker", "index": 1}
    assert rows["worker:1"]["env"]["WANDB_API_KEY"] == "****"
    assert document["warnings"] == ["worker:0 and worker:1 get the same command line; did you mean {task_index}?"]
    assert recorder == [] and not (tmp_path / "state").exists()      # nothing started, no state written


def test_run_dry_run_lists_the_files_it_would_copy_and_their_total(tmp_path, write_inventory):
    """Issue 42, M1: what travels is visible before anything does."""
    write_inventory("""
        all:
          children:
            worker: {hosts: {localhost: {ansible_connection: local}}}
    """)
    (tmp_path / "main.py").write_text("print(1)\n")
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "a.txt").write_text("abc")
    cli = Captured(tmp_path / "state")
    assert cli.run("run", "lab.yaml", "--dry-run", "--json", "--", "python", "main.py") == 0, cli.stderr.getvalue()
    document = json.loads(cli.stdout.getvalue())
    size = (tmp_path / "lab.yaml").stat().st_size
    assert sorted(document["files"], key=lambda f: f["path"]) == [
        {"path": "conf/a.txt", "size": 3}, {"path": "lab.yaml", "size": size}, {"path": "main.py", "size": 9}]
    assert document["files_size"] == 12 + size
