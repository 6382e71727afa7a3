"""What the live status line makes of real verl logs, and what it costs per MB of log.

Usage: python bench/progress.py [LOG ...]   (default: every *.log in ../shared/real-logs)
       python bench/progress.py --cost LOG [--mb 256]

For each log: the log is fed to the level's display (sessions/run/progress.py, plain-line mode, as in CI or a Slurm
file) in 64 KiB chunks, as the launcher would; prints the log's line count, how many status lines a user would see,
the phases in order and the final step N/M. --cost replays LOG repeated up to --mb MiB through (a) the plain tee
the launcher did before (write to /dev/null) and (b) the status display, and prints CPU seconds and MiB/s of each.
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sessions.judge.verdict import LiveJudge  # noqa: E402
from sessions.run import progress

CHUNK = 64 << 10
REAL_LOGS = Path(__file__).resolve().parent.parent.parent / "shared" / "real-logs"


def replay(data: bytes) -> tuple[list[str], progress.Status]:
    shown = io.StringIO()
    display = progress.open_display("verl", Path("RUN"), judge=LiveJudge(), verbose=False, out=shown)
    for start in range(0, len(data), CHUNK):
        display.feed(data[start:start + CHUNK])
    display.close("exit ?")
    return shown.getvalue().splitlines(), display.status


def describe(path: Path) -> str:
    data = path.read_bytes()
    lines, status = replay(data)
    phases = []
    for line in lines:
        phase = line.split(" · ")[1] if line.startswith(progress.STATUS_PREFIX) else None
        if phase and (not phases or phases[-1] != phase):
            phases.append(phase)
    total = status.total if status.total else "?"
    count = data.count(b"\n")
    return (f"{path.name[:60]:60} {count:6d} lines -> {len(lines):3d} status lines; "
            f"step {status.step}/{total}; {' > '.join(phases)}")


def cost(path: Path, mib: int) -> None:
    unit = path.read_bytes()
    data = unit * max(1, (mib << 20) // len(unit))
    size = len(data) / (1 << 20)
    with open("/dev/null", "wb") as sink:
        t0 = time.process_time()
        for start in range(0, len(data), CHUNK):
            sink.write(data[start:start + CHUNK])
        tee = time.process_time() - t0
    t0 = time.process_time()
    lines, _ = replay(data)
    status = time.process_time() - t0
    count = data.count(b"\n")
    print(f"{path.name}: {size:.0f} MiB, {count} lines")
    print(f"  tee only     : {tee:7.2f} s CPU ({size / max(tee, 1e-9):9.0f} MiB/s)")
    print(f"  status line  : {status:7.2f} s CPU ({size / max(status, 1e-9):9.0f} MiB/s), {len(lines)} status lines")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", nargs="*", type=Path)
    parser.add_argument("--cost", type=Path)
    parser.add_argument("--mb", type=int, default=256)
    args = parser.parse_args()
    if args.cost:
        cost(args.cost, args.mb)
        return 0
    logs = args.logs or sorted(REAL_LOGS.glob("*.log"))
    for path in logs:
        print(describe(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
