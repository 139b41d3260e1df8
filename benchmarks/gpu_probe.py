"""What a CUDA runtime shows a process, for ``benchmarks/gpu_check.py``. Stdlib plus whichever CUDA
framework imports (torch, cupy, jax: a GPU box may have no TensorFlow).

``probe``: one line ``GPU-PROBE {json}`` with the task (from pscluster's PSCLUSTER_TASK), its
CUDA_VISIBLE_DEVICES as the process has it, the framework used, the device count and names
the runtime reports, and what was tried. Run by ``pscluster run`` on each task.

``hold``: take ``--mib`` MiB on device 0 (the caller sets CUDA_VISIBLE_DEVICES), write a ready
file (JSON: pid, framework, device) and sleep until stopped: the "someone else's job" that
preflight must call busy.

``--framework fake`` needs no GPU: it counts the devices of ``--fake-gpus N`` that
CUDA_VISIBLE_DEVICES leaves visible, as the CUDA runtime does (the check's unit tests; with
``--fake-ignore-mask`` it sees all N, a runtime that ignores the mask).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from typing import Any, Callable

FRAMEWORKS = ("torch", "cupy", "jax")
MARK = "GPU-PROBE "


class NotCuda(Exception):
    """The framework imports but has no CUDA support here (a CPU build): try the next one."""


def visible(mask: str | None, physical: int) -> int:
    """How many of ``physical`` devices CUDA shows under CUDA_VISIBLE_DEVICES=mask: unset shows
    all; otherwise the listed indices up to the first one that is not a device."""
    if mask is None:
        return physical
    count = 0
    for item in mask.split(","):
        item = item.strip()
        if not item.isdigit() or int(item) >= physical:
            break
        count += 1
    return count


def _torch() -> tuple[int, list[str], Any]:
    import torch
    if torch.version.cuda is None:
        raise NotCuda(f"torch {torch.__version__} is a CPU build")
    count = torch.cuda.device_count()
    return count, [torch.cuda.get_device_name(i) for i in range(count)], torch


def _cupy() -> tuple[int, list[str], Any]:
    import cupy
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        if "NoDevice" not in str(exc):        # cudaErrorNoDevice: nothing visible, a count of 0
            raise
        count = 0
    names = [cupy.cuda.runtime.getDeviceProperties(i)["name"].decode() for i in range(count)]
    return count, names, cupy


def _jax() -> tuple[int, list[str], Any]:
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")   # else JAX takes 75 % of the GPU
    plugins = ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_plugins.xla_cuda12", "jax_plugins.xla_cuda13")
    if not any(_spec(name) for name in plugins):
        raise NotCuda("jax without a CUDA plugin")
    import jax
    try:
        devices = jax.devices("gpu")
    except RuntimeError:                      # no GPU backend: nothing visible
        devices = []
    return len(devices), [device.device_kind for device in devices], jax


def _spec(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


LOADERS: dict[str, Callable[[], tuple[int, list[str], Any]]] = {"torch": _torch, "cupy": _cupy, "jax": _jax}


def observe(framework: str, *, fake_gpus: int = 0, fake_ignore_mask: bool = False) -> dict[str, Any]:
    """What the CUDA runtime of ``framework`` (or the first of torch, cupy, jax that works, for
    ``auto``) shows this process."""
    mask = os.environ.get("CUDA_VISIBLE_DEVICES")
    seen: dict[str, Any] = {"task": os.environ.get("PSCLUSTER_TASK"), "pid": os.getpid(),
                            "cuda_visible_devices": mask, "framework": None, "device_count": None,
                            "devices": [], "tried": {}, "error": None}
    if framework == "fake":
        count = fake_gpus if fake_ignore_mask else visible(mask, fake_gpus)
        seen.update(framework="fake", device_count=count, devices=["Fake GPU"] * count)
        return seen
    for name in FRAMEWORKS if framework == "auto" else (framework,):
        if not _spec(name):
            seen["tried"][name] = "not installed"
            continue
        try:
            count, names, module = LOADERS[name]()
        except NotCuda as exc:
            seen["tried"][name] = str(exc)
            continue
        except Exception as exc:              # a CUDA error is the finding: report it, do not hide it
            seen.update(framework=name, error=f"{type(exc).__name__}: {exc}")
            return seen
        seen["tried"][name] = f"{name} {getattr(module, '__version__', '?')}"
        seen.update(framework=name, device_count=count, devices=names)
        return seen
    return seen


def hold(framework: str, mib: int) -> dict[str, Any]:
    """Allocate ``mib`` MiB on device 0 and keep it (the returned dict says how)."""
    size = mib * 2 ** 20
    for name in FRAMEWORKS if framework == "auto" else (framework,):
        if name == "fake":
            return {"framework": "fake", "device": "Fake GPU", "keep": None}
        if not _spec(name):
            continue
        try:
            count, names, module = LOADERS[name]()
        except NotCuda:
            continue
        if count < 1:
            raise RuntimeError(f"{name} sees no CUDA device (CUDA_VISIBLE_DEVICES="
                               f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r})")
        if name == "torch":
            keep = module.empty(size, dtype=module.uint8, device="cuda:0")
            module.cuda.synchronize()
        elif name == "cupy":
            keep = module.zeros(size, dtype=module.uint8)
            module.cuda.runtime.deviceSynchronize()
        else:
            import jax.numpy as jnp
            keep = module.device_put(jnp.zeros(size, dtype=jnp.uint8), module.devices("gpu")[0])
            keep.block_until_ready()
        return {"framework": name, "device": names[0], "keep": keep}
    raise LookupError("no CUDA framework imports here (tried torch, cupy, jax)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/gpu_probe.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["probe", "hold"])
    parser.add_argument("--framework", default="auto", choices=["auto", *FRAMEWORKS, "fake"])
    parser.add_argument("--fake-gpus", type=int, default=0)
    parser.add_argument("--fake-ignore-mask", action="store_true")
    parser.add_argument("--mib", type=int, default=2048, help="hold: MiB to take on device 0")
    parser.add_argument("--ready", help="hold: the file to write once the memory is taken")
    args = parser.parse_args(argv)
    if args.action == "probe":
        print(MARK + json.dumps(observe(args.framework, fake_gpus=args.fake_gpus,
                                        fake_ignore_mask=args.fake_ignore_mask)), flush=True)
        return 0
    try:
        held = hold(args.framework, args.mib)
    except LookupError as exc:
        print(f"gpu_probe hold: {exc}", file=sys.stderr, flush=True)
        return 3                              # the check reports this step as skipped
    ready = {"pid": os.getpid(), "framework": held["framework"], "device": held["device"], "mib": args.mib}
    if args.ready:
        partial = args.ready + ".tmp"
        with open(partial, "w") as handle:
            json.dump(ready, handle)
        os.replace(partial, args.ready)
    while True:                               # until the check stops this process group
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
