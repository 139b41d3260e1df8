"""Planning (cluster/plan.py): ports, GPU masks, modes, TF_CONFIG, environment, --json document.

Expected plans are worked out by hand from the inventories and the rules in the issue:
ports from pscluster_port_base per address in role order chief, ps, worker; ps tasks CPU-only;
workers and chief without a mask unless the inventory gives one.
"""
from __future__ import annotations

import json
import time

import jsonschema
import pytest

from cluster.contracts import default_mode
from cluster.errors import InventoryError, PlanError
from cluster.inventory import load_inventory
from cluster.plan import ClusterPlan, PlanOptions, loopback_addresses, machine_address, plan_cluster

from .conftest import INVENTORIES, PLAN_SCHEMA

OPTIONS = PlanOptions(local_python="/here/venv/bin/python", local_workdir="/here/checkout")
LAB_PYTHON = "/opt/pscluster/venv/bin/python"


def plan_file(path: str, **options) -> ClusterPlan:
    return plan_cluster(load_inventory(path), PlanOptions(**{**OPTIONS.__dict__, **options}))


def plan_text(write_inventory, text: str, **options) -> ClusterPlan:
    return plan_file(write_inventory(text), **options)


def rows(plan: ClusterPlan) -> list[tuple]:
    """(task, host, address, port, CUDA_VISIBLE_DEVICES, standing) per task."""
    return [(task.name, task.host, task.address, task.port, task.cuda_visible_devices, task.standing)
            for task in plan.tasks]


def local_plan(**options) -> ClusterPlan:
    return plan_file(str(INVENTORIES / "local.yaml"), **options)


def lab_plan(**options) -> ClusterPlan:
    return plan_file(str(INVENTORIES / "lab.yaml"), **options)


# ----------------------------------------------------------------------------- shipped inventories

def test_local_plan():
    plan = local_plan()
    assert (plan.name, plan.mode, plan.unused, plan.firewall) == ("local", "async", (), False)
    assert rows(plan) == [
        ("chief:0", "localhost", "localhost", 2222, None, False),
        ("ps:0", "localhost", "localhost", 2223, "", True),
        ("ps:1", "localhost", "localhost", 2224, "", True),
        ("worker:0", "localhost", "localhost", 2225, None, True),
        ("worker:1", "localhost", "localhost", 2226, None, True),
    ]
    assert plan.cluster_spec == {
        "chief": ["localhost:2222"],
        "ps": ["localhost:2223", "localhost:2224"],
        "worker": ["localhost:2225", "localhost:2226"],
    }
    (host,) = plan.hosts
    # A local host without pscluster_python / pscluster_workdir runs this machine's interpreter and checkout.
    assert (host.name, host.is_local, host.python, host.workdir) == \
        ("localhost", True, "/here/venv/bin/python", "/here/checkout")
    chief, ps0 = plan.task("chief:0"), plan.task("ps:0")
    assert chief.argv == ("/here/venv/bin/python", "-m", "roles.train", "--mode", "async")
    assert ps0.argv == ("/here/venv/bin/python", "-m", "roles.server")
    assert (ps0.workdir, ps0.log_path, ps0.events_path) == \
        ("/here/checkout", "/here/checkout/.pscluster/local/ps-0.log",
         "/here/checkout/.pscluster/local/ps-0.events.jsonl")


def test_lab_plan():
    plan = lab_plan()
    assert (plan.name, plan.mode) == ("lab", "async")
    # Ports are numbered per address: node-a holds chief, ps:0, worker:0; node-b ps:1, worker:1, worker:2.
    assert rows(plan) == [
        ("chief:0", "node-a", "198.51.100.10", 2222, None, False),
        ("ps:0", "node-a", "198.51.100.10", 2223, "", True),
        ("ps:1", "node-b", "198.51.100.11", 2222, "", True),
        ("worker:0", "node-a", "198.51.100.10", 2224, "0", True),
        ("worker:1", "node-b", "198.51.100.11", 2223, "0", True),
        ("worker:2", "node-b", "198.51.100.11", 2224, "1", True),
    ]
    assert plan.cluster_spec == {
        "chief": ["198.51.100.10:2222"],
        "ps": ["198.51.100.10:2223", "198.51.100.11:2222"],
        "worker": ["198.51.100.10:2224", "198.51.100.11:2223", "198.51.100.11:2224"],
    }
    assert [(host.name, host.address, host.is_local, host.python, host.workdir, host.user, host.key_file)
            for host in plan.hosts] == [
        ("node-a", "198.51.100.10", False, LAB_PYTHON, "/opt/pscluster/work", "pscluster", "~/.ssh/id_ed25519"),
        ("node-b", "198.51.100.11", False, LAB_PYTHON, "/opt/pscluster/work", "pscluster", "~/.ssh/id_ed25519"),
    ]
    assert plan.task("worker:2").argv == (LAB_PYTHON, "-m", "roles.server")
    assert plan.task("worker:2").log_path == "/opt/pscluster/work/.pscluster/lab/worker-2.log"


def test_remote_host_defaults(write_inventory):
    plan = plan_text(write_inventory, """\
        all:
          vars:
            pscluster_mode: sync
          children:
            worker:
              hosts:
                node-a:
        """)
    (host,) = plan.hosts
    assert (host.is_local, host.python, host.workdir) == (False, "python3", "~/pscluster")
    assert plan.task("worker:0").log_path == "~/pscluster/.pscluster/lab/worker-0.log"


# ----------------------------------------------------------------------------- ports

def test_port_base_option_overrides_the_inventory():
    plan = lab_plan(port_base=3000)
    assert [(task.name, task.port) for task in plan.tasks] == [
        ("chief:0", 3000), ("ps:0", 3001), ("ps:1", 3000), ("worker:0", 3002), ("worker:1", 3001), ("worker:2", 3002)]


def test_port_base_per_host(write_inventory):
    plan = plan_text(write_inventory, """\
        all:
          vars:
            pscluster_port_base: 4000
          children:
            chief:
              hosts:
                node-a:
            ps:
              hosts:
                node-a:
                node-b: {pscluster_port_base: 5000}
            worker:
              hosts:
                node-b:
        """)
    assert [(task.name, task.port) for task in plan.tasks] == \
        [("chief:0", 4000), ("ps:0", 4001), ("ps:1", 5000), ("worker:0", 5001)]


def test_explicit_ports_and_auto_ports_skip_them(write_inventory):
    plan = plan_text(write_inventory, """\
        all:
          children:
            chief:
              hosts:
                node-a: {chief_ports: [2223]}
            ps:
              hosts:
                node-a: {ps_tasks: 2}
            worker:
              hosts:
                node-a: {worker_tasks: 2, worker_ports: [2222, 2400]}
        """)
    assert [(task.name, task.port) for task in plan.tasks] == \
        [("chief:0", 2223), ("ps:0", 2224), ("ps:1", 2225), ("worker:0", 2222), ("worker:1", 2400)]


COLLIDING_PORTS = """\
all:
  children:
    chief:
      hosts:
        node-a:
    ps:
      hosts:
        node-a: {ps_ports: [2300]}
    worker:
      hosts:
        node-a:
          worker_ports: [2300]
"""


def test_explicit_port_collision_names_both_tasks(write_inventory):
    with pytest.raises(InventoryError) as caught:
        plan_text(write_inventory, COLLIDING_PORTS)
    assert caught.value.message.endswith("port 2300 is given to both ps:0 and worker:0 on node-a")
    assert caught.value.file == "lab.yaml"


def test_explicit_port_collision_points_at_the_port_settings(write_inventory):
    with pytest.raises(InventoryError) as caught:
        plan_text(write_inventory, COLLIDING_PORTS)
    # The second claim (worker_ports, line 12) is the error; the first (ps_ports, line 8) the hint.
    assert (caught.value.line, caught.value.key_path) == (12, "worker.hosts.node-a.worker_ports")
    assert "lab.yaml:8" in caught.value.hint


def test_explicit_ports_on_different_addresses_do_not_collide(write_inventory):
    plan = plan_text(write_inventory, """\
        all:
          children:
            chief:
              hosts:
                node-a: {chief_ports: [2300]}
            ps:
              hosts:
                node-b: {ps_ports: [2300]}
            worker:
              hosts:
                node-b:
        """)
    assert [(task.name, task.port) for task in plan.tasks] == [("chief:0", 2300), ("ps:0", 2300), ("worker:0", 2222)]


def test_hosts_with_the_same_address_share_port_numbering(write_inventory):
    plan = plan_text(write_inventory, """\
        all:
          vars:
            ansible_host: 10.0.0.5
          children:
            chief:
              hosts:
                a:
            ps:
              hosts:
                b:
            worker:
              hosts:
                a:
                b: {worker_ports: [2226]}
                c: {worker_tasks: 2}
        """)
    assert rows(plan) == [
        ("chief:0", "a", "10.0.0.5", 2222, None, False),
        ("ps:0", "b", "10.0.0.5", 2223, "", True),
        ("worker:0", "a", "10.0.0.5", 2224, None, True),
        ("worker:1", "b", "10.0.0.5", 2226, None, True),
        ("worker:2", "c", "10.0.0.5", 2225, None, True),
        ("worker:3", "c", "10.0.0.5", 2227, None, True),
    ]


def test_one_machine_spelled_two_ways_shares_port_numbering(write_inventory):
    # DNS names are case-blind; IPv6 has many spellings of one address.
    # Before issue 46 each spelling counted from the port base: two tasks on 2222 of one machine.
    plan = plan_text(write_inventory, """\
        all:
          children:
            worker:
              hosts:
                a: {ansible_host: Node1.Example}
                b: {ansible_host: node1.EXAMPLE}
                c: {ansible_host: "2001:db8::5"}
                d: {ansible_host: "2001:DB8:0:0::5"}
        """, mode="sync")
    assert [(task.host, task.port) for task in plan.tasks] == [("a", 2222), ("b", 2223), ("c", 2222), ("d", 2223)]


def workers_refused(write_inventory, *hosts: str) -> InventoryError:
    """The error of a sync plan of workers ``hosts`` (``name: {vars}`` lines, the first on line 5)."""
    lines = "".join(f"        {host}\n" for host in hosts)
    with pytest.raises(InventoryError) as caught:
        plan_text(write_inventory, f"all:\n  children:\n    worker:\n      hosts:\n{lines}", mode="sync")
    return caught.value


def test_a_task_on_the_ssh_port_of_the_machine_under_another_spelling_is_refused(write_inventory):
    error = workers_refused(write_inventory, "a: {ansible_host: Gate.Example, ansible_port: 2222}",
                            "b: {ansible_host: gate.example, worker_ports: [2222]}")
    assert "the SSH port of host a" in error.message
    assert error.key_path == "worker.hosts.a.ansible_port"


def test_a_thousand_hosts_on_250_machines_plan_fast_without_a_port_twice(write_inventory):
    # Two to four inventory names per machine (aliases, one machine per GPU pool...), spelled
    # in two cases: a plan, not a refusal, since two names for one machine is a real inventory;
    # the tasks of one machine get distinct ports.
    hosts = "\n".join(f"        h{i:04d}: {{ansible_host: {'NODE' if (i // 250) % 2 else 'node'}{i % 250}.lab}}"
                      for i in range(1000))
    ps = "\n".join(f"        h{i:04d}:" for i in range(0, 1000, 10))
    path = write_inventory(f"all:\n  children:\n    ps:\n      hosts:\n{ps}\n"
                           f"    worker:\n      hosts:\n{hosts}\n")
    started = time.process_time()        # this process's CPU: other work on the machine is no failure
    plan = plan_file(path)
    assert time.process_time() - started < 5         # 0.25 s measured
    assert len(plan.tasks) == 1100
    targets = [(machine_address(task.address), task.port) for task in plan.tasks]
    assert len(set(targets)) == len(targets)
    on_node7 = [(task.name, task.port) for task in plan.tasks if machine_address(task.address) == "node7.lab"]
    assert on_node7 == [("worker:7", 2222), ("worker:257", 2223), ("worker:507", 2224), ("worker:757", 2225)]


def test_auto_gpus_on_two_names_of_one_machine_are_refused_naming_both(write_inventory):
    # Each name resolves `auto` alone, from GPU 0: both names' workers would share GPU 0.
    error = workers_refused(write_inventory, "a: {ansible_host: gpu1.lab, worker_gpus: auto}",
                            "b: {ansible_host: GPU1.lab, worker_gpus: auto}", "c: {ansible_host: gpu2.lab, worker_gpus: auto}")
    assert error.message.endswith("worker_gpus: auto on host b and worker_gpus: auto on host a, one machine "
                                  "(gpu1.lab): both would take its GPUs from 0")
    assert error.key_path == "worker.hosts.b.worker_gpus"
    assert "lab.yaml:5" in error.hint


def test_ipv6_addresses_are_bracketed_in_targets(write_inventory):
    # gRPC and TF_CONFIG take "host:port"; an IPv6 literal must be written "[addr]:port",
    # or "2001:db8::5:2222" cannot be told apart from the address 2001:db8::5:2222.
    plan = plan_text(write_inventory, """\
        all:
          children:
            worker:
              hosts:
                node-a: {ansible_host: "2001:db8::5"}
        """, mode="sync")
    assert plan.cluster_spec == {"worker": ["[2001:db8::5]:2222"]}
    assert plan.task("worker:0").target == "[2001:db8::5]:2222"


def test_no_two_tasks_share_an_address_and_port():
    for plan in (local_plan(), lab_plan(), lab_plan(port_base=1024)):
        targets = [task.target for task in plan.tasks]
        assert len(targets) == len(set(targets))


# ----------------------------------------------------------------------------- GPU masks

def test_gpu_masks(write_inventory):
    plan = plan_text(write_inventory, """\
        all:
          children:
            chief:
              hosts:
                node-a: {chief_gpus: [[0]]}
            ps:
              hosts:
                node-a:
                node-b: {ps_gpus: [1]}
            worker:
              hosts:
                node-a: {worker_tasks: 2}
                node-b: {worker_gpus: [[0, 1], []]}
        """)
    assert [(task.name, task.cuda_visible_devices) for task in plan.tasks] == [
        ("chief:0", "0"),
        ("ps:0", ""),          # ps: CPU-only by default
        ("ps:1", "1"),         # ... unless the inventory says otherwise
        ("worker:0", None),    # worker: no mask by default
        ("worker:1", None),
        ("worker:2", "0,1"),
        ("worker:3", ""),
    ]
    env = {task.name: dict(task.env) for task in plan.tasks}
    assert env["ps:0"]["CUDA_VISIBLE_DEVICES"] == ""
    assert env["worker:2"]["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert "CUDA_VISIBLE_DEVICES" not in env["worker:0"]


# ----------------------------------------------------------------------------- modes

def test_async_mode():
    plan = local_plan(mode="async")
    assert list(plan.cluster_spec) == ["chief", "ps", "worker"]
    assert [task.name for task in plan.standing_tasks] == ["ps:0", "ps:1", "worker:0", "worker:1"]
    assert [task.name for task in plan.training_tasks] == ["chief:0"]
    assert plan.unused == ()


def test_sync_mode():
    plan = local_plan(mode="sync")
    assert plan.mode == "sync"
    # Ports stay those of the full inventory: chief and ps keep 2222-2224 although unused.
    assert plan.cluster_spec == {"worker": ["localhost:2225", "localhost:2226"]}
    assert [task.name for task in plan.tasks] == ["worker:0", "worker:1"]
    assert plan.standing_tasks == ()
    assert [role for role, _ in plan.unused] == ["chief", "ps"]
    assert all(reason for _, reason in plan.unused)
    assert plan.task("worker:1").argv == ("/here/venv/bin/python", "-m", "roles.train", "--mode", "sync")


def test_sync_ps_mode():
    plan = local_plan(mode="sync-ps")
    assert plan.cluster_spec == {"ps": ["localhost:2223", "localhost:2224"],
                                 "worker": ["localhost:2225", "localhost:2226"]}
    assert [task.name for task in plan.standing_tasks] == ["ps:0", "ps:1"]
    assert [task.name for task in plan.training_tasks] == ["worker:0", "worker:1"]
    assert [role for role, _ in plan.unused] == ["chief"]
    assert plan.task("worker:0").argv[-2:] == ("--mode", "sync-ps")


def test_mode_comes_from_options_then_inventory_then_async(write_inventory):
    assert local_plan().mode == "async"                     # pscluster_mode: async in local.yaml
    assert local_plan(mode="sync").mode == "sync"           # the option wins
    text = "all:\n  children:\n    chief: {hosts: {a: }}\n    ps: {hosts: {a: }}\n    worker: {hosts: {a: }}\n"
    assert plan_text(write_inventory, text).mode == "async"  # neither: async
    assert plan_text(write_inventory, "all:\n  vars:\n    pscluster_mode: sync-ps\n" + text[5:]).mode == "sync-ps"


def test_unknown_mode_option():
    with pytest.raises(PlanError) as caught:
        local_plan(mode="fast")
    assert caught.value.hint == "choose one of async, sync, sync-ps, between-graph"
    assert caught.value.exit_code == 2


def test_async_without_chief(write_inventory):
    path = write_inventory("all:\n  children:\n    ps: {hosts: {a: }}\n    worker: {hosts: {a: }}\n")
    with pytest.raises(PlanError) as caught:
        plan_file(path, mode="async")
    assert caught.value.message == "lab.yaml: mode async needs a chief task to run the ClusterCoordinator"
    assert "chief" in caught.value.hint and "--mode sync" in caught.value.hint
    # The same inventory runs in the modes that need no chief.
    assert plan_file(path, mode="sync").cluster_spec == {"worker": ["a:2223"]}
    assert plan_file(path, mode="sync-ps").cluster_spec == {"ps": ["a:2222"], "worker": ["a:2223"]}


@pytest.mark.parametrize("roles, mode", [(("chief", "ps", "worker"), "async"), (("ps", "worker"), "sync-ps"),
                                         (("worker",), "sync"),
                                         (("ps", "worker", "evaluator"), "sync-ps")])
def test_without_a_mode_the_default_comes_from_the_roles(write_inventory, roles, mode):
    """Issue 45 item 6: `plan` refused a workers-only inventory (async needs a chief) that
    `run --dry-run` planned; both now take the mode from default_mode of the inventory's roles."""
    from cluster.program.runspec import one_shot_roles
    groups = {**GROUPS, "evaluator": "    evaluator: {hosts: {a: }}\n"}
    path = write_inventory("all:\n  children:\n" + "".join(groups[role] for role in roles))
    inventory = load_inventory(path)
    assert inventory.roles() == roles and default_mode(roles) == mode
    assert plan_file(path).mode == mode
    assert plan_file(path, roles=one_shot_roles(inventory, None)).mode == mode


GROUPS = {"chief": "    chief: {hosts: {a: }}\n", "ps": "    ps: {hosts: {a: }}\n",
          "worker": "    worker: {hosts: {a: }}\n"}


@pytest.mark.parametrize("roles", [("chief", "ps", "worker"), ("ps", "worker"), ("chief", "worker"), ("worker",),
                                   ("ps",), ("chief", "ps"), ("chief",)])
@pytest.mark.parametrize("mode, in_file", [("async", False), ("sync", False), ("sync-ps", False),
                                           ("between-graph", False), ("async", True), ("sync-ps", True)])
def test_plan_and_a_one_shot_run_accept_and_reject_the_same_inventories(write_inventory, roles, mode, in_file):
    """`plan --mode M` and `run --mode M` (or pscluster_mode: M in the file) decide alike: both
    go through check_mode_roles (issue 24: plan refused async without a chief, run took it)."""
    from cluster.program.runspec import one_shot_roles
    head = "all:\n" + (f"  vars: {{pscluster_mode: {mode}}}\n" if in_file else "") + "  children:\n"
    path = write_inventory(head + "".join(GROUPS[role] for role in roles))
    given = None if in_file else mode

    def verdict(**options) -> str:
        try:
            plan_file(path, mode=given, **options)
        except PlanError:
            return "rejected"
        return "accepted"

    run_roles = one_shot_roles(load_inventory(path), given)
    assert verdict() == (verdict(roles=run_roles) if run_roles else "rejected")


def test_a_run_without_a_mode_takes_every_role_and_checks_none(write_inventory):
    path = write_inventory("all:\n  children:\n" + GROUPS["ps"] + GROUPS["worker"])
    assert plan_file(path).mode == "sync-ps"      # the default without a chief: ps and workers
    assert [t.name for t in plan_file(path, roles=("ps", "worker")).tasks] == ["ps:0", "worker:0"]


def test_between_graph_is_sync_ps(write_inventory):
    path = write_inventory("all:\n  vars: {pscluster_mode: between-graph}\n  children:\n" + GROUPS["ps"]
                           + GROUPS["worker"])
    assert load_inventory(path).mode == "sync-ps"
    assert plan_file(path).mode == plan_file(path, mode="between-graph").mode == "sync-ps"


@pytest.mark.parametrize("mode", ["sync-ps", "async"])
def test_modes_with_ps_need_a_ps(write_inventory, mode):
    path = write_inventory("all:\n  children:\n    chief: {hosts: {a: }}\n    worker: {hosts: {a: }}\n")
    with pytest.raises(PlanError) as caught:
        plan_file(path, mode=mode)
    assert caught.value.message == f"lab.yaml: mode {mode} needs at least one ps task"
    assert caught.value.hint == "add a 'ps' group with at least one host"
    assert plan_file(path, mode="sync").cluster_spec == {"worker": ["a:2223"]}


@pytest.mark.parametrize("mode", ["sync", "sync-ps", "async"])
def test_every_mode_needs_a_worker(write_inventory, mode):
    path = write_inventory("all:\n  children:\n    chief: {hosts: {a: }}\n    ps: {hosts: {a: }}\n")
    with pytest.raises(PlanError) as caught:
        plan_file(path, mode=mode)
    assert caught.value.message == f"lab.yaml: mode {mode} needs at least one worker task"


def test_at_most_one_chief(write_inventory):
    path = write_inventory("all:\n  children:\n    chief:\n      hosts:\n        a: {chief_tasks: 2}\n"
                           "    ps: {hosts: {a: }}\n    worker: {hosts: {a: }}\n")
    with pytest.raises(InventoryError) as caught:
        plan_file(path)
    assert (caught.value.line, caught.value.key_path) == (5, "chief.hosts.a.chief_tasks")
    assert "at most one" in caught.value.message


# ----------------------------------------------------------------------------- TF_CONFIG and environment

@pytest.mark.parametrize("mode", ["async", "sync", "sync-ps"])
def test_tf_config_per_task(mode):
    plan = lab_plan(mode=mode)
    for task in plan.tasks:
        tf_config = json.loads(plan.task_env(task)["TF_CONFIG"])
        assert tf_config == {"cluster": plan.cluster_spec, "task": {"type": task.role, "index": task.index}}
        assert plan.tf_config(task) == tf_config
        assert "TF_CONFIG" not in dict(task.env)      # built when the process starts (N4: O(N^2) otherwise)
        assert tf_config["cluster"][task.role][task.index] == task.target


def test_tf_config_hand_checked():
    plan = lab_plan(mode="sync-ps")
    assert plan.tf_config(plan.task("worker:2")) == {
        "cluster": {"ps": ["198.51.100.10:2223", "198.51.100.11:2222"],
                    "worker": ["198.51.100.10:2224", "198.51.100.11:2223", "198.51.100.11:2224"]},
        "task": {"type": "worker", "index": 2},
    }


def test_task_environment():
    plan = local_plan()
    env = dict(plan.task("ps:1").env)
    assert env["GRPC_FAIL_FAST"] == "use_caller"
    assert env["OMP_NUM_THREADS"] == "1"                  # pscluster_env of local.yaml
    assert (env["PSCLUSTER_CLUSTER"], env["PSCLUSTER_TASK"]) == ("local", "ps:1")
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert "TF_CPP_MIN_LOG_LEVEL" in env                  # quiet TF logging by default
    assert env["TF_ENABLE_ONEDNN_OPTS"] == "1"            # oneDNN CPU kernels on by default
    assert "PSCLUSTER_INTRA_OP_THREADS" not in env


def test_thread_settings_and_user_environment(write_inventory):
    plan = plan_text(write_inventory, """\
        all:
          vars:
            pscluster_intra_op_threads: 4
            pscluster_inter_op_threads: 2
            pscluster_env: {OMP_NUM_THREADS: 4, TF_CPP_MIN_LOG_LEVEL: 0, TF_ENABLE_ONEDNN_OPTS: 0}
          children:
            worker:
              hosts:
                node-a:
                node-b: {pscluster_env: {KMP_AFFINITY: compact}}
        """, mode="sync")
    env_a, env_b = (dict(task.env) for task in plan.tasks)
    assert (env_a["PSCLUSTER_INTRA_OP_THREADS"], env_a["PSCLUSTER_INTER_OP_THREADS"]) == ("4", "2")
    assert env_a["OMP_NUM_THREADS"] == "4"
    assert env_a["TF_CPP_MIN_LOG_LEVEL"] == "0"           # the user may turn TF logging back on
    assert env_a["TF_ENABLE_ONEDNN_OPTS"] == "0"          # ... and oneDNN off
    assert env_b["TF_ENABLE_ONEDNN_OPTS"] == "1"
    assert env_b["KMP_AFFINITY"] == "compact"             # a host's pscluster_env replaces the group's
    assert "OMP_NUM_THREADS" not in env_b
    assert env_b["GRPC_FAIL_FAST"] == "use_caller"


# ----------------------------------------------------------------------------- plan --json

@pytest.mark.parametrize("mode", ["async", "sync", "sync-ps"])
def test_to_json_matches_the_schema(mode):
    plan = lab_plan(mode=mode)
    document = json.loads(json.dumps(plan.to_json()))     # plain JSON types only
    jsonschema.validate(document, PLAN_SCHEMA)
    assert document["cluster"] == plan.cluster_spec
    assert [(t["role"], t["index"], t["host"], t["address"], t["port"], t["cuda_visible_devices"])
            for t in document["tasks"]] == \
        [(t.role, t.index, t.host, t.address, t.port, t.cuda_visible_devices) for t in plan.tasks]
    for entry, task in zip(document["tasks"], plan.tasks):
        assert entry["tf_config"] == plan.tf_config(task) == json.loads(entry["env"]["TF_CONFIG"])
        assert entry["argv"] == list(task.argv)


def test_to_json_masks_are_null_or_strings():
    document = lab_plan().to_json()
    assert [task["cuda_visible_devices"] for task in document["tasks"]] == [None, "", "", "0", "0", "1"]


# ----------------------------------------------------------------------------- determinism, loopback

def test_planning_is_deterministic():
    assert lab_plan() == lab_plan()
    assert lab_plan().to_json() == lab_plan().to_json()
    assert local_plan(mode="sync") == local_plan(mode="sync")


def test_plan_name_option():
    plan = lab_plan(name="exp1")
    assert plan.name == "exp1"
    assert dict(plan.task("ps:0").env)["PSCLUSTER_CLUSTER"] == "exp1"
    assert plan.task("ps:0").log_path == "/opt/pscluster/work/.pscluster/exp1/ps-0.log"


def test_single_host_plans_have_no_loopback_problem():
    plan = local_plan()
    assert not plan.is_multi_host
    assert loopback_addresses(plan) == []
    assert lab_plan().is_multi_host
    assert loopback_addresses(lab_plan()) == []


def test_loopback_addresses_in_a_multi_host_plan(write_inventory):
    plan = plan_text(write_inventory, """\
        all:
          children:
            chief:
              hosts:
                localhost:
            ps:
              hosts:
                node-b: {ansible_host: 10.0.0.2}
                node-c: {ansible_host: "::1"}
            worker:
              hosts:
                node-b:
                node-d: {ansible_host: 127.0.0.1}
        """)
    assert [task.name for task in loopback_addresses(plan)] == ["chief:0", "ps:1", "worker:1"]


def test_loopback_addresses_single_address_after_mode(write_inventory):
    # In sync mode only the workers are in the spec, all on 127.0.0.1: one host, nothing to report.
    plan = plan_text(write_inventory, """\
        all:
          children:
            ps:
              hosts:
                node-b: {ansible_host: 10.0.0.2}
            worker:
              hosts:
                node-d: {ansible_host: 127.0.0.1}
        """, mode="sync")
    assert loopback_addresses(plan) == []


# ----------------------------------------------------------------------------- SSH port collisions (issue 29)

TUNNEL = """\
    # pi-cluster's tunnel: every host is reached through one VPS address, each on its own SSH port
    [ps]
    pi1 ansible_host=vps.example.org ansible_port=2222
    [worker]
    pi2 ansible_host=vps.example.org ansible_port=2223
    [all:vars]
    pscluster_port_base='{base}'
    """


def test_a_task_on_the_ssh_port_of_its_address_is_an_error(write_inventory):
    with pytest.raises(InventoryError) as caught:
        plan_file(write_inventory(TUNNEL.format(base=2222), "hosts"), mode="sync-ps")
    error = caught.value
    assert (error.file, error.line, error.key_path) == ("hosts", 3, "ps.hosts.pi1.ansible_port")
    assert "ps:0 would listen on vps.example.org:2222, the SSH port of host pi1" in error.message
    assert "pscluster_port_base" in error.hint
    with pytest.raises(InventoryError, match="ps:0 would listen on vps.example.org:2223, the SSH port of host pi2"):
        plan_file(write_inventory(TUNNEL.format(base=2223), "hosts"), mode="sync-ps")
    plan = plan_file(write_inventory(TUNNEL.format(base=2300), "hosts"), mode="sync-ps")
    assert [task.target for task in plan.tasks] == ["vps.example.org:2300", "vps.example.org:2301"]


def test_an_explicit_port_on_the_default_ssh_port_is_an_error(write_inventory):
    with pytest.raises(InventoryError, match="worker:0 would listen on node-a:22, the SSH port") as caught:
        plan_text(write_inventory, "worker: {hosts: {node-a: {worker_ports: 22}}}\n", mode="sync")
    assert "worker_ports" in caught.value.hint


# ----------------------------------------------------------------------------- how hosts are reached (issue 29)

def test_plan_json_shows_how_each_host_is_reached_and_where_it_was_set(write_inventory):
    plan = plan_text(write_inventory, """\
        all:
          vars: {ansible_user: pi, ansible_ssh_private_key_file: ~/.ssh/k}
          children:
            worker:
              hosts:
                node-a:
                  ansible_port: "2200"
                  ansible_become: yes
                  ansible_become_user: trainer
                  ansible_ssh_common_args: -J ops@bastion.example.org
                here: {ansible_connection: local}
        """, mode="sync")
    hosts = {host["name"]: host for host in plan.to_json()["hosts"]}
    assert {key: value for key, value in hosts["node-a"].items() if key != "sources"} == {
        "name": "node-a", "address": "node-a", "transport": "ssh", "ssh_port": 2200, "user": "pi",
        "key_file": "~/.ssh/k", "jump": ["ops@bastion.example.org"], "become_user": "trainer",
        "python": "python3", "workdir": "~/pscluster"}
    assert hosts["node-a"]["sources"] == {
        "ansible_port": "lab.yaml:7", "ansible_user": "lab.yaml:2", "ansible_ssh_private_key_file": "lab.yaml:2",
        "ansible_ssh_common_args": "lab.yaml:10", "ansible_become": "lab.yaml:8", "ansible_become_user": "lab.yaml:9"}
    assert (hosts["here"]["transport"], hosts["here"]["workdir"]) == ("local", "/here/checkout")
    from cluster.console import host_line
    assert host_line(plan.host("node-a")).startswith(
        "node-a: ssh pi@node-a:2200 key ~/.ssh/k via ops@bastion.example.org as trainer, python python3, "
        "workdir ~/pscluster  [ansible_port lab.yaml:7, ")
