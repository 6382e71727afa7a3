"""Every corpus log in tests/logs is judged as expected.json says (one test per log), by both readers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from sessions.judge.patterns import CATEGORY_HINTS
from sessions.judge.verdict import CATEGORIES, PHASES, RESULTS, judge_lines, judge_log

LOGS = Path(__file__).parent / "logs"
EXPECTED = json.loads((LOGS / "expected.json").read_text(encoding="utf-8"))


def check(verdict, expect):
    assert verdict.result in RESULTS and verdict.category in CATEGORIES and verdict.phase in PHASES
    assert verdict.result == expect["result"], (verdict.category, verdict.first_error)
    for key in ("category", "phase", "steps_completed", "steps_expected", "vanilla_mbridge", "fresh_start"):
        if key in expect:
            assert getattr(verdict, key) == expect[key], key
    for key, field in (("first_error", "first_error"), ("hint", "hint"), ("resumed_from", "resumed_from")):
        if key in expect:
            assert expect[key] in (getattr(verdict, field) or ""), key
    if "limitation" in expect:
        assert any(expect["limitation"] in item for item in verdict.limitations), verdict.limitations
    if "residual_noise" in expect:
        assert bool(verdict.residual_noise) == expect["residual_noise"], verdict.residual_noise
    if "checkpoints_saved" in expect:
        assert len(verdict.checkpoints_saved) == expect["checkpoints_saved"]
    if "adapter_total" in expect:
        assert verdict.adapters[0]["total"] == expect["adapter_total"]
    for key in ("metric", "metric2"):
        if key in expect:
            step, name, value = expect[key]
            assert math.isclose(verdict.step_metrics[step][name], value, rel_tol=1e-9)
    for key in ("level_result", "level_category"):
        if key in expect:
            assert getattr(verdict, key) == expect[key], key
    if "criterion" in expect:
        name, status = expect["criterion"]
        assert {c.name: c.status for c in verdict.criteria}[name] == status
    if verdict.result == "Pass":
        assert verdict.first_error is None and verdict.category == "success"
    else:  # every non-Pass case states its first error line, and the hint is the one of its cause
        assert "first_error" in expect, "a non-Pass case must state its first error"
        if "hint" not in expect:
            assert CATEGORY_HINTS[verdict.category] in verdict.hint


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_corpus_log_file(name):
    spec = EXPECTED[name]
    run = spec["run"]
    verdict = judge_log(LOGS / name, level=run.get("level"), steps_expected=run.get("steps"),
                        exit_code=run.get("exit_code"), termination=run.get("termination"))
    check(verdict, spec["expect"])


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_corpus_log_lines(name):
    spec = EXPECTED[name]
    run = spec["run"]
    with open(LOGS / name, encoding="utf-8", newline="") as handle:
        verdict = judge_lines(handle, level=run.get("level"), steps_expected=run.get("steps"),
                              exit_code=run.get("exit_code"), termination=run.get("termination"))
    check(verdict, spec["expect"])


def test_corpus_is_big_enough_and_covers_every_category():
    assert len(EXPECTED) >= 40
    seen = {spec["expect"].get(key) for spec in EXPECTED.values() for key in ("category", "level_category")}
    missing = set(CATEGORIES) - seen - {None}
    assert not missing, missing
