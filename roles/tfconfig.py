"""What this process is, read from the environment the orchestrator sets.

``TF_CONFIG`` names the cluster and this task; ``PSCLUSTER_INTRA_OP_THREADS`` and
``PSCLUSTER_INTER_OP_THREADS`` size TensorFlow's thread pools. Parsing lives here,
without TensorFlow, so it is cheap to test and so a malformed environment fails with
a message naming the variable before a 3-second TensorFlow import.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from typing import Mapping


EVALUATOR = "evaluator"


class ConfigError(ValueError):
    """The environment or command line does not describe a runnable task."""


@dataclass(frozen=True)
class TaskInfo:
    """This process's place in the cluster.

    ``cluster`` maps job name to the ordered list of ``host:port`` addresses, exactly
    as in TF_CONFIG (the order defines task indices).
    """

    cluster: Mapping[str, tuple[str, ...]]
    task_type: str
    task_index: int

    @property
    def name(self) -> str:
        """``"worker:1"``, the form events use."""
        return f"{self.task_type}:{self.task_index}"

    @property
    def num_workers(self) -> int:
        return len(self.cluster.get("worker", ()))

    @property
    def num_ps(self) -> int:
        return len(self.cluster.get("ps", ()))

    @property
    def address(self) -> str:
        return self.cluster[self.task_type][self.task_index]

    @property
    def is_evaluator(self) -> bool:
        """The side-car evaluator: outside the cluster (TF_CONFIG names it, the cluster does not)."""
        return self.task_type == EVALUATOR

    def cluster_dict(self) -> dict[str, list[str]]:
        """A plain dict, the form ``tf.train.ClusterSpec`` accepts."""
        return {job: list(addrs) for job, addrs in self.cluster.items()}


def parse_tf_config(raw: str | None) -> TaskInfo:
    """Parses a TF_CONFIG value.

    Raises:
        ConfigError: naming what is missing or malformed.
    """
    if not raw:
        raise ConfigError("TF_CONFIG is not set; the orchestrator sets it for every task")
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ConfigError(f"TF_CONFIG is not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ConfigError("TF_CONFIG must be a JSON object with 'cluster' and 'task'")
    cluster = doc.get("cluster")
    task = doc.get("task")
    if not isinstance(cluster, dict) or not cluster:
        raise ConfigError("TF_CONFIG.cluster must be a non-empty object of job -> [host:port]")
    if not isinstance(task, dict):
        raise ConfigError("TF_CONFIG.task must be an object with 'type' and 'index'")
    parsed: dict[str, tuple[str, ...]] = {}
    for job, addrs in cluster.items():
        if not isinstance(addrs, list) or not all(isinstance(a, str) for a in addrs):
            raise ConfigError(f"TF_CONFIG.cluster.{job} must be a list of 'host:port' strings")
        parsed[job] = tuple(addrs)
    task_type = task.get("type")
    task_index = task.get("index", 0)
    if task_type == EVALUATOR:
        # TensorFlow's convention: the evaluator is not part of the cluster it evaluates.
        if not isinstance(task_index, int) or task_index < 0:
            raise ConfigError(f"TF_CONFIG.task.index {task_index!r} must be an integer >= 0")
        return TaskInfo(cluster=parsed, task_type=task_type, task_index=task_index)
    if not isinstance(task_type, str) or task_type not in parsed:
        raise ConfigError(
            f"TF_CONFIG.task.type {task_type!r} is not a job of the cluster {sorted(parsed)}")
    if not isinstance(task_index, int) or not 0 <= task_index < len(parsed[task_type]):
        raise ConfigError(
            f"TF_CONFIG.task.index {task_index!r} is out of range for job {task_type!r} "
            f"with {len(parsed[task_type])} task(s)")
    return TaskInfo(cluster=parsed, task_type=task_type, task_index=task_index)


def task_from_env(env: Mapping[str, str] | None = None) -> TaskInfo:
    env = os.environ if env is None else env
    return parse_tf_config(env.get("TF_CONFIG"))


@dataclass(frozen=True)
class ThreadConfig:
    """TensorFlow thread-pool sizes; ``None`` leaves TensorFlow's default."""

    intra_op: int | None = None
    inter_op: int | None = None


def _positive_int(env: Mapping[str, str], key: str) -> int | None:
    raw = env.get(key, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{key}={raw!r} is not an integer") from None
    if value < 0:
        raise ConfigError(f"{key}={raw!r} must be >= 0 (0 means TensorFlow's default)")
    return value or None


def threads_from_env(env: Mapping[str, str] | None = None) -> ThreadConfig:
    env = os.environ if env is None else env
    return ThreadConfig(
        intra_op=_positive_int(env, "PSCLUSTER_INTRA_OP_THREADS"),
        inter_op=_positive_int(env, "PSCLUSTER_INTER_OP_THREADS"),
    )


LEADER_WAIT = 10.0     # seconds a sync worker waits for worker 0's port before joining the strategy


def wait_for_leader(task: TaskInfo, timeout: float = LEADER_WAIT) -> None:
    """A worker other than 0 waits (at most ``timeout`` s) until worker 0's port accepts a
    connection before joining the strategy.

    Why: worker 0 hosts the coordination service. A worker whose agent registers before that
    service is up is told to retry after a backoff of about a second: a sync start, restart or
    resize whose workers are started together paid ~0.9 s more whenever worker 0 happened to be
    the last to start (seen in half the resizes of benchmarks/elastic.py). Waiting here costs a
    few milliseconds. Past ``timeout`` TensorFlow's own retries take over, as before."""
    if task.task_index == 0 or not task.cluster.get("worker"):
        return
    host, _, port = str(task.cluster["worker"][0]).rpartition(":")
    address = (host.strip("[]"), int(port))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(address, timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.01)
