"""The tool's own protocol (env/protocol/): the exit-code table, the `[verl-e2e]` lines, the child-task runner, and
that a trainer dies with the tool however the tool dies (issue 27.4, issue 23.2)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from env.protocol import exits, lines
from env.protocol.child import run_task
from tests.conftest import PROJECT


def test_the_readme_states_the_exit_code_table():
    readme = (PROJECT / "README.md").read_text()
    for code, _ in exits.OUTCOMES:
        assert re.search(rf"^\| {code} \|", readme, flags=re.M), f"README has no exit-code row for {code}"


def test_run_dir_lines_round_trip():
    line = lines.run_dir_line("/x/y z")
    assert lines.find_run_dir(line) == "/x/y z"
    assert lines.find_run_dir("\r[verl-e2e] status: step 1\r" + line + "  ") == "/x/y z"
    assert lines.find_run_dir_bytes(line.encode() + b"\r\n") == "/x/y z"
    assert lines.find_run_dir("[verl-e2e] plan run directory: /p") is None
    assert lines.wrapper_exit_footer(0, None, 1.25) == "[verl-e2e] wrapper exit code 0 after 1.2s"
    assert lines.interrupted_line("/r") == "interrupted; run directory: /r"


def test_the_child_runner_streams_finds_the_run_dir_and_keeps_a_tail(workspace):
    seen: list[str] = []
    res = run_task(["level0", "--dry-run"], seen.append, env=workspace.env)
    assert res.code == 0 and not res.interrupted
    assert any(line.startswith("# run directory, named when the run starts:") for line in seen)
    assert res.tail and res.tail[-1] == seen[-1]


def _trainers(ws) -> list[int]:
    out = subprocess.run(["pgrep", "-f", f"verl.trainer.main_ppo.*{ws.data}"], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def _start_hung_level(ws, reaper) -> tuple[subprocess.Popen, Path]:
    env = {**ws.env, "FIXTURE_FAIL": "hang"}
    proc = subprocess.Popen([sys.executable, "-m", "invoke", "level0", "--skip-bridge-checks"], cwd=PROJECT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    reaper(proc)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # the event: the trainer's own line in the log
        logs = list(ws.log_dir.glob("*-level0-*/verl.log"))
        if logs and "Training Progress" in logs[0].read_text(errors="replace"):
            for pid in _trainers(ws):
                reaper(pid)
            return proc, logs[0]
        assert proc.poll() is None, "the level ended before training"
        time.sleep(0.2)
    raise AssertionError("the run never reached training")


def _wait_until(predicate, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


@pytest.mark.timeout(600)
def test_kill_9_of_the_tool_stops_the_trainer_and_keeps_the_run_dir(workspace, reaper):
    proc, log = _start_hung_level(workspace, reaper)
    assert _trainers(workspace), "no trainer to stop"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert _wait_until(lambda: not _trainers(workspace), 120), "the trainer outlived the tool"
    assert log.is_file() and "Training Progress" in log.read_text(errors="replace")
    report = subprocess.run([sys.executable, "-m", "invoke", "report", str(log.parent)], cwd=PROJECT,
                            env=workspace.env, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in report.stdout + report.stderr and report.returncode in (1, 3), report.stderr


@pytest.mark.timeout(600)
def test_a_trainer_left_over_from_a_killed_run_is_named_before_the_next_run(workspace, reaper):
    proc, log = _start_hung_level(workspace, reaper)
    run_dir = log.parent
    # the watchdog is killed too (say, by the OOM killer): the trainer is left over
    ps = subprocess.run(["pgrep", "-f", f"{proc.pid}:{run_dir}"], capture_output=True,
                        text=True)
    watchdogs = [int(p) for p in ps.stdout.split()]
    assert watchdogs, "no watchdog found"
    for pid in watchdogs:
        os.kill(pid, signal.SIGKILL)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(1.0)  # the wrapper's PR_SET_PDEATHSIG: bash gets SIGTERM, its trainer child is left
    leftovers = _trainers(workspace)
    for pid in leftovers:
        reaper(pid)
    if not leftovers:
        pytest.skip("nothing was left over to name (the wrapper took its trainer with it)")
    dry = subprocess.run([sys.executable, "-m", "invoke", "level0", "--dry-run", "--skip-bridge-checks"], cwd=PROJECT,
                         env=workspace.env, capture_output=True, text=True, timeout=300)
    assert "no trainer left over from an earlier run" in dry.stdout, dry.stdout[-3000:]
    assert str(run_dir) in dry.stdout and "would stop at 'no trainer left over" in dry.stdout, dry.stdout[-3000:]
