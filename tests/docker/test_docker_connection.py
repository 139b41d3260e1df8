"""``ansible_connection: docker``: containers with no sshd, reached with ``docker exec`` as Ansible's
community.docker.docker plugin reaches them. pscluster runs on this machine; the node image runs
``idle`` (tini as PID 1, nothing else) on a user-defined network, where Docker's DNS resolves
the container names the plan uses as task addresses."""
from __future__ import annotations

import json
import re
import shutil

import pytest

from testbed import dockerlab
from tests.docker.conftest import IMAGE, NODE_PYTHON, docker, final_report, healthy, processes, pscluster, wait_for

pytestmark = [pytest.mark.docker, pytest.mark.tf]

NETWORK = "psc-exec"
NODES = ("psc-exec-1", "psc-exec-2")
IDLE = ["/usr/bin/tini -- /usr/local/bin/pscluster-entrypoint idle", "sleep infinity"]


@pytest.fixture(scope="module")
def nodes(engine):
    docker(engine, "network", "create", NETWORK)
    try:
        for name in NODES:
            docker(engine, "run", "-d", "--name", name, "--hostname", name, "--network", NETWORK, IMAGE, "idle")
        wait_for("the idle nodes to be healthy", lambda: healthy(engine, *NODES), timeout=120)
        yield NODES
    finally:
        docker(engine, "rm", "-f", *NODES, check=False)
        docker(engine, "network", "rm", NETWORK, check=False)


def inventory(path, hosts: dict, **extra) -> str:
    """chief and a ps on the first host, a ps and a worker on every host."""
    first = next(iter(hosts))
    lines = ["all:", "  vars:", "    ansible_connection: community.docker.docker",
             f"    ansible_user: {extra.pop('ansible_user', 'pscluster')}",
             f"    pscluster_python: {extra.pop('python', NODE_PYTHON)}", "    pscluster_workdir: ~/work",
             "    pscluster_env: {OMP_NUM_THREADS: 1, MNIST_MODEL: mlp}"]   # accuracy is compose's subject
    lines += [f"    {key}: {value}" for key, value in extra.items()]
    lines += ["  children:", f"    chief: {{hosts: {{{first}: }}}}"]
    described = ", ".join(f"{name}: {{ansible_host: {container}}}" if container != name else f"{name}: "
                          for name, container in hosts.items())
    lines += [f"    ps: {{hosts: {{{described}}}}}", f"    worker: {{hosts: {{{described}}}}}"]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_up_train_run_logs_status_down_through_docker_exec(engine, nodes, tmp_path):
    state = tmp_path / "state"
    hosts = {"alpha": NODES[0], "beta": NODES[1]}          # inventory names are not the containers'
    path = inventory(tmp_path / "exec.yaml", hosts)
    up = pscluster(engine, state, "up", path, "--name", "exec")
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        # Code reached the containers through docker exec (a tar stream), not a shared folder.
        synced = docker(engine, "exec", "--user", "pscluster", NODES[1], "cat", "/home/pscluster/work/roles/hostctl.py")
        assert synced == (dockerlab.REPO / "roles" / "hostctl.py").read_text()

        # The MLP for 300 steps (issue 47: the CNN's epoch was 469 steps of the lane's time; 98.5 %
        # after a whole run is tests/docker/test_compose_lab.py's subject).
        train = pscluster(engine, state, "train", "distributed_mnist", "--name", "exec", "--steps", "300", "--json")
        assert train.returncode == 0, train.stderr[-3000:]
        report = final_report(train.stdout)
        assert report["val_accuracy"] >= 0.90 and report["global_step"] == 300, report

        # The user's own program on the cluster that is up (its chief), from a project folder.
        project = tmp_path / "project"
        (project / "data").mkdir(parents=True)
        shutil.copy(dockerlab.REPO / "examples" / "byo" / "tf2_ps_coordinator.py", project / "coord.py")
        shutil.copy(dockerlab.REPO / "examples" / "distributed_mnist" / "data" / "mnist.npz", project / "data")
        run = pscluster(engine, state, "run", "--name", "exec", "--json", "--", "python", "coord.py", "--steps", "200",
                        cwd=project)
        assert run.returncode == 0, run.stderr[-3000:]
        assert re.search(r"\[chief:0@alpha\] final test_accuracy=0\.[89]", run.stderr), run.stderr[-3000:]
        assert json.loads(run.stdout)["tasks"]

        logs = pscluster(engine, state, "logs", "--name", "exec", "worker:1")
        assert logs.returncode == 0 and "roles.server: worker:1 serving at grpc://psc-exec-2:" in logs.stdout, logs.stdout
        status = pscluster(engine, state, "status", "--name", "exec", "--json")
        assert status.returncode == 0, status.stderr
        tasks = {f"{t['role']}:{t['index']}": t for t in json.loads(status.stdout)["tasks"]}
        assert tasks["ps:1"]["host"] == "beta" and tasks["ps:1"]["state"] == "ready", tasks["ps:1"]
    finally:
        down = pscluster(engine, state, "down", "--name", "exec")
    assert down.returncode == 0, down.stderr
    assert "nothing left running" in down.stderr
    for node in NODES:     # nothing of ours: no task, no watcher, no standby
        wait_for(f"only init and sleep in {node}", lambda node=node: processes(engine, node) == IDLE, timeout=30)



def test_a_host_operation_past_its_timeout_leaves_nothing_in_the_container(engine, nodes, tmp_path, monkeypatch):
    """Issue 45 item 7: pscluster's own limit on a one-shot operation killed the docker exec
    client, and the command went on in the container; under the guard it ends with the client."""
    from cluster.errors import HostError
    from cluster.inventory import load_inventory
    from cluster.plan import PlanOptions, plan_cluster
    from cluster.transport import open_transport
    monkeypatch.setenv("DOCKER_HOST", engine.env()["DOCKER_HOST"])
    plan = plan_cluster(load_inventory(inventory(tmp_path / "slow.yaml", {"alpha": NODES[0]})),
                        PlanOptions(local_python=NODE_PYTHON, local_workdir="/tmp", name="slow"))
    transport = open_transport(plan.host("alpha"))
    with pytest.raises(HostError, match="command timed out after 3 s"):
        transport.run([NODE_PYTHON, "-c", "import time; time.sleep(300)", "pscluster-item-45-7"], timeout=3)
    wait_for(f"only init and sleep in {NODES[0]}", lambda: processes(engine, NODES[0]) == IDLE, timeout=30)


@pytest.fixture(scope="module")
def odd_containers(engine, nodes):
    """A stopped node, and a running container of the bare Debian base (no Python at all)."""
    docker(engine, "run", "-d", "--name", "psc-stopped", "--network", NETWORK, IMAGE, "idle")
    docker(engine, "stop", "-t", "1", "psc-stopped")
    docker(engine, "run", "-d", "--name", "psc-bare", "--network", NETWORK, dockerlab.BASE_IMAGE, "sleep", "infinity")
    yield
    docker(engine, "rm", "-f", "psc-stopped", "psc-bare", check=False)


@pytest.mark.parametrize("case, hosts, extra, env, expected", [
    ("no such container", {"alpha": NODES[0], "ghost": "psc-no-such"}, {}, {},
     ("ghost", "docker", "no container named 'psc-no-such' (docker ps -a lists them)")),
    ("stopped container", {"alpha": NODES[0], "beta": "psc-stopped"}, {}, {},
     ("beta", "docker", "container 'psc-stopped' is exited (start it: docker start psc-stopped)")),
    ("no docker client", {"alpha": NODES[0]}, {}, {"PSCLUSTER_DOCKER": "/nonexistent/docker"},
     ("alpha", "docker", "the docker CLI is not installed on this machine")),
    ("daemon down", {"alpha": NODES[0]}, {}, {"DOCKER_HOST": "unix:///nonexistent/docker.sock"},
     ("alpha", "docker", "the docker daemon is not reachable")),
    ("user missing in the image", {"alpha": NODES[0], "bare": "psc-bare"}, {}, {},
     ("bare", "docker", f"no user 'pscluster' in container psc-bare, image {dockerlab.BASE_IMAGE}")),
    ("image without Python", {"alpha": NODES[0], "bare": "psc-bare"}, {"ansible_user": "root"}, {},
     ("bare", "python", f"interpreter '{NODE_PYTHON}' not found (container psc-bare, image {dockerlab.BASE_IMAGE})")),
    ("image without TensorFlow for that Python", {"alpha": NODES[0]}, {"python": "/usr/bin/python3"}, {},
     ("alpha", "tensorflow", f"TensorFlow is not installed for /usr/bin/python3 (container {NODES[0]}, image {IMAGE})")),
])
def test_bad_containers_are_named_at_check(engine, nodes, odd_containers, tmp_path, case, hosts, extra, env, expected):
    path = inventory(tmp_path / "bad.yaml", hosts, **extra)
    checked = pscluster(engine, tmp_path / "state", "check", path, "--name", "bad", "--json", env=env, timeout=120)
    assert checked.returncode == 1, (checked.stdout, checked.stderr)
    failed = [(c["host"], c["check"], c["detail"]) for c in json.loads(checked.stdout)["checks"] if not c["ok"]]
    assert len(failed) == 1 and failed[0][:2] == expected[:2] and expected[2] in failed[0][2], failed
    assert "Traceback" not in checked.stderr
    for node in NODES:
        assert processes(engine, node) == IDLE      # check started nothing
