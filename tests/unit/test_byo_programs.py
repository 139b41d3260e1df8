"""The example programs of examples/byo/: their pure parts (flags, TF_CONFIG checks, where the
data is found), without TensorFlow. tests/local/test_run.py trains them for real."""
from __future__ import annotations

import importlib.util
import json

import pytest

from tests.helpers import REPO

BYO = REPO / "examples" / "byo"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"byo_{name}", BYO / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TF1 = load("tf1_flags")
MWMS = load("tf2_mwms")
COORD = load("tf2_ps_coordinator")
FLAGS = ["--ps_hosts=h1:2222, h2:2222", "--worker_hosts=h1:2223,h2:2223,h2:2224"]


def test_tf1_flags_parse_the_classic_command_line():
    args = TF1.parse_args([*FLAGS, "--job_name=worker", "--task_index=2", "--steps", "40", "--sync_replicas"])
    assert args.hosts == {"ps": ["h1:2222", "h2:2222"], "worker": ["h1:2223", "h2:2223", "h2:2224"]}
    assert (args.job_name, args.task_index, args.steps, args.sync_replicas) == ("worker", 2, 40, True)
    assert TF1.parse_args([*FLAGS, "--job_name=ps", "--task_index=1"]).steps == 2000


@pytest.mark.parametrize("extra, words", [
    (["--job_name=chief", "--task_index=0"], "has no chief job (worker 0 is the chief)"),
    (["--job_name=evaluator", "--task_index=0"], "invalid choice: 'evaluator'"),
    (["--job_name=ps", "--task_index=2"], "--task_index 2 is not a ps task (2 listed)"),
    (["--job_name=worker", "--task_index=0", "--steps", "0"], "must be >= 1"),
])
def test_tf1_flags_refuse_what_cannot_run(capsys, extra, words):
    with pytest.raises(SystemExit) as caught:
        TF1.parse_args([*FLAGS, *extra])
    assert caught.value.code == 2 and words in capsys.readouterr().err


def test_data_is_found_in_the_project_then_in_the_bundled_copy(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bundled = TF1.data_path(None)
    assert bundled.endswith("distributed_mnist/data/mnist.npz")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "mnist.npz").write_bytes(b"x")
    for module in (TF1, MWMS, COORD):
        assert module.data_path(None) == "data/mnist.npz"
        assert module.data_path(bundled) == bundled
        with pytest.raises(SystemExit, match="no such file"):
            module.data_path("missing.npz")


def test_tf_config_is_read_and_checked():
    cluster = {"chief": ["h:1"], "ps": ["h:2"], "worker": ["h:3", "h:4"]}
    config = {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 1}})}
    assert MWMS.task_of(config) == ("worker", 1, 2)
    with pytest.raises(SystemExit, match="TF_CONFIG is missing"):
        MWMS.task_of({})
    with pytest.raises(SystemExit, match="malformed"):
        COORD.task_of({"TF_CONFIG": "{not json"})


def test_the_same_binary_reads_its_role_from_tf_config():
    cluster = {"chief": ["h:1"], "ps": ["h:2"], "worker": ["h:3", "h:4"]}
    for role, index in (("chief", 0), ("ps", 0), ("worker", 1)):
        config = {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": role, "index": index}})}
        assert COORD.task_of(config) == (role, index, cluster)
    with pytest.raises(SystemExit, match="needs a chief, ps and worker tasks"):
        COORD.task_of({"TF_CONFIG": json.dumps({"cluster": {"worker": ["h:3"]}, "task": {"type": "worker",
                                                                                          "index": 0}})})
    with pytest.raises(SystemExit, match="runs as chief, ps or worker"):
        COORD.task_of({"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "evaluator", "index": 0}})})
    with pytest.raises(SystemExit, match="TF_CONFIG is missing"):
        COORD.task_of({})


def test_the_chief_waits_for_its_servers_to_listen():
    import socket
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        COORD.wait_listening([f"127.0.0.1:{port}"], timeout=5)
    with pytest.raises(SystemExit, match="did not listen within"):
        COORD.wait_listening([f"127.0.0.1:{port}"], timeout=0.3)


def test_the_coordinator_program_trains_with_model_fit_on_request(capsys):
    """Issue 45 item 5: TensorFlow's tutorial pattern model.fit(DatasetCreator(dataset_fn), ...)
    under ParameterServerStrategy (Keras 2 names: run with --keras legacy)."""
    args = COORD.parse_args(["--fit", "--steps", "600", "--epochs", "2"])
    assert (args.fit, args.steps, args.epochs) == (True, 600, 2)
    assert COORD.parse_args([]).fit is False
    source = (BYO / "tf2_ps_coordinator.py").read_text()
    assert "model.fit(train_input, epochs=args.epochs, steps_per_epoch=steps_per_epoch" in source
    assert "tf.keras.utils.experimental.DatasetCreator(dataset_fn)" in source
    for bad, words in ((["--fit", "--steps", "2", "--epochs", "3"], "is fewer than --epochs 3"),
                       (["--epochs", "0"], "must be >= 1")):
        with pytest.raises(SystemExit) as caught:
            COORD.parse_args(bad)
        assert caught.value.code == 2 and words in capsys.readouterr().err
