"""benchmarks/gpu_check.py against testbed's fake nvidia-smi (there is no GPU here): the verdicts
on hand-made probe outputs, then the whole check with real preflights and a real one-shot
``pscluster run`` (a few seconds), where the fake "CUDA runtime" of benchmarks/gpu_probe.py
counts devices as CUDA does. Without a real runtime, checks that need one are skipped when they
hold and failed when they do not; never passed."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from benchmarks import gpu_check
from benchmarks.gpu_check import CheckRow, Outcome, Setup, judge_tasks, overall
from benchmarks.gpu_probe import MARK, visible
from cluster.inventory import load_inventory
from cluster.plan import PlanOptions, plan_cluster
from testbed import fake_nvidia_smi
from tests.helpers import REPO, port_base

EXPECTED = {"worker:0": ("0", 1), "worker:1": ("", 0)}


def seen(task: str, mask: str | None, count: int | None, **more) -> dict:
    return {"task": task, "cuda_visible_devices": mask, "framework": "torch" if count is not None else None,
            "device_count": count, "devices": ["NVIDIA H100 80GB HBM3"] * (count or 0), "tried": {}, "error": None,
            **more}


def statuses(rows: list[CheckRow]) -> dict[str, Outcome]:
    return {row.name: row.status for row in rows}


def test_right_masks_and_counts_pass_on_a_real_runtime_and_are_skipped_on_a_fake():
    observed = {"worker:0": seen("worker:0", "0", 1), "worker:1": seen("worker:1", "", 0)}
    real = statuses(judge_tasks(observed, EXPECTED, real=True))
    assert real == {"worker:0 has CUDA_VISIBLE_DEVICES='0'": Outcome.PASSED, "worker:0 sees 1 device(s)": Outcome.PASSED,
                    "worker:1 has CUDA_VISIBLE_DEVICES=''": Outcome.PASSED, "worker:1 sees 0 device(s)": Outcome.PASSED}
    fake = statuses(judge_tasks(observed, EXPECTED, real=False))
    assert fake["worker:0 sees 1 device(s)"] is Outcome.SKIPPED and fake["worker:1 sees 0 device(s)"] is Outcome.SKIPPED
    assert fake["worker:0 has CUDA_VISIBLE_DEVICES='0'"] is Outcome.PASSED       # the mask needs no CUDA


@pytest.mark.parametrize("real", [True, False])
def test_a_task_that_sees_the_wrong_device_count_fails(real):
    observed = {"worker:0": seen("worker:0", "0", 1), "worker:1": seen("worker:1", "", 2)}   # "" hid nothing
    rows = judge_tasks(observed, EXPECTED, real=real)
    assert [row.name for row in rows if row.status is Outcome.FAILED] == ["worker:1 sees 0 device(s)"]
    assert overall([row.status for row in rows]) is Outcome.FAILED


def test_a_missing_task_a_cuda_error_and_no_framework():
    observed = {"worker:0": seen("worker:0", "0", None, framework="torch", error="RuntimeError: CUDA driver too old"),
                "worker:2": seen("worker:2", "1", 1)}
    rows = statuses(judge_tasks(observed, EXPECTED, real=True))
    assert rows["worker:0 sees 1 device(s)"] is Outcome.FAILED and rows["worker:1 reported"] is Outcome.FAILED
    bare = judge_tasks({"worker:1": seen("worker:1", "", None, tried={"torch": "not installed"})},
                       {"worker:1": ("", 0)}, real=True)
    assert statuses(bare)["worker:1 sees 0 device(s)"] is Outcome.SKIPPED
    assert "torch: not installed" in bare[1].detail


@pytest.mark.parametrize("given, expected", [
    ([Outcome.PASSED, Outcome.PASSED], Outcome.PASSED),
    ([Outcome.PASSED, Outcome.SKIPPED], Outcome.SKIPPED),
    ([Outcome.SKIPPED, Outcome.FAILED, Outcome.PASSED], Outcome.FAILED),
    ([], Outcome.SKIPPED),
])
def test_overall(given, expected):
    assert overall(given) is expected


def test_probe_lines_are_found_behind_any_task_prefix():
    text = "\n".join(["▸ run python benchmarks/gpu_probe.py", f"[worker:1@localhost] {MARK}" + json.dumps({"task": "worker:1"}),
                      f"[worker:0@localhost] {MARK}" + "{not json", "[worker:0@localhost] exited with code 0"])
    assert gpu_check.probe_lines(text) == {"worker:1": {"task": "worker:1"}}


@pytest.mark.parametrize("mask, physical, count", [
    (None, 2, 2), ("", 2, 0), ("0", 2, 1), ("1,0", 2, 2), ("0,5,1", 2, 1), ("2", 2, 0), ("-1", 4, 0), (" 0 , 1", 2, 2),
])
def test_the_fake_runtime_counts_as_cuda_does(mask, physical, count):
    assert visible(mask, physical) == count


def test_the_inventories_plan_what_the_steps_expect(tmp_path):
    path = tmp_path / "masks.yaml"
    path.write_text(gpu_check.inventory_text("[[0], []]", busy_mib=1024))
    plan = plan_cluster(load_inventory(str(path)), PlanOptions(local_python="python", local_workdir=str(tmp_path)))
    assert [(task.name, task.cuda_visible_devices) for task in plan.tasks] == [("worker:0", "0"), ("worker:1", "")]
    path.write_text(gpu_check.inventory_text("auto", busy_mib=1024))
    assert plan_cluster(load_inventory(str(path)), PlanOptions(local_python="python", local_workdir=str(tmp_path))
                        ).auto_gpu_hosts == ("localhost",)


def test_the_fake_answers_the_fields_asked_in_their_order():
    config = {"driver": "580.95.05", "gpus": [{"name": "GB10", "total_mib": None, "used_mib": None}],
              "apps": [{"gpu": 0, "pid": 7, "used_mib": None}]}
    status, text = fake_nvidia_smi.answer(["--query-gpu=name,memory.used,index", "--format=csv,noheader,nounits"], config)
    assert (status, text) == (0, "GB10, [N/A], 0\n")
    status, text = fake_nvidia_smi.answer(["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                                          config)
    assert (status, text) == (0, "7, [N/A]\n")
    assert fake_nvidia_smi.answer(["-L"], {"gpus": []})[0] == 6
    assert fake_nvidia_smi.answer(["--query-gpu=fan.speed", "--format=csv,noheader,nounits"], config)[0] == 2


# ----------------------------------------------------------------------------- the whole check, fake GPUs

def test_the_report_on_two_fake_gpus(tmp_path):
    out = tmp_path / "report.json"
    assert gpu_check.main(["--fake", "--out", str(out), "--port-base", str(port_base())]) == 0
    report = json.loads(out.read_text())
    assert (report["fake"], report["result"], report["machine"]["driver"]) == (True, "skipped", "580.95.05")
    steps = {step["name"]: step for step in report["steps"]}
    assert list(steps) == ["plan", "busy", "masks"]
    checks = {name: {check["name"]: check["status"] for check in step["checks"]} for name, step in steps.items()}
    plan = steps["plan"]
    assert plan["status"] == "passed" and set(checks["plan"].values()) == {"passed"}
    assert plan["data"]["masks"] == ["0", "1"]
    assert [(gpu["index"], gpu["name"], gpu["total_mib"], gpu["used_mib"]) for gpu in plan["data"]["gpus"]] == [
        (0, "Fake GPU", 16384, 3), (1, "Fake GPU", 16384, 3)]
    assert len(plan["data"]["nvidia_smi_L"]) == 2 and plan["data"]["raw_queries"]["gpus"].count("\n") == 2
    busy = steps["busy"]
    holder = busy["data"]["holder"]
    assert checks["busy"] == {
        "preflight calls GPU 0 busy": "skipped",       # held, but by a fake: not a GPU's word
        "auto still plans GPU 0 (busy GPUs are refused at preflight, not skipped)": "passed",
        "--allow-busy-gpus passes preflight": "passed"}
    assert busy["data"]["holder_pid_listed"] and busy["data"]["masks"] == ["0", "1"]
    gpu0 = busy["data"]["gpus"][0]
    assert [app["pid"] for app in gpu0["apps"]] == [holder["pid"]] and gpu0["used_mib"] == 3 + 2048
    assert checks["masks"] == {
        "pscluster run exits 0": "passed",
        "worker:0 has CUDA_VISIBLE_DEVICES='0'": "passed", "worker:0 sees 1 device(s)": "skipped",
        "worker:1 has CUDA_VISIBLE_DEVICES=''": "passed", "worker:1 sees 0 device(s)": "skipped"}
    assert {task: seen["device_count"] for task, seen in steps["masks"]["data"]["tasks"].items()} == {
        "worker:0": 1, "worker:1": 0}


def test_a_runtime_that_ignores_the_mask_fails_the_check(tmp_path):
    with gpu_check.fake_gpus(tmp_path, 2) as config:
        setup = Setup(work=tmp_path, port_base=port_base(), framework="fake", fake_config=config,
                      probe_extra=("--fake-gpus", "2", "--fake-ignore-mask"))
        step = gpu_check.step_masks(setup)
    failed = [check.name for check in step.checks if check.status is Outcome.FAILED]
    assert failed == ["worker:0 sees 1 device(s)", "worker:1 sees 0 device(s)"]
    assert step.status is Outcome.FAILED
    assert [check.detail for check in step.checks if check.name == "worker:1 sees 0 device(s)"] == [
        "fake sees 2: Fake GPU, Fake GPU"]


def test_a_gpu_busy_before_the_check_and_a_host_without_gpus_fail(tmp_path):
    with gpu_check.fake_gpus(tmp_path, 2) as config:
        fake_nvidia_smi.write_config(config, [{"name": "Fake GPU", "total_mib": 16384, "used_mib": 5000},
                                              {"name": "Fake GPU", "total_mib": 16384, "used_mib": 3}])
        setup = Setup(work=tmp_path, port_base=port_base(), framework="fake", fake_config=config)
        step = gpu_check.step_plan(setup)
        assert {check.name: check.status for check in step.checks}["preflight finds the GPUs free"] is Outcome.FAILED
        fake_nvidia_smi.write_config(config, [])
        report = gpu_check.run_check(replace(setup, port_base=port_base()))
    assert report["result"] == "failed"
    assert [(step["name"], step["status"]) for step in report["steps"]] == [
        ("plan", "failed"), ("busy", "skipped"), ("masks", "skipped")]
    assert "auto needs nvidia-smi: No devices were found" in report["steps"][0]["checks"][0]["detail"]


def test_the_check_and_a_one_shot_run_import_without_grpcio():
    # A GPU box may lack grpcio (a binary wheel); only probing a TensorFlow server needs it.
    code = ("import sys; sys.modules['grpc'] = None; import cluster.cli, cluster.supervision.program_job, benchmarks.gpu_check; "
            "from cluster.hosts.probe import Prober; Prober().close()")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
