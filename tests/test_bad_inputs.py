"""Every bad input is one line, exit 2 (or its outcome's code), and changes nothing (issue 27).

A table of bad inputs (issue 27's list and the rest of every task's flags, from the flag tables in tasks.py and
sessions/run/level.py) run through the README's pip install (tests/test_readme_install.py's venv), each against a
fresh fixture workspace whose files are compared before and after.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import PROJECT
from tests.test_readme_install import readme_venv  # noqa: F401 - the fixture

LOG = str(PROJECT / "tests/logs/pass_1step_tqdm.log")

# (argv, expected exit code, a fragment of the one error line); <ws> is the workspace root.
BAD: list[tuple[tuple[str, ...], int, str]] = [
    # judge
    (("judge", "--level", "abc", "--log", LOG), 2, "--level must be an integer, got 'abc'"),
    (("judge", "--steps", "abc", "--log", LOG), 2, "--steps must be an integer, got 'abc'"),
    (("judge", "--exit-code", "abc", "--log", LOG), 2, "--exit-code must be an integer, got 'abc'"),
    (("judge", "--steps=-3", "--log", LOG), 2, "--steps must be between 1 and"),
    (("judge", "--steps", "0", "--log", LOG), 2, "--steps must be between 1 and"),
    (("judge", "--level", "7", "--log", LOG), 2, "--level must be between 0 and 5, got 7"),
    (("judge", "--level=-1", "--log", LOG), 2, "--level must be between 0 and 5"),
    (("judge", "--exit-code", "999", "--log", LOG), 2, "--exit-code must be between"),
    (("judge", "--log", "/nonexistent.log"), 2, "log file not found"),
    (("judge", "--log", "<ws>/home"), 2, "is not a regular file"),
    (("judge", "--log", "/dev/null"), 2, "is not a regular file"),
    (("judge",), 2, "log"),
    (("judge", "--log", LOG, "--bridge-repo", "<ws>/Megatron-Bridge"), 2, "--bridge-repo needs --level"),
    (("judge", "--log", LOG, "--bogus"), 2, "No idea what '--bogus' is"),
    (("judge", "--bogus"), 2, "No idea what '--bogus' is"),
    (("report", "--bogus"), 2, "No idea what '--bogus' is"),
    # doctor
    (("doctor", "--level", "abc"), 2, "--level must be an integer, got 'abc'"),
    (("doctor", "--level", "9"), 2, "--level must be between 0 and 5, got 9"),
    (("doctor", "--num-gpus=-1"), 2, "--num-gpus must be >= 0"),
    (("doctor", "--num-gpus", "x"), 2, "--num-gpus must be an integer"),
    (("doctor", "--json", "--timings"), 2, "--json and --timings contradict each other"),
    # report
    (("report",), 2, "run_dir"),
    (("report", "/nonexistent/run"), 2, "is not a run directory"),
    (("report", "<ws>/home"), 2, "is not a run directory (no run.json)"),
    (("report", "<ws>/truncated-run"), 2, "cannot be read back"),
    # levels
    (("level0", "--model", "not a model"), 2, "--model must look like ORG/NAME"),
    (("level0", "--num-gpus", "many"), 2, "--num-gpus must be an integer, got 'many'"),
    (("level0", "--num-gpus=-2"), 2, "--num-gpus must be >= 0"),
    (("level0", "--stall-timeout=-1"), 2, "--stall-timeout must be >= 0"),
    (("level0", "--stall-timeout", "nan"), 2, "--stall-timeout must be a finite number"),
    (("level0", "--stall-timeout", "soon"), 2, "--stall-timeout must be a number"),
    (("level2", "--variant", "sparse"), 2, "--variant must be one of dense, moe"),
    (("level4", "--feature", "foo"), 2, "--feature must be one of"),
    (("level5", "--steps", "abc"), 2, "--steps must be an integer"),
    (("level5", "--steps", "0"), 2, "--steps must be between 1 and 100, got 0"),
    (("level5", "--steps", "101"), 2, "--steps must be between 1 and 100, got 101"),
    (("level5", "--steps=-3"), 2, "--steps must be between 1 and 100, got -3"),
    (("level5", "--threshold", "garbage"), 2, "--threshold must look like METRIC>=VALUE"),
    (("level5", "--baseline", "/nonexistent/run"), 2, "is not a level run directory"),
    (("level0", "--skip-bridge-checks", "--bridge-tests", "tests/x.py"), 2,
     "--skip-bridge-checks and --bridge-tests contradict each other"),
    (("level0", "--skip-bridge-checks", "--allow-missing"), 2, "--skip-bridge-checks and --allow-missing"),
    (("level0", "--skip-bridge-checks", "--keep-going"), 2, "--skip-bridge-checks and --keep-going"),
    (("level0", "--bridge-tests", ","), 2, "--bridge-tests names no path"),
    (("level0", "--dummy-config", ""), 2, "--dummy-config needs a path"),
    (("level1", "--", "trainer.total_training_steps=5"), 2, "level 1 sets trainer.total_training_steps itself"),
    (("level1", "--", "trainer.save_freq=3"), 2, "level 1 sets trainer.save_freq itself"),
    (("level1", "--", "+trainer.resume_mode=disable"), 2, "level 1 sets trainer.resume_mode itself"),
    (("level1", "--", "trainer.default_local_dir=/tmp/x"), 2, "level 1 owns trainer.default_local_dir"),
    (("level5", "--", "trainer.total_training_steps=5"), 2, "use --steps N"),
    (("level0", "--", "notanoverride"), 2, "is not a Hydra override"),
    (("level0", "--", "=1"), 2, "'=1' after -- is not a Hydra override"),
    (("level0", "--", "+=1"), 2, "'+=1' after -- is not a Hydra override"),
    (("level0", "--", "~"), 2, "'~' after -- is not a Hydra override"),
    (("level0", "--", "--steps=1"), 2, "'--steps=1' after -- is not a Hydra override"),
    (("-f", "<ws>/no-such.yaml", "level0", "--dry-run"), 2, "runtime config (-f) <ws>/no-such.yaml: no such file"),
    (("level0", "--bogus-flag"), 2, "No idea what '--bogus-flag' is"),
    (("level0", "--steps", "3"), 2, "No idea what '--steps' is"),
    (("level4", "--script", "no/such/script.sh"), 2, "no such file under VERL_REPO"),
    (("level0", "--log-dir", "/proc/forbidden"), 2, "cannot be used"),
    (("nosuchtask",), 2, "No idea what 'nosuchtask' is"),
    # config files (invoke -f FILE: the same check as the project's invoke.yaml)
    (("-f", "<ws>/malformed.yaml", "level0", "--dry-run"), 2, "not a valid config file"),
    (("-f", "<ws>/unknown-key.yaml", "level0", "--dry-run"), 2, "unknown key(s): nmu_gpus (did you mean num_gpus?)"),
    (("-f", "<ws>/unknown-section-key.yaml", "level0", "--dry-run"), 2, "verl_e2e.bogus"),
    # plan
    (("plan", "--dry-run"), 2, "--dry-run needs --run"),
    (("plan", "--keep-going"), 2, "--keep-going needs --run"),
    (("plan", "--run", "--dry-run", "--keep-going"), 2, "contradict each other"),
    (("plan", "--model", "bad"), 2, "--model must look like ORG/NAME"),
    (("plan", "--skip-bridge-checks", "--bridge-tests", "x"), 2, "contradict each other"),
    (("plan", "--num-gpus", "x"), 2, "--num-gpus must be an integer"),
    # bisect
    (("bisect", "--good", "HEAD~1", "--max-steps", "abc", "level0"), 2, "--max-steps must be an integer"),
    (("bisect", "--good", "HEAD~1", "--max-steps", "0", "level0"), 2, "--max-steps must be >= 1"),
    (("bisect", "--good", "HEAD~1", "--repo", "nemo", "level0"), 2, "--repo must be one of bridge, verl"),
    (("bisect", "--good", "HEAD~1", "prep-data"), 2, "is not a level task"),
    (("bisect", "--good", "HEAD~1", "level0", "--bogus"), 2, "No idea what '--bogus' is"),
    (("bisect", "--good", "HEAD~1", "level5", "--steps", "abc"), 2, "--steps must be an integer"),
    (("bisect", "--good", "HEAD~1", "nosuchtask"), 2, "no task 'nosuchtask'"),
    (("bisect", "level0"), 2, "--good REF is required"),
    # remote (refused before any connection)
    (("remote",), 2, "host"),
    (("remote", "--host", "gpu01", "nosuchtask"), 2, "no task 'nosuchtask'"),
    (("remote", "--host", "gpu01", "level5", "--steps", "abc"), 2, "--steps must be an integer"),
    (("remote", "--host", "gpu01", "level0", "--bogus"), 2, "No idea what '--bogus' is"),
    (("remote", "--host", "gpu01", "--sync-only", "level0"), 2, "--sync-only runs nothing"),
    (("remote", "--host", "gpu01", "--sync-only", "--dry-run"), 2, "contradict each other"),
    (("remote", "--host", "gpu01;rm -rf /", "level0"), 2, "expected [user@]host[:port]"),
    # slurm (refused before sbatch/srun)
    (("slurm", "--dry-run", "nosuchtask"), 2, "no task 'nosuchtask'"),
    (("slurm", "--gpus", "abc", "--dry-run", "level0"), 2, "--gpus must be an integer"),
    (("slurm", "--cpus", "0", "--dry-run", "level0"), 2, "--cpus must be >= 1"),
    (("slurm", "--no-container", "--image", "x", "--dry-run", "level0"), 2, "--no-container and --image"),
    (("slurm", "--dry-run", "level0", "--num-gpus", "x"), 2, "--num-gpus must be an integer"),
    (("slurm", "--dry-run"), 2, "name the task"),
    (("slurm-status",), 2, "job"),
    (("slurm-status", "abc"), 2, "is not a Slurm job id"),
    (("slurm-logs", "abc"), 2, "is not a Slurm job id"),
    # data, model, modelopt
    (("prep-data", "--local-dataset-path", "/typo", "--dry-run"), 2, "does not exist"),
    (("download-model", "--model", "bad", "--dry-run"), 2, "--model must look like ORG/NAME"),
    (("download-model", "--revision", "", "--dry-run"), 2, "--revision needs a value"),
    (("install-modelopt", "--python", "", "--dry-run"), 2, "--python needs a value"),
    # help is not an error: exit 0, no task run (`-h` is no file name)
    (("judge", "-h"), 0, "Usage: inv[oke] [--core-opts] judge"),
    (("report", "-h"), 0, "Usage: inv[oke] [--core-opts] report"),
    (("judge", "--help"), 0, "Usage: inv[oke] [--core-opts] judge"),
]


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for path in root.rglob("*"):
        if path.name == "index" and ".git" in path.parts:  # `git status` refreshes its stat cache: no change
            continue
        try:
            st = path.lstat()
        except FileNotFoundError:
            continue
        out[str(path.relative_to(root))] = (st.st_size, st.st_mtime_ns if path.is_file() else 0)
    return out


def _prepare(ws) -> None:
    (ws.root / "malformed.yaml").write_text("a: [1\nb: 2\n")
    (ws.root / "unknown-key.yaml").write_text("nmu_gpus: 2\n")
    (ws.root / "unknown-section-key.yaml").write_text("verl_e2e:\n  bogus: 1\n")
    run = ws.root / "truncated-run"
    run.mkdir()
    (run / "run.json").write_text('{"level": 0, "runs": [')


def test_the_table_covers_issue_27_and_every_task():
    assert len(BAD) >= 60
    tasks = {argv[0] for argv, _, _ in BAD if not argv[0].startswith("-")}
    assert {"judge", "doctor", "report", "level0", "level1", "level2", "level4", "level5", "plan", "bisect",
            "remote", "slurm", "slurm-status", "slurm-logs", "prep-data", "download-model",
            "install-modelopt"} <= tasks


def test_every_bad_input_is_one_line_exit_2_and_changes_nothing(readme_venv, workspace):  # noqa: F811
    ws = workspace
    _prepare(ws)
    env = dict(ws.env, VIRTUAL_ENV=str(readme_venv), PATH=f"{readme_venv}/bin{os.pathsep}{ws.env['PATH']}")
    problems = []
    for argv, code, fragment in BAD:
        args = [a.replace("<ws>", str(ws.root)) for a in argv]
        fragment = fragment.replace("<ws>", str(ws.root))
        before = _snapshot(ws.root)
        proc = subprocess.run(["invoke", *args], cwd=PROJECT, env=env, capture_output=True, text=True, timeout=120)
        after = _snapshot(ws.root)
        out = proc.stdout + proc.stderr
        what = f"invoke {' '.join(argv)}: exit {proc.returncode}"
        if proc.returncode != code:
            problems.append(f"{what} (want {code}): {out[-500:]}")
        elif "Traceback" in out:
            problems.append(f"{what}: a traceback: {out[-800:]}")
        elif fragment not in out:
            problems.append(f"{what}: {fragment!r} not in: {out[-500:]}")
        elif code == 2 and (len(out.strip().splitlines()) != 1 or not out.startswith("error: ")):
            problems.append(f"{what}: not one `error:` line: {out!r}")
        elif before != after:
            changed = sorted(set(before.items()) ^ set(after.items()))[:5]
            problems.append(f"{what}: changed files: {changed}")
    assert not problems, f"{len(problems)} of {len(BAD)}:\n" + "\n".join(problems)


def test_help_into_a_closed_pipe_is_quiet(readme_venv):  # noqa: F811
    """`invoke judge --help | head -2`: no BrokenPipeError traceback."""
    env = dict(os.environ, PATH=f"{readme_venv}/bin{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run(["bash", "-c", "set -o pipefail; invoke judge --help | head -2; echo \"rc=${PIPESTATUS[0]}\""],
                          cwd=PROJECT, env=env, capture_output=True, text=True, timeout=60)
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
    assert proc.stdout.splitlines()[0].startswith("Usage: inv[oke] [--core-opts] judge")
    assert proc.stdout.strip().splitlines()[-1] in ("rc=0", "rc=141"), proc.stdout


def test_ctrl_c_while_invoke_loads_is_interrupted_130(readme_venv, tmp_path):  # noqa: F811
    """SIGINT once tasks.py has started loading (its first line ran: a marker file), before any task runs."""
    marker = tmp_path / "loaded"
    env = dict(os.environ, PATH=f"{readme_venv}/bin{os.pathsep}{os.environ['PATH']}",
               VERL_E2E_TEST_LOAD_MARKER=str(marker), VERL_E2E_TEST_LOAD_PAUSE_S="30")
    proc = subprocess.Popen(["invoke", "judge", "--log", LOG], cwd=PROJECT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, out + err
    assert err.strip() == "interrupted" and "Traceback" not in out + err


@pytest.mark.parametrize("argv", [["judge", "--log", LOG], ["level0", "--dry-run"]])
def test_a_bad_input_does_not_depend_on_cwd(readme_venv, workspace, argv, tmp_path):  # noqa: F811
    """From another directory, with --search-root: the same validation."""
    env = dict(workspace.env, PATH=f"{readme_venv}/bin{os.pathsep}{workspace.env['PATH']}")
    proc = subprocess.run(["invoke", "--search-root", str(PROJECT), argv[0], "--bogus"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and out.startswith("error: ") and "Traceback" not in out, out
    assert "No idea what '--bogus' is" in out and len(out.strip().splitlines()) == 1, out


def test_a_hydra_override_holding_a_space_stays_one_token(readme_venv, workspace):  # noqa: F811
    """invoke hands the overrides after `--` over space-joined; the tool keeps the tokens as given."""
    env = dict(workspace.env, PATH=f"{readme_venv}/bin{os.pathsep}{workspace.env['PATH']}")
    proc = subprocess.run(["invoke", "level0", "--dry-run", "--", "trainer.experiment_name=a b", "trainer.foo=1"],
                          cwd=PROJECT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    command = next(line for line in proc.stdout.splitlines() if line.startswith("bash "))
    assert command.endswith(" 'trainer.experiment_name=a b' trainer.foo=1"), command


@pytest.mark.parametrize("argv", [("--host", "gpu01;rm -rf /", "level0"), ("--host", "gpu01", "level0", "--bogus")])
def test_remote_refuses_bad_usage_before_it_looks_for_ssh_and_rsync(readme_venv, workspace, argv):  # noqa: F811
    """A host without ssh/rsync on PATH is Blocked (3), but a malformed --host or task line there is still bad
    usage (2): the user's typo is named first, not the missing tools."""
    env = dict(workspace.env, PATH=f"{readme_venv}/bin")  # the venv alone: no ssh, no rsync
    proc = subprocess.run(["invoke", "remote", *argv], cwd=PROJECT, env=env, capture_output=True, text=True,
                          timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and out.startswith("error: ") and len(out.strip().splitlines()) == 1, out
    assert "not found on PATH" not in out, out
