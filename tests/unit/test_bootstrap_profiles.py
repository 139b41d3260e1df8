"""scripts/bootstrap.sh's profiles: the demo installs only what inventories/local.yaml needs.

The script runs for real in a copy of the checkout, as root on a machine that lacks every Debian
package, with `apt-get`, `id` and the virtualenv's python replaced by stubs that record their argv.
"""
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def stub(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def bootstrap(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[str], list[str]]:
    """Run the script in a copy holding only what it reads; return the result, apt and pip calls."""
    (tmp_path / "scripts").mkdir(exist_ok=True)
    for name in ("scripts/bootstrap.sh", "setup.cfg", "pyproject.toml"):
        shutil.copy(REPO / name, tmp_path / name)
    calls = tmp_path / "calls"
    tools = tmp_path / "bin"
    tools.mkdir(exist_ok=True)
    for tool in ("bash", "cat", "cut", "dirname", "sha256sum"):
        found = shutil.which(tool)
        assert found, tool
        if not (tools / tool).exists():
            (tools / tool).symlink_to(found)
    stub(tools / "id", "echo 0\n")
    stub(tools / "apt-get", f'echo "apt-get $*" >> {calls}\n')
    venv = tmp_path / ".venv" / "bin"
    venv.mkdir(parents=True, exist_ok=True)
    stub(venv / "python", f'echo "python $*" >> {calls}\n')
    env = {"PATH": str(tools), "HOME": str(tmp_path)}
    result = subprocess.run([str(tools / "bash"), "scripts/bootstrap.sh", *args], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=60)
    lines = calls.read_text().splitlines() if calls.exists() else []
    calls.unlink(missing_ok=True)
    return (result, [line for line in lines if line.startswith("apt-get install")],
            [line for line in lines if line.startswith("python -m pip install") and "--upgrade pip" not in line])


@pytest.mark.skipif(not shutil.which("sha256sum"), reason="needs coreutils")
def test_demo_installs_python_packages_only(tmp_path):
    result, apt, pip = bootstrap(tmp_path, "demo")
    assert result.returncode == 0, result.stderr
    assert apt == []
    assert pip == ["python -m pip install -q -e .[cpu]"]


@pytest.mark.skipif(not shutil.which("sha256sum"), reason="needs coreutils")
def test_test_profile_installs_the_lab_packages_and_the_test_tools(tmp_path):
    result, apt, pip = bootstrap(tmp_path, "test")
    assert result.returncode == 0, result.stderr
    installed = " ".join(apt).split()
    # Packages the script looks for on PATH only (others it also finds under /usr/sbin, which
    # this machine may have): missing from the stubs' PATH, so always installed here.
    for package in ("openssh-client", "slurm-client", "docker-compose"):
        assert package in installed
    assert pip == ["python -m pip install -q -e .[cpu,test,tensorboard]",
                   "python -m pip install -q --no-deps tf-keras==2.21.0"]


@pytest.mark.skipif(not shutil.which("sha256sum"), reason="needs coreutils")
def test_a_test_set_up_covers_the_demo_but_not_the_other_way_round(tmp_path):
    assert bootstrap(tmp_path, "demo")[2] != []
    assert bootstrap(tmp_path, "demo")[2] == []          # cheap on a re-run
    assert bootstrap(tmp_path, "test")[2] != []          # the demo's .venv lacks the test tools
    assert bootstrap(tmp_path, "demo")[2] == []


def test_unknown_profile_exits_2(tmp_path):
    result, apt, pip = bootstrap(tmp_path, "everything")
    assert result.returncode == 2
    assert "unknown profile 'everything'" in result.stderr
    assert apt == [] and pip == []
