"""Inventory folders, group_vars/host_vars, INI, and the cross-check with ``ansible-inventory --list``
of every shipped and test inventory (issue 12 item 1)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.errors import InventoryError
from cluster.inventory import load_inventory

from .conftest import INVENTORIES
from .test_inventory import _ansible_env
from .test_inventory import _ansible_members as _members

FIXTURES = Path(__file__).resolve().parent / "inventories"
SHIPPED = sorted([*INVENTORIES.glob("*.yaml"), *(path for path in INVENTORIES.iterdir() if path.is_dir())])
CHECKED = [*SHIPPED, FIXTURES / "vars-folder", FIXTURES / "hosts.ini", FIXTURES / "ini-folder",
           FIXTURES / "ansible_styles"]
ANSIBLE_INVENTORY = Path(sys.executable).with_name("ansible-inventory")


def test_folder_with_vars_folders_follows_ansible_precedence():
    inventory = load_inventory(str(FIXTURES / "vars-folder"))
    assert inventory.name == "vars-folder"
    hosts = {host.name: host for host in inventory.hosts}
    # group_vars/all.yml beats every group's vars in the inventory file; host_vars beat all.
    assert {name: host.workdir for name, host in hosts.items()} == {
        "node-a": "/w/all-vars", "node-b": "/w/node-b-vars", "node-c": "/w/all-vars"}
    # group_vars/worker.yaml < group_vars/gpu/ (child group, two files merged in name order)
    assert {name: host.port_base for name, host in hosts.items()} == {"node-a": 3100, "node-b": 3100, "node-c": 3200}
    assert hosts["node-c"].slots_for("worker").count == 2
    # zeta and alpha are at the same depth: ansible_group_priority 5 puts zeta last, so it wins
    assert hosts["node-a"].python == "/py/zeta"
    assert hosts["node-b"].address == "127.0.0.2" and hosts["node-c"].address == "127.0.0.3"


def test_ini_inventory():
    inventory = load_inventory(str(FIXTURES / "hosts.ini"))
    assert inventory.name == "hosts"
    hosts = {host.name: host for host in inventory.hosts}
    assert inventory.hosts_of("worker") == ("node-a", "node-b", "node-c")
    assert inventory.hosts_of("ps") == ("node-a", "node-b")
    assert hosts["node-b"].ssh_port == 2200 and hosts["node-b"].address == "127.0.0.2"
    assert hosts["node-a"].slots_for("worker").count == 2
    assert hosts["node-c"].env == (("OMP_NUM_THREADS", "1"),)
    assert {host.connection for host in inventory.hosts} == {"local"}
    assert {host.workdir for host in inventory.hosts} == {"/w/worker"}
    assert dict(inventory.groups)["gpu"] == ("node-a", "node-b", "node-c")


def test_folder_mixes_ini_and_yaml_and_skips_ignored_files():
    inventory = load_inventory(str(FIXTURES / "ini-folder"))
    assert inventory.hosts_of("chief") == ("node-a",)
    assert inventory.hosts_of("worker") == ("node-a", "node-b")
    assert {host.port_base for host in inventory.hosts} == {2600}


def test_shipped_lab_folder():
    inventory = load_inventory(str(INVENTORIES / "lab-folder"))
    assert inventory.name == "lab-folder" and inventory.mode == "async"
    (host,) = inventory.hosts
    assert (host.address, host.port_base, host.connection) == ("127.0.0.1", 2322, "local")   # host_vars win
    assert [(slot.role, slot.count) for slot in host.slots] == [("chief", 1), ("ps", 2), ("worker", 2)]
    assert host.env == (("OMP_NUM_THREADS", "1"),)
    assert inventory.warnings == ()


@pytest.mark.parametrize("files, line, key_path, where", [
    ({"hosts.yml": "worker: {hosts: {a: }}\n", "group_vars/worker.yml": "x: 1\nworker_gpus: one\n"},
     2, "worker_gpus", "group_vars/worker.yml"),
    ({"hosts.yml": "worker: {hosts: {a: }}\n", "host_vars/a/net.yml": "pscluster_prot_base: 1\n"},
     1, "pscluster_prot_base", "host_vars/a/net.yml"),
    ({"hosts.yml": "worker: {hosts: {a: }}\n", "group_vars/all": "[1, 2]\n"}, 1, "", "group_vars/all"),
    ({"hosts.yml": "worker: {hosts: {a: }}\n", "b.yml": "ps:\n  hosts:\n    'a b':\n"}, 3, "ps.hosts.a b", "b.yml"),
    ({"hosts": "[worker]\na worker_tasks=1\nb oops\n"}, 3, "worker.hosts.b", "hosts"),
    ({"hosts": "[worker]\na\n[worker:vars]\nnovalue\n"}, 4, "worker.vars", "hosts"),
    ({"hosts": "[worker]\na ansible_port=http\n"}, 2, "worker.hosts.a.ansible_port", "hosts"),
])
def test_errors_name_the_vars_file_line_and_key(tmp_path, files, line, key_path, where):
    for name, text in files.items():
        (tmp_path / "inv" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "inv" / name).write_text(text)
    with pytest.raises(InventoryError) as caught:
        load_inventory(str(tmp_path / "inv"), display_name="inv")
    assert caught.value.file == os.path.join("inv", where)
    assert (caught.value.line, caught.value.key_path) == (line, key_path)


def test_cluster_wide_setting_in_group_vars_of_a_role_is_refused(tmp_path):
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "worker.yml").write_text("pscluster_mode: sync\n")
    (tmp_path / "hosts.yml").write_text("worker: {hosts: {a: }}\n")
    with pytest.raises(InventoryError, match="whole cluster"):
        load_inventory(str(tmp_path / "hosts.yml"))
    (tmp_path / "group_vars" / "worker.yml").rename(tmp_path / "group_vars" / "all.yml")
    assert load_inventory(str(tmp_path / "hosts.yml")).mode == "sync"


def test_empty_folder_and_script_are_refused(tmp_path):
    with pytest.raises(InventoryError, match="no inventory file"):
        load_inventory(str(tmp_path))
    script = tmp_path / "dynamic.py"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    with pytest.raises(InventoryError, match="dynamic inventory scripts"):
        load_inventory(str(tmp_path))


# ----------------------------------------------------------------------------- ansible-inventory agrees

def _expected_vars(host) -> dict:
    """The variables ansible-inventory must report for ``host``, from what pscluster loaded: every
    value the plan uses (address, SSH port, user, key, become user, timeout, interpreter, workdir,
    port base, transport, task counts, GPU masks, ports)."""
    expected = {"ansible_host": host.address, "pscluster_port_base": host.port_base,
                "pscluster_workdir": host.workdir, "ansible_port": host.ssh_port, "ansible_user": host.user,
                "pscluster_python": host.python, "ansible_ssh_private_key_file": host.key_file,
                "become_user": host.become_user, "timeout": host.connect_timeout}
    if host.connection == "local":
        expected["ansible_connection"] = "local"
    for slot in host.slots:
        if slot.gpus is None and not slot.auto_gpus and slot.count != 1:
            expected[f"{slot.role}_tasks"] = slot.count
        if slot.gpus is not None:
            expected[f"{slot.role}_gpus"] = list(slot.gpus)
        if slot.ports is not None:
            expected[f"{slot.role}_ports"] = list(slot.ports)
    return expected


def _number(value):
    """Ansible reports INI's ansible_port='2222' and YAML's "2222" as strings; pscluster reads 2222."""
    return int(value) if isinstance(value, str) and value.strip().lstrip("+-").isdigit() else value


def _mask(value) -> str:
    return ",".join(str(gpu) for gpu in (value if isinstance(value, list) else [value]))


def _actual_vars(name: str, values: dict) -> dict:
    values = {key: _number(value) for key, value in values.items()}
    become = str(values.get("ansible_become", False)).lower() in ("true", "yes", "1", "on", "y")
    actual = {"ansible_host": values.get("ansible_host", name),
              "pscluster_port_base": values.get("pscluster_port_base", 2222),
              "pscluster_workdir": values.get("pscluster_workdir"), "ansible_port": values.get("ansible_port"),
              "ansible_user": values.get("ansible_user"),
              "pscluster_python": values.get("pscluster_python", values.get("ansible_python_interpreter")),
              "ansible_ssh_private_key_file": values.get("ansible_ssh_private_key_file"),
              "become_user": values.get("ansible_become_user", "root") if become else None,
              "timeout": values.get("pscluster_connect_timeout") or values.get("ansible_ssh_timeout", 10)}
    for key, value in values.items():
        if key == "ansible_connection" and value == "local":
            actual[key] = value
        elif key.endswith("_tasks") and value != 1 and key[:-6] + "_gpus" not in values:   # masks fix the count
            actual[key] = value
        elif key.endswith("_gpus") and value != "auto":
            actual[key] = [_mask(item) for item in value]
        elif key.endswith("_ports"):
            actual[key] = [_number(item) for item in (value if isinstance(value, list) else [value])]
    return actual


def run_ansible_inventory(tmp_path_factory, jobs: dict) -> dict:
    """Run ``ansible-inventory`` once per job (key -> extra argv) in parallel: key -> (rc, stdout, stderr)."""
    if not ANSIBLE_INVENTORY.exists():
        pytest.skip(f"{ANSIBLE_INVENTORY} not installed (pip install 'pscluster[test]')")
    home = tmp_path_factory.mktemp("ansible-home")
    env = {**_ansible_env(home), "ANSIBLE_INVENTORY_ENABLED": "yaml,ini"}
    running = {key: subprocess.Popen([str(ANSIBLE_INVENTORY), "--list", *argv], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env, cwd=home)
               for key, argv in jobs.items()}
    results = {key: process.communicate(timeout=120) for key, process in running.items()}
    return {key: (running[key].returncode, *output) for key, output in results.items()}


@pytest.fixture(scope="module")
def listings(tmp_path_factory):
    return run_ansible_inventory(tmp_path_factory, {path: ["-i", str(path)] for path in CHECKED})


@pytest.mark.parametrize("path", CHECKED, ids=[path.name for path in CHECKED])
def test_ansible_inventory_gives_the_same_hosts_and_vars(listings, path):
    returncode, stdout, stderr = listings[path]
    assert returncode == 0, stderr
    listing = json.loads(stdout)
    assert "WARNING" not in stderr, stderr
    inventory = load_inventory(str(path))
    assert _members(listing, "all") == {host.name for host in inventory.hosts}
    for group, members in inventory.groups:
        assert _members(listing, group) == set(members), group
    hostvars = listing["_meta"]["hostvars"]
    for host in inventory.hosts:
        assert _actual_vars(host.name, hostvars[host.name]) == _expected_vars(host), host.name


def test_vars_files_of_unknown_groups_and_hosts_are_not_read(tmp_path):
    """As Ansible: group_vars/notes.txt or host_vars/old-host.yml are never opened."""
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "group_vars" / "README.txt").write_bytes(b"\xff not yaml [[[")
    (tmp_path / "host_vars" / "old-host.yml").write_text("[[[\n")
    (tmp_path / "host_vars" / "a.lab.example").write_text("pscluster_workdir: /w/a\n")
    (tmp_path / "hosts.yml").write_text("worker: {hosts: {a.lab.example: }}\n")
    assert load_inventory(str(tmp_path / "hosts.yml")).hosts[0].workdir == "/w/a"
