"""Shared test fixtures: fresh fixture checkouts, data, models and a way to run the real `invoke`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.fixtures import repos

PROJECT = Path(__file__).resolve().parent.parent

# ../shared/real-logs: this project's development set of real verl logs, beside the checkout (CI has it; a fresh
# clone elsewhere does not). VERL_E2E_REAL_LOGS points elsewhere; VERL_E2E_REQUIRE_REAL_LOGS=1 (.ci/run) turns a
# missing folder from a skip into a failure.
REAL_LOGS = Path(os.environ.get("VERL_E2E_REAL_LOGS") or PROJECT.parent / "shared" / "real-logs")
REQUIRE_REAL_LOGS = "VERL_E2E_REQUIRE_REAL_LOGS"


def real_logs() -> Path:
    """The real-log folder, or skip (fail where VERL_E2E_REQUIRE_REAL_LOGS=1) with the reason."""
    if (REAL_LOGS / "INDEX.tsv").is_file():
        return REAL_LOGS
    why = (f"{REAL_LOGS} is absent (the real verl logs beside the checkout, ../shared/real-logs; "
           f"VERL_E2E_REAL_LOGS=DIR points elsewhere)")
    if os.environ.get(REQUIRE_REAL_LOGS) == "1":
        pytest.fail(f"{why}; {REQUIRE_REAL_LOGS}=1 requires it")
    pytest.skip(why)


# Tests that share one resource run in one xdist worker (`--dist loadgroup`): the Slurm cluster (one per host),
# the test sshd (one per module; cheaper once), and every test that starts Ray daemons — the Ray probe's throwaway
# clusters and the two-node Slurm's Ray head and worker share one group: two Ray clusters at once on two loaded cores
# missed their raylet heartbeats (seen: the two-node batch job lost its raylet socket beside a Ray probe test).
# Level runs do not call the real `ray stop --force` in tests (the ray_shim fixture), so they may run beside them.
GROUPS = {"slurm": "slurm-ray", "ssh": "sshd", "ray": "slurm-ray"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        for marker, group in GROUPS.items():
            if item.get_closest_marker(marker) is not None and item.get_closest_marker("xdist_group") is None:
                item.add_marker(pytest.mark.xdist_group(group))
                break


def kill_tree(pid: int, sig: int = 9) -> None:
    """Kill a process, its process group and every descendant (by /proc's parent links)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    todo, seen = [pid], []
    while todo:
        p = todo.pop()
        seen.append(p)
        todo += children.get(p, [])
    for p in seen:
        for kill in (lambda q: os.killpg(q, sig), lambda q: os.kill(q, sig)):
            try:
                kill(p)
            except (OSError, ProcessLookupError):
                pass


@pytest.fixture
def reaper():
    """Register pids (or Popen objects) whose whole tree is killed when the test ends, passed or failed."""
    registered: list = []
    yield registered.append
    for item in registered:
        pid = getattr(item, "pid", item)
        if pid:
            kill_tree(int(pid))
        if hasattr(item, "wait"):
            try:
                item.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


@dataclass
class Workspace:
    root: Path
    bridge: Path
    verl: Path
    data: Path
    model: Path
    reward_model: Path
    log_dir: Path
    home: Path
    env: dict[str, str] = field(default_factory=dict)

    def invoke(self, *args: str, env: dict[str, str] | None = None, timeout: float = 240,
               check: bool = False) -> subprocess.CompletedProcess:
        """Run the real `invoke` of this project (as a user would, from the project root)."""
        proc = subprocess.run([sys.executable, "-m", "invoke", *args], cwd=PROJECT, env={**self.env, **(env or {})},
                              capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"invoke {args} exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        return proc

    def run_dirs(self) -> list[Path]:
        return sorted(p for p in self.log_dir.glob("*-level*") if p.is_dir())


def only_run_dir(ws: Workspace) -> Path:
    """The one level run directory a test made."""
    dirs = ws.run_dirs()
    assert len(dirs) == 1, dirs
    return dirs[0]


def summary_of(run_dir: Path) -> tuple[str, dict]:
    return (run_dir / "summary.md").read_text(), json.loads((run_dir / "summary.json").read_text())


def deliverable(summary: dict, name: str) -> dict:
    return next(d for d in summary["deliverables"] if d["name"] == name)


@pytest.fixture(scope="session")
def _templates(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("templates")
    repos.make_bridge_repo(root)
    verl = repos.make_verl_repo(root)
    repos.make_gsm8k(verl, root / "data" / "gsm8k")
    repos.make_model(root / "models" / "Qwen" / "Qwen2.5-0.5B")
    repos.make_model(root / "models" / "Skywork" / "Skywork-Reward-V2-Llama-3.2-1B", "llama")
    return root


@pytest.fixture(scope="session")
def ray_shim(tmp_path_factory) -> Path:
    """A `ray` first on the workspace PATH: `ray stop` is a no-op (the real one kills every Ray daemon of the user,
    the Ray tests' clusters too), anything else is the real `ray`."""
    real = shutil.which("ray", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    shim = tmp_path_factory.mktemp("ray-shim")
    body = f'exec {real} "$@"' if real else 'echo "ray: not installed" >&2; exit 127'
    (shim / "ray").write_text(f'#!/bin/sh\nif [ "$1" = stop ]; then echo "ray stop (test shim: harmless)"; exit 0; fi\n'
                              f'{body}\n')
    (shim / "ray").chmod(0o755)
    return shim


@pytest.fixture
def workspace(_templates, tmp_path, ray_shim) -> Workspace:
    """Fresh copies of both checkouts + data + models; env ready for a CPU-only fixture run (NUM_GPUS=1)."""
    root = tmp_path / "ws"
    shutil.copytree(_templates, root, symlinks=True)
    home = root / "home"
    home.mkdir()
    ws = Workspace(root=root, bridge=root / "Megatron-Bridge", verl=root / "verl", data=root / "data" / "gsm8k",
                   model=root / "models" / "Qwen" / "Qwen2.5-0.5B",
                   reward_model=root / "models" / "Skywork" / "Skywork-Reward-V2-Llama-3.2-1B",
                   log_dir=root / "logs", home=home)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("BRIDGE_", "VERL_", "MODEL_", "FIXTURE_", "RAY_", "ROCR_", "CUDA_VISIBLE"))
           # nox's uv backend exports its own project environment: a user's shell has none (the uv launcher
           # would otherwise probe nox's venv instead of VERL_REPO/.venv)
           and k != "UV_PROJECT_ENVIRONMENT"
           # pytest-xdist's workers export COLUMNS=80 LINES=24: a user's terminal tells its own size
           and k not in ("COLUMNS", "LINES")}
    env.update(
        HOME=str(home), BRIDGE_REPO=str(ws.bridge), VERL_REPO=str(ws.verl), MODEL_ID="Qwen/Qwen2.5-0.5B",
        MODEL_PATH=str(ws.model), RM_MODEL_PATH=str(ws.reward_model), TRAIN_FILES=str(ws.data / "train.parquet"),
        VAL_FILES=str(ws.data / "test.parquet"), LOG_DIR=str(ws.log_dir), NUM_GPUS="1",
        PYTHONPATH=str(repos.SITE),
        PATH=str(ray_shim) + os.pathsep + os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""),
        # Off for tests about something else (verdicts, reports, level rules, plumbing): the worker probe starts a
        # local Ray cluster (~15 s on 2 cores) and adds nothing to what they check. The tests of the path a user
        # takes turn it on (VERL_E2E_RAY_PROBE=1, marked `ray`): level 0 Pass and its Blocked-by-import cases
        # (test_level0.py), every cheap Blocked (they must start no Ray at all), tests/test_ray_probe.py.
        VERL_E2E_RAY_PROBE="0",
    )
    ws.env = env
    return ws
