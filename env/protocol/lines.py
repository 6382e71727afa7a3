"""The tool's own `[verl-e2e]` lines that other code reads back: the run directory, the wrapper's and the Slurm
step's exit footers, the interrupted line. Written and parsed here only (plan, bisect, remote, slurm, tests)."""

from __future__ import annotations

import re
import sys

from env.settings import TOOL_PREFIX

PREFIX = TOOL_PREFIX
RUN_DIR = f"{PREFIX} run directory: "
WRAPPER_EXIT = f"{PREFIX} wrapper exit code "
SLURM_STEP_EXIT = f"{PREFIX} slurm step exit code "
_RUN_DIR_RE = re.compile(re.escape(RUN_DIR) + r"(.+?)\s*$")
_RUN_DIR_RE_BYTES = re.compile(re.escape(RUN_DIR.encode()) + rb"(.+?)\s*$")

# The run directory this process announced last: an interrupted task names it in its last line.
_announced: list[str] = []


def run_dir_line(path: object) -> str:
    return f"{RUN_DIR}{path}"


def say_run_dir(path: object, file=None) -> None:
    """Print `[verl-e2e] run directory: PATH` (and remember it for the interrupted line)."""
    _announced[:] = [str(path)]
    print(run_dir_line(path), file=file or sys.stdout, flush=True)


def note_run_dir(path: object) -> None:
    """Remember a run directory announced with a line of its own (plan's, bisect's)."""
    _announced[:] = [str(path)]


def announced_run_dir() -> str | None:
    return _announced[0] if _announced else None


def find_run_dir(line: str) -> str | None:
    """The path of a run-directory line (also inside a redrawn terminal line), else None."""
    for segment in reversed(line.split("\r")):  # a redrawn terminal line: the last segment that is one
        m = _RUN_DIR_RE.search(segment)
        if m:
            return m.group(1)
    return None


def find_run_dir_bytes(line: bytes) -> str | None:
    m = _RUN_DIR_RE_BYTES.search(line.replace(b"\r", b""))
    return m.group(1).decode(errors="replace") if m else None


def wrapper_exit_footer(code: int | None, termination: str | None, duration_s: float) -> str:
    """The last line of a verl log the tool wrote: the wrapper's exit code, how it ended, how long it ran."""
    return f"{WRAPPER_EXIT}{code}{f', {termination}' if termination else ''} after {duration_s:.1f}s"


def slurm_step_footer(code: int | None) -> str:
    return f"{SLURM_STEP_EXIT}{code}"


def interrupted_line(run_dir: str | None = None) -> str:
    """The one line of a task stopped by Ctrl-C/SIGTERM (exit 130)."""
    return "interrupted" + (f"; run directory: {run_dir}" if run_dir else "")
