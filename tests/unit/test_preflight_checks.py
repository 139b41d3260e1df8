"""Preflight checks as pure functions (cluster/hosts/preflight.py ``check_host``, ``check_cluster``).

HostFacts are written by hand, as a host would report them; the plan is that of the shipped
lab inventory (node-a: chief, ps:0 on 2223, worker:0 on GPU 0 at 2224; node-b: ps:1 on 2222,
worker:1 on GPU 0 at 2223, worker:2 on GPU 1 at 2224).
"""
from __future__ import annotations

import dataclasses

import pytest

from cluster.contracts import TensorFlowNeed
from cluster.errors import MultiHostError
from cluster.hosts.hostops import HostFacts
from cluster.inventory import load_inventory
from cluster.plan import ClusterPlan, PlanOptions, plan_cluster
from cluster.hosts.preflight import CheckReport, CheckResult, check_cluster, check_host

from .conftest import INVENTORIES

OPTIONS = PlanOptions(local_python="/here/python", local_workdir="/here/checkout")


@pytest.fixture(scope="module")
def lab() -> ClusterPlan:
    return plan_cluster(load_inventory(str(INVENTORIES / "lab.yaml")), OPTIONS)


@pytest.fixture(scope="module")
def local() -> ClusterPlan:
    return plan_cluster(load_inventory(str(INVENTORIES / "local.yaml")), OPTIONS)


def facts(host: str, **changes) -> HostFacts:
    healthy = HostFacts(
        host=host, python="3.11.9", executable="/opt/pscluster/venv/bin/python", hostname=host, cpus=8,
        tf_dist="tensorflow", tf_version="2.21.0", tf_importable=True, busy_ports=(),
        gpus=("GPU 0: NVIDIA A100 (UUID: GPU-0)", "GPU 1: NVIDIA A100 (UUID: GPU-1)"), gpu_error=None,
        workdir_error=None, tools=(), uid=1000)
    return dataclasses.replace(healthy, **changes)


def by_check(results: list[CheckResult]) -> dict[str, CheckResult]:
    checks = {result.check: result for result in results}
    assert len(checks) == len(results), "one result per check"
    return checks


def failed(results: list[CheckResult]) -> list[tuple[str, str]]:
    return [(result.host, result.check) for result in results if not result.ok]


def test_healthy_host(lab):
    results = check_host(lab, lab.host("node-b"), facts("node-b"), 0.25)
    assert [result.check for result in results] == ["ssh", "python", "tensorflow", "ports", "gpus", "workdir"]
    assert all(result.ok for result in results)
    assert {result.host for result in results} == {"node-b"}
    checks = by_check(results)
    assert checks["ssh"].detail == "connected in 0.25 s"
    assert checks["ports"].detail == "free: 2222, 2223, 2224"
    assert checks["tensorflow"].detail == "tensorflow 2.21.0"


def test_local_host_without_gpu_masks_has_no_gpu_check(local):
    host_facts = facts("localhost", gpus=None, gpu_error="nvidia-smi: not found")
    results = check_host(local, local.host("localhost"), host_facts, 0.0)
    checks = by_check(results)
    assert "gpus" not in checks              # ps masks are "" (CPU-only): no GPU needed
    assert checks["ssh"].detail == "local (no SSH)"
    assert all(result.ok for result in results)


def test_busy_port_names_the_task(lab):
    host_facts = facts("node-b", busy_ports=((2223, "[Errno 98] Address already in use"),))
    results = check_host(lab, lab.host("node-b"), host_facts, 0.1)
    assert failed(results) == [("node-b", "ports")]
    ports = by_check(results)["ports"]
    assert ports.detail == "in use: 2223 (worker:1: [Errno 98] Address already in use)"
    assert "pscluster_port_base" in ports.hint


def test_busy_ports_of_another_host_do_not_matter(lab):
    # node-a's tasks use 2222-2224 too, but 2225 is not one of them.
    results = check_host(lab, lab.host("node-a"), facts("node-a", busy_ports=((2225, "in use"),)), 0.1)
    assert failed(results) == []


def test_gpu_index_beyond_the_host_names_the_task(lab):
    host_facts = facts("node-b", gpus=("GPU 0: NVIDIA A100 (UUID: GPU-0)",))
    results = check_host(lab, lab.host("node-b"), host_facts, 0.1)
    assert failed(results) == [("node-b", "gpus")]
    gpus = by_check(results)["gpus"]
    assert gpus.detail == "worker:2 ask(s) for GPU 1, but 1 GPU(s) found"
    assert "_gpus" in gpus.hint


def test_gpus_asked_but_nvidia_smi_missing(lab):
    host_facts = facts("node-b", gpus=None, gpu_error="nvidia-smi: command not found")
    gpus = by_check(check_host(lab, lab.host("node-b"), host_facts, 0.1))["gpus"]
    assert not gpus.ok
    assert gpus.detail == "worker:1, worker:2 ask(s) for GPU 0, 1, but nvidia-smi: command not found"


@pytest.mark.parametrize("changes, detail", [
    ({"tf_version": None, "tf_dist": None, "tf_importable": False},
     "TensorFlow is not installed for /opt/pscluster/venv/bin/python"),
    ({"tf_importable": False}, "TensorFlow is not installed for /opt/pscluster/venv/bin/python"),
    ({"tf_version": "2.15.1"}, "tensorflow 2.15.1 is too old (need 2.16 or newer)"),
    ({"tf_version": "2.9.3"}, "tensorflow 2.9.3 is too old (need 2.16 or newer)"),     # 9 < 16, not "9" > "1"
    ({"tf_version": "1.15.5", "tf_dist": "tensorflow-gpu"}, "tensorflow-gpu 1.15.5 is too old (need 2.16 or newer)"),
])
def test_tensorflow_missing_or_too_old(lab, changes, detail):
    results = check_host(lab, lab.host("node-a"), facts("node-a", **changes), 0.1)
    assert failed(results) == [("node-a", "tensorflow")]
    tensorflow = by_check(results)["tensorflow"]
    assert tensorflow.detail == detail
    assert tensorflow.hint


@pytest.mark.parametrize("version", ["2.16.0", "2.16.0rc1", "2.21.0", "3.0.0"])
def test_tensorflow_new_enough(lab, version):
    tensorflow = by_check(check_host(lab, lab.host("node-a"), facts("node-a", tf_version=version), 0.1))["tensorflow"]
    assert tensorflow.ok


def test_workdir_not_writable(lab):
    results = check_host(lab, lab.host("node-a"), facts("node-a", workdir_error="Permission denied"), 0.1)
    assert failed(results) == [("node-a", "workdir")]
    assert by_check(results)["workdir"].detail == "not writable: Permission denied"


def test_no_firewall_check_without_firewall(lab):
    results = check_host(lab, lab.host("node-a"), facts("node-a", tools=(("nft", False),)), 0.1)
    assert "firewall" not in by_check(results)


@pytest.mark.parametrize("nft, root, ok, words", [
    (True, True, True, "nft and root available"),
    (False, True, False, "nft is not installed"),
    (True, False, False, "uid 1000 has neither root nor passwordless sudo"),
    (False, False, False, "nft is not installed and uid 1000"),
])
def test_firewall_needs_nft_and_root(lab, nft, root, ok, words):
    plan = dataclasses.replace(lab, firewall=True)
    host_facts = dataclasses.replace(facts("node-a", tools=(("nft", nft),)), root=root)
    check = by_check(check_host(plan, plan.host("node-a"), host_facts, 0.1))["firewall"]
    assert check.ok is ok
    assert words in check.detail
    assert (check.hint is None) is ok


def test_cluster_with_one_tensorflow_version(lab):
    assert check_cluster(lab, {"node-a": facts("node-a"), "node-b": facts("node-b")}) == []


def test_tensorflow_versions_differ_across_hosts(lab):
    results = check_cluster(lab, {"node-a": facts("node-a"), "node-b": facts("node-b", tf_version="2.20.0")})
    assert failed(results) == [("node-b", "tensorflow")]
    assert results[0].detail == "TensorFlow 2.20.0 here but 2.21.0 on node-a"
    assert results[0].hint


def test_host_without_tensorflow_is_not_a_version_mismatch(lab):
    # The missing TensorFlow is check_host's finding; check_cluster compares installed versions only.
    results = check_cluster(lab, {"node-a": facts("node-a"),
                                  "node-b": facts("node-b", tf_version=None, tf_importable=False)})
    assert results == []


def test_loopback_address_in_a_multi_host_plan(write_inventory):
    path = write_inventory("""\
        all:
          children:
            chief:
              hosts:
                localhost:
            ps:
              hosts:
                node-b: {ansible_host: 10.0.0.2}
            worker:
              hosts:
                node-b:
                node-c: {ansible_host: 127.0.0.1}
        """)
    plan = plan_cluster(load_inventory(path), OPTIONS)
    results = check_cluster(plan, {})
    assert failed(results) == [("localhost", "address"), ("node-c", "address")]
    assert results[0].detail.startswith("chief:0 has address 'localhost' in a multi-host cluster")
    assert results[1].detail.startswith("worker:1 has address '127.0.0.1' in a multi-host cluster")
    assert "ansible_host" in results[1].hint


def test_loopback_address_in_a_single_host_plan_is_fine(local):
    assert check_cluster(local, {"localhost": facts("localhost")}) == []


def test_report_of_failures_leads_with_the_root_cause(lab):
    results = (check_host(lab, lab.host("node-a"), facts("node-a"), 0.1) +
               check_host(lab, lab.host("node-b"), facts("node-b", gpus=()), 0.1))
    report = CheckReport(tuple(results), (), 0.5)
    assert not report.ok
    assert [(result.host, result.check) for result in report.failures] == [("node-b", "gpus")]
    with pytest.raises(MultiHostError) as caught:
        report.raise_for_failures()
    assert caught.value.root_cause.message.startswith("node-b: gpus: worker:1, worker:2 ask(s) for GPU 0, 1")
    lines = str(caught.value).splitlines()
    assert lines[0] == "preflight failed on 1 host(s): node-b; nothing was started"
    assert lines[1].startswith("Root cause (first observed failure): node-b: gpus: ")


# ------------------------------------------------------------------ host-to-host reach verdicts
def _reach_tasks(n: int):
    from types import SimpleNamespace
    return [SimpleNamespace(host=f"node-{i}", port=2222, target=f"127.77.0.{i}:2222") for i in range(1, n + 1)]


def _all_to_all(n: int, outcome=lambda source, target: "ok") -> dict[str, dict[str, str]]:
    return {f"node-{s}": {f"127.77.0.{t}:2222": outcome(s, t) for t in range(1, n + 1) if t != s}
            for s in range(1, n + 1)}


def test_reach_all_paths_open_passes_every_host():
    from cluster.hosts.preflight import reach_results
    results = reach_results([f"node-{i}" for i in range(1, 4)], _reach_tasks(3), _all_to_all(3))
    assert [(r.host, r.ok, r.detail) for r in results] == [
        ("node-1", True, "reaches 2 peer port(s)"), ("node-2", True, "reaches 2 peer port(s)"),
        ("node-3", True, "reaches 2 peer port(s)")]


def test_reach_one_blocked_path_is_named_from_the_host_that_tried_it():
    from cluster.hosts.preflight import reach_results
    reached = _all_to_all(3, lambda s, t: "timed out" if (s, t) == (2, 3) else "ok")
    results = reach_results([f"node-{i}" for i in range(1, 4)], _reach_tasks(3), reached)
    failed = [r for r in results if not r.ok]
    assert [(r.host, r.detail) for r in failed] == [("node-2", "node-2 → node-3:2222 timed out")]
    assert "firewall or route between these hosts" in failed[0].hint
    assert {r.host for r in results if r.ok} == {"node-1", "node-3"}


def test_reach_a_port_nobody_reaches_is_blamed_once_on_its_host():
    """64 hosts whose connects all time out toward node-12: one line, on node-12, not 63."""
    from cluster.hosts.preflight import reach_results
    reached = _all_to_all(64, lambda s, t: "timed out" if t == 12 else "ok")
    results = reach_results([f"node-{i}" for i in range(1, 65)], _reach_tasks(64), reached)
    failed = [r for r in results if not r.ok]
    assert [(r.host, r.detail) for r in failed] == [("node-12", "node-12:2222 answered none of its 63 peers (timed out)")]
    assert "a firewall on node-12 (or its route) blocks port 2222" in failed[0].hint
    assert sum(r.ok for r in results) == 1          # node-12 itself reached everyone; the others tried node-12


def test_reach_many_blocked_paths_make_one_line_per_host_and_outcome():
    from cluster.hosts.preflight import REACH_NAMED, reach_results
    # node-1 can reach nobody (its own outbound path is cut); everyone else reaches everyone
    reached = _all_to_all(10, lambda s, t: "refused" if s == 1 and t % 2 else ("timed out" if s == 1 else "ok"))
    results = reach_results([f"node-{i}" for i in range(1, 11)], _reach_tasks(10), reached)
    failed = [r for r in results if not r.ok]
    assert [r.host for r in failed] == ["node-1", "node-1"]            # one line per outcome
    timed_out = next(r.detail for r in failed if r.detail.endswith("timed out"))
    refused = next(r.detail for r in failed if r.detail.endswith("refused"))
    assert timed_out == "node-1 → node-2:2222, node-4:2222, node-6:2222, node-8:2222, node-10:2222 timed out"
    assert refused == "node-1 → node-3:2222, node-5:2222, node-7:2222, node-9:2222 refused"
    assert REACH_NAMED == 5
    reached = _all_to_all(20, lambda s, t: "timed out" if s == 1 else "ok")
    (line,) = [r.detail for r in reach_results([f"node-{i}" for i in range(1, 21)], _reach_tasks(20), reached)
               if not r.ok]
    assert line == "node-1 → node-2:2222, node-3:2222, node-4:2222, node-5:2222, node-6:2222 and 14 more timed out"


@pytest.mark.parametrize("outcome", [
    lambda s, t: "ok",
    lambda s, t: "timed out" if (s, t) == (2, 3) else "ok",
    lambda s, t: "timed out" if t == 4 else "ok",
    lambda s, t: "refused" if s == 1 and t % 2 else ("timed out" if s == 1 else "ok"),
])
def test_reach_verdicts_from_failures_and_counts_are_those_from_every_outcome(outcome):
    """``up`` asks hosts for their failed connects only, with how many they tried (issue 46: N
    hosts sent N² "ok"s); the verdicts must not change."""
    from cluster.hosts.preflight import reach_results
    hosts = [f"node-{i}" for i in range(1, 9)]
    every = _all_to_all(8, outcome)
    failed_only = {source: {t: o for t, o in found.items() if o != "ok"} for source, found in every.items()}
    tried = {f"127.77.0.{t}:2222": 7 for t in range(1, 9)}
    attempts = {source: 7 for source in hosts}
    assert reach_results(hosts, _reach_tasks(8), failed_only, tried=tried, attempts=attempts) == \
        reach_results(hosts, _reach_tasks(8), every)


def test_reach_names_blocked_peers_in_inventory_order_whatever_order_they_answered_in():
    from cluster.hosts.preflight import reach_results
    reached = _all_to_all(4, lambda s, t: "timed out" if s == 1 else "ok")
    reached["node-1"] = dict(reversed(list(reached["node-1"].items())))     # answers arrive in any order
    (line,) = [r.detail for r in reach_results([f"node-{i}" for i in range(1, 5)], _reach_tasks(4), reached)
               if not r.ok]
    assert line == "node-1 → node-2:2222, node-3:2222, node-4:2222 timed out"


@pytest.mark.parametrize("changes", [
    {"tf_version": None, "tf_dist": None, "tf_importable": False},
    {"tf_version": "2.15.1"},
])
def test_tensorflow_missing_or_too_old_is_a_warning_where_optional(lab, changes):
    results = check_host(lab, lab.host("node-a"), facts("node-a", **changes), 0.1, tensorflow=TensorFlowNeed.OPTIONAL)
    assert failed(results) == []
    tensorflow = by_check(results)["tensorflow"]
    assert tensorflow.ok and tensorflow.warning and tensorflow.hint
    assert tensorflow.detail.endswith("; run goes on: a program that imports it will fail")
    assert not by_check(check_host(lab, lab.host("node-a"), facts("node-a", **changes), 0.1))["tensorflow"].warning


def test_tensorflow_versions_that_differ_are_a_warning_where_optional(lab):
    hosts = {"node-a": facts("node-a"), "node-b": facts("node-b", tf_version="2.20.0")}
    (required,) = check_cluster(lab, hosts)
    (optional,) = check_cluster(lab, hosts, tensorflow=TensorFlowNeed.OPTIONAL)
    assert (required.host, required.ok, required.warning) == ("node-b", False, False)
    assert (optional.host, optional.ok, optional.warning) == ("node-b", True, True)
    assert optional.detail.startswith(required.detail)


def test_tasks_that_would_run_as_root_are_warned_on_any_transport(lab):
    """Issue 42, L10: a TF server runs any graph it is sent; as root, that is root on the host."""
    results = check_host(lab, lab.host("node-a"), facts("node-a", uid=0), 0.1)
    assert failed(results) == []
    user = by_check(results)["user"]
    assert user.ok and user.warning and "tasks run as root (uid 0)" in user.detail and "ansible_user" in user.hint
    assert "user" not in by_check(check_host(lab, lab.host("node-a"), facts("node-a"), 0.1))


def test_a_workdir_others_can_write_fails_preflight(lab):
    """Issue 42, L2."""
    unsafe = "the workdir /tmp is writable by group or others (mode 1777): anyone there can replace the code the tasks run"
    workdir = by_check(check_host(lab, lab.host("node-a"), facts("node-a", workdir_unsafe=unsafe), 0.1))["workdir"]
    assert not workdir.ok and workdir.detail == f"refused: {unsafe}" and "pscluster_workdir" in workdir.hint


def test_reach_listeners_outlive_the_fan_out_of_a_large_check():
    # A 256-host check took ~40 s to open every listener and connect (benchmarks/scale.py): a
    # fixed 18 s had the first hosts' listeners gone ("refused") before their peers connected.
    from cluster.hosts.preflight import REACH_TIMEOUT, listen_seconds
    assert listen_seconds(2) == pytest.approx(6 * REACH_TIMEOUT + 1.0)
    assert listen_seconds(256) >= 120 and listen_seconds(1000) > listen_seconds(256)
