"""A verdict must rest on its deciding line: delete that line from each non-Pass log (the real logs of
`../shared/real-logs/`, the hand-written corpus) and the result, the category or the first error must change. A
verdict that survives the deletion came from a default, not from the log (issue 20.3). The deciding line is the
corpus's stated first error, and for a real log the line the engine names (a message of the engine's own, such as
"no exception line in the log", is no log line and is not deleted)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sessions.judge.verdict import judge_log
from tests.test_real_logs import REAL_LOGS, index_rows

CORPUS = Path(__file__).parent / "logs"
EXPECTED = json.loads((CORPUS / "expected.json").read_text(encoding="utf-8"))


def _without(path: Path, needles: str | list[str], out: Path) -> int:
    """Copy `path` to `out` without the lines holding the first of `needles` found; returns the lines dropped."""
    raw = path.read_bytes().decode("utf-8", "replace").splitlines(keepends=True)
    for needle in [needles] if isinstance(needles, str) else needles:
        kept = [line for line in raw if needle not in line]
        if len(kept) < len(raw):
            out.write_text("".join(kept), encoding="utf-8")
            return len(raw) - len(kept)
    return 0


def _changed(before, after) -> bool:
    return (before.result, before.category, before.first_error) != (after.result, after.category, after.first_error)


def _needles(first_error: str) -> list[str]:
    """Where a shown first error comes from in the log, most specific first: its own text (no `(Source) ` prefix,
    no `...` cut), the step line of a non-finite metric, the first frame of a cut traceback."""
    text = first_error[:-3] if first_error.endswith("...") else first_error
    if text.startswith("(") and ") " in text:
        text = text.split(") ", 1)[1]
    step = re.match(r"step (\d+)(?::|$)", text)
    if step:  # "step N: key=nan" names the metrics line of step N
        return [f"step:{step.group(1)} - "]
    text = text.split("(the log is cut): ", 1)[-1]
    return [text[:120], text[:40]]


def _real_non_pass() -> list[dict[str, str]]:
    if not (REAL_LOGS / "INDEX.tsv").is_file():
        return []
    return [row for row in index_rows() if "pass" not in row["expected_result"].lower()]


def test_the_real_logs_are_there_for_the_deletion_test():
    """Without ../shared/real-logs the parametrized test below has no cases: say why (skip), or fail in CI."""
    from tests.conftest import real_logs

    assert _real_non_pass(), f"no non-Pass row in {real_logs() / 'INDEX.tsv'}"


@pytest.mark.parametrize("row", _real_non_pass(), ids=lambda row: row["file"])
def test_deleting_the_deciding_line_of_a_real_log_changes_its_verdict(row, tmp_path):
    path = REAL_LOGS / row["file"]
    before = judge_log(path)
    assert before.first_error, row["file"]
    if not _without(path, _needles(before.first_error), tmp_path / "cut.log"):
        pytest.skip(f"the engine's own message, no log line: {before.first_error}")
    after = judge_log(tmp_path / "cut.log")
    assert _changed(before, after), (before.result, before.category, before.first_error)


NON_PASS = sorted(n for n, spec in EXPECTED.items()
                  if spec["expect"]["result"] != "Pass" and "first_error" in spec["expect"]
                  and "no exception line" not in spec["expect"]["first_error"]
                  and spec["run"].get("termination") is None)


@pytest.mark.parametrize("name", NON_PASS)
def test_deleting_the_first_error_of_a_corpus_log_changes_its_verdict(name, tmp_path):
    spec = EXPECTED[name]
    run = {k: v for k, v in spec["run"].items() if k in ("level", "exit_code")}
    run["steps_expected"] = spec["run"].get("steps")
    if not _without(CORPUS / name, _needles(spec["expect"]["first_error"]), tmp_path / "cut.log"):
        pytest.skip(f"the engine's own message, no log line: {spec['expect']['first_error']}")
    before, after = judge_log(CORPUS / name, **run), judge_log(tmp_path / "cut.log", **run)
    assert _changed(before, after), (before.result, before.category, before.first_error)
