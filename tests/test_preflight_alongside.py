"""The heavy preflight probes run alongside verl's start (issue 24.7: on a cold GPU host they took 30-40 s of a
Level 0's 39 s overhead): a Blocked answer stops verl and Blocks the level, whenever it comes; a passing answer
lets the run go on; --probe-first waits for them; the dry-run says which it will be.

The fixture Bridge's `training/config.py` (imported only by the probe: verl imports it inside a function the
fixture trainer never calls) waits for a gate file before it imports, so each test decides by an event — the
trainer's log line — when the probe answers, not by wall time."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import PROJECT, deliverable, only_run_dir, summary_of

GATED_IMPORT = """import os, time
_gate, _deadline = os.environ.get("FIXTURE_PROBE_GATE"), time.monotonic() + 180
while _gate and not os.path.exists(_gate) and time.monotonic() < _deadline:
    time.sleep(0.05)
{after}
"""


def _gate_the_probe(workspace, after: str) -> None:
    """verl's model build imports Bridge's training.config inside a function; that module waits for the gate."""
    (workspace.verl / "verl/utils").mkdir(parents=True, exist_ok=True)
    (workspace.verl / "verl/utils/megatron_utils.py").write_text(
        "def build():\n    from megatron.bridge.training.config import DistributedDataParallelConfig\n")
    training = workspace.bridge / "src/megatron/bridge/training"
    training.mkdir(exist_ok=True)
    (training / "__init__.py").write_text("")
    (training / "config.py").write_text(GATED_IMPORT.format(after=after))


def _start_level(workspace, tmp_path: Path, *args: str, **env: str) -> tuple[subprocess.Popen, Path]:
    gate = tmp_path / "gate"
    environ = {**workspace.env, "VERL_E2E_RAY_PROBE": "0", "FIXTURE_PROBE_GATE": str(gate), **env}
    proc = subprocess.Popen([sys.executable, "-m", "invoke", "level0", "--skip-bridge-checks", *args], cwd=PROJECT,
                            env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, gate


def _wait_for_log(workspace, proc: subprocess.Popen, needle: str, timeout: float = 120) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        logs = list(workspace.log_dir.glob("*-level0-*/verl.log"))
        if logs and needle in logs[0].read_text(errors="replace"):
            return logs[0]
        if proc.poll() is not None:
            raise AssertionError(f"the level ended before its log showed {needle!r}:\n{proc.stdout.read()}")
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"no {needle!r} in verl.log within {timeout:.0f}s")


def test_a_blocked_probe_stops_the_verl_it_started_alongside(workspace, tmp_path):
    _gate_the_probe(workspace, "import megatron.energon")
    proc, gate = _start_level(workspace, tmp_path, FIXTURE_FAIL="hang")
    log = _wait_for_log(workspace, proc, "Training Progress")  # verl is up while the probe still waits
    gate.touch()
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 3, out
    assert "running alongside verl's start" in out
    text = log.read_text()
    assert "[verl-e2e] blocked (preflight 'Bridge modules verl imports' Blocked): stopping the wrapper's" in text, text
    assert "wrapper exit code" in text  # the log is kept, complete up to the stop
    leftover = subprocess.run(["pgrep", "-f", f"verl.trainer.main_ppo.*{workspace.data}"], capture_output=True)
    assert leftover.returncode == 1, "the fake trainer survived the Blocked probe"
    md, summary = summary_of(log.parent)
    assert md.startswith("Result: Blocked - ") and "megatron-energon" in md, md
    assert summary["category"] == "env-dependency" and summary["exit_code"] == 3
    run = deliverable(summary, "verl Megatron backend run")
    assert run["status"] == "Blocked" and "started alongside the heavy probes, stopped after" in run["detail"], run
    assert deliverable(summary, "Requested variants")["status"] in ("Not requested", "Skipped")
    assert "(complete up to the preflight's stop)" in deliverable(summary, "Log capture")["detail"]
    assert summary["follow_ups"][0].startswith("fix the environment: ") and len(summary["follow_ups"]) == 1
    assert not any("interrupted" in x for x in summary["limitations"]), summary["limitations"]
    record = json.loads((log.parent / "run.json").read_text())
    assert record["heavy_alongside"] is True and record["blocked"]["while_verl_ran"] is True
    assert record["runs"][0]["termination"] == "blocked"
    assert any(c["name"] == "Bridge modules verl imports" and c["status"] == "blocked" for c in record["preflight"])


def test_a_probe_that_answers_blocked_after_verl_ended_still_blocks_the_level(workspace, tmp_path):
    _gate_the_probe(workspace, "import megatron.energon")
    proc, gate = _start_level(workspace, tmp_path)
    log = _wait_for_log(workspace, proc, "wrapper exit code")  # the fixture trainer passed and exited
    gate.touch()
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 3, out
    _, summary = summary_of(log.parent)
    assert summary["result"] == "Blocked" and summary["category"] == "env-dependency"
    assert summary["verdicts"]["main"]["result"] == "Pass"  # what the log alone says; preflight overrules it


def test_a_passing_probe_lets_the_run_go_on_and_the_report_says_when_each_happened(workspace, tmp_path):
    _gate_the_probe(workspace, "")
    proc, gate = _start_level(workspace, tmp_path, FIXTURE_STEP_SLEEP="0.5")
    log = _wait_for_log(workspace, proc, "Training Progress")
    gate.touch()
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    md, summary = summary_of(log.parent)
    assert summary["result"] == "Pass"
    record = json.loads((log.parent / "run.json").read_text())
    heavy = {c["name"]: c["status"] for c in record["preflight"]}
    assert heavy["megatron.bridge imports"] == "ok" and heavy["Bridge modules verl imports"] == "ok", heavy
    assert deliverable(summary, "Local Bridge import in verl")["status"] == "Pass"  # the import did run
    started = record["runs"][0]["started"] - record["preflight_started"]
    answered = record["evidence"]["preflight_timings"]["total_s"]
    assert started < answered, (started, answered)  # verl went first: the probes' time is off the critical path
    assert any("ran alongside verl's start" in n for n in summary["notes"]), summary["notes"]


def test_probe_first_waits_and_a_cached_answer_is_not_overlapped(workspace, tmp_path):
    _gate_the_probe(workspace, "")
    (tmp_path / "gate").touch()  # the probe answers at once
    dry = workspace.invoke("level0", "--skip-bridge-checks", "--dry-run",
                           env={"VERL_E2E_RAY_PROBE": "0", "FIXTURE_PROBE_GATE": str(tmp_path / "gate")})
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "run alongside verl's start" in dry.stdout  # nothing cached yet: the run would overlap
    first = workspace.invoke("level0", "--skip-bridge-checks", "--probe-first",
                             env={"VERL_E2E_RAY_PROBE": "0", "FIXTURE_PROBE_GATE": str(tmp_path / "gate")})
    assert first.returncode == 0, first.stdout + first.stderr
    record = json.loads((only_run_dir(workspace) / "run.json").read_text())
    assert record["heavy_alongside"] is False and "running alongside" not in first.stdout
    again = workspace.invoke("level0", "--skip-bridge-checks", "--dry-run",
                             env={"VERL_E2E_RAY_PROBE": "0", "FIXTURE_PROBE_GATE": str(tmp_path / "gate")})
    assert "run alongside verl's start" not in again.stdout  # the answers are cached now: nothing to overlap


@pytest.mark.ray
def test_the_ray_probe_runs_alongside_verl_on_its_own_cluster(workspace, tmp_path):
    """The default path (the Ray worker probe starts a throwaway local cluster): `ray stop --force` runs before
    the probes, not at verl's launch, where it would kill the probe's cluster mid-answer."""
    _gate_the_probe(workspace, "")
    proc, gate = _start_level(workspace, tmp_path, VERL_E2E_RAY_PROBE="1", FIXTURE_STEP_SLEEP="0.5")
    log = _wait_for_log(workspace, proc, "Training Progress")
    gate.touch()
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out
    record = json.loads((log.parent / "run.json").read_text())
    heavy = {c["name"]: (c["status"], c["detail"]) for c in record["preflight"]}
    assert heavy["Ray worker imports the local Bridge"][0] == "ok", heavy
    text = log.read_text()
    assert text.count("ray stop --force: exit") == 1, text  # once, before the probes; none at the launch
