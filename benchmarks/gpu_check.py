"""GPU truth (issue 28): GPU detection, the busy-GPU check and CUDA_VISIBLE_DEVICES masks, seen
on this machine's NVIDIA GPUs, in one command of a few minutes.

    python -m benchmarks.gpu_check [--out REPORT.json]     # on a machine with NVIDIA GPUs
    python -m benchmarks.gpu_check --fake                  # anywhere: a fake nvidia-smi, no CUDA

1. **plan**: a local inventory with ``worker_gpus: auto`` is planned and checked as ``check``
   does it (auto resolved on the host, then preflight): the GPUs found (name, memory, processes),
   the masks planned, the raw nvidia-smi output pscluster parsed.
2. **busy**: a process holds ``--hold-mib`` on GPU 0 (torch, cupy or jax, whichever imports);
   preflight must call GPU 0 busy; what ``auto`` then plans; ``--allow-busy-gpus`` passes.
3. **masks**: a one-shot ``pscluster run`` of benchmarks/gpu_probe.py on two worker tasks, one
   masked to GPU 0, one to ``""``: each prints what its CUDA runtime sees; the first must see
   exactly 1 device, the second 0.
4. a JSON report (``--out``, default benchmarks/out/gpu_check-<time>.json).

Each check is passed, failed or skipped. With ``--fake`` (no GPU here) nvidia-smi is
testbed/fake_nvidia_smi.py and the tasks' "CUDA runtime" is the probe's fake: a check that
needs a real CUDA runtime is reported *skipped* when it holds (the logic ran, the GPU did not)
and failed when it does not. Exit status 1 when a check failed, else 0.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator, Mapping

from cluster.hosts import gpus as gpu_rules
from cluster.hosts.codesync import local_workdir
from cluster.contracts import StrEnum, TensorFlowNeed
from cluster.errors import PsclusterError
from cluster.events import Check, Reporter
from cluster.inventory import load_inventory
from cluster.plan import PlanOptions, plan_cluster
from cluster.hosts.preflight import resolve_auto_gpus, run_preflight
from cluster.transport import TransportPool
from testbed import fake_nvidia_smi

from .common import REPO
from .gpu_probe import MARK

PROBE = "benchmarks/gpu_probe.py"      # relative: `run` finds it in this checkout
HOST = "localhost"


class Outcome(StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class CheckRow:
    name: str
    status: Outcome
    detail: str


@dataclass
class StepResult:
    name: str
    checks: list[CheckRow] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def status(self) -> Outcome:
        return overall([check.status for check in self.checks])


@dataclass(frozen=True)
class Setup:
    """Where and how the check runs (the unit tests build their own)."""
    work: Path                        # a fresh folder: inventories, state, logs
    port_base: int
    framework: str = "auto"           # auto | torch | cupy | jax; "fake" with fake_config
    fake_config: Path | None = None   # the fake nvidia-smi's JSON (fake mode)
    python: str = sys.executable
    busy_mib: int = 1024              # pscluster_gpu_busy_mib in the inventories
    hold_mib: int = 2048              # what the holder takes on GPU 0 (above busy_mib)
    probe_extra: tuple[str, ...] = () # more probe arguments (tests: --fake-ignore-mask)
    timeout: float = 240.0            # seconds for the one-shot run

    @property
    def real(self) -> bool:
        return self.fake_config is None


# ----------------------------------------------------------------------------- pure parts

def overall(statuses: list[Outcome]) -> Outcome:
    """Failed if any failed; passed if all passed; else skipped (nothing failed, not all shown)."""
    if Outcome.FAILED in statuses:
        return Outcome.FAILED
    if statuses and all(status is Outcome.PASSED for status in statuses):
        return Outcome.PASSED
    return Outcome.SKIPPED


def plain(name: str, holds: bool, detail: str) -> CheckRow:
    """A check of pscluster's own logic: it holds against a fake nvidia-smi as against a real one."""
    return CheckRow(name, Outcome.PASSED if holds else Outcome.FAILED, detail)


def needs_cuda(name: str, holds: bool, detail: str, *, real: bool) -> CheckRow:
    """A check whose truth needs a real CUDA runtime: without one it can fail, not pass."""
    if not holds:
        return CheckRow(name, Outcome.FAILED, detail)
    if not real:
        return CheckRow(name, Outcome.SKIPPED, f"{detail} (fake runtime: the logic held; no real GPU showed it)")
    return CheckRow(name, Outcome.PASSED, detail)


def inventory_text(gpus: str, *, busy_mib: int) -> str:
    """A one-host local inventory of sync workers with ``worker_gpus: GPUS`` (YAML flow text)."""
    return (f"all:\n  vars:\n    ansible_connection: local\n    pscluster_mode: sync\n"
            f"    pscluster_gpu_busy_mib: {busy_mib}\n    pscluster_env: {{OMP_NUM_THREADS: 1}}\n"
            f"  children:\n    worker:\n      hosts:\n        {HOST}: {{worker_gpus: {gpus}}}\n")


def describe(gpus: tuple[gpu_rules.Gpu, ...]) -> list[dict[str, Any]]:
    return [{"index": gpu.index, "uuid": gpu.uuid, "name": gpu.name, "total_mib": gpu.total_mib,
             "used_mib": gpu.used_mib, "apps": [asdict(app) for app in gpu.apps]} for gpu in gpus]


def probe_lines(text: str) -> dict[str, dict[str, Any]]:
    """task -> what its probe printed, from ``run``'s output (each line prefixed by its task)."""
    found = {}
    for line in text.splitlines():
        at = line.find(MARK)
        if at < 0:
            continue
        try:
            seen = json.loads(line[at + len(MARK):])
        except ValueError:
            continue
        found[str(seen.get("task"))] = seen
    return found


def judge_tasks(seen: Mapping[str, Mapping[str, Any]], expected: Mapping[str, tuple[str, int]], *,
                real: bool) -> list[CheckRow]:
    """For each task: did its mask arrive, and does its CUDA runtime see the expected devices?"""
    rows = []
    for task, (mask, count) in expected.items():
        got = seen.get(task)
        if got is None:
            rows.append(CheckRow(f"{task} reported", Outcome.FAILED, "no GPU-PROBE line in its output"))
            continue
        rows.append(plain(f"{task} has CUDA_VISIBLE_DEVICES={mask!r}", got.get("cuda_visible_devices") == mask,
                          f"it has {got.get('cuda_visible_devices')!r}"))
        name = f"{task} sees {count} device(s)"
        if got.get("error"):
            rows.append(CheckRow(name, Outcome.FAILED, f"{got.get('framework')}: {got['error']}"))
        elif got.get("device_count") is None:
            tried = "; ".join(f"{key}: {value}" for key, value in (got.get("tried") or {}).items())
            rows.append(CheckRow(name, Outcome.SKIPPED, f"no CUDA framework in the task's interpreter ({tried})"))
        else:
            devices = ", ".join(got.get("devices") or []) or "none"
            rows.append(needs_cuda(name, got["device_count"] == count,
                                   f"{got['framework']} sees {got['device_count']}: {devices}", real=real))
    return rows


# ----------------------------------------------------------------------------- preflight, in process

@dataclass(frozen=True)
class Preflight:
    """``check`` on an inventory, as structured data (the CLI runs the same functions)."""
    masks: tuple[str | None, ...] = ()
    checks: tuple[Check, ...] = ()
    gpus: tuple[gpu_rules.Gpu, ...] = ()
    listed: tuple[str, ...] = ()         # nvidia-smi -L lines
    raw: Mapping[str, Any] | None = None
    error: str | None = None

    @property
    def gpus_check(self) -> Check | None:
        return next((check for check in self.checks if check.check == "gpus"), None)


def preflight(setup: Setup, inventory: Path, *, allow_busy: bool = False) -> Preflight:
    options = PlanOptions(local_python=setup.python, local_workdir=local_workdir(),
                          name=f"gpu-check-{os.getpid()}", port_base=setup.port_base)
    try:
        loaded = load_inventory(str(inventory))
        with TransportPool() as pool:
            plan = plan_cluster(loaded, options)
            plan = plan_cluster(resolve_auto_gpus(loaded, plan, pool), options)
            report = run_preflight(plan, pool, Reporter(), allow_busy_gpus=allow_busy,
                                   tensorflow=TensorFlowNeed.OPTIONAL)
    except PsclusterError as exc:
        return Preflight(error=str(exc))
    facts = report.facts_of(HOST)
    result = Preflight(masks=tuple(task.cuda_visible_devices for task in plan.tasks), checks=report.results,
                       listed=tuple(facts.gpus or ()) if facts else (), raw=facts.gpu_query if facts else None)
    try:
        return replace(result, gpus=gpu_rules.from_query(HOST, result.raw) or ())
    except gpu_rules.GpuQueryError as exc:
        return replace(result, error=str(exc))


def nvidia_smi(*args: str) -> str:
    """nvidia-smi's stdout (or what went wrong), for the report."""
    try:
        done = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"error: {exc}"
    return done.stdout if done.returncode == 0 else f"error: exit {done.returncode}: {done.stderr.strip()}"


def driver_version() -> str:
    lines = nvidia_smi("--query-gpu=driver_version", "--format=csv,noheader,nounits").splitlines()
    return ", ".join(sorted({line.strip() for line in lines if line.strip()}))


def snapshot() -> tuple[gpu_rules.Gpu, ...]:
    """The GPUs now, read by this process with pscluster's own queries and parser."""
    return gpu_rules.parse(HOST, nvidia_smi(*gpu_rules.QUERY_GPUS[1:]), nvidia_smi(*gpu_rules.QUERY_APPS[1:]))


# ----------------------------------------------------------------------------- steps

def step_plan(setup: Setup) -> StepResult:
    step = StepResult("plan")
    inventory = setup.work / "auto.yaml"
    inventory.write_text(inventory_text("auto", busy_mib=setup.busy_mib))
    found = preflight(setup, inventory)
    step.data = {"inventory": inventory.read_text(), "masks": list(found.masks), "gpus": describe(found.gpus),
                 "nvidia_smi_L": list(found.listed), "raw_queries": dict(found.raw or {}),
                 "preflight": [asdict(check) for check in found.checks]}
    if found.error:
        step.checks.append(CheckRow("plan and preflight", Outcome.FAILED, found.error))
        return step
    names = ", ".join(f"{gpu.index}: {gpu.name} ({gpu.total_mib} MiB)" for gpu in found.gpus)
    step.checks.append(plain("nvidia-smi -L lists GPUs", bool(found.listed), f"{len(found.listed)} listed: {names}"))
    step.checks.append(plain("--query-gpu has a row per listed GPU", len(found.gpus) == len(found.listed),
                             f"{len(found.gpus)} row(s)"))
    wanted = tuple(str(index) for index in range(len(found.listed)))
    step.checks.append(plain("auto plans one task per GPU, GPU i alone", found.masks == wanted,
                             f"masks {list(found.masks)}"))
    gpus_check = found.gpus_check
    step.checks.append(plain("preflight finds the GPUs free", gpus_check is not None and gpus_check.ok,
                             gpus_check.detail if gpus_check else "no gpus check ran"))
    return step


@contextmanager
def holding(setup: Setup) -> Iterator[dict[str, Any]]:
    """A process that holds memory on GPU 0 while the block runs ({} when no framework can),
    stopped by its recorded process group afterwards."""
    ready, log = setup.work / "holder.json", setup.work / "holder.log"
    argv = [setup.python, str(REPO / PROBE), "hold", "--framework", setup.framework, "--mib", str(setup.hold_mib),
            "--ready", str(ready)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env=dict(os.environ, CUDA_VISIBLE_DEVICES="0"))
    pgid = proc.pid                      # its own session: pgid == pid
    try:
        deadline = time.monotonic() + 120
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        if not ready.exists():
            tail, code = log.read_text(errors="replace")[-1500:].strip(), proc.poll()
            if code == 3:                   # gpu_probe: no CUDA framework imports here
                yield {"skip": tail}
            else:
                yield {"error": f"the holder exited {code}: {tail}" if code is not None else
                                f"the holder took no memory in 120 s: {tail}"}
            return
        held = json.loads(ready.read_text())
        if setup.fake_config is not None:    # the fake driver lists the holder as a real one would
            config = fake_nvidia_smi.read_config(setup.fake_config)
            config["gpus"][0]["used_mib"] = (config["gpus"][0].get("used_mib") or 0) + setup.hold_mib
            fake_nvidia_smi.write_config(setup.fake_config, config["gpus"],
                                         [*config["apps"], {"gpu": 0, "pid": held["pid"], "used_mib": setup.hold_mib}],
                                         driver=config["driver"])
        yield held
    finally:
        _stop_group(proc, pgid)
        if setup.fake_config is not None and ready.exists():
            config = fake_nvidia_smi.read_config(setup.fake_config)
            config["gpus"][0]["used_mib"] = max(0, (config["gpus"][0].get("used_mib") or 0) - setup.hold_mib)
            fake_nvidia_smi.write_config(setup.fake_config, config["gpus"],
                                         [app for app in config["apps"] if app["pid"] != proc.pid],
                                         driver=config["driver"])


def _stop_group(proc: subprocess.Popen, pgid: int) -> None:
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue


def wait_gpu0_free(setup: Setup, seconds: float = 30.0) -> bool:
    """After the holder: the driver frees its memory a moment after the process ends."""
    if not setup.real:
        return True
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if not any(gpu.index == 0 and gpu.busy(setup.busy_mib) for gpu in snapshot()):
                return True
        except gpu_rules.GpuQueryError:
            pass
        time.sleep(1.0)
    return False


def step_busy(setup: Setup) -> StepResult:
    step = StepResult("busy")
    inventory = setup.work / "auto.yaml"
    inventory.write_text(inventory_text("auto", busy_mib=setup.busy_mib))
    with holding(setup) as held:
        if "pid" not in held:
            if held.get("error"):
                step.checks.append(CheckRow("hold memory on GPU 0", Outcome.FAILED, held["error"]))
            else:
                step.checks.append(CheckRow("hold memory on GPU 0", Outcome.SKIPPED, held.get("skip") or "no holder"))
            return step
        refused = preflight(setup, inventory)
        allowed = preflight(setup, inventory, allow_busy=True)
    step.data["holder"] = held
    step.data["gpu0_free_after"] = wait_gpu0_free(setup)
    if refused.error or allowed.error:
        step.checks.append(CheckRow("plan and preflight", Outcome.FAILED, str(refused.error or allowed.error)))
        return step
    gpu0 = next((gpu for gpu in refused.gpus if gpu.index == 0), None)
    step.data.update(masks=list(refused.masks), gpus=describe(refused.gpus),
                     holder_pid_listed=bool(gpu0 and any(app.pid == held["pid"] for app in gpu0.apps)),
                     preflight=[asdict(check) for check in refused.checks])
    verdict = refused.gpus_check
    busy = verdict is not None and not verdict.ok and gpu0 is not None and gpu0.busy(setup.busy_mib)
    step.checks.append(needs_cuda("preflight calls GPU 0 busy", busy,
                                  verdict.detail if verdict else "no gpus check ran", real=setup.real))
    step.checks.append(plain("auto still plans GPU 0 (busy GPUs are refused at preflight, not skipped)",
                             "0" in refused.masks, f"masks {list(refused.masks)}"))
    shared = allowed.gpus_check
    step.checks.append(plain("--allow-busy-gpus passes preflight", shared is not None and shared.ok,
                             shared.detail if shared else "no gpus check ran"))
    return step


def step_masks(setup: Setup) -> StepResult:
    step = StepResult("masks")
    inventory = setup.work / "masks.yaml"
    inventory.write_text(inventory_text("[[0], []]", busy_mib=setup.busy_mib))
    program = ["python", PROBE, "probe", "--framework", setup.framework, *setup.probe_extra]
    argv = [setup.python, "-m", "cluster", "run", str(inventory), "--name", f"gpu-check-masks-{os.getpid()}",
            "--port-base", str(setup.port_base + 10), "--json", "--", *program]
    env = dict(os.environ, PSCLUSTER_STATE_DIR=str(setup.work / "state"), NO_COLOR="1", COLUMNS="200")
    try:
        done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=setup.timeout)
    except subprocess.TimeoutExpired as exc:
        step.checks.append(CheckRow("pscluster run", Outcome.FAILED, f"no answer in {exc.timeout:.0f} s"))
        return step
    seen = probe_lines(done.stderr)
    try:
        report = json.loads(done.stdout)
    except ValueError:
        report = None
    step.data = {"command": argv[2:], "exit_code": done.returncode, "tasks": seen, "run_report": report,
                 "stderr_tail": done.stderr[-3000:]}
    said = [line.strip() for line in done.stderr.splitlines() if line.strip().startswith(("error:", "Root cause"))]
    step.checks.append(plain("pscluster run exits 0", done.returncode == 0,
                             f"exit {done.returncode}" + (f": {said[0][:300]}" if said and done.returncode else "")))
    step.checks.extend(judge_tasks(seen, {"worker:0": ("0", 1), "worker:1": ("", 0)}, real=setup.real))
    return step


def run_check(setup: Setup) -> dict[str, Any]:
    """The three steps and the report document."""
    began = time.monotonic()
    steps: list[StepResult] = []
    for name, body in (("plan", step_plan), ("busy", step_busy), ("masks", step_masks)):
        if name != "plan" and steps and not steps[0].data.get("gpus"):
            steps.append(StepResult(name, [CheckRow(name, Outcome.SKIPPED, "no GPU was listed in step 1")]))
            continue
        start = time.monotonic()
        step = body(setup)
        step.seconds = round(time.monotonic() - start, 2)
        steps.append(step)
    return {"check": "gpu_check", "fake": not setup.real, "framework": setup.framework,
            "result": overall([step.status for step in steps]).value,
            "machine": {"hostname": platform.node(), "python": platform.python_version(), "driver": driver_version()},
            "seconds": round(time.monotonic() - began, 2),
            "steps": [{"name": step.name, "status": step.status.value, "seconds": step.seconds,
                       "checks": [{"name": c.name, "status": c.status.value, "detail": c.detail} for c in step.checks],
                       "data": step.data} for step in steps]}


@contextmanager
def fake_gpus(work: Path, count: int) -> Iterator[Path]:
    """testbed's fake nvidia-smi first on PATH (for this process and its children), ``count``
    idle GPUs in its JSON file; the environment is restored afterwards."""
    config = work / "fake-gpus.json"
    fake_nvidia_smi.write_config(config, [{"name": "Fake GPU", "total_mib": 16384, "used_mib": 3}] * count)
    fake_nvidia_smi.install(work / "bin")
    saved = {key: os.environ.get(key) for key in ("PATH", fake_nvidia_smi.CONFIG_ENV)}
    os.environ["PATH"] = f"{work / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
    os.environ[fake_nvidia_smi.CONFIG_ENV] = str(config)
    try:
        yield config
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def print_report(document: dict[str, Any]) -> None:
    marks = {"passed": "ok  ", "failed": "FAIL", "skipped": "skip"}
    print(f"GPU check{' (fake nvidia-smi, no CUDA)' if document['fake'] else ''}: {document['result']} "
          f"in {document['seconds']:.1f} s")
    for step in document["steps"]:
        print(f"\n{step['name']}: {step['status']} ({step['seconds']:.1f} s)")
        for gpu in step["data"].get("gpus", []) if step["name"] == "plan" else []:
            used = "?" if gpu["used_mib"] is None else gpu["used_mib"]
            print(f"  GPU {gpu['index']}: {gpu['name']}, {used} of {gpu['total_mib']} MiB used, "
                  f"{len(gpu['apps'])} process(es)")
        if "masks" in step["data"]:
            print(f"  masks planned: {step['data']['masks']}")
        for check in step["checks"]:
            print(f"  {marks[check['status']]} {check['name']}: {check['detail']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="the JSON report (default benchmarks/out/gpu_check-<time>.json)")
    parser.add_argument("--fake", action="store_true", help="a fake nvidia-smi and a fake CUDA runtime (no GPU here)")
    parser.add_argument("--fake-gpus", type=int, default=2, help="GPUs of the fake (default 2)")
    parser.add_argument("--framework", default="auto", choices=["auto", "torch", "cupy", "jax"],
                        help="the CUDA framework of the holder and the probe (default: the first that imports)")
    parser.add_argument("--port-base", type=int, default=39640, help="first of 20 local ports (default 39640)")
    parser.add_argument("--hold-mib", type=int, default=2048)
    args = parser.parse_args(argv)
    out = Path(args.out) if args.out else REPO / "benchmarks" / "out" / time.strftime("gpu_check-%Y%m%d-%H%M%S.json")
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        work = Path(tmp)
        setup = Setup(work=work, port_base=args.port_base, framework=args.framework, hold_mib=args.hold_mib)
        if args.fake:
            with fake_gpus(work, args.fake_gpus) as config:
                document = run_check(replace(setup, framework="fake", fake_config=config,
                                             probe_extra=("--fake-gpus", str(args.fake_gpus))))
        else:
            document = run_check(setup)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=2) + "\n")
    print_report(document)
    print(f"\nwrote {out}")
    return 1 if document["result"] == Outcome.FAILED.value else 0


if __name__ == "__main__":
    sys.exit(main())
