"""Level 0 end to end through the real `invoke level0`, against the fixture verl/Bridge checkouts."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import PROJECT, deliverable, only_run_dir, summary_of

SUMMARY_SHAPE = [
    r"Result: (Pass|Fail|Blocked) - .+",
    r"Requested coverage: Level 0 \(LoRA \+ DDP smoke\).*",
    r"Model: .+",
    r"",
    r"Deliverables:",
    r"- Bridge-side checks: (Pass|Fail|Blocked|Skipped|Not requested) - .+",
    r"- Local Bridge import in verl: (Pass|Fail|Blocked|Skipped|Not shown) - .+",
    r"- verl Megatron backend run: (Pass|Fail|Blocked|Skipped) - .+",
    r"- Requested variants: (Pass|Fail|Blocked|Skipped|Not requested) - .+",
    r"- Log capture: (Pass|Fail|Skipped) - .+",
    r"",
    r"Evidence:",
    r"- Bridge repo: .+",
    r"- verl repo: .+",
    r"- Command: .+",
    r"- Key lines: .+",
    r"",
    r"Limitations:",
]


# Another test run's `ray stop --force` (or a loaded shared machine) can kill a throwaway cluster while it starts:
# that attempt is Blocked by the environment, not by what the test checks, and is run again.
RAY_START_FAILED = re.compile(r"a throwaway local Ray cluster: (ray\.init failed|Ray probe exited|Ray probe did not)")


def invoke_with_ray_probe(workspace, *args: str) -> subprocess.CompletedProcess:
    for _ in range(3):
        proc = workspace.invoke(*args, env={"VERL_E2E_RAY_PROBE": "1"})
        if proc.returncode != 3 or not RAY_START_FAILED.search(proc.stdout):
            return proc
        shutil.rmtree(workspace.log_dir)  # the attempt's Blocked run directory
    return proc


@pytest.mark.ray  # the default path: the Ray worker probe on a throwaway local cluster, as a user runs it
def test_pass_writes_the_procedures_summary_and_the_run_directory(workspace):
    (workspace.bridge / "src/megatron/bridge/new_provider.py").write_text("X = 1\n")
    (workspace.verl / "README.local").write_text("local note\n")
    proc = invoke_with_ray_probe(workspace, "level0", "--skip-bridge-checks")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = only_run_dir(workspace)
    md, summary = summary_of(run_dir)
    lines = md.splitlines()
    for pattern, line in zip(SUMMARY_SHAPE, lines, strict=False):
        assert re.fullmatch(pattern, line), (pattern, line)
    assert lines[0].startswith("Result: Pass - Level 0 (LoRA + DDP smoke) passed")
    assert "Follow-ups:" in lines
    assert summary["result"] == "Pass" and summary["exit_code"] == 0
    assert deliverable(summary, "Bridge-side checks")["status"] == "Not requested"
    assert any("--skip-bridge-checks" in x for x in summary["limitations"])
    imp = deliverable(summary, "Local Bridge import in verl")
    assert imp["status"] == "Pass" and str(workspace.bridge / "src") in imp["detail"]
    assert f"Ray worker: megatron.bridge from {workspace.bridge}/src/megatron/bridge/__init__.py" in imp["detail"]
    assert deliverable(summary, "verl Megatron backend run")["status"] == "Pass"
    assert deliverable(summary, "Log capture")["detail"].startswith(str(run_dir / "verl.log"))
    # evidence: both commits and the dirty files of each checkout
    ev = summary["evidence"]
    assert "?? src/megatron/bridge/new_provider.py" in ev["bridge_repo"]
    assert "?? README.local" in ev["verl_repo"]
    assert re.search(r"@ [0-9a-f]{7}", ev["bridge_repo"]) and re.search(r"@ [0-9a-f]{7}", ev["verl_repo"])
    assert "VANILLA_MBRIDGE=False" in ev["key_lines"]
    for name in ("verl.log", "summary.md", "summary.json", "junit.xml", "env.json", "command.sh", "run.json"):
        assert (run_dir / name).is_file(), name
    log = (run_dir / "verl.log").read_text()
    assert "+ VANILLA_MBRIDGE=False" in log and "step:1 - training/global_step:1" in log
    assert "global_profiler.tool=null" in (run_dir / "command.sh").read_text()
    junit = (run_dir / "junit.xml").read_text()
    assert 'tests="5"' in junit and 'failures="0"' in junit and 'errors="0"' in junit


def test_report_rerenders_the_same_summary(workspace):
    assert workspace.invoke("level0", "--skip-bridge-checks").returncode == 0
    run_dir = only_run_dir(workspace)
    before = (run_dir / "summary.md").read_text()
    (run_dir / "summary.md").unlink()
    proc = workspace.invoke("report", str(run_dir))
    assert proc.returncode == 0, proc.stderr
    assert (run_dir / "summary.md").read_text() == before
    assert before in proc.stdout


def test_provider_exception_after_model_build_fails_with_first_error_and_hint(workspace):
    proc = workspace.invoke("level0", "--skip-bridge-checks", env={"FIXTURE_FAIL": "provider"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    md, summary = summary_of(only_run_dir(workspace))
    assert md.startswith("Result: Fail - ")
    run = deliverable(summary, "verl Megatron backend run")
    assert run["status"] == "Fail"
    assert "provider finalized with tensor_model_parallel_size=2" in run["detail"]
    assert "hint:" in run["detail"]
    assert summary["category"] == "provider"


@pytest.mark.parametrize(
    "case",
    # no modelopt: a warning for level 0 (it never saves), Blocked for level 1 — tests/test_preflight_issue24.py
    ["missing_data", "corrupt_data", "missing_model", "no_gpus", "wrong_bridge",
     # these two get past the cheap checks: the heavy phase starts a throwaway Ray cluster
     pytest.param("bridge_dependency", marks=pytest.mark.ray), pytest.param("energon_missing", marks=pytest.mark.ray)],
)
def test_preflight_failures_are_blocked_before_verl_starts(workspace, case, tmp_path):
    env: dict[str, str] = {}
    if case == "missing_data":
        env["TRAIN_FILES"] = str(tmp_path / "nope" / "train.parquet")
        expect = ("data", "invoke prep-data")
    elif case == "corrupt_data":
        bad = tmp_path / "train.parquet"
        bad.write_bytes(b"PAR1 this is not parquet")
        env["TRAIN_FILES"] = str(bad)
        expect = ("data", "not a readable parquet file")
    elif case == "missing_model":
        env["MODEL_PATH"] = str(tmp_path / "no-model")
        expect = ("data", "invoke download-model")
    elif case == "no_modelopt":
        env["PYTHONPATH"] = ""
        expect = ("env-dependency", "invoke install-modelopt")
    elif case == "no_gpus":
        env["NUM_GPUS"] = "0"
        expect = ("env-no-gpu", "GPUs")
    elif case == "wrong_bridge":
        other = tmp_path / "site-packages"
        (other / "megatron" / "bridge").mkdir(parents=True)
        (other / "megatron" / "bridge" / "__init__.py").write_text("")
        shutil.rmtree(workspace.bridge / "src" / "megatron" / "bridge")
        env["PYTHONPATH"] = f"{workspace.env['PYTHONPATH']}:{other}"
        expect = ("wrong-bridge", str(other))
    elif case == "bridge_dependency":
        init = workspace.bridge / "src/megatron/bridge/__init__.py"
        init.write_text("import transformer_engine_fixture_missing\n")
        expect = ("env-dependency", "transformer_engine_fixture_missing")
    else:  # energon_missing: verl's model build imports Bridge's training.config, which needs megatron.energon
        (workspace.verl / "verl/utils").mkdir(parents=True, exist_ok=True)
        (workspace.verl / "verl/utils/megatron_utils.py").write_text(
            "def build():\n    from megatron.bridge.training.config import DistributedDataParallelConfig\n")
        (workspace.bridge / "src/megatron/bridge/training").mkdir(exist_ok=True)
        (workspace.bridge / "src/megatron/bridge/training/__init__.py").write_text("")
        (workspace.bridge / "src/megatron/bridge/training/config.py").write_text("import megatron.energon\n")
        expect = ("env-dependency", "megatron-energon")
    # the default path: the Ray worker probe on (a throwaway local cluster), as a user runs it
    proc = workspace.invoke("level0", "--skip-bridge-checks", env={"VERL_E2E_RAY_PROBE": "1", **env})
    assert proc.returncode == 3, proc.stdout + proc.stderr
    run_dir = only_run_dir(workspace)
    assert not (run_dir / "verl.log").exists(), "verl must not start"
    md, summary = summary_of(run_dir)
    assert md.startswith("Result: Blocked - ") and "Not evidence against the Bridge provider" in md
    assert md.lower().count("not evidence against the bridge provider") == 1, md  # said once (issue 16.9)
    assert deliverable(summary, "Bridge-side checks")["status"] == "Not requested"  # --skip-bridge-checks
    assert summary["category"] == expect[0]
    assert expect[1] in md
    assert "Traceback" not in proc.stdout + proc.stderr
    # a cheap Blocked (files, find_spec) stops before any heavy probe: no import probe, no Ray cluster started;
    # only a failure that needs the import (the Bridge's own dependency) gets that far. Speed: bench/preflight.py
    record = json.loads((run_dir / "run.json").read_text())
    probes = set(record["evidence"]["preflight_timings"]["started"])
    if case in ("bridge_dependency", "energon_missing"):
        assert {"imports", "ray"} <= probes, probes
    else:
        assert not probes & {"imports", "ray"}, probes


def test_log_is_complete_after_the_wrapper_crashes(workspace):
    proc = workspace.invoke("level0", "--skip-bridge-checks", env={"FIXTURE_FAIL": "crash"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    run_dir = only_run_dir(workspace)
    log = (run_dir / "verl.log").read_text()
    assert "Training Progress:" in log  # the last line the trainer printed before it was killed
    assert "wrapper exit code 137" in log
    _, summary = summary_of(run_dir)
    assert deliverable(summary, "Log capture")["status"] == "Pass"


def test_sigint_to_invoke_stops_the_wrapper_group_and_keeps_the_log(workspace):
    env = {**workspace.env, "FIXTURE_FAIL": "hang"}
    proc = subprocess.Popen([sys.executable, "-m", "invoke", "level0", "--skip-bridge-checks"], cwd=PROJECT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        logs = list(workspace.log_dir.glob("*-level0-*/verl.log"))
        if logs and "Training Progress" in logs[0].read_text():
            log = logs[0]
            break
        time.sleep(0.2)
    assert log is not None, "the run never reached training"
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out  # interrupted (issue 27: one exit code per outcome)
    assert out.rstrip().splitlines()[-1] == f"interrupted; run directory: {log.parent}", out
    text = log.read_text()
    assert "Training Progress" in text and "interrupted (SIGINT)" in text
    assert "wrapper exit code" in text
    leftover = subprocess.run(["pgrep", "-f", f"verl.trainer.main_ppo.*{workspace.data}"], capture_output=True)
    assert leftover.returncode == 1, "the fake trainer survived the interrupt"
    md, summary = summary_of(log.parent)
    assert summary["category"] == "interrupted"
    # summary.json says what the process returned (the H200 run's summary said 3 while the process gave 130)
    assert summary["exit_code"] == 130 and summary["interrupted"] is True
    report = subprocess.run([sys.executable, "-m", "invoke", "report", str(log.parent)], cwd=PROJECT, env=env,
                            capture_output=True, text=True)
    assert report.returncode == 130, report.stdout + report.stderr
    assert "complete up to the interrupted" in deliverable(summary, "Log capture")["detail"]


def test_no_secret_value_lands_in_the_run_directory(workspace):
    token = "hf_FIXTURESECRET0123456789"
    proc = workspace.invoke("level0", "--skip-bridge-checks",
                            env={"HF_TOKEN": token, "WANDB_API_KEY": "wandb-secret-4242", "FIXTURE_PRINT_SECRET": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert token not in proc.stdout + proc.stderr
    run_dir = only_run_dir(workspace)
    for f in run_dir.rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            assert token.encode() not in data, f
            assert b"wandb-secret-4242" not in data, f
    assert json.loads((run_dir / "env.json").read_text())["HF_TOKEN"] == "***"
    assert "HF_TOKEN=***" in (run_dir / "verl.log").read_text()


def test_dry_run_prints_env_and_command_and_starts_nothing(workspace):
    proc = workspace.invoke("level0", "--dry-run", "--enforce-eager", "--", "trainer.foo=1")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "export VANILLA_MBRIDGE=False" in out and "export LORA_RANK=4" in out
    cmd = next(line for line in out.splitlines() if line.startswith("bash tests/special_e2e/"))
    assert "++ray_kwargs.ray_init.runtime_env.env_vars.PYTHONPATH=" in cmd
    assert cmd.endswith("actor_rollout_ref.rollout.enforce_eager=True trainer.foo=1")
    assert not workspace.log_dir.exists() or not workspace.run_dirs()


@pytest.mark.parametrize(
    "args,env,message",
    [
        (("level0",), {"BRIDGE_REPO": "/nonexistent/Megatron-Bridge"}, "does not exist"),
        (("level0",), {"VERL_REPO": "<verl>/verl"}, "not the top of a git checkout"),
        (("level0", "--model", "not a model id"), {}, "--model must look like ORG/NAME"),
        (("level0", "--num-gpus", "many"), {}, "--num-gpus must be an integer, got 'many'"),
        (("level2", "--variant", "sparse"), {}, "--variant must be one of dense, moe"),
        (("level0", "--bogus-flag"), {}, "No idea what '--bogus-flag' is"),
        (("level0",), {"VERL_REPO": ""}, "VERL_REPO is not set"),
        # a pseudo filesystem: root may write anywhere, yet nothing can be created there
        (("level0", "--log-dir", "/proc/forbidden"), {},
         "error: --log-dir /proc/forbidden cannot be used: /proc is on a pseudo filesystem (no storage)"),
        (("level0",), {"LOG_DIR": "<ws>/home/.bashrc-file/logs"},
         "error: LOG_DIR <ws>/home/.bashrc-file/logs cannot be used: <ws>/home/.bashrc-file is not a directory"),
        (("level0", "--stall-timeout", "-1"), {}, "error: --stall-timeout must be >= 0, got -1"),
        (("level0", "--dry-run"), {"STALL_TIMEOUT_MIN": "-0.5"}, "error: STALL_TIMEOUT_MIN must be >= 0, got -0.5"),
        (("level0", "--stall-timeout", "nan"), {}, "error: --stall-timeout must be a finite number, got 'nan'"),
        (("judge", "--log", "/dev/null"), {}, "error: --log /dev/null is not a regular file"),
        (("judge", "--log", "<ws>/home"), {}, "error: --log <ws>/home is not a regular file"),
        # given on the command line, a missing copy is a typo: no fallback to a hub download
        (("prep-data", "--local-dataset-path", "/typo", "--out", "<ws>/gsm8k-out"), {},
         "error: --local-dataset-path /typo does not exist"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(workspace, args, env, message):
    def here(text: str) -> str:
        return text.replace("<verl>", str(workspace.verl)).replace("<ws>", str(workspace.root))

    (workspace.home / ".bashrc-file").write_text("a file, not a folder\n")
    merged = dict(workspace.env, **{k: here(v) for k, v in env.items()})
    if env.get("VERL_REPO") == "":
        merged.pop("VERL_REPO")
    before = _tree(workspace.root)
    proc = subprocess.run([sys.executable, "-m", "invoke", *map(here, args)], cwd=PROJECT, env=merged,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    out = (proc.stdout + proc.stderr).strip()
    assert here(message) in out and len(out.splitlines()) == 1 and "Traceback" not in out, out
    assert _tree(workspace.root) == before  # nothing written (no run dir, no parquet, no log dir)


def _tree(root: Path) -> dict[str, int]:
    """Every path under root with its mtime: what a refused invocation must leave as it was (git's own index
    refresh, done by any `git status`, aside)."""
    return {str(p.relative_to(root)): p.lstat().st_mtime_ns for p in root.rglob("*")
            if ".git" not in p.relative_to(root).parts}


def test_missing_wrapper_script_is_bad_input(workspace):
    os.remove(workspace.verl / "tests/special_e2e/run_ppo_trainer_megatron.sh")
    proc = workspace.invoke("level0")
    assert proc.returncode == 2
    assert "has no tests/special_e2e/run_ppo_trainer_megatron.sh" in proc.stderr


def test_not_a_git_checkout_is_bad_input(workspace, tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    proc = workspace.invoke("level0", env={"BRIDGE_REPO": str(plain)})
    assert proc.returncode == 2 and "is not a git checkout" in proc.stderr


def test_dummy_model_and_missing_reward_model_are_limitations(workspace, tmp_path):
    cfg = tmp_path / "tiny.json"
    cfg.write_text('{"num_hidden_layers": 1}')
    shutil.rmtree(workspace.reward_model)
    proc = workspace.invoke("level0", "--skip-bridge-checks", "--dummy-config", str(cfg))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = only_run_dir(workspace)
    md, summary = summary_of(run_dir)
    assert "(dummy model)" in summary["coverage"]
    assert any("dummy model" in x for x in summary["limitations"])
    assert any("reward model disabled" in x for x in summary["limitations"])
    log = (run_dir / "verl.log").read_text()
    assert "reward.reward_model.enable=False" in log and "+ USE_DUMMY_MODEL=True" in log
    assert (workspace.home / "dummy_models/Qwen/Qwen2.5-0.5B/config.json").is_file()


def test_doctor_shows_every_check_and_exits_3_when_blocked(workspace, tmp_path):
    ok = workspace.invoke("doctor")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    for name in ("Bridge checkout", "megatron.bridge is the local checkout", "modelopt", "data TRAIN_FILES", "GPUs",
                 "nsys", "launcher"):
        assert name in ok.stdout
    bad = workspace.invoke("doctor", env={"TRAIN_FILES": str(tmp_path / "missing.parquet"), "NUM_GPUS": "0"})
    assert bad.returncode == 3
    assert bad.stdout.count("✘") >= 2  # doctor does not stop at the first blocked check


def test_stall_timeout_stops_a_hung_run_and_judges_it_timeout(workspace):
    # 0.05 min = 3 s without output while the fake trainer hangs in its first step
    proc = workspace.invoke("level0", "--skip-bridge-checks", "--stall-timeout", "0.05", env={"FIXTURE_FAIL": "hang"})
    assert proc.returncode == 1, proc.stdout + proc.stderr  # hung after the model was built: Fail, not Blocked
    run_dir = only_run_dir(workspace)
    md, summary = summary_of(run_dir)
    assert summary["category"] == "hang"
    log = (run_dir / "verl.log").read_text()
    assert "Training Progress" in log and "timeout (no output for 3s)" in log
    leftover = subprocess.run(["pgrep", "-f", f"verl.trainer.main_ppo.*{workspace.data}"], capture_output=True)
    assert leftover.returncode == 1, "the hung trainer survived the stall timeout"


def test_sigint_while_the_bridge_checks_run_leaves_a_blocked_summary_and_starts_no_verl(workspace):
    hang = workspace.bridge / "tests/unit_tests/models/test_hangs.py"
    hang.write_text("import time\n\n\ndef test_hangs():\n    time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-m", "invoke", "level0", "--keep-going", "--bridge-tests",
                             "tests/unit_tests/models/test_hangs.py"], cwd=PROJECT, env=workspace.env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        logs = list(workspace.log_dir.glob("*-level0-*/bridge_unit.log"))
        if logs and "running:" in logs[0].read_text():
            break
        time.sleep(0.3)
    else:
        proc.kill()
        raise AssertionError("bridge_unit never started pytest")
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out  # interrupted; the summary still says Blocked
    run_dir = only_run_dir(workspace)
    assert json.loads((run_dir / "summary.json").read_text())["exit_code"] == 130
    assert not (run_dir / "verl.log").exists(), "--keep-going must not start verl after a Ctrl-C"
    md, summary = summary_of(run_dir)
    assert deliverable(summary, "Bridge-side checks")["status"] == "Blocked"
    assert "interrupted" in deliverable(summary, "Bridge-side checks")["detail"]
    assert "running:" in (run_dir / "bridge_unit.log").read_text()


def test_each_limitation_is_stated_once_and_user_overrides_still_count(workspace):
    assert workspace.invoke("level0", "--skip-bridge-checks", "--no-reward-model").returncode == 0
    _, summary = summary_of(only_run_dir(workspace))
    lims = summary["limitations"]
    assert sum("reward model disabled" in x for x in lims) == 1, lims
    assert sum("global_profiler.tool=null" in x for x in lims) == 1, lims
    assert sum("gradient_accumulation_fusion=False" in x for x in lims) == 1, lims
    shutil.rmtree(workspace.log_dir)
    # a setting only the user's Hydra override made is known from the log alone: its limitation stays
    assert workspace.invoke("level0", "--skip-bridge-checks", "--",
                            "actor_rollout_ref.rollout.enforce_eager=True").returncode == 0
    _, summary = summary_of(only_run_dir(workspace))
    assert any("CUDA-graph capture not exercised" in x for x in summary["limitations"])
