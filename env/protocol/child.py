"""One way to run a task of this tool as a child (`invoke levelN ...` for plan and bisect), with one Ctrl-C policy.

The child runs in its own session, so a terminal's Ctrl-C reaches only us; we then stop it the way a user would:
SIGINT to its process group (the level stops verl and writes its summary), after `grace_s` SIGTERM, then SIGKILL;
further Ctrl-C/SIGTERM are ignored meanwhile (bisect must not move a checkout under a level that is still
stopping). On Linux the child also gets SIGTERM when we die without a word (kill -9): prctl(PR_SET_PDEATHSIG).
Its output is streamed line by line to `echo`, its last lines kept, its `[verl-e2e] run directory:` line read.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from env.protocol import lines
from env.settings import PROJECT_ROOT

STOP_GRACE_S = 45  # a level stopped by Ctrl-C stops verl (20 s grace, then KILL) and writes its summary
TERM_GRACE_S = 15
KILL_GRACE_S = 5
TAIL_LINES = 8
PR_SET_PDEATHSIG = 1


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (one owned by another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def invoke_argv(args: list[str]) -> list[str]:
    """This project's invoke, as a child: the same Python, the same collection."""
    return [sys.executable, "-m", "invoke", "--search-root", str(PROJECT_ROOT), *args]


def set_parent_death_signal(sig: int = signal.SIGTERM) -> None:
    """In a forked child (preexec_fn): get `sig` when the parent dies (Linux; elsewhere nothing)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        pass


@dataclass
class ChildResult:
    code: int | None
    run_dir: Path | None
    tail: list[str] = field(default_factory=list)
    interrupted: bool = False

    def last_line(self) -> str:
        return next((t for t in reversed(self.tail) if t.strip()), "no output")


def stop(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> int | None:
    """SIGINT, then SIGTERM, then SIGKILL to the child's group, each with its grace; our own Ctrl-C/SIGTERM are
    ignored while it stops."""
    old = {}
    for s in (signal.SIGINT, signal.SIGTERM):
        try:
            old[s] = signal.signal(s, signal.SIG_IGN)
        except ValueError:  # not the main thread
            break
    try:
        for sig, grace in ((signal.SIGINT, grace_s), (signal.SIGTERM, TERM_GRACE_S), (signal.SIGKILL, KILL_GRACE_S)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                return proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                continue
        return proc.poll()
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def run_task(args: list[str], echo: Callable[[str], None], *, env: Mapping[str, str] | None = None,
             grace_s: float = STOP_GRACE_S, reraise: bool = False) -> ChildResult:
    """`invoke <args>` as a child: stream, keep a tail, find its run directory, stop it on Ctrl-C.

    reraise: after stopping the child on Ctrl-C, raise KeyboardInterrupt again (the caller stops too);
    else the result says interrupted=True."""
    proc = subprocess.Popen(invoke_argv(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1, errors="replace", start_new_session=True, stdin=subprocess.DEVNULL,
                            env=None if env is None else dict(env), preexec_fn=set_parent_death_signal)
    found: list[str] = []
    tail: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.rstrip("\n")
            echo(line)
            tail[:] = (tail + [line])[-TAIL_LINES:]
            path = lines.find_run_dir(line)
            if path:
                found.append(path)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    interrupted = False
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        interrupted = True
        code = stop(proc, grace_s)
    reader.join(timeout=10)
    result = ChildResult(code, Path(found[-1]) if found else None, list(tail), interrupted)
    if interrupted and reraise:
        raise KeyboardInterrupt
    return result
