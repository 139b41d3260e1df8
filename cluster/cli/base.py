"""The command line's frame: the click group, :class:`Env` (what commands read and write instead of
globals), loading an inventory and its plan, the secrets taken from the environment, and
:func:`run`, which maps errors to exit codes (contracts.ExitStatus)."""
from __future__ import annotations

import contextlib
import signal
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from .. import console as ui
from ..hosts.codesync import local_workdir
from ..contracts import ExitStatus
from ..errors import PsclusterError, Terminated, UsageError
from ..inventory import Inventory, load_inventory
from ..notify.notifier import Notifier
from ..plan import ClusterPlan, PlanOptions, plan_cluster
from ..state import RunState, StateStore
from ..transport import TransportPool

if TYPE_CHECKING:
    from rich.console import Console      # rich itself is console/'s (docs/architecture.md)


@dataclass
class Env:
    """What commands read and write instead of globals (tests pass their own)."""

    out: Console
    err: Console
    store: StateStore
    traceback: bool = False
    pool_factory: type = TransportPool
    extra: dict = field(default_factory=dict)
    detached: Any = None        # cluster.supervision.daemon.DaemonFiles when this process is a --detach supervisor


def _plan(inventory: str, *, name: str | None, mode: str | None, port_base: int | None,
          env: Env | None = None, limit: str | None = None, pool: TransportPool | None = None) -> ClusterPlan:
    """The plan of INVENTORY; with ``pool``, `<role>_gpus: auto` is resolved on the hosts."""
    options = PlanOptions(local_python=sys.executable, local_workdir=local_workdir(), name=name,
                          mode=mode, port_base=port_base)
    return _planned(_inventory(env, inventory, limit, mode), options, pool)


def _planned(inventory: Inventory, options: PlanOptions, pool: TransportPool | None) -> ClusterPlan:
    plan = plan_cluster(inventory, options)
    if pool is not None and plan.auto_gpu_hosts:
        from ..hosts.preflight import resolve_auto_gpus
        plan = plan_cluster(resolve_auto_gpus(inventory, plan, pool), options)
    return plan


def _inventory(env: Env | None, path: str, limit: str | None, mode: str | None,
               roles: tuple[str, ...] | None = None):
    """Load INVENTORY, print its warnings once (stderr), apply --limit."""
    return _limited(env, _loaded(env, path), limit, mode, roles)


def _loaded(env: Env | None, path: str) -> Inventory:
    """Load INVENTORY and print its warnings once (stderr)."""
    inventory = load_inventory(path)
    if env is not None:
        ui.render_warnings(env.err, inventory.warnings)
    return inventory


def _limited(env: Env | None, inventory: Inventory, limit: str | None, mode: str | None,
             roles: tuple[str, ...] | None = None) -> Inventory:
    """``inventory`` with --limit applied (its warnings to stderr)."""
    from ..inventory.patterns import apply_limit, required_roles
    warn = None if env is None else (lambda warning: ui.render_warnings(env.err, [warning]))
    return apply_limit(inventory, limit, required_roles(mode, inventory, roles), warn=warn)


def _notifier(env: Env, plan: ClusterPlan, urls: tuple[str, ...], commands: tuple[str, ...],
              display) -> Notifier | None:
    """The notifier of the inventory's pscluster_notify and the command line's targets (None: no target).
    Its warnings go to ``display`` as messages."""
    from ..notify.notifier import parse_targets
    targets = parse_targets([*plan.notify, *urls], commands)
    if not targets:
        return None
    return Notifier(targets, warn=lambda text: display.emit("message", level="warning", text=text))


def _with_notifier(display, notifier):
    from ..events import TeeReporter
    return display if notifier is None else TeeReporter(display, notifier)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--state-dir", type=click.Path(file_okay=False), envvar="PSCLUSTER_STATE_DIR",
              help="Where cluster state files live (default ~/.local/state/pscluster).")
@click.option("--traceback", is_flag=True, help="Show the full Python traceback on errors.")
@click.option("--no-color", is_flag=True, envvar="NO_COLOR", help="Plain output.")
@click.version_option(package_name="pscluster")
@click.pass_context
def cli(ctx: click.Context, state_dir: str | None, traceback: bool, no_color: bool) -> None:
    """Plan, launch and tear down TensorFlow parameter-server clusters over SSH."""
    if ctx.obj is None:
        out, err = ui.make_consoles(no_color=no_color)
        ctx.obj = Env(out=out, err=err, store=StateStore(Path(state_dir) if state_dir else None))
    ctx.obj.traceback = ctx.obj.traceback or traceback


def _existing(env: Env, name: str) -> RunState:
    """The state of cluster ``name``, which must exist (it may vanish between resolve and load)."""
    state = env.store.load(name)
    if state is None:
        raise UsageError(f"no cluster named {name!r}", hint="'pscluster status' lists the clusters that are up")
    return state


def run(argv: list[str] | None = None, env: Env | None = None) -> int:
    """Run the CLI and return its exit code (what tests call).

    SIGTERM and SIGHUP raise :class:`~cluster.errors.Terminated` (a KeyboardInterrupt) in the
    main thread, so ``up``, ``train``, ``bench`` and ``run`` roll back and clean up as after
    Ctrl-C; the exit code is then 128 + the signal's number, whatever the command reported.
    """
    with _terminations_interrupt() as received:
        code = _run(argv, env)
    return 128 + received[0] if received else code


@contextlib.contextmanager
def _terminations_interrupt():
    """Handlers for SIGTERM/SIGHUP for the duration of one command; yields the signals seen."""
    received: list[int] = []

    def handler(signum, frame):
        if received:
            return      # already cleaning up after the first one: let the clean-up finish
        received.append(signum)
        raise Terminated(signum)

    previous = {}
    try:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.signal(sig, handler)
    except ValueError:      # not the main thread (an embedding program): leave signals alone
        pass
    try:
        yield received
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _run(argv: list[str] | None, env: Env | None) -> int:
    try:
        cli.main(args=argv, prog_name="pscluster", standalone_mode=False, obj=env)
        return ExitStatus.OK
    except PsclusterError as exc:
        env = env or _fallback_env()
        if env.traceback:
            env.err.print(traceback.format_exc(), markup=False)
        ui.render_error(env.err, exc)
        return exc.exit_code
    except (click.exceptions.Abort, KeyboardInterrupt):
        return ExitStatus.INTERRUPTED
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except SystemExit as exc:
        return int(exc.code) if isinstance(exc.code, int) else (ExitStatus.OK if exc.code is None else ExitStatus.FAILURE)


def _fallback_env() -> Env:
    out, err = ui.make_consoles()
    return Env(out=out, err=err, store=StateStore(), traceback="--traceback" in sys.argv)


def main() -> None:
    sys.exit(run(sys.argv[1:]))
