"""--limit host patterns (issue 12 item 3): semantics, Ansible agreement, required roles."""
from __future__ import annotations

import json

import pytest

from cluster.errors import UsageError
from cluster.inventory import load_inventory
from cluster.inventory.patterns import apply_limit, required_roles, select_hosts

from .test_inventory_sources import FIXTURES, run_ansible_inventory

INI = FIXTURES / "hosts.ini"      # chief: a; ps: a, b; worker: a, b, c; gpu: children worker

PATTERNS = {
    "all": ["node-a", "node-b", "node-c"],
    "node-a,node-c": ["node-a", "node-c"],
    "node-a:node-c": ["node-a", "node-c"],
    "all:!node-c": ["node-a", "node-b"],
    "worker:&ps": ["node-a", "node-b"],
    "worker:&ps:!node-a": ["node-b"],
    "!node-a": ["node-b", "node-c"],
    "node-*": ["node-a", "node-b", "node-c"],
    "node-[bc]": ["node-b", "node-c"],
    "~node-[ab]": ["node-a", "node-b"],
    "chief,node-c": ["node-a", "node-c"],
    "g*:!ps": ["node-c"],
    "!ps:gpu": ["node-c"],             # plain terms first, then exclusions, whatever the order
}


@pytest.mark.parametrize("pattern, expected", PATTERNS.items(), ids=list(PATTERNS))
def test_select_hosts(pattern, expected):
    assert select_hosts(load_inventory(str(INI)), pattern) == expected


@pytest.fixture(scope="module")
def ansible_limits(tmp_path_factory):
    return run_ansible_inventory(tmp_path_factory, {pattern: ["-i", str(INI), "--limit", pattern]
                                                    for pattern in CROSS_CHECKED})


# One ansible-inventory per pattern (~1.5 s of CPU each): the ones that exercise each rule.
CROSS_CHECKED = ["node-a:node-c", "worker:&ps:!node-a", "!node-a", "node-[bc]", "~node-[ab]", "!ps:gpu"]


@pytest.mark.parametrize("pattern", CROSS_CHECKED)
def test_ansible_inventory_limit_agrees(ansible_limits, pattern):
    _, stdout, stderr = ansible_limits[pattern]
    assert sorted(json.loads(stdout)["_meta"]["hostvars"]) == PATTERNS[pattern], stderr


def test_apply_limit_keeps_roles_groups_and_host_order():
    inventory = load_inventory(str(INI))
    limited = apply_limit(inventory, "all:!node-b", required_roles("async", inventory))
    assert [host.name for host in limited.hosts] == ["node-a", "node-c"]
    assert limited.hosts_of("ps") == ("node-a",) and limited.hosts_of("worker") == ("node-a", "node-c")
    assert dict(limited.groups)["gpu"] == ("node-a", "node-c")
    assert apply_limit(inventory, None) is inventory


@pytest.mark.parametrize("pattern, mode, message", [
    ("nothing", "async", "--limit 'nothing' matches no host"),
    ("node-c", "async", "--limit 'node-c' leaves no chief host"),
    ("node-c:node-b", "async", "--limit 'node-c:node-b' leaves no chief host"),
    ("all:!node-a:!node-b", "sync-ps", "leaves no ps host"),
    ("node-a,~[", "async", "bad regex"),     # without a comma, "~[" is "~" (every host), as in Ansible
    (",", "async", "empty pattern"),
])
def test_limit_errors_name_the_pattern_and_role(pattern, mode, message):
    inventory = load_inventory(str(INI))
    with pytest.raises(UsageError, match=message.replace("[", r"\[")) as caught:
        apply_limit(inventory, pattern, required_roles(mode, inventory))
    assert caught.value.exit_code == 2


def test_limit_may_drop_a_role_the_mode_does_not_use():
    inventory = load_inventory(str(INI))
    limited = apply_limit(inventory, "node-c", required_roles("sync", inventory))
    assert limited.role_hosts == (("worker", ("node-c",)),)
