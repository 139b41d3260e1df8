"""Cluster names and number options (issue 16 items 15 and 16).

A cluster name becomes a state file and a folder on every host, so names that are paths or
carry control characters are refused wherever they enter: ``--name`` on every command and the
inventory's file stem (the default name). Float options refuse nan, inf and out-of-range values
with exit 2 and a message naming the option.
"""
from __future__ import annotations

import pytest
from cluster.errors import UsageError
from cluster.names import check_cluster_name, is_cluster_name
from cluster.state import StateStore

from .conftest import INVENTORIES
from .test_cli_plan import Captured

LOCAL = str(INVENTORIES / "local.yaml")
BAD_NAMES = ["../x", "a/b", "/tmp/x", "", ".", "..", ".hidden", "-flag", "a\nb", "a\x1b[31mb", "a b",
             "x" * 64, "tab\there", "ünï"]


@pytest.mark.parametrize("name", ["local", "exp-1", "exp.a", "exp_a", "A1", "x" * 63, "0"])
def test_good_names(name):
    assert is_cluster_name(name) and check_cluster_name(name) == name


@pytest.mark.parametrize("name", ["exp.resize", "exp.resize-result"])
def test_names_of_the_files_beside_a_state_are_not_cluster_names(name):
    assert not is_cluster_name(name)
    with pytest.raises(UsageError) as caught:
        check_cluster_name(name)
    assert ".resize-result" in caught.value.message


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_names(name):
    assert not is_cluster_name(name)
    with pytest.raises(UsageError) as caught:
        check_cluster_name(name)
    assert caught.value.exit_code == 2 and caught.value.hint
    assert "\n" not in caught.value.message and "\x1b" not in caught.value.message   # shown escaped


# Every command that takes --name: (argv before --name, argv after it).
NAME_COMMANDS = {
    "plan": ["plan", LOCAL], "check": ["check", LOCAL], "up": ["up", LOCAL], "status": ["status"],
    "logs": ["logs"], "down": ["down"], "train": ["train", "mnist"], "export": ["export", LOCAL],
    "run": ["run", LOCAL], "attach": ["attach"], "stop-job": ["stop-job"],
}


@pytest.mark.parametrize("command", sorted(NAME_COMMANDS))
@pytest.mark.parametrize("name", ["../x", "/tmp/abs", "..", "a\nb"])
def test_every_command_refuses_a_bad_name(tmp_path, command, name):
    cli = Captured(tmp_path / "state")
    argv = [*NAME_COMMANDS[command], "--name", name]
    if command == "run":
        argv += ["--", "true"]
    assert cli.run(*argv) == 2
    err = cli.stderr.getvalue()
    assert "is not a valid cluster name" in err and "hint:" in err
    assert not (tmp_path / "state").exists() or not any((tmp_path / "state").iterdir())
    assert not (tmp_path / "x.json").exists()


def test_a_bad_inventory_stem_needs_a_name(tmp_path):
    inventory = tmp_path / "my lab.yaml"
    inventory.write_text((INVENTORIES / "local.yaml").read_text())
    cli = Captured(tmp_path / "state")
    assert cli.run("plan", str(inventory)) == 2
    err = cli.stderr.getvalue()
    assert f"{inventory}: the cluster name taken from the inventory's file name, 'my lab', " in err
    assert "pass --name NAME" in err
    assert Captured(tmp_path / "state").run("plan", str(inventory), "--name", "my-lab") == 0


def test_state_store_refuses_path_names(tmp_path):
    store = StateStore(tmp_path / "state")
    for name in ("../x", "/etc/passwd", ".."):
        with pytest.raises(UsageError):
            store.path(name)
        with pytest.raises(UsageError):
            store.load(name)


# --------------------------------------------------------------------------- float options

# (command argv, option, a valid value) for every float option of every command.
FLOAT_OPTIONS = [
    (["up", LOCAL], "--timeout"),
    (["down"], "--grace"),
    (["train", "mnist"], "--epochs"),
    (["train", "mnist"], "--learning-rate"),
    (["train", "mnist"], "--start-timeout"),
    (["train", "mnist"], "--stall-timeout"),
    (["train", "mnist"], "--hosts-every"),
    (["train", "mnist"], "--notices-every"),
    (["train", "mnist"], "--collective-timeout"),
    (["train", "mnist"], "--host-timeout"),
    (["train", "mnist"], "--stop-grace"),
    (["train", "mnist"], "--snapshot-every"),
    (["bench", "mnist", LOCAL], "--target-accuracy"),
    (["bench", "mnist", LOCAL], "--timeout"),
    (["run", LOCAL], "--host-timeout"),
    (["run", LOCAL], "--grace"),
    (["run", LOCAL], "--timeout"),
    (["stop-job"], "--timeout"),
    (["stop-job"], "--grace"),
    (["scale", LOCAL], "--timeout"),
    (["undrain", "h1"], "--timeout"),
    (["tensorboard"], "--timeout"),
]


@pytest.mark.parametrize("argv, option", FLOAT_OPTIONS, ids=[f"{a[0]}{o}" for a, o in FLOAT_OPTIONS])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1", "NaN", "1e999", "abc"])
def test_float_options_refuse_non_finite_and_negative(tmp_path, capsys, argv, option, value):
    cli = Captured(tmp_path / "state")
    full = [*argv, f"{option}={value}"] + (["--", "true"] if argv[0] == "run" else [])
    assert cli.run(*full) == 2
    err = capsys.readouterr().err
    assert f"Invalid value for '{option}'" in err, err
    assert not (tmp_path / "state").exists()


def test_every_float_option_is_covered():
    """A new float option without a finite-number type would slip past the test above."""
    import click

    from cluster.cli import FiniteFloat, cli
    found = set()
    for name, command in cli.commands.items():
        for param in command.params:
            if isinstance(param.type, click.types.FloatParamType):
                assert isinstance(param.type, FiniteFloat), (name, param.name)
                found.add((name, param.opts[0]))
    assert found == {(argv[0], option) for argv, option in FLOAT_OPTIONS}


def test_every_integer_option_has_a_range():
    """A bare ``int`` option lets 0 or -5 through to a trainer that fails minutes later, on a host."""
    import click

    from cluster.cli import cli
    bare = [(name, param.opts[0]) for name, command in cli.commands.items() for param in command.params
            if isinstance(param, click.Option) and param.type is click.INT]
    assert bare == []


@pytest.mark.parametrize("option", ["--steps", "--batch-size", "--checkpoint-every", "--steps-per-execution",
                                    "--eval-every"])
def test_train_refuses_a_zero_count_before_touching_the_state(tmp_path, capsys, option):
    cli = Captured(tmp_path / "state")
    assert cli.run("train", "mnist", f"{option}=0") == 2
    assert f"Invalid value for '{option}'" in capsys.readouterr().err
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize("spec", ["../examples/distributed_mnist", "distributed_mnist/../distributed_mnist"])
def test_a_shipped_job_name_cannot_climb_out_of_its_folder(tmp_path, monkeypatch, spec):
    """A shipped job's name becomes <workdir>/.pscluster/<cluster>/jobs/<name>/ on every host."""
    from cluster.hosts.codesync import project_root
    from cluster.supervision.train_spec import resolve_job
    monkeypatch.chdir(tmp_path)            # so that the spec is not an existing path here
    assert resolve_job("distributed_mnist", project_root()).name == "distributed_mnist"
    with pytest.raises(UsageError, match="no job named"):
        resolve_job(spec, project_root())
