"""Resizing a cluster that is up: ``pscluster scale INVENTORY``.

Membership is a value that changes. A resize is a new plan of the same cluster, computed by the
pure planner from the edited inventory (same name, mode and port base); :func:`diff_plans` says
which tasks start (new, or moved: another host, port or GPU mask), which stop (gone or moved) and
which stay; :func:`check_resize` refuses what cannot be done, before anything changes.

Carrying the diff out (:func:`apply_plan`) is the same with or without a job: stop the servers and
standbys of the tasks that stop, record the new plan, sync the code to new hosts, start the new
standing servers and wait until they answer, start the standbys the new plan wants (not under a
running job: its relaunch takes the standbys that are there, and the job leaves new ones after).
With a live ``train`` job its supervisor does it between two turns of its loop
(cluster/supervision/train_resize.py ``Resizer.resize``). **Async** jobs change **in place** where
the chief can (:func:`in_place`: workers added after the last one, or the last ones removed): the
running chief takes the new cluster between two closures (roles/membership.py ``apply_change``, the
same ps), so nothing is restored and no step is lost; a drained or dropped-out worker leaves in
place at any index (its number stays, out of the chief's list: supervision/core.py ``drop_out``).
Any other async change (a worker renumbered, a ps moved) and every **sync** change go through a
checkpoint: new servers that need no port of the old plan start while the job still trains
(:func:`early_servers`), then the job checkpoints (cluster/supervision/jobstop.py), its processes
stop, the plan changes, and the training processes start again from that checkpoint at the new size
(``--resume``); the standing servers that stay are not touched. (A planned ps move, as a drain of a
ps host, checkpoints first: supervision/train_resize.py ``_move_ps``.)
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Collection, Mapping, Sequence

from ..hosts.codesync import sync_new_hosts
from ..contracts import DEFAULT_GRACE, PS_SPARE_GROUP, Mode, Phase, ProcessKind
from ..errors import PsclusterError, UsageError
from ..events import Reporter
from .resize_request import ResizeRequest, ask_job, resize_lock
from .tasks import forget_pid_files, new_record, report_standbys, start_standbys, start_tasks, stop_records, task_env, wait_ready
from ..inventory import Inventory
from ..plan import ClusterPlan, HostSpec, TaskSpec
from ..hosts.probe import Prober
from ..secrets import Secrets
from ..state import ProcessRecord, RunState, StateStore, StateWriter
from ..transport import TransportPool


@dataclass(frozen=True)
class PlanDiff:
    """What a resize changes: tasks by name (``worker:2``)."""

    start: tuple[str, ...]      # in the new plan only, or moved
    stop: tuple[str, ...]       # in the old plan only, or moved
    keep: tuple[str, ...]

    @property
    def empty(self) -> bool:
        return not self.start and not self.stop


def _where(task: TaskSpec) -> tuple:
    """What makes a task the same process after a resize (its TF_CONFIG lists the whole
    cluster and changes with every resize: standing servers take the cluster from the
    coordinator's context, so it is not part of it)."""
    return (task.role, task.host, task.address, task.port, task.cuda_visible_devices, task.workdir, task.standing)


def diff_plans(old: ClusterPlan, new: ClusterPlan) -> PlanDiff:
    before = {task.name: task for task in old.tasks}
    after = {task.name: task for task in new.tasks}
    keep = tuple(name for name, task in after.items() if name in before and _where(before[name]) == _where(task))
    start = tuple(name for name in after if name not in keep)
    stop = tuple(name for name in before if name not in keep)
    return PlanDiff(start=start, stop=stop, keep=keep)


def restarting(diff: PlanDiff, names: Collection[str]) -> PlanDiff:
    """``diff`` with the tasks of ``names`` that it keeps stopped and started again. A ps moved to
    another address needs it of every server that stays: a TensorFlow server routes a task name
    to the address it first knew, also for a new chief (docs/platform-notes.md TF13; seen: a
    chief restored after a ps moved made no step, its closures waiting on the old address)."""
    again = tuple(name for name in diff.keep if name in names)
    return PlanDiff(start=diff.start + again, stop=diff.stop + again,
                    keep=tuple(name for name in diff.keep if name not in again))


def membership(plan: ClusterPlan) -> dict[str, list[str]]:
    """``{"worker": ["worker:0@h1", ...], ...}``: who is in the cluster, for the ``resized`` event."""
    found: dict[str, list[str]] = {}
    for task in plan.tasks:
        found.setdefault(task.role, []).append(f"{task.name}@{task.host}")
    return found


def describe(diff: PlanDiff, new: ClusterPlan) -> str:
    parts = []
    if diff.start:
        parts.append("start " + ", ".join(f"{name}@{new.task(name).host}" for name in diff.start))
    if diff.stop:
        parts.append("stop " + ", ".join(diff.stop))
    return "; ".join(parts) or "no change"


def check_resize(old: ClusterPlan, new: ClusterPlan, diff: PlanDiff, *, job_live: bool) -> None:
    """Refuse what a resize cannot do, before anything changes.

    Raises:
        UsageError: naming what and why, with what to do instead.
    """
    hint = "edit the inventory back, or 'pscluster down' and 'up' the new one"
    if new.mode != old.mode:
        raise UsageError(f"scale keeps the mode: cluster {old.name!r} runs {old.mode}, the plan would run {new.mode}",
                         hint=hint)
    if not new.tasks_of("worker"):
        raise UsageError(f"the edited inventory leaves cluster {old.name!r} without a worker: a resize keeps at "
                         "least one", hint=hint)
    if old.firewall:
        raise UsageError(f"cluster {old.name!r} runs with --firewall: scale does not rewrite its tables yet",
                         hint="'pscluster down', then 'up --firewall' the edited inventory")
    leader_old = old.leader if any(t.name == old.leader.name for t in old.tasks) else None
    if job_live and leader_old is not None:
        moved = leader_old.name in diff.stop
        if moved:
            raise UsageError(f"{leader_old.name} on {leader_old.host} keeps the running job's checkpoints: a resize "
                             "cannot remove or move it while the job runs",
                             hint=f"keep {leader_old.name} on {leader_old.host}, or 'pscluster stop-job' first and "
                                  "'train --resume --checkpoint-dir' a folder the new leader reads")
    if new.mode == Mode.ASYNC and not new.tasks_of("chief"):
        raise UsageError("async mode needs a chief; the edited inventory has none", hint=hint)


def knowing_hosts(plan: ClusterPlan, *others: ClusterPlan | HostSpec) -> ClusterPlan:
    """``plan`` that also knows how to reach the hosts of ``others`` (plans or hosts): processes
    are stopped through the plan, and a host that left it may still run some."""
    hosts = {host.name: host for host in plan.hosts}
    for other in others:
        for host in (other.hosts if isinstance(other, ClusterPlan) else (other,)):
            hosts.setdefault(host.name, host)
    return replace(plan, hosts=tuple(hosts.values()))


def keep_reach(new: ClusterPlan, state: RunState, *known: ClusterPlan | HostSpec) -> ClusterPlan:
    """``new``, also knowing each host of ``known`` on which ``state`` still records live processes."""
    planned = {host.name for host in new.hosts}
    left = {record.host for record in state.live_records() if record.host not in planned}
    hosts = [host for other in known for host in (other.hosts if isinstance(other, ClusterPlan) else (other,))
             if host.name in left]
    return knowing_hosts(new, *hosts) if hosts else new


def plan_changes_for(new: ClusterPlan, diff: PlanDiff, old: ClusterPlan | None = None) -> ClusterPlan:
    """The part of ``new`` that starts: what preflight checks before a resize (ports, TensorFlow,
    GPUs on the hosts that get tasks), so that the servers that stay are not in its way. A task
    that takes the address and port of an ``old`` task that stops (a worker renumbered after a
    host left: ``worker:2@h3`` becomes ``worker:1@h3``) is left out: its port is ours until then."""
    freed = {(task.host, task.port) for task in (old.tasks if old is not None else ()) if task.name in diff.stop}
    tasks = tuple(task for task in new.tasks if task.name in diff.start and (task.host, task.port) not in freed)
    hosts = tuple(host for host in new.hosts if any(task.host == host.name for task in tasks))
    return replace(new, tasks=tasks, hosts=hosts)


def apply_plan(writer: StateWriter, pool: TransportPool, reporter: Reporter, old: ClusterPlan, new: ClusterPlan,
               diff: PlanDiff, secrets: Secrets | None, *, root: Path | None = None, timeout: float = 120.0,
               standbys: bool = True, unreachable: Collection[str] = (), known_hosts: Sequence[HostSpec] = (),
               started: Collection[str] = (), running: Collection[str] = ()) -> None:
    """Bring the processes in line with ``new`` (module docstring); the job's own processes must
    be stopped already, but for ``running`` (record keys: a chief that took the change in place).
    ``started``: new servers :func:`start_early` already started.

    Raises:
        PsclusterError: a server did not start or answer (the state records what runs).
    """
    state: RunState = writer.state

    def stays(record: ProcessRecord) -> bool:
        if record.key in running:
            return True
        if record.kind == ProcessKind.SERVER and record.task in started and record.host == new.task(record.task).host:
            return True
        if record.task not in diff.keep or record.host != new.task(record.task).host:
            return False        # its task goes or moved, or a leftover of a host that was lost
        if record.kind == ProcessKind.SERVER:
            return True
        # Standbys of the tasks that stay were started with the old cluster's TF_CONFIG: new ones.
        return record.kind == ProcessKind.STANDBY and not standbys
    # Any training process still recorded live here is a leftover of a lost host (the job's own
    # were stopped before); a lost host's processes are left for later (its rejoin, or `down`).
    going = [r for r in state.live_records() if not stays(r) and r.host not in unreachable]
    if going:
        reporter.emit("phase", name="stop", detail=f"{len(going)} process(es) the new membership leaves out")
        reach = knowing_hosts(old, new, *known_hosts)
        stopped, errors = stop_records(reach, going, pool, reporter, grace=DEFAULT_GRACE)
        writer.change(lambda s: s.replace_records(stopped))
        if errors:
            host, error = next(iter(errors.items()))
            raise PsclusterError(f"could not stop the processes on {host} that the resize leaves out: "
                                 f"{error.message.splitlines()[0]}", hint="'pscluster down' stops what is left")
        # A host that leaves the cluster: `down` will not know how to reach it, so its pid files go now.
        staying = {host.name for host in new.hosts} | {host.name for host in known_hosts}
        leaving = [r for r in state.processes if r.stopped and r.host not in staying and r.host not in unreachable]
        if leaving:
            forget_pid_files(reach, leaving, pool)
    # A lost host that still has processes stays known to the recorded plan (with no tasks), so
    # that `down` can reach it once it answers; found by the containers' fault tests, where
    # `down` after an elastic drop-out failed on the host it no longer knew.
    writer.change(lambda s: setattr(s, "plan", keep_reach(new, s, old, *known_hosts)))
    sync_new_hosts(writer, new, pool, reporter, root)
    standing = [new.task(name) for name in diff.start if new.task(name).standing and name not in started]
    _start_servers(writer, pool, reporter, new, standing, secrets, timeout)
    if standbys:
        report_standbys(reporter, *start_standbys(writer, pool, new, secrets))


def in_place(old: ClusterPlan, new: ClusterPlan, diff: PlanDiff, early: Collection[TaskSpec]) -> bool:
    """Whether the running async chief can take the change without a restart (roles/membership.py):
    workers only, added after the last one (their servers started early) or the last ones removed;
    no worker keeps its name at another index or address."""
    if new.mode != Mode.ASYNC or old.mode != Mode.ASYNC or diff.empty or (diff.start and diff.stop):
        return False
    if any(new.task(name).role != "worker" for name in diff.start) or \
            any(old.task(name).role != "worker" for name in diff.stop):
        return False
    before, after = len(old.tasks_of("worker")), len(new.tasks_of("worker"))
    if diff.start:
        started = {task.name for task in early}
        return (after > before and set(diff.start) == {f"worker:{i}" for i in range(before, after)}
                and set(diff.start) <= started)
    return 0 < after < before and set(diff.stop) == {f"worker:{i}" for i in range(after, before)}


def can_overlap(old: ClusterPlan, new: ClusterPlan, diff: PlanDiff, standby_hosts: Mapping[str, str | None]) -> bool:
    """Whether a resize's new workers can start while the old ones train (sync to sync,
    roles/handover.py): no standing server starts or stops, and every training task of ``new``
    has a standby (``standby_hosts``: task name -> the host of its live standby, None without one)
    on its own host (a task that moves host has its old standby on the old one)."""
    if old.mode != Mode.SYNC or new.mode != Mode.SYNC or diff.empty:
        return False
    if any(new.task(name).standing for name in diff.start) or any(old.task(name).standing for name in diff.stop):
        return False
    return all(standby_hosts.get(task.name) == task.host for task in new.training_tasks)


def match_standbys(tasks: Sequence[TaskSpec], standbys: Sequence[ProcessRecord]) -> dict[str, ProcessRecord | None]:
    """A live standby for each of ``tasks`` (a resize's new training tasks): its own (by task
    name) when it is on the task's host, else one on that host that no task of ``tasks`` has by
    name (a renumbered task: draining w2 makes worker:2@w3 worker:1@w3, whose own standby is on
    w2, while worker:2's waits on w3); None when there is none. A standby started for another task
    may still decline (roles/standby.py: an environment TensorFlow reads at import that differs,
    e.g. a GPU mask): the task then starts afresh."""
    live = [r for r in standbys if r.kind == ProcessKind.STANDBY and not r.stopped]
    by_name = {r.task: r for r in live}
    found: dict[str, ProcessRecord | None] = {}
    for task in tasks:
        own = by_name.get(task.name)
        found[task.name] = own if own is not None and own.host == task.host else None
    taken = {r.key for r in found.values() if r is not None}
    wanted = {task.name for task in tasks}
    spare = [r for r in live if r.key not in taken and r.task not in wanted]
    for task in tasks:
        if found[task.name] is None:
            pick = next((r for r in spare if r.host == task.host), None)
            if pick is not None:
                spare.remove(pick)
                found[task.name] = pick
    return found


GROWTH = "TF_FORCE_GPU_ALLOW_GROWTH"


def gpus_allow_overlap(task: TaskSpec, standby_gpus: int | None) -> bool:
    """Whether ``task``'s next incarnation may start while the current one trains, as far as GPU
    memory goes: its standby sees no GPU, or the task's environment turns on memory growth
    (``TF_FORCE_GPU_ALLOW_GROWTH=true``). TensorFlow otherwise reserves nearly all of a GPU's memory
    at its first op, so a second process on that GPU would start with almost none and fail; the
    usual path (stop, then start) is taken instead. Unknown (None): no overlap."""
    if standby_gpus == 0:
        return True
    return standby_gpus is not None and dict(task.env).get(GROWTH, "").strip().lower() == "true"


def early_servers(old: ClusterPlan, new: ClusterPlan, diff: PlanDiff, unreachable: Collection[str] = ()) -> list[TaskSpec]:
    """New standing servers that can start while the job still runs: on a host that answers, on
    an address and port no task of ``old`` holds (a renumbered task waits for the old one to stop)."""
    held = {(task.address, task.port) for task in old.tasks}
    return [task for task in (new.task(name) for name in diff.start)
            if task.standing and task.host not in unreachable and (task.address, task.port) not in held]


def start_early(writer: StateWriter, pool: TransportPool, reporter: Reporter, new: ClusterPlan,
                tasks: Sequence[TaskSpec], secrets: Secrets | None, *, root: Path | None = None,
                timeout: float = 120.0, idle: Callable[[], None] | None = None) -> None:
    """Start ``tasks`` (:func:`early_servers`) before the job stops for a resize: they import
    TensorFlow and answer while it still trains, which keeps that out of its pause. ``idle``:
    what the job's supervisor does while they start (read its streams, keep its record current)."""
    if tasks:
        sync_new_hosts(writer, new, pool, reporter, root)
        _start_servers(writer, pool, reporter, new, tasks, secrets, timeout, idle)


def _start_servers(writer: StateWriter, pool: TransportPool, reporter: Reporter, new: ClusterPlan,
                   standing: Sequence[TaskSpec], secrets: Secrets | None, timeout: float,
                   idle: Callable[[], None] | None = None) -> None:
    state: RunState = writer.state
    if standing:
        attempts = {t.name: state.next_attempt(t.name, ProcessKind.SERVER) for t in standing}
        reporter.emit("phase", name="start", detail=f"{len(standing)} new server(s)")
        records, failures = start_tasks(writer, pool, new, [
            (task, new_record(task, kind=ProcessKind.SERVER, attempt=attempts[task.name]), task.argv,
             task_env(new, task, secrets, standing=True)) for task in standing], reporter)
        if failures:
            raise failures[0].error
        with Prober() as prober:
            wait_ready(new, records, pool, prober, reporter, timeout=timeout, idle=idle)


# ------------------------------------------------------------------ membership from the inventory

def with_workers(inventory: Inventory, counts: Mapping[str, int]) -> Inventory:
    """``inventory`` with the worker tasks of some hosts changed: ``{"h3": 0}`` leaves h3 out of
    the worker group, ``{"h2": 1}`` gives h2 one worker (a GPU list or port list is cut to match).
    Hosts not named keep theirs.

    Raises:
        UsageError: a host that is not a worker host of the inventory, or more workers than its
            GPU or port list holds.
    """
    workers = set(inventory.hosts_of("worker"))
    unknown = sorted(set(counts) - workers)
    if unknown:
        raise UsageError(f"{', '.join(unknown)}: not a worker host of {inventory.path}",
                         hint="add it to the inventory's worker group (with how to reach it)")
    hosts = []
    for host in inventory.hosts:
        count = counts.get(host.name)
        slot = host.slots_for("worker")
        if count is None or slot is None:
            hosts.append(host)
            continue
        for sized in (slot.gpus, slot.ports):
            if sized is not None and count > len(sized):
                raise UsageError(f"{host.name} can run at most {len(sized)} worker(s): its inventory lists that "
                                 f"many GPUs or ports, not {count}", hint="give it fewer workers")
        kept = tuple(other for other in host.slots if other.role != "worker")
        if count > 0:
            kept += (replace(slot, count=count, gpus=slot.gpus[:count] if slot.gpus is not None else None,
                             ports=slot.ports[:count] if slot.ports is not None else None),)
        hosts.append(replace(host, slots=kept))
    left = {name for name in workers if counts.get(name, 1) > 0}
    role_hosts = tuple((role, tuple(h for h in names if role != "worker" or h in left))
                       for role, names in inventory.role_hosts)
    return replace(inventory, hosts=tuple(hosts), role_hosts=role_hosts)


def replan(plan: ClusterPlan, *, port_base: int | None, limit: str | None, counts: Mapping[str, int],
           pool: TransportPool | None, moved: Mapping[str, tuple[str, int | None]] | None = None) -> ClusterPlan:
    """The cluster's plan again from its inventory file, with the worker counts of
    :func:`with_workers` (a lost host left out, a host back taken in, a discovery command's list).
    ``moved``: ps tasks that live elsewhere than the inventory says (task -> (host, port): a ps
    moved off a host lost for good, :func:`cluster.plan.move_task`), kept there.

    Raises:
        UsageError: the inventory cannot be re-read (:func:`pinned_inventory`), or a moved ps's
            host is no longer in it.
    """
    import sys
    from ..hosts.codesync import local_workdir
    from ..inventory import load_inventory
    from ..inventory.patterns import apply_limit, required_roles
    from ..plan import PlanOptions, move_task, plan_cluster
    whole = load_inventory(pinned_inventory(plan))
    limited = apply_limit(whole, limit, required_roles(plan.mode, whole, None))
    # A host left out that runs no worker (a ps host lost for good) has no workers to take away.
    counts = {host: count for host, count in counts.items() if count or host in limited.hosts_of("worker")}
    inventory = with_workers(limited, counts)
    options = PlanOptions(local_python=sys.executable, local_workdir=local_workdir(), name=plan.name,
                          mode=plan.mode, port_base=port_base)
    new = plan_cluster(inventory, options)
    if pool is not None and new.auto_gpu_hosts:
        from ..hosts.preflight import resolve_auto_gpus
        new = plan_cluster(resolve_auto_gpus(inventory, new, pool), options)
    for task, (host, port) in (moved or {}).items():
        if host not in {h.name for h in whole.hosts}:
            raise UsageError(f"{task} was moved to {host}, which {whole.path} no longer names",
                             hint="put the host back in the inventory")
        new = move_task(new, task, whole.host(host), options, port)
    return replace(new, firewall=plan.firewall, inventory_sha256=plan.inventory_sha256)


def ps_spares(plan: ClusterPlan) -> tuple[str, ...]:
    """The hosts of the inventory's ``ps_spare`` group (none without one): hosts a ps moves to
    when its host is lost for good, in the group's order. They run nothing until then and need
    no role group; ``up`` neither checks nor starts anything on them.

    Raises:
        UsageError: the inventory cannot be re-read (:func:`pinned_inventory`).
    """
    from ..inventory import load_inventory
    return dict(load_inventory(pinned_inventory(plan)).groups).get(PS_SPARE_GROUP, ())


def pin_inventory(plan: ClusterPlan) -> ClusterPlan:
    """``plan`` with its inventory's absolute, resolved path and sha256 (``up``, ``scale``): an
    elastic re-plan reads that file from wherever the supervisor runs, and only as it was.

    Raises:
        UsageError: the inventory cannot be read.
    """
    from ..inventory.source import inventory_digest
    path = os.path.realpath(plan.inventory_path)
    try:
        return replace(plan, inventory_path=path, inventory_sha256=inventory_digest(path))
    except OSError as exc:
        raise UsageError(f"{plan.inventory_path}: cannot read the inventory: {exc.strerror}") from None


def pinned_inventory(plan: ClusterPlan) -> str:
    """The inventory path a re-plan (host loss, rejoin, ``--hosts-from``) may read: the one
    ``up``/``scale`` recorded, if it is still there, still this user's (or root's), and unchanged. A plan
    recorded without a digest (a state from before issue 42) is read as before.

    Raises:
        UsageError: naming the file and what changed, with ``scale`` as the way to take edits.
    """
    from ..inventory.source import inventory_digest
    path = plan.inventory_path
    if plan.inventory_sha256 is None:
        return path
    hint = (f"'pscluster scale {path} --name {plan.name}' takes an edited inventory; else put back the "
            "file 'up' read")
    try:
        owner = os.stat(path).st_uid
        digest = inventory_digest(path)
    except OSError as exc:
        raise UsageError(f"cannot re-plan cluster {plan.name!r}: its inventory {path} is gone or unreadable "
                         f"({exc.strerror})", hint=hint) from None
    if owner not in (os.geteuid(), 0):      # root's files are trusted, as ssh's StrictModes does (an image's inventory)
        raise UsageError(f"cannot re-plan cluster {plan.name!r}: its inventory {path} now belongs to uid {owner}, "
                         f"not to you (uid {os.geteuid()}) or root", hint=hint)
    if digest != plan.inventory_sha256:
        raise UsageError(f"cannot re-plan cluster {plan.name!r}: its inventory {path} changed since 'up'/'scale' "
                         "recorded it", hint=hint)
    return path


def worker_counts(plan: ClusterPlan) -> dict[str, int]:
    """Worker tasks per host in ``plan``."""
    counts: dict[str, int] = {}
    for task in plan.tasks_of("worker"):
        counts[task.host] = counts.get(task.host, 0) + 1
    return counts




# ------------------------------------------------------------------ `pscluster scale`

@dataclass(frozen=True)
class ScaleResult:
    diff: PlanDiff
    message: str
    through_job: bool           # carried out by the running job's supervisor


def cluster_that_is_up(store: StateStore, name: str, what: str) -> RunState:
    """The state of cluster ``name`` if it is up (only such a cluster can be ``what``).

    Raises:
        UsageError: no such cluster, or one starting or stopping.
    """
    state = store.load(name)
    if state is None:
        raise UsageError(f"no cluster named {name!r}", hint="'pscluster status' lists the clusters that are up")
    if state.phase != Phase.UP:
        raise UsageError(f"cluster {name!r} is {state.phase}: only a cluster that is up can be {what}",
                         hint="wait for 'up', 'scale' or 'down' to finish")
    return state


def scale_cluster(store: StateStore, name: str, new: ClusterPlan, *, pool: TransportPool, reporter: Reporter,
                  secrets: Secrets | None, keep_global_batch: bool = False, allow_busy_gpus: bool = False,
                  timeout: float = 600.0, sleep=None, reason: str = "scale", drain: str | None = None,
                  undrain: str | None = None) -> ScaleResult:
    """Resize cluster ``name`` to ``new`` (module docstring).

    Raises:
        UsageError: the cluster is not up, the resize is refused (check_resize), a job runs with no
            supervisor here, or another scale runs.
        MultiHostError: preflight failed on a host that gets tasks (nothing changed).
        PsclusterError: the resize failed under way (the job's failure names why).
    """
    from ..hosts.preflight import run_preflight
    with resize_lock(store, name):
        state = cluster_that_is_up(store, name, "resized")
        old = state.plan
        diff = diff_plans(old, new)
        job = state.job
        job_live = job is not None and job.live
        check_resize(old, new, diff, job_live=job_live)
        if diff.empty:
            return ScaleResult(diff, f"cluster {name!r} already matches the inventory: nothing to change", False)
        if diff.start:
            # Only the hosts that get tasks, and only their new tasks' ports: what stays is not in the way.
            changes = plan_changes_for(new, diff, old)
            report = run_preflight(changes, pool, reporter, allow_busy_gpus=allow_busy_gpus) if changes.tasks else None
            if report is not None and not report.ok:
                report.raise_for_failures()
        if not job_live:
            writer = StateWriter(store, state, expect_phase=Phase.UP)
            apply_plan(writer, pool, reporter, old, new, diff, secrets)
            return ScaleResult(diff, f"cluster {name!r} resized: {describe(diff, new)}", False)
        scoped = secrets.names if secrets is not None else {}
        roles = secrets.standing_roles if secrets is not None else {}
        text = ask_job(store, name, ResizeRequest(new, keep_global_batch, reason, secret_names=dict(scoped),
                                                  secret_roles=dict(roles), drain=drain, undrain=undrain,
                                                  within=timeout),
                       reporter=reporter, timeout=timeout, sleep=sleep, what=describe(diff, new))
        return ScaleResult(diff, text, True)
