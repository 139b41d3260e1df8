"""Job loading, the MNIST data loader, and the plan arithmetic: no TensorFlow needed.

The job loader never calls the job's functions, so the jobs written here are plain
Python; the MNIST loader is exercised on tiny fake npz files.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from roles.events import EVENT_FIELDS, EventWriter, read_events
from roles.jobs import Job, JobError, load_job
from roles.settings import TrainOptions, make_plan
from roles.tfconfig import ConfigError, parse_tf_config

REPO = Path(__file__).resolve().parents[2]

MINIMAL_JOB = """
BATCH_SIZE = 64
LEARNING_RATE = 0.01
EPOCHS = 2
TRAIN_EXAMPLES = 1000

def build_model():
    return "model"

def dataset(shard):
    return shard

def loss(labels, outputs):
    return 0.0

def optimizer(learning_rate):
    return learning_rate
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


# --- job loading --------------------------------------------------------------------

def test_load_job_from_file(tmp_path):
    job = load_job(write(tmp_path / "tiny.py", MINIMAL_JOB))
    assert isinstance(job, Job)
    assert job.name == "tiny"
    assert (job.batch_size, job.learning_rate, job.epochs, job.steps) == (64, 0.01, 2.0, None)
    assert job.train_examples == 1000
    assert job.build_model() == "model"
    assert job.accuracy is None  # optional, not defined


def test_load_job_from_directory_with_relative_import(tmp_path):
    write(tmp_path / "myjob" / "helpers.py", "SIZE = 32\n")
    write(tmp_path / "myjob" / "job.py",
          MINIMAL_JOB.replace("BATCH_SIZE = 64",
                              "from . import helpers\nBATCH_SIZE = helpers.SIZE"))
    job = load_job(tmp_path / "myjob")
    assert job.name == "myjob"
    assert job.batch_size == 32
    assert job.path == str(tmp_path / "myjob" / "job.py")


def test_two_jobs_with_the_same_file_name_do_not_collide(tmp_path):
    a = load_job(write(tmp_path / "a" / "job.py", MINIMAL_JOB))
    b = load_job(write(tmp_path / "b" / "job.py", MINIMAL_JOB.replace("= 64", "= 16")))
    assert (a.batch_size, b.batch_size) == (64, 16)


def test_missing_function_names_file_and_function(tmp_path):
    path = write(tmp_path / "broken.py", MINIMAL_JOB.replace("def loss(", "def not_loss("))
    with pytest.raises(JobError) as info:
        load_job(path)
    message = str(info.value)
    assert str(path) in message
    assert "loss()" in message


@pytest.mark.parametrize("line, name", [
    ("BATCH_SIZE = 64", "BATCH_SIZE"),
    ("LEARNING_RATE = 0.01", "LEARNING_RATE"),
])
def test_missing_required_constant_is_named(tmp_path, line, name):
    path = write(tmp_path / "job.py", MINIMAL_JOB.replace(line, ""))
    with pytest.raises(JobError, match=name) as info:
        load_job(path)
    assert str(path) in str(info.value)


def test_budget_is_required(tmp_path):
    path = write(tmp_path / "job.py", MINIMAL_JOB.replace("EPOCHS = 2", ""))
    with pytest.raises(JobError, match="EPOCHS or STEPS"):
        load_job(path)


@pytest.mark.parametrize("bad", ["BATCH_SIZE = 0", "BATCH_SIZE = 1.5", "BATCH_SIZE = True",
                                 "BATCH_SIZE = '64'"])
def test_ill_typed_constant(tmp_path, bad):
    path = write(tmp_path / "job.py", MINIMAL_JOB.replace("BATCH_SIZE = 64", bad))
    with pytest.raises(JobError, match="BATCH_SIZE must be a positive integer"):
        load_job(path)


def test_non_callable_function(tmp_path):
    path = write(tmp_path / "job.py", MINIMAL_JOB + "\naccuracy = 3\n")
    with pytest.raises(JobError, match="accuracy must be a function"):
        load_job(path)


def test_missing_path_and_directory_without_job_py(tmp_path):
    with pytest.raises(JobError, match="no such job"):
        load_job(tmp_path / "nope.py")
    (tmp_path / "empty").mkdir()
    with pytest.raises(JobError, match="must contain job.py"):
        load_job(tmp_path / "empty")
    with pytest.raises(JobError, match=r"\.py file"):
        load_job(write(tmp_path / "job.txt", MINIMAL_JOB))


def test_job_code_errors_propagate_with_their_type(tmp_path):
    path = write(tmp_path / "raises.py", "raise RuntimeError('boom at import')\n")
    with pytest.raises(RuntimeError, match="boom at import"):
        load_job(path)


def test_reference_job_satisfies_the_api():
    # The example imports keras/tensorflow at module level; only check it statically
    # for the names the loader needs, so this stays a no-TensorFlow test.
    source = (REPO / "examples" / "distributed_mnist" / "job.py").read_text()
    for name in ("def build_model(", "def dataset(", "def loss(", "def optimizer(",
                 "BATCH_SIZE =", "LEARNING_RATE =", "EPOCHS =", "TRAIN_EXAMPLES ="):
        assert name in source


# --- MNIST data loader --------------------------------------------------------------

def _load_data_module():
    path = REPO / "examples" / "distributed_mnist" / "data.py"
    spec = importlib.util.spec_from_file_location("mnist_data_under_test", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture()
def data():
    module = _load_data_module()
    module._CACHE.clear()
    module._PUBLISHED.clear()
    return module


def fake_npz(path: Path, marker: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        np.savez(f, x_train=np.full((2, 28, 28), marker, np.uint8),
                 y_train=np.array([marker, marker], np.uint8),
                 x_test=np.zeros((1, 28, 28), np.uint8), y_test=np.zeros(1, np.uint8))
    return path


def test_data_search_order(data, tmp_path):
    home = tmp_path / "home"
    explicit = fake_npz(tmp_path / "explicit.npz", 1)
    cache = fake_npz(home / ".keras" / "datasets" / "mnist.npz", 2)

    # 1. PSCLUSTER_DATA (what --data sets) beats everything.
    found = data.locate_local({"PSCLUSTER_DATA": str(explicit)}, home)
    assert (found.path, found.origin) == (explicit, "PSCLUSTER_DATA")
    assert data.read_npz(found.path, sha256=None)["y_train"][0] == 1
    # 2. then the Keras cache,
    found = data.locate_local({}, home)
    assert (found.path, found.origin) == (cache, "keras cache")
    assert data.read_npz(found.path, sha256=None)["y_train"][0] == 2
    # 3. then the repository's copy.
    found = data.locate_local({}, tmp_path / "empty-home")
    assert (found.path, found.origin) == (data.REPO_COPY, "repository copy")


def test_repository_copy_is_the_published_file(data):
    assert data.sha256_of(data.REPO_COPY) == data.MNIST_SHA256


def test_explicit_missing_path_is_an_error_not_a_fallback(data, tmp_path):
    missing = tmp_path / "nowhere" / "mnist.npz"
    with pytest.raises(data.MnistDataError, match=str(missing)):
        data.locate_local({"PSCLUSTER_DATA": str(missing)}, tmp_path)


def test_checksum_mismatch_names_the_file(data, tmp_path):
    bad = fake_npz(tmp_path / "home" / ".keras" / "datasets" / "mnist.npz", 7)
    with pytest.raises(data.MnistDataError) as info:
        data.load_mnist({}, tmp_path / "home")
    assert str(bad) in str(info.value)
    assert "SHA-256" in str(info.value)
    actual = hashlib.sha256(bad.read_bytes()).hexdigest()
    assert actual in str(info.value)


def test_download_only_when_no_local_file(data, tmp_path, monkeypatch):
    calls = []

    def fake_download(home=None):
        calls.append(home)
        return data.MnistSource(fake_npz(tmp_path / "downloaded.npz", 3), "download")

    monkeypatch.setattr(data, "download", fake_download)
    # A local copy exists (the repository's): no download.
    data.load_mnist({}, tmp_path / "home-a")
    assert calls == []
    # No local copy at all: download (here faked; its checksum then fails loudly).
    monkeypatch.setattr(data, "REPO_COPY", tmp_path / "no-repo-copy.npz")
    with pytest.raises(data.MnistDataError, match="downloaded.npz"):
        data.load_mnist({}, tmp_path / "home-b")
    assert len(calls) == 1
    with pytest.raises(data.MnistDataError, match="downloading is disabled"):
        data.load_mnist({}, tmp_path / "home-c", allow_download=False)


def test_real_file_loads(data, tmp_path):
    env = {"PSCLUSTER_DATA": str(data.REPO_COPY), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    arrays = data.load_mnist(env, Path("/nonexistent"))
    assert arrays["x_train"].shape == (60000, 28, 28)
    assert arrays["y_test"].shape == (10000,)
    mixed = data.mixed("train", env, Path("/nonexistent"))
    x, y = mixed["x"], mixed["y"]
    assert x.shape == (60000, 28, 28) and sorted(np.bincount(y)) == sorted(
        np.bincount(arrays["y_train"]))
    assert not (x == arrays["x_train"]).all()          # mixed, not the file's order


def test_mixed_splits_are_kept_and_reused(data, tmp_path, monkeypatch):
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    first = data.mixed("test", env, tmp_path / "home")
    folder = data.kept_folder(env, tmp_path / "home")
    assert folder.parent == tmp_path / "cache" / "pscluster"
    assert sorted(p.name for p in folder.iterdir()) == ["test-x.npy", "test-y.npy", "test.sha256"]   # no partials

    # A process that starts later reads the kept copy: no decompression at all.
    def no_decompressing(*args, **kwargs):
        raise AssertionError("mnist.npz was read although a kept copy exists")

    monkeypatch.setattr(data, "load_mnist", no_decompressing)
    again = data.mixed("test", env, tmp_path / "home")
    assert (again["x"] == first["x"]).all() and (again["y"] == first["y"]).all()
    monkeypatch.undo()

    # A damaged copy is decompressed again and replaced.
    (folder / "test-x.npy").write_bytes(b"not an array")
    assert data.read_kept(folder, "test") is None
    repaired = data.mixed("test", env, tmp_path / "home")
    assert (repaired["x"] == first["x"]).all()
    assert data.read_kept(folder, "test") is not None

    # The kept copy belongs to the published file only: another source is not served from it.
    other = fake_npz(tmp_path / "other.npz", 5)
    with pytest.raises(data.MnistDataError, match="SHA-256"):
        data.mixed("test", {**env, "PSCLUSTER_DATA": str(other)}, tmp_path / "home")


def test_the_kept_copy_is_private_checksummed_and_never_written_through_a_link(data, tmp_path):
    """Issue 42, L4: the copy was checked for dtype and shape only, its folders made with the
    umask's bits, and its predictable .partial names followed planted symlinks."""
    import os
    import stat
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    first = data.mixed("test", env, tmp_path / "home")
    folder = data.kept_folder(env, tmp_path / "home")
    assert {stat.S_IMODE(p.stat().st_mode) for p in (folder, folder.parent)} == {0o700}
    # Same dtype and shape, other digits: the checksum tells.
    swapped = first["x"].copy()
    swapped[0] = 255 - swapped[0]
    np.save(folder / "test-x.npy", swapped, allow_pickle=False)
    assert data.read_kept(folder, "test") is None
    # A folder others can write is not read (nor written): they may have put the copy there.
    data.keep(folder, "test", first)
    assert data.read_kept(folder, "test") is not None
    os.chmod(folder, 0o777)
    assert data.read_kept(folder, "test") is None
    os.chmod(folder, 0o700)
    # Nor is another user's, 0700 or not: they may have put the copy there too.
    os.chown(folder, 4321, -1)
    data.keep(folder, "train", first)
    assert data.read_kept(folder, "test") is None and not (folder / "train.sha256").exists()
    os.chown(folder, os.geteuid(), -1)
    # A link planted under a partial's name is not followed (O_EXCL|O_NOFOLLOW).
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    import socket
    (folder / f".train-y.{socket.gethostname()}.{os.getpid()}.partial").symlink_to(victim)    # the old name
    data.keep(folder, "train", {"x": first["x"], "y": first["y"]})
    assert victim.read_text() == "precious\n"


def test_a_home_that_cannot_keep_copies_still_loads(data, tmp_path):
    blocked = tmp_path / "cache"
    blocked.write_text("a file where the cache folder would go")
    mixed = data.mixed("test", {"XDG_CACHE_HOME": str(blocked)}, tmp_path / "home")
    assert mixed["x"].shape == (10000, 28, 28)


# --- plan: batch sizes, budgets, learning rate ---------------------------------------

@pytest.fixture()
def job(tmp_path):
    return load_job(write(tmp_path / "job.py", MINIMAL_JOB))


def options(**kw):
    base = dict(mode="sync", job="j", events="e")
    base.update(kw)
    return TrainOptions(**base)


def test_plan_epochs_to_steps_and_batches(job):
    plan = make_plan(job, options(), workers=2)
    # 2 epochs of 1000 examples at 64 per update: ceil(2000 / 64) = 32 steps.
    assert (plan.global_batch_size, plan.worker_batch_size, plan.steps_total) == (64, 32, 32)
    assert plan.epochs == 2
    assert plan.steps_per_execution == 8


def test_plan_async_worker_batch_is_the_update_batch(job):
    plan = make_plan(job, options(mode="async"), workers=2)
    assert (plan.global_batch_size, plan.worker_batch_size, plan.steps_total) == (64, 64, 32)
    assert plan.steps_per_execution == 32


def test_plan_async_warm_start(job):
    # Default: 256 steps, at most a quarter of the budget; none with one worker or outside async.
    assert make_plan(job, options(mode="async", steps=5000), workers=2).warmup_steps == 256
    assert make_plan(job, options(mode="async", steps=400), workers=2).warmup_steps == 100
    assert make_plan(job, options(mode="async", steps=5000), workers=1).warmup_steps == 0
    assert make_plan(job, options(mode="async", steps=5000, warmup_steps=0), workers=2).warmup_steps == 0
    assert make_plan(job, options(mode="async", steps=400, warmup_steps=300), workers=3).warmup_steps == 300
    assert make_plan(job, options(mode="sync", steps=5000), workers=2).warmup_steps == 0


def test_plan_uneven_batch_rounds_down_to_what_is_averaged(job):
    plan = make_plan(job, options(batch_size=100), workers=3)
    assert (plan.worker_batch_size, plan.global_batch_size) == (33, 99)


def test_plan_command_line_wins_and_scale_lr(job):
    plan = make_plan(job, options(steps=500, learning_rate=0.1, scale_lr=True), workers=4)
    assert plan.steps_total == 500
    assert plan.learning_rate == pytest.approx(0.4)
    assert plan.epochs == pytest.approx(500 * 64 / 1000)
    plan = make_plan(job, options(epochs=1.0), workers=1)
    assert plan.steps_total == 16


def test_plan_sync_ps_runs_one_step_per_call(job):
    assert make_plan(job, options(mode="sync-ps", steps_per_execution=50),
                     workers=2).steps_per_execution == 1


@pytest.mark.parametrize("kw, message", [
    (dict(resume=True), "--resume needs --checkpoint-dir"),
    (dict(checkpoint_every=10), "--checkpoint-every needs --checkpoint-dir"),
    (dict(batch_size=1), "smaller than the 2 workers"),
    (dict(mode="bogus"), "choose one of"),
    (dict(eval_every=0), "--eval-every must be >= 1"),
    (dict(mode="async", warmup_steps=-1), "--warmup-steps must be >= 0"),
    (dict(mode="sync", warmup_steps=10), "--warmup-steps applies to async mode only"),
    (dict(mode="async", snapshot_every=20.0), "--snapshot-every needs --checkpoint-dir"),
    (dict(mode="async", snapshot_every=0.5, checkpoint_dir="c"), "at least 1 second"),
    (dict(mode="async", snapshot_every=-3.0, checkpoint_dir="c"), "at least 1 second"),
    (dict(mode="async", snapshot_every=float("nan"), checkpoint_dir="c"), "at least 1 second"),
    (dict(mode="sync", snapshot_every=20.0), "--snapshot-every needs --checkpoint-dir"),
])
def test_plan_rejects_impossible_requests(job, kw, message):
    with pytest.raises(ConfigError, match=message):
        make_plan(job, options(**kw), workers=2)


def test_plan_snapshots_are_seconds_in_every_mode_and_zero_is_off(job):
    for mode in ("async", "sync", "sync-ps"):
        assert make_plan(job, options(mode=mode, snapshot_every=15.0, checkpoint_dir="c"), workers=2).snapshot_every == 15.0
    assert make_plan(job, options(mode="async", snapshot_every=0.0), workers=2).snapshot_every is None
    assert make_plan(job, options(mode="sync", snapshot_every=0.0), workers=2).snapshot_every is None
    assert make_plan(job, options(mode="async"), workers=2).snapshot_every is None


# --- TF_CONFIG and events -------------------------------------------------------------

def test_parse_tf_config():
    task = parse_tf_config(json.dumps({
        "cluster": {"chief": ["h:1"], "ps": ["h:2", "h:3"], "worker": ["h:4", "h:5"]},
        "task": {"type": "worker", "index": 1}}))
    assert (task.name, task.num_workers, task.num_ps, task.address) == ("worker:1", 2, 2, "h:5")
    with pytest.raises(ConfigError, match="not set"):
        parse_tf_config(None)
    with pytest.raises(ConfigError, match="out of range"):
        parse_tf_config(json.dumps({"cluster": {"worker": ["h:1"]},
                                    "task": {"type": "worker", "index": 1}}))


def test_event_writer_lines_and_contract(tmp_path):
    path = tmp_path / "ev" / "events.jsonl"
    with EventWriter(path, "worker:0", clock=lambda: 12.5) as writer:
        writer.emit("checkpoint", step=np.int64(3), path="ckpt-3")
        writer.emit("progress", step=4, steps_total=10, epoch=None, loss=float("nan"),
                    examples_per_second=1.0, per_worker={"worker:0": 1.0})
        with pytest.raises(ValueError, match="lacks fields"):
            writer.emit("done", mode="sync")
        with pytest.raises(ValueError, match="unknown event"):
            writer.emit("finished")
    events = read_events(path)
    assert [e["event"] for e in events] == ["checkpoint", "progress"]
    assert events[0] == {"event": "checkpoint", "ts": 12.5, "task": "worker:0", "step": 3,
                         "path": "ckpt-3"}
    assert events[1]["loss"] is None  # NaN is not JSON
    assert set(EVENT_FIELDS) == {"start", "placement", "progress", "checkpoint", "eval",
                                 "done", "error", "membership", "waiting", "worker"}
    with open(path, "a") as f:
        f.write('{"event": "progre')  # a writer killed mid-line
    assert len(read_events(path)) == 2


@pytest.mark.parametrize("options, min_workers, error", [
    (dict(epochs=1.0, steps=5), None, "give --epochs or --steps, not both"),
    (dict(warmup_steps=10), None, "--warmup-steps applies to async mode only"),
    (dict(snapshot_every=0.25), None, "--snapshot-every must be at least 1 second"),
    (dict(), 3, "--min-workers 3 is larger than cluster"),
])
def test_train_options_a_sync_cluster_cannot_run_are_refused(options, min_workers, error):
    from cluster.errors import UsageError
    from cluster.inventory import load_inventory
    from cluster.plan import PlanOptions, plan_cluster
    from cluster.supervision.train_spec import JobOptions, check_job_options
    plan = plan_cluster(load_inventory(str(REPO / "inventories" / "local.yaml")),
                        PlanOptions(local_python="/py", local_workdir="/wd", mode="sync"))
    with pytest.raises(UsageError, match=error.replace("-", "\\-")):
        check_job_options(JobOptions(**options), plan, min_workers=min_workers)
    check_job_options(JobOptions(), plan, min_workers=len(plan.tasks_of("worker")))     # the cluster's size: fine


def test_async_and_sync_jobs_snapshot_every_15_s_unless_told_and_sync_ps_never():
    """Issue 41 items 3-4: the default a user gets. 0 turns it off; a sync-ps cluster gets none
    (and 0 on it is accepted: nothing to turn off)."""
    from cluster.inventory import load_inventory
    from cluster.plan import PlanOptions, plan_cluster
    from cluster.supervision.train_spec import DEFAULT_SNAPSHOT_EVERY, JobOptions, check_job_options, with_defaults
    plans = {mode: plan_cluster(load_inventory(str(REPO / "inventories" / "local.yaml")),
                                PlanOptions(local_python="/py", local_workdir="/wd", mode=mode))
             for mode in ("async", "sync", "sync-ps")}
    assert DEFAULT_SNAPSHOT_EVERY == 15.0
    assert with_defaults(JobOptions(), plans["async"]).snapshot_every == DEFAULT_SNAPSHOT_EVERY
    assert with_defaults(JobOptions(snapshot_every=0.0), plans["async"]).snapshot_every == 0.0
    assert with_defaults(JobOptions(snapshot_every=40.0), plans["async"]).snapshot_every == 40.0
    assert with_defaults(JobOptions(), plans["sync"]).snapshot_every == DEFAULT_SNAPSHOT_EVERY
    assert with_defaults(JobOptions(), plans["sync-ps"]).snapshot_every is None
    check_job_options(JobOptions(snapshot_every=0.0), plans["sync-ps"])
