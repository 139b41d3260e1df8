"""Option types and options shared by several commands."""
from __future__ import annotations

import math
import click

from ..contracts import RestartPolicy
from ..errors import UsageError
from ..history import DEFAULT_KEEP
from ..inventory import MODE_NAMES, canonical_mode
from ..names import check_cluster_name



detach_opt = click.option("--detach", is_flag=True,
                          help="Return once the job's processes have started; a supervisor daemon on this machine keeps "
                               "supervising it (pscluster attach / status / stop-job).")


replace_opt = click.option("--replace", is_flag=True,
                           help="If a job is still running on the cluster, stop it first (instead of refusing).")


keep_opt = click.option("--keep", type=click.IntRange(1, 100_000), default=DEFAULT_KEEP, show_default=True,
                        help="Runs of this cluster name whose logs are kept (pscluster runs / logs --run); older ones "
                             "are removed from the hosts when this job ends, as are older runs that never recorded "
                             "an end (a killed supervisor) once their processes are gone and they started over an "
                             "hour ago.")
allow_busy_opt = click.option("--allow-busy-gpus", is_flag=True,
                              help="Start on GPUs that other processes already use (lab GPUs are shared).")


inventory_arg = click.argument("inventory", type=click.Path())


limit_opt = click.option("--limit", metavar="PATTERN",
                         help="Only these hosts (Ansible pattern: a,b  all:!node-c  worker:&gpu  node-*).")


name_opt = click.option("--name", help="Cluster name (default: the inventory's file name without .yaml).",
                        callback=lambda ctx, param, value: value if value is None else check_cluster_name(value))


mode_opt = click.option("--mode", type=click.Choice(MODE_NAMES),
                        callback=lambda ctx, param, value: value if value is None else canonical_mode(value),
                        help="Training mode (default: pscluster_mode, else async); between-graph is another name for "
                             "sync-ps (ps and workers, TF1 style; sync or async as the program decides).")


port_opt = click.option("--port-base", type=click.IntRange(1024, 65000), help="First port (overrides pscluster_port_base).")


class FiniteFloat(click.FloatRange):
    """A number option within [min, max] that must be finite: click's float and FloatRange take
    ``nan`` (which passes every bound check, so ``up --timeout nan`` never timed out) and ``inf``."""

    name = "finite number"

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


SECONDS = FiniteFloat(1, 86400)      # timeouts: a second to a day

# --stall-timeout: 0 turns the watch off; below this a single unit of work (a closure of
# --steps-per-execution steps, a sync collective, a checkpoint) would pass for a stall.
MIN_STALL_TIMEOUT = 10.0


class StallTimeout(FiniteFloat):
    """``train --stall-timeout``: 0 (off) or 10 s to a day."""

    name = "seconds"

    def __init__(self) -> None:
        super().__init__(0, 86400)

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if 0 < number < MIN_STALL_TIMEOUT:
            self.fail(f"{number:g} s is shorter than a unit of work may take (a closure of --steps-per-execution "
                      f"steps, a collective, a checkpoint): give at least {MIN_STALL_TIMEOUT:g} s, or 0 to turn the "
                      "stall watch off", param, ctx)
        return number


def _check_notify_urls(ctx, param, values: tuple[str, ...]) -> tuple[str, ...]:
    from ..urls import url_problem
    for value in values:
        problem = url_problem(value)
        if problem:
            raise click.BadParameter(problem, ctx, param)
    return values


def _check_notify_cmds(ctx, param, values: tuple[str, ...]) -> tuple[str, ...]:
    from ..notify.notifier import parse_targets
    try:
        parse_targets([], values)
    except UsageError as exc:
        raise click.BadParameter(exc.message.split(": ", 1)[-1], ctx, param) from None
    return values


def _check_command(option: str, example: str):
    """A click callback: ``option``'s command must split into words (it runs with no shell)."""
    def check(ctx, param, value: str | None) -> str | None:
        from ..notify.notifier import split_command
        if value is not None:
            try:
                split_command(value, option, example)
            except UsageError as exc:
                shown = exc.message.split(": ", 1)[-1] + (f" ({exc.hint})" if exc.hint else "")
                raise click.BadParameter(shown, ctx, param) from None
        return value
    return check


check_hosts_from = _check_command("--hosts-from", "./discover_hosts.sh")       # train --hosts-from COMMAND
check_notices_from = _check_command("--notices-from", "'examples/notices/spot_notices.py --aws w1 w2'")


class DeadlineParam(click.ParamType):
    """A drain's deadline (cluster/lifecycle/drain.py ``parse_deadline``): 30, 30s, 2m, 500ms, 1h."""

    name = "deadline"

    def convert(self, value, param, ctx):  # type: ignore[no-untyped-def]
        if isinstance(value, float):
            return value
        from ..lifecycle.drain import parse_deadline
        try:
            return parse_deadline(value)
        except UsageError as exc:
            self.fail(exc.message.split(": ", 1)[-1], param, ctx)


def notify_opts(command):
    """``--notify URL`` and ``--notify-cmd CMD`` (train, run): job state changes, see cluster/notify/notifier.py."""
    command = click.option("--notify-cmd", "notify_cmds", multiple=True, metavar="CMD", callback=_check_notify_cmds,
                           help="Run CMD with the event JSON on stdin on each job state change; repeatable.")(command)
    return click.option("--notify", "notify_urls", multiple=True, metavar="URL", callback=_check_notify_urls,
                        help="POST a JSON event to URL when the job starts, restarts a task, fails, finishes or "
                             "reaches --deadline; repeatable, adds to pscluster_notify.")(command)


class DurationParam(click.ParamType):
    """A duration as seconds: 90, 90s, 45m, 2h, 1d; finite and at most a year (``nan``, ``inf`` and
    ``1e400s`` parsed as floats and meant "no deadline")."""

    name = "duration"
    units = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
    longest = 366 * 86400

    def convert(self, value, param, ctx):  # type: ignore[no-untyped-def]
        text = str(value).strip().lower()
        number, unit = text.rstrip("smhd"), text[len(text.rstrip("smhd")):]
        try:
            seconds = float(number) * self.units[unit]
        except (ValueError, KeyError):
            self.fail(f"{value!r} is not a duration; write e.g. 90s, 45m, 2h", param, ctx)
        if not math.isfinite(seconds) or seconds <= 0 or seconds > self.longest:
            self.fail(f"{value!r}: a duration must be > 0 and at most 366d", param, ctx)
        return seconds


def restart_opts(*, policy: str, policy_help: str, lost_host: str):
    """--restart-policy (default ``policy``), --max-restarts and --host-timeout, as train and run
    take them (``lost_host``: what fails when a host stays unreachable)."""
    def decorate(command):
        command = click.option("--host-timeout", type=SECONDS, default=60.0, show_default=True,
                               help=f"Seconds to wait for an unreachable host before failing the {lost_host}.")(command)
        command = click.option("--max-restarts", type=click.IntRange(0, 100), default=3, show_default=True,
                               help="Restarts allowed per task (exponential backoff from 1 s).")(command)
        return click.option("--restart-policy", type=click.Choice([p.value for p in RestartPolicy]), default=policy,
                            show_default=True, help=policy_help)(command)
    return decorate
