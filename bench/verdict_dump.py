"""Dump (or compare) the verdict of every log the engine is checked against: a speed change must move none of them.

    .venv/bin/python bench/verdict_dump.py dump OUT.json      # before a change
    .venv/bin/python bench/verdict_dump.py compare OUT.json   # after it: prints every difference, exit 1 on any

Logs: tests/logs/*.log, every log of the shared real-log folder (VERL_E2E_REAL_LOGS, else ../shared/real-logs)
and the four re-captured variants tests/test_real_logs.py builds of each (no ANSI, no Ray prefixes, external
timestamps, CRLF), the real logs concatenated and repeated past several read chunks, and the bench's synthetic
placements (start/middle/end/metrics) at a few MiB. Each is judged plain, and with level 5 and its level rule.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import judge as bench  # noqa: E402
from sessions.judge.verdict import judge_log  # noqa: E402
from tests.test_real_logs import CAPTURES  # noqa: E402

SYNTHETIC_MIB = 20  # > 2 read chunks (8 MiB): chunk boundaries fall inside the interesting parts


def cases(tmp: Path):
    for path in sorted((ROOT / "tests" / "logs").glob("*.log")):
        yield f"tests/logs/{path.name}", path
    real = sorted(bench.REAL_LOGS.glob("*.log"))
    for path in real:
        yield f"real/{path.name}", path
        lines = path.read_bytes().decode("utf-8", "replace").splitlines()
        for index, capture in enumerate(CAPTURES.values()):
            variant = tmp / f"variant{index}-{path.name}"
            variant.write_text("\n".join(capture(line) for line in lines) + "\n", encoding="utf-8")
            yield f"real-variant{index}/{path.name}", variant
    if real:
        concat = tmp / "real-concat.log"
        bench.build_real(concat, SYNTHETIC_MIB)
        yield "real-concat", concat
    for placement in ("start", "middle", "end"):
        path = tmp / f"{placement}.log"
        bench.build_log(path, SYNTHETIC_MIB, placement)
        yield f"synthetic/{placement}", path
    path = tmp / "metrics.log"
    bench.build_metrics(path, SYNTHETIC_MIB)
    yield "synthetic/metrics", path


def verdicts() -> dict[str, dict]:
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in cases(Path(tmp)):
            out[name] = judge_log(path).to_json()
            out[name + " [level 5]"] = judge_log(path, level=5, level_rule=True).to_json()
    return out


def main() -> int:
    mode, target = sys.argv[1], Path(sys.argv[2])
    got = verdicts()
    if mode == "dump":
        target.write_text(json.dumps(got, indent=1, sort_keys=True))
        print(f"{len(got)} verdicts -> {target}")
        return 0
    want = json.loads(target.read_text())
    got = json.loads(json.dumps(got))  # same key types as the dump
    diffs = [name for name in sorted(set(want) | set(got)) if want.get(name) != got.get(name)]
    for name in diffs:
        a, b = want.get(name) or {}, got.get(name) or {}
        fields = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        print(f"DIFF {name}: {fields}")
        for key in fields[:4]:
            print(f"  {key}: {str(a.get(key))[:300]!r}\n   -> {str(b.get(key))[:300]!r}")
    print(f"{len(got)} verdicts compared, {len(diffs)} differences")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
