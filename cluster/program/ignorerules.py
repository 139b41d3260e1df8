"""``.gitignore``-style rules: which files of a program's folder stay home (``run``).

``.gitignore`` and ``.psclusterignore`` files are read in every folder that ``run`` copies
from, and in that folder's parents up to the current directory (or, inside a git work tree,
up to its top). Their syntax is gitignore's, for the parts people use:

* one pattern per line; blank lines and lines starting with ``#`` are ignored (``\\#`` for a
  literal ``#``); trailing spaces are dropped;
* ``!pattern`` brings back what an earlier pattern left out (not inside a folder that is
  itself left out: it is never entered);
* ``pattern/`` matches folders only;
* a pattern with a ``/`` at its start or middle is relative to the ignore file's folder;
  one without matches a name at any depth below it;
* ``*`` any characters but ``/``, ``?`` one of them, ``[a-z]`` / ``[!a-z]`` a class, ``**``
  any number of folders (``**/logs``, ``data/**``, ``a/**/b``).

A deeper file's rules come after its parents' and win; in one folder ``.psclusterignore``
comes after ``.gitignore`` (so ``!big.npz`` there sends a file git ignores).

Inside a git work tree, git's other two sources count too, as git ranks them: ``core.excludesFile``
(default ``$XDG_CONFIG_HOME/git/ignore``) first, then ``.git/info/exclude`` (the common one of a
linked worktree), then the ``.gitignore`` files; their patterns are relative to the work tree's top.
"""
from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

IGNORE_FILES = (".gitignore", ".psclusterignore")
MAX_RULES_BYTES = 1 << 20        # an ignore file larger than this is not read


@dataclass(frozen=True)
class Rule:
    base: str                # absolute folder of the ignore file
    pattern: re.Pattern[str]
    negate: bool
    dir_only: bool
    source: str              # "path/.psclusterignore:3", for messages


def parse_rules(text: str, base: str, source: str) -> list[Rule]:
    """The rules of one ignore file whose folder is ``base``."""
    rules = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = _strip_trailing_spaces(raw)
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        if negate:
            line = line[1:]
        elif line.startswith(("\\#", "\\!")):
            line = line[1:]
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        if not line:
            continue
        anchored = "/" in line
        line = line.lstrip("/")
        try:
            pattern = re.compile(("" if anchored else "(?:.*/)?") + _translate(line) + r"\Z", re.DOTALL)
        except re.error:
            continue             # git skips a pattern it cannot read; so do we
        rules.append(Rule(base, pattern, negate, dir_only, f"{source}:{number}"))
    return rules


def _strip_trailing_spaces(line: str) -> str:
    stripped = line.rstrip(" ")
    if stripped.endswith("\\") and len(stripped) < len(line):
        return stripped + " "    # "\ " keeps one space
    return stripped


def _translate(pattern: str) -> str:
    """A gitignore pattern (no leading/trailing slash) as a regular expression."""
    out = []
    i, n = 0, len(pattern)
    while i < n:
        if pattern.startswith("**/", i) and (i == 0 or pattern[i - 1] == "/"):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i) and i + 2 == n and (i == 0 or pattern[i - 1] == "/"):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[":
            end = pattern.find("]", i + 2)
            if end == -1:
                out.append(re.escape("["))
                i += 1
                continue
            body = pattern[i + 1:end]
            if body.startswith("!"):
                body = "^" + body[1:]
            out.append("[" + body.replace("\\", "\\\\").replace("/", "") + "]")
            i = end + 1
        elif pattern[i] == "\\" and i + 1 < n:
            out.append(re.escape(pattern[i + 1]))
            i += 2
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return "".join(out)


class IgnoreRules:
    """Rules gathered from ignore files; ask :meth:`ignored` about absolute paths."""

    def __init__(self, rules: list[Rule] | None = None):
        self.rules: list[Rule] = list(rules or [])
        self._read: set[str] = set()

    def add_folder(self, folder: str) -> None:
        """Read ``folder``'s ignore files once (their rules go after every rule read so far)."""
        if folder in self._read:
            return
        self._read.add(folder)
        for name in IGNORE_FILES:
            self.add_file(os.path.join(folder, name), folder)

    def add_file(self, path: str, base: str) -> None:
        """Read one exclude file whose patterns are relative to ``base`` (a missing one: nothing)."""
        try:
            if os.path.isfile(path) and os.path.getsize(path) <= MAX_RULES_BYTES:
                with open(path, encoding="utf-8", errors="replace") as handle:
                    self.rules.extend(parse_rules(handle.read(), base, path))
        except OSError:
            return

    def ignored(self, path: str, is_dir: bool) -> bool:
        """Whether the last rule that matches ``path`` (absolute) leaves it out."""
        result = False
        for rule in self.rules:
            if rule.dir_only and not is_dir:
                continue
            rel = os.path.relpath(path, rule.base)
            if rel.startswith("..") or rel == ".":
                continue
            if rule.pattern.match(rel.replace(os.sep, "/")):
                result = not rule.negate
        return result


def rules_above(folder: Path, stop: Path) -> IgnoreRules:
    """The rules that apply in ``folder`` from its parents: every folder from the top (the git
    work tree's top when ``stop`` lies in one, else ``stop``) down to ``folder``, in order."""
    git_top = _git_top(stop)
    top = git_top or stop
    chain = []
    current = folder
    while True:
        chain.append(current)
        if current == top or current.parent == current:
            break
        current = current.parent
    rules = IgnoreRules()
    if git_top is not None:
        for path in _git_exclude_files(git_top):
            rules.add_file(path, str(top))
    for each in reversed(chain):
        rules.add_folder(str(each))
    return rules


def _git_top(start: Path) -> Path | None:
    for folder in (start, *start.parents):
        if (folder / ".git").exists():
            return folder
    return None


def _git_exclude_files(top: Path) -> list[str]:
    """``core.excludesFile`` and ``info/exclude`` of the work tree at ``top``, in git's order
    (lowest first). Git itself answers where it can (config levels, includes, ``~``, linked
    worktrees); without git: the XDG default and ``.git/info/exclude``."""
    default = os.path.join(os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config"), "git", "ignore")
    excludes, info = default, str(top / ".git" / "info" / "exclude")
    try:
        configured = _git(top, "config", "--path", "--get", "core.excludesFile")
        if configured is not None:
            excludes = os.path.expanduser(configured) if configured else default
        where = _git(top, "rev-parse", "--git-path", "info/exclude")
        if where:
            info = where if os.path.isabs(where) else str(top / where)
    except (OSError, subprocess.SubprocessError):
        pass                     # no git here: its defaults
    return [excludes, info]


def _git(top: Path, *args: str) -> str | None:
    """Git's answer ("" when the key is unset); None when git refuses (e.g. another user's repo)."""
    done = subprocess.run(["git", "-C", str(top), *args], capture_output=True, text=True, timeout=10)
    if done.returncode not in (0, 1):
        return None
    return done.stdout.strip()
