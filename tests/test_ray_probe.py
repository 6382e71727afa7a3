"""Preflight 3 on a real Ray: a worker given the run's runtime_env PYTHONPATH imports the fixture Bridge checkout.

Ray tests are few and small (`num_cpus=1`): one head node started with `ray start --head --block` for the module
(stopped by killing its own process group, never `ray stop`, which would stop other people's clusters), and one
throwaway local cluster started by the probe itself.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray

from env.preflight.checklist import BLOCKED, OK, SKIPPED
from env.preflight.pythonpath import probe_imports
from env.preflight.ray_probe import _driver_pythonpath, check_ray_worker, probe_ray_worker
from env.settings import resolve
from sessions.run.level import LevelOptions, build_context
from tests import local_index

RAY = Path(sys.executable).parent / "ray"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RayHead:
    """A one-CPU head node of our own (`ray start --head --block` in its own process group).

    Other test runs on a shared machine call `ray stop --force`, which kills every Ray daemon of the user: when our
    head is found dead after a probe, `retry` restarts it and runs the probe again (only then, never on a wrong
    answer from a live cluster).
    """

    def __init__(self, folder: Path):
        self.folder = folder
        self.proc: subprocess.Popen | None = None
        self.address = ""
        self.restarts = 0

    def start(self) -> None:
        port = _free_port()
        log = self.folder / f"head-{port}.log"
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAY_ADDRESS")}
        # Ray >= 2.5x turns token auth on for new clusters (token in ~/.ray): the tests' drivers have another HOME
        env.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [str(RAY), "start", "--head", f"--port={port}", "--num-cpus=1", "--num-gpus=0",
                 "--include-dashboard=false", "--block"],
                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.address = f"127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.alive():
                return
            if self.proc.poll() is not None:
                pytest.fail(f"ray start --head exited {self.proc.returncode}: {log.read_text()[-2000:]}")
            time.sleep(0.5)
        pytest.fail("Ray head did not listen within 120 s")

    def alive(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            return False
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", int(self.address.rsplit(":", 1)[1]))) == 0

    def stop(self) -> None:
        # only the processes this fixture started: its own process group
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
                self.proc.wait(wait)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue

    def retry(self, fn, attempts: int = 3):
        for _ in range(attempts):
            try:
                result = fn(self.address)
            except subprocess.TimeoutExpired:
                if self.alive():
                    raise  # hung against a live cluster: a real failure
                result = None
            if self.alive():
                return result
            self.stop()
            self.restarts += 1
            self.start()
        return result


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    head = RayHead(tmp_path_factory.mktemp("ray"))
    head.start()
    yield head
    head.stop()


def _context(workspace, **flags):
    environ = dict(workspace.env, RAY_AUTH_MODE="disabled")
    settings = resolve({"python": sys.executable, **flags}, environ)
    ctx = build_context(LevelOptions(0), settings, probe=True)
    ctx.environ = environ
    return ctx


def test_driver_pythonpath_drops_only_the_runs_own_entries():
    own = ["/b/src", "/b/3rdparty/Megatron-LM", "/v"]
    assert _driver_pythonpath({"PYTHONPATH": "/b/src:/site:/v"}, own) == "/site"
    assert _driver_pythonpath({}, own) == ""
    # the stack on the user's PYTHONPATH (ray itself) stays with the driver (issue 16 item 8)
    composed = "/b/src:/b/3rdparty/Megatron-LM:/v:/opt/stack/site-packages"
    assert _driver_pythonpath({"PYTHONPATH": composed}, own) == "/opt/stack/site-packages"


def test_dry_run_and_switched_off_probe_run_nothing(workspace):
    ctx = _context(workspace)
    ctx.probe = False
    assert [c.status for c in check_ray_worker(ctx)] == [SKIPPED]
    ctx = _context(workspace)  # workspace env has VERL_E2E_RAY_PROBE=0
    checks = list(check_ray_worker(ctx))
    assert [c.status for c in checks] == [SKIPPED] and "VERL_E2E_RAY_PROBE=0" in checks[0].detail
    assert any("Ray worker import not probed" in x for x in ctx.limitations)
    assert "worker_bridge_file" not in ctx.evidence


@pytest.mark.ray
@pytest.mark.timeout(900)  # room for a restart of our head when another run killed it
def test_cluster_worker_right_wrong_and_foreign_pythonpath(workspace, ray_head, tmp_path):
    workspace.env["VERL_E2E_RAY_PROBE"] = "1"
    def probe(address):
        ctx = _context(workspace, ray_address=address)
        return ctx, list(check_ray_worker(ctx))

    ctx, checks = ray_head.retry(probe)
    main = checks[0]
    assert main.status == OK, main
    src = workspace.bridge / "src"
    assert ctx.evidence["worker_bridge_file"].startswith(str(src))
    assert ctx.evidence["worker_core_file"].startswith(str(workspace.bridge / "3rdparty/Megatron-LM"))
    assert ctx.evidence["ray_cluster_cpus"] == 1
    assert [c.status for c in checks[1:]] == [OK]

    # the runtime_env PYTHONPATH misses the checkout: the worker cannot import megatron.bridge
    def probe_nowhere(address):
        ctx = _context(workspace, ray_address=address)
        ctx.pythonpath = str(tmp_path / "nowhere")
        return ctx, list(check_ray_worker(ctx))

    ctx, [blocked] = ray_head.retry(probe_nowhere)
    assert blocked.status == BLOCKED and blocked.category == "env-ray-import"
    assert "No module named 'megatron'" in blocked.detail
    assert "runtime_env.env_vars.PYTHONPATH=" in blocked.fix and str(src) in blocked.fix
    assert "worker_bridge_file" not in ctx.evidence

    # another megatron.bridge first on the workers' path: the wrong Bridge
    other = tmp_path / "site-packages"
    (other / "megatron" / "bridge").mkdir(parents=True)
    (other / "megatron" / "bridge" / "__init__.py").write_text("")
    def probe_other(address):
        ctx = _context(workspace, ray_address=address)
        ctx.pythonpath = f"{other}:{ctx.pythonpath}"
        return list(check_ray_worker(ctx))

    [blocked] = ray_head.retry(probe_other)
    assert blocked.status == BLOCKED and blocked.category == "wrong-bridge" and str(other) in blocked.detail, blocked


@pytest.mark.ray
@pytest.mark.timeout(900)
def test_level0_records_the_workers_bridge(workspace, ray_head):
    proc = ray_head.retry(lambda address: workspace.invoke(
        "level0", "--skip-bridge-checks", "--ray-address", address,
        env={"VERL_E2E_RAY_PROBE": "1", "RAY_AUTH_MODE": "disabled"}, timeout=280))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    run_dir = workspace.run_dirs()[-1]
    record = json.loads((run_dir / "run.json").read_text())
    checks = {c["name"]: c for c in record["preflight"]}
    assert checks["Ray worker imports the local Bridge"]["status"] == "ok"
    worker_file = record["evidence"]["worker_bridge_file"]
    assert worker_file.startswith(str(workspace.bridge / "src"))
    assert checks["Ray CPUs"]["status"] == "warn" and "has 1 CPUs" in checks["Ray CPUs"]["detail"]
    summary = json.loads((run_dir / "summary.json").read_text())
    imp = next(d for d in summary["deliverables"] if d["name"] == "Local Bridge import in verl")
    assert imp["status"] == "Pass" and f"Ray worker: megatron.bridge from {worker_file}" in imp["detail"]


@pytest.mark.ray
def test_throwaway_local_cluster(workspace):
    """No --ray-address: the probe starts (and shuts down) its own one-CPU cluster; the driver gets no Bridge."""
    pythonpath = f"{workspace.bridge}/src:{workspace.bridge}/3rdparty/Megatron-LM:{workspace.verl}"
    environ = dict(workspace.env, PYTHONPATH=f"{pythonpath}:{workspace.env['PYTHONPATH']}")
    for _ in range(3):  # a `ray stop --force` from another test run can kill the throwaway cluster mid-probe
        probe = probe_ray_worker(sys.executable, pythonpath, None, environ=environ)
        if probe.driver_error is None:
            break
    assert probe.driver_error is None, probe.driver_error
    [worker] = probe.workers
    assert worker["pythonpath"] == pythonpath  # what runtime_env gave it
    assert worker["megatron.bridge"]["file"].startswith(str(workspace.bridge / "src"))


@pytest.mark.ray
@pytest.mark.timeout(900)
def test_stack_on_pythonpath_reaches_the_driver_and_a_failed_worker_import_is_never_ok(workspace, ray_head,
                                                                                        tmp_path):
    """Issue 16 item 8: the run's Python has no ray of its own, the stack (ray) is on the user's PYTHONPATH, as in
    an image with the stack on PYTHONPATH; the probe's driver keeps that entry. Issue 15: a worker that finds the
    checkout but fails to import it is Blocked, never ✔."""
    workspace.env["VERL_E2E_RAY_PROBE"] = "1"
    bare = local_index.fresh_venv(tmp_path / "bare", with_pip=False)
    stack = str(Path(ray.__file__).parent.parent)  # the site-packages holding ray
    workspace.env["PYTHONPATH"] = f"{stack}:{workspace.env['PYTHONPATH']}"

    def probe(address):
        environ = dict(workspace.env, RAY_AUTH_MODE="disabled")
        settings = resolve({"python": bare, "ray_address": address}, environ)
        ctx = build_context(LevelOptions(0), settings, probe=True)
        ctx.environ = environ
        ctx.pythonpath = f"{workspace.bridge}/src:{workspace.bridge}/3rdparty/Megatron-LM:{workspace.verl}:{stack}"
        # the worker resolves (find_spec); the import is the driver probe's, in the same Python (issue 24 item 7)
        ctx.imports = probe_imports(bare, ctx.pythonpath, cwd=workspace.verl)
        return list(check_ray_worker(ctx))

    checks = ray_head.retry(probe)
    assert checks[0].status == OK, checks[0]

    (workspace.bridge / "src/megatron/bridge/__init__.py").write_text("import transformer_engine_fixture_missing\n")
    [blocked] = ray_head.retry(probe)
    assert blocked.status == BLOCKED and "transformer_engine_fixture_missing" in blocked.detail, blocked
