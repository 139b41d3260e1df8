"""Ansible fidelity on the inventory styles of public inventories (issue 29): ``--limit`` against
ansible-core itself, pattern by pattern, on our fixture folder and on every checked inventory.

The hosts and variables of tests/unit/inventories/ansible_styles/ (INI without an extension, quoted
[group:vars] values, open, strided, letter and padded ranges, group_vars/ and host_vars/ files
without an extension, YAML without an ``all:`` root) are compared with ``ansible-inventory --list``
by test_inventory_sources.py (it is in CHECKED). Patterns go through ansible_limits.py: ansible's
InventoryManager in one process per inventory, checked against ``ansible all --list-hosts --limit``
itself for a few patterns (one process each: ~1.5 s of CPU apiece)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.errors import UsageError
from cluster.inventory import load_inventory
from cluster.inventory.patterns import select

from .test_inventory_sources import ANSIBLE_INVENTORY, CHECKED, FIXTURES
from .test_inventory import _ansible_env

STYLES = FIXTURES / "ansible_styles"
ANSIBLE = Path(sys.executable).with_name("ansible")
HARNESS = Path(__file__).with_name("ansible_limits.py")

# ≥ 20 patterns on the styles fixture: every subscript form, globs, regexes, & and !, and parts
# that match nothing (worker: gpu01 gpu03 gpu05 nodea nodeb nodec big0 big5 big10).
STYLE_PATTERNS = [
    "all", "*", "worker", "worker[0]", "worker[-1]", "worker[0:1]", "worker[2:]", "worker[1:0]",
    "worker[8]", "worker[9]", "worker[-10]", "gpu[-2]", "rack[0]", "rack_gpu[1]:chief", "*[1]",
    "all[3:5]", "worker[1-2]", "gpu0[12]", "node[4-5]", "node[ab]", "~node[ab]", "~^big[0-9]+$",
    "nosuchhost:gpu01", "nosuchhost", "gpu01,nosuch*,~zz", "worker:&rack", "worker:!rack_gpu",
    "!worker", "&ps", "gpu0?", "mail*", "*.example.com", "mail0.example.com:gpu01", "edge:22",
    "localhost", "evaluator,ps[0]", "a,~[", "~[", "worker[0]:worker[-1]:!gpu01",
]
# On every inventory the tests check (shipped ones included).
COMMON_PATTERNS = [
    "all", "worker[0]", "worker[-1]", "worker[0:1]", "ps[1:]", "*[0]", "chief:worker[-1]",
    "nosuchhost:worker", "all:!ps", "worker:&ps", "~.*b$", "localhost", "ungrouped", "all[-1]",
    "node-*", "ps[7]",
]
# Run through the ansible command itself, to show the harness evaluates as the CLI does.
CLI_PATTERNS = ["nosuchhost:gpu01", "node[4-5]", "rack_gpu[-1]:worker[0:1]"]


def _jobs() -> dict[Path, list[str]]:
    jobs = {path: list(COMMON_PATTERNS) for path in CHECKED}
    jobs[STYLES] = list(dict.fromkeys(STYLE_PATTERNS + COMMON_PATTERNS + CLI_PATTERNS))
    return jobs


@pytest.fixture(scope="module")
def ansible_env(tmp_path_factory):
    if not ANSIBLE_INVENTORY.exists() or not ANSIBLE.exists():
        pytest.skip(f"{ANSIBLE} not installed (pip install 'pscluster[test]')")
    home = tmp_path_factory.mktemp("ansible-home")
    return {**_ansible_env(home), "ANSIBLE_INVENTORY_ENABLED": "yaml,ini", "COLUMNS": "1000"}, home


@pytest.fixture(scope="module")
def ansible_results(ansible_env):
    """Per inventory, what ansible makes of each pattern; and the CLI's answers: all in parallel."""
    env, home = ansible_env
    running = {path: subprocess.Popen([sys.executable, str(HARNESS)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, env=env, cwd=home)
               for path in _jobs()}
    cli = {pattern: subprocess.Popen([str(ANSIBLE), "all", "-i", str(STYLES), "--list-hosts", "--limit", pattern],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=home)
           for pattern in CLI_PATTERNS}
    results = {}
    for path, process in running.items():
        stdout, stderr = process.communicate(json.dumps({"inventory": str(path), "patterns": _jobs()[path]}),
                                             timeout=120)
        assert process.returncode == 0, stderr
        results[path] = json.loads(stdout)
    return results, {pattern: process.communicate(timeout=120) for pattern, process in cli.items()}


def _compare(path: Path, pattern: str, expected: dict) -> None:
    inventory = load_inventory(str(path))
    if expected["error"] is not None:
        with pytest.raises(UsageError) as caught:
            select(inventory, pattern)
        assert expected["error"] in caught.value.message
        return
    selection = select(inventory, pattern)
    assert set(selection.hosts) == set(expected["hosts"]), pattern
    assert list(selection.warnings) == expected["warnings"], pattern


@pytest.mark.parametrize("pattern", STYLE_PATTERNS)
def test_limit_agrees_with_ansible_on_the_styles_fixture(ansible_results, pattern):
    _compare(STYLES, pattern, ansible_results[0][STYLES][pattern])


@pytest.mark.parametrize("path", CHECKED, ids=[path.name for path in CHECKED])
def test_limit_agrees_with_ansible_on_every_checked_inventory(ansible_results, path):
    for pattern in COMMON_PATTERNS:
        _compare(path, pattern, ansible_results[0][path][pattern])


@pytest.mark.parametrize("pattern", CLI_PATTERNS)
def test_the_harness_answers_as_the_ansible_command(ansible_results, pattern):
    stdout, stderr = ansible_results[1][pattern]
    hosts = [line.strip() for line in stdout.splitlines()[1:]] if "hosts (" in stdout else []
    warnings = [line.split("[WARNING]: ", 1)[1].strip() for line in stderr.splitlines() if "[WARNING]: " in line]
    expected = ansible_results[0][STYLES][pattern]
    # as sets: Ansible orders the groups below all's children in set order (hash-seeded per process)
    assert sorted(hosts) == sorted(expected["hosts"]), stdout
    assert [warning for warning in warnings if warning != "No hosts matched, nothing to do"] == expected["warnings"]


def test_the_fixture_covers_every_style():
    """Hand-checked against ansible-inventory: what each style of the fixture expands to."""
    inventory = load_inventory(str(STYLES))
    assert inventory.hosts_of("ps") == ("mail0.example.com", "mail1.example.com")             # [:1]
    assert inventory.hosts_of("worker") == ("gpu01", "gpu03", "gpu05", "nodea", "nodeb", "nodec",
                                            "big0", "big5", "big10")                           # [01:05:2], [a:c]
    ports = {host.name: host.ssh_port for host in inventory.hosts}
    assert (ports["gpu01"], ports["gpu03"], ports["nodea"], ports["eval7"], ports["edge"]) == \
        (2200, 2203, 2201, 2207, 2222)      # '2200' in [worker:vars], "2203" in host_vars/gpu03, node[a:c]:2201
    gpu03 = inventory.host("gpu03")
    assert (gpu03.workdir, gpu03.key_file, gpu03.connect_timeout, gpu03.slots[0].count) == \
        ("/srv/gpu03", "~/.ssh/lab_ed25519", 7, 2)
    assert inventory.host("big5").become_user == "trainer"
    assert inventory.host("control").connection == "local"


def test_limit_files_are_refused_with_a_hint():
    with pytest.raises(UsageError, match="limit files"):
        select(load_inventory(str(STYLES)), "@hosts.txt")
