"""The pure parts of the benchmark scripts: what they compute from measurements and how the
runner (``python -m benchmarks``) reads them. The measurements themselves are not tests."""
from __future__ import annotations

import argparse
import json

import pytest

from benchmarks import onednn, run, standby, training
from benchmarks.tf_baselines import rate_after_first
from cluster.inventory import load_inventory
from cluster.plan import PlanOptions, plan_cluster


def test_generated_inventory_is_a_valid_local_cluster_of_the_asked_shape(tmp_path):
    path = tmp_path / "acc.yaml"
    path.write_text(training.inventory_text(training.ACCURACY_SHAPES[0], 39000, {"OMP_NUM_THREADS": "1"}))
    inventory = load_inventory(str(path))
    assert inventory.mode == "async"
    (host,) = inventory.hosts
    assert host.connection == "local" and host.port_base == 39020 and dict(host.env) == {"OMP_NUM_THREADS": "1"}
    assert [(s.role, s.count) for s in host.slots] == [("chief", 1), ("ps", 2), ("worker", 2)]
    plan = plan_cluster(inventory, PlanOptions(local_python="python3", local_workdir=str(tmp_path)))
    ports = [task.port for task in plan.tasks]
    assert len(set(ports)) == 5 and all(39020 <= port < 39050 for port in ports)


def test_steps_per_second_from_a_train_report():
    assert training.report_steps_per_second({"examples_per_second": 2560.0, "global_batch_size": 128}, 64) == 20.0
    assert training.report_steps_per_second({"examples_per_second": 2560.0}, 128) == 20.0
    assert training.report_steps_per_second({"examples_per_second": None}, 128) is None


def test_rate_after_first_excludes_the_first_mark():
    assert rate_after_first([(8, 10.0), (16, 11.0), (40, 12.0)]) == 16.0
    assert rate_after_first([(8, 10.0)]) is None
    assert rate_after_first([(8, 10.0), (16, 10.0)]) is None


def test_best_sweep_takes_medians_per_k_and_skips_missing():
    runs = [{"sweep": [{"steps_per_execution": 1, "steps_per_second": 10.0},
                       {"steps_per_execution": 32, "steps_per_second": 30.0}]},
            {"sweep": [{"steps_per_execution": 1, "steps_per_second": 12.0},
                       {"steps_per_execution": 32, "steps_per_second": None}]}]
    best, medians = training.best_sweep(runs)
    assert medians == {1: 11.0, 32: 30.0} and best == 32
    assert training.best_sweep([]) == (None, {})


@pytest.mark.parametrize("values, of, prefer, expected", [
    ([1, 8, 32, 128], 128, 32, 32), ([1, 8, 32, 128], 64, 128, 32), ([1, 8, 32], 100, None, 1)])
def test_single_process_k_divides_the_evaluation_interval(values, of, prefer, expected):
    assert training.largest_divisor(values, of, prefer) == expected


def test_first_evaluation_reaching_the_target():
    evals = [{"step": 128, "val_accuracy": 0.97}, {"step": 256, "val_accuracy": None},
             {"step": 384, "val_accuracy": 0.986}, {"step": 512, "val_accuracy": 0.99}]
    assert training.first_reaching(evals, 0.985)["step"] == 384
    assert training.first_reaching(evals, 0.995) is None


def _results() -> dict:
    return {"async": {"pscluster_median": 30.0, "tutorial_median": 6.0, "ratio_1": 5.0,
                      "single_median": 40.0, "single_sweep_medians": {1: 20.0, 32: 40.0}, "single_best_k": 32,
                      "ratio_2": 0.75},
            "sync": {"pscluster_median": 10.0, "tfkeras_median": 10.0, "ratio_3": 1.0,
                     "tfkeras_sweep_medians": {1: 8.0, 8: 10.0}, "tfkeras_best_k": 8},
            "accuracy": {"target": 0.985, "single": {"steps_per_execution": 32, "time_to_target_seconds": 50.0,
                                                     "step_at_target": 640},
                         "async": {"cluster": "pscluster async (2 ps, 2 workers)", "up_seconds": 5.0,
                                   "time_to_target_seconds": 100.0, "step_at_target": 768,
                                   "final_val_accuracy": 0.99},
                         "sync": {"cluster": "pscluster sync (2 workers)", "up_seconds": 2.0,
                                  "time_to_target_seconds": None, "step_at_target": None,
                                  "final_val_accuracy": 0.98}}}


def test_table_carries_ratios_goals_and_verdicts():
    rows = training.table_rows(_results(), argparse.Namespace())
    verdicts = {row["part"]: row["met"] for row in rows if row["figure"] and row["goal"].startswith(">=")}
    assert verdicts == {1: True, 2: True, 3: False}          # 5 >= 3, 0.75 >= 0.5, 1.0 < 1.2
    accuracy = [row for row in rows if row["part"] == 4 and row["figure"]]
    assert [row["ratio"] for row in accuracy] == [2.0, None]
    assert accuracy[1]["measured"] == "not reached, final 98.00%"


def test_the_runner_reads_every_summary_row_of_the_training_benchmark():
    summary = training.summary(training.table_rows(_results(), argparse.Namespace()))
    rows = run._rows("training", json.loads(json.dumps({"summary": summary})))
    assert len(rows) == 5
    assert rows[0][2] == "5.00 (30.0 steps/s)" and rows[0][3] == ">= 3"
    assert rows[4][2] == "n/a"


def test_the_runner_reports_a_failed_benchmark_instead_of_crashing():
    assert run._rows("soak", {"error": "boom", "seconds": 1.0}) == [("soak", "failed", "boom", "")]
    assert run._rows("soak", {"cycles": 20, "leaks_total": 0}) == [("soak", "20 cycles up/train/down", "0 leaks", "0")]


def test_onednn_ratio_of_medians_and_its_summary_row():
    runs = {"1": [{"steps_per_second": 40.0, "val_accuracy": 0.97}, {"steps_per_second": 44.0, "val_accuracy": 0.98}],
            "0": [{"steps_per_second": 20.0, "val_accuracy": 0.96}, {"steps_per_second": None, "val_accuracy": 0.98}]}
    result = onednn.onednn_ratio(runs)
    assert result["1"]["steps_per_second"] == 42.0 and result["0"]["steps_per_second"] == 20.0
    assert result["ratio"] == pytest.approx(2.1)
    assert result["0"]["val_accuracy"] == pytest.approx(0.97)
    rows = run._rows("onednn", {"modes": {"sync": result}, "config": {"model": "cnn"}})
    assert rows == [("oneDNN on vs off (sync, cnn)", "steps/s on / off", "2.10 (42.0 / 20.0)", "")]
    missing = onednn.onednn_ratio({"1": [{"steps_per_second": 40.0}], "0": []})
    assert missing["ratio"] is None
    assert run._rows("onednn", {"modes": {"async": missing}, "config": {"model": "cnn"}})[0][2] == "n/a"


def test_standby_comparison_of_medians():
    runs = {True: [{"seconds": 20.0, "steps_per_second": 72.0, "wait": 0.3}, {"seconds": 19.0, "steps_per_second": 74.0}],
            False: [{"seconds": 23.0, "steps_per_second": 73.0}, {"seconds": 22.0, "steps_per_second": 71.0}]}
    result = standby.compare(runs)
    assert result["standby"]["seconds"] == 19.5 and result["afresh"]["seconds"] == 22.5
    assert result["ratio"] == pytest.approx(19.5 / 22.5) and result["saved_seconds"] == 3.0
    assert result["standby"]["waits"] == [0.3, None]
    assert standby.compare({True: [], False: [{"seconds": 1.0, "steps_per_second": 1.0}]})["ratio"] is None
    rows = run._rows("standby", {"modes": {"async": result}, "config": {"steps": 1200}})
    assert rows == [("train with standbys vs without (async, 1200 steps)", "launch to exit, standby / afresh (medians)",
                     "0.867 (19.5 s / 22.5 s, 3.0 s sooner)", "")]


def test_the_inventory_without_standbys_says_so(tmp_path):
    path = tmp_path / "nostandby.yaml"
    path.write_text(training.inventory_text(training.ACCURACY_SHAPES[0], 39000, {}, standby=False))
    assert load_inventory(str(path)).hosts[0].standby is False
    path.write_text(training.inventory_text(training.ACCURACY_SHAPES[0], 39000, {}))
    assert load_inventory(str(path)).hosts[0].standby is True


def test_overhead_rows_name_the_budget():
    row = {"steps": 0, "ratio": 1.01, "pscluster_median": 60.6, "hand_median": 60.0,
           "added_seconds": 0.9, "ratio_without_noise": 1.015}
    rows = run._rows("overhead", {"sync": row, "async": dict(row, steps=200)})
    assert rows[0][0] == "train overhead (sync, whole default job)"
    assert rows[0][2] == "1.010 (60.6 s / 60.0 s)"
    assert rows[2][0] == "train overhead (async, 200 steps)"
    assert rows[1][2] == "0.90 s -> 1.015"


# ----------------------------------------------------------------------------- run overhead (issue 11)

def test_byhand_plans_the_classic_command_lines_with_runs_environment():
    from benchmarks.byhand import LOCAL, plan_tasks
    tasks = plan_tasks(LOCAL, 5000, 300, python="/py")
    assert [(t.job_name, t.task_index) for t in tasks] == [("ps", 0), ("ps", 1), ("worker", 0), ("worker", 1)]
    # local.yaml's chief takes the port base even when only ps and workers run: the same ports as run's.
    assert tasks[3].argv == ("/py", "examples/byo/tf1_flags.py", "--ps_hosts=localhost:5001,localhost:5002",
                             "--worker_hosts=localhost:5003,localhost:5004", "--job_name=worker", "--task_index=1",
                             "--steps", "300")
    env = {t.job_name: dict(t.env) for t in tasks}
    assert env["ps"]["CUDA_VISIBLE_DEVICES"] == "" and "CUDA_VISIBLE_DEVICES" not in env["worker"]
    assert env["worker"]["OMP_NUM_THREADS"] == "1" and env["worker"]["TF_ENABLE_ONEDNN_OPTS"] == "1"
    assert not [key for key in env["worker"] if key == "TF_CONFIG" or key.startswith("PSCLUSTER_")]


def test_run_overhead_row_in_the_summary():
    result = {"steps": 800, "ratio": 1.031, "run_median_seconds": 41.2, "hand_median_seconds": 40.0,
              "added_seconds": 1.2, "ratio_without_noise": 1.03}
    assert run._rows("run_overhead", result) == [
        ("pscluster run overhead (TF1 example, 800 steps)", "run / by hand (medians)", "1.031 (41.2 s / 40.0 s)",
         "<= 1.05"),
        ("pscluster run overhead, outside the training", "seconds run adds -> ratio", "1.20 s -> 1.030", "<= 1.05")]


def test_run_overhead_seconds_outside_the_training():
    from benchmarks.run_overhead import added_seconds, outside_seconds

    def result(wall, seconds):
        return {"wall_seconds": wall, "final": {"seconds": seconds} if seconds is not None else None}
    runs = [result(40.5, 33.2), result(41.0, 32.3), result(47.7, 34.5)]
    hands = [result(33.3, 28.3), result(37.4, 30.7), result(53.9, 42.0), result(9.0, None)]   # no final line
    assert outside_seconds(hands) == pytest.approx([5.0, 6.7, 11.9])
    assert added_seconds(runs, hands) == pytest.approx(8.7 - 6.7)


def test_final_line_and_ratio():
    from benchmarks.byhand import parse_final
    from benchmarks.run_overhead import ratio
    assert parse_final("x\nfinal test_accuracy=0.9712 test_loss=0.0912 steps=2000 seconds=41.2\n") == \
        {"accuracy": 0.9712, "loss": 0.0912, "steps": 2000, "seconds": 41.2}
    assert parse_final("no result") is None
    assert ratio([10.0, 12.0, 11.0], [10.0, 10.0, 9.0]) == pytest.approx(1.1)


def test_part_4_medians_count_a_missed_target_as_slowest():
    from benchmarks.training import summarize_runs
    runs = [{"time_to_target_seconds": 25.2, "step_at_target": 768, "final_val_accuracy": 0.99, "steps_per_second": 40},
            {"time_to_target_seconds": 17.9, "step_at_target": 512, "final_val_accuracy": 0.98, "steps_per_second": 44},
            {"time_to_target_seconds": None, "step_at_target": None, "final_val_accuracy": 0.984,
             "steps_per_second": 42}]
    out = summarize_runs(runs)
    assert out["time_to_target_seconds"] == 25.2            # 17.9 < 25.2 < missed
    assert out["times_to_target"] == [25.2, 17.9, None] and out["step_at_target"] == 768   # the median run's
    assert summarize_runs(runs[2:])["time_to_target_seconds"] is None
    assert summarize_runs([runs[1], runs[2], runs[2]])["time_to_target_seconds"] is None   # 2 of 3 missed


def test_part_4_goals_are_at_most_ratios():
    import argparse

    from benchmarks.training import table_rows
    t = {"target": 0.985, "single": {"steps_per_execution": 128, "time_to_target_seconds": 10.0,
                                      "step_at_target": 512},
         "async": {"cluster": "pscluster async", "up_seconds": 7, "time_to_target_seconds": 15.0,
                   "step_at_target": 640},
         "sync-ps": {"cluster": "pscluster sync-ps", "up_seconds": 4, "time_to_target_seconds": 19.0,
                     "step_at_target": 512, "times_to_target": [19.0, 21.0], "steps_at_target": [512, 640]}}
    rows = {r["configuration"]: r for r in table_rows({"accuracy": t}, argparse.Namespace())}
    assert rows["pscluster async (+7 s up)"]["met"] is False and rows["pscluster async (+7 s up)"]["goal"] == "<= 1.4"
    sync_ps = rows["pscluster sync-ps (+4 s up)"]
    assert sync_ps["met"] is True and sync_ps["ratio"] == 1.9
    assert sync_ps["measured"] == "19.0 s (step 512) [19.0 s @512, 21.0 s @640]"


def _drain_row(role: str, **extra) -> dict:
    return {"role": role, "budget": 1000, "deadline_s": 30.0, "drain_ts": 100.0, "drain_end_ts": 101.0,
            "drain_rc": 0, "drain_s": 4.0, "left": 0, **extra}


def test_drain_trial_summary_counts_steps_past_the_budget_and_the_pause_around_the_drain():
    from benchmarks import drain
    progress = [(90.0, 100), (91.5, 200), (100.5, 300), (103.5, 400), (104.0, 500), (106.0, 1000)]
    said = "w1 drained in 1.2 s: resized (drain w1) in place"
    row = drain.summarize(_drain_row("async-worker"), {"global_step": 1032, "val_accuracy": 0.97}, progress, said)
    # The pause: the drain's start (100) to 100.5, then 100.5 to 103.5 (the longest); 104 -> 106
    # reaches the budget, which pauses() leaves out (the final report comes after the last save).
    assert (row["outcome"], row["steps_lost"], row["pause"], row["drain_own_s"]) == ("drained", 32, 3.0, 1.2)
    assert row["before_deadline"] and row["gap_before"] == 1.5
    late = drain.summarize(_drain_row("sync-worker", drain_s=31.0), {"global_step": 1032, "val_accuracy": 0.5,
                                                                     "steps_redone": 7}, progress, said)
    assert not late["before_deadline"] and late["steps_lost"] == 7 and late["outcome"] == "finished at 0.5"
    ps = drain.summarize(_drain_row("ps", drain_rc=1), {}, progress,
                         "p1 still runs ps:0 (...): the job was checkpointed at\nstep 400 and stopped")
    assert (ps["outcome"], ps["checkpoint_step"], ps["checkpoint_in_deadline"], ps["steps_lost"]) == \
        ("checkpoint instead", 400, True, 600)
    rows = [row, late, ps]
    lines = drain.table(rows)
    assert [line[0] for line in lines] == ["async-worker", "sync-worker", "ps"]
    assert lines[2][4] == "1/1 checkpointed" and lines[0][5] == "32"
    goals = drain.goals(rows)
    assert "MET    async worker host: 1/1 before the deadline" in goals
    assert "MISSED async worker host: 0 steps lost (lost: [32])" in goals
    assert "MISSED ps host: 0/1 before the deadline" in goals and ps["pause"] is None
    assert "MISSED ps host: chief pause <= 5 s (the job stopped)" in goals
    assert goals[-1] == "MET    nothing left after down: 0 process(es)"
    # A sync resize whose save came at the budget's end: trained through, no pause measured.
    end = drain.summarize(_drain_row("sync-worker"), {"global_step": 1000, "restored_step": 1000,
                                                      "val_accuracy": 0.97}, progress, said)
    assert end["outcome"] == "resized after the end" and end["pause"] is None and end["steps_lost"] == 0
    assert any(g.startswith("MISSED sync worker host: pause") for g in drain.goals([end]))


def test_drain_pause_between_units_of_work_is_finer_than_the_reporting_gap():
    """The pause is counted between collected units (progress events' work_from/work_to/gap):
    inside a window, across two windows, and across a restart (the new process's first unit)."""
    from benchmarks import drain
    spans = [(96.0, 97.4, 0.3, 100), (97.6, 98.3, 0.4, 200),        # before the drain (at 100)
             (98.5, 100.2, 0.2, 300), (100.3, 101.5, 0.9, 400),     # 0.9 s inside a window after it
             (102.7, 103.0, 0.1, 500),                                # 1.2 s between two windows
             (200.0, 201.0, 0.1, 2000)]                               # past the budget: left out
    assert drain.work_pauses(spans, 100.0, 101.0, 1000) == (1.2, 0.4)
    restart = spans[:3] + [(104.5, 104.5, 0.0, 300), (104.6, 106.0, 0.2, 400)]   # the next process's first unit
    assert drain.work_pauses(restart, 100.0, 101.0, 1000) == (4.3, 0.4)
    assert drain.work_pauses([], 100.0, 101.0, 1000) is None
    row = drain.summarize(_drain_row("async-worker"), {"global_step": 1000, "val_accuracy": 0.97},
                          [(99.0, 300), (102.0, 400), (104.0, 500)], "", spans)
    assert (row["pause"], row["gap_before"], row["report_pause"]) == (1.2, 0.4, 2.0)


def test_drain_paper_inventories_plan_and_drain_in_place_or_by_resize():
    from benchmarks import drain
    results = {r["mode"]: r for r in drain.paper([16], 1)}
    assert results["async"]["action"] == "in place" and results["async"]["tasks"] == 18
    assert results["sync"]["action"] == "resize" and results["sync"]["tasks"] == 16
    assert results["async"]["tasks_moved"] == 1 and results["sync"]["tasks_moved"] >= 1


@pytest.mark.parametrize("restored, met, outcome", [(900, True, "restored"), (1200, True, "restored"),
                                                    (0, False, "restored"), (600, False, "restored"),
                                                    (0, False, "rode through")])
def test_the_fault_benchmark_holds_a_restore_after_a_save_to_that_save(restored, met, outcome):
    """CI's short form kills a ps (and a sync worker) only once the job saved: the restore must
    resume from that save or a newer one (issue 47 folded tests/local's snapshot tests into it)."""
    from benchmarks.faults import goals
    row = {"mode": "async", "fault": "kill-ps", "outcome": outcome, "pause": 12.0, "host_timeout": 60.0,
           "steps_lost": 100, "snapshot_steps": 900, "first_save_step": 900, "saved_at_fault": 900,
           "restored_step": restored, "left": 0}
    [line] = [line for line in goals([row]) if "restore after a save" in line]
    assert line.startswith("MET " if met else "MISS"), line
    assert ("saved 900, restored" in line) is not met


def test_supervisor_cost_builds_its_state_and_compares_the_two_writes(tmp_path, capsys):
    """benchmarks.supervisor_cost: a state of N hosts (a ps and a program each), and both ways
    of writing it give the same document."""
    import json as _json

    from benchmarks import supervisor_cost
    from cluster.state import StateStore
    state = supervisor_cost.synthetic_state(5, tmp_path)
    assert len(state.plan.hosts) == 5 and len(state.processes) == 11     # the chief and 5 ps + 5 workers
    store = StateStore(tmp_path / "state")
    store.save(state)
    new = _json.loads(store.path("many").read_text())
    supervisor_cost.write_old(store, state)
    old = _json.loads(store.path("many").read_text())
    assert {k: v for k, v in old.items() if k != "updated"} == {k: v for k, v in new.items() if k != "updated"}
    assert supervisor_cost.main(["--hosts", "4", "--repeat", "1", "--lines", "5"]) == 0
    assert "write ms old" in capsys.readouterr().out


def test_the_drain_benchmarks_idle_ps_trial_drains_the_only_ps_that_holds_variables(tmp_path):
    """benchmarks.drain --roles ps-idle: ps:0 on p1 (drained), ps:1 idle on main, which stays."""
    import random
    from benchmarks import drain
    path = tmp_path / "idle.yaml"
    path.write_text(drain.inventory_text("ps-idle", 30000))
    plan = plan_cluster(load_inventory(str(path)), PlanOptions(local_python="python3", local_workdir=str(tmp_path)))
    assert plan.idle_ps == 1 and [(t.name, t.host) for t in plan.tasks_of("ps")] == [("ps:0", "p1"), ("ps:1", "main")]
    assert drain.drained_host("ps-idle", random.Random(0)) == "p1"
    assert drain.LAB_GROUPS["ps-idle"][0]["ps"][-1] == "node-1" and drain.LAB_GROUPS["ps-idle"][1] == ["node-2"]


def test_up_cost_splits_a_runs_cpu_and_wall_by_phase(monkeypatch):
    """benchmarks.up_cost: each phase event starts a span that ends at the next one (a phase met
    twice adds up), and "all" spans from the clock's start to now."""
    from benchmarks import up_cost
    ticks = iter([0.0, 1.0, 3.0, 6.0, 10.0])
    walls = iter([0.0, 2.0, 5.0, 9.0, 20.0])
    monkeypatch.setattr(up_cost.time, "process_time", lambda: next(ticks))
    monkeypatch.setattr(up_cost.time, "monotonic", lambda: next(walls))
    clock = up_cost.PhaseClock()
    for name in ("preflight", "sync", "preflight"):
        clock.handle("phase", name=name)
    clock.handle("check", name="ignored")
    spans = clock.phases()
    assert spans["preflight"] == (2.0 + 4.0, 3.0 + 11.0) and spans["sync"] == (3.0, 4.0)
    assert spans["all"] == (10.0, 20.0)
