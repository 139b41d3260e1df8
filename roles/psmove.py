"""Async mode: a parameter server's variables move to another ps without a chief restart.

What TensorFlow 2.21 allows, checked with real servers (benchmarks/ps_move.py, docs/platform-notes.md
TF13): the chief's eager context takes a cluster with *fewer* ps tasks
(``context.context().update_server_def``, as roles/membership.py does for workers), but not one
with a ps server it did not have at its start: the other tasks go on routing a task name to the
server they first knew (a new address under the old name: ``RecvTensor expects a different
device incarnation``; a new name: ``No worker known as /job:ps/replica:0/task:2``), and the first
step after the switch fails. So a ps moves only to a ps already in the cluster: a remaining one
(ps count N -> N-1), or a spare that was in the chief's cluster from its start and held no
variable (:func:`keep_spares_idle`). With nothing in flight, the chief:

1. reads the value of every variable on the ps that leaves (one read per variable, to the chief);
2. points its context at the cluster without it (one ``update_server_def``);
3. creates each such variable again on its new task (a ``VarHandleOp`` + assign there) and puts
   the new handle into the *same* Python variable object (:func:`_rehome`), so that the model,
   the optimizer, the step counter and the checkpoint keep the objects they hold (a variable's
   old handle is a remote tensor of the old server: ``Resource input tensor contains an invalid
   device`` once the cluster changed);
4. gives the coordinator's failure handler the new server def (it reconnects with that one).

Functions traced before the move captured the old handles: the caller traces its step (and
evaluation, and save) functions again. Per-worker datasets live on the workers and survive.
The other ps keep their task names, so the ps job may become sparse (``{0: ..., 2: ...}``),
which TensorFlow's ClusterSpec and eager context accept.

The request (:func:`plan_request`): ``{"ps": K, "to": J}`` or ``{"ps": K, "to": "HOST:PORT"}``
(the address of a ps task of the cluster), or ``{"ps": K}`` (to the lowest other ps).
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

log = logging.getLogger("pscluster.psmove")

_TASK = re.compile(r"/job:ps/(?:replica:\d+/)?task:(\d+)(?:/|$)")
# The handles' deleters of the moved variables, alive until the process ends: dropping one runs
# a DestroyResourceOp with a handle of the old server's context on the device name that now
# means the new server (an error in __del__ at best).
_OLD_DELETERS: list[Any] = []


class MoveRefused(ValueError):
    """A move the chief cannot make in place (the reason is the message)."""


@dataclass(frozen=True)
class PsMove:
    """The cluster after the move, and where the variables of each ps that changes go."""

    cluster: Mapping[str, Mapping[int, str]]      # every job as {index: address} (ps may be sparse)
    destination: Mapping[int, int]      # old ps task -> new ps task, only for the tasks that change

    def target(self, task: int | None) -> int | None:
        return None if task is None else self.destination.get(task)


@dataclass(frozen=True)
class MoveReport:
    variables: int          # variables re-created
    bytes: int              # their size
    read_s: float           # reading them to the chief
    switch_s: float         # update_server_def
    create_s: float         # re-creating and assigning them on the new task(s)

    @property
    def seconds(self) -> float:
        return self.read_s + self.switch_s + self.create_s


def _tasks(job: Any) -> dict[int, str]:
    """A job's tasks by index (a list, or a sparse ``{index: address}`` after a move)."""
    items = job.items() if isinstance(job, Mapping) else enumerate(job)
    return {int(index): str(address) for index, address in items}


def plan_shrink(cluster: Mapping[str, Any], ps: int, to: int | None = None) -> PsMove:
    """``/job:ps/task:ps`` leaves; its variables go to ps task ``to`` (default: the lowest
    remaining one). The others keep their names: the ps job may become sparse. With ``to`` an
    idle spare that was in the cluster from the chief's start (:func:`spare_count`), this is a
    move to the spare.

    Raises:
        MoveRefused: no such ps, the only ps, or ``to`` is not another ps of the cluster.
    """
    tasks = _tasks(cluster.get("ps", []))
    if ps not in tasks:
        raise MoveRefused(f"there is no ps:{ps} (the ps tasks are {sorted(tasks)})")
    if len(tasks) == 1:
        raise MoveRefused("it is the only ps: its variables have nowhere to go (move it to a spare)")
    if to is not None and (to == ps or to not in tasks):
        raise MoveRefused(f"ps:{to} cannot take ps:{ps}'s variables (the ps tasks are {sorted(tasks)})")
    new: dict[str, Any] = {job: _tasks(addresses) for job, addresses in cluster.items()}
    del new["ps"][ps]
    return PsMove(cluster=new, destination={ps: min(new["ps"]) if to is None else to})


def plan_request(cluster: Mapping[str, Any], request: Any) -> PsMove:
    """The move a request asks for (module docstring).

    Raises:
        MoveRefused: a malformed request, or one TensorFlow 2.21 cannot carry out in place (a
            destination that is not a ps of the cluster: the hint says what to do instead).
    """
    if not isinstance(request, Mapping) or isinstance(request.get("ps"), bool) or not isinstance(request.get("ps"), int):
        raise MoveRefused('the request holds no ps task index ({"ps": K, "to": J or "HOST:PORT"})')
    to = request.get("to")
    tasks = _tasks(cluster.get("ps", []))
    if isinstance(to, str):
        by_address = {address: index for index, address in tasks.items()}
        if to not in by_address:
            raise MoveRefused(f"{to} is not a ps of the chief's cluster; TensorFlow 2.21 cannot take in a new ps "
                              f"server in place (docs/platform-notes.md TF13): start the job with it as a spare "
                              f"ps, or move through a checkpoint and a chief restart")
        to = by_address[to]
    elif to is not None and (isinstance(to, bool) or not isinstance(to, int)):
        raise MoveRefused(f"'to' must be a ps task index or HOST:PORT, not {to!r}")
    return plan_shrink(cluster, request["ps"], to)


def effective_cluster(cluster: Mapping[str, Any], moved: Mapping[int, int]) -> dict[str, Any]:
    """The cluster the chief's context holds after the moves ``moved`` (ps task -> the ps that
    took its variables): ``cluster`` (the orchestrator's, every ps listed) less the ps tasks that
    moved away, the ps job as ``{index: address}``; ``cluster`` as it is when nothing moved."""
    if not moved:
        return dict(cluster)
    ps = {index: address for index, address in _tasks(cluster.get("ps", [])).items() if index not in moved}
    return {**cluster, "ps": ps}


def _dense_prefix(tasks: Mapping[int, str]) -> int:
    count = 0
    while count in tasks:
        count += 1
    return max(count, 1)


def ps_task(device: str) -> int | None:
    """The ps task index in a device name (``/job:ps/replica:0/task:1/device:CPU:0`` -> 1)."""
    match = _TASK.search(device or "")
    return int(match.group(1)) if match else None


def resource_variables(variables: Iterable[Any]) -> list[Any]:
    """The TensorFlow variables behind ``variables`` (a Keras 3 variable holds one in ``_value``, a
    ParameterServerStrategy wrapper in ``_v``), each once."""
    out, seen = [], set()
    for variable in variables:
        inner = _innermost(variable)
        if "_handle" in getattr(inner, "__dict__", {}) and id(inner) not in seen:
            seen.add(id(inner))
            out.append(inner)
    return out


def _innermost(variable: Any) -> Any:
    """The ResourceVariable under Keras 3's ``_value`` and ParameterServerStrategy's wrappers
    (``ps_values``: ``_v``), which pass attribute reads through to it."""
    for _ in range(8):
        own = getattr(variable, "__dict__", {})
        if "_handle" in own:
            return variable
        inner = own.get("_v", own.get("_value"))
        if inner is None:
            return variable
        variable = inner
    return variable


def move_variables(strategy: Any, coordinator: Any, variables: Iterable[Any], move: PsMove) -> MoveReport:
    """Carry ``move`` out (module docstring); nothing may be in flight (``coordinator.join()``
    first). The caller traces its functions again afterwards."""
    import tensorflow as tf
    from tensorflow.python.eager import context

    began = time.perf_counter()
    moving = [(v, move.target(ps_task(v.device))) for v in resource_variables(variables)
              if move.target(ps_task(v.device)) is not None]
    values = [v.read_value().numpy() for v, _ in moving]
    read = time.perf_counter()

    server_def = context.get_server_def()
    server_def.cluster.CopyFrom(tf.train.ClusterSpec(dict(move.cluster)).as_cluster_def())
    context.context().update_server_def(server_def)
    handler = coordinator._cluster.failure_handler                # noqa: SLF001 - no public API
    handler._server_def = context.get_server_def()                  # noqa: SLF001 - it reconnects with this one
    # New variables go round robin over ps:0..N-1 by name (ParameterServerStrategy): keep them
    # on tasks that exist. A job creates its variables before training; this is for later ones.
    strategy.extended._num_ps = _dense_prefix(move.cluster.get("ps", {}))  # noqa: SLF001
    switched = time.perf_counter()

    for (variable, task), value in zip(moving, values):
        _rehome(tf, variable, value, f"/job:ps/replica:0/task:{task}/device:CPU:0")
    created = time.perf_counter()
    size = sum(int(value.nbytes) for value in values)
    log.info("%d variable(s), %d bytes moved to %s in %.2f s", len(moving), size,
             dict(move.destination), created - began)
    return MoveReport(len(moving), size, read - began, switched - read, created - switched)


def _rehome(tf: Any, variable: Any, value: Any, device: str) -> None:
    """Create ``variable`` again on ``device`` with ``value`` and give the object the new handle."""
    with tf.device(device):
        fresh = tf.Variable(value, dtype=variable.dtype, trainable=variable.trainable,
                            name=variable._handle_name.split(":")[0])    # noqa: SLF001
    _OLD_DELETERS.append(getattr(variable, "_handle_deleter", None))
    for name in ("_handle", "_handle_deleter", "_initializer_op", "_is_initialized_op", "_graph_element",
                 "_cached_value"):
        if hasattr(fresh, name):
            setattr(variable, name, getattr(fresh, name))
    fresh._handle_deleter = None        # noqa: SLF001 - the resource is the old object's now


def idle_count(num_ps: int, environ: Mapping[str, str]) -> int:
    """How many of the last ps tasks the chief keeps free of variables: ``PSCLUSTER_IDLE_PS``
    (the inventory's ``pscluster_idle_ps``), at most all but one (a re-planned cluster may have
    fewer ps than the inventory asked for); 0 when unset or not a whole number."""
    text = environ.get("PSCLUSTER_IDLE_PS") or "0"
    try:
        asked = int(text)
    except ValueError:
        log.warning("PSCLUSTER_IDLE_PS=%r is not a whole number: no ps is kept idle", text)
        return 0
    return max(0, min(asked, num_ps - 1))


def keep_spares_idle(strategy: Any, spares: int) -> None:
    """Place no variable on the last ``spares`` ps tasks: ParameterServerStrategy puts variables
    round robin on ps:0..N-1, N its ``_num_ps``; call before the variables are created. A spare in
    the cluster from the start is what lets :func:`plan_shrink` with ``to`` move a ps to it."""
    num_ps = strategy.extended._num_ps              # noqa: SLF001 - no public API
    if not 0 <= spares < num_ps:
        raise MoveRefused(f"{spares} spare(s) of {num_ps} ps task(s) leave none for the variables")
    strategy.extended._num_ps = num_ps - spares      # noqa: SLF001
