"""Pass rules per level, on top of the per-log verdicts. Level 0's rule is the verdict of its one run; other
levels add their own evidence (checkpoints for level 1, metrics for level 5, ...) through RULES.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from sessions.verdict import Verdict


@dataclass
class LevelOutcome:
    run_status: str  # "verl Megatron backend run" deliverable
    run_detail: str
    variant_status: str  # "Requested variants" deliverable (ignored when the level requests none)
    variant_detail: str
    category: str
    key_lines: list[str] = field(default_factory=list)
    limitations: list[str] = field(default_factory=list)
    follow_ups: list[str] = field(default_factory=list)


def describe_verdict(v: Verdict) -> str:
    expected = f"/{v.steps_expected}" if v.steps_expected is not None else ""
    if v.result == "Pass":
        return f"{v.steps_completed}{expected} step(s) completed, exit {v.exit_code}"
    where = f"{v.result} in {v.phase} ({v.category})"
    err = f": {v.first_error}" if v.first_error else ""
    hint = f" — hint: {v.hint}" if v.hint else ""
    if v.result == "Blocked":
        hint += " — not evidence against the Bridge provider"
    return f"{where}{err}; {v.steps_completed}{expected} step(s) completed{hint}"


def single_run(record: dict, judged: list[tuple[dict, Verdict]]) -> LevelOutcome:
    """The level passes when its one run passes (levels 0, 2, 3, 4 before their own evidence is added)."""
    entry, v = judged[-1]
    detail = describe_verdict(v)
    return LevelOutcome(v.result, detail, v.result, detail, v.category, list(v.key_lines),
                        list(v.limitations), list(v.follow_ups))


RuleFn = Callable[[dict, list[tuple[dict, Verdict]]], LevelOutcome]
RULES: dict[int, RuleFn] = {}


def combine(level: int, record: dict, judged: list[tuple[dict, Verdict]]) -> LevelOutcome:
    if not judged:
        return LevelOutcome("Skipped", "verl not started", "Skipped", "verl not started", "unknown")
    return RULES.get(level, single_run)(record, judged)
