"""The verdict engine: reads a verl log (streamed, every line) and gives two answers, both in the JSON and the report.

1. The run, from the log alone: did verl's training finish its steps without a fatal error? Pass / Fail / Blocked
   with a category, the first error line and a triage hint. Blocked only on positive evidence that the environment
   stopped the run (patterns with result "blocked"); any other error is Fail with its category.
2. The level's criteria (when a level is given): the wrapper's own `VANILLA_MBRIDGE=False`, no Bridge file outside
   the local checkout, the expected steps, exit 0 - each Pass / Fail / not shown. The level's result is Pass only
   when the run and every criterion passed.

Contract used by the rest of the tool (level runner, reports, `invoke judge`):

    judge_log(path, *, level=None, steps_expected=None, exit_code=None, termination=None, bridge_src=None) -> Verdict

Layout: evidence.py collects while streaming (record.py holds the Verdict), decide.py decides in one pure function
`decide(evidence) -> Verdict`, structure.py holds the method/frame tables, level_criteria.py level N's own rule for
`judge --level N`.

`termination` is what the launcher knows and the log cannot: None (the wrapper ended by itself),
"interrupted" (our process got SIGINT/SIGTERM and stopped the wrapper) or "timeout" (stall timeout).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sessions.judge.decide import decide
from sessions.judge.evidence import Evidence, parse_metrics
from sessions.judge.logstream import CHUNK_SIZE, NeedleMatcher, ScanStats, join_wrapped, scan_file
from sessions.judge.patterns import COMPLETE_BAR_NEEDLE, LAST_ONLY_NEEDLE, SCAN_NEEDLES
from sessions.judge.record import (
    CATEGORIES,
    CRITERION_STATUSES,
    EXIT_BAD_USAGE,
    EXIT_BY_RESULT,
    NOT_SHOWN,
    PHASES,
    RESULTS,
    Criterion,
    Verdict,
)
from sessions.judge.skim import LastingLines, Skim

__all__ = [
    "ALL_NEEDLES", "CATEGORIES", "CRITERION_STATUSES", "NOT_SHOWN", "PHASES", "RESULTS", "Criterion", "Evidence",
    "LiveJudge", "Verdict", "decide", "format_verdict", "judge_command", "judge_lines", "judge_log", "parse_metrics",
    "scan_matcher",
]

ALL_NEEDLES = SCAN_NEEDLES + (LAST_ONLY_NEEDLE, COMPLETE_BAR_NEEDLE)
SCAN_NEEDLES_BYTES = tuple(n.encode() for n in SCAN_NEEDLES + (COMPLETE_BAR_NEEDLE,))
SNIFF_BYTES = 1 << 16
_MATCHER: NeedleMatcher | None = None
_LASTING: LastingLines | None = None


def lasting_lines() -> LastingLines:
    """The skimming reader's finder of lasting lines (built once per process)."""
    global _LASTING
    if _LASTING is None:
        _LASTING = LastingLines(scan_matcher())
    return _LASTING


def scan_matcher() -> NeedleMatcher:
    """The judge's needle matcher (built once per process)."""
    global _MATCHER
    if _MATCHER is None:
        _MATCHER = NeedleMatcher(SCAN_NEEDLES_BYTES)
    return _MATCHER


def sniff(path: str | os.PathLike[str]) -> str | None:
    """"empty" / "binary" when the file is no text log (an ELF, random bytes, NULs), else None."""
    with open(path, "rb") as handle:
        head = handle.read(SNIFF_BYTES)
    if not head.strip():
        return "empty"
    if head.startswith(b"\x7fELF") or b"\x00" in head:
        return "binary"
    text = head.decode("utf-8", "replace")
    bad = text.count("\ufffd") + sum(1 for ch in text if ord(ch) < 32 and ch not in "\t\n\r\x1b\x0c\x08")
    return "binary" if bad * 10 > len(text) else None


def _coerce_int(value: Any, name: str) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"--{name} must be an integer, got {value!r}") from None


def _check_termination(termination: str | None) -> None:
    if termination not in (None, "interrupted", "timeout"):
        raise ValueError(f"termination must be None, 'interrupted' or 'timeout', not {termination!r}")


def judge_lines(
    lines: Iterable[str],
    *,
    level: int | None = None,
    steps_expected: int | None = None,
    exit_code: int | None = None,
    termination: str | None = None,
    bridge_src: str | None = None,
) -> Verdict:
    """Judge an iterable of text lines (a pipe, a list in tests) with the same needle list as `judge_log`."""
    _check_termination(termination)
    judge = Evidence(level, steps_expected, exit_code, termination, bridge_src)
    for raw in join_wrapped(lines):
        for needle in ALL_NEEDLES:
            if needle in raw:
                judge.feed(raw)
                break
    return decide(judge)


def judge_log(
    path: str | os.PathLike[str],
    *,
    level: int | None = None,
    steps_expected: int | None = None,
    exit_code: int | None = None,
    termination: str | None = None,
    bridge_src: str | None = None,
    matcher: NeedleMatcher | None = None,
    level_rule: bool = False,
    chunk_size: int = CHUNK_SIZE,
) -> Verdict:
    """Judge a log file, streamed in large chunks (constant memory, every line searched). `bridge_src`: the
    expected `$BRIDGE_REPO/src`; a megatron.bridge path printed outside it fails the level's Bridge criterion.
    `matcher`: the line prefilter (tests pass one without Hyperscan to check both find the same lines).
    `level_rule`: with a level, also apply that level's own rule from the log (`invoke judge --level N`).
    `chunk_size`: bytes read at a time (tests make it small)."""
    _check_termination(termination)
    judge = Evidence(level, steps_expected, exit_code, termination, bridge_src)
    judge.input_note = sniff(path)
    matcher = scan_matcher() if matcher is None else matcher
    lasting = lasting_lines() if matcher.engine == "hyperscan" else None
    if lasting is not None and lasting.available:  # the same lines fed, but not those the next progress clears
        Skim(judge, matcher, lasting, LAST_ONLY_NEEDLE.encode()).run(path, chunk_size, ScanStats())
    else:
        for raw in scan_file(path, matcher, last_only_needle=LAST_ONLY_NEEDLE.encode(), chunk_size=chunk_size):
            judge.feed_bytes(raw)
    return decide(judge, level_rule=level_rule, log_path=str(path))


def format_verdict(verdict: Verdict) -> str:
    """Human-readable verdict: the run's answer, then the level's criteria when a level was judged."""
    out = [f"Run: {verdict.result} - {verdict.summary}"]
    out.append(f"Category: {verdict.category} (phase: {verdict.phase})")
    expected = verdict.steps_expected if verdict.steps_expected is not None else "?"
    out.append(f"Steps completed: {verdict.steps_completed}/{expected}")
    if verdict.first_error:
        out.append(f"First error: {verdict.first_error}")
    if verdict.hint:
        out.append(f"Hint: {verdict.hint}")
    if verdict.level_result is not None:
        out.append(f"Level {verdict.level}: {verdict.level_result} ({verdict.level_category}) - {verdict.level_summary}")
        out.append("Criteria:")
        out.extend(f"- {c.name}: {c.status} - {c.detail}" for c in verdict.criteria)
    for title, items in (
        ("Key lines", verdict.key_lines),
        ("Residual noise", verdict.residual_noise),
        ("Limitations", verdict.limitations),
        ("Follow-ups", verdict.follow_ups),
    ):
        if items:
            out.append(f"{title}:")
            out.extend(f"- {item}" for item in items)
    return "\n".join(out)


def judge_command(log: Any, level: Any = None, steps: Any = None, exit_code: Any = None, as_json: bool = False,
                  bridge_repo: Any = None) -> int:
    """`invoke judge`: print the verdict of LOG; exit 0 Pass, 1 Fail, 3 Blocked (the run's answer, or the level's with
    --level), 2 bad invocation/unreadable log."""
    try:
        level_n, steps_n, exit_n = (
            _coerce_int(level, "level"), _coerce_int(steps, "steps"), _coerce_int(exit_code, "exit-code")
        )
        if level_n is not None and not 0 <= level_n <= 5:
            raise ValueError(f"--level must be 0..5, got {level_n}")
        if not log:
            raise ValueError("--log FILE is required")
        if not os.path.exists(log):
            raise ValueError(f"log file not found: {log}")
        if not os.path.isfile(log):  # /dev/null, a folder, a fifo: nothing a run wrote
            raise ValueError(f"--log {log} is not a regular file")
        # the level's Bridge criterion needs the checkout the run was meant to import (--bridge-repo, BRIDGE_REPO)
        bridge = bridge_repo or os.environ.get("BRIDGE_REPO")
        bridge_src = str(Path(bridge).expanduser().absolute() / "src") if bridge and level_n is not None else None
        verdict = judge_log(log, level=level_n, steps_expected=steps_n, exit_code=exit_n, bridge_src=bridge_src,
                            level_rule=True)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}")
        return EXIT_BAD_USAGE
    if as_json:
        print(json.dumps(verdict.to_json(), indent=2))
    else:
        print(format_verdict(verdict))
    return EXIT_BY_RESULT[verdict.final_result]


class LiveJudge:
    """The engine fed one physical line at a time while the log is being written (the launcher's tee), for the
    live status line (sessions/run/progress.py): the same needles and classification as `judge_log`, no second parser.
    """

    NEEDLES = tuple(n.encode() for n in ALL_NEEDLES)

    def __init__(self, *, level: int | None = None):
        self._judge = Evidence(level, None, None, None, None)

    def feed(self, line: bytes) -> None:
        for needle in self.NEEDLES:
            if needle in line:
                self._judge.feed_bytes(line)
                return

    @property
    def phase(self) -> str:
        """The current activity by the engine's phase markers (one of PHASES)."""
        return self._judge.phase

    @property
    def step(self) -> int:
        """Highest training step logged so far."""
        return self._judge.max_step

    @property
    def steps_expected(self) -> int | None:
        """Steps the log says the run will train (printed total, Hydra override, traced command), if it said."""
        return self._judge._expected_steps()[0]
