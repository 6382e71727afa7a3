"""The tool's outcomes and their exit codes: one table, used by every task, nox session and child-task runner.

| code | outcome | returned by |
|---|---|---|
| 0 | Pass / found / done | every task; `bisect`: first bad commit found |
| 1 | Fail | level0..5, judge, report, plan --run, remote/slurm (the task's), nox -s bridge_unit, slurm-status/-logs |
| 2 | bad usage: a flag, value, setting or invoke.yaml the tool refuses (one line; nothing changed) | every task |
| 3 | Blocked: the environment stopped it before the Bridge provider was exercised (bisect: ambiguous/stopped) | level0..5, doctor, judge, report, plan --run, remote, slurm, bisect, prep-data, download-model, install-modelopt, nox -s bridge_unit / verl |
| 130 | interrupted (Ctrl-C, SIGTERM): one line `interrupted`, with the run directory when one exists | every task |
| 141 | stdout closed by its reader (`... | head`): the rest was not printed | every task |
"""

from __future__ import annotations

PASS = FOUND = 0
FAIL = 1
BAD_USAGE = 2
BLOCKED = 3
INTERRUPTED = 130
CLOSED_STDOUT = 141  # 128 + SIGPIPE, what a shell reports for a writer whose reader went away

# A verdict's Result -> exit code (levels, judge, report, plan --run).
BY_RESULT = {"Pass": PASS, "Fail": FAIL, "Blocked": BLOCKED}

# (code, outcome): what README's exit-code table says, in one place.
OUTCOMES: tuple[tuple[int, str], ...] = (
    (PASS, "Pass / found / done"),
    (FAIL, "Fail"),
    (BAD_USAGE, "bad usage (one line, nothing changed)"),
    (BLOCKED, "Blocked (environment; bisect: ambiguous or stopped)"),
    (INTERRUPTED, "interrupted (Ctrl-C / SIGTERM)"),
    (CLOSED_STDOUT, "stdout closed by its reader"),
)
CODES = frozenset(code for code, _ in OUTCOMES)


def for_result(result: str) -> int:
    """Exit code of a verdict's Result (Pass, Fail, Blocked)."""
    return BY_RESULT[result]


def describe(code: int | None) -> str:
    return next((what for c, what in OUTCOMES if c == code), f"exit {code}")
