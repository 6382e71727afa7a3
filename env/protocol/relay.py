"""The tool's status lines, and passing them on from a child: `[verl-e2e] status: ...` is written by a level's
display (sessions/run/progress.py) and read back here, by the commands that run a level somewhere else and pass its
output on (`plan --run`, `bisect`, `remote`, `slurm` attached): the child, whose stdout is a pipe, prints plain
status lines; on a terminal the relay redraws them in place as one line, elsewhere it passes everything through
untouched."""

from __future__ import annotations

import atexit
import os
import sys
import time
from typing import Any, BinaryIO, TextIO

from env.settings import TOOL_PREFIX

STATUS_PREFIX = f"{TOOL_PREFIX} status: "
ENDED_MARK = " · ended: "  # the last status line of a run (a relay stops redrawing there)
REFRESH_PER_SECOND = 4


def is_terminal(stream: Any) -> bool:
    """A terminal that can redraw a line: a tty whose TERM is not `dumb`."""
    try:
        return os.isatty(stream.fileno()) and os.environ.get("TERM", "") != "dumb"
    except (AttributeError, OSError, ValueError):
        return False


def duration(seconds: float) -> str:
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class TerminalLine:
    """One line redrawn in place under the normal output, with rich's Live (its own refresh thread, so elapsed
    and idle times move between log lines); `print` goes above it."""

    def __init__(self, stream: TextIO, renderable: Any):
        from rich.console import Console
        from rich.live import Live

        self.console = Console(file=stream, force_terminal=True, force_interactive=True, highlight=False,
                               soft_wrap=False)
        self.live = Live(renderable, console=self.console, auto_refresh=True,
                         refresh_per_second=REFRESH_PER_SECOND, transient=False, redirect_stdout=True,
                         redirect_stderr=True)
        self.live.start()
        atexit.register(self.stop)  # a child that died before its last status line: the cursor comes back

    def print(self, text: str) -> None:
        from rich.text import Text

        self.console.print(Text.from_ansi(text), soft_wrap=True)

    def refresh(self) -> None:
        self.live.refresh()

    def stop(self) -> None:
        self.live.stop()  # idempotent
        atexit.unregister(self.stop)


class Relay:
    """A binary stream for another process's output: on a terminal, its plain status lines become one line
    redrawn in place (marked with how long ago the child last printed); elsewhere bytes pass through as they are."""

    def __init__(self, out: TextIO | None = None):
        self.out = out or sys.stdout
        self.binary: BinaryIO = getattr(self.out, "buffer", self.out)
        self.terminal = is_terminal(self.out)
        self.pending = b""
        self.status_text: str | None = None
        self.last_line = time.monotonic()
        self.line_view: TerminalLine | None = None

    # -- file-like (remote's stream, slurm's read loop) -------------------------------------------------------
    def write(self, data: bytes) -> int:
        if not self.terminal:
            self.binary.write(data)
            return len(data)
        lines = (self.pending + data).split(b"\n")
        self.pending = lines.pop()
        for line in lines:
            self.line(line.decode("utf-8", "replace"))
        return len(data)

    def flush(self) -> None:
        if not self.terminal:
            try:
                self.binary.flush()
            except (BrokenPipeError, ValueError):
                pass

    # -- line by line (plan's echo) -----------------------------------------------------------------------------
    def line(self, text: str) -> None:
        self.last_line = time.monotonic()
        if not self.terminal:
            print(text, file=self.out, flush=True)
            return
        if text.startswith(STATUS_PREFIX):
            self.status_text = text[len(STATUS_PREFIX):]
            if self.line_view is None:
                self.line_view = TerminalLine(self.out, self)
            if ENDED_MARK in text:
                self._stop()
            return
        if self.line_view is not None:
            self.line_view.print(text)
        else:
            print(text, file=self.out, flush=True)

    def __rich__(self) -> Any:
        from rich.text import Text

        ago = duration(time.monotonic() - self.last_line)
        return Text(f"{self.status_text} · updated {ago} ago", no_wrap=True, overflow="ellipsis")

    def _stop(self) -> None:
        if self.line_view is not None:
            self.line_view.refresh()
            self.line_view.stop()
            self.line_view = None

    def close(self) -> None:
        if self.pending:
            self.line(self.pending.decode("utf-8", "replace"))
            self.pending = b""
        self._stop()
