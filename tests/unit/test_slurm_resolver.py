"""TF_CONFIG cross-check: pscluster's cluster spec vs tf.distribute's SlurmClusterResolver.

Same allocation (canned SLURM_* variables, a fake ``scontrol`` on PATH that expands node lists
with pscluster's own expander), same layout. Where they agree the specs are equal; where they do
not, the test pins the difference documented in README "On a Slurm cluster": the resolver fills
each node's task slots in node order and hands them to jobs in *sorted job-name order* (chief,
evaluator, ps, worker), so with ps beside the workers its ps land on the first node(s); pscluster
spreads one ps per node (the point of ps: spread the variables' bandwidth). Jobs, task counts
and hosts used are the same either way.
"""
from __future__ import annotations

import os
import sys
import textwrap

import pytest
import yaml

from cluster.inventory import load_inventory
from cluster.plan import PlanOptions, plan_cluster
from cluster.slurm_layout import Allocation, SlurmLayout, layout_inventory, tf_resolver_jobs

resolver_module = pytest.importorskip(
    "tensorflow.python.distribute.cluster_resolver.slurm_cluster_resolver")


@pytest.fixture
def fake_scontrol(tmp_path, monkeypatch):
    tool = tmp_path / "bin" / "scontrol"
    tool.parent.mkdir()
    tool.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import sys
        sys.path.insert(0, {os.getcwd()!r})
        from cluster.slurm_layout import expand_nodelist
        assert sys.argv[1:3] == ["show", "hostnames"], sys.argv
        print("\\n".join(expand_nodelist(sys.argv[3])))
        """))
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tool.parent}{os.pathsep}{os.environ['PATH']}")


def _pscluster_spec(tmp_path, alloc, layout, mode):
    doc = layout_inventory(alloc, layout, python=sys.executable, workdir=str(tmp_path), mode=mode,
                           port_base=8888)
    path = tmp_path / "slurm.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    plan = plan_cluster(load_inventory(str(path)), PlanOptions(local_python=sys.executable,
                                                               local_workdir=str(tmp_path)))
    per_node = {}
    for task in plan.tasks:
        per_node[task.host] = per_node.get(task.host, 0) + 1
    return {role: list(addresses) for role, addresses in plan.cluster}, doc, per_node


def _resolver_spec(monkeypatch, nodelist, per_node, jobs):
    total = sum(per_node.values())
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", str(total))
    monkeypatch.setenv("SLURM_STEP_NODELIST", nodelist)
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", ",".join(str(per_node[n]) for n in sorted(per_node)))
    # CPU-only: gpus_per_node must be >= tasks per node, or the resolver refuses (docs/platform-notes.md S3).
    resolver = resolver_module.SlurmClusterResolver(jobs=jobs, port_base=8888, auto_set_gpu=False,
                                                    gpus_per_node=max(per_node.values()), gpus_per_task=1)
    return resolver.cluster_spec().as_dict()


def test_workers_only_layout_matches_the_resolver_exactly(tmp_path, monkeypatch, fake_scontrol):
    alloc = Allocation("7", ("n1", "n2"), (2, 2), ((), ()))
    ours, doc, per_node = _pscluster_spec(tmp_path, alloc, SlurmLayout(ps=0, chief=False), "sync")
    theirs = _resolver_spec(monkeypatch, "n[1-2]", per_node, tf_resolver_jobs(doc))
    assert ours == theirs == {"worker": ["n1:8888", "n1:8889", "n2:8888", "n2:8889"]}


def test_default_ps_layout_differs_only_in_placement(tmp_path, monkeypatch, fake_scontrol):
    alloc = Allocation("7", ("n1", "n2"), (1, 1), ((), ()))
    ours, doc, per_node = _pscluster_spec(tmp_path, alloc, SlurmLayout(), "async")
    theirs = _resolver_spec(monkeypatch, "n[1-2]", per_node, tf_resolver_jobs(doc))
    def hosts(spec):
        return {job: sorted(a.split(":")[0] for a in addrs) for job, addrs in spec.items()}
    assert {job: len(addrs) for job, addrs in ours.items()} == {job: len(a) for job, a in theirs.items()}
    assert hosts(ours) == {"chief": ["n1"], "ps": ["n1", "n2"], "worker": ["n1", "n2"]}
    # The documented difference: the resolver packs both ps onto n1, beside the chief.
    assert hosts(theirs) == {"chief": ["n1"], "ps": ["n1", "n1"], "worker": ["n2", "n2"]}
