"""Inventory loading (cluster/inventory/): structure, precedence, errors.

Every error test checks the InventoryError's file, line and key path, and the first line of
its text, which is what the user reads: ``FILE:LINE: KEY.PATH: message``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.errors import InventoryError
from cluster.inventory import HostConfig, expand_host_pattern, load_inventory

from .conftest import INVENTORIES

SHIPPED = sorted(INVENTORIES.glob("*.yaml"))


def load_error(write_inventory, text: str, name: str = "lab.yaml") -> InventoryError:
    path = write_inventory(text, name)
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    return caught.value


def first_line(error: Exception) -> str:
    return str(error).splitlines()[0]


def slots(host: HostConfig) -> dict[str, tuple[int, tuple[str, ...] | None, tuple[int, ...] | None]]:
    """role -> (count, gpus, ports) of one host."""
    return {slot.role: (slot.count, slot.gpus, slot.ports) for slot in host.slots}


# ----------------------------------------------------------------------------- the issue's example

ISSUE_EXAMPLE = """\
all:
  vars:
    ansible_user: root
    ansible_ssh_private_key_file: ~/.ssh/id_ed25519
    pscluster_python: /opt/pscluster/venv/bin/python
  children:
    chief:  {hosts: {node-a: }}
    ps:     {hosts: {node-a: {ansible_host: 127.77.0.2}, node-b: {ansible_host: 127.77.0.3}}}
    worker:
      hosts:
        node-a:
        # node-b runs two workers,
        # one GPU each
        node-b: {worker_gpus: [[0], one]}
"""


def test_issue_example_error_names_file_line_and_key_path(write_inventory):
    error = load_error(write_inventory, ISSUE_EXAMPLE)
    assert (error.file, error.line, error.key_path) == ("lab.yaml", 14, "worker.hosts.node-b.worker_gpus[1]")
    assert first_line(error) == \
        'lab.yaml:14: worker.hosts.node-b.worker_gpus[1]: expected a GPU index or a list of them, got "one"'
    assert error.hint  # what to write instead
    assert error.exit_code == 2


def test_issue_example_loads_once_fixed(write_inventory):
    path = write_inventory(ISSUE_EXAMPLE.replace("[[0], one]", "[[0], [1]]"))
    inventory = load_inventory(path)
    assert inventory.role_hosts == (("chief", ("node-a",)), ("ps", ("node-a", "node-b")),
                                    ("worker", ("node-a", "node-b")))
    node_a, node_b = inventory.hosts
    assert (node_a.name, node_a.address, node_a.user, node_a.key_file, node_a.python) == \
        ("node-a", "127.77.0.2", "root", "~/.ssh/id_ed25519", "/opt/pscluster/venv/bin/python")
    assert slots(node_a) == {"chief": (1, None, None), "ps": (1, None, None), "worker": (1, None, None)}
    assert slots(node_b) == {"ps": (1, None, None), "worker": (2, ("0", "1"), None)}


# ----------------------------------------------------------------------------- file-level errors

@pytest.mark.parametrize("text, line", [
    ("all:\n  vars:\n    a: b: c\n", 3),                           # a second ': ' on one line
    ("all:\n\tvars: {}\n", 2),                                     # a tab
    ("all:\n  children:\n    ps:\n      hosts: [a, b\n", 5),       # unclosed flow list: at the end
])
def test_invalid_yaml_names_the_line(write_inventory, text, line):
    error = load_error(write_inventory, text)
    assert (error.file, error.line, error.key_path) == ("lab.yaml", line, "")
    assert first_line(error).startswith(f"lab.yaml:{line}: invalid YAML: ")
    assert error.hint


def test_missing_file(write_inventory):
    with pytest.raises(InventoryError) as caught:
        load_inventory("nope.yaml")
    assert (caught.value.file, caught.value.line, caught.value.key_path) == ("nope.yaml", None, "")
    assert first_line(caught.value) == "nope.yaml: no such file"


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n"])
def test_empty_file(write_inventory, text):
    error = load_error(write_inventory, text)
    assert (error.file, error.line, error.key_path) == ("lab.yaml", None, "")
    assert first_line(error) == "lab.yaml: the inventory is empty"
    assert error.hint


@pytest.mark.parametrize("text, got", [
    ("- node-a\n- node-b\n", "a list"),
    ("node-a\n", '"node-a"'),
])
def test_top_level_must_be_a_mapping(write_inventory, text, got):
    error = load_error(write_inventory, text)
    assert (error.line, error.key_path) == (1, "")
    assert first_line(error) == f"lab.yaml:1: expected a mapping of groups, got {got}"
    assert "all:" in error.hint


def test_display_name_is_used_in_errors(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("all:\n  vars:\n    pscluster_nope: 1\n")
    with pytest.raises(InventoryError) as caught:
        load_inventory(str(path), display_name="inventories/x.yaml")
    assert (caught.value.file, caught.value.line) == ("inventories/x.yaml", 3)


# ----------------------------------------------------------------------------- group structure errors

@pytest.mark.parametrize("text, line, key_path, message", [
    pytest.param("""\
        all:
          children:
            worker:
              hosts:
                node-a:
              node-b:
        """, 6, "worker.node-b", "unknown group key 'node-b'", id="unknown-group-key"),
    pytest.param("""\
        all:
          children:
            worker:
              hosts: [node-a, node-b]
        """, 4, "worker.hosts", "expected a mapping of host names, got a list", id="hosts-list"),
    pytest.param("""\
        all:
          children:
            worker:
              hosts: node-a
        """, 4, "worker.hosts", 'expected a mapping of host names, got "node-a"', id="hosts-scalar"),
    pytest.param("""\
        all:
          children:
            worker:
              hosts:
                node-a: [1, 2]
        """, 5, "worker.hosts.node-a", "host variables must be a mapping, got a list", id="host-vars-list"),
    pytest.param("""\
        all:
          children:
            worker:
              vars: [a]
        """, 4, "worker.vars", "expected a mapping of variables, got a list", id="vars-list"),
    pytest.param("""\
        all:
          children: [worker]
        """, 2, "all.children", "expected a mapping of groups, got a list", id="children-list"),
    pytest.param("""\
        all:
          children:
            worker: 3
        """, 3, "worker", "a group must be a mapping with hosts/vars/children, got 3", id="group-scalar"),
])
def test_group_structure_errors(write_inventory, text, line, key_path, message):
    error = load_error(write_inventory, text)
    assert (error.file, error.line, error.key_path) == ("lab.yaml", line, key_path)
    assert first_line(error) == f"lab.yaml:{line}: {key_path}: {message}"


def test_unknown_group_key_hints_at_indentation(write_inventory):
    error = load_error(write_inventory, """\
        all:
          children:
            worker:
              hosts:
                node-a:
              node-b:
        """)
    assert "indented" in error.hint


def test_group_containing_itself(write_inventory):
    error = load_error(write_inventory, """\
        all:
          children:
            g1:
              children:
                g2:
                  children:
                    g1:
        """)
    assert (error.line, error.key_path) == (3, "g1")
    assert "contains itself" in error.message


# Key paths start at the innermost group, as in the issue's example
# (worker.hosts.node-b.worker_gpus[1], not all.children.worker.hosts...). The YAML-level
# checks in yamlsrc.py must follow the same convention as every other error.
@pytest.mark.parametrize("text, line, key_path", [
    pytest.param("""\
        all:
          children:
            worker:
              hosts:
                node-a:
                  worker_tasks: 1
                  worker_tasks: 2
        """, 7, "worker.hosts.node-a.worker_tasks", id="duplicate-key"),
    pytest.param("""\
        all:
          vars: &common {ansible_user: root}
          children:
            worker:
              vars:
                <<: *common
        """, 6, "worker.vars", id="merge-key"),
])
def test_yaml_level_errors_use_the_innermost_group_key_path(write_inventory, text, line, key_path):
    error = load_error(write_inventory, text)
    assert (error.file, error.line, error.key_path) == ("lab.yaml", line, key_path)


def test_duplicate_key_names_both_lines(write_inventory):
    error = load_error(write_inventory, """\
        all:
          vars:
            ansible_user: a
            ansible_user: b
        """)
    assert (error.line, error.key_path) == (4, "all.vars.ansible_user")
    assert first_line(error) == "lab.yaml:4: all.vars.ansible_user: duplicate key (first defined on line 3)"


# ----------------------------------------------------------------------------- host ranges

@pytest.mark.parametrize("pattern, expected", [
    ("node-a", ["node-a"]),
    ("node-[01:04]", ["node-01", "node-02", "node-03", "node-04"]),
    ("node-[1:3]", ["node-1", "node-2", "node-3"]),
    ("node-[8:11]", ["node-8", "node-9", "node-10", "node-11"]),
    ("node-[0:2]", ["node-0", "node-1", "node-2"]),            # a lone 0 is not padding
    ("gpu[a:c]", ["gpua", "gpub", "gpuc"]),
    ("[a:c].lab", ["a.lab", "b.lab", "c.lab"]),
    ("n[1:9:3]", ["n1", "n4", "n7"]),
    ("n[01:10:4]", ["n01", "n05", "n09"]),
    ("n[a:e:2]", ["na", "nc", "ne"]),
    ("r[1:2]-n[a:b]", ["r1-na", "r1-nb", "r2-na", "r2-nb"]),
    ("n[3:3]", ["n3"]),
    # issue 29 item 2: every form Ansible expands (checked with ansible-inventory)
    ("mail[:2].example.com", ["mail0.example.com", "mail1.example.com", "mail2.example.com"]),
    ("n[:04:2]", ["n0", "n2", "n4"]),
    ("n[0:10:5]", ["n0", "n5", "n10"]),
    ("h[y:B]", ["hy", "hz", "hA", "hB"]),
    ("n[008:010]", ["n008", "n009", "n010"]),
])
def test_expand_host_pattern(pattern, expected):
    assert expand_host_pattern(pattern) == expected


@pytest.mark.parametrize("pattern", ["node-[04:01]", "node-[c:a]", "node-[a:01]", "node-[1:4:0]", "node-[aa:bb]",
                                     "node-[01:4]", "node-[1:]", "node-[1:2:3:4]", "node-[1:3"])
def test_expand_host_pattern_rejects_bad_ranges(pattern):
    with pytest.raises(ValueError):
        expand_host_pattern(pattern)


@pytest.mark.parametrize("written, expected", [
    ("node-a:2200", ("node-a", 2200)), ("10.0.0.5:22", ("10.0.0.5", 22)), ("[::1]:2222", ("::1", 2222)),
    ("node[1:3]:22", ("node[1:3]", 22)), ("::1", ("::1", None)), ("node-a", ("node-a", None)),
])
def test_host_port_suffix_as_ansible_reads_it(written, expected):
    from cluster.inventory.hostnames import split_host_port
    assert split_host_port(written) == expected


def test_host_range_in_inventory(write_inventory):
    path = write_inventory("""\
        all:
          children:
            chief:
              hosts:
                node-01:
            ps:
              hosts:
                node-[01:02]:
                  ansible_user: ops
            worker:
              hosts:
                node-[01:04]:
        """)
    inventory = load_inventory(path)
    assert inventory.role_hosts == (("chief", ("node-01",)), ("ps", ("node-01", "node-02")),
                                    ("worker", ("node-01", "node-02", "node-03", "node-04")))
    assert [host.name for host in inventory.hosts] == ["node-01", "node-02", "node-03", "node-04"]
    assert [host.user for host in inventory.hosts] == ["ops", "ops", None, None]
    assert [host.address for host in inventory.hosts] == ["node-01", "node-02", "node-03", "node-04"]


@pytest.mark.parametrize("pattern", ["node-[04:01]", "node-[a:01]", "node-[1:4:0]"])
def test_bad_host_range_in_inventory(write_inventory, pattern):
    error = load_error(write_inventory, f"""\
        all:
          children:
            worker:
              hosts:
                node-a:
                {pattern}:
        """)
    assert (error.file, error.line, error.key_path) == ("lab.yaml", 6, f"worker.hosts.{pattern}")
    assert first_line(error).startswith(f"lab.yaml:6: worker.hosts.{pattern}: ")


# ----------------------------------------------------------------------------- groups and precedence

NESTED = """\
all:
  children:
    chief:
      hosts:
        head:
    ps:
      children:
        rack1:
          hosts:
            r1-[1:2]:
    worker:
      hosts:
        w0:
      children:
        rack1:
        gpu:
          hosts:
            g1:
    evaluator:
      hosts:
        ev:
    monitoring:
      hosts:
        mon:
"""


def test_membership_through_children(write_inventory):
    inventory = load_inventory(write_inventory(NESTED))
    # A group's own hosts first, then those of its children (as Ansible orders them).
    assert inventory.role_hosts == (
        ("chief", ("head",)),
        ("ps", ("r1-1", "r1-2")),
        ("worker", ("w0", "r1-1", "r1-2", "g1")),
        ("evaluator", ("ev",)),
    )
    assert inventory.hosts_of("ps") == ("r1-1", "r1-2")
    assert inventory.hosts_of("nothing") == ()
    by_name = {host.name: host for host in inventory.hosts}
    assert set(by_name) == {"head", "r1-1", "r1-2", "w0", "g1", "ev", "mon"}
    assert [slot.role for slot in by_name["r1-1"].slots] == ["ps", "worker"]
    assert by_name["mon"].slots == ()            # in no role group: part of the inventory, no tasks


PRECEDENCE = """\
all:
  vars:
    pscluster_workdir: /all
    pscluster_python: /all/python
  children:
    chief:
      hosts:
        head:
    worker:
      vars:
        pscluster_workdir: /worker
      hosts:
        w1:
      children:
        gpu:
          vars:
            pscluster_workdir: /gpu
          hosts:
            g1:
            g2:
              pscluster_workdir: /host
    ps:
      vars:
        pscluster_workdir: /ps
      hosts:
        w1:
        p1:
        e1:
    evaluator:
      vars:
        pscluster_workdir: /evaluator
      hosts:
        e1:
"""
# Hand-checked: host beats child group beats parent group beats all; between groups at the
# same depth the later name wins ("worker" > "ps" > "evaluator"), whatever the file order.
PRECEDENCE_WORKDIRS = {
    "head": "/all",        # only in chief: all.vars
    "w1": "/worker",       # worker and ps at depth 1: "worker" sorts last
    "g1": "/gpu",          # gpu (depth 2) beats worker (depth 1)
    "g2": "/host",         # its own variable beats every group
    "p1": "/ps",
    "e1": "/ps",           # ps and evaluator at depth 1: "ps" sorts last, though evaluator comes later
}


def test_variable_precedence(write_inventory):
    inventory = load_inventory(write_inventory(PRECEDENCE))
    assert {host.name: host.workdir for host in inventory.hosts} == PRECEDENCE_WORKDIRS
    assert {host.python for host in inventory.hosts} == {"/all/python"}


def test_same_host_variable_twice_with_different_values(write_inventory):
    error = load_error(write_inventory, """\
        all:
          children:
            ps:
              hosts:
                node-a: {pscluster_python: /a/python}
            worker:
              hosts:
                node-a:
                  pscluster_python: /b/python
        """)
    assert (error.file, error.line, error.key_path) == ("lab.yaml", 9, "worker.hosts.node-a.pscluster_python")
    assert first_line(error) == ("lab.yaml:9: worker.hosts.node-a.pscluster_python: host 'node-a' sets "
                                 "pscluster_python twice with different values (also on line 5)")


def test_same_host_variable_twice_with_the_same_value_is_fine(write_inventory):
    inventory = load_inventory(write_inventory("""\
        all:
          children:
            ps:
              hosts:
                node-a: {pscluster_python: /a/python}
            worker:
              hosts:
                node-a: {pscluster_python: /a/python}
        """))
    assert inventory.host("node-a").python == "/a/python"


def test_same_group_variable_twice_with_different_values(write_inventory):
    error = load_error(write_inventory, """\
        all:
          children:
            ps:
              children:
                rack1:
                  vars: {pscluster_workdir: /a}
            worker:
              children:
                rack1:
                  vars:
                    pscluster_workdir: /b
        """)
    assert (error.line, error.key_path) == (11, "rack1.vars.pscluster_workdir")
    assert first_line(error) == \
        "lab.yaml:11: rack1.vars.pscluster_workdir: set twice for group 'rack1' with different values"


# ----------------------------------------------------------------------------- settings

@pytest.mark.parametrize("typo, meant", [
    ("pscluster_pyhton", "pscluster_python"),          # two letters swapped
    ("pscluster_workdr", "pscluster_workdir"),         # a letter missing near the end
    ("pscluster_pythonn", "pscluster_python"),         # a letter too many
    ("pscluster_port", "pscluster_port_base"),         # cut short
    ("pscluster_port_bse", "pscluster_port_base"),     # a letter missing mid-word
    ("pscluster_workir", "pscluster_workdir"),         # a letter missing mid-word
])
def test_unknown_pscluster_key_suggests_the_known_one(write_inventory, typo, meant):
    error = load_error(write_inventory, f"""\
        all:
          vars:
            pscluster_python: /py
            {typo}: x
        """)
    assert (error.line, error.key_path) == (4, f"all.vars.{typo}")
    assert first_line(error) == f"lab.yaml:4: all.vars.{typo}: unknown setting '{typo}'"
    assert error.hint == f"did you mean {meant}?"


def test_unknown_pscluster_key_far_from_any_lists_the_known_ones(write_inventory):
    error = load_error(write_inventory, """\
        all:
          children:
            worker:
              hosts:
                node-a:
                  pscluster_colour: blue
        """)
    assert (error.line, error.key_path) == (6, "worker.hosts.node-a.pscluster_colour")
    assert error.hint.startswith("known settings: ")
    assert "pscluster_port_base" in error.hint


@pytest.mark.parametrize("where, line, key_path", [
    ("host", 5, "worker.hosts.node-a.worker_gpu"),
    ("group", 4, "worker.vars.worker_gpu"),
])
def test_unknown_role_suffix(write_inventory, where, line, key_path):
    text = ("all:\n  children:\n    worker:\n      hosts:\n        node-a: {worker_gpu: [0]}\n" if where == "host"
            else "all:\n  children:\n    worker:\n      vars: {worker_gpu: [0]}\n      hosts:\n        node-a:\n")
    error = load_error(write_inventory, text)
    assert (error.line, error.key_path) == (line, key_path)
    assert first_line(error) == f"lab.yaml:{line}: {key_path}: unknown task setting 'worker_gpu'"
    assert error.hint == "per-role settings are worker_tasks, worker_gpus, worker_ports"


def test_unknown_role_suffix_of_another_role(write_inventory):
    error = load_error(write_inventory, "all:\n  vars:\n    ps_task: 2\n")
    assert (error.line, error.key_path) == (3, "all.vars.ps_task")
    assert error.hint == "per-role settings are ps_tasks, ps_gpus, ps_ports"


@pytest.mark.parametrize("key", ["ansible_password", "ansible_ssh_pass", "ansible_ssh_password",
                                 "ansible_become_password", "ansible_become_pass", "ansible_sudo_pass"])
def test_passwords_are_refused(write_inventory, key):
    error = load_error(write_inventory, f"""\
        all:
          children:
            worker:
              hosts:
                node-a:
                  {key}: hunter2
        """)
    assert (error.line, error.key_path) == (6, f"worker.hosts.node-a.{key}")
    assert first_line(error) == f"lab.yaml:6: worker.hosts.node-a.{key}: passwords are not accepted in inventories"
    assert "key" in error.hint and "agent" in error.hint


def test_password_in_all_vars_is_refused(write_inventory):
    error = load_error(write_inventory, "all:\n  vars:\n    ansible_password: hunter2\n")
    assert (error.line, error.key_path) == (3, "all.vars.ansible_password")


@pytest.mark.parametrize("key, value", [("pscluster_mode", "sync"), ("pscluster_firewall", "true")])
@pytest.mark.parametrize("where, line, prefix", [
    ("group", 5, "worker.vars"),
    ("host", 8, "worker.hosts.node-a"),
])
def test_cluster_wide_settings_only_in_all_vars(write_inventory, key, value, where, line, prefix):
    group_var = f"        {key}: {value}" if where == "group" else "        ansible_user: me"
    host_var = f"          {key}: {value}" if where == "host" else "          ansible_port: 22"
    text = "\n".join(["all:", "  children:", "    worker:", "      vars:", group_var,
                      "      hosts:", "        node-a:", host_var, ""])
    error = load_error(write_inventory, text)
    assert (error.line, error.key_path) == (line, f"{prefix}.{key}")
    assert first_line(error) == f"lab.yaml:{line}: {prefix}.{key}: {key} applies to the whole cluster"
    assert error.hint == "set it under all.vars"


def test_cluster_wide_settings_in_all_vars(write_inventory):
    inventory = load_inventory(write_inventory("""\
        all:
          vars:
            pscluster_mode: sync-ps
            pscluster_firewall: true
          children:
            worker:
              hosts:
                node-a:
        """))
    assert (inventory.mode, inventory.firewall) == ("sync-ps", True)
    assert (inventory.mode_origin.line, inventory.mode_origin.key_path) == (3, "all.vars.pscluster_mode")


def test_defaults_without_settings(write_inventory):
    inventory = load_inventory(write_inventory("all:\n  children:\n    worker:\n      hosts:\n        node-a:\n"))
    assert (inventory.mode, inventory.mode_origin, inventory.firewall, inventory.name) == (None, None, False, "lab")
    host = inventory.host("node-a")
    assert (host.address, host.connection, host.ssh_port, host.user, host.key_file, host.python, host.workdir,
            host.port_base, host.host_key_policy, host.known_hosts, host.connect_timeout, host.env,
            host.secret_env, host.intra_op_threads, host.inter_op_threads) == \
        ("node-a", "ssh", None, None, None, None, None, 2222, "reject", None, 10.0, (), (), None, None)
    assert slots(host) == {"worker": (1, None, None)}


def test_all_settings_are_read(write_inventory):
    inventory = load_inventory(write_inventory("""\
        all:
          vars:
            ansible_port: 2200
            pscluster_host_key_policy: accept-new
            pscluster_known_hosts: /etc/ssh/lab_known_hosts
            pscluster_connect_timeout: 5
            pscluster_env: {OMP_NUM_THREADS: 2, TF_ENABLE_ONEDNN_OPTS: false, NAME: x}
            pscluster_secret_env: [WANDB_API_KEY]
            pscluster_intra_op_threads: 4
            pscluster_inter_op_threads: 2
          children:
            worker:
              hosts:
                node-a:
                  ansible_host: 10.0.0.7
                  ansible_python_interpreter: /usr/bin/python3
                  pscluster_port_base: 3000
        """))
    host = inventory.host("node-a")
    assert (host.address, host.ssh_port, host.host_key_policy, host.known_hosts, host.connect_timeout) == \
        ("10.0.0.7", 2200, "accept-new", "/etc/ssh/lab_known_hosts", 5.0)
    assert host.env == (("OMP_NUM_THREADS", "2"), ("TF_ENABLE_ONEDNN_OPTS", "false"), ("NAME", "x"))
    assert host.secret_env == ("WANDB_API_KEY",)
    assert (host.intra_op_threads, host.inter_op_threads, host.port_base) == (4, 2, 3000)
    assert host.python == "/usr/bin/python3"      # ansible_python_interpreter when pscluster_python is unset


@pytest.mark.parametrize("line_text, key_path, message", [
    ("ansible_port: 70000", "worker.hosts.node-a.ansible_port",
     "expected an SSH port between 1 and 65535, got 70000"),
    ("ansible_port: 0", "worker.hosts.node-a.ansible_port", "expected an SSH port between 1 and 65535, got 0"),
    ("ansible_port: ssh", "worker.hosts.node-a.ansible_port", 'expected an SSH port, got "ssh"'),
    ("pscluster_port_base: 80", "worker.hosts.node-a.pscluster_port_base",
     "expected a port number between 1024 and 65000, got 80"),
    ("pscluster_port_base: '22x22'", "worker.hosts.node-a.pscluster_port_base", 'expected a port number, got "22x22"'),
    ("pscluster_port_base: true", "worker.hosts.node-a.pscluster_port_base", "expected a port number, got true"),
    ("worker_ports: [99999]", "worker.hosts.node-a.worker_ports[0]",
     "expected a port number between 1 and 65535, got 99999"),
    ("worker_ports: 0", "worker.hosts.node-a.worker_ports", "expected a port number between 1 and 65535, got 0"),
])
def test_bad_ports(write_inventory, line_text, key_path, message):
    error = load_error(write_inventory, f"all:\n  children:\n    worker:\n      hosts:\n        node-a:\n"
                                        f"          {line_text}\n")
    assert (error.file, error.line, error.key_path) == ("lab.yaml", 6, key_path)
    assert first_line(error) == f"lab.yaml:6: {key_path}: {message}"
    assert error.hint or "between" in message            # e.g. "write a whole number, e.g. 22"


def test_integer_strings_are_integers_as_in_ansible(write_inventory):
    """Issue 29 item 1: Ansible converts "2222" where it wants a number; so does pscluster."""
    inventory = load_inventory(write_inventory("""\
        all:
          vars: {ansible_port: "2200", ansible_ssh_timeout: "7", pscluster_port_base: " 3000 "}
          children:
            worker: {hosts: {node-a: {worker_tasks: "2", worker_ports: ["4001", 4002]}}}
        """))
    host = inventory.hosts[0]
    assert (host.ssh_port, host.connect_timeout, host.port_base) == (2200, 7, 3000)
    assert (host.slots[0].count, host.slots[0].ports) == (2, (4001, 4002))


@pytest.mark.parametrize("line_text, key_path, message", [
    ("pscluster_host_key_policy: accept", "all.vars.pscluster_host_key_policy",
     'expected one of reject, accept-new, got "accept"'),
    ("pscluster_mode: fast", "all.vars.pscluster_mode", 'expected one of async, sync, sync-ps, between-graph, got "fast"'),
    ("pscluster_firewall: yes please", "all.vars.pscluster_firewall", 'expected true or false, got "yes please"'),
    ("ansible_connection: winrm", "all.vars.ansible_connection",
     'expected one of ssh, local, paramiko, smart, slurm, docker, community.docker.docker, got "winrm"'),
    ("ansible_docker_extra_args: \"-H 'unix:///x\"", "all.vars.ansible_docker_extra_args",
     "cannot split the docker arguments: No closing quotation"),
    ("pscluster_python: ''", "all.vars.pscluster_python", "expected an interpreter path, got an empty value"),
    ("pscluster_workdir: [a]", "all.vars.pscluster_workdir", "expected a directory path, got a list"),
    ("pscluster_connect_timeout: 0", "all.vars.pscluster_connect_timeout",
     "expected seconds between 1 and 600, got 0"),
    ("pscluster_secret_env: WANDB_API_KEY", "all.vars.pscluster_secret_env",
     'expected a list of environment variable names, got "WANDB_API_KEY"'),
])
def test_bad_setting_values(write_inventory, line_text, key_path, message):
    error = load_error(write_inventory, f"all:\n  vars:\n    {line_text}\n  children:\n    worker:\n"
                                        f"      hosts:\n        node-a:\n")
    assert (error.line, error.key_path) == (3, key_path)
    assert first_line(error) == f"lab.yaml:3: {key_path}: {message}"


@pytest.mark.parametrize("env_text, line, key_path, message", [
    ("    pscluster_env:\n      1BAD: x\n", 4, "all.vars.pscluster_env.1BAD",
     "'1BAD' is not a valid environment variable name"),
    ("    pscluster_env:\n      A-B: x\n", 4, "all.vars.pscluster_env.A-B",
     "'A-B' is not a valid environment variable name"),
    ("    pscluster_env: [OMP_NUM_THREADS]\n", 3, "all.vars.pscluster_env",
     "expected a mapping NAME: value, got a list"),
    ("    pscluster_env:\n      A: [1]\n", 4, "all.vars.pscluster_env.A", "expected a string or number, got a list"),
    ("    pscluster_env:\n      A:\n", 4, "all.vars.pscluster_env.A", "expected a string or number, got None"),
    ("    pscluster_secret_env: [OK, 2BAD]\n", 3, "all.vars.pscluster_secret_env[1]",
     "'2BAD' is not a valid environment variable name"),
    # N12 (issue 25): "$" matched before a final newline, so these passed
    ('    pscluster_env:\n      "TF_CONFIG\\n": x\n', 4, "all.vars.pscluster_env.'TF_CONFIG\\n'",
     "'TF_CONFIG\\n' is not a valid environment variable name"),
    ('    pscluster_secret_env: ["KEY\\n"]\n', 3, "all.vars.pscluster_secret_env[0]",
     "'KEY\\n' is not a valid environment variable name"),
    # ... a NUL in a value passed loading, then Popen's ValueError left only "monitor process died"
    ('    pscluster_env:\n      A: "x\\0y"\n', 4, "all.vars.pscluster_env.A", "the value of A holds a NUL character"),
    ("    pscluster_env:\n      1: x\n", 4, "all.vars.pscluster_env.1", "'1' is not a valid environment variable name"),
])
def test_bad_environment(write_inventory, env_text, line, key_path, message):
    error = load_error(write_inventory, "all:\n  vars:\n" + env_text +
                       "  children:\n    worker:\n      hosts:\n        node-a:\n")
    assert (error.line, error.key_path) == (line, key_path)
    assert first_line(error) == f"lab.yaml:{line}: {key_path}: {message}"


@pytest.mark.parametrize("name", ["TF_CONFIG", "CUDA_VISIBLE_DEVICES", "PSCLUSTER_TASK", "PSCLUSTER_CLUSTER",
                                  "PSCLUSTER_INTRA_OP_THREADS", "PSCLUSTER_PORT"])
def test_reserved_environment(write_inventory, name):
    error = load_error(write_inventory, f"""\
        all:
          children:
            worker:
              hosts:
                node-a:
                  pscluster_env:
                    OMP_NUM_THREADS: 1
                    {name}: '0'
        """)
    assert (error.line, error.key_path) == (8, f"worker.hosts.node-a.pscluster_env.{name}")
    assert first_line(error) == f"lab.yaml:8: worker.hosts.node-a.pscluster_env.{name}: " \
                                f"{name} is set by pscluster for each task"
    assert "_gpus" in error.hint


# ----------------------------------------------------------------------------- task variables

@pytest.mark.parametrize("host_vars, expected", [
    ("{}", (1, None, None)),
    ("{worker_tasks: 3}", (3, None, None)),
    ("{worker_gpus: [0, [1, 2], []]}", (3, ("0", "1,2", ""), None)),
    ("{worker_gpus: [[]]}", (1, ("",), None)),
    ("{worker_tasks: 2, worker_gpus: [[0], [1]]}", (2, ("0", "1"), None)),
    ("{worker_ports: 2300}", (1, None, (2300,))),
    ("{worker_tasks: 2, worker_ports: [2300, 2400]}", (2, None, (2300, 2400))),
    ("{worker_gpus: [0, 1], worker_ports: [2300, 2301]}", (2, ("0", "1"), (2300, 2301))),
])
def test_task_variables(write_inventory, host_vars, expected):
    inventory = load_inventory(write_inventory(f"all:\n  children:\n    worker:\n      hosts:\n"
                                               f"        node-a: {host_vars}\n"))
    assert slots(inventory.host("node-a")) == {"worker": expected}


def test_task_variables_from_group_vars(write_inventory):
    inventory = load_inventory(write_inventory("""\
        all:
          children:
            ps:
              vars:
                ps_tasks: 2
              hosts:
                node-a:
                node-b: {ps_tasks: 1}
        """))
    assert slots(inventory.host("node-a")) == {"ps": (2, None, None)}
    assert slots(inventory.host("node-b")) == {"ps": (1, None, None)}


def test_task_variables_of_a_role_the_host_lacks_are_ignored(write_inventory):
    inventory = load_inventory(write_inventory("""\
        all:
          vars:
            worker_tasks: 2
          children:
            ps:
              hosts:
                node-a:
        """))
    assert slots(inventory.host("node-a")) == {"ps": (1, None, None)}


@pytest.mark.parametrize("host_vars, key_path, message", [
    ("{worker_tasks: 3, worker_gpus: [[0], [1]]}", "worker.hosts.node-a.worker_gpus",
     "lists 2 GPU masks but worker_tasks is 3"),
    ("{worker_tasks: 2, worker_ports: [2300]}", "worker.hosts.node-a.worker_ports",
     "lists 1 ports for 2 worker task(s) on node-a"),
    ("{worker_gpus: [[0], [1]], worker_ports: [2300, 2301, 2302]}", "worker.hosts.node-a.worker_ports",
     "lists 3 ports for 2 worker task(s) on node-a"),
    ("{worker_tasks: 2, worker_ports: [2300, 2300]}", "worker.hosts.node-a.worker_ports",
     "lists the same port twice"),
    ("{worker_tasks: 0}", "worker.hosts.node-a.worker_tasks", "expected a task count between 1 and 64, got 0"),
    ("{worker_tasks: two}", "worker.hosts.node-a.worker_tasks", 'expected a task count, got "two"'),
    ("{worker_gpus: 0}", "worker.hosts.node-a.worker_gpus", "expected a list with one GPU mask per task, got 0"),
    ("{worker_gpus: [-1]}", "worker.hosts.node-a.worker_gpus[0]", "expected a GPU index (0, 1, ...), got -1"),
    ("{worker_gpus: [[0, true]]}", "worker.hosts.node-a.worker_gpus[0][1]",
     "expected a GPU index (0, 1, ...), got true"),
    ("{worker_gpus: [gpu0]}", "worker.hosts.node-a.worker_gpus[0]",
     'expected a GPU index or a list of them, got "gpu0"'),
])
def test_task_variable_errors(write_inventory, host_vars, key_path, message):
    error = load_error(write_inventory, f"all:\n  children:\n    worker:\n      hosts:\n"
                                        f"        node-a: {host_vars}\n")
    assert (error.file, error.line, error.key_path) == ("lab.yaml", 5, key_path)
    assert first_line(error) == f"lab.yaml:5: {key_path}: {message}"
    if "GPU" in message or "ports" in message:
        assert error.hint


@pytest.mark.parametrize("host_vars, key_path", [
    ("{worker_gpus: []}", "worker.hosts.node-a.worker_gpus"),           # no task at all
    ("{worker_gpus: [[1, 1]]}", "worker.hosts.node-a.worker_gpus[0]"),   # one GPU twice in a mask
])
def test_task_variable_errors_without_fixed_wording(write_inventory, host_vars, key_path):
    error = load_error(write_inventory, f"all:\n  children:\n    worker:\n      hosts:\n"
                                        f"        node-a: {host_vars}\n")
    assert (error.line, error.key_path) == (5, key_path)


def test_gpu_error_in_a_block_list_names_its_own_line(write_inventory):
    error = load_error(write_inventory, """\
        all:
          children:
            worker:
              hosts:
                node-b:
                  worker_gpus:
                    - [0]
                    - [1, x]
        """)
    assert (error.line, error.key_path) == (8, "worker.hosts.node-b.worker_gpus[1][1]")


# ----------------------------------------------------------------------------- connection

@pytest.mark.parametrize("value, expected", [("local", "local"), ("ssh", "ssh"), ("paramiko", "ssh"),
                                             ("smart", "ssh")])
def test_ansible_connection(write_inventory, value, expected):
    inventory = load_inventory(write_inventory(f"all:\n  vars:\n    ansible_connection: {value}\n"
                                               f"  children:\n    worker:\n      hosts:\n        node-a:\n"))
    assert inventory.host("node-a").connection == expected


def test_local_connection_can_be_set_per_host(write_inventory):
    inventory = load_inventory(write_inventory("""\
        all:
          children:
            worker:
              hosts:
                here: {ansible_connection: local}
                there: {ansible_host: 10.0.0.2}
        """))
    assert [(host.name, host.connection, host.address) for host in inventory.hosts] == \
        [("here", "local", "here"), ("there", "ssh", "10.0.0.2")]


# ----------------------------------------------------------------------------- shipped inventories

def test_shipped_local_inventory():
    inventory = load_inventory(str(INVENTORIES / "local.yaml"))
    assert (inventory.name, inventory.mode, inventory.firewall) == ("local", "async", False)
    assert inventory.role_hosts == (("chief", ("localhost",)), ("ps", ("localhost",)), ("worker", ("localhost",)))
    (host,) = inventory.hosts
    assert (host.name, host.address, host.connection, host.port_base, host.env) == \
        ("localhost", "localhost", "local", 2222, (("OMP_NUM_THREADS", "1"),))
    assert slots(host) == {"chief": (1, None, None), "ps": (2, None, None), "worker": (2, None, None)}


def test_shipped_lab_inventory():
    inventory = load_inventory(str(INVENTORIES / "lab.yaml"))
    assert (inventory.name, inventory.mode) == ("lab", "async")
    assert inventory.role_hosts == (("chief", ("node-a",)), ("ps", ("node-a", "node-b")),
                                    ("worker", ("node-a", "node-b")))
    node_a, node_b = inventory.hosts
    for host, address in ((node_a, "198.51.100.10"), (node_b, "198.51.100.11")):
        assert (host.address, host.connection, host.user, host.key_file, host.python, host.workdir,
                host.port_base, host.host_key_policy) == \
            (address, "ssh", "pscluster", "~/.ssh/id_ed25519", "/opt/pscluster/venv/bin/python",
             "/opt/pscluster/work", 2222, "reject")
    assert slots(node_a) == {"chief": (1, None, None), "ps": (1, None, None), "worker": (1, ("0",), None)}
    assert slots(node_b) == {"ps": (1, None, None), "worker": (2, ("0", "1"), None)}


# ----------------------------------------------------------------------------- ansible-inventory agrees

ANSIBLE_INVENTORY = Path(sys.executable).with_name("ansible-inventory")


def _ansible_env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "ANSIBLE_HOME": str(home),                        # nothing written under ~
        "ANSIBLE_LOCAL_TEMP": str(home / "tmp"),
        "ANSIBLE_INVENTORY_ENABLED": "yaml",              # parse as the YAML format, nothing else
        "ANSIBLE_INVENTORY_UNPARSED_FAILED": "1",         # a file it cannot parse is an error, not a warning
        "ANSIBLE_NOCOLOR": "1",
    })
    return env


@pytest.fixture(scope="module")
def ansible_lists(tmp_path_factory):
    """``ansible-inventory --list`` of every shipped inventory and of PRECEDENCE, run in parallel."""
    if not ANSIBLE_INVENTORY.exists():
        pytest.skip(f"{ANSIBLE_INVENTORY} not installed (pip install 'pscluster[test]')")
    home = tmp_path_factory.mktemp("ansible-home")
    precedence = tmp_path_factory.mktemp("precedence") / "precedence.yaml"
    precedence.write_text(PRECEDENCE)
    paths = [*SHIPPED, precedence]
    running = {path: subprocess.Popen([str(ANSIBLE_INVENTORY), "-i", str(path), "--list"],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env=_ansible_env(home), cwd=home)
               for path in paths}
    results = {}
    for path, process in running.items():
        stdout, stderr = process.communicate(timeout=60)
        results[path.name] = (process.returncode, stdout, stderr, path)
    return results


def _ansible_members(listing: dict, group: str) -> set[str]:
    entry = listing.get(group, {})
    members = set(entry.get("hosts", []))
    for child in entry.get("children", []):
        members |= _ansible_members(listing, child)
    return members


def test_there_are_shipped_inventories():
    assert {path.name for path in SHIPPED} >= {"local.yaml", "lab.yaml"}


@pytest.mark.parametrize("path", SHIPPED, ids=[path.name for path in SHIPPED])
def test_ansible_inventory_accepts_shipped_inventory(ansible_lists, path):
    returncode, stdout, stderr, _ = ansible_lists[path.name]
    assert returncode == 0, stderr
    assert "WARNING" not in stderr, stderr
    listing = json.loads(stdout)
    inventory = load_inventory(str(path))
    for role in ("chief", "ps", "worker", "evaluator"):
        assert _ansible_members(listing, role) == set(inventory.hosts_of(role)), role
    assert _ansible_members(listing, "all") == {host.name for host in inventory.hosts}
    hostvars = listing["_meta"]["hostvars"]
    for host in inventory.hosts:
        assert hostvars[host.name].get("ansible_host", host.name) == host.address
        assert hostvars[host.name].get("pscluster_python") == host.python
        assert hostvars[host.name].get("pscluster_port_base", 2222) == host.port_base


def test_ansible_inventory_agrees_on_precedence(ansible_lists):
    returncode, stdout, stderr, path = ansible_lists["precedence.yaml"]
    assert returncode == 0, stderr
    hostvars = json.loads(stdout)["_meta"]["hostvars"]
    assert {host: values["pscluster_workdir"] for host, values in hostvars.items()} == PRECEDENCE_WORKDIRS
    inventory = load_inventory(str(path))
    assert {host.name: host.workdir for host in inventory.hosts} == PRECEDENCE_WORKDIRS


def test_secret_with_a_plain_value_is_refused(tmp_path):
    from cluster.errors import InventoryError
    from cluster.inventory import load_inventory
    path = tmp_path / "secret.yaml"
    path.write_text("all:\n  vars:\n    pscluster_secret_env: [API_TOKEN]\n    pscluster_env:\n"
                    "      API_TOKEN: hunter2\n  children:\n    worker: {hosts: {a: }}\n")
    with pytest.raises(InventoryError) as caught:
        load_inventory(str(path))
    assert caught.value.line == 5
    assert caught.value.key_path == "all.vars.pscluster_env.API_TOKEN"
    assert "plain value" in caught.value.message


def test_the_tests_mlp_copy_of_the_local_inventory_differs_only_by_the_model():
    """tests/fixtures/local-mlp.yaml stands in for inventories/local.yaml in the local tests whose
    subject is a state: it must say what the shipped file says, but for MNIST_MODEL."""
    import yaml

    repo = Path(__file__).resolve().parents[2]
    shipped = yaml.safe_load((repo / "inventories" / "local.yaml").read_text())
    copy = yaml.safe_load((repo / "tests" / "fixtures" / "local-mlp.yaml").read_text())
    assert copy["all"]["vars"]["pscluster_env"].pop("MNIST_MODEL") == "mlp"
    assert copy == shipped
