"""TFJob export (cluster/export.py, ``pscluster export``): the manifest is a valid Kubeflow TFJob
and is the same cluster as the plan.

Validity is checked against the TFJob CRD's own schema (tests/fixtures/tfjob.schema.json, see
tests/fixtures/README.md) with ``jsonschema``, plus what the API server would do that
``jsonschema`` does not: Kubernetes *prunes* fields a structural schema does not declare (silently,
so a misspelt field would just vanish), and checks ``int32``/``int64`` ranges. ``x-kubernetes-*``
keys are extensions ``jsonschema`` ignores; ``int-or-string`` fields carry their own ``anyOf``.
What the CRD leaves open (replica type names, restart policies, the container's name) is
checked against the operator's documented values below.
"""
from __future__ import annotations

import io
import json
import sys

import jsonschema
import pytest
import yaml
from rich.console import Console

from cluster.cli import Env, run
from cluster.hosts.codesync import project_root
from cluster.errors import PlanError, UsageError
from cluster.export import DEFAULT_IMAGE, REPLICA_TYPES, gpu_count, secret_refs, tfjob_manifest, train_command
from cluster.inventory import MODES, load_inventory
from cluster.plan import ClusterPlan, PlanOptions, plan_cluster
from cluster.state import StateStore

from .conftest import INVENTORIES, REPO

SCHEMA = json.loads((REPO / "tests" / "fixtures" / "tfjob.schema.json").read_text(encoding="utf-8"))
INVENTORY_FILES = ("local.yaml", "lab.yaml", "docker.yaml")
# What the training operator accepts where the CRD says only "string".
OPERATOR_REPLICA_TYPES = {"Chief", "Master", "PS", "Worker", "Evaluator"}
OPERATOR_RESTART_POLICIES = {"Always", "OnFailure", "Never", "ExitCode"}
OPERATOR_CLEAN_POD_POLICIES = {"None", "Running", "All"}

FORMATS = jsonschema.FormatChecker(formats=())


@FORMATS.checks("int32")
def _int32(value) -> bool:
    return not isinstance(value, int) or -2 ** 31 <= value < 2 ** 31


@FORMATS.checks("int64")
def _int64(value) -> bool:
    return not isinstance(value, int) or -2 ** 63 <= value < 2 ** 63


# OpenAPI 3.0 schema objects are JSON Schema draft-04/05 with extensions.
VALIDATOR = jsonschema.Draft4Validator(SCHEMA, format_checker=FORMATS)


def plan_of(path, mode: str | None = None, name: str | None = None) -> ClusterPlan:
    options = PlanOptions(local_python=sys.executable, local_workdir=str(project_root()), mode=mode, name=name)
    return plan_cluster(load_inventory(str(path)), options)


def schema_errors(manifest: dict) -> list[str]:
    return [f"{'.'.join(map(str, error.absolute_path))}: {error.message}"
            for error in VALIDATOR.iter_errors(manifest)]


def pruned_fields(value, schema: dict, path: str = "") -> list[str]:
    """Fields the API server would drop: keys not declared where the schema lists properties."""
    found = []
    if isinstance(value, dict):
        properties = schema.get("properties")
        additional = schema.get("additionalProperties")
        for key, item in value.items():
            if properties is not None and key in properties:
                found += pruned_fields(item, properties[key], f"{path}.{key}")
            elif isinstance(additional, dict):
                found += pruned_fields(item, additional, f"{path}.{key}")
            elif properties is not None and additional is not True \
                    and not schema.get("x-kubernetes-preserve-unknown-fields"):
                found.append(f"{path}.{key}")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            found += pruned_fields(item, schema["items"], f"{path}[{index}]")
    return found


def assert_valid_tfjob(manifest: dict) -> None:
    assert schema_errors(manifest) == []
    assert pruned_fields(manifest, SCHEMA) == []
    assert (manifest["apiVersion"], manifest["kind"]) == ("kubeflow.org/v1", "TFJob")
    specs = manifest["spec"]["tfReplicaSpecs"]
    assert specs and set(specs) <= OPERATOR_REPLICA_TYPES
    assert manifest["spec"]["runPolicy"]["cleanPodPolicy"] in OPERATOR_CLEAN_POD_POLICIES
    for spec in specs.values():
        assert spec["restartPolicy"] in OPERATOR_RESTART_POLICIES
        (container,) = spec["template"]["spec"]["containers"]
        assert container["name"] == "tensorflow"              # the operator looks the container up by name
        assert {"name": "tfjob-port", "containerPort": 2222} in container["ports"]
        names = [item["name"] for item in container["env"]]
        assert len(names) == len(set(names))
        assert not {"TF_CONFIG", "PSCLUSTER_TASK"} & set(names)   # the operator writes TF_CONFIG


def test_the_fixture_is_the_crds_schema():
    source = REPO.parent / "shared" / "data" / "k8s" / "kubeflow.org_tfjobs.yaml"
    if not source.exists():
        pytest.skip(f"{source} is not on this machine")
    crd = yaml.safe_load(source.read_text(encoding="utf-8"))
    assert crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"] == SCHEMA
    jsonschema.Draft4Validator.check_schema(SCHEMA)


def test_the_checks_catch_bad_manifests():
    """The validation is not vacuous: wrong types, bad ranges and unknown fields are found."""
    manifest = tfjob_manifest(plan_of(INVENTORIES / "lab.yaml"), image="example.org/pscluster:1")
    assert_valid_tfjob(manifest)
    worker = manifest["spec"]["tfReplicaSpecs"]["Worker"]
    worker["replicas"] = "3"
    worker["restartpolicy"] = "Never"                  # misspelt: Kubernetes would drop it silently
    worker["template"]["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "one"}}
    manifest["spec"]["runPolicy"]["backoffLimit"] = 2 ** 31
    errors = schema_errors(manifest)
    assert any(error.startswith("spec.tfReplicaSpecs.Worker.replicas:") for error in errors)
    assert any(error.startswith("spec.tfReplicaSpecs.Worker.template.spec.containers.0.resources.limits")
               for error in errors)
    assert any(error.startswith("spec.runPolicy.backoffLimit:") for error in errors)
    assert pruned_fields(manifest, SCHEMA) == [".spec.tfReplicaSpecs.Worker.restartpolicy"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("inventory", INVENTORY_FILES)
def test_export_is_a_valid_tfjob_equal_to_the_plan(inventory, mode):
    plan = plan_of(INVENTORIES / inventory, mode=mode)
    manifest = tfjob_manifest(plan, image=DEFAULT_IMAGE)
    assert_valid_tfjob(manifest)
    specs = manifest["spec"]["tfReplicaSpecs"]
    expected = {replica_type: len(plan.tasks_of(role)) for role, replica_type in REPLICA_TYPES
                if plan.tasks_of(role)}
    assert {replica_type: spec["replicas"] for replica_type, spec in specs.items()} == expected
    for role, replica_type in REPLICA_TYPES:
        tasks = plan.tasks_of(role)
        if not tasks:
            continue
        (container,) = specs[replica_type]["template"]["spec"]["containers"]
        gpus = max(gpu_count(task.cuda_visible_devices) for task in tasks)
        assert container.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0) == gpus
        if tasks[0].standing:
            assert container["command"] == ["python", "-m", "roles.server"]
        else:
            assert container["command"] == train_command(mode) == [
                "python", "-m", "roles.train", "--mode", mode, "--job", "examples/distributed_mnist",
                "--events", "/tmp/pscluster/events.jsonl", "--start-timeout", "300", "--collective-timeout", "60"]
        env = {item["name"]: item["value"] for item in container["env"]}
        shared = {key: value for key, value in tasks[0].env
                  if key not in ("TF_CONFIG", "PSCLUSTER_TASK", "CUDA_VISIBLE_DEVICES")}
        assert {key: env[key] for key in shared} == shared     # GRPC_FAIL_FAST, OMP_NUM_THREADS, ...
        assert env.get("CUDA_VISIBLE_DEVICES") == ("" if role == "ps" else None)


def test_lab_export_by_hand():
    """inventories/lab.yaml: chief without a mask, ps CPU-only, workers on [0], [0], [1]."""
    manifest = tfjob_manifest(plan_of(INVENTORIES / "lab.yaml"), image="registry.example/pscluster:2.21")
    specs = manifest["spec"]["tfReplicaSpecs"]
    assert list(specs) == ["Chief", "PS", "Worker"]
    assert [specs[kind]["replicas"] for kind in specs] == [1, 2, 3]
    limits = {kind: spec["template"]["spec"]["containers"][0].get("resources") for kind, spec in specs.items()}
    assert limits == {"Chief": None, "PS": None, "Worker": {"limits": {"nvidia.com/gpu": 1}}}
    assert "metadata" not in specs["Worker"]["template"]        # equal counts: no note
    assert manifest["metadata"]["name"] == "lab"
    assert manifest["metadata"]["annotations"]["pscluster/mode"] == "async"
    assert {spec["restartPolicy"] for spec in specs.values()} == {"OnFailure"}
    assert {spec["template"]["spec"]["containers"][0]["image"] for spec in specs.values()} == \
        {"registry.example/pscluster:2.21"}


def test_sync_mode_has_only_workers_and_sync_ps_no_chief():
    sync = tfjob_manifest(plan_of(INVENTORIES / "local.yaml", mode="sync"), image=DEFAULT_IMAGE)
    assert list(sync["spec"]["tfReplicaSpecs"]) == ["Worker"]
    assert "chief: sync mode" in sync["metadata"]["annotations"]["pscluster/unused-roles"]
    sync_ps = tfjob_manifest(plan_of(INVENTORIES / "local.yaml", mode="sync-ps"), image=DEFAULT_IMAGE)
    assert list(sync_ps["spec"]["tfReplicaSpecs"]) == ["PS", "Worker"]
    assert sync_ps["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["command"][2] == \
        "roles.train"


def test_different_gpu_counts_become_the_maximum_with_a_note(write_inventory):
    path = write_inventory("""\
        all:
          vars: {ansible_connection: local}
          children:
            chief: {hosts: {here: }}
            ps: {hosts: {here: }}
            worker: {hosts: {here: {worker_gpus: [[0], [1, 2], []]}}}
        """)
    manifest = tfjob_manifest(plan_of(path), image=DEFAULT_IMAGE)
    assert_valid_tfjob(manifest)
    worker = manifest["spec"]["tfReplicaSpecs"]["Worker"]
    assert worker["template"]["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 2}}
    note = worker["template"]["metadata"]["annotations"]["pscluster/gpus"]
    assert "worker:0=1, worker:1=2, worker:2=0" in note


def test_secret_values_are_referenced_never_written(write_inventory, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "from-this-shell")
    path = write_inventory("""\
        all:
          vars:
            ansible_connection: local
            pscluster_secret_env: [WANDB_API_KEY]
            pscluster_env: {OMP_NUM_THREADS: 2}
          children:
            chief: {hosts: {here: }}
            ps: {hosts: {here: }}
            worker: {hosts: {here: }}
        """, name="exp.yaml")
    manifest = tfjob_manifest(plan_of(path), image=DEFAULT_IMAGE)
    assert_valid_tfjob(manifest)
    text = yaml.safe_dump(manifest)
    assert "from-this-shell" not in text
    reference = {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "exp-env", "key": "WANDB_API_KEY"}}}
    for replica, spec in manifest["spec"]["tfReplicaSpecs"].items():
        env = spec["template"]["spec"]["containers"][0]["env"]
        assert (reference in env) == (replica == "Chief")       # the trainer; ps/worker stand (async)
        assert {"name": "OMP_NUM_THREADS", "value": "2"} in env
    assert secret_refs(manifest) == {"exp-env": ("WANDB_API_KEY",)}


def _replica_secrets(manifest) -> dict[str, list[str]]:
    return {replica: [item["name"] for item in spec["template"]["spec"]["containers"][0]["env"] if "valueFrom" in item]
            for replica, spec in manifest["spec"]["tfReplicaSpecs"].items()}


def test_standing_servers_get_no_secret_they_were_not_given(write_inventory):
    """N3 (issue 25): only host b names the secret; the PS and both Worker replicas (standing
    servers, roles.server) got WANDB_API_KEY, host c's too, which never named it."""
    path = write_inventory("""\
        all:
          children:
            chief: {hosts: {b: {ansible_host: 198.51.100.2}}}
            ps: {hosts: {b: }}
            worker: {hosts: {b: , c: {ansible_host: 198.51.100.3}}}
          vars: {pscluster_env: {OMP_NUM_THREADS: 2}}
        """.replace("b: {ansible_host", "b: {pscluster_secret_env: [WANDB_API_KEY], ansible_host"), name="exp.yaml")
    manifest = tfjob_manifest(plan_of(path), image=DEFAULT_IMAGE)
    assert _replica_secrets(manifest) == {"Chief": ["WANDB_API_KEY"], "PS": [], "Worker": []}


def test_servers_get_secrets_where_secret_env_roles_asks(write_inventory):
    path = write_inventory("""\
        all:
          vars: {ansible_connection: local, pscluster_secret_env: [WANDB_API_KEY], pscluster_secret_env_roles: [ps]}
          children:
            chief: {hosts: {here: }}
            ps: {hosts: {here: }}
            worker: {hosts: {here: }}
        """, name="exp.yaml")
    assert _replica_secrets(tfjob_manifest(plan_of(path), image=DEFAULT_IMAGE)) == \
        {"Chief": ["WANDB_API_KEY"], "PS": ["WANDB_API_KEY"], "Worker": []}


def test_a_secret_for_some_trainers_only_is_refused(write_inventory):
    path = write_inventory("""\
        all:
          vars: {pscluster_mode: sync}
          children:
            worker:
              hosts:
                b: {ansible_host: 198.51.100.2, pscluster_secret_env: [WANDB_API_KEY]}
                c: {ansible_host: 198.51.100.3}
        """, name="exp.yaml")
    with pytest.raises(PlanError, match="secret WANDB_API_KEY goes to worker:0 but not to worker:1"):
        tfjob_manifest(plan_of(path), image=DEFAULT_IMAGE)


def test_an_environment_that_differs_within_a_role_is_refused(write_inventory):
    path = write_inventory("""\
        all:
          children:
            worker:
              hosts:
                a: {ansible_host: 198.51.100.1, pscluster_env: {OMP_NUM_THREADS: 1}}
                b: {ansible_host: 198.51.100.2, pscluster_env: {OMP_NUM_THREADS: 4}}
        """)
    with pytest.raises(PlanError) as caught:
        tfjob_manifest(plan_of(path, mode="sync"), image=DEFAULT_IMAGE)
    assert "OMP_NUM_THREADS differs between worker tasks" in caught.value.message


@pytest.mark.parametrize("arguments, message", [
    ({"name": "My_Lab"}, "'My_Lab' is not a valid TFJob name"),
    ({"restart_policy": "on-failure"}, "unknown restart policy 'on-failure'"),
    ({"image": ""}, "'' is not a container image reference"),
])
def test_bad_arguments(arguments, message):
    with pytest.raises(UsageError) as caught:
        tfjob_manifest(plan_of(INVENTORIES / "lab.yaml"), **{"image": DEFAULT_IMAGE, **arguments})
    assert caught.value.message == message


def test_job_command_and_restart_policy_are_used():
    manifest = tfjob_manifest(plan_of(INVENTORIES / "lab.yaml", mode="sync"), image=DEFAULT_IMAGE,
                              job_command=["python", "-m", "roles.train", "--mode", "sync", "--job", "/jobs/mine.py",
                                           "--events", "/tmp/e.jsonl"], restart_policy="ExitCode", name="exp-7")
    assert_valid_tfjob(manifest)
    (worker,) = manifest["spec"]["tfReplicaSpecs"].values()
    assert worker["restartPolicy"] == "ExitCode"
    assert worker["template"]["spec"]["containers"][0]["command"][6] == "/jobs/mine.py"
    assert manifest["metadata"]["name"] == "exp-7"


# ----------------------------------------------------------------------------- CLI

class Captured:
    def __init__(self, state_dir):
        self.stdout, self.stderr = io.StringIO(), io.StringIO()
        self.env = Env(out=Console(file=self.stdout, width=500, color_system=None),
                       err=Console(file=self.stderr, width=500, color_system=None),
                       store=StateStore(state_dir))

    def run(self, *argv: str) -> int:
        return run(list(argv), env=self.env)


def test_cli_writes_a_valid_tfjob_to_output(tmp_path):
    cli = Captured(tmp_path / "state")
    output = tmp_path / "lab-tfjob.yaml"
    assert cli.run("export", str(INVENTORIES / "lab.yaml"), "--format", "tfjob", "--image", "reg.example/ps:1",
                   "--output", str(output)) == 0
    manifest = yaml.safe_load(output.read_text(encoding="utf-8"))
    assert_valid_tfjob(manifest)
    assert manifest == tfjob_manifest(plan_of(INVENTORIES / "lab.yaml"), image="reg.example/ps:1")
    assert list(manifest) == ["apiVersion", "kind", "metadata", "spec"]       # sort_keys=False
    assert cli.stdout.getvalue() == ""
    assert str(output) in cli.stderr.getvalue()
    assert not (tmp_path / "state").exists()                                  # touches no state


def test_cli_prints_the_manifest_with_options(tmp_path):
    cli = Captured(tmp_path)
    assert cli.run("export", str(INVENTORIES / "docker.yaml"), "--mode", "sync-ps", "--name", "exp-1",
                   "--job", "distributed_mnist", "--restart-policy", "Never") == 0
    manifest = yaml.safe_load(cli.stdout.getvalue())
    assert_valid_tfjob(manifest)
    assert manifest == tfjob_manifest(plan_of(INVENTORIES / "docker.yaml", mode="sync-ps", name="exp-1"),
                                      image=DEFAULT_IMAGE, restart_policy="Never")


@pytest.mark.parametrize("argv", [
    ("--format", "helm"),
    ("--job", "no_such_job"),
    ("--name", "Not_A_Name"),
    ("--restart-policy", "sometimes"),
])
def test_cli_bad_input_exits_2(tmp_path, argv):
    cli = Captured(tmp_path)
    assert cli.run("export", str(INVENTORIES / "lab.yaml"), *argv) == 2
    assert cli.stdout.getvalue() == ""


def test_cli_unwritable_output_exits_2(tmp_path):
    cli = Captured(tmp_path)
    assert cli.run("export", str(INVENTORIES / "lab.yaml"), "-o", str(tmp_path / "missing" / "x.yaml")) == 2
    assert "cannot write" in cli.stderr.getvalue()
