"""What the terminal shows while a run goes on: one status line, not the wrapper's thousands of lines.

The launcher (sessions/run/launch.py) writes every byte to the run's log first and then hands it to a display here:
- `StatusDisplay`: feeds each line to the verdict engine's `LiveJudge` (the same needles and phase markers that
  judge the log afterwards; nothing here parses verl's output) and shows phase, step N/M, elapsed, a rough time
  left once steps tick, time since the last log line and the run directory. On a terminal that is one line
  redrawn in place (rich's `Live`: it keeps the line to the terminal's width and owns the cursor codes); anywhere
  else (CI, nohup, Slurm files) a plain `[verl-e2e] status: ...` line on each phase change and step, never `\\r`.
- `EchoDisplay`: `--verbose` / VERL_E2E_VERBOSE=1, the whole log as it arrives (the old behaviour).
(A child's status lines passed on by `plan --run`, `bisect`, `remote` and attached `slurm`: env/protocol/relay.py.)
After the run, `outcome` gives what a user needs: on Fail/Blocked the first error, its hint and the log's last
lines, then the summary's Result line and where the report is.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from env.protocol.relay import ENDED_MARK, STATUS_PREFIX, TerminalLine, duration, is_terminal
from env.settings import TOOL_PREFIX

VERBOSE_ENV = "VERL_E2E_VERBOSE"
TOOL_NOTE = TOOL_PREFIX.encode()
TAIL_LINES = 20
BAR_WIDTH = 20
BAR_MIN_WIDTH = 100  # narrower terminals: no bar, the numbers matter more
QUIET_NOTE_S = 300.0  # plain output: a status line after this long without log output (still alive, or hung)
TRUE_WORDS = ("1", "true", "yes", "on")


def verbose_requested(environ: Any = None) -> bool:
    """--verbose (the level task sets the variable for itself and its children) or VERL_E2E_VERBOSE=1."""
    environ = os.environ if environ is None else environ
    return str(environ.get(VERBOSE_ENV, "")).strip().lower() in TRUE_WORDS


# ---------------------------------------------------------------------------------------------------------------
# The status of one run


def _phase_rank(phase: str) -> int:
    """A phase's place in a healthy run (verdict.PHASES); phases outside that list rank as the first. Training and
    checkpoint alternate every save step: one rank."""
    from sessions.judge.record import PHASE_INDEX  # noqa: PLC0415 - the judge's table, loaded with the display

    return PHASE_INDEX.get("training" if phase == "checkpoint" else phase, -1)


@dataclass
class Status:
    label: str  # "verl", "verl run A", "Bridge-side checks"
    run_dir: Path
    started: float
    steps_fallback: int | None = None  # the run's TOTAL_TRAIN_STEPS, until the log says how many steps it trains
    phase: str = "launch"
    step: int = 0
    steps_expected: int | None = None
    last_output: float = 0.0
    phase_since: float = 0.0  # when the current phase began (the first step's time is measured from it)
    step_times: list[tuple[int, float]] = field(default_factory=list)  # (step, when) of each new highest step
    ended: str | None = None  # "exit 0", "interrupted", "timeout"

    def __post_init__(self) -> None:
        self.last_output = self.phase_since = self.started

    @property
    def total(self) -> int | None:
        return self.steps_expected or self.steps_fallback

    def update(self, phase: str, step: int, steps_expected: int | None, now: float) -> bool:
        """Take the engine's view; True when the phase or the step changed (a plain line is due)."""
        changed = False
        if step > self.step:
            self.step_times.append((step, now))  # step ticks only: engine start-up is not a step's time
            self.step, changed = step, True
        if phase != self.phase and _phase_rank(phase) >= _phase_rank(self.phase):
            # the engine's phase can step back (a model-build line after model-built): the display never does
            self.phase, self.phase_since, changed = phase, now, True
        self.steps_expected = steps_expected or self.steps_expected
        return changed

    def seconds_left(self, now: float) -> float | None:
        """Rough time left: the mean time between step ticks times the steps to go (None before two steps ticked:
        the first step's time holds the engines' start-up, not a step's)."""
        total = self.total
        if not total or self.step >= total or len(self.step_times) < 2:
            return None
        (first_step, first_t), (last_step, last_t) = self.step_times[0], self.step_times[-1]
        per_step = (last_t - first_t) / max(1, last_step - first_step)
        return max(0.0, per_step * (total - self.step) - (now - last_t))

    def fields(self, now: float, *, idle: bool) -> list[str]:
        parts = [self.label, self.phase]
        total = self.total
        if total or self.step:
            parts.append(f"step {self.step}/{total if total else '?'}")
        parts.append(f"{duration(now - self.started)} elapsed")
        left = self.seconds_left(now)
        if left is not None:
            parts.append(f"~{duration(left)} left")
        if idle:
            parts.append(f"last output {duration(now - self.last_output)} ago")
        parts.append(str(self.run_dir))
        if self.ended:
            parts[-1] += f"{ENDED_MARK}{self.ended}"
        return parts

    def plain(self, now: float, *, idle: bool = False) -> str:
        return STATUS_PREFIX + " · ".join(self.fields(now, idle=idle))


# ---------------------------------------------------------------------------------------------------------------
# Terminal rendering (rich)


class _StatusRenderable:
    """Rendered by rich at each refresh from the live Status: phase, a step bar, the rest on one line."""

    def __init__(self, status: Status):
        self.status = status

    def __rich_console__(self, console: Any, options: Any) -> Any:
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        st, now = self.status, time.monotonic()
        label, phase, *rest = st.fields(now, idle=st.ended is None)
        grid = Table.grid(padding=(0, 1))
        head = Text.assemble((label, "bold"), " ", (phase, "cyan" if st.ended is None else "bold"))
        grid.add_column(no_wrap=True, min_width=head.cell_len)  # where and what: never squeezed
        row: list[Any] = [head]
        if st.total and options.max_width >= BAR_MIN_WIDTH:
            grid.add_column(width=BAR_WIDTH, no_wrap=True)
            row.append(ProgressBar(total=st.total, completed=min(st.step, st.total), width=BAR_WIDTH))
        grid.add_column()  # shrinkable (no_wrap columns are not): a narrow terminal cuts the run dir first
        grid.add_row(*row, Text(" · ".join(rest), no_wrap=True, overflow="ellipsis"))
        yield grid


# ---------------------------------------------------------------------------------------------------------------
# Displays fed by the launcher


class EchoDisplay:
    """--verbose: every byte as it arrives (after redaction), as before."""

    def __init__(self, stream: BinaryIO):
        self.stream = stream

    def feed(self, data: bytes) -> None:
        try:
            self.stream.write(data)
            self.stream.flush()
        except (BrokenPipeError, ValueError):
            pass

    def tick(self) -> None:
        pass

    def close(self, ended: str | None = None) -> None:
        pass


class StatusDisplay:
    """Splits the launcher's stream into lines for the engine's `LiveJudge` and shows the resulting status."""

    def __init__(self, status: Status, judge: Any | None, out: TextIO, terminal: bool):
        self.status, self.judge, self.out = status, judge, out
        self.pending = b""
        self.quiet_noted = status.started
        self.terminal = TerminalLine(out, _StatusRenderable(status)) if terminal else None
        if self.terminal is None:
            self._plain()

    def feed(self, data: bytes) -> None:
        if not data:
            return
        now = time.monotonic()
        self.status.last_output = now
        block = self.pending + data
        cut = block.rfind(b"\n") + 1
        self.pending = block[cut:]
        for line in self._wanted(block, cut):
            self._line(line, now)

    def _wanted(self, block: bytes, cut: int) -> list[bytes]:
        """The whole lines of block[:cut] that hold one of the engine's needles or start with our prefix, in order:
        found with bytes.find over the block (C speed), so the bulk of a log costs no Python per line."""
        needles = (*self.judge.NEEDLES, TOOL_NOTE) if self.judge is not None else (TOOL_NOTE,)
        starts = set()
        for needle in needles:
            pos = block.find(needle, 0, cut)
            while pos != -1:
                starts.add(block.rfind(b"\n", 0, pos) + 1)
                end = block.find(b"\n", pos, cut)
                pos = block.find(needle, end + 1, cut)
        return [block[start:block.find(b"\n", start, cut)] for start in sorted(starts)]

    def _line(self, line: bytes, now: float) -> None:
        if line.startswith(TOOL_NOTE):  # the launcher's own notes (stopping, timeout): always shown
            self._print(line.decode("utf-8", "replace"))
        elif self.judge is not None:
            self.judge.feed(line)  # after each line: every phase change and step gets its plain line
            if self.status.update(self.judge.phase, self.judge.step, self.judge.steps_expected, now):
                if self.terminal is None:
                    self._plain()

    def tick(self) -> None:
        """Between lines: plain output notes a long silence (a hung run shows in a Slurm log file)."""
        now = time.monotonic()
        if self.terminal is None and now - max(self.status.last_output, self.quiet_noted) >= QUIET_NOTE_S:
            self.quiet_noted = now
            self._plain(idle=True)

    def close(self, ended: str | None = None) -> None:
        if self.pending:
            block, self.pending = self.pending + b"\n", b""
            for line in self._wanted(block, len(block)):
                self._line(line, time.monotonic())
        self.status.ended = ended or "ended"
        if self.terminal is not None:
            self.terminal.refresh()
            self.terminal.stop()
        else:
            self._plain()

    def _plain(self, idle: bool = False) -> None:
        self._print(self.status.plain(time.monotonic(), idle=idle))

    def _print(self, text: str) -> None:
        if self.terminal is not None:
            self.terminal.print(text)
            return
        try:
            print(text, file=self.out, flush=True)
        except (BrokenPipeError, ValueError):
            pass


def open_display(label: str, run_dir: Path, *, judge: Any | None = None, steps: int | None = None,
                 verbose: bool | None = None, out: TextIO | None = None):
    """The display for one launched process: the full log with --verbose, else its status line."""
    verbose = verbose_requested() if verbose is None else verbose
    out = out or sys.stdout
    if verbose:
        return EchoDisplay(out.buffer if hasattr(out, "buffer") else out)
    status = Status(label, run_dir, time.monotonic(), steps_fallback=steps)
    if judge is None:
        status.phase = "running"  # no phases known for what is not verl
    return StatusDisplay(status, judge, out, terminal=is_terminal(out))


def verl_display(label: str, run_dir: Path, *, level: int | None, steps: int | None):
    """A verl run's display: the verdict engine reads the stream as it arrives."""
    from sessions.judge.verdict import LiveJudge

    return open_display(label, run_dir, judge=None if verbose_requested() else LiveJudge(level=level),
                        steps=steps)


# ---------------------------------------------------------------------------------------------------------------
# After the run


def tail_lines(path: Path, n: int = TAIL_LINES, max_bytes: int = 256 << 10) -> list[str]:
    """The last `n` lines of a log as a terminal should show them: ANSI codes out, a `\\r` redraw as its last
    state."""
    from sessions.judge.logstream import ANSI_RE

    with open(path, "rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        handle.seek(max(0, size - max_bytes))
        data = handle.read()
    lines = data.decode("utf-8", "replace").split("\n")  # not splitlines: `\r` is a redraw, not a line end
    if size > max_bytes:
        lines = lines[1:]  # the first one is cut
    shown = []
    for line in lines:
        line = ANSI_RE.sub("", line)
        shown.append(next((seg for seg in reversed(line.split("\r")) if seg.strip()), "").rstrip())
    while shown and not shown[-1]:
        shown.pop()
    return shown[-n:]


def _failure(summary: dict, logs: Iterable[tuple[str, Path]], run_dir: Path) -> tuple[str | None, str | None,
                                                                                          Path | None]:
    """(first error, hint, log to show the tail of) for a run that is not Pass."""
    verdicts = summary.get("verdicts") or {}
    logs = [(name, path) for name, path in logs if path.is_file()]
    for name, path in logs:
        verdict = verdicts.get(name) or {}
        if (verdict.get("level_result") or verdict.get("result")) not in (None, "Pass") or verdict.get("first_error"):
            return verdict.get("first_error"), verdict.get("hint"), path
    bridge = next((d for d in summary.get("deliverables", []) if d["name"] == "Bridge-side checks"), None)
    if not logs and bridge and bridge["status"] in ("Fail", "Blocked"):
        log = run_dir / "bridge_unit.log"
        return bridge["detail"], None, log if log.is_file() else None
    return None, None, logs[-1][1] if logs else None


def outcome(summary: dict, run_dir: Path, logs: Iterable[tuple[str, Path]], *, verbose: bool | None = None) -> str:
    """What the terminal gets after a level: with --verbose the whole summary (as before); else on Fail/Blocked
    the first error, its hint and the last log lines, then the Result line and the report's path."""
    from sessions.run.report import render_markdown

    markdown = render_markdown(summary)
    if verbose_requested() if verbose is None else verbose:
        return markdown
    out = []
    if summary["result"] != "Pass":
        error, hint, log = _failure(summary, logs, run_dir)
        if error:
            out.append(f"First error: {error}")
        if hint:
            out.append(f"Hint: {hint}")
        if log is not None:
            tail = tail_lines(log)
            out.append(f"Last {len(tail)} lines of {log}:")
            out += [f"  {line}" for line in tail]
    out.append(markdown.splitlines()[0])
    out.append(f"{TOOL_PREFIX} report: {run_dir / 'summary.md'}")
    return "\n".join(out)
