"""The keys that say how a host is reached (``ansible_*`` and their aliases), SSH options and jump hosts."""
from __future__ import annotations

import shlex
from typing import Any

from ..errors import InventoryError
from .hostnames import check_host_name
from .yamlsrc import KeyPath
from .raw import _Raw, _describe, _err, _warn
from .values import Validator, _as_int, _as_str, _choice


# Keys whose file and line `plan` shows for each host (how it is reached, where code runs).
ORIGIN_KEYS = ("ansible_host", "ansible_ssh_host", "ansible_port", "ansible_ssh_port", "ansible_user",
               "ansible_ssh_user", "ansible_ssh_private_key_file", "ansible_ssh_common_args",
               "ansible_ssh_extra_args", "ansible_become", "ansible_become_user", "ansible_connection",
               "pscluster_transport", "ansible_python_interpreter", "pscluster_python", "pscluster_workdir",
               "pscluster_port_base", "ansible_ssh_timeout", "pscluster_connect_timeout", "ansible_docker_extra_args")


CONNECTION_KEYS: dict[str, Validator] = {
    "ansible_host": lambda raw, path, value: _address(raw, path, value),
    "ansible_ssh_host": lambda raw, path, value: _address(raw, path, value),
    "ansible_port": lambda raw, path, value: _as_int(raw, path, value, 1, 65535, "an SSH port"),
    "ansible_ssh_port": lambda raw, path, value: _as_int(raw, path, value, 1, 65535, "an SSH port"),
    "ansible_user": lambda raw, path, value: _as_str(raw, path, value, "a user name"),
    "ansible_ssh_user": lambda raw, path, value: _as_str(raw, path, value, "a user name"),
    "ansible_ssh_timeout": lambda raw, path, value: _as_int(raw, path, value, 1, 600, "seconds"),
    "ansible_host_key_checking": lambda raw, path, value: _ansible_bool(raw, path, value),
    "ansible_ssh_private_key_file": lambda raw, path, value: _as_str(raw, path, value, "a key file path"),
    "ansible_connection": _choice(("ssh", "local", "paramiko", "smart", "slurm", "docker", "community.docker.docker")),
    # docker connection (community.docker.docker): the docker client's own arguments (-H, --context).
    "ansible_docker_extra_args": lambda raw, path, value: _docker_args(raw, path, value),
    "ansible_python_interpreter": lambda raw, path, value: _as_str(raw, path, value, "an interpreter path"),
    "ansible_become": lambda raw, path, value: _ansible_bool(raw, path, value),
    "ansible_become_user": lambda raw, path, value: _as_str(raw, path, value, "a user name"),
    "ansible_become_method": _choice(("sudo",)),
    "ansible_group_priority": lambda raw, path, value: _as_int(raw, path, value, -1_000_000, 1_000_000, "a priority"),
    "ansible_ssh_common_args": lambda raw, path, value: _ssh_jumps(raw, path, value),
    "ansible_ssh_extra_args": lambda raw, path, value: _ssh_jumps(raw, path, value),
}


def _address(raw: _Raw, path: KeyPath, value: Any) -> str:
    text = _as_str(raw, path, value, "a host name or address")
    problem = check_host_name(text)
    if problem:
        raise _err(raw, path, problem, hint="ansible_host is a host name, IPv4 or IPv6 address")
    return text


def _docker_args(raw: _Raw, path: KeyPath, value: Any) -> tuple[str, ...]:
    text = _as_str(raw, path, value, "docker client arguments")
    try:
        return tuple(shlex.split(text))
    except ValueError as exc:
        raise _err(raw, path, f"cannot split the docker arguments: {exc}") from None


def _ansible_bool(raw: _Raw, path: KeyPath, value: Any) -> bool:
    """Ansible's booleans: true/false, yes/no, on/off, 1/0 (as YAML or as INI strings)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("yes", "true", "on", "1", "y"):
        return True
    if text in ("no", "false", "off", "0", "n"):
        return False
    raise _err(raw, path, f"expected true or false, got {_describe(value)}")


# ssh's own option letters that take an argument (its getopt string), so "-i key" is one option.
_SSH_ARG_LETTERS = frozenset("bcDeEFiIJlLmOopPQRSwWB")


def _ssh_options(raw: _Raw, path: KeyPath, value: Any) -> list[tuple[str, str, str]]:
    """Split an ssh argument string into options: (as written, lower-case name, value).

    ``-o Key=Value``, ``-oKey=Value`` and ``-o "Key Value"`` give the option's name; a flag
    (``-C``, ``-vv``) or a letter with an argument (``-i FILE``, ``-J HOPS``) gives ``-X``.
    """
    text = _as_str(raw, path, value, "ssh arguments")
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise _err(raw, path, f"cannot split the ssh arguments: {exc}") from None
    options: list[tuple[str, str, str]] = []
    index = 0
    while index < len(words):
        word = words[index]
        index += 1
        if not word.startswith("-") or len(word) < 2:
            options.append((word, word.lower(), ""))        # a stray word: reported as it is
            continue
        letters = word[1:]
        while letters:
            letter, letters = letters[0], letters[1:]
            if letter not in _SSH_ARG_LETTERS:
                options.append((f"-{letter}", f"-{letter}", ""))
                continue
            argument = letters
            if not argument and index < len(words):
                argument = words[index]
                index += 1
            letters = ""
            if letter == "o":
                name, _, setting = argument.replace("=", " ", 1).partition(" ")
                options.append((f"-o {argument}", name.strip().lower(), setting.strip()))
            else:
                options.append((f"-{letter} {argument}", f"-{letter}", argument))
    return options


def _jump_hops(name: str, setting: str) -> tuple[str, ...] | None:
    """The hops of a ProxyJump option (None if the option is something else)."""
    if name not in ("proxyjump", "-J"):
        return None
    if setting.lower() == "none":
        return ("none",)        # said outright: no hop, not even ~/.ssh/config's (the transport reads it)
    return tuple(hop.strip() for hop in setting.split(",") if hop.strip())


def _ssh_jumps(raw: _Raw, path: KeyPath, value: Any) -> tuple[str, ...]:
    """The ProxyJump hops in an ssh argument string (-J HOPS, -o ProxyJump=HOPS)."""
    hops: list[str] = []
    for _, name, setting in _ssh_options(raw, path, value):
        hops.extend(_jump_hops(name, setting) or ())
    return tuple(hops)


# ssh options that turn host-key checking off: pscluster keeps it on whatever they say.
_HOST_KEY_OFF = {"stricthostkeychecking": ("no", "off", "false"),
                 "userknownhostsfile": ("/dev/null",)}


def _warn_ssh_options(raw: _Raw, path: KeyPath, value: Any) -> None:
    """Warn about every option of ansible_ssh_*_args that pscluster does not honour (all but ProxyJump)."""
    if not isinstance(value, str):
        return                                   # the validator names the wrong type
    try:
        options = _ssh_options(raw, path, value)
    except InventoryError:
        return                                   # the validator reports it as an error
    for written, name, setting in options:
        if _jump_hops(name, setting) is not None:
            continue
        if setting.lower() in _HOST_KEY_OFF.get(name, ()):
            _warn(raw, path, f"ssh option {written!r} ignored: pscluster keeps host-key checking on",
                  "set pscluster_host_key_policy: accept-new to trust a new host's key on first use")
        else:
            _warn(raw, path, f"ssh option {written!r} ignored: pscluster honours only ProxyJump (-J) here",
                  "pscluster connects with paramiko, not the ssh command; of ~/.ssh/config it reads "
                  "HostName, User, Port, IdentityFile and ProxyJump")
