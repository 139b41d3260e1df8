"""Cluster names: the one rule for every place a name enters (``--name``, an inventory's file stem).

A cluster name becomes a file name on the control machine (``<state dir>/<name>.json`` and
``.lock``) and a folder on every host (``<workdir>/.pscluster/<name>/``, whose contents ``down``
deletes), so ``../x``, ``/abs``, ``.``, ``..``, separators, control characters or a very long name
would read, write or delete outside those folders. A name is 1-63 letters, digits, ``.``, ``_``
and ``-``, starting with a letter or digit (so never ``.`` or ``..``), and not ending in
``.resize`` or ``.resize-result``: those are the files beside a state (``<name>.resize.json``,
a resize request, and ``<name>.resize-result.json``, its answer), never clusters.
"""

from __future__ import annotations

import re

from .errors import UsageError

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
RESIZE_ENDING = ".resize"               # <state dir>/<name>.resize.json: a request to a job's supervisor
RESULT_ENDING = ".resize-result"        # <state dir>/<name>.resize-result.json: its answer
RULE = ("1-63 letters, digits, '.', '_' or '-', starting with a letter or digit, "
        f"not ending in {RESIZE_ENDING!r} or {RESULT_ENDING!r}")


def is_cluster_name(name: str) -> bool:
    return NAME_RE.fullmatch(name) is not None and not name.endswith((RESIZE_ENDING, RESULT_ENDING))


def check_cluster_name(name: str, *, source: str | None = None) -> str:
    """``name`` if it is a valid cluster name.

    Args:
        source: the inventory the name was derived from (its file stem), for the message.

    Raises:
        UsageError: not a valid name; the message names where it came from and how to pick another.
    """
    if is_cluster_name(name):
        return name
    shown = ascii(name) if len(name) <= 80 else ascii(name[:80]) + f"... ({len(name)} characters)"
    if source is not None:
        raise UsageError(f"{source}: the cluster name taken from the inventory's file name, {shown}, "
                         f"is not a valid cluster name ({RULE})",
                         hint="pass --name NAME, or rename the inventory file")
    raise UsageError(f"--name {shown} is not a valid cluster name ({RULE})",
                     hint="e.g. --name exp-1; the name becomes a state file and a folder on every host")
