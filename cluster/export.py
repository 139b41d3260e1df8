"""Export a :class:`~cluster.plan.ClusterPlan` to a Kubeflow TFJob (``kubeflow.org/v1``).

Pure: a plan in, a manifest (plain dict, ready for ``yaml.safe_dump``) out. The TFJob is the
same cluster as ``pscluster up`` + ``train`` would run, translated to what the Kubeflow
training operator does itself:

* one replica spec per role of the plan (``Chief``, ``PS``, ``Worker``, ``Evaluator``) with the
  plan's task count; roles the mode does not use are left out, as in the plan (sync mode: only
  workers; sync-ps: ps and workers); an evaluator is left out too (said in an annotation): it
  reads the leader's checkpoints, which the exported job keeps on no shared volume;
* standing servers run ``python -m roles.server``, training tasks ``python -m roles.train
  --mode MODE --job ...`` in the image (its WORKDIR holds ``roles/`` and ``examples/``, see
  docker/Dockerfile);
* the operator writes TF_CONFIG (with the pods' service names and its port, ``tfjob-port``) and
  the device plugin hands out GPUs, so the plan's addresses, ports, TF_CONFIG and GPU indices
  are not carried over; the GPU *count* of each mask becomes an ``nvidia.com/gpu`` limit;
* the plan's other environment is carried over, except that variables the inventory marks
  secret (``pscluster_secret_env``) only reference a Kubernetes Secret: no value is written.

One replica spec has one pod template, so what differs between tasks of one role cannot all be
expressed: different GPU counts become the maximum (said in an annotation); different values of
one environment variable are an error.
"""
from __future__ import annotations

import re

from .errors import PlanError, UsageError
from .plan import ClusterPlan, TaskSpec

API_VERSION = "kubeflow.org/v1"
KIND = "TFJob"
# Replica types of the TFJob API, in the plan's role order.
REPLICA_TYPES = (("chief", "Chief"), ("ps", "PS"), ("worker", "Worker"), ("evaluator", "Evaluator"))
RESTART_POLICIES = ("OnFailure", "Never", "Always", "ExitCode")
# The operator finds the TensorFlow container by this name and its port by "tfjob-port".
CONTAINER_NAME = "tensorflow"
PORT_NAME = "tfjob-port"
DEFAULT_PORT = 2222
GPU_RESOURCE = "nvidia.com/gpu"
DEFAULT_IMAGE = "pscluster-node:tf2.21.0-cpu"       # docker/compose.yaml's tag of docker/Dockerfile
DEFAULT_JOB = "distributed_mnist"
# `python` is the image's (docker/Dockerfile puts its virtualenv first on PATH).
SERVER_COMMAND = ("python", "-m", "roles.server")
# Where a training task writes its events (roles/events.py); any user can write there.
EVENTS_PATH = "/tmp/pscluster/events.jsonl"
POD_START_TIMEOUT, POD_COLLECTIVE_TIMEOUT = 300, 60
# `train`'s side-car evaluator reads the checkpoints the leader writes; the exported training
# command keeps none (a pod's disk goes with it), so the manifest leaves the evaluator out.
EVALUATOR_NOT_EXPORTED = ("not exported: it evaluates the checkpoints the leader writes, which an exported job "
                          "does not keep on a volume both pods share")
ANNOTATION = "pscluster"                            # prefix of our annotations
# Set per task by pscluster; in a TFJob the operator (TF_CONFIG) or the device plugin
# (GPUs) does that, and a per-task name has no place in a per-role template.
PER_TASK_ENV = ("TF_CONFIG", "PSCLUSTER_TASK", "CUDA_VISIBLE_DEVICES")
# Kubernetes object names (DNS-1035 labels, as the operator's per-replica services need):
# pod names are <name>-<type>-<index>, so leave room for "-evaluator-NN".
_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
MAX_NAME = 48


def train_command(mode: str, job: str = DEFAULT_JOB) -> list[str]:
    """The training task's command in the image: a shipped job name or a path there."""
    path = job if ("/" in job or job.endswith(".py")) else f"examples/{job}"
    # Pods start when their images are pulled, minutes apart on a cold node: wait longer for the
    # first step and for peers than `pscluster train`, which starts every task itself.
    return ["python", "-m", "roles.train", "--mode", mode, "--job", path, "--events", EVENTS_PATH,
            "--start-timeout", str(POD_START_TIMEOUT), "--collective-timeout", str(POD_COLLECTIVE_TIMEOUT)]


def tfjob_manifest(plan: ClusterPlan, *, image: str, job_command: list[str] | None = None,
                   restart_policy: str = "OnFailure", name: str | None = None,
                   secret_name: str | None = None) -> dict:
    """The TFJob that runs ``plan`` on Kubernetes.

    Args:
        plan: the cluster, as ``plan_cluster`` made it (its mode decides the replica types).
        image: the container image of every replica (docker/Dockerfile builds one).
        job_command: the training tasks' command (default: ``train_command(plan.mode)``).
        restart_policy: the replica specs' restart policy (one of ``RESTART_POLICIES``).
        name: ``metadata.name`` (default: the plan's name).
        secret_name: the Secret holding ``pscluster_secret_env`` values (default: NAME-env).

    Raises:
        UsageError: a bad name, image or restart policy.
        PlanError: tasks of one role whose environments differ.
    """
    name = name or plan.name
    if not _NAME.match(name) or len(name) > MAX_NAME:
        suggestion = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:MAX_NAME].strip("-")
        raise UsageError(f"{name!r} is not a valid TFJob name",
                         hint="lower-case letters, digits and '-', starting with a letter, at most "
                              f"{MAX_NAME} characters" + (f"; e.g. --name {suggestion}" if suggestion else ""))
    if not image or any(ch.isspace() for ch in image):
        raise UsageError(f"{image!r} is not a container image reference")
    if restart_policy not in RESTART_POLICIES:
        raise UsageError(f"unknown restart policy {restart_policy!r}", hint=f"one of {', '.join(RESTART_POLICIES)}")
    command = list(job_command) if job_command is not None else train_command(plan.mode)
    secrets = secret_name or f"{name}-env"

    replica_specs = {}
    for role, replica_type in REPLICA_TYPES:
        tasks = plan.tasks_of(role)
        if tasks and role != "evaluator":
            replica_specs[replica_type] = _replica_spec(plan, tasks, image=image, train=command,
                                                        restart_policy=restart_policy, secret_name=secrets)
    annotations = {f"{ANNOTATION}/mode": plan.mode, f"{ANNOTATION}/inventory": plan.inventory_path}
    unused = list(plan.unused)
    if plan.evaluator_tasks:
        unused.append(("evaluator", EVALUATOR_NOT_EXPORTED))
    if unused:
        annotations[f"{ANNOTATION}/unused-roles"] = "; ".join(f"{role}: {reason}" for role, reason in unused)
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "labels": {"app.kubernetes.io/created-by": "pscluster"},
                     "annotations": annotations},
        "spec": {
            # Standing servers never exit by themselves: stop them when the job ends.
            "runPolicy": {"cleanPodPolicy": "Running"},
            "tfReplicaSpecs": replica_specs,
        },
    }


def secret_refs(manifest: dict) -> dict[str, tuple[str, ...]]:
    """Secret name -> keys the manifest's containers read from it (what must exist before it runs)."""
    refs: dict[str, set[str]] = {}
    for spec in manifest["spec"]["tfReplicaSpecs"].values():
        for container in spec["template"]["spec"]["containers"]:
            for item in container.get("env", ()):
                ref = item.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    refs.setdefault(ref["name"], set()).add(ref["key"])
    return {name: tuple(sorted(keys)) for name, keys in sorted(refs.items())}


def gpu_count(mask: str | None) -> int:
    """GPUs in a CUDA_VISIBLE_DEVICES mask: None (no mask) and "" (CPU only) ask for none."""
    return len(mask.split(",")) if mask else 0


def _replica_spec(plan: ClusterPlan, tasks: tuple[TaskSpec, ...], *, image: str, train: list[str],
                  restart_policy: str, secret_name: str) -> dict:
    standing = {task.standing for task in tasks}
    if len(standing) > 1:     # not produced by plan_cluster: a role either stands or trains
        raise PlanError(f"{tasks[0].role} tasks are partly standing servers, partly training tasks")
    container: dict = {
        "name": CONTAINER_NAME,
        "image": image,
        "command": list(SERVER_COMMAND) if standing.pop() else list(train),
        "env": _env(plan, tasks, secret_name),
        "ports": [{"name": PORT_NAME, "containerPort": DEFAULT_PORT}],
    }
    annotations = {}
    counts = [gpu_count(task.cuda_visible_devices) for task in tasks]
    if max(counts):
        container["resources"] = {"limits": {GPU_RESOURCE: max(counts)}}
    if len(set(counts)) > 1:
        per_task = ", ".join(f"{task.name}={count}" for task, count in zip(tasks, counts))
        annotations[f"{ANNOTATION}/gpus"] = (f"the inventory asks for different GPU counts ({per_task}); one "
                                             f"template holds one limit, so every replica gets {max(counts)}")
    template: dict = {"spec": {"containers": [container]}}
    if annotations:
        template = {"metadata": {"annotations": annotations}, **template}
    return {"replicas": len(tasks), "restartPolicy": restart_policy, "template": template}


def _env(plan: ClusterPlan, tasks: tuple[TaskSpec, ...], secret_name: str) -> list[dict]:
    """The environment the tasks share, secrets as Secret references: a secret goes to a role's
    replicas only if cluster.secrets' rule gives it to every task of the role (a host that names
    it; for a standing server, only with pscluster_secret_env_roles), as ``up`` and ``train`` do.
    Before (N3), a role's replicas got the union of its hosts' secrets, standing servers included.

    Raises:
        PlanError: the rule gives a secret to some of the role's tasks only (one template
        cannot say so).
    """
    from .secrets import Secrets
    secret = {env for task in tasks for env in plan.host(task.host).secret_env}
    rule = Secrets(names={host.name: host.secret_env for host in plan.hosts},
                   standing_roles={host.name: host.secret_env_roles for host in plan.hosts})
    given = [set(rule.names_for(task, standing=task.standing)) for task in tasks]
    shared = set.intersection(*given)
    for name in sorted(set.union(*given) - shared):
        with_it = [task.name for task, names in zip(tasks, given) if name in names]
        without = [task.name for task, names in zip(tasks, given) if name not in names]
        raise PlanError(f"secret {name} goes to {', '.join(with_it)} but not to {', '.join(without)}; a TFJob "
                        f"gives all {tasks[0].role} replicas one environment",
                        hint="name it in pscluster_secret_env for every host of the role or for none"
                             + (" (and in pscluster_secret_env_roles: servers get secrets only where it asks)"
                                if tasks[0].standing else ""))
    per_task = [{key: value for key, value in task.env if key not in PER_TASK_ENV and key not in secret}
                for task in tasks]
    merged: dict[str, str] = {}
    for env in per_task:
        for key in env:
            if key in merged:
                continue
            values = [other.get(key) for other in per_task]
            if len(set(values)) > 1:
                shown = ", ".join(f"{task.name}@{task.host}: {'unset' if value is None else repr(value)}"
                                  for task, value in zip(tasks, values))
                raise PlanError(f"{key} differs between {tasks[0].role} tasks ({shown}); a TFJob gives all "
                                "replicas of a role one environment",
                                hint="set it the same way for every host of the role (e.g. in all.vars)")
            merged[key] = env[key]
    # A CPU-only mask stays: images built on CUDA bases may expose every GPU to a pod that
    # requests none, and a parameter server must not take GPU memory.
    if all(task.cuda_visible_devices == "" for task in tasks):
        merged["CUDA_VISIBLE_DEVICES"] = ""
    items: list[dict] = [{"name": key, "value": value} for key, value in merged.items()]
    items += [{"name": key, "valueFrom": {"secretKeyRef": {"name": secret_name, "key": key}}}
              for key in sorted(shared)]
    return items
