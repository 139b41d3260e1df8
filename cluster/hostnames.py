"""Host names and host ranges of inventories (pure).

Host names reach shell commands, SSH arguments and the nft ruleset that runs as root, so only
host names (RFC 1123 labels, plus ``_``), IPv4 and IPv6 literals pass (issue 16 item 9). Ranges
such as ``node-[01:04]`` expand to at most MAX_RANGE_HOSTS names, checked before any list is built.
"""
from __future__ import annotations

import ipaddress
import re

# RFC 1123 labels, plus "_" (found in lab host names and accepted by Ansible and OpenSSH).
_HOST_LABEL = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?$")
MAX_RANGE_HOSTS = 10_000     # hosts from one range pattern (n[0:999999] would be a million)
_RANGE = re.compile(r"\[([0-9a-zA-Z]+):([0-9a-zA-Z]+)(?::([0-9]+))?\]")


def expand_host_pattern(pattern: str) -> list[str]:
    """Expand Ansible host ranges: ``node-[01:03]`` -> node-01, node-02, node-03.

    Numeric ranges keep the start's zero padding; ``[a:c]`` ranges letters; ``[1:9:2]`` steps.
    Several ranges in one name expand as a product.

    Raises:
        ValueError: a range whose bounds do not make sense, or more than MAX_RANGE_HOSTS names.
    """
    return _expand(pattern, MAX_RANGE_HOSTS, pattern)


def _expand(pattern: str, budget: int, whole: str) -> list[str]:
    match = _RANGE.search(pattern)
    if not match:
        return [pattern]
    start, end, step_text = match.group(1), match.group(2), match.group(3)
    step = int(step_text) if step_text else 1
    if step < 1:
        raise ValueError(f"range step must be at least 1 in {pattern!r}")
    if start.isdigit() and end.isdigit():
        if int(start) > int(end):
            raise ValueError(f"range start {start} is after its end {end} in {pattern!r}")
        width = len(start) if start.startswith("0") and len(start) > 1 else 0
        numbers = range(int(start), int(end) + 1, step)
        _check_budget(len(numbers), budget, whole)
        values = [str(number).zfill(width) for number in numbers]
    elif len(start) == 1 and len(end) == 1 and start.isalpha() and end.isalpha():
        if start > end:
            raise ValueError(f"range start {start} is after its end {end} in {pattern!r}")
        values = [chr(code) for code in range(ord(start), ord(end) + 1, step)]
    else:
        raise ValueError(f"cannot expand range [{start}:{end}] in {pattern!r}: "
                         "use numbers ([01:04]) or single letters ([a:d])")
    _check_budget(len(values), budget, whole)
    prefix, suffix = pattern[:match.start()], pattern[match.end():]
    names: list[str] = []
    for value in values:
        names.extend(_expand(prefix + value + suffix, budget // len(values), whole))
    return names


def _check_budget(count: int, budget: int, pattern: str) -> None:
    if count > budget:
        raise ValueError(f"{pattern!r} expands to more than {MAX_RANGE_HOSTS} hosts")


def check_host_name(name: str) -> str | None:
    """Why ``name`` is not a host name, IPv4 or IPv6 literal (None: it is one).

    Host names reach shell commands, SSH and the nft ruleset run as root: only these shapes
    pass, never control characters, whitespace, brackets, quotes or ``;`` (issue 16 item 9).
    """
    if not name:
        return "the host name is empty"
    try:
        ipaddress.ip_address(name)
        return None
    except ValueError:
        pass
    if len(name) > 253:
        return "a host name has at most 253 characters"
    bad = next((char for char in name if not (char.isascii() and (char.isalnum() or char in "-_."))), None)
    if bad is not None:
        return f"{name!r} is not a host name or IP address ({bad!r} is not allowed)"
    if not all(_HOST_LABEL.match(label) for label in name.split(".")):
        return f"{name!r} is not a host name or IP address (empty label, or '-' at a label's start or end)"
    return None
