"""`pscluster run`: the program's folder travels (cluster/program/progfiles.py, cluster/program/ignorerules.py),
the static import scan (cluster/program/importscan.py) and the per-host verdicts on what a host lacks
(cluster/supervision/program_job.program_problems), hand-checked."""
from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

from cluster.hosts import hostops
from cluster.errors import UsageError
from cluster.program.ignorerules import IgnoreRules, parse_rules
from cluster.program.importscan import scan_program
from cluster.plan import HostSpec
from cluster.program.progfiles import MIB, check_relative, program_files
from cluster.supervision.program_job import program_problems
from cluster.program.runspec import Workspace, check_sync_paths, local_files, program_folder
from cluster.transport.local import LocalTransport

HOST = HostSpec(name="node-b", address="10.1.1.2", connection="ssh", ssh_port=None, user=None, key_file=None,
                python="/opt/venv/bin/python", workdir="~/pscluster", host_key_policy="reject", known_hosts=None,
                connect_timeout=10.0)


def write(root: Path, files: dict[str, str | bytes]) -> Path:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return root


# ----------------------------------------------------------------------------- ignore rules

@pytest.mark.parametrize("pattern, path, is_dir, ignored", [
    ("*.ckpt", "model.ckpt", False, True),
    ("*.ckpt", "runs/a/model.ckpt", False, True),          # no slash: at any depth
    ("/data", "data", True, True),
    ("/data", "sub/data", True, False),                    # leading slash: only beside the ignore file
    ("logs/", "logs", True, True),
    ("logs/", "logs", False, False),                       # trailing slash: folders only
    ("a/*.txt", "a/x.txt", False, True),
    ("a/*.txt", "a/b/x.txt", False, False),                # "*" stops at "/"
    ("**/cache", "x/y/cache", True, True),
    ("data/**", "data/big/part.bin", False, True),
    ("a/**/b", "a/b", True, True),
    ("a/**/b", "a/x/y/b", True, True),
    ("file?.bin", "file1.bin", False, True),
    ("file[0-3].bin", "file4.bin", False, False),
    ("file[!0-3].bin", "file4.bin", False, True),
    ("\\#notes", "#notes", False, True),
    ("# comment", "# comment", False, False),
])
def test_gitignore_patterns(pattern, path, is_dir, ignored):
    rules = IgnoreRules(parse_rules(pattern + "\n", "/p", "/p/.psclusterignore"))
    assert rules.ignored("/p/" + path, is_dir) is ignored


def test_negation_and_order_last_match_wins():
    rules = IgnoreRules(parse_rules("*.npz\n!keep.npz\n", "/p", "x") + parse_rules("keep.npz\n", "/p/sub", "y"))
    assert rules.ignored("/p/a.npz", False) and not rules.ignored("/p/keep.npz", False)
    assert rules.ignored("/p/sub/keep.npz", False)             # a deeper file's rule comes later and wins


# ----------------------------------------------------------------------------- the folder that travels

def test_the_scripts_folder_travels_less_what_ignore_files_and_caches_leave_out(tmp_path):
    cwd = write(tmp_path / "proj", {
        ".gitignore": "*.log\n/outputs/\n",
        "app/main.py": "import helper\n", "app/helper.py": "X = 1\n", "app/conf/vocab.txt": "a b\n",
        "app/.psclusterignore": "scratch/\n!keep.log\n", "app/scratch/big.bin": b"x" * 10,
        "app/run.log": "noise\n", "app/keep.log": "wanted\n", "app/__pycache__/helper.cpython-311.pyc": b"\0",
        "app/venv/pyvenv.cfg": "home = /usr\n", "app/venv/lib/site.py": "\n",
        "outputs/ckpt": "\n", "other/unrelated.py": "\n",
    })
    space = Workspace(cwd=cwd, root=tmp_path / "checkout")
    argv = ["python", "app/main.py", "--vocab", "app/conf/vocab.txt"]
    assert program_folder(argv, space) == "app"
    files = sorted(f.rel for f in local_files(argv, [], space))
    assert files == ["app/.psclusterignore", "app/conf/vocab.txt", "app/helper.py", "app/keep.log", "app/main.py"]


def test_a_named_file_travels_even_if_ignored_and_sync_dot_takes_the_current_directory(tmp_path):
    cwd = write(tmp_path / "proj", {".psclusterignore": "*.npz\n", "main.py": "\n", "data.npz": b"1",
                                    "sub/x.npz": b"2", "sub/y.py": "\n"})
    space = Workspace(cwd=cwd, root=tmp_path / "checkout")
    assert check_sync_paths(["."], space) == ["."]              # was refused: "not under the current directory"
    files = sorted(f.rel for f in local_files(["python", "main.py", "data.npz"], ["."], space))
    assert files == [".psclusterignore", "data.npz", "main.py", "sub/y.py"]


def test_a_script_outside_the_current_directory_takes_no_folder(tmp_path):
    write(tmp_path, {"elsewhere/main.py": "\n", "proj/a.py": "\n"})
    space = Workspace(cwd=tmp_path / "proj", root=tmp_path / "checkout")
    assert program_folder(["python", str(tmp_path / "elsewhere" / "main.py")], space) is None
    assert program_folder(["python", "-m", "pkg"], space) is None
    assert local_files(["python", "../elsewhere/main.py"], [], space) == []


def test_past_the_size_cap_run_stops_naming_the_folder_the_cap_and_the_largest_files(tmp_path):
    cwd = write(tmp_path / "home", {"main.py": "\n", "datasets/imagenet.tar": b"\0" * (3 * MIB),
                                    "notes.txt": "x\n"})
    with pytest.raises(UsageError) as caught:
        program_files(cwd, [], ".", [], limit_mib=2)
    error = caught.value
    assert error.exit_code == 2
    assert "the current directory (the script's folder)" in error.message and "2 MiB (the --sync-limit)" in error.message
    assert "datasets/imagenet.tar (3.0 MiB)" in error.message
    assert ".psclusterignore" in error.hint and "--sync-limit" in error.hint
    assert len(program_files(cwd, [], ".", [], limit_mib=0).entries) == 3           # 0: no limit
    (cwd / ".psclusterignore").write_text("datasets/\n")
    assert sorted(e.rel for e in program_files(cwd, [], ".", [], limit_mib=2).entries) == [
        ".psclusterignore", "main.py", "notes.txt"]


# ----------------------------------------------------------------------------- what never travels (issue 42, M1)

HOME_FILES = {"main.py": "\n", "id_utils.py": "\n", ".ssh/id_ed25519": "key", ".ssh/config": "x",
              ".aws/credentials": "k", ".azure/a": "k", ".kube/config": "k", ".docker/config.json": "k",
              ".gnupg/x": "k", ".netrc": "m", ".config/gcloud/creds.json": "k", ".config/app.toml": "ok",
              "certs/server.pem": "k", "keys/id_rsa": "k", "keys/id_rsa.pub": "k",
              ".local/state/pscluster/demo.json": "{}"}


def test_a_script_in_the_home_folder_does_not_take_the_home_folder_along(tmp_path):
    home = write(tmp_path / "home", HOME_FILES)
    space = Workspace(cwd=home, root=tmp_path / "checkout", home=home, state_dir=home / ".local/state/pscluster")
    with pytest.raises(UsageError) as caught:
        local_files(["python", "main.py"], [], space)
    assert caught.value.exit_code == 2
    assert "holds .ssh" in caught.value.message and "--sync ." in caught.value.hint
    for marker in (".ssh", ".gnupg", ".aws"):                # $HOME itself is refused without a marker
        (home / marker).rename(tmp_path / marker)
    with pytest.raises(UsageError, match="your home folder"):
        local_files(["python", "main.py"], [], space)
    for marker in (".ssh", ".gnupg", ".aws"):                # back home: the folder above holds none
        (tmp_path / marker).rename(home / marker)
    above = Workspace(cwd=tmp_path, root=tmp_path / "checkout", home=home)      # /home: every home at once
    (tmp_path / "main.py").write_text("\n")
    with pytest.raises(UsageError, match=f"it holds your home folder {home}"):
        local_files(["python", "main.py"], [], above)
    assert "home/main.py" in {f.rel for f in local_files(["python", "main.py"], ["."], above)}   # named: taken


def test_credentials_and_the_state_never_travel_unless_named_one_by_one(tmp_path):
    home = write(tmp_path / "home", HOME_FILES)
    space = Workspace(cwd=home, root=tmp_path / "checkout", home=home, state_dir=home / ".local/state/pscluster")
    files = sorted(f.rel for f in local_files(["python", "main.py"], ["."], space))
    assert files == [".config/app.toml", "id_utils.py", "main.py"]
    named = sorted(f.rel for f in local_files(["python", "main.py", ".ssh/config"], [".", "certs/server.pem"], space))
    assert named == [".config/app.toml", ".ssh/config", "certs/server.pem", "id_utils.py", "main.py"]
    with pytest.raises(UsageError, match="--sync .aws: a folder of credentials"):
        local_files(["python", "main.py"], [".", ".aws"], space)


def test_a_private_file_stays_private_on_the_hosts(tmp_path):
    cwd = write(tmp_path / "proj", {"main.py": "\n", "token.txt": "t", "run.sh": "#!/bin/sh\n"})
    (cwd / "token.txt").chmod(0o600)
    (cwd / "run.sh").chmod(0o700)
    (cwd / "main.py").chmod(0o644)
    modes = {f.rel: f.mode for f in local_files(["python", "main.py"], [], Workspace(cwd=cwd, root=tmp_path / "co"))}
    assert modes == {"main.py": None, "run.sh": 0o700, "token.txt": 0o600}
    target = tmp_path / "host" / "token.txt"
    LocalTransport(HOST).put_files([(str(cwd / "token.txt"), str(target))], root=str(target.parent),
                                   mode=modes["token.txt"])
    assert target.stat().st_mode & 0o777 == 0o600


def test_a_private_file_copied_open_before_is_sent_again_though_unchanged(tmp_path):
    """Issue 42, M1: only a changed sha256 travelled, so a copy made 0644 before the fix (or
    before the file was chmod 600 here) stayed 0644 on the host; hostctl ``hashes`` says which
    copies are open to others, and a private file's open copy is sent again."""
    from cluster.events import Reporter
    from cluster.hosts.codesync import sync_files
    from cluster.inventory import load_inventory
    from cluster.plan import PlanOptions, plan_cluster
    from cluster.transport import TransportPool
    cwd = write(tmp_path / "proj", {"main.py": "\n", "token.txt": "t"})
    (cwd / "main.py").chmod(0o644)
    (cwd / "token.txt").chmod(0o600)
    host = write(tmp_path / "host", {"main.py": "\n", "token.txt": "t"})     # the copies an earlier run made
    for name in ("main.py", "token.txt"):
        (host / name).chmod(0o644)
    (tmp_path / "one.yaml").write_text(f"all: {{vars: {{ansible_connection: local, pscluster_python: {sys.executable}}}, "
                                       f"children: {{worker: {{hosts: {{a: {{pscluster_workdir: {host}}}}}}}}}}}\n")
    plan = plan_cluster(load_inventory(str(tmp_path / "one.yaml")),
                        PlanOptions(local_python=sys.executable, local_workdir=str(tmp_path / "co"), mode="sync"))
    files = local_files(["python", "main.py"], [], Workspace(cwd=cwd, root=tmp_path / "co"))
    with TransportPool() as pool:
        assert hostops.hashes(pool.get(plan.hosts[0]), str(host), ["main.py", "token.txt", "gone.txt"]).open == {
            "main.py", "token.txt"}
        [result] = sync_files(plan, pool, Reporter(), files, tmp_path / "co")
        assert (result.sent, result.unchanged) == (1, 1)
        assert {name: (host / name).stat().st_mode & 0o777 for name in ("main.py", "token.txt")} == {
            "main.py": 0o644, "token.txt": 0o600}
        assert sync_files(plan, pool, Reporter(), files, tmp_path / "co")[0].sent == 0     # private there now


def test_git_info_exclude_and_core_excludesfile_leave_files_home_as_git_does(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "gitconfig"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    cwd = write(tmp_path / "repo", {"main.py": "\n", "secret.txt": "s", "a.key": "k", "b.local": "l",
                                    "keep.txt": "\n", ".gitignore": "!b.local\n"})
    (cwd / ".git" / "info").mkdir(parents=True)
    (cwd / ".git" / "info" / "exclude").write_text("secret.txt\n*.local\n")
    write(tmp_path / "xdg", {"git/ignore": "*.key\n"})
    space = Workspace(cwd=cwd, root=tmp_path / "checkout")
    files = sorted(f.rel for f in local_files(["python", "main.py"], [], space))
    assert files == [".gitignore", "b.local", "keep.txt", "main.py"]    # .gitignore's "!" beats info/exclude
    (tmp_path / "gitconfig").write_text(f"[core]\n\texcludesFile = {tmp_path / 'global-ignore'}\n")
    (tmp_path / "global-ignore").write_text("keep.txt\n")
    files = sorted(f.rel for f in local_files(["python", "main.py"], [], space))
    assert files == [".gitignore", "a.key", "b.local", "main.py"]


# ----------------------------------------------------------------------------- symlinked folders (issue 42, M2)

def test_a_symlinked_folder_travels_under_its_own_name_not_where_it_leads(tmp_path):
    write(tmp_path / "datasets" / "mnist", {"train.npz": b"1", "sub/test.npz": b"2"})
    write(tmp_path / "code" / "app", {"main.py": "\n", "helper.py": "\n"})
    cwd = write(tmp_path / "home" / "proj", {"run.py": "\n"})
    (cwd / "data").symlink_to(tmp_path / "datasets" / "mnist")
    (cwd / "app").symlink_to(tmp_path / "code" / "app")
    space = Workspace(cwd=cwd, root=tmp_path / "checkout")
    assert sorted(f.rel for f in local_files(["python", "run.py"], ["data"], space)) == [
        "data/sub/test.npz", "data/train.npz", "run.py"]                   # were ../../datasets/mnist/...
    assert sorted(f.rel for f in local_files(["python", "app/main.py"], [], space)) == ["app/helper.py", "app/main.py"]


@pytest.mark.parametrize("rel", ["../x.py", "/etc/passwd", "a/../../x.py", ".."])
def test_a_name_that_leaves_the_current_directory_is_refused_naming_it(rel):
    with pytest.raises(UsageError) as caught:
        check_relative(rel)
    assert repr(rel) in caught.value.message and caught.value.exit_code == 2


# ----------------------------------------------------------------------------- the import scan

def test_the_scan_follows_sibling_modules_and_tells_required_from_optional(tmp_path):
    write(tmp_path, {
        "main.py": textwrap.dedent("""\
            from __future__ import annotations
            import os, json
            import tensorflow.keras as tfk
            import mnist_setup
            from . import rel
            from typing import TYPE_CHECKING
            if TYPE_CHECKING:
                import mypy_extensions
            try:
                import ujson
            except ImportError:
                ujson = None
            def plot():
                import matplotlib.pyplot
            if __name__ == "__main__":
                import absl.app
            """),
        "mnist_setup.py": "import numpy as np\nfrom pkgdir import thing\n",
        "pkgdir/__init__.py": "import yaml\n",
        "broken.py": "def (:\n",
    })
    found = {m.name: (m.required, m.where) for m in scan_program(tmp_path / "main.py")}
    assert found == {"os": (True, "main.py:2"), "json": (True, "main.py:2"), "tensorflow": (True, "main.py:3"),
                     "typing": (True, "main.py:6"), "ujson": (False, "main.py:10"),
                     "matplotlib": (False, "main.py:14"), "absl": (True, "main.py:16"),
                     "numpy": (True, "mnist_setup.py:1"), "yaml": (True, "pkgdir/__init__.py:1")}
    assert scan_program(tmp_path / "broken.py") == ()


# ----------------------------------------------------------------------------- per-host verdicts

def facts(**kw) -> hostops.ProgramFacts:
    return hostops.ProgramFacts(**{"missing": (), "tools": (), "modules": (), **kw})


def test_a_required_module_missing_on_a_host_is_an_error_naming_host_module_and_hint(tmp_path):
    write(tmp_path, {"main.py": "import numpy\nimport wandb\ndef f():\n    import seaborn\n"})
    modules = scan_program(tmp_path / "main.py")
    errors, warnings = program_problems(HOST, "~/pscluster", ["/opt/venv/bin/python", "main.py"], ["main.py"],
                                        modules, facts(modules=(("numpy", True), ("wandb", False),
                                                                ("seaborn", False))), keras="keras3")
    assert [e.message for e in errors] == [
        "node-b: module 'wandb' (imported at main.py:2) is not installed for /opt/venv/bin/python"]
    assert "pip install wandb" in errors[0].hint and "script's folder" in errors[0].hint
    assert warnings == ["module 'seaborn' (imported at main.py:4) is not installed for /opt/venv/bin/python; "
                        "the program may fail when it gets there"]


def test_a_missing_script_is_named_first():
    errors, _ = program_problems(HOST, "~/pscluster", ["python", "t.py"], ["t.py"], (),
                                 facts(missing=("t.py",)), keras="legacy")
    assert [e.message for e in errors] == ["node-b: t.py does not exist in ~/pscluster"]


@pytest.mark.parametrize("tf, tf_keras, importable, dist, problem, install", [
    ("2.21.0", None, False, "tensorflow", "tf-keras is not installed (TensorFlow 2.21.0)",
     "pip install tf-keras==2.21.0 (or pip install 'pscluster[legacy-keras]')"),
    ("2.21.0", "2.20.0", True, "tensorflow-cpu", "tf-keras 2.20.0 does not match TensorFlow 2.21.0 (need 2.21.x)",
     "pip install --no-deps tf-keras==2.21.0"),
    ("2.21.0", "2.21.0", False, "tensorflow", "tf-keras 2.21.0 does not import", "pip install tf-keras==2.21.0"),
    (None, None, False, None, "needs TensorFlow, which is not installed", "pscluster[cpu,legacy-keras]"),
])
def test_legacy_keras_needs_tf_keras_of_the_hosts_tensorflow(tf, tf_keras, importable, dist, problem, install):
    errors, _ = program_problems(HOST, "~/pscluster", ["python", "t.py"], [], (),
                                 facts(tf_version=tf, tf_keras_version=tf_keras, tf_keras_importable=importable,
                                       tf_dist=dist), keras="legacy")
    assert len(errors) == 1 and errors[0].host == "node-b"
    assert problem in errors[0].message and install in errors[0].hint
    ok, _ = program_problems(HOST, "~", ["python", "t.py"], [], (), facts(tf_version="2.21.0",
                             tf_keras_version="2.21.0", tf_keras_importable=True), keras="legacy")
    assert ok == []
    ignored, _ = program_problems(HOST, "~", ["python", "t.py"], [], (), facts(tf_version=tf), keras="keras3")
    assert ignored == []


# ----------------------------------------------------------------------------- the host side, for real

def test_the_host_check_resolves_modules_from_the_scripts_folder_and_reads_tf_keras(tmp_path):
    """hostctl ``program`` on this machine: one call, this interpreter's site-packages."""
    write(tmp_path, {"app/main.py": "\n", "app/helper_mod.py": "\n"})
    transport = LocalTransport(HostSpec(name="localhost", address="127.0.0.1", connection="local", ssh_port=None,
                                        user=None, key_file=None, python=sys.executable, workdir=str(tmp_path),
                                        host_key_policy="accept-new", known_hosts=None, connect_timeout=10.0))
    got = hostops.program(transport, cwd=str(tmp_path), paths=["app/main.py", "app/gone.py"],
                          modules=["numpy", "helper_mod", "no_such_module_24b"], script_dir="app",
                          pythonpath=None, tf_keras=True)
    assert got.missing == ("app/gone.py",)
    assert dict(got.modules) == {"numpy": True, "helper_mod": True, "no_such_module_24b": False}
    from importlib import metadata
    assert got.tf_version == metadata.version(got.tf_dist or "tensorflow-cpu")
    assert got.tf_keras_version == metadata.version("tf-keras") and got.tf_keras_importable
    facts_here = hostops.facts(transport, ports=(), gpus=False, workdir=None, tf_keras=True)
    assert facts_here.tf_keras_version == got.tf_keras_version
    assert os.path.basename(sys.executable).startswith("python")
