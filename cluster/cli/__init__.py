"""The ``pscluster`` command line: a thin layer over the modules that do the work.

Each command parses its options, calls the function that does the work (lifecycle, supervision,
export, bench, ...) and renders the result; errors become exit codes in one place,
:func:`cluster.cli.base.run` (contracts.ExitStatus: 0 ok, 1 failure, 2 bad input or usage,
4 ``train --deadline`` reached with its checkpoint saved, 130 interrupted, 143/129 terminated
by SIGTERM/SIGHUP after the same clean-up as Ctrl-C).

Rooms: ``base`` (the click group, :class:`Env`, the inventory and plan a command loads, the
secrets it takes from the environment, :func:`run`), ``options`` (option types and options
shared by several commands), and one module per family of commands: ``cluster_cmds`` (plan,
check, up, status, down, scale, tensorboard), ``job_cmds`` (train, run, attach, stop-job,
supervise), ``history_cmds`` (logs, runs, clean), ``study_cmds`` (export, bench).

Why the commands import inside their functions (about 80 ``from ..x import y`` lines in this
package): start-up time. Each command loads only the rooms it uses; importing every command's
modules at the top made ``pscluster --help`` take 0.81-0.89 s against 0.60-0.69 s (three runs
each, 2026-12-03, this project's 2-core machine with the suite running beside), and every
``status`` or ``logs`` would pay it. matplotlib (``bench --plot``) is heavier still.
"""
from __future__ import annotations

from .base import Env, _terminations_interrupt, cli, main, run
from .options import DurationParam, FiniteFloat
from . import cluster_cmds, history_cmds, job_cmds, study_cmds  # noqa: F401  (each registers its commands on cli)

__all__ = ["DurationParam", "Env", "FiniteFloat", "cli", "main", "run", "_terminations_interrupt"]
