"""Commands that write or measure instead of running a job: export, bench."""
from __future__ import annotations

import json
import sys
from pathlib import Path
import click

from .. import console as ui
from ..hosts.codesync import local_workdir, project_root
from ..contracts import ExitStatus
from ..errors import UsageError
from ..plan import PlanOptions

from ..secrets import take_from_environment as take_secrets
from .base import Env, _inventory, _plan, cli
from .options import FiniteFloat, SECONDS, inventory_arg, limit_opt, mode_opt, name_opt, port_opt


@cli.command()
@inventory_arg
@click.option("--format", "fmt", type=click.Choice(["tfjob", "sbatch"]), default="tfjob", show_default=True,
              help="Manifest format: a Kubeflow TFJob (kubeflow.org/v1), or a Slurm batch script.")
@click.option("--time", "time_limit", help="sbatch: the job's time limit (e.g. 1:00:00).")
@click.option("--partition", help="sbatch: the partition.")
@click.option("--gres", help="sbatch: generic resources per node (e.g. gpu:2).")
@click.option("--steps", type=click.IntRange(1), help="sbatch: training steps (default: the job's own).")
@click.option("--run", "run_program_text", metavar="COMMAND",
              help="sbatch: run this program with `pscluster run` instead of training, e.g. "
                   "\"python prog.py --task_index={task_index}\" (split like a shell line).")
@click.option("--checkpoint-dir", "batch_checkpoint_dir",
              help="sbatch: checkpoint folder on shared storage; every run resumes from it "
                   "(default: $SLURM_SUBMIT_DIR/pscluster-checkpoints/<name>/<job>).")
@click.option("--checkpoint-every", "batch_checkpoint_every", type=click.IntRange(1), default=500, show_default=True,
              metavar="STEPS", help="sbatch: checkpoint interval in steps (besides the checkpoint on stop).")
@click.option("--warn-before", type=click.IntRange(1, 65535), default=120, show_default=True, metavar="SECONDS",
              help="sbatch: Slurm signals the script this long before the time limit (--signal=B:USR1@SECONDS); "
                   "it checkpoints, takes the cluster down and requeues the job.")
@click.option("--requeue/--no-requeue", "batch_requeue", default=True, show_default=True,
              help="sbatch: requeue the job itself after the time-limit warning.")
@click.option("--max-nodes", type=click.IntRange(1, 100000), metavar="N",
              help="sbatch: ask for the inventory's nodes up to N (--nodes=MIN-N); each run, a requeued one too, "
                   "lays the cluster out on the nodes it got and resumes from the checkpoint at that size.")
@click.option("--image", help="Container image of every replica (docker/Dockerfile builds one).  [default: "
                              "pscluster-node:tf2.21.0-cpu]")
@click.option("--job", default="distributed_mnist", show_default=True,
              help="A job of examples/, or a job's path inside the image.")
@mode_opt
@name_opt
@click.option("--restart-policy", type=click.Choice(["OnFailure", "Never", "Always", "ExitCode"]),
              default="OnFailure", show_default=True, help="The replicas' restart policy.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the manifest to FILE, not stdout.")
@click.pass_obj
def export(env: Env, inventory: str, fmt: str, time_limit: str | None, partition: str | None, gres: str | None,
           steps: int | None, run_program_text: str | None, batch_checkpoint_dir: str | None,
           batch_checkpoint_every: int, warn_before: int, batch_requeue: bool, max_nodes: int | None,
           image: str | None, job: str,
           mode: str | None, name: str | None, restart_policy: str, output: str | None) -> None:
    """Write the cluster as a manifest for another launcher (Kubernetes TFJob, Slurm sbatch), touching no host."""
    import yaml
    from ..export import DEFAULT_IMAGE, secret_refs, tfjob_manifest, train_command
    if fmt == "sbatch":
        _export_sbatch(env, inventory, mode=mode, name=name, job=job, steps=steps, time_limit=time_limit,
                       partition=partition, gres=gres, output=output, program_text=run_program_text,
                       checkpoint_dir=batch_checkpoint_dir, checkpoint_every=batch_checkpoint_every,
                       warn_seconds=warn_before, requeue=batch_requeue, max_nodes=max_nodes)
        return
    if max_nodes is not None:
        raise UsageError("--max-nodes applies to --format sbatch")
    if run_program_text is not None:
        raise UsageError("--run applies to --format sbatch", hint="a TFJob trains the job given by --job")
    shipped = project_root() / "examples"      # the image is built from this checkout
    if shipped.is_dir() and "/" not in job and not job.endswith(".py") and not (shipped / job / "job.py").is_file():
        known = sorted(p.name for p in shipped.iterdir() if (p / "job.py").is_file())
        raise UsageError(f"no job named {job!r} in examples/",
                         hint=f"shipped jobs: {', '.join(known) or 'none'}; or give the job's path inside the image")
    cluster = _plan(inventory, name=name, mode=mode, port_base=None)
    if cluster.auto_gpu_hosts:
        raise UsageError(f"<role>_gpus: auto on {', '.join(cluster.auto_gpu_hosts)}: a manifest cannot count "
                         "a host's GPUs", hint="list the masks in the inventory for export")
    manifest = tfjob_manifest(cluster, image=image or DEFAULT_IMAGE, job_command=train_command(cluster.mode, job),
                              restart_policy=restart_policy, name=name)
    _write_output(env, yaml.safe_dump(manifest, sort_keys=False), output,
                  f"wrote TFJob {manifest['metadata']['name']!r} to {output}")
    for secret, keys in secret_refs(manifest).items():
        env.err.print(f"the manifest reads {', '.join(keys)} from the Secret {secret!r}; create it first from a "
                      f"file of KEY=value lines (not on a command line): kubectl create secret generic {secret} "
                      "--from-env-file=FILE", markup=False, highlight=False)


def _export_sbatch(env: Env, inventory: str, *, mode: str | None, name: str | None, job: str, steps: int | None,
                   time_limit: str | None, partition: str | None, gres: str | None, output: str | None,
                   program_text: str | None, checkpoint_dir: str | None, checkpoint_every: int, warn_seconds: int,
                   requeue: bool, max_nodes: int | None = None) -> None:
    """The inventory's layout as a batch script that runs `up --slurm` inside (cluster.slurm_layout.BatchJob)."""
    import shlex
    from ..program.runspec import check_placeholders
    from ..slurm_layout import BatchJob, batch_shape, sbatch_script
    program: tuple[str, ...] = ()
    if program_text is not None:
        try:
            program = tuple(shlex.split(program_text))
        except ValueError as exc:
            raise UsageError(f"--run {program_text!r}: {exc}", hint='quote it like a shell line: --run "python p.py"')
        if not program:
            raise UsageError("--run needs a program", hint='e.g. --run "python prog.py --task_index={task_index}"')
        check_placeholders(program)
    cluster = _plan(inventory, name=name, mode=mode, port_base=None)
    text = sbatch_script(BatchJob(
        **batch_shape(cluster), mode=cluster.mode, job=job, program=program, python=sys.executable,
        checkout=str(project_root()), steps=steps, time_limit=time_limit, partition=partition, gres=gres,
        name=cluster.name, checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
        warn_seconds=warn_seconds, requeue=requeue, max_nodes=max_nodes))
    _write_output(env, text, output, f"wrote a batch script to {output}; submit it with: sbatch {output}")


def _write_output(env: Env, text: str, output: str | None, done: str) -> None:
    """Write an exported document to ``output`` (saying ``done``), or to stdout."""
    if output:
        try:
            Path(output).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot write {output}: {exc.strerror or exc}") from None
        env.err.print(done, markup=False, highlight=False)
    else:
        env.out.file.write(text)
        env.out.file.flush()


@cli.command()
@click.argument("job")
@inventory_arg
@click.option("--workers", "workers_text", required=True, metavar="N,N,...",
              help="Worker counts to compare, e.g. 1,2,4.")
@click.option("--mode", "modes_text", metavar="MODE,...",
              help="Modes to compare: async, sync, sync-ps (default: pscluster_mode, else async).")
@click.option("--placement", "placements_text", default="pack", show_default=True, metavar="spread|pack",
              help="spread: one worker per host; pack: fill each host's GPU/CPU slots first; or both: spread,pack.")
@click.option("--steps", type=click.IntRange(1), default=300, show_default=True, help="Global steps per run.")
@click.option("--repeat", type=click.IntRange(1, 100), default=1, show_default=True,
              help="Runs per configuration (the table shows medians and the min-max spread).")
@click.option("--target-accuracy", type=FiniteFloat(0, 1), help="Also time how long until val_accuracy "
                                                                     "reaches this (evaluates during training).")
@click.option("--eval-every", type=click.IntRange(1), metavar="STEPS",
              help="Evaluation interval with --target-accuracy (default: steps/10).")
@click.option("--batch-size", type=click.IntRange(1), help="Global batch size (default: the job's).")
@click.option("--steps-per-execution", type=click.IntRange(1), metavar="K", help="Steps per traced call.")
@port_opt
@click.option("--timeout", type=SECONDS, default=120.0, show_default=True,
              help="Seconds to wait for the servers of each run.")
@click.option("--json", "as_json", is_flag=True, help="Print {environment, results} as JSON.")
@click.option("--out", type=click.Path(dir_okay=False), help="Also write the JSON document to FILE.")
@click.option("--plot", type=click.Path(dir_okay=False), help="Write a PNG of throughput and efficiency vs workers.")
@limit_opt
@click.pass_obj
def bench(env: Env, job: str, inventory: str, workers_text: str, modes_text: str | None, placements_text: str,
          steps: int, repeat: int, target_accuracy: float | None, eval_every: int | None, batch_size: int | None,
          steps_per_execution: int | None, port_base: int | None, timeout: float, as_json: bool, out: str | None,
          plot: str | None, limit: str | None) -> None:
    """Train JOB on 1, 2, 4 ... workers of INVENTORY: running time, throughput, accuracy, scaling efficiency.

    Each configuration (mode x workers x placement, each --repeat times) is brought up as its own
    cluster (bench-<mode>-<n>w-<placement>-r<k>), trained for --steps and always brought down.
    Exit code 1 when a configuration failed, 130 when interrupted (what was measured is still shown).
    """
    from ..bench import environment, study
    from ..supervision.train_spec import resolve_job
    inv = _inventory(env, inventory, limit, None, roles=("worker",))
    spec = study.StudySpec.from_command_line(inv, workers=workers_text, modes=modes_text, placements=placements_text,
                                             steps=steps, repeat=repeat, target_accuracy=target_accuracy,
                                             eval_every=eval_every, batch_size=batch_size,
                                             steps_per_execution=steps_per_execution, port_base=port_base,
                                             ready_timeout=timeout)
    if plot:
        from ..bench.plot import require_matplotlib
        require_matplotlib()
    job_ref = resolve_job(job, project_root())
    options = PlanOptions(local_python=sys.executable, local_workdir=local_workdir())
    display = ui.BenchProgress(env.err)
    try:
        with env.pool_factory() as pool:
            facts = environment.gather_facts(study.study_hosts(inv, spec, options), pool)
            cpus = {host: item.cpus for host, item in facts.items() if not isinstance(item, str)}
            configs = study.plan_study(inv, spec, options, cpus)
            secrets = take_secrets(*(config.plan for config in configs if config.plan))
            outcome = study.Study(spec, store=env.store, pool=pool, job=job_ref, reporter=display,
                                  root=project_root(), secrets=secrets).run(configs)
    finally:
        display.close()
    document = study.document(outcome.results, environment.environment(facts, job=job, inventory=inventory, spec=spec))
    if out:
        try:
            Path(out).write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot write {out}: {exc.strerror or exc}") from None
    summaries = study.summarize(outcome.results)
    title = f"{job_ref.name} on {inventory}: {steps} steps" + (f", median of {repeat} runs" if repeat > 1 else "")
    if plot:
        from ..bench.plot import describe_environment, write_plot
        write_plot(summaries, plot, title=title, subtitle=describe_environment(document["environment"]))
    if as_json:
        env.out.print_json(json.dumps(document))
    else:
        ui.render_bench(env.out, summaries, outcome.results, title=title)
    if any(result.status == "ok" and result.examples_per_second is None for result in outcome.results):
        env.err.print("some runs were too short to measure a rate (the first step or scheduled function is not "
                      "timed; async runs 32 steps per function): raise --steps or lower --steps-per-execution",
                      markup=False, highlight=False)
    if out and not as_json:
        env.err.print(f"wrote {out}", markup=False, highlight=False)
    if plot and not as_json:
        env.err.print(f"wrote {plot}", markup=False, highlight=False)
    if outcome.interrupted:
        raise SystemExit(ExitStatus.INTERRUPTED)
    if any(result.status == "failed" for result in outcome.results):
        raise SystemExit(ExitStatus.FAILURE)
