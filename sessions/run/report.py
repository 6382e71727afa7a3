"""Reports of one run, in the procedure's summary format: summary.md, summary.json, junit.xml.

Everything is rendered from `run.json` (what the runner recorded) plus the verdicts of the logs in the run
directory, so `invoke report RUN_DIR` re-renders a run from what its directory holds (re-judging the logs).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

DELIVERABLES = (
    "Bridge-side checks",
    "Local Bridge import in verl",
    "verl Megatron backend run",
    "Requested variants",
    "Log capture",
)
PASSING = ("Pass", "Not requested")
NOT_SHOWN = "Not shown"  # requested, but no probe or run showed it: never a Pass


@dataclass
class Deliverable:
    name: str
    status: str  # Pass | Fail | Blocked | Skipped | Not requested | Not shown (nothing exercised it)
    detail: str


def overall_result(deliverables: list[Deliverable]) -> str:
    """Pass only when every requested deliverable passed; a Fail outranks a Blocked."""
    statuses = [d.status for d in deliverables]
    if "Fail" in statuses:
        return "Fail"
    if "Blocked" in statuses or "Skipped" in statuses or NOT_SHOWN in statuses:
        return "Blocked"
    return "Pass"


def render_markdown(summary: dict) -> str:
    lines = [
        f"Result: {summary['result']} - {summary['sentence']}",
        f"Requested coverage: {summary['coverage']}",
        f"Model: {summary['model']}",
        "",
        "Deliverables:",
    ]
    lines += [f"- {d['name']}: {d['status']} - {d['detail']}" for d in summary["deliverables"]]
    ev = summary["evidence"]
    lines += [
        "",
        "Evidence:",
        f"- Bridge repo: {ev['bridge_repo']}",
        f"- verl repo: {ev['verl_repo']}",
        f"- Command: {ev['command']}",
        f"- Key lines: {ev['key_lines']}",
        "",
        "Limitations:",
    ]
    lines += [f"- {x}" for x in summary["limitations"]] or ["- none"]
    lines += ["", "Follow-ups:"]
    lines += [f"- {x}" for x in summary["follow_ups"]] or ["- none"]
    return "\n".join(lines) + "\n"


def render_junit(summary: dict) -> str:
    cases = []
    failures = errors = skipped = 0
    for d in summary["deliverables"]:
        body = ""
        msg = quoteattr(d["detail"])
        if d["status"] == "Fail":
            failures += 1
            body = f"<failure message={msg}>{escape(d['detail'])}</failure>"
        elif d["status"] == "Blocked":
            errors += 1
            body = f"<error type=\"Blocked\" message={msg}>{escape(d['detail'])}</error>"
        elif d["status"] in ("Skipped", "Not requested", NOT_SHOWN):
            skipped += 1
            body = f"<skipped message={quoteattr(d['status'] + ': ' + d['detail'])}/>"
        cases.append(f'    <testcase classname={quoteattr(summary["suite"])} name={quoteattr(d["name"])}>{body}</testcase>')
    head = (f'<testsuite name={quoteattr(summary["suite"])} tests="{len(cases)}" failures="{failures}" '
            f'errors="{errors}" skipped="{skipped}">')
    return '<?xml version="1.0" encoding="utf-8"?>\n<testsuites>\n  ' + head + "\n" + "\n".join(cases) + \
        "\n  </testsuite>\n</testsuites>\n"


def write_reports(run_dir: Path, summary: dict) -> None:
    (run_dir / "summary.md").write_text(render_markdown(summary))
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    (run_dir / "junit.xml").write_text(render_junit(summary))
