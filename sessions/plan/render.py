"""The plan as text: what a user reads of `invoke plan`.
"""

from __future__ import annotations

import json
import shlex

from sessions.plan import rules as plan_rules
from sessions.plan.analysis import TIERS
from sessions.plan.recommend import Entry, Plan


def level_command(entry: Entry, passthrough: list[str], model: str | None) -> list[str]:
    args = [f"level{entry.level}"]
    if entry.variant:
        args += ["--variant", entry.variant]
    if entry.feature:
        args += ["--feature", entry.feature]
    if model:
        args += ["--model", model]
    return args + passthrough


def _render_entry(e: Entry, passthrough: list[str], chosen_model: str | None) -> list[str]:
    model = chosen_model or e.model
    cmd = "invoke " + shlex.join(level_command(e, passthrough or [], model))
    if e.overrides:  # what `plan --run` appends: the settings that run the changed line
        cmd += " -- " + shlex.join(e.overrides)
    lines = [f"- {e.title}: {cmd}"]
    if e.optional:
        lines.append(f"    optional: {e.optional}")
    lines.append(f"    required when: {plan_rules.REQUIRED_WHEN[e.level]}")
    fams, feats = e.justified_by()
    if fams or feats:
        lines.append("    for: " + (", ".join(fams) or "-") + ("; features: " + ", ".join(feats) if feats else ""))
    for s in e.settings:
        lines.append(f"    to run the changed line: {s}")
    for r in e.reasons:
        files = ", ".join(r.files) if r.files else "-"
        lines.append(f"    [{r.rule}] {r.why}: {files}")
        for u in r.units[:3]:
            matched = f" — by {', '.join(u['matched'])}" if u.get("matched") else ""
            lines.append(f"      {u['unit']} ({TIERS[u['tier']]}){matched}")
            if u["path"]:
                lines.append(f"        path: {' → '.join(u['path'][-5:])}")
        if len(r.units) > 3:
            lines.append(f"      ... and {len(r.units) - 3} more changed unit(s)")
    moe_entry = (e.level, e.variant, e.feature) in ((2, "moe", None), (4, None, "moe"))
    if chosen_model and moe_entry and e.model and e.model != chosen_model:
        lines.append(f"    needs a MoE checkpoint: is {chosen_model} one? (proposed: {e.model})")
    if e.dummy and not chosen_model:
        lines.append(f"    no small public checkpoint: run with --dummy-config <minimal config JSON> "
                     f"--model {e.dummy['MODEL_ID']}")
    return lines


def render_text(plan: Plan, passthrough: list[str] | None = None, chosen_model: str | None = None) -> str:
    ch = plan.change
    c = ch.counts()
    lines = [f"Bridge change: {ch.repo} @ {ch.head} against {ch.base} (merge-base {ch.merge_base}): "
             f"{c['committed']} committed, {c['uncommitted']} uncommitted, {c['untracked']} untracked file(s)"]
    for h in plan.families:
        note = f" — {h.note}" if h.note else ""
        lines.append(f"Provider family: {h.family} ({len(h.files)} file(s)) → {h.proposal()}{note}")
        if h.dummy:
            lines.append(f"  dummy-model path: USE_DUMMY_MODEL=True DUMMY_MODEL_CONFIG_PATH=<file with "
                         f"{json.dumps(h.dummy['minimal_config'])}> MODEL_ID={h.dummy['MODEL_ID']} "
                         "(validates construction and training mechanics, not pretrained weights)")
    lines += ["", plan.message[:1].upper() + plan.message[1:] + "."]
    if plan.entries:
        lines += ["", "Recommended levels:"]
    for e in plan.entries:
        lines += _render_entry(e, passthrough or [], chosen_model)
    if plan.optional:
        lines += ["", "Optional (arguable; not run by plan --run):"]
    for e in plan.optional:
        lines += _render_entry(e, passthrough or [], chosen_model)
    for n in plan.notes:
        lines += ["", n]
    if plan.bridge_tests:
        lines += ["", "Bridge-side tests of this change (run first): nox -s bridge_unit -- "
                  + " ".join(plan.bridge_tests)]
    if plan.unmatched:
        lines += ["", "Changed files no rule maps to a level: " + ", ".join(plan.unmatched)]
    if plan.entries:
        lines += ["", "Run them in order (stops at the first level that is not Pass): invoke plan --run"]
    return "\n".join(lines) + "\n"
