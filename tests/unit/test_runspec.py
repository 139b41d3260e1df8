"""`pscluster run`, the pure part (cluster/program/runspec.py): placeholders, which tasks run the
program per mode and with --on, what each process gets, python substitution, files to sync and
where the program runs on each host."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from cluster.errors import PlanError, UsageError
from cluster.inventory import load_inventory
from cluster.plan import PlanOptions, plan_cluster
from cluster.program.runspec import (Workspace, check_placeholders, expand, host_argv, local_files, parse_roles,
                             placeholder_values, program_env, program_name, required_paths, same_command_lines,
                             script_of, select_tasks)

from .conftest import INVENTORIES

OPTIONS = PlanOptions(local_python="/venv/bin/python", local_workdir="/checkout")


def lab_plan(mode: str = "async", roles: tuple[str, ...] | None = None):
    return plan_cluster(load_inventory(str(INVENTORIES / "lab.yaml")), replace(OPTIONS, mode=mode, roles=roles))


# ----------------------------------------------------------------------------- placeholders

def test_placeholders_are_filled_per_task():
    plan = lab_plan("sync-ps", roles=("ps", "worker"))
    argv = ["python", "train.py", "--ps_hosts={ps_hosts}", "--worker_hosts={worker_hosts}",
            "--job_name={job_name}", "--task_index={task_index}", "{num_workers}", "{port}@{host}", "{{literal}}"]
    check_placeholders(argv)
    task = plan.task("worker:2")
    got = expand(argv, placeholder_values(plan, task))
    spec = plan.cluster_spec
    assert got == ["python", "train.py", f"--ps_hosts={','.join(spec['ps'])}",
                   f"--worker_hosts={','.join(spec['worker'])}", "--job_name=worker", "--task_index=2",
                   str(len(spec["worker"])), f"{task.port}@{task.address}", "{literal}"]
    # hand-checked against inventories/lab.yaml: node-a keeps 2222 for its chief slot even when unused
    assert got[2] == "--ps_hosts=198.51.100.10:2223,198.51.100.11:2222"


def test_chief_hosts_is_empty_without_a_chief():
    plan = lab_plan("sync-ps", roles=("ps", "worker"))
    assert expand(["[{chief_hosts}]"], placeholder_values(plan, plan.task("ps:0"))) == ["[]"]


@pytest.mark.parametrize("arg, shown", [
    ("--x={foo}", "{foo}"), ("{0}", "{0}"), ("{task_index!r}", "{task_index!r}"), ("{ps_hosts.x}", "{ps_hosts.x}"),
])
def test_unknown_placeholders_are_usage_errors(arg, shown):
    with pytest.raises(UsageError) as caught:
        check_placeholders(["python", "t.py", arg])
    assert shown in caught.value.message and caught.value.exit_code == 2
    assert "{task_index}" in caught.value.hint and "{{" in caught.value.hint


@pytest.mark.parametrize("arg", ["{", "}", "a{b", "x}y"])
def test_unbalanced_braces_are_usage_errors(arg):
    with pytest.raises(UsageError) as caught:
        check_placeholders([arg])
    assert "literal braces" in caught.value.hint


# ----------------------------------------------------------------------------- which tasks run it

@pytest.mark.parametrize("mode, expected", [
    ("async", ["chief:0"]),
    ("sync", ["worker:0", "worker:1", "worker:2"]),
    ("sync-ps", ["worker:0", "worker:1", "worker:2"]),
])
def test_on_an_up_cluster_tasks_without_a_standing_server_run_it(mode, expected):
    assert [t.name for t in select_tasks(lab_plan(mode), None)] == expected


def test_on_overrides_and_rejects_standing_servers_and_missing_roles():
    assert [t.name for t in select_tasks(lab_plan("sync-ps"), ("worker",))] == ["worker:0", "worker:1", "worker:2"]
    with pytest.raises(UsageError) as caught:
        select_tasks(lab_plan("async"), ("ps", "worker"))
    assert "ps:0, ps:1 run(s) standing servers" in caught.value.message
    with pytest.raises(UsageError) as caught:
        select_tasks(lab_plan("sync"), ("ps",))
    assert "has no ps task" in caught.value.message


def test_one_shot_plans_every_role_it_is_given_and_nothing_stands():
    plan = lab_plan("async", roles=("chief", "ps", "worker"))
    assert [t.name for t in plan.tasks] == ["chief:0", "ps:0", "ps:1", "worker:0", "worker:1", "worker:2"]
    assert not plan.standing_tasks and all(task.argv == () for task in plan.tasks)
    assert sorted(plan.cluster_spec) == ["chief", "ps", "worker"]
    only = lab_plan("async", roles=("ps", "worker"))
    assert sorted(only.cluster_spec) == ["ps", "worker"]              # with --on, the roles that take part
    tf_config = only.tf_config(only.task("worker:1"))
    assert tf_config == {"cluster": only.cluster_spec, "task": {"type": "worker", "index": 1}}
    assert ("chief", "not among the roles that run the program (ps, worker)") in only.unused


def test_one_shot_with_a_role_the_inventory_lacks_is_an_error():
    with pytest.raises(PlanError) as caught:
        lab_plan("async", roles=("evaluator",))
    assert "defines no evaluator task" in caught.value.message and "chief, ps, worker" in caught.value.hint


def test_the_evaluator_is_not_part_of_the_cluster_spec(tmp_path):
    inventory = tmp_path / "eval.yaml"
    inventory.write_text("all:\n  children:\n    worker: {hosts: {a: {ansible_connection: local}}}\n"
                         "    evaluator: {hosts: {a: }}\n")
    plan = plan_cluster(load_inventory(str(inventory)), replace(OPTIONS, roles=("worker", "evaluator")))
    assert plan.cluster_spec == {"worker": [plan.task("worker:0").target]}
    assert plan.tf_config(plan.task("evaluator:0"))["task"] == {"type": "evaluator", "index": 0}
    assert plan.task("evaluator:0").port != plan.task("worker:0").port


@pytest.mark.parametrize("text, roles", [("worker", ("worker",)), ("worker,ps", ("ps", "worker")),
                                         (" ps , worker,ps", ("ps", "worker"))])
def test_parse_roles(text, roles):
    assert parse_roles(text) == roles


@pytest.mark.parametrize("text", ["", ",", "workers", "ps,boss"])
def test_parse_roles_rejects_unknown_roles(text):
    with pytest.raises(UsageError):
        parse_roles(text)


# ----------------------------------------------------------------------------- what each process gets

def test_program_env_names_the_task_and_the_cluster():
    plan = lab_plan("sync-ps", roles=("ps", "worker"))
    task = plan.task("worker:1")
    env = program_env(plan, task)
    assert env == {"PSCLUSTER_TASK_TYPE": "worker", "PSCLUSTER_TASK_INDEX": "1", "PSCLUSTER_NUM_WORKERS": "3",
                   "PSCLUSTER_NUM_PS": "2", "PSCLUSTER_PS_HOSTS": ",".join(plan.cluster_spec["ps"]),
                   "PSCLUSTER_WORKER_HOSTS": ",".join(plan.cluster_spec["worker"]), "PSCLUSTER_CHIEF_HOSTS": "",
                   "PSCLUSTER_HOST": task.address, "PSCLUSTER_PORT": str(task.port)}


@pytest.mark.parametrize("argv, expected", [
    (["python", "t.py"], ["/opt/venv/bin/python", "t.py"]),
    (["python3", "-u", "t.py"], ["/opt/venv/bin/python", "-u", "t.py"]),
    (["python3.11", "t.py"], ["python3.11", "t.py"]),            # an explicit interpreter stays
    (["./run.sh", "python"], ["./run.sh", "python"]),
])
def test_python_means_the_hosts_interpreter(argv, expected):
    host = replace(lab_plan().hosts[0], python="/opt/venv/bin/python")
    assert host_argv(argv, host) == expected


@pytest.mark.parametrize("argv, script, required", [
    (["python", "t.py", "a"], "t.py", ["t.py"]),
    (["python", "-u", "-W", "ignore", "dir/t.py"], "dir/t.py", ["dir/t.py"]),
    (["python", "-m", "pkg.mod"], None, []),
    (["python", "-c", "print(1)"], None, []),
    (["./bin/train", "x"], None, ["./bin/train"]),
    (["train"], None, []),
    (["python", "{task_type}.py"], "{task_type}.py", []),       # differs per task: checked at start
])
def test_script_and_required_paths(argv, script, required):
    assert script_of(argv) == script
    assert required_paths(argv) == required


def test_program_name():
    assert program_name(["python", "examples/byo/tf1_flags.py", "--x"]) == "python tf1_flags.py"
    assert program_name(["/usr/bin/env", "x"]) == "env"


# ----------------------------------------------------------------------------- files and directories

def make_tree(tmp_path: Path) -> Path:
    (tmp_path / "proj" / "lib").mkdir(parents=True)
    (tmp_path / "proj" / "train.py").write_text("print(1)\n")
    (tmp_path / "proj" / "conf.json").write_text("{}\n")
    (tmp_path / "proj" / "lib" / "util.py").write_text("x = 1\n")
    (tmp_path / "outside.py").write_text("\n")
    return tmp_path / "proj"


def test_files_named_by_the_command_and_sync_paths_travel(tmp_path):
    cwd = make_tree(tmp_path)
    space = Workspace(cwd=cwd, root=tmp_path / "checkout")
    argv = ["python", "train.py", "--config", "conf.json", "../outside.py", "--flag=conf.json", "missing.py",
            str(cwd / "train.py")]
    files = local_files(argv, ["lib"], space)
    assert sorted(f.rel for f in files) == ["conf.json", "lib/util.py", "train.py"]
    assert all(Path(f.path).is_file() for f in files)


@pytest.mark.parametrize("sync, message", [("../outside.py", "not under the current directory"),
                                           ("nope", "no such file or folder")])
def test_bad_sync_paths_are_usage_errors(tmp_path, sync, message):
    cwd = make_tree(tmp_path)
    with pytest.raises(UsageError) as caught:
        local_files(["python", "train.py"], [sync], Workspace(cwd=cwd, root=tmp_path))
    assert message in caught.value.message


def test_where_the_program_runs(tmp_path):
    root = tmp_path / "checkout"
    (root / "examples" / "byo").mkdir(parents=True)
    plan = lab_plan()
    remote = replace(plan.hosts[0], workdir="~/pscluster", connection="ssh")
    shared = replace(plan.hosts[0], workdir=str(root), connection="ssh")
    inside = Workspace(cwd=root / "examples", root=root)
    assert inside.host_cwd(remote) == "~/pscluster/examples"          # the same place below the workdir
    assert inside.host_cwd(shared) == str(root / "examples")           # shares this checkout: this very folder
    (root / "examples" / "byo" / "t.py").write_text("\n")
    assert [f.rel for f in local_files(["python", "byo/t.py"], [], inside)] == ["examples/byo/t.py"]
    outside = Workspace(cwd=tmp_path, root=root)
    assert outside.host_cwd(remote) == "~/pscluster"
    assert outside.host_cwd(shared) == str(tmp_path)


@pytest.mark.parametrize("mode, roles", [(None, ("chief", "ps", "worker")), ("async", ("chief", "ps", "worker")),
                                         ("sync", ("worker",)), ("sync-ps", ("ps", "worker"))])
def test_one_shot_roles_follow_an_explicit_mode(mode, roles):
    from cluster.program.runspec import one_shot_roles
    assert one_shot_roles(load_inventory(str(INVENTORIES / "lab.yaml")), mode) == roles


def test_every_pscluster_variable_pscluster_sets_is_refused_in_pscluster_env():
    """N12 (issue 25): pscluster_env could override PSCLUSTER_TASK and PSCLUSTER_CLUSTER."""
    from cluster.inventory import PLANNED_PSCLUSTER_ENV
    plan = lab_plan("async", roles=("chief", "ps", "worker"))
    for task in plan.tasks:
        names = [*program_env(plan, task), *plan.task_env(task)]
        assert {name for name in names if name.startswith("PSCLUSTER_")} <= set(PLANNED_PSCLUSTER_ENV)


def test_a_hard_coded_task_index_is_warned_once_per_duplicate():
    """Issue 24 item 7: two workers with `--task_index=0` (TensorFlow: "Could not start gRPC server")."""
    plan = lab_plan("sync-ps", roles=("ps", "worker"))
    tasks = plan.tasks
    warned = same_command_lines(plan, tasks, ["python", "train.py", "--job_name={job_name}", "--task_index=0"])
    assert [t.name for t in tasks] == ["ps:0", "ps:1", "worker:0", "worker:1", "worker:2"]
    assert warned == ["ps:0 and ps:1 get the same command line; did you mean {task_index}?",
                      "worker:0 and worker:1 get the same command line; did you mean {task_index}?",
                      "worker:0 and worker:2 get the same command line; did you mean {task_index}?"]
    assert same_command_lines(plan, tasks, ["python", "train.py", "--job_name={job_name}",
                                            "--task_index={task_index}"]) == []
    # A TF_CONFIG program: the same command line everywhere is how it is written.
    assert same_command_lines(plan, tasks, ["python", "train.py"]) == []
