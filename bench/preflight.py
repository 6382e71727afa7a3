"""Benchmark: how long preflight takes to answer (`invoke doctor`) on this machine's fixture checkouts.

    /work/venv/bin/python bench/preflight.py [--project DIR] [--repeat 2] [--ray-address ADDR]

Builds the test fixtures (Bridge with its Megatron-LM submodule, verl, GSM8K parquet, models) in a temporary folder
with the builders of `--project` (default: this checkout), then times `invoke doctor` of that project with the real
Ray worker probe on (a throwaway local Ray cluster, or `--ray-address`):

- cheap Blocked: nvidia-modelopt missing, data missing, model missing — each should stop before any heavy probe
  (`invoke doctor` and `invoke level0`, which stops at the first Blocked check);
- full, cold: a fresh LOG_DIR (no probe cache) — the first run after a change;
- full, warm: the same LOG_DIR again (the probe cache, when the project has one).

Prints one line per scenario (wall seconds, exit code) and, where the project's doctor supports `--timings`, the
per-check times of the last run of each scenario. Run it on a checkout before and after a change to compare; the
machine's load matters (2 shared cores here), so repeat and read the minimum.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build_fixtures(project: Path, root: Path) -> dict[str, Path]:
    sys.path.insert(0, str(project))
    from tests.fixtures import repos  # noqa: PLC0415 - the builders of the project under test

    repos.make_bridge_repo(root)
    verl = repos.make_verl_repo(root)
    repos.make_gsm8k(verl, root / "data" / "gsm8k")
    repos.make_model(root / "models" / "Qwen" / "Qwen2.5-0.5B")
    repos.make_model(root / "models" / "Skywork" / "Skywork-Reward-V2-Llama-3.2-1B", "llama")
    return {"bridge": root / "Megatron-Bridge", "verl": verl, "data": root / "data" / "gsm8k",
            "model": root / "models" / "Qwen" / "Qwen2.5-0.5B", "site": repos.SITE,
            "rm": root / "models" / "Skywork" / "Skywork-Reward-V2-Llama-3.2-1B"}


def base_env(fx: dict[str, Path], log_dir: Path, ray_address: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("BRIDGE_", "VERL_", "MODEL_", "RAY_", "ROCR_", "CUDA_VISIBLE"))}
    env.update(BRIDGE_REPO=str(fx["bridge"]), VERL_REPO=str(fx["verl"]), MODEL_ID="Qwen/Qwen2.5-0.5B",
               MODEL_PATH=str(fx["model"]), RM_MODEL_PATH=str(fx["rm"]), TRAIN_FILES=str(fx["data"] / "train.parquet"),
               VAL_FILES=str(fx["data"] / "test.parquet"), LOG_DIR=str(log_dir), NUM_GPUS="1",
               PYTHONPATH=str(fx["site"]), PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""),
               VERL_E2E_RAY_PROBE="1", RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
    if ray_address:
        env["RAY_ADDRESS"] = ray_address
    return env


def start_head(tmp: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAY_ADDRESS")}
    env.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
    ray = Path(sys.executable).parent / "ray"
    proc = subprocess.Popen([str(ray), "start", "--head", f"--port={port}", "--num-cpus=1", "--num-gpus=0",
                             "--include-dashboard=false", "--block"], stdout=open(tmp / "head.log", "wb"),
                            stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                time.sleep(3)  # the GCS listens before the raylet registers
                return proc, f"127.0.0.1:{port}"
        time.sleep(0.5)
    raise SystemExit("ray start --head did not listen within 120 s")


def supports_timings(project: Path) -> bool:
    proc = subprocess.run([sys.executable, "-m", "invoke", "--help", "doctor"], cwd=project, capture_output=True,
                          text=True)
    return "--timings" in proc.stdout


def run_task(project: Path, task: str, env: dict[str, str], timings: bool) -> tuple[float, int, str]:
    argv = [sys.executable, "-m", "invoke", task] + (["--timings"] if timings else [])
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=project, env=env, capture_output=True, text=True, timeout=600)
    return time.monotonic() - started, proc.returncode, proc.stdout + proc.stderr


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--project", type=Path, default=ROOT, help="checkout of this project to time (default: this one)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--ray-address", default=None, help="attach the worker probe to this cluster")
    ap.add_argument("--own-head", action="store_true",
                    help="start a one-CPU Ray head of our own (its own process group) and attach to it: on a shared "
                         "machine where others' `ray stop --force` kills throwaway clusters")
    ap.add_argument("--show", action="store_true", help="print doctor's output of the last run of each scenario")
    args = ap.parse_args()
    project = args.project.resolve()
    timings = supports_timings(project)
    tmp = Path(tempfile.mkdtemp(prefix="bench-preflight-"))
    head = None
    if args.own_head:
        head, args.ray_address = start_head(tmp)
    try:
        fx = build_fixtures(project, tmp / "fx")
        # (name, invoke task, env changes, warm); each cold scenario gets its own fresh LOG_DIR: no cache helps it
        scenarios: list[tuple[str, str, dict[str, str], bool]] = []
        blocked = {"modelopt missing": {"PYTHONPATH": ""},
                   "data missing": {"TRAIN_FILES": str(tmp / "nope" / "train.parquet")},
                   "model missing": {"MODEL_PATH": str(tmp / "nope" / "model")}}
        for what, extra in blocked.items():
            scenarios.append((f"doctor, cheap Blocked: {what}", "doctor", extra, False))
            scenarios.append((f"level0, cheap Blocked: {what}", "level0", extra, False))
        scenarios.append(("doctor, full, cold (fresh LOG_DIR)", "doctor", {}, False))
        scenarios.append(("doctor, full, warm (same LOG_DIR)", "doctor", {}, True))
        print(f"project {project} (doctor --timings: {'yes' if timings else 'no'}); {os.cpu_count()} CPUs; "
              f"Ray: {args.ray_address or 'throwaway local cluster'}")
        warm_dir = tmp / "logs-warm"
        for name, task, extra, warm in scenarios:
            walls, codes, out = [], [], ""
            for _ in range(args.repeat):
                log_dir = warm_dir if warm else tmp / f"logs-{time.time_ns()}"
                if warm and not warm_dir.exists():  # prime the cache once, not timed
                    run_task(project, task, dict(base_env(fx, warm_dir, args.ray_address), **extra), False)
                wall, code, out = run_task(project, task, dict(base_env(fx, log_dir, args.ray_address), **extra),
                                           timings and task == "doctor")
                walls.append(wall)
                codes.append(code)
            figures = " ".join(f"{w:.1f}" for w in walls)
            print(f"{name:<40} min {min(walls):5.1f} s  (runs: {figures}; exit {sorted(set(codes))})", flush=True)
            if args.show or (timings and task == "doctor"):
                shown = out.splitlines() if args.show else out.split("# timings", 1)[-1].splitlines()[1:]
                for ln in shown:
                    print(f"    {ln}")
    finally:
        if head is not None:  # only our own head: its process group
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(head.pid, sig)
                    head.wait(30)
                    break
                except ProcessLookupError:
                    break
                except subprocess.TimeoutExpired:
                    continue
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
