"""The contract between the orchestrator and ``python -m roles.train``: the argv that
``pscluster train`` builds for each training process parses back, with the trainer's own
parser, to the settings the user chose; both sides take defaults from one definition."""
from __future__ import annotations

import dataclasses

import pytest

from cluster import cli
from cluster.inventory import load_inventory
from cluster.plan import PlanOptions, plan_cluster
from cluster.supervision.train_spec import JobOptions, train_argv
from roles.settings import TRAINER_DEFAULTS, TrainerSettings
from roles.train import parse_options
from tests.helpers import REPO

CHOSEN = JobOptions(steps=321, batch_size=96, learning_rate=0.0125, scale_lr=True, checkpoint_every=40,
                      snapshot_every=12.5,
                      data="/data/mnist.npz", eval_every=80, steps_per_execution=4, warmup_steps=64,
                      start_timeout=77.5,
                      collective_timeout=12.25, summary_every=25, max_restarts=9, extra_args=())


def trainer_argvs(mode: str, options: JobOptions, resume: bool):
    plan = plan_cluster(load_inventory(str(REPO / "inventories" / "local.yaml")),
                        PlanOptions(local_python="/venv/bin/python", local_workdir="/checkout", mode=mode))
    leader = plan.leader.name
    for task in plan.tasks:
        if task.argv[1:3] == ("-m", "roles.train"):
            # as the supervisor launches them: the leader writes summaries; a relaunch knows the restarts
            yield task, train_argv(task, mode=mode, job_path="examples/distributed_mnist", events_path="/run/events.jsonl",
                                   checkpoint_dir="/ckpt", options=options, resume=resume,
                                   summaries="/tb/j" if task.name == leader else None, restarts=2 if resume else 0)


@pytest.mark.parametrize("mode", ["async", "sync", "sync-ps"])
@pytest.mark.parametrize("options, resume", [(CHOSEN, True), (JobOptions(), False)])
def test_the_argv_parses_back_to_the_chosen_settings(mode, options, resume):
    seen = 0
    for task, argv in trainer_argvs(mode, options, resume):
        assert argv[:3] == ["/venv/bin/python", "-m", "roles.train"]
        parsed = parse_options(argv[3:])
        assert (parsed.mode, parsed.job, parsed.events) == (mode, "examples/distributed_mnist", "/run/events.jsonl")
        expected = {f.name: getattr(options, f.name) for f in dataclasses.fields(TrainerSettings)}
        expected.update(checkpoint_dir="/ckpt", resume=resume or options.resume)
        if mode != "sync":       # only sync workers are told the collective timeout; others keep the default
            expected["collective_timeout"] = TRAINER_DEFAULTS.collective_timeout
        assert {name: getattr(parsed, name) for name in expected} == expected, task.name
        leads = task.name == ("chief:0" if mode == "async" else "worker:0")
        assert (parsed.summary_dir, parsed.restarts) == ("/tb/j" if leads else None, 2 if resume else 0)
        seen += 1
    assert seen == {"async": 1, "sync": 2, "sync-ps": 2}[mode]


def test_one_set_of_defaults():
    assert {f.name: getattr(JobOptions(), f.name) for f in dataclasses.fields(TrainerSettings)} == \
        dataclasses.asdict(TRAINER_DEFAULTS)
    defaults = {param.name: param.default for param in cli.cli.commands["train"].params}
    assert defaults["start_timeout"] == TRAINER_DEFAULTS.start_timeout
    assert defaults["collective_timeout"] == TRAINER_DEFAULTS.collective_timeout
    assert defaults["summary_every"] == TRAINER_DEFAULTS.summary_every
    parsed = parse_options(["--mode", "async", "--job", "j", "--events", "e"])
    assert (parsed.start_timeout, parsed.collective_timeout, parsed.summary_every, parsed.seed) == \
        (TRAINER_DEFAULTS.start_timeout, TRAINER_DEFAULTS.collective_timeout, TRAINER_DEFAULTS.summary_every,
         TRAINER_DEFAULTS.seed)
    assert (parsed.summary_dir, parsed.restarts) == (None, 0)


def test_home_relative_paths_are_expanded_on_the_host(monkeypatch):
    """The default workdir is ~/pscluster and argv lists reach no shell: the trainer expands ~."""
    monkeypatch.setenv("HOME", "/home/alice")
    parsed = parse_options(["--mode", "async", "--job", "~/pscluster/examples/distributed_mnist",
                            "--events", "~/pscluster/.pscluster/c/job-1/chief-0.1.events.jsonl",
                            "--checkpoint-dir", "~/pscluster/.pscluster/c/checkpoints/j", "--data", "~/d.npz"])
    assert (parsed.job, parsed.events, parsed.checkpoint_dir, parsed.data) == (
        "/home/alice/pscluster/examples/distributed_mnist", "/home/alice/pscluster/.pscluster/c/job-1/chief-0.1.events.jsonl",
        "/home/alice/pscluster/.pscluster/c/checkpoints/j", "/home/alice/d.npz")
