"""Host names and host ranges of inventories (pure).

Host names reach shell commands, SSH arguments and the nft ruleset that runs as root, so only
host names (RFC 1123 labels, plus ``_``), IPv4 and IPv6 literals pass (issue 16 item 9). Ranges
such as ``node-[01:04]`` or ``mail[:5]`` expand as Ansible expands them (issue 29), to at most
MAX_RANGE_HOSTS names, checked before any list is built.
"""
from __future__ import annotations

import ipaddress
import re
import string

# RFC 1123 labels, plus "_" (found in lab host names and accepted by Ansible and OpenSSH).
_HOST_LABEL = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?$")
MAX_RANGE_HOSTS = 10_000     # hosts from one range pattern (n[0:999999] would be a million)
_LETTERS = string.ascii_letters          # Ansible's letter ranges run a..z then A..Z: [x:C] is x, y, z, A, B, C
_DIGITS = re.compile(r"^[0-9]+$")
# A trailing ":PORT" after a name, an IPv4 address or a bracketed IPv6 address ([::1]:2222), where
# the name may hold complete [...] ranges (Ansible's parse_address, allow_ranges=True).
_BRACKETED_PORT = re.compile(r"^\[(.+)\]:([0-9]+)$")
_NAME_PORT = re.compile(r"^((?:[^:\[\]]|\[[^\]]*\])*):([0-9]+)$")
_VALID_RANGE = re.compile(r"\[(?:[0-9]+:[0-9]+|[a-z]:[a-z])(?::[0-9]+)?\]", re.I)   # in a name:PORT


def split_host_port(pattern: str) -> tuple[str, int | None]:
    """``node-a:2200`` -> (``node-a``, 2200); ``[::1]:22`` -> (``::1``, 22); else (pattern, None).

    As Ansible reads an inventory host (YAML key or INI host word): a ``:PORT`` suffix is a port
    unless the name left over is neither a host name (ranges allowed), an IPv4 nor an IPv6 address.
    """
    host, port = pattern, None
    for regex in (_BRACKETED_PORT, _NAME_PORT):
        match = regex.match(host)
        if match:
            host, port = match.group(1), int(match.group(2))
    if port is None or check_host_name(_VALID_RANGE.sub("0", host)) is not None:
        return pattern, None
    return host, port


def expand_host_pattern(pattern: str) -> list[str]:
    """Expand Ansible host ranges as ``ansible-inventory`` does (its expand_hostname_range).

    ``node-[01:03]`` -> node-01, node-02, node-03 (a start with a leading zero pads, and then the
    end must have as many digits); ``[:5]`` starts at 0; ``[0:10:2]`` steps; ``[a:f]`` ranges
    letters (``[x:C]`` runs on through the capitals, as Ansible's does). Several ranges expand as
    a product, leftmost outermost.

    Raises:
        ValueError: a range Ansible refuses, one that expands to nothing (Ansible silently drops
            the host; pscluster refuses it), or more than MAX_RANGE_HOSTS names.
    """
    return _expand(pattern, MAX_RANGE_HOSTS, pattern)


def _expand(pattern: str, budget: int, whole: str) -> list[str]:
    if "[" not in pattern:
        return [pattern]
    head, _, rest = pattern.partition("[")
    body, closed, tail = rest.partition("]")
    if not closed or "]" in head:
        raise ValueError(f"unbalanced brackets in {whole!r}")
    values = _range_values(body, whole)
    _check_budget(len(values), budget, whole)
    names: list[str] = []
    for value in values:
        names.extend(_expand(head + value + tail, budget // len(values), whole))
    return names


def _range_values(body: str, whole: str) -> list[str]:
    bounds = body.split(":")
    if len(bounds) not in (2, 3):
        raise ValueError(f"{whole!r} is not a host name or a host range ([{body}]: a range is "
                         "begin:end or begin:end:step)")
    start, end = bounds[0] or "0", bounds[1]
    if not end:
        raise ValueError(f"host range [{body}] in {whole!r} must specify its end")
    step_text = bounds[2] if len(bounds) == 3 else "1"
    if not _DIGITS.match(step_text) or int(step_text) < 1:
        raise ValueError(f"range step must be a number of at least 1 in {whole!r}")
    step = int(step_text)
    if len(start) == 1 and len(end) == 1 and start in _LETTERS and end in _LETTERS:
        first, last = _LETTERS.index(start), _LETTERS.index(end)
        if first > last:
            raise ValueError(f"range start {start} is after its end {end} in {whole!r}")
        return list(_LETTERS[first:last + 1:step])
    if not (_DIGITS.match(start) and _DIGITS.match(end)):
        raise ValueError(f"cannot expand range [{body}] in {whole!r}: "
                         "use numbers ([01:04], [:4]) or single letters ([a:d])")
    width = len(start) if start.startswith("0") and len(start) > 1 else 0
    if width and len(end) != width:
        raise ValueError(f"range [{body}] in {whole!r} must give its start and end with as many digits "
                         f"(a leading zero pads: [{start}:{end.zfill(width)}])")
    if int(start) > int(end):
        raise ValueError(f"range start {start} is after its end {end} in {whole!r}")
    numbers = range(int(start), int(end) + 1, step)
    _check_budget(len(numbers), MAX_RANGE_HOSTS, whole)
    return [str(number).zfill(width) for number in numbers]


def _check_budget(count: int, budget: int, pattern: str) -> None:
    if count > budget:
        raise ValueError(f"{pattern!r} expands to more than {MAX_RANGE_HOSTS} hosts")


_SCOPE_ID = re.compile(r"[A-Za-z0-9_.-]{1,15}")


def check_host_name(name: str) -> str | None:
    """Why ``name`` is not a host name, IPv4 or IPv6 literal (None: it is one).

    Host names reach shell commands, SSH and the nft ruleset run as root: only these shapes
    pass, never control characters, whitespace, brackets, quotes or ``;`` (issue 16 item 9).
    """
    if not name:
        return "the host name is empty"
    try:
        ipaddress.ip_address(name)
    except ValueError:
        pass
    else:
        # Python accepts any text after "%" as an IPv6 scope id (newlines, ';', '$()'...): only
        # an interface name (at most 15 characters, Linux's IFNAMSIZ) or index passes (N6).
        scope = name.partition("%")[2]
        if scope and not _SCOPE_ID.fullmatch(scope):
            return f"{name!r} is not an IPv6 address (its scope id {scope!r} is not an interface name or number)"
        return None
    if len(name) > 253:
        return "a host name has at most 253 characters"
    bad = next((char for char in name if not (char.isascii() and (char.isalnum() or char in "-_."))), None)
    if bad is not None:
        return f"{name!r} is not a host name or IP address ({bad!r} is not allowed)"
    if not all(_HOST_LABEL.match(label) for label in name.split(".")):
        return f"{name!r} is not a host name or IP address (empty label, or '-' at a label's start or end)"
    return None
