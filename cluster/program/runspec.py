"""``pscluster run``: the user's own program on the cluster's tasks -- the pure part.

Which tasks run the program, what each process gets (its command line with placeholders
filled, its environment), which local files travel to the hosts, and in which directory the
program runs there. Nothing here touches a host or reads the environment; the CLI passes in
this machine's current directory and checkout.

Placeholders, filled per task in every argument (``{{`` and ``}}`` are literal braces):

==================  ==============================================================
``{ps_hosts}``      the cluster's ps tasks as ``host:port,host:port`` (likewise
``{worker_hosts}``  ``worker`` and ``chief``); empty when the cluster has none
``{chief_hosts}``
``{job_name}``      the task's type: ``ps``, ``worker``, ``chief``, ``evaluator``
``{task_type}``     (both names: TF1 scripts say job_name, TF_CONFIG says type)
``{task_index}``    the task's index within its type
``{num_workers}``   how many worker tasks the cluster has (``{num_ps}``: ps tasks)
``{port}``          the task's own port, ``{host}`` its address
==================  ==============================================================

Every process also gets ``TF_CONFIG``, its ``CUDA_VISIBLE_DEVICES`` mask, the inventory's
``pscluster_env`` and the :func:`program_env` variables (``PSCLUSTER_TASK_TYPE`` ...).
"""
from __future__ import annotations

import json
import os
import posixpath
import re
import string
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Mapping, Sequence

from ..hosts.codesync import LocalFile, collect, needs_sync
from ..errors import UsageError
from ..inventory import ROLES, Inventory, canonical_mode
from ..contracts import MODE_ROLES
from ..plan import ClusterPlan, HostSpec, TaskSpec
from .progfiles import DEFAULT_SYNC_LIMIT_MIB, FileSet, program_files
from .request import RunRequest

PLACEHOLDERS = ("ps_hosts", "worker_hosts", "chief_hosts", "job_name", "task_type", "task_index", "num_workers",
                "num_ps", "port", "host")
PYTHON_NAMES = ("python", "python3")
_PYTHON_OPTIONS_WITH_VALUE = ("-W", "-X", "-Q")


def check_placeholders(argv: Sequence[str]) -> None:
    """Reject unknown or malformed placeholders before anything starts.

    Raises:
        UsageError: naming the argument and the placeholder, with the known ones as a hint.
    """
    for arg in argv:
        for field_name, conversion in _fields(arg):
            if field_name not in PLACEHOLDERS or conversion:
                shown = "{" + field_name + (f"!{conversion}" if conversion else "") + "}"
                raise UsageError(f"unknown placeholder {shown} in argument {arg!r}",
                                 hint="placeholders: " + ", ".join("{" + p + "}" for p in PLACEHOLDERS) +
                                      "; write {{ and }} for literal braces")


def _fields(arg: str) -> list[tuple[str, str | None]]:
    try:
        parsed = list(string.Formatter().parse(arg))
    except ValueError as exc:
        raise UsageError(f"argument {arg!r}: {exc}",
                         hint="write {{ and }} for literal braces; placeholders look like {task_index}") from None
    return [(field_name, conversion) for _, field_name, _, conversion in parsed if field_name is not None]


def placeholder_values(plan: ClusterPlan, task: TaskSpec) -> dict[str, object]:
    """The values of the placeholders for one task."""
    spec = plan.cluster_spec
    return {
        "ps_hosts": ",".join(spec.get("ps", ())), "worker_hosts": ",".join(spec.get("worker", ())),
        "chief_hosts": ",".join(spec.get("chief", ())), "job_name": task.role, "task_type": task.role,
        "task_index": task.index, "num_workers": len(spec.get("worker", ())), "num_ps": len(spec.get("ps", ())),
        "port": task.port, "host": task.address,
    }


def expand(argv: Sequence[str], values: Mapping[str, object]) -> list[str]:
    """``argv`` with every placeholder filled (after :func:`check_placeholders`)."""
    try:
        return [arg.format_map(values) for arg in argv]
    except (ValueError, KeyError, IndexError) as exc:      # a bad format spec such as {task_index:x.y}
        raise UsageError(f"cannot fill the placeholders of {list(argv)}: {exc}") from None


_INDEX_FLAG = re.compile(r"^--?(task[_-]?index|task[_-]?id)(=|$)")


def same_command_lines(plan: ClusterPlan, tasks: Sequence[TaskSpec], argv: Sequence[str]) -> list[str]:
    """Warnings for tasks of one role that get the same command line while it passes a task
    index flag (``--task_index=0`` left hard-coded: TensorFlow then says only "Could not start
    gRPC server"). A TF_CONFIG program's command lines are the same by design: not warned."""
    if not any(_INDEX_FLAG.match(arg) for arg in argv):
        return []
    seen: dict[tuple[str, tuple[str, ...]], str] = {}
    warnings = []
    for task in tasks:
        key = (task.role, tuple(expand(argv, placeholder_values(plan, task))))
        if key in seen:
            warnings.append(f"{seen[key]} and {task.name} get the same command line; did you mean "
                            "{task_index}?")
        else:
            seen[key] = task.name
    return warnings


@dataclass(frozen=True)
class LaunchSpec:
    """One program process as it starts: its task, the folder it runs in on its host, its filled
    command line and its whole environment (TF_CONFIG, the PSCLUSTER_* variables, its secrets)."""

    task: TaskSpec
    cwd: str
    argv: tuple[str, ...]
    env: Mapping[str, str]

    def to_row(self) -> dict:
        """The ``run --dry-run --json`` row of this process."""
        env = dict(self.env)
        return {"task": self.task.name, "host": self.task.host, "cwd": self.cwd, "argv": list(self.argv),
                "cuda_visible_devices": self.task.cuda_visible_devices,
                "tf_config": json.loads(env["TF_CONFIG"]) if "TF_CONFIG" in env else None, "env": env}


def launch_spec(plan: ClusterPlan, task: TaskSpec, request: RunRequest, space: Workspace,
                secrets: Mapping[str, str] | None = None) -> LaunchSpec:
    """What ``run`` starts for ``task``: the one definition that the launch and ``run --dry-run``
    share, so the dry run is exactly what will run (TorchX's submit_dryrun). ``secrets`` are the
    task's secret values (cluster/secrets.py ``Secrets.env_for``); None: a dry run, which names
    every secret of the task's host with ``****`` for its value (they are read only when a run starts)."""
    host = plan.host(task.host)
    env = {**plan.task_env(task), **({name: "****" for name in host.secret_env} if secrets is None else secrets),
           **program_env(plan, task, request.keras)}
    return LaunchSpec(task=task, cwd=space.host_cwd(host),
                      argv=tuple(host_argv(expand(request.program, placeholder_values(plan, task)), host)), env=env)


def dry_run(plan: ClusterPlan, tasks: Sequence[TaskSpec], request: RunRequest, space: Workspace) -> list[dict]:
    """What ``run`` would start, per task, starting nothing (``run --dry-run``): :func:`launch_spec`
    of each task, its secrets masked."""
    return [launch_spec(plan, task, request, space).to_row() for task in tasks]


def program_env(plan: ClusterPlan, task: TaskSpec, keras: str | None = None) -> dict[str, str]:
    """What every program process gets besides the task's planned environment; with legacy
    Keras (``keras``, the ``run --keras`` choice, else the host's ``pscluster_keras``) also
    ``TF_USE_LEGACY_KERAS=1``, which makes ``tf.keras`` tf-keras in TensorFlow 2.16 and newer."""
    values = placeholder_values(plan, task)
    legacy = {"TF_USE_LEGACY_KERAS": "1"} if effective_keras(plan.host(task.host), keras) == "legacy" else {}
    return {**legacy,
        "PSCLUSTER_TASK_TYPE": task.role, "PSCLUSTER_TASK_INDEX": str(task.index),
        "PSCLUSTER_NUM_WORKERS": str(values["num_workers"]), "PSCLUSTER_NUM_PS": str(values["num_ps"]),
        "PSCLUSTER_PS_HOSTS": str(values["ps_hosts"]), "PSCLUSTER_WORKER_HOSTS": str(values["worker_hosts"]),
        "PSCLUSTER_CHIEF_HOSTS": str(values["chief_hosts"]), "PSCLUSTER_HOST": task.address,
        "PSCLUSTER_PORT": str(task.port),
    }


def effective_keras(host: HostSpec, keras: str | None) -> str:
    """The Keras a program on ``host`` gets: ``run --keras`` beats the host's pscluster_keras."""
    return keras or host.keras


def host_argv(argv: Sequence[str], host: HostSpec) -> list[str]:
    """A program of ``python``/``python3`` means the host's interpreter (``pscluster_python``)."""
    argv = list(argv)
    if argv and argv[0] in PYTHON_NAMES:
        argv[0] = host.python
    return argv


def script_of(argv: Sequence[str]) -> str | None:
    """The script a ``python ...`` command runs (None for ``-m``/``-c`` or another program)."""
    if not argv or argv[0] not in PYTHON_NAMES:
        return None
    args = iter(argv[1:])
    for arg in args:
        if arg in ("-m", "-c", "-"):
            return None
        if arg in _PYTHON_OPTIONS_WITH_VALUE:
            next(args, None)
            continue
        if arg.startswith("-"):
            continue
        return arg
    return None


def parse_roles(text: str) -> tuple[str, ...]:
    """``--on worker`` / ``--on ps,worker`` -> roles in cluster order."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    unknown = [item for item in items if item not in ROLES]
    if not items or unknown:
        raise UsageError(f"--on: {', '.join(unknown) or repr(text)} is not a role",
                         hint=f"roles are {', '.join(ROLES)}, e.g. --on ps,worker")
    return tuple(role for role in ROLES if role in items)


def one_shot_roles(inventory: Inventory, mode: str | None) -> tuple[str, ...]:
    """The roles a one-shot run starts without ``--on``: those of ``--mode`` when it is given
    (sync: the workers; sync-ps: ps and workers; async: chief, ps and workers), else every role
    the inventory defines; an evaluator the inventory defines always takes part."""
    defined = inventory.roles()
    if mode is None:
        return defined
    wanted = {role for role, _ in MODE_ROLES[canonical_mode(mode)]} | {"evaluator"}
    return tuple(role for role in defined if role in wanted)


def select_tasks(plan: ClusterPlan, on: tuple[str, ...] | None) -> tuple[TaskSpec, ...]:
    """The tasks of a cluster that is up which run the program.

    Without ``--on``: every task that has no standing server of ``up`` (async: the chief;
    sync and sync-ps: the workers). With it: every task of those roles, which must exist in the
    cluster and must not be standing servers (their ports are taken).

    Raises:
        UsageError: a role the cluster lacks, or one whose tasks are standing servers.
    """
    if on is None:
        tasks = plan.training_tasks
        if not tasks:
            raise UsageError(f"cluster {plan.name!r} has no task without a standing server",
                             hint="name the roles with --on")
        return tasks
    chosen: list[TaskSpec] = []
    for role in on:
        of_role = plan.tasks_of(role)
        if not of_role:
            raise UsageError(f"--on {role}: cluster {plan.name!r} ({plan.mode}) has no {role} task",
                             hint=f"its tasks: {', '.join(t.name for t in plan.tasks)}; a one-shot "
                                  "'pscluster run INVENTORY --on ...' plans the roles you name")
        standing = [t.name for t in of_role if t.standing]
        if standing:
            raise UsageError(f"--on {role}: {', '.join(standing)} run(s) standing servers started by 'up' "
                             "(their ports are taken)",
                             hint="run on the other roles, or use a one-shot 'pscluster run INVENTORY --on ...'")
        chosen.extend(of_role)
    return tuple(chosen)


# ----------------------------------------------------------------------------- files and directories

@dataclass(frozen=True)
class Workspace:
    """Where the program runs: this machine's current directory and checkout, and per host."""

    cwd: Path        # where `pscluster run` was typed
    root: Path       # this checkout (synced as the hosts' workdir)
    home: Path | None = None        # this user's home: a script there does not take its folder along
    state_dir: Path | None = None   # pscluster's state: never copied

    def subdir(self) -> str:
        """The current directory relative to the checkout ("" when outside it)."""
        try:
            rel = self.cwd.relative_to(self.root)
        except ValueError:
            return ""
        return "" if str(rel) == "." else rel.as_posix()

    def host_cwd(self, host: HostSpec) -> str:
        """The program's working directory on ``host``: this very directory on hosts that share
        this checkout; else the same place relative to the host's workdir (the workdir itself
        when this directory is outside the checkout)."""
        if not needs_sync(host, self.root):
            return str(self.cwd)
        sub = self.subdir()
        return host.workdir.rstrip("/") + (f"/{sub}" if sub else "")

    def dest_prefix(self) -> str:
        """Prefix of synced files relative to a host's workdir."""
        sub = self.subdir()
        return f"{sub}/" if sub else ""


def program_file_set(argv: Sequence[str], sync: Sequence[str], space: Workspace, *,
                     limit_mib: int = DEFAULT_SYNC_LIMIT_MIB) -> FileSet:
    """What :func:`local_files` copies, measured but not read (``run --dry-run`` lists it)."""
    entries: list[str] = []
    for arg in argv:
        rel = _under(arg, space.cwd)
        if rel is not None and rel != "." and (space.cwd / rel).is_file() and rel not in entries:
            entries.append(rel)
    return program_files(space.cwd, entries, program_folder(argv, space), check_sync_paths(sync, space),
                         limit_mib=limit_mib, home=space.home, state_dir=space.state_dir)


def local_files(argv: Sequence[str], sync: Sequence[str], space: Workspace, *,
                limit_mib: int = DEFAULT_SYNC_LIMIT_MIB) -> list[LocalFile]:
    """Local files to copy to hosts that do not share this checkout, as paths relative to the
    current directory: the files the command names (the program or script, arguments that are
    relative paths to files under the current directory), the script's whole folder when it is
    the current directory or below it (cluster.program.progfiles: ignore files, caps), and every
    ``--sync`` path.

    Raises:
        UsageError: a bad ``--sync`` path, or more than the cap to copy.
    """
    found = program_file_set(argv, sync, space, limit_mib=limit_mib)
    return collect(space.cwd.resolve(), tuple(entry.rel for entry in found.entries), prefix=space.dest_prefix(),
                   keep_private=True)


def program_folder(argv: Sequence[str], space: Workspace) -> str | None:
    """The folder of the command's script (or program path) relative to the current directory,
    "." for the current directory itself; None when it is elsewhere (or there is no script)."""
    script = script_of(argv) or (argv[0] if argv and "/" in argv[0] else None)
    if not script or "{" in script:
        return None
    rel = _under(script, space.cwd)
    if rel is None or not (space.cwd / rel).is_file():
        return None
    return posixpath.dirname(rel) or "."


def check_sync_paths(sync: Sequence[str], space: Workspace) -> list[str]:
    """``--sync`` paths relative to the current directory (``.`` is the directory itself).

    Raises:
        UsageError: a path that is missing or outside the current directory.
    """
    entries: list[str] = []
    for item in sync:
        rel = _under(item, space.cwd)
        if rel is None:
            raise UsageError(f"--sync {item}: not under the current directory ({space.cwd})",
                             hint="--sync copies files and folders below where you run pscluster (. for all of "
                                  "it), to the same place below each host's workdir")
        if not (space.cwd / rel).exists():
            raise UsageError(f"--sync {item}: no such file or folder")
        if rel not in entries:
            entries.append(rel)
    return entries


def _under(text: str, cwd: Path) -> str | None:
    """``text`` as a normalised path relative to ``cwd``, if it names something below it."""
    if not text or text.startswith("-") or "\n" in text or "=" in text:
        return None
    path = Path(text)
    if path.is_absolute():
        try:
            path = path.resolve().relative_to(cwd.resolve())
        except (ValueError, OSError):
            return None
    if os.path.normpath(path.as_posix()) == ".":
        return "."           # the current directory itself (--sync .)
    parts = PurePosixPath(os.path.normpath(path.as_posix())).parts
    if not parts or parts[0] in ("..", ".") or any(part == ".." for part in parts):
        return None
    return "/".join(parts)


def required_paths(argv: Sequence[str]) -> list[str]:
    """Paths that must exist on every host before the program starts: the program itself when
    it is a path, and a ``python`` command's script."""
    if not argv:
        return []
    if argv[0] in PYTHON_NAMES:
        script = script_of(argv)
        return [script] if script and "{" not in script else []
    return [argv[0]] if "/" in argv[0] and "{" not in argv[0] else []


def program_name(argv: Sequence[str]) -> str:
    """A short name for the job record: ``python tf1_flags.py``."""
    script = script_of(argv)
    if script:
        return f"{argv[0]} {PurePosixPath(script).name}"
    return PurePosixPath(argv[0]).name if argv else "?"
