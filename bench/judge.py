"""Benchmark: `invoke judge` on a 1 GiB verl log vs the procedure's grep, with the failure at the start, the middle
and the end of the log.

    /work/venv/bin/python bench/judge.py [--size-mib 1024 --dir /tmp --keep --placements start,middle,end,real,real-pass,metrics]

For each placement it builds a realistic log in --dir (wrapper trace, Ray start, model build, training steps with
vLLM, worker, tqdm and metrics lines, ANSI colours and `\\r` redraws; at the placement a CUDA OOM kills the run:
the worker's OOM line without a traceback header, the driver's Hydra/RayTaskError chain; after it the workers'
chatter goes on until the file has its size), then measures in the same run, each in a fresh process:
- ours: `invoke judge --log F --json` (process start included): wall, CPU (user+sys), peak RSS;
- grep: `grep -a -E "<the procedure's pattern>" F | wc -l` (the procedure's own log check): wall, CPU;
- prefilter alone: a Python process that imports the judge and runs its prefilter as a standalone pass (the
  judge's own chunk reader and literal scan over every byte, every hit line located and counted, nothing else done):
  about what a judge driven from Python pays before it reads a hit line (its imports cost ~0.1 s). It is no strict
  floor: the judge skims long stretches and does not locate every hit there.
More placements: `real` (the shared real logs, repeated to the size, each copy's digits renumbered so that
lines with numbers do not repeat byte for byte: see digit_permutation), `real-pass` (only the passing ones; both
are hundreds of thousands of short runs end to end: every copy restarts its steps and repeats its start-up facts),
`real-long` (one long healthy run: the step sections of the real passing logs in turn, steps counting on: see
build_real_long), `metrics` (a metrics line per step) and `storm` (half the file trains, then every
rank's NCCL watchdog, ERROR and frame lines, each distinct, to the end).
It prints the figures, the ratios (target: <= 2x grep CPU and wall, <= 64 MiB RSS) and whether the verdict and the
first error are the same in all three placements.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the project is run from its checkout, not installed
GREP_PATTERN = "Training Progress|VANILLA_MBRIDGE|Traceback|RuntimeError|KeyError|ValueError"
ESC = "\x1b"
TR = f"{ESC}[36m(TaskRunnerV1 pid=2101){ESC}[0m"
WD = f"{ESC}[36m(WorkerDict pid=2288, ip=10.0.0.4){ESC}[0m"
VS = f"{ESC}[36m(vLLMHttpServer pid=2301){ESC}[0m {ESC}[36m(EngineCore pid=2355){ESC}[0m"
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.80 GiB"

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
FAILURE = [
    f"{WD} {OOM}",  # the worker's line: no traceback header before it
    "Error executing job with overrides: ['trainer.total_training_steps={total}']",
    "Traceback (most recent call last):",
    '  File "/workspace/verl/verl/trainer/main_ppo.py", line 96, in run_ppo',
    "ray.exceptions.RayTaskError(OutOfMemoryError): ray::WorkerDict.actor_rollout_update_actor() (pid=2288)",
    OOM,
    "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.",
]


def chatter(step: int, total: int) -> list[str]:
    """One step's worth of worker output other than its metrics line (~30 KB)."""
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
    return lines


def metrics(step: int) -> str:
    return f"{TR} " + " - ".join(
        [f"step:{step}", f"training/global_step:{step}", "training/epoch:np.int64(0)"]
        + [f"actor/metric_{k}:np.float64(0.{k:04d}123456)" for k in range(60)]
        + ["actor/pg_loss:np.float64(-0.0123)", "actor/grad_norm:0.4567", "critic/vf_loss:2.1e-03"]
    )


def build_log(path: Path, size_mib: int, placement: str) -> int:
    """A log of about size_mib MiB whose run dies of a CUDA OOM at `placement`; returns the steps it trains."""
    block = len(("\n".join(chatter(1, 1)) + "\n" + metrics(1) + "\n").encode())
    total = max(2, (size_mib << 20) // block)
    trained = {"start": 0, "middle": total // 2, "end": total - 1}[placement]
    with open(path, "w", encoding="utf-8", buffering=1 << 20) as out:
        out.write("\n".join(HEAD).format(total=total) + "\n")
        for step in range(1, total + 1):
            out.write("\n".join(chatter(step, total)) + "\n")
            if step <= trained:
                out.write(metrics(step) + "\n")
            elif step == trained + 1:
                out.write("\n".join(FAILURE).format(total=total) + "\n")
    return trained


REAL_LOGS = Path(os.environ.get("VERL_E2E_REAL_LOGS") or ROOT.parent / "shared" / "real-logs")


def passing_logs() -> list[Path]:
    """The real logs INDEX.tsv labels `pass`, sorted."""
    with open(REAL_LOGS / "INDEX.tsv", encoding="utf-8") as index:
        rows = [line.split("\t") for line in index.read().splitlines()[1:]]
    passing = {row[0] for row in rows if len(row) > 2 and row[2].strip().lower() == "pass"}
    return [p for p in sorted(REAL_LOGS.glob("*.log")) if p.name in passing]


def build_real(path: Path, size_mib: int, passing_only: bool = False) -> int:
    """Real log content: the shared real logs (../shared/real-logs), concatenated and repeated to the size.
    passing_only: the logs INDEX.tsv labels `pass` only (what a long healthy run's log is made of: steps, vLLM and
    worker lines, few tracebacks; the issue's own measurement was "real passing verl logs repeated")."""
    logs = passing_logs() if passing_only else sorted(REAL_LOGS.glob("*.log"))
    if not logs:
        raise SystemExit(f"error: no real logs in {REAL_LOGS} (set VERL_E2E_REAL_LOGS)")
    corpus = b"".join(p.read_bytes().rstrip(b"\n") + b"\n" for p in logs)
    with open(path, "wb") as out:
        for copy in range(max(1, (size_mib << 20) // len(corpus))):
            out.write(corpus.translate(digit_permutation(copy)))
    return 0


STEP_NUMBER = re.compile(rb"(?<![\w/])(step:|training/global_step:)(\d+)")
VALIDATION_ONLY = re.compile(rb"step:\d+ - val[\w-]*/")
BAR_COUNT = re.compile(rb"(\| ?)\d+/\d+( \[)")
PLANNED = re.compile(rb"(Total training steps: |'total_training_steps': |TOTAL_TRAIN_STEPS=|total_training_steps=)-?\d+")


def long_run_parts(path: Path) -> tuple[bytes, bytes, bytes, int] | None:
    """A real passing log as (head, body, tail, training steps): the body runs from its first step line to its last
    (what a run repeats per step: rollout, worker, vLLM, sample and metrics lines); None below two training steps."""
    lines = path.read_bytes().rstrip(b"\n").split(b"\n")
    steps = [i for i, line in enumerate(lines) if STEP_NUMBER.search(line) and b" - " in line]
    trained = sum(not VALIDATION_ONLY.search(lines[i]) for i in steps)
    if trained < 2:
        return None
    first, last = steps[0], steps[-1]
    join = lambda part: b"".join(line + b"\n" for line in part)  # noqa: E731
    return join(lines[:first]), join(lines[first : last + 1]), join(lines[last + 1 :]), trained


def build_real_long(path: Path, size_mib: int) -> int:
    """One long healthy run made of real content: the head of the first real passing log with two or more step
    lines, then the bodies of all of them in turn, repeated to the size with the step numbers counting on (each
    body's `step:N`, `training/global_step:N` and tqdm `n/M`), then the first log's tail. The other digits are
    renumbered per copy (digit_permutation); the planned totals in the head are set to the steps written."""
    parts = [found for p in passing_logs() if (found := long_run_parts(p)) is not None]
    if not parts:
        raise SystemExit(f"error: no passing real logs with two or more steps in {REAL_LOGS}")
    head, _, tail, _ = parts[0]
    cycle = sum(len(body) for _, body, _, _ in parts)
    per_cycle = sum(n for _, _, _, n in parts)
    copies = max(1, ((size_mib << 20) - len(head) - len(tail)) // cycle)
    total = copies * per_cycle
    step = 0

    def renumbered(match: re.Match[bytes]) -> bytes:
        return match.group(1) + str(step).encode()

    with open(path, "wb") as out:
        out.write(PLANNED.sub(lambda m: m.group(1) + str(total).encode(), head))
        for copy in range(copies):
            table = digit_permutation(copy)
            for _, body, _, _ in parts:
                for line in body.translate(table).split(b"\n")[:-1]:
                    if STEP_NUMBER.search(line) and b" - " in line:
                        step += not VALIDATION_ONLY.search(line)  # a validation line keeps its step's number
                        line = STEP_NUMBER.sub(renumbered, line)
                    elif b"Training Progress" in line or b"it/s]" in line or b"s/it]" in line:
                        count = f"{step}/{total}".encode()
                        line = BAR_COUNT.sub(lambda m, count=count: m.group(1) + count + m.group(2), line)
                    out.write(line + b"\n")
        out.write(tail)
    return step


def digit_permutation(copy: int) -> bytes:
    """A bytes.translate table that maps the digits 0-9 by the copy-th permutation (copy 0: unchanged).

    A long run's log does not repeat a corpus byte for byte: its step numbers, pids, timings and metrics differ from
    line to line while the lines without numbers (warnings, banners, frames) repeat. Renumbering each copy keeps the
    lines' shape and that mix, so a reader remembering lines it has seen gains what it would gain on a real log."""
    digits = list(b"0123456789")
    permuted = []
    for radix in range(10, 0, -1):  # the copy-th permutation in the factorial number system
        copy, index = divmod(copy, radix) if radix > 1 else (copy, 0)
        permuted.append(digits.pop(index))
    table = bytearray(range(256))
    for digit, mapped in zip(b"0123456789", permuted, strict=True):
        table[digit] = mapped
    return bytes(table)


def build_metrics(path: Path, size_mib: int) -> int:
    """A metrics-heavy log: every step a full metrics line (~100 keys) and its tqdm redraw, little else."""
    head = "\n".join(HEAD).format(total=0) + "\n"
    block = len((metrics(1) + "\n").encode()) + 120
    total = max(2, (size_mib << 20) // block)
    with open(path, "w", encoding="utf-8", buffering=1 << 20) as out:
        out.write(head.replace("TOTAL_TRAIN_STEPS=0", f"TOTAL_TRAIN_STEPS={total}")
                  .replace("total_training_steps=0", f"total_training_steps={total}")
                  .replace("Total training steps: 0", f"Total training steps: {total}"))
        for step in range(1, total + 1):
            out.write(metrics(step) + "\n")
            out.write(f"{TR} \rTraining Progress: {100 * step // total:3d}%|#    | {step}/{total} [00:01<00:01, "
                      "1.2s/it]\n")
    return total


def build_storm(path: Path, size_mib: int) -> int:
    """A run that trains half the file, then dies in an error storm: every rank's NCCL watchdog, tracebacks and
    logger ERROR lines, each line distinct (ranks, pids, timestamps, sequence numbers), to the size."""
    block = len(("\n".join(chatter(1, 1)) + "\n" + metrics(1) + "\n").encode())
    half = (size_mib << 19) // block
    total = 2 * max(1, half)
    written = 0
    with open(path, "w", encoding="utf-8", buffering=1 << 20) as out:
        out.write("\n".join(HEAD).format(total=total) + "\n")
        for step in range(1, half + 1):
            text = "\n".join(chatter(step, total)) + "\n" + metrics(step) + "\n"
            out.write(text)
            written += len(text)
        i = 0
        while written < size_mib << 20:
            rank, pid = i % 512, 3000 + i % 4093
            text = (f"(WorkerDict pid={pid}, ip=10.0.{rank % 64}.{rank // 64}) [rank{rank}]:[E{i % 1000:03d} "
                    f"12:{i % 60:02d}:{i % 59:02d}.{i % 997:03d}] [PG ID 0 PG GUID 0(default_pg) Rank {rank}] "
                    f"Watchdog caught collective operation timeout: WorkNCCL(SeqNum={i}, OpType=ALLREDUCE, "
                    f"NumelIn={i * 4096}, NumelOut={i * 4096}, Timeout(ms)=600000) ran for {600000 + i} "
                    f"milliseconds before timing out.\n"
                    f"(WorkerDict pid={pid}) ERROR 08-14 12:{i % 60:02d}:{i % 59:02d} worker.py:{i} RuntimeError: "
                    f"rank {rank} lost the collective (sequence {i})\n"
                    f'(WorkerDict pid={pid})   File "/workspace/verl/verl/workers/x_{i % 97}.py", line {i % 1000}, '
                    f"in step_{i % 13}\n")
            out.write(text)
            written += len(text)
            i += 1
    return half


# Python children keep their bytecode caches, as an installed tool does (pip compiles on install); a machine that
# sets PYTHONDONTWRITEBYTECODE would otherwise charge every run the compilation of the tool's sources (~60 ms)
PYTHON_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def measured(argv: list[str] | str, shell: bool = False) -> tuple[float, float, float, str]:
    """(wall s, CPU s, peak RSS MiB, stdout) of one fresh process, reaped by os.wait4 so that its own rusage (with
    the children it waited for: grep and wc under the shell) is read."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, shell=shell, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            env=None if shell else PYTHON_ENV)
    chunks = []
    while True:
        data = proc.stdout.read(1 << 16)
        if not data:
            break
        chunks.append(data)
    _, _, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0  # reaped here; keep Popen from waiting again
    wall = time.perf_counter() - t0
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, b"".join(chunks).decode()


# the prefilter alone: the judge's imports, its reader (read_chunks) and its literal scan, hit lines counted
PREFILTER_ALONE = """
import sys
sys.path.insert(0, sys.argv[1])
from sessions.judge.logstream import CHUNK_SIZE, ScanStats, read_chunks
from sessions.judge.verdict import scan_matcher
matcher, hits = scan_matcher(), 0
for buf, cut, _eof in read_chunks(sys.argv[2], CHUNK_SIZE, ScanStats()):
    starts = set()
    matcher.line_starts(buf, cut, starts)
    hits += len(starts)
print(hits)
"""


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--dir", default="/tmp")
    parser.add_argument("--keep", action="store_true", help="keep the generated logs")
    parser.add_argument("--runs", type=int, default=2, help="runs of each command (the best is reported)")
    parser.add_argument("--placements", default="start,middle,end,real,real-pass,real-long,metrics,storm",
                        help="comma list of: start, middle, end (filler with an OOM), real (the shared real logs "
                             "repeated), real-pass (only those labelled pass), real-long (one long healthy run of real passing "
                             "logs' step sections), metrics (a metrics line per step), "
                             "storm (half the file trains, then an error storm of distinct lines)")
    args = parser.parse_args()
    invoke = shutil.which("invoke", path=str(Path(sys.executable).parent)) or shutil.which("invoke")
    if not invoke:
        print("error: invoke not found next to this Python or on PATH")
        return 2
    from sessions.judge.verdict import scan_matcher

    # one untimed run first: it writes the bytecode caches that every timed run then reads
    warm = Path(args.dir) / "verl-judge-bench-warm-up.log"
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    warm.write_text(HEAD[0] + "\n")
    for argv in ([invoke, "judge", "--log", str(warm)], [sys.executable, "-c", PREFILTER_ALONE, str(ROOT), str(warm)]):
        subprocess.run(argv, cwd=ROOT, env=PYTHON_ENV, capture_output=True)
    warm.unlink()
    print(f"prefilter: {scan_matcher().engine}; grep pattern: {GREP_PATTERN!r}; bytecode cached; "
          f"load average {_load()}")
    answers, ok, rows = {}, True, []
    for placement in args.placements.split(","):
        Path(args.dir).mkdir(parents=True, exist_ok=True)
        path = Path(args.dir) / f"verl-judge-bench-{placement}.log"
        if placement in ("real", "real-pass"):
            trained = build_real(path, args.size_mib, passing_only=placement == "real-pass")
        elif placement == "real-long":
            trained = build_real_long(path, args.size_mib)
        elif placement == "storm":
            trained = build_storm(path, args.size_mib)
        elif placement == "metrics":
            trained = build_metrics(path, args.size_mib)
        else:
            trained = build_log(path, args.size_mib, placement)
        mib = path.stat().st_size / (1 << 20)
        subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)  # same page-cache state for both
        ours = [measured([invoke, "judge", "--log", str(path), "--json"]) for _ in range(args.runs)]
        # -a: real logs hold bytes grep calls binary (it would stop at the first match and read nothing more)
        grep = [measured(f'grep -a -E "{GREP_PATTERN}" "{path}" | wc -l', shell=True) for _ in range(args.runs)]
        prefilter = [measured([sys.executable, "-c", PREFILTER_ALONE, str(ROOT), str(path)]) for _ in range(args.runs)]
        f_wall, f_cpu, hit_lines = min(r[0] for r in prefilter), min(r[1] for r in prefilter), int(prefilter[0][3])
        o_wall, g_wall = min(r[0] for r in ours), min(r[0] for r in grep)
        o_cpu, g_cpu = min(r[1] for r in ours), min(r[1] for r in grep)
        rss = max(r[2] for r in ours)
        verdict = json.loads(ours[0][3])
        if placement in ("start", "middle", "end"):
            answers[placement] = (verdict["result"], verdict["category"], verdict["first_error"])
        within = o_cpu <= 2 * g_cpu and o_wall <= 2 * g_wall and rss <= 64
        ok &= within
        print(f"{placement:6s} {mib:6.0f} MiB, dies after step {trained:5d}: ours wall {o_wall:5.2f} s cpu {o_cpu:5.2f} s "
              f"rss {rss:5.1f} MiB | grep wall {g_wall:5.2f} s cpu {g_cpu:5.2f} s | ratio wall {o_wall / g_wall:4.2f}x "
              f"cpu {o_cpu / g_cpu:4.2f}x {'ok' if within else 'OVER TARGET'} | {verdict['result']}/"
              f"{verdict['category']} steps {verdict['steps_completed']}")
        print(f"{'':6s} prefilter alone ({hit_lines} hit lines): wall {f_wall:5.2f} s cpu {f_cpu:5.2f} s | "
              f"prefilter/grep wall {f_wall / g_wall:4.2f}x | ours/prefilter wall {o_wall / f_wall:4.2f}x")
        rows.append((placement, mib, o_wall, o_cpu, rss, g_wall, g_cpu, within, f_wall, f_cpu))
        if not args.keep:
            path.unlink()
    print(f"\nside by side ({args.size_mib} MiB, best of {args.runs} runs, load average now {_load()}):")
    print(f"{'placement':9s} {'MiB':>5s} | {'ours wall':>9s} {'cpu':>6s} {'rss MiB':>7s} | {'grep wall':>9s} {'cpu':>6s} | "
          f"{'wall x':>6s} {'cpu x':>6s} | {'prefilter':>10s} {'cpu':>6s} {'x grep':>6s}")
    for placement, mib, o_wall, o_cpu, rss, g_wall, g_cpu, within, f_wall, f_cpu in rows:
        print(f"{placement:9s} {mib:5.0f} | {o_wall:8.2f}s {o_cpu:5.2f}s {rss:7.1f} | {g_wall:8.2f}s {g_cpu:5.2f}s | "
              f"{o_wall / g_wall:5.2f}x {o_cpu / g_cpu:5.2f}x {'ok' if within else 'OVER TARGET'} | "
              f"{f_wall:9.2f}s {f_cpu:5.2f}s {f_wall / g_wall:5.2f}x")
    same = len(set(answers.values())) <= 1
    first = next(iter(answers.values()), None)
    print(f"same verdict and first error in all filler placements: {same} -> {first}")
    return 0 if ok and same else 1


if __name__ == "__main__":
    sys.exit(main())
