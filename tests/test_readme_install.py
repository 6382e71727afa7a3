"""Every task through the README's own install: a fresh venv, `python3 -m pip install -e .` (pip, not uv).

pip and uv resolve this project's dependencies differently (pip: invoke 2.2 under fabric 3.2.3's `invoke<3` cap;
uv: invoke 3 with fabric 3.2.2). `nox -s tests` runs the rest of the suite on uv's pick; this file runs each task
on pip's, so a task that only works on one resolution fails CI. .ci/run makes the venv with the README's command and
names it in VERL_E2E_README_VENV; without it, the venv is made here the same way (needs the package index).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PROJECT
from tests.remote_fixtures import sshd  # noqa: F401
from tests.sshd import DIRECT_ALIAS

README_INSTALL = "python3 -m pip install -e ."
VENV_ENV = "VERL_E2E_README_VENV"
TASKS = ["doctor", "download-model", "install-modelopt", "judge", "level0", "level1", "level2", "level3", "level4",
         "level5", "plan", "prep-data", "remote", "report", "slurm", "slurm-logs", "slurm-status"]


@pytest.fixture(scope="session")
def readme_venv(tmp_path_factory) -> Path:
    """The venv the README's install made (.ci/run's), else one made here with the same command."""
    given = os.environ.get(VENV_ENV)
    if given:
        venv = Path(given)
        assert (venv / "bin" / "invoke").is_file(), f"{VENV_ENV}={given} has no bin/invoke"
        return venv
    venv = tmp_path_factory.mktemp("readme") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # the README's command word for word, in that venv (activated, as a user would)
    subprocess.run(["bash", "-c", f". {venv}/bin/activate && {README_INSTALL}"], cwd=PROJECT, check=True,
                   capture_output=True)
    return venv


def test_the_readme_states_this_install_command():
    assert f"{README_INSTALL} && " in (PROJECT / "README.md").read_text()


def _run(venv: Path, env: dict[str, str], *argv: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """A command of the activated venv, from the project root."""
    env = dict(env, VIRTUAL_ENV=str(venv), PATH=f"{venv}/bin{os.pathsep}{env.get('PATH', os.environ['PATH'])}")
    return subprocess.run(list(argv), cwd=PROJECT, env=env, capture_output=True, text=True, timeout=timeout)


def _ok(proc: subprocess.CompletedProcess, code: int = 0) -> str:
    out = proc.stdout + proc.stderr
    assert proc.returncode == code and "Traceback" not in out, f"exit {proc.returncode}\n{out[-4000:]}"
    return out


def test_pip_resolution_is_what_the_code_was_checked_on(readme_venv):
    """What pip installed: a supported invoke with a fabric that accepts it, uv and matplotlib (level 5 plot)."""
    probe = ("import importlib.metadata as m, json; print(json.dumps({d: m.version(d) for d in "
             "('invoke', 'fabric', 'uv', 'matplotlib')}))")
    versions = json.loads(_ok(_run(readme_venv, dict(os.environ), "python", "-c", probe)))
    assert versions["invoke"].split(".")[0] in ("2", "3"), versions  # env/protocol/cli.py hooks invoke 2.2 and 3.x
    assert _ok(_run(readme_venv, dict(os.environ), "uv", "--version")).startswith("uv ")


def test_every_task_is_listed_and_has_help(readme_venv):
    """The README's tasks at least; and every task listed (also ones added later) answers --help, before or after
    its name (`invoke judge --help` must not become `--log --help`)."""
    listed = _ok(_run(readme_venv, dict(os.environ), "invoke", "--list"))
    names = re.findall(r"^  (\S+)", listed, flags=re.M)
    assert set(TASKS) <= set(names), names
    for task in names:
        before = _ok(_run(readme_venv, dict(os.environ), "invoke", "--help", task))
        assert before.startswith(f"Usage: inv[oke] [--core-opts] {task} [--options]"), before
        assert _ok(_run(readme_venv, dict(os.environ), "invoke", task, "--help")) == before, task


def test_nox_sessions_are_listed(readme_venv):
    listed = _ok(_run(readme_venv, dict(os.environ), "nox", "-l"))
    assert all(f"* {s}" in listed or f"- {s}" in listed for s in ("tests", "lint", "bridge_unit", "verl")), listed


@pytest.mark.parametrize("level", ["level0", "level1", "level2", "level3", "level4", "level5"])
def test_level_dry_run_takes_the_overrides_after_double_dash(readme_venv, workspace, level):
    out = _ok(_run(readme_venv, workspace.env, "invoke", level, "--dry-run", "--", "trainer.foo=1"))
    commands = [line for line in out.splitlines() if line.startswith("bash ")]
    assert commands and all(line.endswith(" trainer.foo=1") for line in commands), out[-3000:]
    assert workspace.run_dirs() == []


def test_slurm_dry_run_level0(readme_venv, workspace):
    out = _ok(_run(readme_venv, workspace.env, "invoke", "slurm", "--dry-run", "--allow-local-logs", "level0",
                   "--model", "Qwen/Qwen2.5-0.5B", "--", "trainer.foo=1"))
    assert "exec python3 -m nox -s verl -- level0 --model Qwen/Qwen2.5-0.5B -- trainer.foo=1" in out


@pytest.mark.ssh
def test_remote_sync_only_and_dry_run(readme_venv, workspace, sshd, tmp_path):  # noqa: F811
    remote_root = tmp_path / "remote"
    common = ("invoke", "remote", "--host", DIRECT_ALIAS, "--ssh-config", str(sshd.ssh_config), "--remote-root",
              str(remote_root))
    dry = _ok(_run(readme_venv, workspace.env, *common, "--dry-run", "level0", "--", "trainer.foo=1"))
    assert "trainer.foo=1" in dry and not remote_root.exists()
    _ok(_run(readme_venv, workspace.env, *common, "--sync-only", timeout=240))
    assert (remote_root / "verl-bridge-e2e" / "tasks.py").read_bytes() == (PROJECT / "tasks.py").read_bytes()
    assert (remote_root / "verl" / "tests/special_e2e/run_ppo_trainer_megatron.sh").is_file()


def test_judge_doctor_plan(readme_venv, workspace):
    judged = _ok(_run(readme_venv, workspace.env, "invoke", "judge", "--log",
                      str(PROJECT / "tests/logs/pass_1step_tqdm.log")))
    assert "Pass" in judged.splitlines()[0]
    doctor = _run(readme_venv, workspace.env, "invoke", "doctor")
    assert "Traceback" not in doctor.stdout + doctor.stderr and "✔" in doctor.stdout, doctor.stdout[-3000:]
    _ok(_run(readme_venv, workspace.env, "invoke", "plan", "--base", "HEAD", "--json"))


def test_data_and_model_tasks_dry_run(readme_venv, workspace, tmp_path):
    out = _ok(_run(readme_venv, workspace.env, "invoke", "prep-data", "--out", str(tmp_path / "gsm8k"), "--dry-run"))
    assert "examples/data_preprocess/gsm8k.py" in out and not (tmp_path / "gsm8k").exists()
    out = _ok(_run(readme_venv, workspace.env, "invoke", "download-model", "--model", "Qwen/Qwen2.5-0.5B",
                   "--scratch", str(tmp_path / "scratch"), "--dry-run"))
    assert f"MODEL_PATH={tmp_path / 'scratch' / 'Qwen/Qwen2.5-0.5B'}" in out
    _ok(_run(readme_venv, workspace.env, "invoke", "install-modelopt", "--dry-run", "--log-dir", str(tmp_path)))
