"""N4 (issue 25): inventories that blow up in size. A 103-byte file of one range made `plan`
print 51 MB and `plan --json` die of MemoryError at 2.9 GB: every TF_CONFIG held the whole
cluster, and loading was quadratic. Now hosts and tasks are capped with an error at the cap,
TF_CONFIG is built per process rather than stored per task, and 10,000 hosts plan in < 5 s
of CPU and < 500 MB."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from cluster.errors import InventoryError
from cluster.inventory import MAX_HOSTS, load_inventory
from cluster.plan import INLINE_TF_CONFIG_TASKS, MAX_TASKS, plan_cluster

from .test_plan import OPTIONS
from tests.helpers import REPO


def test_hosts_are_capped_for_the_whole_inventory_with_an_error_at_the_cap(write_inventory):
    # Each range is within the per-pattern cap; together they are not.
    path = write_inventory("worker:\n  hosts:\n    \"a[0:5999]\":\n    \"b[0:5999]\":\n")
    with pytest.raises(InventoryError, match=f"more than {MAX_HOSTS} hosts") as caught:
        load_inventory(path)
    assert caught.value.line == 4 and "b[0:5999]" in str(caught.value)


def test_thirty_ranges_of_ten_thousand_stop_at_the_cap_quickly(write_inventory):
    text = "worker:\n  hosts:\n" + "".join(f"    \"h{i}-[0:9999]\":\n" for i in range(30))
    with pytest.raises(InventoryError, match="more than"):
        load_inventory(write_inventory(text))


def test_exactly_the_cap_loads(write_inventory):
    inventory = load_inventory(write_inventory(f"worker:\n  hosts:\n    \"n[1:{MAX_HOSTS}]\":\n"))
    assert len(inventory.hosts) == MAX_HOSTS


def test_tasks_are_capped_with_an_error_naming_the_line(write_inventory):
    path = write_inventory("all:\n  vars: {pscluster_mode: sync}\nworker:\n  vars: {worker_tasks: 64}\n"
                           "  hosts:\n    \"n[0:999]\":\n")
    with pytest.raises(InventoryError, match=f"more than {MAX_TASKS} tasks") as caught:
        plan_cluster(load_inventory(path), OPTIONS)
    assert caught.value.line == 4


def test_a_big_plan_keeps_tf_config_out_of_each_task(write_inventory):
    count = INLINE_TF_CONFIG_TASKS + 1
    plan = plan_cluster(load_inventory(write_inventory(
        f"all: {{vars: {{pscluster_mode: sync}}}}\nworker: {{hosts: {{\"n[1:{count}]\": }}}}\n")), OPTIONS)
    document = plan.to_json()
    assert document["tf_config_inline"] is False
    assert document["tasks"][7]["tf_config"] == {"task": {"type": "worker", "index": 7}}
    assert "TF_CONFIG" not in document["tasks"][7]["env"]
    # ...while each process still gets the whole cluster.
    assert json.loads(plan.task_env(plan.tasks[7])["TF_CONFIG"])["cluster"] == document["cluster"]


MEASURE = textwrap.dedent("""
    import io, json, sys, time
    from cluster import cli
    sizes = {}
    for args in (["plan", sys.argv[1]], ["plan", sys.argv[1], "--json"]):
        out = io.StringIO()
        began = time.process_time()
        sys.stdout = out
        code = cli.run(args)
        sys.stdout = sys.__stdout__
        assert code == 0, code
        sizes[" ".join(args[2:]) or "text"] = {"cpu_s": time.process_time() - began, "bytes": len(out.getvalue())}
    # VmHWM, not ru_maxrss, which counts the forking pytest's memory from before exec.
    status = open("/proc/self/status").read()
    sizes["max_rss_mb"] = int(status.split("VmHWM:")[1].split()[0]) / 1024
    print(json.dumps(sizes))
""")


def test_ten_thousand_hosts_plan_in_under_five_seconds_and_500_mb(tmp_path):
    """Before: 10,000 hosts made `plan` print 1.3 GB in 118 s, `plan --json` took 23 GB."""
    inventory = tmp_path / "big.yaml"
    inventory.write_text(f"all: {{vars: {{pscluster_mode: sync}}}}\nworker: {{hosts: {{\"n[1:{MAX_HOSTS}]\": }}}}\n")
    proc = subprocess.run([sys.executable, "-c", MEASURE, str(inventory)], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(REPO), "NO_COLOR": "1", "COLUMNS": "200",
                                            "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    sizes = json.loads(proc.stdout)
    print(f"\n10,000 hosts: {sizes}")
    assert sizes["max_rss_mb"] < 500
    for output in ("text", "--json"):
        assert sizes[output]["cpu_s"] < 5
        assert sizes[output]["bytes"] < 20 * 2**20       # ~2 KB a task, never the cluster per task
