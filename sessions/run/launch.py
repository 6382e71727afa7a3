"""Launch the verl wrapper with its output teed to the run's log as it arrives.

The wrapper runs in its own process group (so a terminal Ctrl-C reaches us, not Ray directly); on SIGINT/SIGTERM
of our process, or a stall (no output for `stall_timeout` s), the whole group gets SIGTERM, then SIGKILL after a
grace period, and we keep draining its output so the log is complete up to its end. Known secret values are masked
before a byte reaches the log or the terminal.

The wrapper dies with this tool however the tool dies: a small watchdog process (its own session) holds the read
end of a pipe only we write to; when that pipe closes without our "done" (kill -9, OOM killer), it stops the
wrapper's group and every process tagged with this run (RUN_MARKER in its environment: the trainer, and the Ray
daemons verl starts, which run in sessions of their own). On Linux the wrapper also gets SIGTERM when we die
(PR_SET_PDEATHSIG). A process still tagged with a run whose tool is gone is a leftover: `leftover_processes` names it
with its run directory, and a level's preflight reports it before starting another run. The log gets every byte first; the terminal gets what a display of
sessions/run/progress.py makes of it (a status line, or the whole stream with --verbose).
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from env.protocol.child import pid_alive
from env.settings import TOOL_PREFIX

RUN_MARKER = "VERL_E2E_RUN"  # "<tool pid>:<run directory>", in the environment of everything a run starts
WATCHDOG_GRACE_S = 10.0
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
    termination: str | None  # None | "interrupted" | "timeout" | "blocked" (a preflight probe, while verl started)
    duration_s: float
    log_path: str
    signal_name: str | None = None


# The watchdog: argv = read fd, process group, run marker value. Reads until EOF; "done" first means a clean end.
WATCHDOG = r"""
import os, signal, sys, time
fd, pgid, marker = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
for s in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
    signal.signal(s, signal.SIG_IGN)
data = b""
while True:
    try:
        chunk = os.read(fd, 64)
    except InterruptedError:
        continue
    if not chunk:
        break
    data += chunk
if b"done" in data:
    sys.exit(0)
def tagged():
    out = []
    for pid in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if ("%s=%s" % ("VERL_E2E_RUN", marker)).encode() in f.read().split(b"\0"):
                    out.append(int(pid))
        except OSError:
            pass
    return out
def kill(sig):
    try:
        os.killpg(pgid, sig)
    except OSError:
        pass
    for pid in tagged():
        try:
            os.kill(pid, sig)
        except OSError:
            pass
kill(signal.SIGTERM)
deadline = time.monotonic() + float(os.environ.get("VERL_E2E_WATCHDOG_GRACE_S", "10"))
while time.monotonic() < deadline:
    try:
        os.killpg(pgid, 0)
    except OSError:
        if not tagged():
            break
    time.sleep(0.2)
kill(signal.SIGKILL)
"""


def _start_watchdog(pgid: int, marker: str) -> int | None:
    """The watchdog for the group `pgid`; returns the write end of its pipe (write b"done" and close at the end)."""
    import sys

    read_fd, write_fd = os.pipe()  # both non-inheritable: the wrapper never holds them
    try:
        subprocess.Popen([sys.executable, "-c", WATCHDOG, str(read_fd), str(pgid), marker], pass_fds=(read_fd,),
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True, env={**os.environ, "VERL_E2E_WATCHDOG_GRACE_S": str(WATCHDOG_GRACE_S)})
    except OSError:
        os.close(write_fd)
        return None
    finally:
        os.close(read_fd)
    return write_fd


def _end_watchdog(write_fd: int | None) -> None:
    if write_fd is None:
        return
    try:
        os.write(write_fd, b"done")
    except OSError:
        pass
    os.close(write_fd)


@dataclass
class Leftover:
    pid: int
    command: str
    run_dir: str
    tool_pid: int
    ray: bool  # a Ray daemon (gcs_server, raylet, ...): `ray stop --force` clears it


def leftover_processes(log_dir: Path | None = None) -> list[Leftover]:
    """Processes started by an earlier run of this tool whose tool process is gone (Linux: /proc; else none);
    with `log_dir`, only those of run directories under it."""
    out = []
    if not os.path.isdir("/proc"):
        return out
    prefix = f"{RUN_MARKER}=".encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        tag = next((e[len(prefix):].decode(errors="replace") for e in env if e.startswith(prefix)), None)
        if not tag or ":" not in tag:
            continue
        tool, _, run_dir = tag.partition(":")
        if not tool.isdigit() or pid_alive(int(tool)):
            continue
        if log_dir is not None and Path(run_dir).parent != Path(log_dir).absolute():
            continue
        ray = any(k in cmd for k in ("raylet", "gcs_server", "ray/dashboard", "ray/_private", "ray::", "ray_client"))
        out.append(Leftover(int(name), cmd[:200], run_dir, int(tool), ray))
    return out


def leftover_checks(log_dir: Path) -> list:
    """The preflight line for leftovers: Blocked for a trainer still running (it holds GPUs), a warning for Ray
    daemons alone (the level's `ray stop --force` clears them; with --ray-address they stay)."""
    from env.preflight.checks import BLOCKED, WARN, Check

    found = leftover_processes(log_dir)
    if not found:
        return []
    runs = sorted({x.run_dir for x in found})
    pids = " ".join(str(x.pid) for x in found)
    trainers = [x for x in found if not x.ray]
    if trainers:
        return [Check("no trainer left over from an earlier run", BLOCKED,
                      f"{len(trainers)} process(es) of an earlier run still running (its tool is gone): "
                      f"{trainers[0].command[:120]} (pid {trainers[0].pid}); run directory: {', '.join(runs)}",
                      fix=f"kill {pids}", category="env-dependency")]
    return [Check("no Ray cluster left over from an earlier run", WARN,
                  f"Ray daemons of an earlier run still running (pid {pids}); run directory: {', '.join(runs)}; "
                  f"`ray stop --force` before the run stops them", fix=f"ray stop --force (or kill {pids})")]


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
    watch: Callable[[], str | None] | None = None,
) -> LaunchResult:
    """Run argv, tee its stdout+stderr into `log` and to a display, survive our own SIGINT/SIGTERM.

    `echo`: a stream that gets every byte (the old tee); else `display` (sessions/run/progress.py), by default the
    status line of this process (or the whole stream when VERL_E2E_VERBOSE=1). The display is closed here.
    `watch`: polled every tick; a reason it returns stops the run as "blocked" (preflight probes that answered
    Blocked while verl started).
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

    from env.protocol.child import set_parent_death_signal

    marker = f"{os.getpid()}:{log_path.parent}"
    proc = subprocess.Popen(
        argv, cwd=cwd, env={**env, RUN_MARKER: marker}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=set_parent_death_signal,
    )
    watchdog = _start_watchdog(proc.pid, marker)

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
            if watch is not None and termination is None and exited_at is None:
                reason = watch()
                if reason:
                    request_stop("blocked", reason)
            if stop_deadline is not None and now > stop_deadline:
                _stop_group(proc, signal.SIGKILL)
                stop_deadline = now + 5.0
    except BaseException:  # the tool itself failed (a bug, a watch that raised): verl must not outlive it
        termination = termination or "interrupted"
        raise
    finally:
        write(redactor.flush())
        sel.close()
        if proc.poll() is None and termination is not None:
            _stop_group(proc, signal.SIGKILL)
        proc.wait()
        # stragglers of the group (Ray workers) must not outlive the run
        _stop_group(proc, signal.SIGKILL)
        _end_watchdog(watchdog)
        for sig, old in handlers.items():
            signal.signal(sig, old)
        display.close(termination or f"exit {proc.returncode}")
    return LaunchResult(proc.returncode, termination, time.monotonic() - start, str(log_path), signal_name)
