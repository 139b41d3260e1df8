"""A stand-in ``nvidia-smi`` for machines without an NVIDIA GPU (this one, CI): the GPUs and the
processes using them come from a JSON file that a test (or ``benchmarks/gpu_check.py --fake``)
writes and rewrites, named by ``$PSCLUSTER_FAKE_GPUS``::

    {"driver": "580.95.05",
     "gpus": [{"name": "Fake GPU", "total_mib": 16384, "used_mib": 3}, ...],
     "apps": [{"gpu": 0, "pid": 4242, "used_mib": 2048}, ...]}

It answers what pscluster and the GPU check ask, in the real tool's formats: ``-L``, and
``--query-gpu=FIELDS`` / ``--query-compute-apps=FIELDS`` with ``--format=csv,noheader,nounits``
(FIELDS in the order asked, so a change of query in cluster/hosts/gpus.py needs no change here). A
value of ``null`` in the file is printed as the driver prints a value it does not report:
``[N/A]``. Anything else exits 2, as the real one does on a bad option.

:func:`install` puts an ``nvidia-smi`` that runs this file first on a PATH of your choosing.
"""
from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

CONFIG_ENV = "PSCLUSTER_FAKE_GPUS"


def uuid(index: int) -> str:
    return f"GPU-fa4e0000-0000-4000-8000-{index:012d}"


def write_config(path: Path, gpus: list[dict[str, Any]], apps: list[dict[str, Any]] | None = None, *,
                 driver: str = "580.95.05") -> None:
    """(Re)write the fake's state atomically: it may be read while a preflight runs."""
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(json.dumps({"driver": driver, "gpus": gpus, "apps": apps or []}))
    os.replace(partial, path)


def read_config(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def install(bin_dir: Path, python: str = sys.executable) -> Path:
    """An executable ``bin_dir/nvidia-smi`` that runs this fake (put ``bin_dir`` first on PATH)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    target = bin_dir / "nvidia-smi"
    target.write_text(f"#!/bin/sh\nexec {shlex.quote(python)} {shlex.quote(str(Path(__file__).resolve()))} \"$@\"\n")
    target.chmod(0o755)
    return target


def _value(value: Any) -> str:
    return "[N/A]" if value is None else str(value)


def _gpu_field(index: int, gpu: dict[str, Any], field: str, driver: str) -> str:
    values = {"index": index, "uuid": uuid(index), "gpu_uuid": uuid(index), "name": gpu.get("name", "Fake GPU"),
              "memory.total": gpu.get("total_mib", 16384), "memory.used": gpu.get("used_mib", 0),
              "driver_version": driver}
    if field not in values:
        raise KeyError(field)
    return _value(values[field])


def _app_field(app: dict[str, Any], field: str) -> str:
    values = {"gpu_uuid": uuid(int(app["gpu"])), "pid": app["pid"], "used_memory": app.get("used_mib")}
    if field not in values:
        raise KeyError(field)
    return _value(values[field])


def answer(args: list[str], config: dict[str, Any]) -> tuple[int, str]:
    """(exit status, stdout) of ``nvidia-smi ARGS`` on the fake's GPUs."""
    gpus, apps, driver = config.get("gpus", []), config.get("apps", []), config.get("driver", "580.95.05")
    if args == ["-L"]:
        if not gpus:
            return 6, "No devices were found\n"
        return 0, "".join(f"GPU {i}: {gpu.get('name', 'Fake GPU')} (UUID: {uuid(i)})\n" for i, gpu in enumerate(gpus))
    queries = [arg for arg in args if arg.startswith(("--query-gpu=", "--query-compute-apps="))]
    if len(queries) != 1 or "--format=csv,noheader,nounits" not in args or len(args) != 2:
        return 2, f"fake nvidia-smi: unexpected arguments {args}\n"
    kind, _, fields_text = queries[0].partition("=")
    fields = fields_text.split(",")
    try:
        if kind == "--query-gpu":
            rows = [[_gpu_field(i, gpu, field, driver) for field in fields] for i, gpu in enumerate(gpus)]
        else:
            rows = [[_app_field(app, field) for field in fields] for app in apps]
    except KeyError as exc:
        return 2, f"fake nvidia-smi: field {exc} is not known here\n"
    return 0, "".join(", ".join(row) + "\n" for row in rows)


def main() -> int:
    path = os.environ.get(CONFIG_ENV)
    if not path:
        sys.stderr.write(f"fake nvidia-smi: set {CONFIG_ENV} to its JSON file\n")
        return 9
    status, text = answer(sys.argv[1:], read_config(Path(path)))
    (sys.stdout if status == 0 else sys.stderr).write(text)
    return status


if __name__ == "__main__":
    sys.exit(main())
