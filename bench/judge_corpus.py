"""Score the verdict engine on a folder of real verl logs with an INDEX.tsv (the layout of ../shared/real-logs):
results, categories and false Passes, with every miss listed.

    python bench/judge_corpus.py [--halves] DIR [DIR ...]

--halves: also score the odd- and the even-numbered files (`NN_...`) apart: a held-out folder is split in two, the
odd half may be looked at and fixed by cause, the even half is never tuned on (the closing note reports both).

Used on the shared development set and on held-out folders that are not in this repository (the numbers of the
closing note); tests/test_real_logs.py holds the same scoring as a test on the shared set.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from sessions.judge.verdict import judge_log  # noqa: E402


def accepted(cell: str) -> set[str]:
    return {part.strip().lower() for part in cell.split("|") if part.strip()}


def judged(folder: Path) -> list[tuple[dict[str, str], object]]:
    """Every INDEX.tsv row of the folder with the verdict on its log (each log judged once)."""
    with open(folder / "INDEX.tsv", encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    return [(row, judge_log(folder / row["file"])) for row in rows]


def score(folder: Path, verdicts, label: str = "", keep=lambda row: True, show_misses: bool = True) -> None:
    results = categories = false_pass = 0
    misses, unknown = [], []
    kept = [(row, v) for row, v in verdicts if keep(row)]
    for row, v in kept:
        r_ok = v.result.lower() in accepted(row["expected_result"])
        c_ok = v.category.lower() in accepted(row["category"])
        results += r_ok
        categories += c_ok
        false_pass += v.result == "Pass" and "pass" not in accepted(row["expected_result"])
        if v.category == "unknown":
            unknown.append(row["file"])
        if not (r_ok and c_ok):
            misses.append(f"  {row['file']}: {v.result}/{v.category} vs {row['expected_result']}/{row['category']}")
    n = len(kept)
    print(f"{folder}{label}: {n} logs; results {results}/{n} ({100 * results / n:.1f} %), categories {categories}/{n} "
          f"({100 * categories / n:.1f} %), false Pass {false_pass}, judged unknown {len(unknown)}")
    if show_misses and misses:
        print("\n".join(misses))


def numbered_half(odd: bool):
    return lambda row: row["file"][:2].isdigit() and int(row["file"][:2]) % 2 == int(odd)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--halves", action="store_true",
                        help="also score the odd (looked at) and even (never tuned on) numbered files apart")
    parser.add_argument("folders", nargs="*", default=["../shared/real-logs"],
                        help="folders of logs with an INDEX.tsv (default: ../shared/real-logs)")
    args = parser.parse_args()
    for arg in args.folders:
        folder = Path(arg)
        if not (folder / "INDEX.tsv").is_file():
            print(f"error: {folder} has no INDEX.tsv (a folder of logs in the layout of ../shared/real-logs)")
            return 2
        verdicts = judged(folder)
        score(folder, verdicts, show_misses=not args.halves)
        if args.halves:
            score(folder, verdicts, " (odd: looked at)", numbered_half(True))
            score(folder, verdicts, " (even: never tuned on)", numbered_half(False), show_misses=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
