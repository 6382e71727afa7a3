"""`invoke slurm --nodes 2` on a real two-node Slurm on this machine (tests/slurm_cluster.py, multiple-slurmd: n1 and
n2, each slurmd in its own mount namespace, NodeAddr 127.0.0.2 / 127.0.0.3, one count-only GPU each) with a real
Ray head and worker across them (--no-container: no pyxis here).

What this proves: the allocation, one Ray node per Slurm node (two `ray start`, head then worker, joined into one
cluster of 2 nodes and 2 GPUs), the Bridge import probed on each node and a node whose view of the checkout differs
caught and named, the level run on the head with RAY_ADDRESS, NUM_GPUS=N×G and trainer.nnodes, and every node's Ray
stopped afterwards (also on Ctrl-C). What it cannot prove: NCCL between real GPUs on separate hosts — only a real
multi-node GPU cluster does.

Skipped when slurm-wlm is not installed or we are not root, unless VERL_E2E_REQUIRE_SLURM=1 (then it fails).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests import slurm_cluster

pytestmark = [pytest.mark.slurm, pytest.mark.ray, pytest.mark.timeout(600)]

LOCAL = ("--allow-local-logs", "--cpus", "1")
PROJECT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cluster2(tmp_path_factory):
    why = None
    if slurm_cluster.missing_binaries():
        why = f"Slurm programs missing: {', '.join(slurm_cluster.missing_binaries())} (apt-get install slurm-wlm)"
    elif os.geteuid() != 0:
        why = "the test Slurm daemons run as root"
    elif shutil.which("unshare") is None or shutil.which("nsenter") is None:
        why = "unshare/nsenter (util-linux) missing"
    if why:
        if os.environ.get("VERL_E2E_REQUIRE_SLURM") == "1":
            pytest.fail(why)
        pytest.skip(why)
    c = slurm_cluster.start_cluster(tmp_path_factory.mktemp("slurm2"), nodes=2)
    yield c
    c.stop()


@pytest.fixture
def ws(workspace, cluster2):
    workspace.env = {k: v for k, v in workspace.env.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
    workspace.env.update(cluster2.env, RAY_USAGE_STATS_ENABLED="0")
    yield workspace
    cluster2.unbind_all()


def _invoke(ws, *args: str, env: dict | None = None, timeout: float = 540) -> subprocess.CompletedProcess:
    """`invoke` as ws.invoke runs it, in its own session: on a timeout the whole tree (salloc, the driver, srun)
    is killed, not just invoke."""
    proc = subprocess.Popen([sys.executable, "-m", "invoke", *args], cwd=PROJECT, env={**ws.env, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        try:  # the group may hold leftovers even after invoke exited
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rdv(stdout: str) -> Path:
    return Path(re.search(r"rendezvous (.+)$", stdout, re.MULTILINE).group(1).strip())


def _assert_ray_gone(rdv: Path, nodes=("n1", "n2")) -> None:
    """Every node's Ray stopped: nothing left in the process group it ran in."""
    for node in nodes:
        pg = int((rdv / f"ray-{node}.pgid").read_text())
        with pytest.raises(ProcessLookupError):
            os.killpg(pg, 0)
        assert (rdv / f"stopped-{node}").exists(), node


def _run_dir(stdout: str) -> Path:
    found = re.findall(r"\[verl-e2e\] run directory: (.+)", stdout)
    assert found, stdout
    return Path(found[-1].strip())


def test_two_nodes_one_ray_cluster_level0_passes_on_the_head(ws):
    port = _port()
    out = _invoke(ws, "slurm", "--no-container", *LOCAL, "--nodes", "2", "--gpus-per-node", "1", "--ray-port",
                  str(port), "level0", "--skip-bridge-checks", env={"VERL_E2E_RAY_PROBE": "1"})
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    # one Ray cluster of both Slurm nodes (their own addresses), 2 × 1 GPUs
    assert f"ray cluster at 127.0.0.2:{port}: 2 nodes (127.0.0.2, 127.0.0.3), 2 GPUs" in out.stdout, text
    src = ws.bridge / "src"
    for node in ("n1", "n2"):
        assert re.search(rf"node {node} \(host [^)]+\): megatron.bridge from {re.escape(str(src))}/", out.stdout), text
    assert "worker import probe: all 2 nodes import megatron.bridge" in out.stdout
    run_dir = _run_dir(out.stdout)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["result"] == "Pass", summary
    env = json.loads((run_dir / "env.json").read_text())
    assert env["RAY_ADDRESS"] == f"127.0.0.2:{port}" and env["NUM_GPUS"] == "2"
    run = json.loads((run_dir / "run.json").read_text())
    # the level's own worker probe went through that cluster (one task per Ray node) and found this Bridge
    assert run["evidence"]["worker_bridge_file"].startswith(str(src)), run["evidence"]
    assert run["options"]["extra_overrides"][-2:] == ["trainer.nnodes=2", "trainer.n_gpus_per_node=1"]
    assert "trainer.nnodes=2" in (run_dir / "command.sh").read_text()
    # teardown: both nodes' Ray stopped, nothing of theirs left running
    assert "node n1: ray stopped" in out.stdout and "node n2: ray stopped" in out.stdout
    _assert_ray_gone(_rdv(out.stdout))


def test_a_node_that_imports_another_bridge_is_named_and_blocks(ws, cluster2, tmp_path):
    """n2 does not see the checkout (its BRIDGE_REPO/src is an empty mount there: a per-node mount mistake) and
    its PYTHONPATH has an installed Bridge behind it: the worker import on n2 resolves to that other Bridge."""
    other = tmp_path / "site-with-another-bridge"
    shutil.copytree(ws.bridge / "src" / "megatron", other / "megatron")
    empty = tmp_path / "empty"
    empty.mkdir()
    cluster2.bind_on("n2", empty, ws.bridge / "src")
    port = _port()
    out = _invoke(ws, "slurm", "--no-container", *LOCAL, "--nodes", "2", "--gpus-per-node", "1", "--ray-port",
                  str(port), "level0", "--skip-bridge-checks",
                  env={"PYTHONPATH": f"{ws.env['PYTHONPATH']}{os.pathsep}{other}"})
    text = out.stdout + out.stderr
    assert out.returncode == 3, text
    src = ws.bridge / "src"
    assert re.search(rf"node n2 \(host [^)]+\) imports megatron.bridge from {re.escape(str(other))}/megatron/bridge/"
                     rf"\S+, not from {re.escape(str(src))}: another Bridge", out.stdout), text
    assert re.search(rf"node n1 \(host [^)]+\): megatron.bridge from {re.escape(str(src))}/", out.stdout), text
    assert "1 of 2 node(s) would not run this Bridge: Blocked" in out.stdout
    assert not ws.run_dirs()  # the level never started
    _assert_ray_gone(_rdv(out.stdout))


def test_ctrl_c_stops_the_task_and_every_nodes_ray(ws):
    port = _port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "invoke", "slurm", "--no-container", *LOCAL, "--nodes", "2", "--gpus-per-node", "1",
         "--ray-port", str(port), "level0", "--skip-bridge-checks"],
        cwd=PROJECT, env={**ws.env, "FIXTURE_STEP_SLEEP": "60"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    lines = []
    try:
        for raw in proc.stdout:  # wait for the event: the level has started on the head of a 2-node cluster
            line = raw.decode(errors="replace")
            lines.append(line)
            if "run directory:" in line:
                break
        assert any("ray cluster at" in x for x in lines), "".join(lines)
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole foreground group
        rest = proc.stdout.read().decode(errors="replace")
        code = proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = "".join(lines) + rest
    assert code != 0, text
    assert "node n1: ray stopped" in text and "node n2: ray stopped" in text, text
    _assert_ray_gone(_rdv(text))


def test_detached_batch_job_on_two_nodes(ws):
    """--detach: the same driver as an sbatch job; followed to its end, with the exit file and run directory."""
    port = _port()
    out = _invoke(ws, "slurm", "--no-container", *LOCAL, "--detach", "--nodes", "2", "--gpus-per-node", "1",
                  "--ray-port", str(port), "level0", "--skip-bridge-checks")
    assert out.returncode == 0, out.stdout + out.stderr
    job = re.search(r"submitted batch job (\d+)", out.stdout).group(1)
    follow = _invoke(ws, "slurm-logs", job, "--follow")
    assert follow.returncode == 0, follow.stdout + follow.stderr
    assert "2 nodes (127.0.0.2, 127.0.0.3), 2 GPUs" in follow.stdout
    assert "ray cluster torn down; slurm step exit code 0" in follow.stdout
    assert (ws.log_dir / "slurm" / f"{job}.exit").read_text().strip() == "0"
    assert json.loads((_run_dir(follow.stdout) / "summary.json").read_text())["result"] == "Pass"
    _assert_ray_gone(_rdv(follow.stdout))


def test_jobid_two_node_allocation_detached_is_followed_by_step(ws, cluster2):
    """An existing two-node allocation (held open): the Ray cluster and the level as steps inside it."""
    held = cluster2.client("salloc", "--no-shell", "-N2", "--ntasks-per-node=1", "--gpus-per-node=1",
                           "--cpus-per-task=1", "--time=30", timeout=60)
    job = re.search(r"Granted job allocation (\d+)", held.stdout + held.stderr).group(1)
    try:
        out = _invoke(ws, "slurm", "--no-container", *LOCAL, "--jobid", job, "--detach", "--nodes", "2",
                      "--gpus-per-node", "1", "--ray-port", str(_port()), "level0", "--skip-bridge-checks")
        assert out.returncode == 0, out.stdout + out.stderr
        step = re.search(rf"started step ({job}\.\d+) in allocation {job}", out.stdout).group(1)
        follow = _invoke(ws, "slurm-logs", step, "--follow")
        assert follow.returncode == 0, follow.stdout + follow.stderr
        assert "2 nodes (127.0.0.2, 127.0.0.3), 2 GPUs" in follow.stdout
        env = json.loads((_run_dir(follow.stdout) / "env.json").read_text())
        assert env["SLURM_JOB_ID"] == job  # a step of the held allocation
        assert (ws.log_dir / "slurm" / f"{step}.exit").read_text().strip() == "0"
        _assert_ray_gone(_rdv(follow.stdout))
    finally:
        cluster2.client("scancel", job)
