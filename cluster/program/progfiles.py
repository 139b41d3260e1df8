"""Which local files a ``run`` program takes to hosts that do not share this checkout.

A program is rarely one file: ``main.py`` imports ``mnist_setup.py`` beside it (TensorFlow's
own multi-worker tutorial is written so), reads a config or a vocabulary from its folder. So
``run`` copies, besides the files its command line names and every ``--sync PATH``, the
script's whole folder when that folder is the current directory or below it (a script
elsewhere takes only itself, as before). Left home: what ``.gitignore`` / ``.psclusterignore``
files exclude (:mod:`cluster.program.ignorerules`), caches (``__pycache__``, ``.git``, ``.pscluster``,
tool caches, ``*.pyc``) and virtualenvs (a folder with ``pyvenv.cfg``).

Never copied unless named one by one (on the command line, or a file given to ``--sync``):
credentials (:data:`CREDENTIAL_DIRS`, ``.config/gcloud``, :data:`CREDENTIAL_FILES`, ``*.pem``,
``id_*`` but ``id_*.py``) and pscluster's own state directory. A script's folder that is the home
folder or above it (``/home``), or holds ``.ssh``/``.gnupg``/``.aws``, is not walked at all unless
``--sync`` names it.

The total is capped (``--sync-limit``, default :data:`DEFAULT_SYNC_LIMIT_MIB` MiB, and
:data:`MAX_FILES` files): a script in a home folder would otherwise copy the home folder. Over
the cap, ``run`` stops before anything starts and names the largest things it would copy.
Files are measured (``stat``) before any is hashed, and the walk stops at the cap.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..errors import UsageError
from .ignorerules import IgnoreRules, rules_above

DEFAULT_SYNC_LIMIT_MIB = 100     # a program's code and small data; data sets belong on the hosts
MAX_FILES = 10_000               # more is a checkout or a home folder, not a program
SKIPPED_DIRS = frozenset({"__pycache__", ".git", ".hg", ".svn", ".pscluster", ".pytest_cache", ".mypy_cache",
                          ".ruff_cache", ".ipynb_checkpoints", ".tox", ".nox", "node_modules"})
SKIPPED_SUFFIXES = (".pyc", ".pyo")
# Left home at any depth of a walk (issue 42, M1): what a home folder keeps for ssh, gpg and the
# clouds. ``id_*`` are ssh key names; ``id_*.py`` is a module name, so it travels.
CREDENTIAL_DIRS = frozenset({".ssh", ".gnupg", ".aws", ".azure", ".kube", ".docker"})
CREDENTIAL_FILES = frozenset({".netrc", ".git-credentials"})
HOME_MARKERS = (".ssh", ".gnupg", ".aws")     # a folder holding one is a home folder, whatever $HOME says
MIB = 1 << 20


@dataclass(frozen=True)
class Entry:
    """One file to copy: its path relative to the current directory, and its size."""

    rel: str
    size: int


@dataclass(frozen=True)
class FileSet:
    """The program's files, and why each group travels (for messages)."""

    entries: tuple[Entry, ...]
    folder: str | None          # the script's folder that travels ("." for the current directory)

    @property
    def size(self) -> int:
        return sum(entry.size for entry in self.entries)


class _Budget:
    """Counts what the walk found and stops it, with a clear error, past the cap."""

    def __init__(self, limit_bytes: int | None, what: str):
        self.limit = limit_bytes
        self.what = what
        self.total = 0
        self.count = 0
        self.largest: list[tuple[int, str]] = []

    def add(self, rel: str, size: int) -> None:
        self.total += size
        self.count += 1
        self.largest = sorted(self.largest + [(size, rel)], reverse=True)[:5]
        if self.count > MAX_FILES:
            raise UsageError(f"{self.what} hold(s) more than {MAX_FILES:,} files; that is not a program's folder",
                             hint=_HINT)
        if self.limit is not None and self.total > self.limit:
            biggest = ", ".join(f"{rel} ({size / MIB:.1f} MiB)" for size, rel in self.largest)
            raise UsageError(f"{self.what} come(s) to more than {self.limit / MIB:.0f} MiB (the --sync-limit) to copy "
                             f"to each host that does not share this checkout; largest: {biggest}",
                             hint=_HINT + "; or raise --sync-limit MIB (0: no limit)")


_HINT = ("leave out what need not travel with a .psclusterignore beside the script (gitignore patterns, e.g. "
         "'data/' or '*.ckpt'), or run from a smaller folder")


def program_files(cwd: Path, named: Sequence[str], folder: str | None, sync: Sequence[str], *,
                  limit_mib: int = DEFAULT_SYNC_LIMIT_MIB, home: Path | None = None,
                  state_dir: Path | None = None) -> FileSet:
    """The files to copy, relative to ``cwd``: ``named`` files (the command names them: sent
    even if an ignore file lists them), the script's ``folder`` (relative to ``cwd``, "." for
    ``cwd`` itself, None for none) and each ``--sync`` path (a file, or a folder walked as the
    script's is). A walk leaves credentials and ``state_dir`` home; names are relative to the
    folder as typed, never to where a symlink leads.

    Raises:
        UsageError: past ``limit_mib`` MiB (0: no limit) or :data:`MAX_FILES` files; the script's
            folder is ``home`` or holds credentials and ``--sync`` does not name it; a ``--sync``
            folder that is a credential folder; a name that leaves ``cwd``.
    """
    what = (f"{_shown(folder)} (the script's folder)" if folder is not None else "the program's files")
    budget = _Budget(limit_mib * MIB if limit_mib else None, what)
    found: dict[str, Entry] = {}
    top = cwd.resolve()

    def add(rel: str) -> None:
        check_relative(rel)
        if rel not in found:
            size = (top / rel).stat().st_size
            found[rel] = Entry(rel, size)
            budget.add(rel, size)

    for rel in named:
        add(rel)
    synced = [os.path.normpath(root) for root in sync]
    if folder is not None and os.path.normpath(folder) not in synced:
        _refuse_home(top / folder, folder, home)
    for root in ([folder] if folder is not None else []) + list(sync):
        path = top / root
        if path.is_file():
            add(os.path.normpath(root))
            continue
        if credential_path(os.path.normpath(root)):
            raise UsageError(f"--sync {root}: a folder of credentials is never copied whole",
                             hint="name each file you mean to send (--sync FILE), one by one")
        rules = rules_above(path, top)
        for rel in _walk(top, os.path.normpath(root), rules, state_dir):
            add(rel)
    return FileSet(tuple(found.values()), folder)


def check_relative(rel: str) -> str:
    """``rel`` unless it is absolute or leads out of its folder once normalized (``a/../../x``).

    Raises:
        UsageError: naming the file.
    """
    normal = os.path.normpath(rel) if rel else ""
    if not rel or os.path.isabs(rel) or normal == ".." or normal.startswith("../") or "\0" in rel:
        raise UsageError(f"{rel!r}: a file to copy must lie below the current directory",
                         hint="names are relative to the folder as typed; a path that leaves it would be written "
                              "outside the hosts' workdir")
    return rel


def credential_path(rel: str) -> bool:
    """Whether ``rel`` (relative, "/"-separated) is or lies in a credential path a walk leaves home."""
    parts = [part for part in rel.split("/") if part not in ("", ".")]
    for index, part in enumerate(parts):
        if part in CREDENTIAL_DIRS or (part == "gcloud" and index and parts[index - 1] == ".config"):
            return True
    name = parts[-1] if parts else ""
    return (name in CREDENTIAL_FILES or name.endswith(".pem")
            or (name.startswith("id_") and not name.endswith(".py")))


def _refuse_home(path: Path, folder: str, home: Path | None) -> None:
    """Refuse the script's folder when it is ``home``, lies above it (``/home``: every user's
    home at once), or holds one of :data:`HOME_MARKERS`."""
    resolved = path.resolve()
    marker = next((m for m in HOME_MARKERS if (resolved / m).exists()), None)
    mine = home.resolve() if home is not None else None
    if marker is None and (mine is None or (resolved != mine and resolved not in mine.parents)):
        return
    why = (f"it holds {marker}" if marker else "it is your home folder" if resolved == mine
           else f"it holds your home folder {mine}")
    raise UsageError(f"{_shown(folder)} (the script's folder) is not copied to the hosts: {why}",
                     hint="move the script into a folder of its own, or name what travels with --sync "
                          f"(--sync {folder} takes the folder anyway, less credentials)")


def _walk(top: Path, root: str, rules: IgnoreRules, state_dir: Path | None = None) -> list[str]:
    """Files under ``top/root`` (relative to ``top``, through the folder as typed even where a
    symlink leads elsewhere) that no rule leaves out, in sorted order; each folder's ignore
    files are read as the walk enters it. Credential paths and ``state_dir`` are left out."""
    files = []
    skipped = {str(state_dir.resolve())} if state_dir is not None else set()
    for folder, dirs, names in os.walk(top / root):
        rules.add_folder(folder)
        kept = []
        for name in sorted(dirs):
            path = os.path.join(folder, name)
            if (name in SKIPPED_DIRS or os.path.islink(path) or os.path.isfile(os.path.join(path, "pyvenv.cfg"))
                    or credential_path(_rel(path, top)) or os.path.realpath(path) in skipped):
                continue
            if not rules.ignored(path, True):
                kept.append(name)
        dirs[:] = kept
        for name in sorted(names):
            path = os.path.join(folder, name)
            if (name.endswith(SKIPPED_SUFFIXES) or not os.path.isfile(path) or credential_path(_rel(path, top))
                    or rules.ignored(path, False)):
                continue
            files.append(_rel(path, top))
    return files


def _rel(path: str, top: Path) -> str:
    return os.path.relpath(path, top).replace(os.sep, "/")


def _shown(folder: str | None) -> str:
    return "the current directory" if folder in (".", "") else f"{folder}/"
