"""Benchmark: the full verdict on a >= 1 GiB verl log vs the procedure's grep, plus our peak memory.

    .venv/bin/python bench/judge.py [--size-mib 1024 --small-mib 256 --dir /tmp --keep]

Builds realistic logs (wrapper trace, Ray start, model build, then many training steps with vLLM, worker, tqdm
and metrics lines, ANSI colours and `\\r` redraws, then shutdown noise) at two sizes, and for each size prints:
our `judge_log` wall time and peak RSS (measured in a fresh child process), and the wall time of
`grep -E "Training Progress|VANILLA_MBRIDGE|Traceback|RuntimeError|KeyError|ValueError" FILE | wc -l` on the
same file in the same run (piped: GNU grep stops at the first match when its output is /dev/null).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GREP_PATTERN = "Training Progress|VANILLA_MBRIDGE|Traceback|RuntimeError|KeyError|ValueError"
ESC = "\x1b"
TR = f"{ESC}[36m(TaskRunnerV1 pid=2101){ESC}[0m"
WD = f"{ESC}[36m(WorkerDict pid=2288, ip=10.0.0.4){ESC}[0m"
VS = f"{ESC}[36m(vLLMHttpServer pid=2301){ESC}[0m {ESC}[36m(EngineCore pid=2355){ESC}[0m"

HEAD = [
    "[verl-e2e] level 5 model=Qwen/Qwen2.5-0.5B",
    "+ USE_MBRIDGE=True", "+ VANILLA_MBRIDGE=False", "+ VALUE_VANILLA_MBRIDGE=False", "+ LORA_RANK=4",
    "+ TOTAL_TRAIN_STEPS={total}",
    "+ python3 -m verl.trainer.main_ppo actor_rollout_ref.actor.megatron.use_mbridge=True "
    "actor_rollout_ref.actor.megatron.vanilla_mbridge=False trainer.total_training_steps={total}",
    "2026-08-14 12:00:03,120\tINFO worker.py:1917 -- Started a local Ray instance.",
    f"{TR} torchtitan engine is not available: No module named 'torchtitan'",
    f"{TR} Total training steps: {{total}}",
    f"{WD} Enabling LORA with rank=4, alpha=32, dropout=0.0",
    f"{WD} PEFT Adapter Information:", f"{WD}   Total parameters: 494,032,768",
    f"{WD}   Adapter parameters: 1,081,344", f"{WD}   Trainable percentage: 0.22%",
    f"{VS} INFO 08-14 12:01:15 [core.py:77] Initializing a V1 LLM engine (v0.11.0) with config: model='/m'",
]


def step_block(step: int, total: int) -> str:
    """One training step's worth of console output (~30 KB, one metrics line)."""
    lines = []
    for i in range(40):
        lines.append(
            f"{VS} INFO 08-14 12:{i % 60:02d}:11 [loggers.py:123] Engine 000: Avg prompt throughput: 812.{i} "
            f"tokens/s, Avg generation throughput: 1934.2 tokens/s, Running: 12 reqs, Waiting: 0 reqs, GPU KV "
            f"cache usage: 3.1%, Prefix cache hit rate: 41.0%"
        )
        lines.append(
            f"{WD} [rank0]:[W814 12:00:{i % 60:02d}.1] Warning: using a deprecated path in the grad scaler "
            f"(function operator()) [repeated 3x across cluster]"
        )
        lines.append(f"{TR} \rTraining Progress:  {i}%|#    | {step - 1}/{total} [00:{i % 60:02d}<01:00, 1.2s/it]")
        lines.append(f"{WD} update_actor micro batch {i}: loss scale 1.0, tokens 4096, seqlen balance 0.98")
    metrics = " - ".join(
        [f"step:{step}", f"training/global_step:{step}", "training/epoch:np.int64(0)"]
        + [f"actor/metric_{k}:np.float64(0.{k:04d}123456)" for k in range(60)]
        + ["actor/pg_loss:np.float64(-0.0123)", "actor/grad_norm:0.4567", "critic/vf_loss:2.1e-03"]
    )
    lines.append(f"{TR} {metrics}")
    return "\n".join(lines) + "\n"


TAIL = [
    "/usr/lib/python3.12/multiprocessing/resource_tracker.py:279: UserWarning: resource_tracker: There appear to be "
    "1 leaked semaphore objects to clean up at shutdown",
    "Exception ignored in atexit callback: <function _exit_function at 0x7f3c2a1b2c20>",
    "Traceback (most recent call last):",
    "RuntimeError: DataLoader worker (pid 3412) is killed by signal: Killed. ",
]


def build_log(path: Path, size_mib: int) -> int:
    """Write a healthy multi-step log of about size_mib MiB; returns the number of steps."""
    block_size = len(step_block(1, 1).encode())
    total = max(1, (size_mib << 20) // block_size)
    with open(path, "w", encoding="utf-8", buffering=1 << 20) as out:
        out.write("\n".join(HEAD).format(total=total) + "\n")
        for step in range(1, total + 1):
            out.write(step_block(step, total))
        out.write("\n".join(TAIL) + "\n")
    return total


def judge_in_child(path: Path) -> dict:
    """Our full verdict in a fresh interpreter: wall time and the child's own peak RSS."""
    code = (
        "import json, resource, sys, time\n"
        "from sessions.verdict import judge_log\n"
        "t0, c0 = time.perf_counter(), time.process_time()\n"
        "v = judge_log(sys.argv[1])\n"
        "wall, cpu = time.perf_counter() - t0, time.process_time() - c0\n"
        "print(json.dumps({'wall_s': wall, 'cpu_s': cpu,"
        " 'peak_rss_mib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss"
        " / 1024, 'result': v.result, 'category': v.category, 'steps': v.steps_completed,"
        " 'expected': v.steps_expected, 'kept_steps': len(v.step_metrics)}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(path)], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)


def grep_wall(path: Path) -> tuple[float, float, int]:
    """(wall s, CPU s of grep + wc, matching lines). CPU time stays honest when other jobs share the cores."""
    before = os.times()
    t0 = time.perf_counter()
    done = subprocess.run(
        f'grep -E "{GREP_PATTERN}" "{path}" | wc -l', shell=True, capture_output=True, text=True, check=True
    )
    wall = time.perf_counter() - t0
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return wall, cpu, int(done.stdout.strip())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--small-mib", type=int, default=256)
    parser.add_argument("--dir", default="/tmp")
    parser.add_argument("--keep", action="store_true", help="keep the generated logs")
    args = parser.parse_args()
    rows = []
    for size in (args.small_mib, args.size_mib):
        path = Path(args.dir) / f"verl-judge-bench-{size}mib.log"
        steps = build_log(path, size)
        real_mib = path.stat().st_size / (1 << 20)
        subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)  # same page-cache state for both
        grep_runs = [grep_wall(path)]
        ours_runs = [judge_in_child(path)]
        grep_runs.append(grep_wall(path))
        ours_runs.append(judge_in_child(path))
        grep_s, grep_cpu, grep_lines = min(grep_runs)
        ours = min(ours_runs, key=lambda run: run["wall_s"])
        ours_cpu = min(run["cpu_s"] for run in ours_runs)
        grep_cpu = min(run[1] for run in grep_runs)
        rows.append((real_mib, steps, ours, grep_s, grep_lines))
        print(
            f"{real_mib:6.0f} MiB {steps:6d} steps | ours wall {ours['wall_s']:5.2f} s cpu {ours_cpu:5.2f} s, "
            f"peak RSS {ours['peak_rss_mib']:5.1f} MiB -> {ours['result']}/{ours['category']} "
            f"{ours['steps']}/{ours['expected']} | grep wall {grep_s:5.2f} s cpu {grep_cpu:5.2f} s "
            f"({grep_lines} lines) | ratio wall {ours['wall_s'] / grep_s:4.2f}x cpu {ours_cpu / grep_cpu:4.2f}x"
        )
        if not args.keep:
            os.unlink(path)
    (small, large) = rows[0][2], rows[-1][2]
    print(f"peak RSS {small['peak_rss_mib']:.1f} MiB at {rows[0][0]:.0f} MiB vs {large['peak_rss_mib']:.1f} MiB at "
          f"{rows[-1][0]:.0f} MiB (flat = memory does not grow with log size)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
