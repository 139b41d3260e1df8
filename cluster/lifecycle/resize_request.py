"""The request protocol between ``pscluster scale`` (and ``drain``/``undrain``) and a running
``train`` job's supervisor: one frozen :class:`ResizeRequest` (the new plan, its secret scope,
a host to drain or undrain), written 0600 beside the state as ``<name>.resize.json``, and the
supervisor's answer ``<name>.resize-result.json``.

The asking side (:func:`ask_job`: ``scale_cluster`` in cluster/lifecycle/resize.py,
cluster/supervision/drain_job.py) posts the request, signals the supervisor (SIGUSR2) and waits
for the answer while the job and its supervisor live; the supervisor (``Resizer.poll`` in
cluster/supervision/train_resize.py) takes the request (another user's file is refused), carries
it out between two turns of its loop and posts the answer. :func:`resize_lock` keeps one
``scale``/``drain`` of a cluster at a time. The wire is kept here, as cluster/hosts/hostops.py
keeps hostctl's: the plan diff and how it is applied stay in cluster/lifecycle/resize.py.
"""
from __future__ import annotations

import json
import math
import signal
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Mapping

from ..errors import PsclusterError, UsageError
from ..events import Reporter
from ..liveness import orchestrator_alive, signal_supervisor
from ..names import RESIZE_ENDING, RESULT_ENDING
from ..plan import ClusterPlan
from ..secrets import Secrets
from ..state import StateStore, file_lock, plan_from_json, plan_to_json, read_owned, write_private_json

RESIZE_SUFFIX = f"{RESIZE_ENDING}.json"   # a request to a job's supervisor, beside the state
RESULT_SUFFIX = f"{RESULT_ENDING}.json"   # its answer


@contextmanager
def resize_lock(store: StateStore, name: str) -> Iterator[None]:
    """One resize of a cluster at a time: a second ``scale`` is refused while one runs."""
    path = store.root / f"{name}.resize.lock"
    store.root.mkdir(parents=True, exist_ok=True)
    with file_lock(path, wait=0, busy=lambda: UsageError(f"another 'pscluster scale' of cluster {name!r} is running",
                                                         hint="wait for it to finish, then run this one again")):
        yield


@dataclass(frozen=True)
class ResizeRequest:
    """What ``scale`` asks a job's supervisor to carry out. ``secret_names``/``secret_roles``:
    the new plan's secret scope, names only (:func:`cluster.secrets.scope`; None: the plan's
    own), which the supervisor applies to the values it holds (issue 42, L5: new tasks got the
    scope of ``train``'s start, keyed by the old plan's host names)."""

    plan: ClusterPlan
    keep_global_batch: bool = False
    reason: str = "scale"
    secret_names: Mapping[str, tuple[str, ...]] | None = None
    secret_roles: Mapping[str, tuple[str, ...]] | None = None
    # `pscluster drain HOST` / `undrain HOST` of an async job's worker host: the plan stays, HOST's
    # workers leave (or come back) in place (cluster/lifecycle/drain.py)
    drain: str | None = None
    undrain: str | None = None
    # Seconds the asker waits for the answer (a drain's deadline less its checkpoint reserve): the
    # supervisor waits for a relaunch's standbys a third of it at most (a loaded machine's import
    # of TensorFlow took 40 s of a 50-s drain budget). None: no bound of the asker's.
    within: float | None = None

    def to_json(self) -> dict:
        data: dict = {"plan": plan_to_json(self.plan), "keep_global_batch": self.keep_global_batch,
                      "reason": self.reason}
        for key, host in (("drain", self.drain), ("undrain", self.undrain)):
            if host is not None:        # only then: an older request is written again unchanged
                data[key] = host
        if self.within is not None:
            data["within"] = self.within
        for key, scope in (("secret_names", self.secret_names), ("secret_roles", self.secret_roles)):
            if scope is not None:
                data[key] = {host: list(each) for host, each in scope.items()}
        return data

    @classmethod
    def from_json(cls, data: dict) -> "ResizeRequest":
        def scope(key: str) -> dict[str, tuple[str, ...]] | None:
            found = data.get(key)
            if not isinstance(found, dict):
                return None
            return {str(host): tuple(str(name) for name in each) for host, each in found.items()
                    if isinstance(each, list)}
        def host(key: str) -> str | None:
            return str(data[key]) if data.get(key) else None
        within = data.get("within")
        if isinstance(within, bool) or not isinstance(within, (int, float)) or not 0 < within < math.inf:
            within = None
        return cls(plan_from_json(data["plan"]), bool(data.get("keep_global_batch")), str(data.get("reason", "scale")),
                   scope("secret_names"), scope("secret_roles"), host("drain"), host("undrain"),
                   float(within) if within is not None else None)

    def secret_scope(self) -> tuple[Mapping[str, tuple[str, ...]], Mapping[str, tuple[str, ...]]]:
        """The scope to apply: the one sent, else the plan's."""
        from ..secrets import scope
        names, roles = scope(self.plan)
        return (self.secret_names if self.secret_names is not None else names,
                self.secret_roles if self.secret_roles is not None else roles)

    def secrets_for(self, held: Secrets | None) -> Secrets | None:
        """``held`` (the values the supervisor has) under this request's scope.

        Raises:
            UsageError: the scope names a secret ``held`` lacks.
        """
        names, roles = self.secret_scope()
        if held is None:
            held = Secrets()
        if held.values or names:
            return held.rescoped(names, roles)
        return None


def post_request(store: StateStore, name: str, request: ResizeRequest) -> None:
    (store.root / f"{name}{RESULT_SUFFIX}").unlink(missing_ok=True)
    write_private_json(store.root / f"{name}{RESIZE_SUFFIX}", request.to_json())


def take_request(store: StateStore, name: str) -> ResizeRequest | None:
    """The pending request (removed as it is read), if any."""
    path = store.root / f"{name}{RESIZE_SUFFIX}"
    try:
        data = json.loads(read_owned(path))       # another user's request is refused (issue 42, L1)
    except (FileNotFoundError, ValueError):
        return None
    path.unlink(missing_ok=True)
    return ResizeRequest.from_json(data)


def post_result(store: StateStore, name: str, *, ok: bool, message: str) -> None:
    write_private_json(store.root / f"{name}{RESULT_SUFFIX}", {"ok": ok, "message": message})


def read_result(store: StateStore, name: str) -> dict | None:
    try:
        return json.loads(read_owned(store.root / f"{name}{RESULT_SUFFIX}"))
    except (FileNotFoundError, ValueError):
        return None


def ask_job(store: StateStore, name: str, request: ResizeRequest, *, reporter: Reporter, timeout: float,
            what: str, sleep=None) -> str:
    """Post ``request`` to the supervisor of cluster ``name``'s running ``train`` job and wait for its
    answer (its message).

    Raises:
        UsageError: the job is a program, or runs with no supervisor on this machine.
        PsclusterError: the supervisor refused or failed it, the job ended, or ``timeout`` passed.
    """
    sleep = sleep or time.sleep
    state = store.load(name)
    job = state.job if state is not None else None
    if job is None or not job.live:
        raise UsageError(f"cluster {name!r} runs no job")
    if job.entry != "train":
        raise UsageError(f"job {job.id} is a 'pscluster run' program: scale resizes 'train' jobs and idle clusters",
                         hint="stop the program ('pscluster stop-job'), scale, and run it again")
    info = job.orchestrator
    if info is None or not orchestrator_alive(info):
        raise UsageError(f"job {job.id} runs without a supervisor on this machine: nobody can restart it at the "
                         "new size", hint="'pscluster stop-job' (it checkpoints), scale, then 'train --resume'")
    post_request(store, name, request)
    signal_supervisor(info, signal.SIGUSR2)
    reporter.emit("message", text=f"asked job {job.id}'s supervisor (pid {info.pid}) to resize it: {what}")
    deadline = time.monotonic() + timeout
    while True:
        result = read_result(store, name)
        if result is not None:
            if not result.get("ok"):
                raise PsclusterError(f"the resize failed: {result.get('message')}",
                                     hint="'pscluster status' shows what runs now")
            return str(result.get("message"))
        current = store.load(name)
        if current is None or current.job is None or not current.job.live or not orchestrator_alive(info):
            raise PsclusterError(f"job {job.id} ended before it was resized",
                                 hint="'pscluster status' shows what runs now")
        if time.monotonic() > deadline:
            raise PsclusterError(f"job {job.id}'s supervisor has not resized it after {timeout:.0f} s",
                                 hint="'pscluster status' shows what runs now")
        sleep(0.3)
