"""The suite's Docker engine leaves the machine as it found it: after a container on a network of
its own has run, stopping the engine removes dockerd's iptables rules and chains, docker0 and the
network's bridge, and restores ip_forward and the FORWARD policy (docs/platform-notes.md D4, D5).
Then the engine starts again for the tests that follow (its data root, with the images, is kept)."""
from __future__ import annotations

import pathlib
import subprocess
import tempfile

import pytest

from testbed import dockerlab
from tests.docker.conftest import docker

pytestmark = [pytest.mark.docker]


def machine() -> dict:
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return {
        "rules": {table: sorted(subprocess.run(["iptables", "-t", table, "-S"], capture_output=True,
                                               text=True).stdout.splitlines()) for table in ("filter", "nat")},
        "links": sorted(line.split(":")[1].strip().split("@")[0] for line in links.splitlines()),
        "ip_forward": open("/proc/sys/net/ipv4/ip_forward").read().strip(),
    }


def dockers(rules: list[str]) -> list[str]:
    """The rules dockerd makes (its chains, its bridges) and the policies it changes: the local
    lane runs beside these tests and adds rules of its own meanwhile (tests/local/test_roles.py
    blackholes a worker's port in INPUT/OUTPUT), which are not the engine's to undo."""
    return sorted(r for r in rules if r.startswith("-P ") or any(m in r for m in ("DOCKER", "docker0", "br-")))


def test_dockers_rules_are_told_from_the_others():
    rules = ["-P FORWARD DROP", "-N DOCKER", "-A FORWARD -o docker0 -j DOCKER", "-A FORWARD -i br-1a2b -j ACCEPT",
             "-A INPUT -p tcp -m tcp --dport 23191 -j DROP"]
    assert dockers(rules) == sorted(rules[:4])


def test_stopping_the_engine_undoes_what_dockerd_did(engine):
    before = engine._saved      # what start() found
    docker(engine, "network", "create", "psc-engine-test")
    docker(engine, "run", "-d", "--name", "psc-engine-test", "--network", "psc-engine-test",
           dockerlab.BASE_IMAGE, "sleep", "infinity")
    during = machine()
    assert "docker0" in during["links"] and any(link.startswith("br-") for link in during["links"])
    assert any("DOCKER" in rule for rule in during["rules"]["filter"])
    assert during["ip_forward"] == "1"

    engine.stop()
    after = machine()
    try:
        assert dockers(after["rules"]["filter"]) == dockers(before["rules"]["filter"])
        assert dockers(after["rules"]["nat"]) == dockers(before["rules"]["nat"])
        assert set(after["links"]) == set(before["links"])
        assert after["ip_forward"] == before["ip_forward"]
        assert engine.pid is None
    finally:
        engine.start()
    assert engine.image_exists(dockerlab.NODE_IMAGE)       # the data root (images) is kept
    assert engine.containers() == []                       # ...but not what ran


def test_a_start_removes_what_a_killed_run_left(engine):
    """A run killed mid-way (CI's time limit) leaves dockerd's rules and its bridge: the next
    engine's start removes them before it records the machine's state, so that its stop leaves
    the machine clean (a killed run's leftovers once failed the next run's engine test)."""
    engine.stop()
    clean = machine()
    engine.start()
    docker(engine, "network", "create", "psc-left-behind")
    engine.kill(pathlib.Path(tempfile.mkdtemp(prefix="pscluster-dock-")))
    left = machine()
    assert "docker0" in left["links"] and any(link.startswith("br-") for link in left["links"])
    assert any("DOCKER" in rule for rule in left["rules"]["filter"])
    try:
        engine.start()
        engine.stop()
        after = machine()
        assert all(dockers(after["rules"][t]) == dockers(clean["rules"][t]) for t in ("filter", "nat")), after
        assert set(after["links"]) == set(clean["links"]), after
    finally:
        if engine.pid is None:
            engine.start()
