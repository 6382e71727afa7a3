"""`invoke slurm` against a real single-node Slurm (tests/slurm_cluster.py): the fixture level runs in an srun step
(--no-container: there is no pyxis here), attached and detached; slurm-status / slurm-logs with accounting off.

Skipped when slurm-wlm is not installed or we are not root, unless VERL_E2E_REQUIRE_SLURM=1 (then it fails).
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from tests import slurm_cluster

pytestmark = pytest.mark.slurm

# The workspace lives under pytest's /tmp: fine on one node, refused by default (logs must outlive the allocation)
LOCAL = ("--allow-local-logs", "--cpus", "1")


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    why = None
    if slurm_cluster.missing_binaries():
        why = f"Slurm programs missing: {', '.join(slurm_cluster.missing_binaries())} (apt-get install slurm-wlm)"
    elif os.geteuid() != 0:
        why = "the test Slurm daemons run as root"
    if why:
        if os.environ.get("VERL_E2E_REQUIRE_SLURM") == "1":
            pytest.fail(why)
        pytest.skip(why)
    c = slurm_cluster.start_cluster(tmp_path_factory.mktemp("slurm"))
    yield c
    c.stop()


@pytest.fixture
def ws(workspace, cluster):
    """The workspace, talking to the test cluster (and to no Slurm job pytest itself may run in)."""
    workspace.env = {k: v for k, v in workspace.env.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
    workspace.env.update(cluster.env)
    return workspace


def _run_dir(stdout: str) -> Path:
    found = re.findall(r"\[verl-e2e\] run directory: (.+)", stdout)
    assert found, stdout
    return Path(found[-1].strip())


def test_attached_level0_pass_through_srun(ws):
    # ROCR next to CUDA in the launcher's environment: the step drops it before the task starts
    out = ws.invoke("slurm", "--no-container", *LOCAL, "level0", "--skip-bridge-checks",
                    env={"ROCR_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": "0"})
    assert out.returncode == 0, out.stdout + out.stderr
    run_dir = _run_dir(out.stdout)
    assert run_dir.parent == ws.log_dir
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["result"] == "Pass" and summary["exit_code"] == 0
    env = json.loads((run_dir / "env.json").read_text())
    assert env["SLURM_JOB_ID"].isdigit() and "SLURM_STEP_ID" in env  # it really ran inside a Slurm step
    assert env["VERL_E2E_SLURM"] == "1" and env["LOG_DIR"] == str(ws.log_dir)
    assert "ROCR_VISIBLE_DEVICES" not in env
    assert "ROCR_VISIBLE_DEVICES=0 was set next to CUDA_VISIBLE_DEVICES=0: unset inside this step" in out.stdout
    run = json.loads((run_dir / "run.json").read_text())
    assert not any("ROCR" in n for n in run["notes"])  # the level never saw it: the step had dropped it
    assert "slurm step exit code 0" in out.stdout


def test_attached_level0_fail_returns_exit_1(ws):
    out = ws.invoke("slurm", "--no-container", *LOCAL, "level0", "--skip-bridge-checks",
                    env={"FIXTURE_FAIL": "provider"})
    assert out.returncode == 1, out.stdout + out.stderr
    summary = json.loads((_run_dir(out.stdout) / "summary.json").read_text())
    assert summary["result"] == "Fail"
    assert "slurm step exit code 1" in out.stdout


def test_node_local_log_dir_refused_without_the_override(ws):
    out = ws.invoke("slurm", "--no-container", "level0", "--skip-bridge-checks")
    assert out.returncode == 2
    assert out.stderr.startswith("error: LOG_DIR") and "node-local" in out.stderr
    assert not ws.log_dir.exists() or not any(ws.log_dir.iterdir())


def test_detach_returns_a_job_id_at_once_and_the_log_and_result_land_in_log_dir(ws, cluster):
    t0 = time.monotonic()
    out = ws.invoke("slurm", "--no-container", "--detach", *LOCAL, "--srun-args", "--job-name='detached test'",
                    "level0", "--skip-bridge-checks")
    submit_s = time.monotonic() - t0
    assert out.returncode == 0, out.stdout + out.stderr
    job = re.search(r"submitted batch job (\d+)", out.stdout).group(1)
    log = ws.log_dir / "slurm" / f"slurm-{job}.log"
    assert f"log: {log}" in out.stdout and f"invoke slurm-logs {job} --follow" in out.stdout
    assert submit_s < 15, submit_s  # sbatch returns at once; the level runs in the job

    # right after submit: running (or already done) — never an error
    status = ws.invoke("slurm-status", job)
    assert status.returncode == 0, status.stdout + status.stderr
    assert re.search(rf"job {job} \(level0 --skip-bridge-checks\): (PENDING|RUNNING|COMPLETING|COMPLETED)",
                     status.stdout), status.stdout

    follow = ws.invoke("slurm-logs", job, "--follow", timeout=240)
    assert follow.returncode == 0, follow.stdout + follow.stderr
    assert "Result" in follow.stdout and "slurm step exit code 0" in follow.stdout
    run_dir = _run_dir(log.read_text())
    assert run_dir.parent == ws.log_dir
    assert json.loads((run_dir / "summary.json").read_text())["result"] == "Pass"
    assert (ws.log_dir / "slurm" / f"{job}.exit").read_text().strip() == "0"
    record = json.loads((ws.log_dir / "slurm" / f"{job}.json").read_text())
    assert record["task_line"] == ["level0", "--skip-bridge-checks"]
    assert "--job-name=detached test" in record["sbatch"]

    # accounting is off (sacct refuses); the controller still holds the finished job
    assert cluster.client("sacct", "-j", job).returncode != 0
    done = ws.invoke("slurm-status", job, "--json")
    assert done.returncode == 0, done.stderr
    st = json.loads(done.stdout)
    assert st["slurm_state"] == "COMPLETED" and st["state_source"] == "scontrol"
    assert st["result"] == "Pass" and st["finished"] and st["run_dir"] == str(run_dir)

    # Slurm no longer knows the job (accounting off, and here the controller is unreachable): the job's own files
    # still answer
    dead = cluster.root / "dead-controller.conf"
    dead.write_text(re.sub(r"(?m)^SlurmctldPort=\d+$", "SlurmctldPort=1", cluster.conf.read_text()))
    gone = ws.invoke("slurm-status", job, env={"SLURM_CONF": str(dead)})
    assert gone.returncode == 0, gone.stdout + gone.stderr
    assert "Slurm no longer knows it" in gone.stdout
    assert "result: Pass (exit 0, from summary.json)" in gone.stdout and "step exit code: 0" in gone.stdout


def test_detached_fail_status_exit_code_is_the_tasks(ws):
    out = ws.invoke("slurm", "--no-container", "--detach", *LOCAL, "level0", "--skip-bridge-checks",
                    env={"FIXTURE_FAIL": "provider"})
    assert out.returncode == 0, out.stdout + out.stderr
    job = re.search(r"submitted batch job (\d+)", out.stdout).group(1)
    follow = ws.invoke("slurm-logs", job, "--follow", timeout=240)
    assert follow.returncode == 1, follow.stdout + follow.stderr
    status = ws.invoke("slurm-status", job)
    assert status.returncode == 1 and "result: Fail" in status.stdout, status.stdout


def test_status_of_an_unknown_job_is_a_one_line_error(ws):
    out = ws.invoke("slurm-status", "999999")
    assert out.returncode == 2 and out.stderr.startswith("error: job 999999: unknown to Slurm")
    out = ws.invoke("slurm-status", "12; rm -rf /")
    assert out.returncode == 2 and "not a Slurm job id" in out.stderr


@pytest.mark.parametrize("detach", [False, True])
def test_container_step_without_pyxis_is_blocked_not_a_verdict(ws, detach):
    """This cluster has no pyxis: the container step is refused up front (exit 3), nothing is submitted."""
    out = ws.invoke("slurm", *(["--detach"] if detach else []), *LOCAL, "level0", "--skip-bridge-checks")
    assert out.returncode == 3, out.stdout + out.stderr
    assert "no --container-image (the pyxis plugin is not installed)" in out.stderr and "--no-container" in out.stderr
    assert not ws.run_dirs() and not (ws.log_dir / "slurm").exists()


def test_srun_refusing_the_step_is_blocked_not_the_tasks_exit_code(ws):
    out = ws.invoke("slurm", "--no-container", *LOCAL, "--srun-args", "--nodelist=no-such-node", "level0",
                    "--skip-bridge-checks")
    assert out.returncode == 3, out.stdout + out.stderr
    assert "before the step started" in out.stderr and not ws.run_dirs()


def test_sbatch_refusing_the_job_is_blocked(ws):
    out = ws.invoke("slurm", "--no-container", "--detach", *LOCAL, "--partition", "no-such-partition", "level0")
    assert out.returncode == 3, out.stdout + out.stderr
    assert out.stderr.rstrip().splitlines()[-1].startswith("error: sbatch refused the job")
    assert not list((ws.log_dir / "slurm").glob("*.json"))


@pytest.fixture
def held(cluster):
    """An existing allocation, held open (`salloc --no-shell`), cancelled afterwards."""
    out = cluster.client("salloc", "--no-shell", "--cpus-per-task=1", "--time=30", "--job-name=held", timeout=60)
    m = re.search(r"Granted job allocation (\d+)", out.stdout + out.stderr)
    assert m, out.stdout + out.stderr
    job = m.group(1)
    yield job
    cluster.client("scancel", job)


def test_jobid_attached_step_runs_inside_the_existing_allocation(ws, held):
    out = ws.invoke("slurm", "--jobid", held, "--no-container", *LOCAL, "level0", "--skip-bridge-checks")
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"inside the existing allocation {held}: srun --jobid={held} --overlap" in out.stdout
    run_dir = _run_dir(out.stdout)
    assert run_dir.parent == ws.log_dir
    env = json.loads((run_dir / "env.json").read_text())
    assert env["SLURM_JOB_ID"] == held and env["SLURM_STEP_ID"].isdigit()  # a new step of that job, not a new job
    assert json.loads((run_dir / "summary.json").read_text())["result"] == "Pass"
    fail = ws.invoke("slurm", "--jobid", held, "--no-container", *LOCAL, "level0", "--skip-bridge-checks",
                     env={"FIXTURE_FAIL": "provider"})
    assert fail.returncode == 1, fail.stdout + fail.stderr
    assert json.loads((_run_dir(fail.stdout) / "summary.json").read_text())["result"] == "Fail"


def test_jobid_detached_step_is_followed_by_step(ws, held):
    out = ws.invoke("slurm", "--jobid", held, "--detach", "--no-container", *LOCAL, "level0",
                    "--skip-bridge-checks")
    assert out.returncode == 0, out.stdout + out.stderr
    step = re.search(rf"started step ({held}\.\d+) in allocation {held}", out.stdout).group(1)
    assert f"invoke slurm-logs {step} --follow" in out.stdout
    follow = ws.invoke("slurm-logs", step, "--follow", timeout=240)
    assert follow.returncode == 0, follow.stdout + follow.stderr
    assert "slurm step exit code 0" in follow.stdout
    log = ws.log_dir / "slurm" / f"slurm-{step}.log"
    run_dir = _run_dir(log.read_text())
    assert json.loads((run_dir / "env.json").read_text())["SLURM_JOB_ID"] == held
    assert (ws.log_dir / "slurm" / f"{step}.exit").read_text().strip() == "0"
    status = ws.invoke("slurm-status", step, "--json")
    assert status.returncode == 0, status.stdout + status.stderr
    st = json.loads(status.stdout)
    assert st["finished"] and st["result"] == "Pass" and st["run_dir"] == str(run_dir)
    assert st["task_line"] == ["level0", "--skip-bridge-checks"]


def test_jobid_of_no_running_allocation_is_blocked(ws):
    out = ws.invoke("slurm", "--jobid", "999999", "--no-container", *LOCAL, "level0")
    assert out.returncode == 3, out.stdout + out.stderr
    assert "allocation 999999 is unknown to Slurm" in out.stderr and not ws.run_dirs()
