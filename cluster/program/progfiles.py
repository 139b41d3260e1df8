"""Which local files a ``run`` program takes to hosts that do not share this checkout.

A program is rarely one file: ``main.py`` imports ``mnist_setup.py`` beside it (TensorFlow's
own multi-worker tutorial is written so), reads a config or a vocabulary from its folder. So
``run`` copies, besides the files its command line names and every ``--sync PATH``, the
script's whole folder when that folder is the current directory or below it (a script
elsewhere takes only itself, as before). Left home: what ``.gitignore`` / ``.psclusterignore``
files exclude (:mod:`cluster.program.ignorerules`), caches (``__pycache__``, ``.git``, ``.pscluster``,
tool caches, ``*.pyc``) and virtualenvs (a folder with ``pyvenv.cfg``).

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
                  limit_mib: int = DEFAULT_SYNC_LIMIT_MIB) -> FileSet:
    """The files to copy, relative to ``cwd``: ``named`` files (the command names them: sent
    even if an ignore file lists them), the script's ``folder`` (relative to ``cwd``, "." for
    ``cwd`` itself, None for none) and each ``--sync`` path (a file, or a folder walked as the
    script's is).

    Raises:
        UsageError: past ``limit_mib`` MiB (0: no limit) or :data:`MAX_FILES` files.
    """
    what = (f"{_shown(folder)} (the script's folder)" if folder is not None else "the program's files")
    budget = _Budget(limit_mib * MIB if limit_mib else None, what)
    found: dict[str, Entry] = {}

    def add(rel: str) -> None:
        if rel not in found:
            size = (cwd / rel).stat().st_size
            found[rel] = Entry(rel, size)
            budget.add(rel, size)

    for rel in named:
        add(rel)
    for root in ([folder] if folder is not None else []) + list(sync):
        path = cwd / root
        if path.is_file():
            add(os.path.normpath(root))
            continue
        rules = rules_above(path.resolve(), cwd.resolve())
        for rel in _walk(cwd, root, rules):
            add(rel)
    return FileSet(tuple(found.values()), folder)


def _walk(cwd: Path, root: str, rules: IgnoreRules) -> list[str]:
    """Files under ``cwd/root`` (relative to ``cwd``) that no rule leaves out, in sorted order;
    each folder's ignore files are read as the walk enters it."""
    files = []
    top = (cwd / root).resolve()
    for folder, dirs, names in os.walk(top):
        rules.add_folder(folder)
        kept = []
        for name in sorted(dirs):
            path = os.path.join(folder, name)
            if name in SKIPPED_DIRS or os.path.islink(path) or os.path.isfile(os.path.join(path, "pyvenv.cfg")):
                continue
            if not rules.ignored(path, True):
                kept.append(name)
        dirs[:] = kept
        for name in sorted(names):
            path = os.path.join(folder, name)
            if name.endswith(SKIPPED_SUFFIXES) or not os.path.isfile(path) or rules.ignored(path, False):
                continue
            files.append(os.path.relpath(path, cwd.resolve()).replace(os.sep, "/"))
    return files


def _shown(folder: str | None) -> str:
    return "the current directory" if folder in (".", "") else f"{folder}/"
