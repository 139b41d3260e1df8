"""Training process: ``python -m roles.train --mode {async|sync|sync-ps} --job JOB
--events PATH [options]``.

Started by the orchestrator on the chief (async) or on every worker (sync, sync-ps),
with TF_CONFIG naming the cluster and this task. It loads the job, hands it to the
driver of the mode (roles/*_driver.py) and reports through the events file (see
roles/events.py): ``start``, ``placement``, ``progress``, ``checkpoint``, then ``done``
or ``error``. stdout/stderr are for humans only.

The process splits in two before importing TensorFlow (roles/guardian.py): the
PID the orchestrator started stays a small guardian, and a forked child trains. The
guardian ends the trainer at once on SIGTERM/SIGINT/SIGHUP, even when TensorFlow
blocks holding the GIL or swallows SIGTERM, and enforces ``--start-timeout``.

Exit codes (of the guardian, i.e. of the PID that was started): 0 done; 1 training
failed; 2 bad command line, environment or job file; 3 ``--start-timeout`` passed before the
first step; 128+N ended by signal N (SIGTERM: 143; also after a checkpoint-on-stop).
Every non-zero exit comes after an ``error`` event saying why (``exception`` "Stopped"
when the job checkpointed and stopped on SIGTERM, with the checkpoint in the message).
At ``--deadline`` the run checkpoints and ends like a finished one (``done`` with
``global_step`` short of the budget, exit 0); ``pscluster train`` exits 4 then.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any, Callable, NoReturn, Sequence

from roles.events import EventWriter
from roles.jobs import JobError
from roles.guardian import TrainerLink, split
from roles.settings import DEFAULT_STEPS_PER_EXECUTION, DEFAULT_WARMUP_STEPS, MODES, TRAINER_DEFAULTS, TrainOptions
from roles.tfconfig import ConfigError, TaskInfo, task_from_env

DRIVERS = {"async": "roles.async_driver", "sync": "roles.sync_driver",
           "sync-ps": "roles.syncps_driver"}
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_STOPPED = 128 + signal.SIGTERM     # checkpointed and ended on a stop request

log = logging.getLogger("pscluster.train")


class UsageError(Exception):
    """A bad command line (argparse would otherwise sys.exit from deep inside)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m roles.train",
                description="Run one training process of a pscluster job.")
    p.add_argument("--mode", required=True, choices=MODES,
                   help="async: ParameterServerStrategy, run on the chief; sync: "
                        "MultiWorkerMirroredStrategy, run on every worker; sync-ps: "
                        "SyncReplicasOptimizer with ps tasks, run on every worker")
    p.add_argument("--job", required=True,
                   help="job .py file, or directory containing job.py")
    p.add_argument("--events", required=True, help="JSON-lines events file to append to")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--epochs", type=float, help="epochs of the train split "
                        "(default: the job's EPOCHS/STEPS)")
    budget.add_argument("--steps", type=int, help="global step (optimizer update) budget")
    p.add_argument("--batch-size", type=int,
                   help="examples per optimizer update (default: the job's BATCH_SIZE)")
    p.add_argument("--learning-rate", type=float,
                   help="default: the job's LEARNING_RATE")
    p.add_argument("--scale-lr", action="store_true",
                   help="multiply the learning rate by the number of workers")
    p.add_argument("--checkpoint-dir",
                   help="where the chief keeps checkpoints (need not exist on other hosts)")
    p.add_argument("--checkpoint-every", type=int, metavar="STEPS",
                   help="also checkpoint every STEPS global steps (default: only at the end)")
    p.add_argument("--snapshot-every", type=float, metavar="SECONDS",
                   help="also save every SECONDS (async: the chief, while training goes on; sync: every "
                        "worker after the same step), so that a lost ps or worker costs at most that much "
                        "training (default: off; 0: off)")
    p.add_argument("--resume", action="store_true",
                   help="restore the latest checkpoint in --checkpoint-dir and continue")
    p.add_argument("--eval-every", type=int, metavar="STEPS",
                   help="also evaluate on the test set every STEPS global steps (chief; "
                        "'eval' events); the final evaluation always happens")
    p.add_argument("--data", help="data file for the job (exported as PSCLUSTER_DATA)")
    p.add_argument("--steps-per-execution", type=int, metavar="K",
                   help="steps per traced call (default: "
                        + ", ".join(f"{m} {k}" for m, k in DEFAULT_STEPS_PER_EXECUTION.items())
                        + ")")
    p.add_argument("--warmup-steps", type=int, metavar="STEPS",
                   help="async: the first STEPS global steps run on one worker at a time, then all "
                        f"train (default: {DEFAULT_WARMUP_STEPS}, at most a quarter of the budget; 0: none)")
    p.add_argument("--start-timeout", type=float, default=TRAINER_DEFAULTS.start_timeout, metavar="SECONDS",
                   help=f"fail if the first step has not run by then (default {TRAINER_DEFAULTS.start_timeout:g})")
    p.add_argument("--collective-timeout", type=float, default=TRAINER_DEFAULTS.collective_timeout,
                   metavar="SECONDS",
                   help="sync: fail a collective that waits longer; sync-ps: fail a step (after the "
                        f"first) that waits longer (default {TRAINER_DEFAULTS.collective_timeout:g})")
    p.add_argument("--stop-grace", type=float, default=TRAINER_DEFAULTS.stop_grace, metavar="SECONDS",
                   help="on SIGTERM checkpoint and stop within SECONDS, then be killed; "
                        f"0: die at once (default {TRAINER_DEFAULTS.stop_grace:g})")
    p.add_argument("--deadline", type=float, metavar="SECONDS",
                   help="checkpoint and end SECONDS after the start ('done' short of the budget)")
    p.add_argument("--summary-dir",
                   help="where the chief (async) or worker 0 (sync, sync-ps) writes TensorBoard "
                        "summaries (default: none)")
    p.add_argument("--summary-every", type=int, default=TRAINER_DEFAULTS.summary_every, metavar="STEPS",
                   help="one point of TensorBoard scalars every STEPS global steps; 0: none "
                        f"(default {TRAINER_DEFAULTS.summary_every})")
    p.add_argument("--restarts", type=int, default=0,
                   help="restarts of the job before this process (the 'restarts' scalar)")
    p.add_argument("--seed", type=int, default=TRAINER_DEFAULTS.seed, help=argparse.SUPPRESS)
    p.add_argument("--gate", metavar="PATH", help=argparse.SUPPRESS)   # roles/handover.py (sync)
    return p


def parse_options(argv: Sequence[str]) -> TrainOptions:
    ns = build_parser().parse_args(list(argv))
    # Paths come from the orchestrator relative to the host's workdir, which defaults to
    # ~/pscluster: no shell expands `~` in an argv list, so expand it here (else a folder
    # named "~" appears in the workdir and the orchestrator never finds the events).
    home = {name: os.path.expanduser(value) if value else value
            for name, value in (("job", ns.job), ("events", ns.events), ("checkpoint_dir", ns.checkpoint_dir),
                                ("data", ns.data), ("summary_dir", ns.summary_dir), ("gate", ns.gate))}
    return TrainOptions(
        mode=ns.mode, job=home["job"], events=home["events"], epochs=ns.epochs, steps=ns.steps,
        batch_size=ns.batch_size, learning_rate=ns.learning_rate, scale_lr=ns.scale_lr,
        checkpoint_dir=home["checkpoint_dir"], checkpoint_every=ns.checkpoint_every,
        resume=ns.resume, data=home["data"], eval_every=ns.eval_every,
        steps_per_execution=ns.steps_per_execution, warmup_steps=ns.warmup_steps,
        start_timeout=ns.start_timeout, collective_timeout=ns.collective_timeout,
        stop_grace=ns.stop_grace, deadline=ns.deadline, summary_every=ns.summary_every,
        snapshot_every=ns.snapshot_every,
        summary_dir=home["summary_dir"], restarts=ns.restarts, seed=ns.seed, gate=home["gate"])


def _flag(argv: Sequence[str], name: str) -> str | None:
    """A flag's value found without the full parser (which may have failed)."""
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _task_name(task: TaskInfo | None) -> str:
    return task.name if task else "unknown"


def _report_early_failure(argv: Sequence[str], task: TaskInfo | None,
                          message: str, exception: str) -> None:
    print(f"roles.train: {message}", file=sys.stderr, flush=True)
    path = _flag(argv, "--events")
    if path:
        try:
            with EventWriter(path, _task_name(task)) as writer:
                writer.emit("error", message=message, exception=exception)
        except OSError:
            pass


def error_message(error: BaseException, limit: int = 2000) -> str:
    """The gist of an exception for the ``error`` event.

    TensorFlow's op errors embed the Python stack where the failing op was defined
    ("Detected at node ... defined at (most recent call last): File ..."); that is
    for the log, which gets the full traceback. The event keeps the other lines.
    """
    text = (getattr(error, "message", None) or str(error) or type(error).__name__).strip()
    lines = [line for line in text.splitlines()
             if line.strip() and not line.startswith('  File "')
             and not line.startswith("Detected at node")]
    return "\n".join(lines)[:limit]


def is_chief(mode: str, task: TaskInfo) -> bool:
    """The task that writes job-level events, checkpoints and the evaluation."""
    if mode == "async":
        return task.task_type == "chief"
    return task.task_type == "worker" and task.task_index == 0


def configure_logging() -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")


def prepare(argv: Sequence[str]) -> tuple[TrainOptions, TaskInfo] | int:
    """The command line and TF_CONFIG, read before the split; :data:`EXIT_USAGE` (after an
    ``error`` event, when the events file is known) if either is bad."""
    task: TaskInfo | None = None
    try:
        options = parse_options(argv)
        task = task_from_env()
    except (UsageError, ConfigError) as e:
        _report_early_failure(argv, task, str(e), type(e).__name__)
        return EXIT_USAGE
    return options, task


FIRST_STEP = "the first training step"    # what --start-timeout waits for (the guardian's words)


def guardian_report(options: TrainOptions, task: TaskInfo) -> Callable[[str, str], None]:
    """How the guardian writes the ``error`` event when the trainer could not."""
    events_path, task_name = options.events, task.name

    def report_from_guardian(message: str, exception: str) -> None:
        print(f"roles.train guardian: {message}", file=sys.stderr, flush=True)
        with EventWriter(events_path, task_name) as guardian_writer:
            guardian_writer.emit("error", message=message, exception=exception)
    return report_from_guardian


def stop_grace_of(options: TrainOptions) -> float:
    """The guardian's checkpoint-on-stop grace (``--stop-grace``). Every mode checkpoints on
    SIGTERM: sync's coordination service takes SIGTERM over in C++ (docs/platform-notes.md TF3),
    so the guardian passes the request on as SIGUSR1 (roles/guardian.py), and the workers agree
    on the step to stop at (roles/sync_driver.py)."""
    return options.stop_grace


def main(argv: Sequence[str] | None = None) -> int:
    started = time.time()
    argv = list(sys.argv[1:] if argv is None else argv)
    configure_logging()
    prepared = prepare(argv)
    if isinstance(prepared, int):
        return prepared
    options, task = prepared
    # Before TensorFlow is imported: from here on this is the trainer, and the
    # original process supervises it (roles/guardian.py).
    guardian = split(options.start_timeout, FIRST_STEP, guardian_report(options, task),
                     stop_grace=stop_grace_of(options))
    return run_trainer(options, task, guardian, started)


def run_trainer(options: TrainOptions, task: TaskInfo, guardian: TrainerLink, started: float) -> int:
    """The trainer's side of the split (here, or in an adopted standby: roles/standby.py):
    train, write the final event, return the exit code."""
    if options.deadline is not None:
        timer = threading.Timer(max(0.0, options.deadline - (time.time() - started)),
                                guardian.request_stop, args=("deadline",))
        timer.daemon = True
        timer.start()
    writer = EventWriter(options.events, task.name)
    if options.data:
        os.environ["PSCLUSTER_DATA"] = os.path.abspath(options.data)
    try:
        result = _train(options, task, writer, guardian)
    except (ConfigError, UsageError, JobError) as e:  # the user's input, not the run
        log.error("%s", e)
        writer.emit("error", message=str(e), exception=type(e).__name__)
        guardian.finished()
        return EXIT_USAGE
    except Exception as e:  # noqa: BLE001 - the process boundary: report, then exit 1
        traceback.print_exc()
        writer.emit("error", message=error_message(e), exception=type(e).__name__)
        guardian.finished()
        return EXIT_FAILED
    if guardian.stop_requested and guardian.stop_reason != "deadline":
        return _stopped(result, writer, guardian, options, task)
    writer.emit("done", mode=options.mode, workers=result.workers or task.num_workers,
                global_step=result.global_step, val_loss=result.val_loss,
                val_accuracy=result.val_accuracy,
                wall_seconds=round(time.time() - started, 2),
                examples_per_second=result.examples_per_second,
                checkpoint=result.checkpoint, restored_step=result.restored_step,
                per_worker=result.per_worker)
    guardian.finished()
    log.info("done: step %d, val_loss %s, val_accuracy %s, checkpoint %s",
             result.global_step, result.val_loss, result.val_accuracy, result.checkpoint)
    writer.close()
    if options.mode == "sync":
        from roles.sync_driver import leave
        started_leaving = time.monotonic()
        leave(task, options.collective_timeout)
        log.info("left with the other workers in %.2f s", time.monotonic() - started_leaving)
    return EXIT_OK


def _stopped(result: Any, writer: EventWriter, guardian: TrainerLink, options: TrainOptions, task: TaskInfo) -> int:
    """The driver checkpointed and ended early on SIGTERM: say so and exit 143."""
    saved = f"checkpoint {result.checkpoint}" if result.checkpoint else "no checkpoint (no --checkpoint-dir)"
    message = (f"stopped by {guardian.stop_reason} at step {result.global_step}; {saved}; "
               "continue with --resume")
    log.info("%s", message)
    writer.emit("error", message=message, exception="Stopped")
    guardian.finished()
    writer.close()
    if options.mode == "sync":      # every worker stopped at the same step: leave together
        from roles.sync_driver import leave
        leave(task, options.collective_timeout)
    return EXIT_STOPPED


def _train(options: TrainOptions, task: TaskInfo, writer: EventWriter,
           guardian: TrainerLink) -> Any:
    from roles.tfconfig import threads_from_env
    from roles.tfruntime import import_tensorflow

    threads = threads_from_env()
    import_tensorflow(threads)
    from roles.jobs import load_job
    from roles.settings import make_plan
    from roles.reporting import TaskReporter

    job = load_job(options.job)
    plan = make_plan(job, options, workers=task.num_workers)
    driver = importlib.import_module(DRIVERS[options.mode])
    chief = is_chief(options.mode, task)
    summaries = None
    if chief and options.summary_dir and plan.summary_every:
        from roles.summaries import Summaries
        summaries = Summaries(options.summary_dir, plan.summary_every, plan.learning_rate, options.restarts)
    reporter = TaskReporter(writer, plan, chief, summaries)
    log.info("%s: mode %s, %d worker(s), global batch %d, %d steps, lr %g, K %d",
             task.name, plan.mode, plan.workers, plan.global_batch_size,
             plan.steps_total, plan.learning_rate, plan.steps_per_execution)
    try:
        result = driver.run(job, plan, task, reporter, guardian)
    except BaseException:
        reporter.close_summaries(None)      # what was written stays (each point is flushed)
        raise
    reporter.close_summaries(result.global_step)
    return result


# Modes whose trainer ends with os._exit once its final event is written. Every
# outcome is on disk by then (events are flushed per line, checkpoints are written
# synchronously) while TensorFlow's teardown can stall: closing a sync-ps chief's
# session waits ~15 s to cancel the SyncReplicasOptimizer queue runner blocked on the
# ps; destroying a sync worker's distributed dataset iterator takes 2-20 s at random.
# sync only after a finished run, which ends with ``sync_driver.leave``: worker 0
# hosts MultiWorkerMirroredStrategy's coordination service, and a worker 0 that
# vanished before the others were done left them stuck for ~60 s after their last
# collective. A failed sync run exits normally (its group is stopped anyway).
HARD_EXIT_MODES = frozenset({"async", "sync-ps"})


def _exits_hard(mode: str | None, code: int) -> bool:
    return mode in HARD_EXIT_MODES or (mode == "sync" and code in (EXIT_OK, EXIT_STOPPED))


def exit_trainer(mode: str | None, code: int) -> NoReturn:
    """End the process with ``code``: at once where TensorFlow's teardown can stall (above)."""
    if _exits_hard(mode, code):
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def _run_and_exit(argv: Sequence[str]) -> None:
    exit_trainer(_flag(argv, "--mode"), main(argv))


if __name__ == "__main__":
    _run_and_exit(sys.argv[1:])
