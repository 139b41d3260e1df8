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
    for tool in ("bash", "cat", "cut", "dirname", "mv", "sha256sum"):
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


def _copy_with_tools(root: Path, home: Path, calls: Path) -> dict:
    """A copy of what the script reads under ``root``, and the environment of a run there: real
    coreutils, and a ``python3`` stub that makes venvs whose python records its argv."""
    (root / "scripts").mkdir(parents=True)
    for name in ("scripts/bootstrap.sh", "setup.cfg", "pyproject.toml"):
        shutil.copy(REPO / name, root / name)
    tools = home / "bin"
    if not tools.exists():
        tools.mkdir(parents=True)
        for tool in ("bash", "cat", "cut", "dirname", "mv", "sha256sum", "cp", "grep", "sed", "chmod", "rm", "ls",
                     "tail", "mkdir", "printf", "head", "sh"):
            found = shutil.which(tool)
            if found:
                (tools / tool).symlink_to(found)
        stub(tools / "id", "echo 1000\n")          # not root: no apt
        # `python3 -m venv DIR`: a venv whose python records its calls, a script with its path in
        # the shebang and a site-packages file; `python3 -c ...`: the interpreter's identity.
        stub(tools / "python3", f'''case "$1" in
  -c) echo "3.11.7 stub" ;;
  --version) echo "Python 3.11.7" ;;
  -m) dir="$3"; mkdir -p "$dir/bin" "$dir/lib/site-packages"
      printf '#!/bin/sh\\necho "python $*" >> {calls}\\n' > "$dir/bin/python"; chmod +x "$dir/bin/python"
      printf '#!%s/bin/python\\nrun\\n' "$PWD/$dir" > "$dir/bin/tool"; chmod +x "$dir/bin/tool"
      echo big > "$dir/lib/site-packages/tensorflow.py" ;;
esac
''')
    return {"PATH": str(tools), "HOME": str(home)}


@pytest.mark.skipif(not all(shutil.which(t) for t in ("sha256sum", "cp", "sed", "grep")), reason="needs coreutils")
def test_a_fresh_clone_links_the_venv_this_machine_built_and_installs_only_pscluster(tmp_path):
    home, calls = tmp_path / "home", tmp_path / "calls"
    home.mkdir()

    def run(root: Path, **env: str) -> list[str]:
        result = subprocess.run(["bash", "scripts/bootstrap.sh", "demo"], cwd=root, capture_output=True, text=True,
                                timeout=60, env={**_copy_with_tools(root, home, calls), **env})
        assert result.returncode == 0, result.stderr
        lines = calls.read_text().splitlines() if calls.exists() else []
        calls.unlink(missing_ok=True)
        return [line for line in lines if "pip install" in line and "--upgrade pip" not in line]

    first, second, off = tmp_path / "first", tmp_path / "second", tmp_path / "off"
    assert run(first) == ["python -m pip install -q -e .[cpu]"]
    (cached,) = (home / ".cache" / "pscluster" / "venvs").iterdir()
    assert (cached / ".pscluster-cache-origin").read_text().strip() == str(first / ".venv")
    # The next clone: the same files linked, its scripts pointed at its own venv, pscluster alone installed.
    assert run(second) == ["python -m pip install -q --no-deps --no-build-isolation -e ."]
    site = second / ".venv" / "lib" / "site-packages" / "tensorflow.py"
    assert site.stat().st_ino == (first / ".venv" / "lib" / "site-packages" / "tensorflow.py").stat().st_ino
    assert (second / ".venv" / "bin" / "tool").read_text().splitlines()[0] == f"#!{second}/.venv/bin/python"
    assert (first / ".venv" / "bin" / "tool").read_text().splitlines()[0] == f"#!{first}/.venv/bin/python"
    assert not (second / ".venv" / ".pscluster-cache-origin").exists()
    assert (second / ".venv" / ".pscluster-setup-stamp").read_text().endswith(" demo\n")
    # A checkout path with sed's special characters (before: "s|$origin|$here|g" broke on | and &).
    odd = tmp_path / "odd|dir&x.[1]"
    assert run(odd) == ["python -m pip install -q --no-deps --no-build-isolation -e ."]
    assert (odd / ".venv" / "bin" / "tool").read_text().splitlines()[0] == f"#!{odd}/.venv/bin/python"
    # Turned off: pip's install as on a fresh machine.
    assert run(off, PSCLUSTER_BOOTSTRAP_CACHE="0") == ["python -m pip install -q -e .[cpu]"]
