"""The report of one bisection: summary.md (result, first bad commit, every step and why it was marked), summary.json
and the `git bisect replay` log, in the bisection's own directory under $LOG_DIR."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from env import presets

REPLAY_FILE = "bisect-replay.log"


def _cell(text: str, limit: int = 120) -> str:
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _verdict_line(step: Any, what: str) -> str:  # a driver.Step, or None when not run
    if step is None:
        return f"- {what}: not run (--max-steps reached, or the bisection took it on trust)"
    where = f"{step.run_dir}" + (" (reused)" if step.reused else "")
    err = f"; first error: `{_cell(step.first_error, 400)}`" if step.first_error else ""
    return f"- {what} {step.commit[:12]}: **{step.result}** ({step.category}){err}; run directory: {where}"


def report(b: Any, report_dir: Path, started: float, argv_display: str) -> dict:
    """summary.md, summary.json and the replay log of a finished driver.Bisection `b` (typed Any: this module
    does not import the driver that calls it)."""
    co = b.checkout
    first = b.state.first_bad if b.state else None
    contradiction = b._contradiction()
    code = b.exit_code()
    remaining = b.remaining if b.outcome in ("stopped", "failed", "interrupted") else []
    candidates = b.state.candidates if b.state and b.state.candidates else []
    if b.outcome == "found" and contradiction is None:
        sentence = f"first bad commit: {first[:12]} {co.info(first).subject!r}"
    elif b.outcome == "found":
        sentence = f"git bisect named {first[:12]}, but {contradiction}"
    elif b.outcome == "ambiguous":
        sentence = f"skipped commits leave the first bad commit ambiguous: one of {len(candidates)} candidates"
    elif b.outcome == "stopped":
        sentence = (f"stopped after {b.runs} run(s) (--max-steps {b.opts.max_steps}): the first bad commit is one of "
                    f"{len(remaining)} commits")
    elif b.outcome == "interrupted":
        sentence = "interrupted (Ctrl-C) before a first bad commit was found"
    else:
        sentence = f"failed: {b.error}"
    (report_dir / REPLAY_FILE).write_text(b.replay)

    lines = [f"# Bisect: Level {b.line.number} ({presets.LEVELS[b.line.number].title}) over "
             f"{b.opts.repo} {co.path}", "",
             f"Result: {sentence} (exit {code})", "",
             f"- command: `{argv_display}`",
             f"- level at each commit: `{b.line.display()}`",
             f"- range: good `{b.opts.good}` = {b.good[:12]} .. bad `{b.opts.bad or 'HEAD'}` = {b.bad[:12]}",
             "- marks: Pass → good; Blocked → skip; Fail → bad for "
             + ", ".join(c for c, m in sorted(b.opts.rules.items()) if m == "bad") + "; skip for every other category"
             + (f" (--on: {', '.join(f'{c}={b.opts.rules[c]}' for c in sorted(b.opts.on_given))})"
                if b.opts.on_given else " (defaults)"),
             f"- runs: {b.runs} level run(s), {sum(s.reused for s in b.steps)} Pass/Fail verdict(s) reused from "
             f"earlier run directories (Blocked ones are run again); {time.time() - started:.1f}s in all. Model, data "
             f"and Bridge unit-test records are shared "
             f"through LOG_DIR ({b.runner.log_dir}) and the settings' paths",
             f"- replay: `git bisect replay {report_dir / REPLAY_FILE}` (in {co.path}, after `git bisect start`)"]
    if b.error:
        lines.append(f"- error: {b.error}")
    if first:
        info = co.info(first)
        lines += ["", "## First bad commit", "",
                  f"- hash: {info.sha}", f"- subject: {info.subject}", f"- author: {info.author}",
                  f"- author date: {info.author_date}", "- files changed:"]
        lines += [f"  - {f}" for f in info.files] or ["  - (none)"]
        lines += ["", _verdict_line(b.judged.get(first), "verdict at the first bad commit"),
                  _verdict_line(b.judged.get(info.parent) if info.parent else None, "verdict at its parent")]
        if contradiction:
            lines += ["", f"Not trusted: {contradiction}."]
    if candidates:
        lines += ["", "## Candidates (the first bad commit is one of these)", ""]
        lines += [f"- {c[:12]} {co.info(c).subject}" for c in candidates]
    if remaining:
        lines += ["", f"## Range that remains ({len(remaining)} commits, newest first)", ""]
        lines += [f"- {c[:12]} {co.info(c).subject}" for c in remaining]
        newest_good = co.info(remaining[-1]).parent
        lines += ["", f"Go on with: invoke bisect --good {(newest_good or '<a good commit>')[:12]} --bad "
                      f"{remaining[0][:12]} (and the same level flags)"]
    lines += ["", "## Steps", "",
              "| # | commit | subject | result | category | marked | rule | time | run directory | submodules |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for s in b.steps:
        run = (s.run_dir or "-") + (" (reused)" if s.reused else "")
        mark = s.mark or "-"
        if s.purpose == "confirm":
            mark = f"(confirm) {mark}"
        lines.append(f"| {s.n} | {s.commit[:12]} | {_cell(s.subject, 60)} | {s.result} | {s.category} | {mark} | "
                     f"{_cell(s.rule)} | {s.duration_s:.1f}s | {run} | {_cell('; '.join(s.submodules)) or '-'} |")
    skipped = [s for s in b.steps if s.mark == "skip" and s.purpose == "bisect"]
    lines += ["", "## Skipped commits", ""]
    lines += [f"- {s.commit[:12]} {s.subject}: {s.rule}" + (f" — {_cell(s.first_error, 300)}" if s.first_error else "")
              for s in skipped] or ["- none"]
    notes = [f"- step {s.n} ({s.commit[:12]}): {note}" for s in b.steps for note in s.notes]
    if notes:
        lines += ["", "## Notes", "", *notes]
    lines += ["", "## Checkout", ""]
    start = b.start
    if start is not None:
        lines.append(f"- restored to {start.branch or 'detached HEAD'} at {start.head[:12]}"
                     + "".join(f"; {s.path} at {s.head[:12]}" for s in start.submodules)
                     + ("; stash popped: " + ", ".join(b.dirty) if start.stashes else ""))
    lines += [f"- PROBLEM: {p}" for p in b.restore_problems]
    (report_dir / "summary.md").write_text("\n".join(lines) + "\n")

    summary = {
        "suite": f"verl-e2e.bisect.level{b.line.number}", "result": b.outcome, "exit_code": code,
        "sentence": sentence, "repo": b.opts.repo, "path": str(co.path), "good": b.good, "bad": b.bad,
        "first_bad": first if b.outcome == "found" and contradiction is None else None, "contradiction": contradiction,
        "candidates": candidates, "remaining": remaining, "runs": b.runs,
        "reused": sum(s.reused for s in b.steps), "seconds": round(time.time() - started, 2),
        "rules": b.opts.rules, "on": sorted(b.opts.on_given), "level_command": b.line.display(),
        "steps": [asdict(s) for s in b.steps], "restore_problems": b.restore_problems, "error": b.error,
        "run_dir": str(report_dir),
    }
    (report_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
