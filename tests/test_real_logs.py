"""The verdict engine against real verl logs: every log of `../shared/real-logs/` (beside the project checkout) is
judged by `invoke judge`'s engine and compared with that folder's INDEX.tsv (`a|b`: either is right).

The folder is the development set (it may grow); the files stay there, outside the project. The test fails below
95 % right results or 93 % right categories, and prints every miss with the line the index says decides it.

One kind of miss is a disagreement of rules, not an error of the engine, and is counted apart (and printed): the
index labels excerpts by the health of what they show, so a public paste cut after step N of a planned M (no error
line) is `pass`; issue 25 says a run never Passes while the log shows a planned total it did not reach. The engine
follows the issue; those logs are "rule conflicts" and do not count against the floor.
"""

from __future__ import annotations

import csv
import re

import pytest

from sessions.judge.verdict import judge_log
from tests.conftest import REAL_LOGS, real_logs

MIN_RESULTS = 0.95
MIN_CATEGORIES = 0.93


def need_real_logs() -> None:
    """One rule for every real-log reader (tests/conftest.py): skip with the reason, fail where CI requires it."""
    real_logs()


@pytest.fixture(autouse=True)
def _real_logs_needed():
    need_real_logs()


def index_rows() -> list[dict[str, str]]:
    with open(REAL_LOGS / "INDEX.tsv", encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle, delimiter="\t"))


def accepted(cell: str) -> set[str]:
    return {part.strip().lower() for part in cell.split("|") if part.strip()}


UNREACHED_TOTAL = re.compile(r"^no exception line in the log; it ends after step \d+ of \d+")


def rule_conflict(row: dict[str, str], verdict) -> bool:
    """A pass-labelled excerpt the engine fails only because it ends below the planned total the log shows."""
    return accepted(row["expected_result"]) == {"pass"} and verdict.result == "Fail" and \
        bool(UNREACHED_TOTAL.match(verdict.first_error or ""))


def judge_real_logs() -> tuple[list[str], int, int, int, list[str]]:
    """(misses, right results, right categories, logs judged less rule conflicts, false passes)."""
    misses, results_ok, categories_ok, false_pass, conflicts = [], 0, 0, [], 0
    rows = index_rows()
    for row in rows:
        verdict = judge_log(REAL_LOGS / row["file"])
        if rule_conflict(row, verdict):
            conflicts += 1
            misses.append(f"{row['file']}: RULE CONFLICT (index pass; {verdict.first_error})")
            continue
        result_ok = verdict.result.lower() in accepted(row["expected_result"])
        category_ok = verdict.category in accepted(row["category"])
        if verdict.result == "Pass" and "pass" not in accepted(row["expected_result"]):
            false_pass.append(row["file"])
        results_ok += result_ok
        categories_ok += category_ok
        if not (result_ok and category_ok):
            misses.append(
                f"{row['file']}: got {verdict.result}/{verdict.category} (first error: {verdict.first_error}), "
                f"index {row['expected_result']}/{row['category']}; deciding line: {row['proof_line'][:200]}"
            )
    return misses, results_ok, categories_ok, len(rows) - conflicts, false_pass


def test_real_logs_match_their_index():
    misses, results_ok, categories_ok, total, false_pass = judge_real_logs()
    files = {row["file"] for row in index_rows()}
    on_disk = {p.name for p in REAL_LOGS.glob("*.log")}
    assert on_disk <= files, f"logs without an INDEX.tsv row: {sorted(on_disk - files)}"
    print(f"\nreal logs less {len(files) - total} rule conflicts: results {results_ok}/{total} "
          f"({results_ok / total:.1%}), categories {categories_ok}/{total} ({categories_ok / total:.1%})")
    for miss in misses:
        print("MISS", miss)
    assert not false_pass, f"false Pass: {false_pass}"
    assert results_ok / total >= MIN_RESULTS and categories_ok / total >= MIN_CATEGORIES, "\n".join(misses)


def test_h200_attention_backend_error_is_kept_past_the_tqdm_redraw_after_it():
    """Issue 16.4/16.5: TE's missing attention backend is Blocked (env-dependency) with the fused hint, although a
    `Training Progress: 0%` bar is printed after the error as the process dies."""
    path = REAL_LOGS / "h200_s2_level0_no_attention_backend.log"
    tail = path.read_text(encoding="utf-8", errors="replace").rsplit("No dot product attention backend", 1)[1]
    assert "Training Progress:   0%|" in tail  # the bar really comes after the error
    verdict = judge_log(path)
    assert (verdict.result, verdict.category) == ("Blocked", "env-dependency")
    assert "ValueError: No dot product attention backend is available" in verdict.first_error
    assert "attention_backend=fused" in verdict.hint


def test_level_criteria_are_a_second_answer_not_part_of_the_run():
    """A public success log passes as a run; `--level 0` names what the log does not show instead of failing the run.
    (Issue 25.2: 01's tqdm bar shows 10/45, a planned total it does not reach, so 03 — no bar, no total — serves.)"""
    path = REAL_LOGS / "03_pass_fsdp_grpo_steps1_16_learning_signal.log"
    run_only = judge_log(path)
    assert (run_only.result, run_only.category, run_only.level_result, run_only.criteria) == ("Pass", "success", None, [])
    with_level = judge_log(path, level=0)
    assert with_level.result == "Pass" and with_level.level_result == "Fail"
    status = {c.name: c.status for c in with_level.criteria}
    assert status == {"VANILLA_MBRIDGE=False in the wrapper's output": "not shown", "local Bridge imported": "not shown",
                      "expected steps completed": "not shown", "exit code 0": "not shown"}
    assert "VANILLA_MBRIDGE=False in the wrapper's output" in with_level.level_summary
    own = judge_log(REAL_LOGS / "h200_s2_level0_pass.log", level=0, exit_code=0, steps_expected=1,
                    bridge_src="/work/Megatron-Bridge/src")  # a level run knows its checkout
    assert (own.result, own.level_result) == ("Pass", "Pass")
    assert {c.name: c.status for c in own.criteria}["VANILLA_MBRIDGE=False in the wrapper's output"] == "Pass"


ANSI = re.compile(r"\x1b\[[0-9;]*m")
RAY_PREFIX = re.compile(r"^(?:\x1b\[36m)?\((?:[A-Za-z_][\w.\-]*(?: pid=\d+)?|pid=\d+)(?:, ip=[\d.]+)?\)(?:\x1b\[0m)? ?")
CAPTURES = {  # how the same run reaches a user through other tools: the verdict must not move
    "no ANSI (copied from a terminal)": lambda line: ANSI.sub("", line),
    "no Ray prefixes (one process's output)": lambda line: RAY_PREFIX.sub("", line),
    "external timestamps (a log shipper)": lambda line: "[2026-01-01 00:00:00] " + line,
    "CRLF line ends (a Windows paste)": lambda line: line + "\r",
}


def test_the_same_logs_captured_otherwise_get_the_same_verdict(tmp_path):
    moved = []
    for row in index_rows():
        path = REAL_LOGS / row["file"]
        base = judge_log(path)
        lines = path.read_bytes().decode("utf-8", "replace").splitlines()
        for name, capture in CAPTURES.items():
            variant = tmp_path / "variant.log"
            variant.write_text("\n".join(capture(line) for line in lines) + "\n", encoding="utf-8")
            got = judge_log(variant)
            if (got.result, got.category) != (base.result, base.category):
                moved.append(f"{row['file']} {name}: {base.result}/{base.category} -> {got.result}/{got.category}")
    assert not moved, "\n".join(moved)
