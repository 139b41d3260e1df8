"""The on-host layout (cluster/layout.py): every path pscluster uses on a host, and the detached
supervisor's files, spelled out by hand for sample plans. These strings are the ones users'
run folders and running clusters' state files already hold: a change here is a migration."""
from __future__ import annotations

from pathlib import Path

import pytest

import roles.hostctl as hostctl
from cluster import layout as layout_module
from cluster.supervision.daemon import DaemonFiles
from cluster.inventory import load_inventory
from cluster.lifecycle.tasks import new_record
from cluster.layout import (DaemonLayout, HostLayout, attempt_log, exit_file, host_layout, job_code_dir, leader_layout,
                            pid_file)
from cluster.plan import ClusterPlan, PlanOptions, plan_cluster
from cluster.contracts import ProcessKind
from cluster.state import ProcessRecord, RunState
from cluster.tensorboard import board_spec
from cluster.supervision.train_spec import JobRef, job_files, job_path_on

from .conftest import INVENTORIES


def plan(inventory: str, *, workdir: str = "/here/checkout", name: str | None = None, mode: str | None = None) -> ClusterPlan:
    return plan_cluster(load_inventory(str(INVENTORIES / inventory)),
                        PlanOptions(local_python="/here/python", local_workdir=workdir, name=name, mode=mode))


def test_every_path_of_a_local_plan():
    p = plan("local.yaml")                      # async: the chief leads
    run = "/here/checkout/.pscluster/local"
    ps1 = p.task("ps:1")
    layout = host_layout(ps1, p)
    assert layout == HostLayout("/here/checkout", "local")
    assert layout.run_dir == run
    assert (ps1.log_path, ps1.events_path) == (f"{run}/ps-1.log", f"{run}/ps-1.events.jsonl")
    assert layout.server_log("ps", 1) == ps1.log_path
    assert layout.server_log("ps", 1, attempt=3) == f"{run}/ps-1.3.log"
    assert layout.job_dir(7) == f"{run}/job-7"
    assert layout.job_paths(7, "worker", 1, 1) == (f"{run}/job-7/worker-1.1.log", f"{run}/job-7/worker-1.1.events.jsonl")
    assert layout.job_paths(7, "worker", 1, 2) == (f"{run}/job-7/worker-1.2.log", f"{run}/job-7/worker-1.2.events.jsonl")
    leader = leader_layout(p)
    assert leader.checkpoint_dir("mnist") == f"{run}/checkpoints/mnist"
    assert leader.tensorboard_root == f"{run}/tensorboard"
    assert leader.summary_dir("mnist") == f"{run}/tensorboard/mnist"
    assert leader.tensorboard_log(2) == f"{run}/tensorboard.2.log"
    assert job_code_dir("local", "myjob") == ".pscluster/local/jobs/myjob"
    log = f"{run}/ps-1.log"
    assert (pid_file(log), exit_file(log)) == (f"{run}/ps-1.log.pid", f"{run}/ps-1.log.exit")


def test_the_leaders_host_per_mode_and_a_home_relative_workdir():
    # lab.yaml: hosts with their own pscluster_workdir; sync leads with worker:0
    p = plan("lab.yaml", mode="sync")
    leader = p.task("worker:0")
    assert leader_layout(p) == HostLayout(leader.workdir, "lab")
    assert leader_layout(p).checkpoint_dir("j") == f"{leader.workdir.rstrip('/')}/.pscluster/lab/checkpoints/j"
    # `~` stays for the host to expand; a trailing slash is not doubled
    assert HostLayout("~/pscluster/", "c").server_log("worker", 0) == "~/pscluster/.pscluster/c/worker-0.log"


def test_attempt_n_of_a_server_changes_only_the_file_names_suffix():
    # the bug this module fixed: str.replace(".log", ...) also rewrote a ".log" in a folder name
    p = plan("local.yaml", workdir="/srv/app.log/checkout", name="exp.log")
    worker = p.task("worker:0")
    run = "/srv/app.log/checkout/.pscluster/exp.log"
    assert worker.log_path == f"{run}/worker-0.log"
    first, third = new_record(worker, kind="server", attempt=1), new_record(worker, kind="server", attempt=3)
    assert (first.key, first.log, first.exit_file) == ("worker:0#1", f"{run}/worker-0.log", f"{run}/worker-0.log.exit")
    assert (third.key, third.log, third.exit_file) == ("worker:0#3", f"{run}/worker-0.3.log", f"{run}/worker-0.3.log.exit")
    assert host_layout(worker, p).server_log("worker", 0, 3) == third.log
    assert host_layout(worker, p).job_paths(1, "worker", 0, 2)[0] == f"{run}/job-1/worker-0.2.log"
    assert attempt_log("/a.log/b.log", 2) == "/a.log/b.2.log"
    given = ProcessRecord.for_task(worker.name, worker.host, ProcessKind.TRAIN, 2, "/x/given.log", job=1)
    assert (given.key, given.log, given.exit_file) == ("worker:0#j1.2", "/x/given.log", "/x/given.log.exit")


def test_tensorboard_records_follow_the_layout(tmp_path):
    p = plan("local.yaml")
    state = RunState(name="local", plan=p, phase="up", processes=[], created=0.0, updated=0.0)
    spec = board_spec(state)
    assert spec.logdir == "/here/checkout/.pscluster/local/tensorboard"
    assert (spec.record.log, spec.record.exit_file) == ("/here/checkout/.pscluster/local/tensorboard.1.log",
                                                        "/here/checkout/.pscluster/local/tensorboard.1.log.exit")


def test_a_user_jobs_files_go_under_the_run_folder(tmp_path):
    folder = tmp_path / "my job"
    folder.mkdir()
    (folder / "job.py").write_text("# a job\n")
    p = plan("lab.yaml")
    remote = next(h for h in p.hosts if not h.is_local)
    # a job folder keeps its own name below jobs/<job>/; a job file sits there itself
    job = JobRef(str(folder), "my job", folder, False)
    assert [f.rel for f in job_files(job, p)] == [".pscluster/lab/jobs/my job/my job/job.py"]
    assert job_path_on(remote, job, p, tmp_path / "checkout") == ".pscluster/lab/jobs/my job/my job"
    single = JobRef(str(folder / "job.py"), "job", folder / "job.py", False)
    assert [f.rel for f in job_files(single, p)] == [".pscluster/lab/jobs/job/job.py"]
    assert job_path_on(remote, single, p, tmp_path / "checkout") == ".pscluster/lab/jobs/job/job.py"


@pytest.mark.parametrize("cluster", ["../x", "/abs", ".", "..", "a/b", "", "-x", "x" * 64, "a\nb"])
def test_hostile_cluster_names_are_rejected(cluster):
    with pytest.raises(ValueError, match="cluster name"):
        HostLayout("/w", cluster)
    with pytest.raises(ValueError, match="cluster name"):
        DaemonLayout(Path("/s"), cluster)
    with pytest.raises(ValueError, match="cluster name"):
        job_code_dir(cluster, "j")


@pytest.mark.parametrize("job", ["", ".", "..", "../up", "a/b", "a\0b"])
def test_hostile_job_names_are_rejected(job):
    layout = HostLayout("/w", "c")
    for build in (layout.checkpoint_dir, layout.summary_dir, lambda j: job_code_dir("c", j)):
        with pytest.raises(ValueError, match="job name"):
            build(job)


def test_names_with_spaces_or_quotes_are_kept_verbatim():
    # paths travel in argv lists and JSON (never through a shell unquoted): nothing to escape
    layout = HostLayout("/w", "c")
    assert layout.checkpoint_dir("it's a job") == "/w/.pscluster/c/checkpoints/it's a job"


@pytest.mark.parametrize("call", [
    lambda h: h.server_log("worker", -1), lambda h: h.server_log("worker", 0, attempt=0),
    lambda h: h.job_paths(0, "worker", 0, 1), lambda h: h.job_paths(1, "worker", 0, 0),
    lambda h: h.job_paths(1, "../ps", 0, 1), lambda h: h.tensorboard_log(0), lambda h: h.server_log("worker", True),
])
def test_numbers_and_roles_that_cannot_name_a_file_are_rejected(call):
    with pytest.raises(ValueError):
        call(HostLayout("/w", "c"))


def test_an_empty_workdir_is_rejected():
    with pytest.raises(ValueError, match="workdir"):
        HostLayout("", "c")


def test_the_detached_supervisors_files():
    layout = DaemonLayout(Path("/s"), "c")
    assert layout.log == Path("/s/c.supervisor.log")
    assert layout.events(4242) == Path("/s/c.supervisor-4242.events")
    assert sorted(p.name for p in [Path("/s/c.supervisor-1.events"), Path("/s/d.supervisor-1.events")]
                  if p.match(layout.events_glob)) == ["c.supervisor-1.events"]
    assert DaemonFiles.of(Path("/s"), "c", 4242) == DaemonFiles("/s/c.supervisor.log", "/s/c.supervisor-4242.events")


def test_the_suffixes_match_the_host_program():
    # hostctl is shipped alone to each host and cannot import the layout: the two must agree
    assert layout_module.RUN_ROOT == hostctl.RUN_ROOT
    assert (layout_module.PID_SUFFIX, layout_module.EXIT_SUFFIX, layout_module.CANCEL_SUFFIX,
            layout_module.LOCK_SUFFIX, layout_module.REPLY_SUFFIX, layout_module.FIFO_SUFFIX) == (
        hostctl.PID_SUFFIX, hostctl.EXIT_SUFFIX, hostctl.CANCEL_SUFFIX, hostctl.LOCK_SUFFIX,
        hostctl.REPLY_SUFFIX, hostctl.FIFO_SUFFIX)
