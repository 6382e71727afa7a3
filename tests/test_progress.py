"""What a level prints while it runs: one status line (redrawn on a terminal, plain lines elsewhere), the whole log
with --verbose, and on failure the first error, its hint and the log's tail (issue 18). Level runs use the fixture
verl trainer; the terminal is a real pseudo-terminal."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

from sessions.run import progress
from sessions.run.launch import run_logged
from tests.conftest import PROJECT, only_run_dir

CSI = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])")


def screen(raw: bytes) -> list[str]:
    """What a terminal shows after `raw`: enough of a VT100 for rich's Live (\\r, \\n, erase line, cursor up)."""
    rows, row, col = [""], 0, 0
    text = raw.decode("utf-8", "replace")
    pos = 0
    while pos < len(text):
        match = CSI.match(text, pos)
        if match:
            args, cmd = match.groups()
            if cmd == "K" or (cmd == "J" and args == ""):
                rows[row] = rows[row][:col] if args in ("", "0") else ""
            elif cmd == "A":
                row = max(0, row - int(args or 1))
            pos = match.end()
            continue
        ch = text[pos]
        pos += 1
        if ch == "\r":
            col = 0
        elif ch == "\n":
            row += 1
            if row == len(rows):
                rows.append("")
            col = 0
        elif ch == "\x1b":
            continue
        else:
            line = rows[row].ljust(col)
            rows[row] = line[:col] + ch + line[col + 1:]
            col += 1
    return rows


def run_in_pty(args: list[str], env: dict[str, str], *, columns: int = 220, timeout: float = 240) -> tuple[int, bytes]:
    """`invoke ARGS` with stdin/stdout/stderr on a pseudo-terminal of `columns` columns; (exit code, bytes shown)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "invoke", *args], cwd=PROJECT, env={**env, "TERM": "xterm"},
                            stdin=slave, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    out, deadline = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    data = os.read(master, 1 << 16)
                except OSError:  # EIO: every holder of the terminal is gone
                    break
                if not data:
                    break
                out += data
            elif proc.poll() is not None:
                break
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    return proc.wait(timeout=30), out


STEPPING = ["level5", "--skip-bridge-checks", "--steps", "3"]  # three steps of a second: the status has to move


def test_terminal_shows_one_status_line_redrawn_in_place_with_step_counts(workspace):
    code, raw = run_in_pty(STEPPING, {**workspace.env, "FIXTURE_STEP_SLEEP": "1"})
    rows = screen(raw)
    assert code == 0, "\n".join(rows[-40:])
    run_dir = only_run_dir(workspace)
    # every count was drawn, each over the one before: the screen keeps one status line, the last one
    for drawn in ("step 0/3", "step 1/3", "step 2/3", "step 3/3"):
        assert drawn.encode() in raw, drawn
    status = [r for r in rows if r.startswith("verl ")]
    assert len(status) == 1, status
    assert re.match(r"verl training [━╸╺ ]+ step 3/3 · \d+s elapsed · " + re.escape(str(run_dir)) + " · ended: exit 0",
                    status[0]), status[0]
    assert b"\r\x1b[2K" in raw  # rich's redraw: back to column 0, erase the line
    # a time left once two steps ticked (the first step's time holds the engines' start-up)
    assert re.search(r"~\d+s left", raw.decode())
    # the log stayed off the terminal and went to verl.log
    assert not any("step:1 - training/global_step" in r or "+ VANILLA_MBRIDGE=False" in r for r in rows)
    assert "[verl-e2e] status:" not in raw.decode()
    log = (run_dir / "verl.log").read_text()
    assert "step:3 - training/global_step:3" in log and "+ VANILLA_MBRIDGE=False" in log
    shown = [r for r in rows if r.strip()]
    assert shown[-3].startswith("Result: Pass - Level 5 (learning signal) passed")
    assert shown[-2] == f"[verl-e2e] report: {run_dir}/summary.md"
    assert shown[-1] == f"[verl-e2e] run directory: {run_dir}"


def test_piped_output_has_plain_status_lines_on_phase_and_step_changes_only(workspace):
    proc = workspace.invoke(*STEPPING, env={"FIXTURE_STEP_SLEEP": "0.3"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    run_dir = only_run_dir(workspace)
    assert "\r" not in proc.stdout and "\x1b[" not in proc.stdout
    status = [ln for ln in proc.stdout.splitlines() if ln.startswith("[verl-e2e] status: ")]
    assert all(re.search(r" · \d+s elapsed · (~\d+s left · )?/", s) for s in status), status
    shown = [re.sub(r" · \d+s elapsed · (~\d+s left · )?", " · ", s)[len("[verl-e2e] status: "):] for s in status]
    # the first and the last two lines; between them one line per change of the engine's phase or of the step
    assert shown[0] == f"verl · launch · step 0/3 · {run_dir}"
    assert shown[-2:] == [f"verl · training · step 3/3 · {run_dir}",
                          f"verl · training · step 3/3 · {run_dir} · ended: exit 0"], shown
    body = [s.split(" · ")[1:3] for s in shown[:-1]]
    assert all(a != b for a, b in zip(body, body[1:], strict=False)), shown
    assert [b for b in body if b[0] == "training"] == [["training", "step 1/3"], ["training", "step 2/3"],
                                                       ["training", "step 3/3"]], shown
    assert {"ray-up", "model-build"} <= {b[0] for b in body}
    assert "step:1 - " not in proc.stdout and "VANILLA_MBRIDGE" not in proc.stdout
    assert proc.stdout.splitlines()[-3].startswith("Result: Pass - ")


def test_verbose_streams_the_whole_log_and_no_status(workspace):
    proc = workspace.invoke("level0", "--skip-bridge-checks", "--verbose")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "+ VANILLA_MBRIDGE=False" in proc.stdout and "step:1 - training/global_step:1" in proc.stdout
    assert "Training Progress: 100%" in proc.stdout  # tqdm's redraws too, as verl wrote them
    assert "[verl-e2e] status:" not in proc.stdout
    # the whole summary, as before
    assert "Result: Pass - " in proc.stdout and "Deliverables" in proc.stdout
    log = (only_run_dir(workspace) / "verl.log").read_text()
    assert "step:1 - training/global_step:1" in log


def test_failing_run_shows_first_error_hint_and_the_last_20_lines_before_the_result(workspace):
    proc = workspace.invoke("level0", "--skip-bridge-checks", env={"FIXTURE_FAIL": "oom"})
    assert proc.returncode == 1, proc.stdout[-3000:]
    run_dir = only_run_dir(workspace)
    lines = proc.stdout.splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.startswith("First error: "))
    assert lines[first].endswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
                                 "GPU 0 has a total capacity of 139.81 GiB")
    assert lines[first + 1].startswith("Hint: Out of memory: use a smaller model or micro batch")
    assert lines[first + 2] == f"Last 20 lines of {run_dir}/verl.log:"
    tail = lines[first + 3: first + 23]
    assert all(t.startswith("  ") or t == "" for t in tail), tail
    assert "  Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace." in tail
    assert "  torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity " \
           "of 139.81 GiB" in tail
    assert tail[-1].startswith("  [verl-e2e] wrapper exit code 1 after ")
    assert lines[first + 23].startswith("Result: Fail - Level 0 (LoRA + DDP smoke) failed")
    assert "ray.get(runner.run.remote(config))" not in "\n".join(lines[:first])  # no log before the tail


# ---------------------------------------------------------------------------------------------------------------
# The pieces


def test_verbose_variable_makes_the_launcher_echo_every_byte(tmp_path):
    script = tmp_path / "w.sh"
    script.write_text("echo one; printf 'a\\rb\\n'; echo two >&2\n")
    code = (f"import sys; from pathlib import Path; from sessions.run.launch import run_logged\n"
            f"p = Path({str(tmp_path / 'log')!r})\n"
            f"with open(p, 'wb') as log: run_logged(['bash', {str(script)!r}], cwd=p.parent, env={{}}, log=log, "
            f"log_path=p)\n")
    loud = subprocess.run([sys.executable, "-c", code], cwd=PROJECT, capture_output=True,
                          env={**os.environ, "VERL_E2E_VERBOSE": "1"})
    assert loud.stdout == b"one\na\rb\ntwo\n" == (tmp_path / "log").read_bytes()
    quiet = subprocess.run([sys.executable, "-c", code], cwd=PROJECT, capture_output=True,
                           env={k: v for k, v in os.environ.items() if k != "VERL_E2E_VERBOSE"})
    assert quiet.stdout.decode().splitlines() == [
        f"[verl-e2e] status: log · running · 0s elapsed · {tmp_path}",
        f"[verl-e2e] status: log · running · 0s elapsed · {tmp_path} · ended: exit 0",
    ]


def test_launcher_notes_reach_the_terminal_and_the_log(tmp_path):
    log_path = tmp_path / "verl.log"
    out = tmp_path / "shown"
    with open(log_path, "wb") as log, open(out, "w") as shown:
        display = progress.open_display("verl", tmp_path, verbose=False, out=shown)
        res = run_logged([sys.executable, "-c", "import time; print('started', flush=True); time.sleep(600)"],
                         cwd=tmp_path, env={}, log=log, log_path=log_path, stall_timeout=1.5, display=display)
    assert res.termination == "timeout"
    text = out.read_text()
    assert "[verl-e2e] timeout (no output for 2s): stopping the wrapper's process group" in text
    assert text.rstrip().endswith(f"{tmp_path} · ended: timeout")
    assert "started" not in text and b"started" in log_path.read_bytes()


def test_status_time_left_from_the_steps_so_far():
    st = progress.Status("verl", Path("/r"), started=100.0, steps_fallback=10)
    st.update("rollout-up", 0, None, now=110.0)
    assert st.seconds_left(115.0) is None  # no step yet
    st.update("training", 1, 20, now=130.0)  # the log says 20 steps: it wins over the preset's 10
    # one tick: its time is the engines' start-up, not a step's (issue 24): no estimate yet
    assert st.total == 20 and st.seconds_left(130.0) is None
    st.update("model-build", 1, 20, now=131.0)  # a late model-build line: the display's phase never goes back
    assert st.phase == "training"
    st.update("training", 3, 20, now=150.0)  # (150 - 130) / 2 steps between ticks
    assert abs(st.seconds_left(155.0) - (17 * 10 - 5)) < 1e-9
    assert " · ".join(st.fields(155.0, idle=True)) == \
        "verl · training · step 3/20 · 55s elapsed · ~2m45s left · last output 55s ago · /r"


def test_tail_lines_shows_redraws_as_their_last_state_without_colour(tmp_path):
    log = tmp_path / "verl.log"
    log.write_bytes(b"".join(b"line %d\n" % i for i in range(30))
                    + b"\x1b[36m(TaskRunner pid=1)\x1b[0m \rTraining Progress:  0%\rTraining Progress: 100%\n\n")
    assert progress.tail_lines(log, 3) == ["line 28", "line 29", "Training Progress: 100%"]


def test_relay_redraws_child_status_lines_on_a_terminal_and_passes_through_elsewhere(tmp_path):
    lines = [b"[verl-e2e] preflight table\n",
             b"[verl-e2e] status: verl \xc2\xb7 launch \xc2\xb7 /r\n",
             b"[verl-e2e] status: verl \xc2\xb7 training \xc2\xb7 step 1/2 \xc2\xb7 /r\n",
             b"[verl-e2e] note in between\n",
             b"[verl-e2e] status: verl \xc2\xb7 training \xc2\xb7 step 2/2 \xc2\xb7 /r \xc2\xb7 ended: exit 0\n",
             b"Result: Pass - done\n"]
    code = ("import sys, time; from env.protocol.relay import Relay\nr = Relay()\n"
            f"for chunk in {lines!r}:\n    r.write(chunk[:5]); r.write(chunk[5:]); r.flush(); time.sleep(0.3)\n"
            "r.close()\n")
    piped = subprocess.run([sys.executable, "-c", code], cwd=PROJECT, capture_output=True)
    assert piped.stdout == b"".join(lines)
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 120, 0, 0))
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=PROJECT, stdout=slave, stderr=slave,
                            env={**os.environ, "TERM": "xterm"})
    os.close(slave)
    raw = b""
    while True:
        try:
            data = os.read(master, 1 << 16)
        except OSError:
            break
        if not data:
            break
        raw += data
    os.close(master)
    assert proc.wait(timeout=30) == 0
    rows = [r.rstrip() for r in screen(raw) if r.strip()]
    assert rows[0] == "[verl-e2e] preflight table"
    assert rows[1] == "[verl-e2e] note in between"
    assert re.fullmatch(r"verl · training · step 2/2 · /r · ended: exit 0 · updated \ds ago", rows[2]), rows
    assert rows[3:] == ["Result: Pass - done"]
    assert b"step 1/2" in raw and "step 1/2" not in "\n".join(rows)


def test_ctrl_c_on_a_terminal_ends_the_status_line_keeps_the_log_and_gives_the_cursor_back(workspace):
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 220, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "invoke", "level0", "--skip-bridge-checks"], cwd=PROJECT,
                            env={**workspace.env, "TERM": "xterm", "FIXTURE_FAIL": "hang"}, stdin=slave,
                            stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    raw, deadline, sent = b"", time.monotonic() + 180, False
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                data = os.read(master, 1 << 16)
            except OSError:
                break
            if not data:
                break
            raw += data
        if not sent and b"Total training steps" in b"".join(
                p.read_bytes() for p in workspace.log_dir.glob("*/verl.log")):
            time.sleep(1.0)
            proc.send_signal(signal.SIGINT)  # what the terminal's Ctrl-C sends to the foreground process
            sent = True
        if proc.poll() is not None and not ready:
            break
    os.close(master)
    assert sent and proc.wait(timeout=60) == 130  # interrupted (the summary still says what the run showed)
    rows = [r.rstrip() for r in screen(raw) if r.strip()]
    run_dir = only_run_dir(workspace)
    assert "[verl-e2e] interrupted (SIGINT): stopping the wrapper's process group" in rows
    assert [r for r in rows if r.startswith("verl ")][-1].endswith(f"{run_dir} · ended: interrupted")
    assert raw.rfind(b"\x1b[?25h") > raw.rfind(b"\x1b[?25l")  # rich hid the cursor while drawing and gave it back
    assert any(r.startswith("Result: Blocked - ") for r in rows)
    log = (run_dir / "verl.log").read_text()
    assert "Total training steps: 1" in log and "interrupted (SIGINT)" in log


def test_plain_output_notes_a_long_silence_once_per_period(tmp_path, monkeypatch):
    monkeypatch.setattr(progress, "QUIET_NOTE_S", 0.3)
    shown = tmp_path / "shown"
    with open(shown, "w") as out:
        display = progress.open_display("verl", Path("/r"), verbose=False, out=out)
        display.tick()  # not quiet yet
        time.sleep(0.4)
        display.tick()
        display.tick()  # the same silence: noted once
        display.close("exit 0")
    lines = shown.read_text().splitlines()
    assert lines[0] == "[verl-e2e] status: verl · running · 0s elapsed · /r"
    assert lines[1] == "[verl-e2e] status: verl · running · 0s elapsed · last output 0s ago · /r"
    assert lines[2] == "[verl-e2e] status: verl · running · 0s elapsed · /r · ended: exit 0"
    assert len(lines) == 3


def test_terminal_status_stays_one_line_on_a_narrow_terminal():
    from rich.console import Console

    st = progress.Status("verl run B", Path("/very/long/log/dir/20261130T120000Z-level1-Qwen2.5-0.5B"),
                         started=time.monotonic(), steps_fallback=2)
    st.update("training", 1, None, now=time.monotonic())
    for width in (60, 100):
        console = Console(file=(buf := io.StringIO()), width=width, force_terminal=True, color_system=None)
        console.print(progress._StatusRenderable(st))
        lines = buf.getvalue().rstrip("\n").split("\n")
        assert len(lines) == 1 and len(lines[0]) <= width, lines
        assert lines[0].startswith("verl run B training ") and "step 1/2 · 0s elapsed" in lines[0], lines
        assert lines[0].endswith("…")  # the run dir is what gives way
