"""What a ``run`` (and, through :class:`JsonRequest`, a ``train``) asks for, as one frozen value.

The command line builds the value from its flags; a ``--detach`` supervisor receives
``request.to_json()`` on its stdin and rebuilds the same value with :meth:`JsonRequest.from_json`,
which refuses a missing or an unknown field by name (as TorchX's ``TorchXRunArgs`` is built from
flags or from JSON). Nothing here touches a host or reads the environment.
"""
from __future__ import annotations

import typing
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, TypeVar

from ..contracts import DEFAULT_GRACE
from ..errors import UsageError
from .progfiles import DEFAULT_SYNC_LIMIT_MIB

R = TypeVar("R", bound="JsonRequest")


class JsonRequest:
    """A frozen dataclass that travels as a JSON object: tuples as lists, nested dataclasses as
    objects, every field present and no other."""

    def to_json(self) -> dict[str, Any]:
        return typing.cast(dict[str, Any], _encode(self))

    @classmethod
    def from_json(cls: type[R], data: object) -> R:
        """The request of ``data`` (what :meth:`to_json` wrote).

        Raises:
            UsageError: ``data`` is not an object, or lacks a field, or has one the request does not know.
        """
        return typing.cast(R, _decode_dataclass(cls, data, cls.__name__))


def _encode(value: object) -> object:
    if is_dataclass(value) and not isinstance(value, type):
        return {item.name: _encode(getattr(value, item.name)) for item in fields(value)}
    if isinstance(value, (tuple, list)):
        return [_encode(item) for item in value]
    return value


def _decode_dataclass(cls: type, data: object, where: str) -> object:
    if not isinstance(data, dict):
        raise UsageError(f"{where}: a JSON object expected, not {type(data).__name__}",
                         hint="a request is what to_json() of the same pscluster version wrote")
    names = [item.name for item in fields(cls)]
    missing = [name for name in names if name not in data]
    extra = sorted(str(key) for key in data if key not in names)
    if missing or extra:
        problems = ([f"missing field(s) {', '.join(missing)}"] if missing else []) + \
                   ([f"unknown field(s) {', '.join(extra)}"] if extra else [])
        raise UsageError(f"{where}: {'; '.join(problems)}",
                         hint="a request is what to_json() of the same pscluster version wrote")
    hints = typing.get_type_hints(cls)
    return cls(**{name: _decode(hints[name], data[name], f"{where}.{name}") for name in names})


def _decode(hint: Any, value: object, where: str) -> object:
    if value is None:
        return None
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, _union_type()) else (hint,)
    for option in options:
        if isinstance(option, type) and is_dataclass(option):
            return _decode_dataclass(option, value, where)
        if typing.get_origin(option) is tuple and isinstance(value, list):
            return tuple(value)
    return value


def _union_type() -> object:
    import types
    return types.UnionType


@dataclass(frozen=True)
class RunRequest(JsonRequest):
    """``pscluster run [INVENTORY] [OPTIONS] -- PROGRAM``: one shot with ``inventory``, else on
    the cluster ``name`` that is up. ``cwd`` is where the command was typed (the program's
    files are named relative to it)."""

    program: tuple[str, ...]
    cwd: str
    keep: int                   # runs of this name whose logs are kept (history.DEFAULT_KEEP by default)
    inventory: str | None = None
    name: str | None = None
    mode: str | None = None
    port_base: int | None = None
    on: tuple[str, ...] | None = None
    sync_paths: tuple[str, ...] = ()
    sync_limit: int = DEFAULT_SYNC_LIMIT_MIB
    keras: str | None = None
    restart_policy: str = "never"
    max_restarts: int = 3
    host_timeout: float = 60.0
    grace: float = DEFAULT_GRACE
    timeout: float = 120.0
    firewall: bool = False
    limit: str | None = None
    allow_busy_gpus: bool = False
    notify_urls: tuple[str, ...] = ()
    notify_cmds: tuple[str, ...] = ()
    replace: bool = False
    until: str | None = None
    min_workers: int | None = None
    as_json: bool = False

    @property
    def one_shot(self) -> bool:
        return self.inventory is not None

    def check(self, *, detach: bool = False) -> None:
        """What the flags alone can tell is wrong, before anything is read or started.

        Raises:
            UsageError: no program, a bad placeholder, or an option of the other way in.
        """
        from .runspec import check_placeholders
        if not self.program:
            raise UsageError("no program to run: put it after --",
                             hint="pscluster run inventories/local.yaml -- python train.py --task_index={task_index}")
        check_placeholders(self.program)
        if self.inventory is None and (self.mode or self.port_base or self.firewall or self.limit):
            raise UsageError("--mode, --port-base, --firewall and --limit apply to a one-shot run (give INVENTORY)",
                             hint="a cluster that is up keeps the mode and ports of its 'up'")
        if self.inventory is not None and (detach or self.replace):
            raise UsageError("--detach and --replace apply to a run on a cluster that is up, not to a one-shot run",
                             hint=f"'pscluster up {self.inventory}', then 'pscluster run --detach -- PROGRAM ...'; "
                                  "'pscluster down' when it is done")
