"""Validators of inventory values (integers as Ansible reads them, GPU masks, environments, lists,
choices) and the ``pscluster_*`` keys they check."""
from __future__ import annotations

import re
from typing import Any, Callable, cast

from ..contracts import MODE_NAMES, canonical_mode
from .yamlsrc import KeyPath
from .model import HOST_KEY_POLICIES, KERAS_CHOICES, PLANNED_PSCLUSTER_ENV, RESERVED_ENV
from .raw import _Raw, _describe, _err


_CONTROL_CHAR = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")     # C0 but tab, DEL, C1


# \Z, not $: "$" also matches before a final newline, which let "TF_CONFIG\n" through (N12).
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


# Spaces and tabs only: \s also takes \x1c-\x1f, which int() refuses ("2222\x1d" was a ValueError
# traceback), and $ a final newline.
_INT_TEXT = re.compile(r"[ \t]*[+-]?[0-9]+[ \t]*\Z")


def _as_int(raw: _Raw, path: KeyPath, value: Any, low: int, high: int, what: str) -> int:
    """An integer, or a string of one: Ansible converts ``ansible_port: "2222"`` (or INI's
    ``ansible_port='2222'``) to 2222, so pscluster does too, for every integer setting."""
    if isinstance(value, str) and _INT_TEXT.match(value) and len(value) < 100:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _err(raw, path, f"expected {what}, got {_describe(value)}",
                   hint=f"write a whole number, e.g. {max(low, min(high, 22 if 'port' in what else 1))}")
    if not low <= value <= high:
        raise _err(raw, path, f"expected {what} between {low} and {high}, got {value}")
    return value


def _as_str(raw: _Raw, path: KeyPath, value: Any, what: str = "a string") -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise _err(raw, path, f"expected {what}, got {_describe(value)}")
    text = str(value)
    if not text.strip():
        raise _err(raw, path, f"expected {what}, got an empty value")
    bad = _CONTROL_CHAR.search(text)
    if bad:     # (issue 25: they reached argv, paths and the output; nothing needs them)
        raise _err(raw, path, f"expected {what}, got a control character ({bad.group()!r})")
    return text


def _gpu_mask(raw: _Raw, path: KeyPath, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, list)):
        raise _err(raw, path, f"expected a GPU index or a list of them, got {_describe(value)}",
                   hint="write 0, [0, 1], or [] for a CPU-only task")
    items = value if isinstance(value, list) else [value]
    for index, item in enumerate(items):
        item_path = path + (index,) if isinstance(value, list) else path
        if isinstance(item, bool) or not isinstance(item, int) or item < 0:
            raise _err(raw, item_path, f"expected a GPU index (0, 1, ...), got {_describe(item)}",
                       hint="GPU indices are the numbers 'nvidia-smi -L' prints")
    repeated = sorted({item for item in items if items.count(item) > 1})
    if repeated:
        raise _err(raw, path, f"GPU {', '.join(map(str, repeated))} listed twice in one mask")
    return ",".join(str(item) for item in items)


Validator = Callable[[_Raw, KeyPath, Any], Any]


def _env_map(raw: _Raw, path: KeyPath, value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict):
        raise _err(raw, path, f"expected a mapping NAME: value, got {_describe(value)}",
                   hint="e.g. pscluster_env: {OMP_NUM_THREADS: 2}")
    result = []
    for name, item in value.items():
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise _err(raw, path + (name,), f"{name!r} is not a valid environment variable name")
        if name in RESERVED_ENV or name in PLANNED_PSCLUSTER_ENV:
            raise _err(raw, path + (name,), f"{name} is set by pscluster for each task",
                       hint="use <role>_gpus for CUDA_VISIBLE_DEVICES, pscluster_intra_op_threads/"
                            "pscluster_inter_op_threads for the thread counts; TF_CONFIG and PSCLUSTER_TASK, "
                            "_CLUSTER... come from the plan")
        if item is None or isinstance(item, (dict, list)):
            raise _err(raw, path + (name,), f"expected a string or number, got {_describe(item)}")
        text = str(item).lower() if isinstance(item, bool) else str(item)
        if "\0" in text:      # the process could not start (Popen's ValueError): refuse it here, by name
            raise _err(raw, path + (name,), f"the value of {name} holds a NUL character",
                       hint="an environment value cannot hold \\0")
        result.append((name, text))
    return tuple(result)


def _name_list(raw: _Raw, path: KeyPath, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise _err(raw, path, f"expected a list of environment variable names, got {_describe(value)}",
                   hint="e.g. pscluster_secret_env: [WANDB_API_KEY]; values go in pscluster_env "
                        "or in this machine's environment")
    for index, item in enumerate(value):
        if not _ENV_NAME.match(item):
            raise _err(raw, path + (index,), f"{item!r} is not a valid environment variable name")
        if item in RESERVED_ENV or item.startswith("PSCLUSTER_"):
            raise _err(raw, path + (index,), f"{item} is set by pscluster for each task and cannot be a secret",
                       hint="TF_CONFIG, CUDA_VISIBLE_DEVICES and PSCLUSTER_* come from the plan")
    return tuple(value)


def _role_list(raw: _Raw, path: KeyPath, value: Any) -> tuple[str, ...]:
    standing = ("ps", "worker")
    if not isinstance(value, list) or not all(item in standing for item in value):
        raise _err(raw, path, f"expected a list of standing server roles, got {_describe(value)}",
                   hint="e.g. pscluster_secret_env_roles: [ps, worker] also gives the secrets to the servers "
                        "that up starts (whose environment anyone reaching their port can read)")
    return tuple(dict.fromkeys(value))


def _url_list(raw: _Raw, path: KeyPath, value: Any) -> tuple[str, ...]:
    """pscluster_notify: one http(s) URL or a list of them (shown masked in every message)."""
    from ..urls import url_problem
    items = value if isinstance(value, list) else [value]
    if not items or not all(isinstance(item, str) for item in items):
        raise _err(raw, path, f"expected a URL or a list of URLs, got {_describe(value)}",
                   hint="e.g. pscluster_notify: https://hooks.example.com/T/B/KEY")
    for index, item in enumerate(items):
        problem = url_problem(item)
        if problem:
            raise _err(raw, path + (index,) if isinstance(value, list) else path, problem,
                       hint="notifications are POSTed to http:// or https:// URLs; for mail or a chat CLI use "
                            "train --notify-cmd")
    return tuple(dict.fromkeys(items))


def _choice(options: tuple[str, ...]) -> Validator:
    def check(raw: _Raw, path: KeyPath, value: Any) -> str:
        if value not in options:
            raise _err(raw, path, f"expected one of {', '.join(options)}, got {_describe(value)}")
        return cast(str, value)     # a YAML value equal to one of the options
    return check


def _boolean(raw: _Raw, path: KeyPath, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _err(raw, path, f"expected true or false, got {_describe(value)}")
    return value


PSCLUSTER_KEYS: dict[str, Validator] = {
    "pscluster_python": lambda raw, path, value: _as_str(raw, path, value, "an interpreter path"),
    "pscluster_workdir": lambda raw, path, value: _as_str(raw, path, value, "a directory path"),
    "pscluster_port_base": lambda raw, path, value: _as_int(raw, path, value, 1024, 65000, "a port number"),
    "pscluster_host_key_policy": _choice(HOST_KEY_POLICIES),
    # How pscluster reaches the host (issue 13's name); the same as ansible_connection's ssh/local/slurm.
    "pscluster_transport": _choice(("ssh", "local", "slurm", "docker")),
    "pscluster_known_hosts": lambda raw, path, value: _as_str(raw, path, value, "a known_hosts path"),
    "pscluster_env": _env_map,
    "pscluster_secret_env": _name_list,
    "pscluster_secret_env_roles": _role_list,
    "pscluster_mode": lambda raw, path, value: canonical_mode(_choice(MODE_NAMES)(raw, path, value)),
    "pscluster_firewall": _boolean,
    "pscluster_intra_op_threads": lambda raw, path, value: _as_int(raw, path, value, 0, 1024, "a thread count"),
    "pscluster_inter_op_threads": lambda raw, path, value: _as_int(raw, path, value, 0, 1024, "a thread count"),
    "pscluster_connect_timeout": lambda raw, path, value: _as_int(raw, path, value, 1, 600, "seconds"),
    "pscluster_gpu_busy_mib": lambda raw, path, value: _as_int(raw, path, value, 0, 10_000_000, "MiB"),
    "pscluster_standby": _boolean,
    "pscluster_sync_relay": _boolean,
    # async: the last N ps tasks hold no variable until a drain moves a ps's variables onto one
    # (roles/psmove.py: TensorFlow moves a ps in place only to a ps the chief had from its start).
    "pscluster_idle_ps": lambda raw, path, value: _as_int(raw, path, value, 0, 1000, "a ps task count"),
    "pscluster_notify": _url_list,
    "pscluster_keras": _choice(KERAS_CHOICES),
}
