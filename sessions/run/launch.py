"""Launch the verl wrapper with its output teed to the run's log as it arrives.

The wrapper runs in its own process group (so a terminal Ctrl-C reaches us, not Ray directly); on SIGINT/SIGTERM
of our process, or a stall (no output for `stall_timeout` s), the whole group gets SIGTERM, then SIGKILL after a
grace period, and we keep draining its output so the log is complete up to its end. Known secret values are masked
before a byte reaches the log or the terminal. The log gets every byte first; the terminal gets what a display of
sessions/run/progress.py makes of it (a status line, or the whole stream with --verbose).
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from env.settings import TOOL_PREFIX

SECRET_MARKERS = ("TOKEN", "SECRET", "PASSWORD", "API_KEY", "_KEY", "CREDENTIAL")
MASK = b"***"
GRACE_S = 20.0


def is_secret_name(name: str) -> bool:
    upper = name.upper()
    return any(m in upper for m in SECRET_MARKERS)


def secret_values(env: Mapping[str, str]) -> list[bytes]:
    return sorted({v.encode() for k, v in env.items() if is_secret_name(k) and len(v) >= 4}, key=len, reverse=True)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: ("***" if is_secret_name(k) and v else v) for k, v in env.items()}


class Redactor:
    """Masks secret values in a byte stream, holding back only a tail that could be the start of a secret."""

    def __init__(self, secrets: Iterable[bytes]):
        self.secrets = [s for s in secrets if s]
        self.pending = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self.pending + chunk
        for s in self.secrets:
            data = data.replace(s, MASK)
        hold = 0
        for s in self.secrets:
            for k in range(min(len(s) - 1, len(data)), hold, -1):
                if s.startswith(data[-k:]):
                    hold = k
                    break
        self.pending = data[len(data) - hold:] if hold else b""
        return data[: len(data) - hold]

    def flush(self) -> bytes:
        out, self.pending = self.pending, b""
        return out


@dataclass
class LaunchResult:
    exit_code: int | None
    termination: str | None  # None | "interrupted" | "timeout"
    duration_s: float
    log_path: str
    signal_name: str | None = None


def _stop_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def run_logged(
    argv: list[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    log: BinaryIO,
    log_path: Path,
    echo: BinaryIO | None = None,
    stall_timeout: float | None = None,
    secrets: Iterable[bytes] = (),
    display: Any = None,
) -> LaunchResult:
    """Run argv, tee its stdout+stderr into `log` and to a display, survive our own SIGINT/SIGTERM.

    `echo`: a stream that gets every byte (the old tee); else `display` (sessions/run/progress.py), by default the
    status line of this process (or the whole stream when VERL_E2E_VERBOSE=1). The display is closed here.
    """
    from sessions.run import progress

    if echo is not None:
        display = progress.EchoDisplay(echo)
    elif display is None:
        display = progress.open_display(log_path.stem, log_path.parent)
    redactor = Redactor(secrets)
    start = last_output = time.monotonic()
    termination: str | None = None
    signal_name: str | None = None
    stop_deadline: float | None = None

    proc = subprocess.Popen(
        argv, cwd=cwd, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True,
    )

    def request_stop(reason: str, name: str | None = None) -> None:
        nonlocal termination, stop_deadline, signal_name
        if termination is None:
            termination, signal_name = reason, name
            note = f"\n{TOOL_PREFIX} {reason}{f' ({name})' if name else ''}: stopping the wrapper's process group\n"
            write(note.encode())
        if stop_deadline is None:
            stop_deadline = time.monotonic() + GRACE_S
            _stop_group(proc, signal.SIGTERM)

    def write(data: bytes) -> None:
        if data:
            log.write(data)
            log.flush()
            display.feed(data)

    def on_signal(signum: int, _frame: object) -> None:
        if stop_deadline is not None:  # asked twice: no more grace
            _stop_group(proc, signal.SIGKILL)
        request_stop("interrupted", signal.Signals(signum).name)

    handlers = {}
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        try:
            handlers[sig] = signal.signal(sig, on_signal)
        except ValueError:  # not the main thread: no handlers, the caller owns signals
            break

    sel = selectors.DefaultSelector()
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    sel.register(fd, selectors.EVENT_READ)
    exited_at: float | None = None
    try:
        while True:
            if sel.select(timeout=0.5):
                try:
                    chunk = os.read(fd, 1 << 16)
                except (BlockingIOError, InterruptedError):
                    chunk = None
                if chunk == b"":
                    break  # EOF: every writer of the pipe is gone
                if chunk:
                    last_output = time.monotonic()
                    write(redactor.feed(chunk))
            display.tick()
            now = time.monotonic()
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > 5.0 and now - last_output > 1.0:
                break  # the wrapper is gone; a detached child still holds the pipe
            if stall_timeout and termination is None and now - last_output > stall_timeout:
                request_stop("timeout", f"no output for {stall_timeout:.0f}s")
            if stop_deadline is not None and now > stop_deadline:
                _stop_group(proc, signal.SIGKILL)
                stop_deadline = now + 5.0
    finally:
        write(redactor.flush())
        sel.close()
        if proc.poll() is None and termination is not None:
            _stop_group(proc, signal.SIGKILL)
        proc.wait()
        # stragglers of the group (Ray workers) must not outlive the run
        _stop_group(proc, signal.SIGKILL)
        for sig, old in handlers.items():
            signal.signal(sig, old)
        display.close(termination or f"exit {proc.returncode}")
    return LaunchResult(proc.returncode, termination, time.monotonic() - start, str(log_path), signal_name)
