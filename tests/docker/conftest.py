"""Containers for real: a Docker engine of the suite's own (testbed/dockerlab.py), the registry-free
base image, and the node image built from this checkout.

The engine is started once for this package and stopped after its last test (so nothing of it
is left while the rest of the suite runs); stopping removes every container
and network it made, its iptables chains and bridges, and restores ``ip_forward``
(tests/docker/test_engine.py checks that). Images are kept in the engine's data root between
runs (``/var/cache/pscluster-dockerlab``): a cold machine builds them in about 1.5 minutes,
afterwards only the layers with this checkout's code are rebuilt (seconds).

Where Docker cannot run (not root, packages missing and not installable), every test here is
skipped with the reason; on our machines they must run.
"""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import tempfile

import pytest

from testbed import dockerlab
from testbed.dockerlab import wait_for  # noqa: F401  (the tests import it from here)

pytestmark = [pytest.mark.docker]

IMAGE = dockerlab.NODE_IMAGE
NODE_PYTHON = "/opt/pscluster/venv/bin/python"


@pytest.fixture(scope="package")
def engine():
    try:
        dockerlab.check_available()
    except dockerlab.DockerUnavailable as exc:
        pytest.skip(f"Docker cannot run here: {exc}")
    state = pathlib.Path(tempfile.mkdtemp(prefix="pscluster-dock-"))
    engine = dockerlab.Engine(state)
    try:
        engine.start()
    except dockerlab.DockerUnavailable as exc:
        pytest.skip(f"Docker cannot run here: {exc}")
    try:
        base = dockerlab.ensure_base_image(engine, log=lambda m: print(m, file=sys.stderr))
        report = dockerlab.build_node_image(engine, log=lambda m: print(m, file=sys.stderr))
        report["base_seconds"] = base
        engine.build_report = report     # type: ignore[attr-defined]
        yield engine
    finally:
        engine.stop()


def docker(engine, *args: str, check: bool = True, timeout: float = 120, input: bytes | None = None) -> str:
    proc = engine.docker(*args, check=check, timeout=timeout, input=input)
    return proc.stdout.decode("utf-8", "replace")


# The engine's own, never ours: the image's HEALTHCHECK (docker/Dockerfile) runs every 10 s through
# an exec whose shim shows as "runc init" for a moment (seen in a clean-clone run, twentieth session).
HEALTH_CHECK = ("runc init", "python3 -c import os, socket, sys; os.path.exists('/run/pscluster-idle')")


def processes(engine, container: str) -> list[str]:
    """Command lines of every process in ``container`` except ``ps`` itself and the engine's
    health check."""
    out = docker(engine, "exec", container, "ps", "-eo", "args=", check=False)
    return [line.strip() for line in out.splitlines() if line.strip() and not line.strip().startswith("ps ")
            and not line.strip().startswith(HEALTH_CHECK)]


def healthy(engine, *containers: str) -> bool:
    out = docker(engine, "inspect", "--format", "{{.State.Health.Status}}", *containers, check=False)
    return out.split() == ["healthy"] * len(containers)


def final_report(stdout: str) -> dict:
    """The JSON report ``train --json`` prints last."""
    return json.loads(stdout[stdout.index("{"):]) if "{" in stdout else {}


def cli_env(engine, state_dir: pathlib.Path, **extra: str) -> dict[str, str]:
    env = engine.env()
    env.update(PSCLUSTER_STATE_DIR=str(state_dir), NO_COLOR="1", COLUMNS="200", **extra)
    return env


def pscluster(engine, state_dir, *args, env: dict | None = None, timeout: float = 600,
              cwd: pathlib.Path | None = None) -> subprocess.CompletedProcess:
    """``pscluster ARGS`` on this machine (the docker connection reaches the containers), from
    ``cwd`` (a user's project; default the checkout)."""
    return subprocess.run([sys.executable, "-m", "cluster", *map(str, args)], cwd=cwd or dockerlab.REPO,
                          env={**cli_env(engine, state_dir), **(env or {})}, capture_output=True, text=True,
                          timeout=timeout)

