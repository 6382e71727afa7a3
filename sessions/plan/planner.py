"""`invoke plan`: read the Bridge change, decide which coverage levels it justifies from what verl actually reaches
(sessions/plan/verl_surface.py reads verl's use of Bridge, sessions/plan/reach.py follows it through Bridge's code, the
rules are data in sessions/plan/rules.py), and with `--run` run them in order through the real `invoke levelN` tasks,
then write one combined report.

The change = committed since the merge-base with the base (default: the upstream main branch), plus uncommitted
(staged or not) and untracked files, read with gitpython. Levels run as `invoke levelN` subprocesses rather than
in-process `run_level` calls: each level then is exactly the command a user would type (it is recorded, and
replayable, in the combined report), resolves its settings the same way, and a level that dies cannot take the
plan's report down with it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from env.protocol import lines as tool_lines
from env.protocol.cli import task_remainder
from env.protocol.exits import BY_RESULT as EXIT_BY_RESULT
from env.protocol.relay import Relay
from env.settings import PROJECT_ROOT, TOOL_PREFIX, UsageError, config_section, resolve
from sessions.plan.analysis import Analysis, ChangedUnit, analyse  # noqa: F401 (the planner's API)
from sessions.plan.change import Change, ChangedFile, read_change  # noqa: F401
from sessions.plan.recommend import Entry, Plan, recommend  # noqa: F401
from sessions.plan.render import level_command, render_text
from sessions.run.report import DELIVERABLES, NOT_SHOWN, Deliverable, overall_result, render_junit
from sessions.run.rundir import new_run_dir

PROJECT = PROJECT_ROOT


# ---------------------------------------------------------------- running the plan


@dataclass
class LevelResult:
    entry: Entry
    status: str  # Pass | Fail | Blocked | Skipped
    command: list[str]
    run_dir: str | None = None
    exit_code: int | None = None
    summary: dict | None = None  # the level's summary.json
    reason: str = ""  # why Skipped / why there is no summary

    def to_json(self) -> dict:
        return {**self.entry.to_json(), "label": self.entry.label, "status": self.status, "command": shlex.join(self.command),
                "run_dir": self.run_dir, "exit_code": self.exit_code, "reason": self.reason,
                "result": (self.summary or {}).get("result"), "sentence": (self.summary or {}).get("sentence")}


# the combined deliverable is the worst of the levels': a criterion one level could not show is no Pass
RANK = {"Fail": 5, "Blocked": 4, NOT_SHOWN: 3, "Skipped": 2, "Pass": 1, "Not requested": 0}


def run_one(entry: Entry, args: list[str], remainder: list[str], echo) -> LevelResult:
    """Run `invoke levelN ...` as a child (env/protocol/child.py: its Ctrl-C policy), streaming its output; read its
    run directory's summary.json."""
    from env.protocol.child import run_task

    full = args + (["--", *remainder] if remainder else [])
    display = ["invoke", *full]
    child = run_task(full, echo, reraise=True)  # Ctrl-C: the level stops verl and writes its summary, then we stop
    code, run_dir = child.code, (str(child.run_dir) if child.run_dir else None)
    summary = None
    if run_dir and (Path(run_dir) / "summary.json").is_file():
        summary = json.loads((Path(run_dir) / "summary.json").read_text())
    if summary is not None:
        return LevelResult(entry, summary["result"], display, run_dir, code, summary)
    return LevelResult(entry, "Blocked", display, run_dir, code, None,
                       f"invoke level{entry.level} exited {code} without a summary: {child.last_line()}")


def _deliverable(results: list[LevelResult], name: str) -> Deliverable:
    parts, statuses = [], []
    per_bridge = name in ("Bridge-side checks", "Local Bridge import in verl")  # one Bridge state for all levels
    for r in results:
        if name == "Requested variants" and r.entry.level == 0:
            continue  # Level 0 requests no variant
        if r.summary is not None:
            d = next(d for d in r.summary["deliverables"] if d["name"] == name)
            status, detail = d["status"], d["detail"]
        elif per_bridge:
            continue  # said by the levels that ran
        elif r.status == "Skipped" or name != "verl Megatron backend run":
            status, detail = "Skipped", r.reason if r.status == "Skipped" else "no level summary (see the verl run)"
        else:
            status, detail = r.status, r.reason
        statuses.append(status)
        parts.append(f"{r.entry.label}: {status} - {detail}")
    if not statuses:
        if name == "Requested variants":
            return Deliverable(name, "Not requested", "only Level 0 recommended")
        return Deliverable(name, "Skipped", "no level got far enough to check it")
    worst = max(statuses, key=lambda s: RANK[s])
    return Deliverable(name, worst, "; ".join(parts))


def combined_summary(plan: Plan, results: list[LevelResult], plan_dir: Path, plan_cmd: str) -> dict:
    deliverables = [_deliverable(results, name) for name in DELIVERABLES]
    result = overall_result(deliverables)
    labels = ", ".join(r.entry.label for r in results)
    if result == "Pass":
        sentence = f"every recommended level passed ({labels})."
    else:
        bad = next(r for r in results if r.status != "Pass")
        why = (bad.summary or {}).get("sentence") or bad.reason
        skipped = [r.entry.label for r in results if r.status == "Skipped" and r is not bad]
        sentence = (f"{bad.entry.title} {bad.status}: {why.rstrip('.')}"
                    + (f"; not run: {', '.join(skipped)}" if skipped else "") + ".")
        if result == "Blocked":
            sentence += " Not evidence against the Bridge provider."
    ran = [r for r in results if r.summary]
    first = ran[0].summary if ran else None
    models = list(dict.fromkeys(r.summary["model"] for r in ran))
    limitations, follow_ups, key_lines = [], [], []
    for r in ran:
        limitations += [f"{r.entry.label}: {x}" for x in r.summary["limitations"]]
        follow_ups += [f"{r.entry.label}: {x}" for x in r.summary["follow_ups"]]
        key_lines.append(f"{r.entry.label}: {r.summary['evidence']['key_lines']}")
    skipped = [r for r in results if r.status == "Skipped"]
    if skipped:
        follow_ups.append(f"rerun after the fix: {plan_cmd} (not run: {', '.join(r.entry.label for r in skipped)})")
    limitations += plan.notes
    return {
        "suite": "verl-e2e.plan",
        "result": result,
        "exit_code": EXIT_BY_RESULT[result],
        "sentence": sentence,
        "coverage": ", ".join(r.entry.title for r in results) + " (recommended by invoke plan)",
        "model": ", ".join(models) or "none (no level ran)",
        "deliverables": [asdict(d) for d in deliverables],
        "evidence": {
            "bridge_repo": first["evidence"]["bridge_repo"] if first else plan.change.repo,
            "verl_repo": first["evidence"]["verl_repo"] if first else "not reached",
            "command": plan_cmd + " → " + " ; ".join(shlex.join(r.command) for r in results),
            "key_lines": " | ".join(key_lines) or "none (no level ran)",
        },
        "limitations": list(dict.fromkeys(limitations)),
        "follow_ups": list(dict.fromkeys(follow_ups)),
        "levels": [r.to_json() for r in results],
        "plan": plan.to_json(),
        "run_dir": str(plan_dir),
    }


def render_combined(summary: dict, results: list[LevelResult], plan: Plan) -> str:
    from sessions.run.report import render_markdown

    lines = [render_markdown(summary).rstrip("\n"), "", "Plan:"]
    for e in plan.entries:
        lines.append(f"- {e.title}: " + "; ".join(f"[{r.rule}] {', '.join(r.files) or '-'}" for r in e.reasons))
    for r in results:
        lines += ["", f"## {r.entry.title}: {r.status}"]
        lines.append(f"Command: {shlex.join(r.command)}")
        if r.run_dir:
            lines.append(f"Run directory: {r.run_dir}")
        if r.summary is not None and r.run_dir and (Path(r.run_dir) / "summary.md").is_file():
            lines += ["", (Path(r.run_dir) / "summary.md").read_text().rstrip("\n")]
        else:
            lines.append(f"{r.status}: {r.reason}")
    return "\n".join(lines) + "\n"


def _junit(summary: dict) -> str:
    # one testcase per level run, in the same shape as a level's own junit.xml
    cases = {"suite": summary["suite"], "deliverables": [
        {"name": lv["label"], "status": lv["status"], "detail": lv["sentence"] or lv["reason"]}
        for lv in summary["levels"]]}
    return render_junit(cases)


def execute(plan: Plan, passthrough: list[str], remainder: list[str], keep_going: bool, model_for,
            log_dir: Path, plan_cmd: str, echo, default_model: str) -> tuple[dict, Path, list[LevelResult]]:
    plan_dir = new_run_dir(log_dir, "plan", model_for(plan.entries[0]) or default_model)
    echo(f"{TOOL_PREFIX} plan run directory: {plan_dir}")
    tool_lines.note_run_dir(plan_dir)
    results: list[LevelResult] = []
    stop: LevelResult | None = None
    for entry in plan.entries:
        args = level_command(entry, passthrough, model_for(entry))
        if stop is not None:
            why = (stop.summary or {}).get("sentence") or stop.reason
            results.append(LevelResult(entry, "Skipped", ["invoke", *args],
                                       reason=f"not run: {stop.entry.label} was {stop.status} — {why} "
                                              f"(--keep-going runs later levels anyway)"))
            continue
        echo(f"{TOOL_PREFIX} plan: {entry.title}: invoke {shlex.join(args)}")
        res = run_one(entry, args, remainder + entry.overrides, echo)
        results.append(res)
        echo(f"{TOOL_PREFIX} plan: {entry.title}: {res.status}")
        if res.status != "Pass" and not keep_going:
            stop = res
    summary = combined_summary(plan, results, plan_dir, plan_cmd)
    (plan_dir / "plan.json").write_text(json.dumps(plan.to_json(), indent=2))
    (plan_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    (plan_dir / "summary.md").write_text(render_combined(summary, results, plan))
    (plan_dir / "junit.xml").write_text(_junit(summary))
    return summary, plan_dir, results


# ---------------------------------------------------------------- the task body

# Level flags `plan` forwards to every level it runs (name → takes a value): those marked `forward` in the level
# flag table (sessions/run/level.py), which also declares them as plan's own flags (tasks.py).
def _passthrough() -> dict[str, bool]:
    from sessions.run.level_task import LEVEL_FLAGS

    return {f.name: f.takes_value for f in LEVEL_FLAGS if f.forward}


PASSTHROUGH: dict[str, bool] = _passthrough()


def passthrough_args(flags: dict[str, Any]) -> list[str]:
    args = []
    for name, takes_value in PASSTHROUGH.items():
        value = flags.get(name)
        if value in (None, False, ""):
            continue
        flag = "--" + name.replace("_", "-")
        args += [flag, str(value)] if takes_value else [flag]
    return args


def plan_command(c: Any, flags: dict[str, Any], base: str | None = None, run: bool = False,
                 keep_going: bool = False, as_json: bool = False, dry_run: bool = False) -> int:
    model = flags.get("model")
    if model is not None and not re.fullmatch(r"[\w.\-]+/[\w.\-]+", model):
        raise UsageError(f"--model must look like ORG/NAME, got {model!r}")
    setting_flags = {k: flags.get(k) for k in ("bridge_repo", "verl_repo", "log_dir", "num_gpus", "model_path")}
    setting_flags["model_id"] = model
    settings = resolve(setting_flags, os.environ, config_section(getattr(c, "config", None)))
    if settings.bridge_repo is None:
        raise UsageError("BRIDGE_REPO is not set (--bridge-repo or BRIDGE_REPO)")
    try:
        remainder = shlex.split(task_remainder(c))
    except ValueError as e:
        raise UsageError(f"cannot parse the overrides after --: {e}") from None
    if settings.verl_repo is None:
        raise UsageError("VERL_REPO is not set (--verl-repo or VERL_REPO): the plan reads which Bridge names verl "
                         "uses from the verl checkout")
    change = read_change(settings.bridge_repo, base)
    plan = recommend(change, analyse(change, settings.verl_repo))
    passthrough = passthrough_args(flags)
    if plan.bridge_tests and not flags.get("bridge_tests") and not flags.get("skip_bridge_checks"):
        passthrough += ["--bridge-tests", ",".join(plan.bridge_tests)]  # the change's own tests, run first
    # The user's model (flag, env, invoke.yaml, or a local MODEL_PATH) wins; else each level gets its proposal.
    user_model = settings.model_id if (settings.source("model_id") != "default"
                                       or settings.source("model_path") not in ("default", "unset")) else None

    def model_for(entry: Entry) -> str | None:
        return model or (None if user_model else entry.model)

    chosen = user_model
    if not run:
        if as_json:
            json.dump(plan.to_json(), sys.stdout, indent=2)
            print()
        else:
            sys.stdout.write(render_text(plan, passthrough, chosen))
        return 0
    if not plan.entries:
        if as_json:
            json.dump({**plan.to_json(), "result": None, "levels": []}, sys.stdout, indent=2)
            print()
        else:
            sys.stdout.write(render_text(plan, passthrough, chosen) + "Nothing to run.\n")
        return 0
    out = sys.stderr if as_json else sys.stdout
    echo = (relay := Relay(out)).line  # each level's status lines: one line redrawn in place on a terminal

    if dry_run:  # every level's own --dry-run: its exact environment and command, nothing started
        if not as_json:
            sys.stdout.write(render_text(plan, passthrough, chosen) + "\n")
        dry = []
        for entry in plan.entries:
            args = level_command(entry, passthrough, model_for(entry)) + ["--dry-run"]
            echo(f"{TOOL_PREFIX} plan (dry-run): {entry.title}: invoke {shlex.join(args)}")
            res = run_one(entry, args, remainder + entry.overrides, echo)
            dry.append({**entry.to_json(), "command": shlex.join(res.command), "exit_code": res.exit_code})
            if res.exit_code != 0:
                raise UsageError(f"invoke level{entry.level} --dry-run exited {res.exit_code}: {res.reason}")
        if as_json:
            json.dump({**plan.to_json(), "dry_run": dry}, sys.stdout, indent=2)
            print()
        return 0

    if not as_json:
        sys.stdout.write(render_text(plan, passthrough, chosen) + "\n")
    plan_cmd = "invoke plan --run" + (f" --base {shlex.quote(base)}" if base else "") + (
        " --keep-going" if keep_going else "")
    summary, plan_dir, results = execute(plan, passthrough, remainder, keep_going, model_for,
                                         Path(settings.log_dir), plan_cmd, echo, settings.model_id)
    relay.close()
    if as_json:
        json.dump(summary, sys.stdout, indent=2, default=str)
        print()
    else:
        print()
        print((plan_dir / "summary.md").read_text(), end="")
        print(f"{TOOL_PREFIX} plan run directory: {plan_dir}")
    return summary["exit_code"]
