"""What every rendering shares: the two consoles, text made safe to show (control characters
visible, markup escaped, secrets masked), JSON, warnings and errors.
"""
from __future__ import annotations

import json
import os
import re
import sys
from typing import Any, Sequence

from rich.console import Console
from rich.markup import escape as _markup_escape
from rich.text import Text

from ..errors import PsclusterError


STATE_STYLES = {"ready": "green", "running": "green", "starting": "yellow", "exited": "red", "lost": "red",
                "not answering": "red",
                "not started": "dim", "stopped": "dim", "failed": "red", "up": "green", "done": "green"}


class OutputStream:
    """``sys.stdout`` or ``sys.stderr`` (looked up at each write, as rich does) for a console,
    where an output error never reaches the caller.

    A closed terminal (SIGHUP, then EIO on every write) or a reader that went away (EPIPE)
    must not stop a clean-up halfway: the rollback prints before it stops anything. On the
    first such error the stream's file descriptor is pointed at ``/dev/null``, so later
    writes, from rich, click, a traceback or the interpreter's flush at exit, succeed too.
    """

    def __init__(self, name: str):
        self.name = name

    @property
    def stream(self):
        return getattr(sys, self.name)

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except OSError:
            self._gone()
            return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except OSError:
            self._gone()

    def _gone(self) -> None:
        try:
            fd = self.stream.fileno()
            null = os.open(os.devnull, os.O_WRONLY)
        except (OSError, ValueError, AttributeError):    # no descriptor (a test's StringIO): nothing to redirect
            return
        try:
            os.dup2(null, fd)
        finally:
            os.close(null)
        try:
            self.stream.flush()      # what the failed write left in the buffer goes to /dev/null
        except (OSError, ValueError):
            pass

    def __getattr__(self, name: str) -> Any:      # isatty, fileno, encoding...: the stream's own
        return getattr(self.stream, name)


def make_consoles(*, no_color: bool = False) -> tuple[Console, Console]:
    """(stdout console, stderr console). Output to a pipe or file is 200 columns wide rather
    than rich's 80 (the bench table needs ~180), so tables stay readable in CI logs and
    benchmark files; $COLUMNS still wins. Output errors are swallowed (:class:`OutputStream`)."""
    consoles = []
    for name in ("stdout", "stderr"):
        # emoji=False: ":fire:" in a path or host output stays text
        file: Any = OutputStream(name)
        console = Console(file=file, no_color=no_color, highlight=False, emoji=False)
        if not console.is_terminal and not os.environ.get("COLUMNS"):
            console = Console(file=file, no_color=no_color, highlight=False, emoji=False, width=200)
        consoles.append(console)
    return consoles[0], consoles[1]


# C0 controls but newline and tab, DEL and C1 controls: a remote string with ESC could recolour,
# move the cursor or retitle the operator's terminal; they are shown as \x1b instead.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _plain(value: Any) -> str:
    """``value`` as text with its control characters made visible."""
    return _CONTROL.sub(lambda match: f"\\x{ord(match.group()):02x}", str(value))


def visible(value: Any) -> str:
    """Text (remote output) for a plain stream, with its control characters but newline and tab
    made visible, so a log cannot recolour, move the cursor of or retitle the terminal."""
    return _plain(value)


def escape(value: Any) -> str:
    """Data (a name, path or remote text) for a string read as rich markup: shown as it is."""
    return _markup_escape(_plain(value))


def render_warnings(console: Console, warnings: Sequence[str]) -> None:
    """Inventory warnings (ansible_* keys pscluster ignores), in yellow."""
    for warning in warnings:
        console.print(Text("warning: " + _plain(warning), style="yellow"))


def _mask(value: str | None) -> str:
    return "(none)" if value is None else (f'"{value}"' if value == "" else value)


def _texts(*values: Any) -> list[Text]:
    """Table cells from data (names, paths, remote output): never read as markup."""
    return [value if isinstance(value, Text) else Text(_plain(value)) for value in values]


PLAIN_JSON_ABOVE = 64 * 1024     # characters: rich's JSON highlighting took 24 s for a 7 MB plan


def print_json(console: Console, document: Any) -> None:
    """``document`` as indented JSON; a big one as plain text (rich's highlighting is quadratic-ish
    in practice: a 10,000-task plan took 24 s and 1 GB through it)."""
    text = json.dumps(document, indent=2)
    if len(text) <= PLAIN_JSON_ABOVE:
        console.print_json(text)
        return
    console.file.write(text + "\n")
    console.file.flush()


def render_error(console: Console, error: PsclusterError) -> None:
    text = str(error)
    first, _, rest = text.partition("\n")
    console.print(Text("error: ", "bold red") + Text(_plain(first)))
    if rest:
        console.print(Text(_plain(rest)))


def _first_line(text: Any) -> str:
    return str(text or "").strip().split("\n", 1)[0]
