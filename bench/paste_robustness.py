"""Benchmark: how many verdicts of the real logs change when each log is pasted the way users and collectors paste
it (quote markers, a Markdown indent, container records, kubectl/journald/compose/clock line heads, line numbers,
HTML entities, a byte order mark, a hard wrap under quotes: bench/pastes.py, which
tests/test_verdict_pasted.py asserts on).

    /work/venv/bin/python bench/paste_robustness.py [DIR ...]   (default: ../shared/real-logs)

For each paste it prints the number of logs whose result, category or step count differs from the log's own, and
the first few. The test asserts 0 for every paste on the shared logs; this prints the figures (run it from an older
checkout, with this file and bench/pastes.py copied in, to see what a change moved).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.pastes import PASTES  # noqa: E402
from sessions.judge.verdict import judge_log  # noqa: E402


def main() -> int:
    folders = [Path(a) for a in sys.argv[1:]] or [ROOT.parent / "shared" / "real-logs"]
    logs = [p for folder in folders for p in sorted(folder.glob("*.log"))]
    if not logs:
        print(f"error: no .log files in {', '.join(map(str, folders))}", file=sys.stderr)
        return 2
    own = {p: judge_log(p) for p in logs}
    with tempfile.TemporaryDirectory() as tmp:
        for name, paste in sorted(PASTES.items()):
            changed = []
            for path in logs:
                pasted = Path(tmp) / path.name
                pasted.write_bytes(b"\n".join(paste(path.read_bytes().split(b"\n"))))
                a, b = own[path], judge_log(pasted)
                if (a.result, a.category, a.steps_completed) != (b.result, b.category, b.steps_completed):
                    changed.append(f"    {path.name}: {a.result}/{a.category} -> {b.result}/{b.category}")
            print(f"{name:13s} {len(changed):3d} of {len(logs)} verdicts changed")
            if changed:
                print("\n".join(changed[:3]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
