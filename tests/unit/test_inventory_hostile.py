"""Hostile and odd inventories (issue 16 items 9, 13, 17) and the ansible_* keys (issue 12 item 2):
every one is an InventoryError naming file and line, in bounded time and memory."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import tracemalloc

import pytest

from cluster.errors import InventoryError
from cluster.inventory import check_host_name, expand_host_pattern, load_inventory
from cluster.inventory.yamlsrc import MAX_FILE_BYTES
from tests.helpers import REPO

WORKER = "all:\n  children:\n    worker:\n      hosts:\n"
# 9 levels of 9 aliases: 9**9 (387 million) values once expanded; 400 bytes of YAML.
ALIAS_BOMB = "".join(f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]\n"
                     for prev, name in zip("abcdefgh", "bcdefghi"))
ALIAS_BOMB = 'a: &a ["x","x","x","x","x","x","x","x","x"]\n' + ALIAS_BOMB


def load(tmp_path, content: str | bytes, name: str = "inv.yaml"):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return load_inventory(str(path), display_name=name)


def refused(tmp_path, content: str | bytes, name: str = "inv.yaml", seconds: float = 20.0,
            mib: float = 64) -> InventoryError:
    tracemalloc.start()
    started = time.process_time()      # this process's CPU: other work on the machine is no failure
    try:
        with pytest.raises(InventoryError) as caught:
            load(tmp_path, content, name)
        elapsed = time.process_time() - started
        peak = tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()
    assert elapsed < seconds and peak < mib, (elapsed, peak)
    assert caught.value.file == name
    return caught.value


@pytest.mark.parametrize("content, line, message", [
    ("\ufeffall:\n  hosts: {a: }\n".encode("utf-16"), 1, "UTF-16"),
    (b"all:\n  hosts:\n    caf\xe9:\n", 3, "not valid UTF-8"),
    ("all: !foo {hosts: {a: }}\n", 1, "unsupported tag !foo"),
    ("all:\n  vars:\n    pscluster_port_base: !!int abc\n", 3, "invalid literal"),
    ("all:\n  vars: {x: !!python/object:os.system ls}\n", 2, "tagged"),
    ("x: " + "[" * 5000 + "]" * 5000 + "\n", 1, "nested more than 64 levels"),
    ("x: &a [*a]\n", 1, "nested more than"),
    (ALIAS_BOMB, 1, "more than 100000 values"),
    (WORKER + "        n[0:999999]:\n", 5, "expands to more than 10000 hosts"),
    (WORKER + "        n[0:200][0:200]:\n", 5, "expands to more than 10000 hosts"),
])
def test_hostile_yaml_is_refused_fast(tmp_path, content, line, message):
    error = refused(tmp_path, content)
    assert error.line == line
    assert message in str(error)
    assert error.hint


def test_alias_bomb_is_small():
    assert len(ALIAS_BOMB) < 450


def test_huge_file_is_refused_unread(tmp_path):
    error = refused(tmp_path, WORKER + "        a:\n" + "#" * MAX_FILE_BYTES + "\n")
    assert "larger than 4 MiB" in error.message


def test_ten_thousand_hosts_load_fast(tmp_path):
    started = time.process_time()      # this process's CPU: other work on the machine is no failure
    inventory = load(tmp_path, WORKER + "        n[00000:09999]:\n")
    assert len(inventory.hosts) == 10_000 and inventory.hosts[-1].name == "n09999"
    assert time.process_time() - started < 10


@pytest.mark.parametrize("name", ["a\nflush ruleset", "a b", "a;b", "a'b", 'a"b', "a[0]b", "a{b}", "-a",
                                  "a-", "a..b", "a\tb", "a$(reboot)", "é", "a/b"])
def test_bad_host_names_are_refused(tmp_path, name):
    quoted = '"' + name.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t") + '"'
    error = refused(tmp_path, WORKER + f"        {quoted}:\n")
    assert error.line == 5 and "not a host name" in error.message and error.hint
    assert "\n" not in str(error).split("  hint:")[0].rstrip("\n")


def test_newline_host_never_reaches_the_ruleset(tmp_path):
    with pytest.raises(InventoryError, match="'\\\\n' is not allowed"):
        load(tmp_path, WORKER + '        "a\\nflush ruleset":\n')


@pytest.mark.parametrize("address", ["1.2.3.4\nflush ruleset", "10.0.0.1; reboot", "[::1]", "a b", ""])
def test_bad_addresses_are_refused(tmp_path, address):
    error = refused(tmp_path, WORKER + f"        a:\n          ansible_host: {address!r}\n".replace("'", '"')
                    if "\n" not in address else WORKER + "        a:\n          ansible_host: \"1.2.3.4\\nx\"\n")
    assert error.line == 6 and error.key_path == "worker.hosts.a.ansible_host"


@pytest.mark.parametrize("name", ["fe80::1%eth0\nflush ruleset", "fe80::1%a b", "fe80::1%a;b", "fe80::1%$(id)",
                                  "fe80::1%`id`", "fe80::1%[x]", "fe80::1%" + "e" * 16, "fe80::1%\x1b", "fe80::1%é"])
def test_ipv6_scope_ids_are_interface_names_or_numbers(name):
    """N6 (issue 25): Python accepts any text after '%' as a scope id; it passed host-name
    validation with newlines, spaces, ';', '$()', backticks and brackets."""
    assert "scope id" in (check_host_name(name) or "")


@pytest.mark.parametrize("name", ["node-a", "NODE_1.lab.example", "10.0.0.1", "::1", "fe80::1", "a" * 63,
                                  "fe80::1%eth0", "fe80::1%2", "fe80::1%br-lab.7"])
def test_good_host_names(name):
    assert check_host_name(name) is None


def test_empty_host_name_is_refused(tmp_path):
    error = refused(tmp_path, WORKER + '        "":\n')
    assert "empty" in error.message


@pytest.mark.parametrize("key, kind", [("yes", "bool"), ("on", "bool"), ("1", "int"), ("~", "NoneType"),
                                       ("1.5", "float")])
def test_yaml_non_string_host_names_are_refused_as_ansible_does(tmp_path, key, kind):
    """ansible-inventory refuses them too ("Host pattern True must be a string. Enclose integers/floats
    in quotation marks"), so the host is never silently renamed "True"."""
    error = refused(tmp_path, WORKER + f"        {key}:\n")
    assert f"read by YAML as {kind}" in error.message and "quote it" in error.hint
    assert [host.name for host in load(tmp_path, WORKER + f'        "{key}":\n'.replace("~", "n")).hosts] \
        in (["yes"], ["on"], ["1"], ["n"], ["1.5"])


def test_range_expansion_bound():
    assert len(expand_host_pattern("n[1:10000]")) == 10_000
    with pytest.raises(ValueError, match="more than 10000"):
        expand_host_pattern("n[1:100][1:101]")


# ----------------------------------------------------------------------------- ansible_* keys

def test_ansible_ssh_aliases_and_timeout(tmp_path):
    inventory = load(tmp_path, WORKER + "        a:\n          ansible_ssh_host: 10.0.0.5\n"
                     "          ansible_ssh_port: 2200\n          ansible_ssh_user: lab\n"
                     "          ansible_ssh_timeout: 33\n")
    host = inventory.hosts[0]
    assert (host.address, host.ssh_port, host.user, host.connect_timeout) == ("10.0.0.5", 2200, "lab", 33.0)
    assert inventory.warnings == ()


def test_ansible_host_and_pscluster_timeout_win_over_aliases(tmp_path):
    host = load(tmp_path, WORKER + "        a:\n          ansible_host: 10.0.0.1\n          ansible_ssh_host: 10.0.0.5\n"
                "          ansible_ssh_timeout: 33\n          pscluster_connect_timeout: 5\n").hosts[0]
    assert (host.address, host.connect_timeout) == ("10.0.0.1", 5.0)


def test_unused_ansible_keys_are_warned_with_file_line_key(tmp_path):
    inventory = load(tmp_path, "all:\n  vars:\n    ansible_ssh_pipelining: true\n    ansible_host_key_checking: false\n"
                     "    other_tool_setting: 1\n  children:\n    worker:\n      hosts:\n        a:\n"
                     "          ansible_shell_type: sh\n        b:\n")
    assert inventory.warnings[0] == ("inv.yaml:3: all.vars.ansible_ssh_pipelining: ignored by pscluster "
                                     "(an Ansible setting it does not use)")
    assert inventory.warnings[1].startswith("inv.yaml:4: all.vars.ansible_host_key_checking: ignored: "
                                            "pscluster still checks host keys")
    assert "pscluster_host_key_policy: accept-new" in inventory.warnings[1]
    assert inventory.warnings[2].startswith("inv.yaml:10: worker.hosts.a.ansible_shell_type: ignored")
    assert len(inventory.warnings) == 3          # once per place, not per host; other tools' keys are fine


def test_ssh_args_other_than_proxyjump_are_warned_one_by_one(tmp_path):
    inventory = load(tmp_path, WORKER + "        a:\n          ansible_ssh_common_args: "
                     "'-o StrictHostKeyChecking=no -C -o ServerAliveInterval=5 -J hop1'\n"
                     "        b:\n          ansible_ssh_extra_args: '-oUserKnownHostsFile=/dev/null -i k.pem "
                     "-o \"ProxyJump hop2\"'\n")
    where_a = "inv.yaml:6: worker.hosts.a.ansible_ssh_common_args: ssh option "
    where_b = "inv.yaml:8: worker.hosts.b.ansible_ssh_extra_args: ssh option "
    assert [line.partition(" ignored: ")[0] for line in inventory.warnings] == [
        where_a + "'-o StrictHostKeyChecking=no'", where_a + "'-C'", where_a + "'-o ServerAliveInterval=5'",
        where_b + "'-o UserKnownHostsFile=/dev/null'", where_b + "'-i k.pem'"]
    host_key_off = [0, 3]
    for index, line in enumerate(inventory.warnings):
        assert ("pscluster keeps host-key checking on" in line) == (index in host_key_off), line
    assert [host.jump for host in inventory.hosts] == [("hop1",), ("hop2",)]    # ProxyJump is honoured


def test_ssh_args_with_only_proxyjump_are_silent(tmp_path):
    inventory = load(tmp_path, WORKER + "        a:\n          ansible_ssh_common_args: '-o ProxyJump=h1,h2'\n"
                     "        b:\n          ansible_ssh_extra_args: '-Jh3 -o StrictHostKeyChecking=yes'\n")
    assert [host.jump for host in inventory.hosts] == [("h1", "h2"), ("h3",)]
    assert [line.partition(" ignored")[0] for line in inventory.warnings] == [
        "inv.yaml:8: worker.hosts.b.ansible_ssh_extra_args: ssh option '-o StrictHostKeyChecking=yes'"]


def test_host_key_checking_true_is_silent(tmp_path):
    assert load(tmp_path, WORKER + "        a:\n          ansible_host_key_checking: true\n").warnings == ()


def test_passwords_stay_errors(tmp_path):
    refused(tmp_path, WORKER + "        a:\n          ansible_ssh_pass: x\n")


# ----------------------------------------------------------------------------- N5: not regular files

def _fifo(path) -> str:
    os.mkfifo(path)
    return str(path)


@pytest.mark.parametrize("where", ["inventory", "folder", "group_vars", "host_vars_file", "host_vars_folder"])
def test_a_fifo_anywhere_in_the_inventory_is_refused_without_blocking(tmp_path, where):
    """N5 (issue 25): before, a FIFO blocked every command until killed. Run in a child with a
    deadline, so a regression fails the test instead of hanging the suite."""
    folder = tmp_path / "inv"
    (folder / "group_vars").mkdir(parents=True)
    (folder / "host_vars" / "b").mkdir(parents=True)
    (folder / "hosts.yml").write_text("worker:\n  hosts: {b: }\n")
    target = {"inventory": tmp_path / "fifo.yaml", "folder": folder / "more.yml",
              "group_vars": folder / "group_vars" / "all.yml", "host_vars_file": folder / "host_vars" / "b.yml",
              "host_vars_folder": folder / "host_vars" / "b" / "x.yml"}[where]
    _fifo(target)
    path = target if where == "inventory" else folder
    proc = subprocess.run([sys.executable, "-c", "import sys; from cluster.inventory import load_inventory\n"
                           "try:\n    load_inventory(sys.argv[1])\nexcept Exception as exc:\n    print(exc)\n",
                           str(path)], capture_output=True, text=True, timeout=20, cwd=REPO,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert "not a regular file (a FIFO)" in proc.stdout and target.name in proc.stdout


@pytest.mark.parametrize("special", ["/dev/null", "/dev/zero", "/dev/stdin"])
def test_devices_are_refused_as_inventories(special):
    with pytest.raises(InventoryError, match="not a regular file"):
        load_inventory(special)


def test_group_vars_read_from_outside_the_inventory_folder_are_warned(tmp_path):
    """Issue 25, "Also": a symlinked group_vars/all.yml -> /etc/shadow was followed and parsed
    without a word."""
    outside = tmp_path / "elsewhere.yml"
    outside.write_text("pscluster_port_base: 3000\n")
    folder = tmp_path / "inv"
    (folder / "group_vars").mkdir(parents=True)
    (folder / "hosts.yml").write_text("worker:\n  hosts: {b: }\n")
    (folder / "group_vars" / "all.yml").symlink_to(outside)
    (folder / "group_vars" / "worker.yml").write_text("worker_tasks: 1\n")
    inventory = load_inventory(str(folder))
    warned = [text for text in inventory.warnings if "outside the inventory folder" in text]
    assert len(warned) == 1 and "group_vars/all.yml" in warned[0] and str(outside) in warned[0]
