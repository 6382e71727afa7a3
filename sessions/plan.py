"""`invoke plan`: read the Bridge change, pick the coverage levels it justifies (env/plan_rules.py), and with
`--run` run them in order through the real `invoke levelN` tasks, then write one combined report.

The change = committed since the merge-base with the base (default: the upstream main branch), plus uncommitted
(staged or not) and untracked files, read with gitpython. Levels run as `invoke levelN` subprocesses rather than
in-process `run_level` calls: each level then is exactly the command a user would type (it is recorded, and
replayable, in the combined report), resolves its settings the same way, and a level that dies cannot take the
plan's report down with it.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import git

from env import plan_rules, presets
from env.cli import EXIT_BY_RESULT
from env.plan_rules import Family, Rule
from env.repos import RepoError, open_repo
from env.settings import UsageError, config_section, resolve
from sessions.launch import TOOL_PREFIX
from sessions.progress import Relay
from sessions.report import DELIVERABLES, Deliverable, overall_result, render_junit
from sessions.rundir import new_run_dir

PROJECT = Path(__file__).resolve().parent.parent
MAX_UNTRACKED_BYTES = 2_000_000  # larger untracked files count by path only
BASE_CANDIDATES = ("upstream/main", "origin/main")


# ---------------------------------------------------------------- reading the change


@dataclass
class ChangedFile:
    path: str  # repo-relative POSIX path (the new path of a rename)
    status: str  # A | M | D | R | T | ?? (untracked)
    origins: list[str] = field(default_factory=list)  # committed | uncommitted | untracked
    lines: list[str] = field(default_factory=list)  # changed lines (+/-) and hunk context; a new file: all of it


@dataclass
class Change:
    repo: str
    head: str
    base: str
    merge_base: str
    files: list[ChangedFile]

    def counts(self) -> dict[str, int]:
        out = {"committed": 0, "uncommitted": 0, "untracked": 0}
        for f in self.files:
            for o in f.origins:
                out[o] += 1
        return out


def default_base(repo: git.Repo) -> str:
    """upstream/main, then origin/main, then what local main tracks, then local main."""
    refs = {r.name for r in repo.refs}
    for name in BASE_CANDIDATES:
        if name in refs:
            return name
    if "main" in repo.heads:
        tracking = repo.heads["main"].tracking_branch()
        if tracking is not None and tracking.name in refs:
            return tracking.name
        return "main"
    raise UsageError(f"{repo.working_tree_dir}: no upstream/main, origin/main or main branch to compare with; "
                     f"pass --base REF")


def _unquote(path: str) -> str:
    if path.startswith('"') and path.endswith('"'):
        return path[1:-1].encode("latin-1", "backslashreplace").decode("unicode_escape").encode("latin-1").decode()
    return path


def _name_status(repo: git.Repo, *args: str) -> dict[str, str]:
    out = repo.git.diff("--name-status", "-z", "-M", "--ignore-submodules=dirty", *args)
    tokens = [t for t in out.split("\0")]
    result, i = {}, 0
    while i < len(tokens) and tokens[i]:
        status = tokens[i]
        if status[0] in "RC":
            result[tokens[i + 2]] = status[0]
            i += 3
        else:
            result[tokens[i + 1]] = status[0]
            i += 2
    return result


def _diff_lines(repo: git.Repo, merge_base: str) -> dict[str, list[str]]:
    """Changed lines per file, merge-base → working tree, with each hunk's function context (`def finalize`)."""
    text = repo.git.diff("-U0", "--no-color", "--no-ext-diff", "-M", "--ignore-submodules=dirty", merge_base)
    lines: dict[str, list[str]] = {}
    old = current = None
    for raw in text.splitlines():
        if raw.startswith("diff --git "):
            old = current = None
        elif raw.startswith("--- "):
            old = None if raw[4:] == "/dev/null" else _unquote(raw[4:])[2:]
        elif raw.startswith("+++ "):
            current = old if raw[4:] == "/dev/null" else _unquote(raw[4:])[2:]
            if current is not None:
                lines.setdefault(current, [])
        elif current is None:
            continue
        elif raw.startswith("@@"):
            context = raw.split("@@", 2)[-1].strip()
            if context:
                lines[current].append(context)
        elif raw[:1] in "+-":
            lines[current].append(raw[1:])
    return lines


def _read_text(path: Path) -> list[str]:
    try:
        if path.stat().st_size > MAX_UNTRACKED_BYTES:
            return []
        return path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return []  # binary or unreadable: it still counts by its path


def read_change(bridge_repo: Path | str, base: str | None = None) -> Change:
    """The Bridge change: committed since merge-base(base, HEAD), plus uncommitted and untracked files."""
    try:
        repo = open_repo(bridge_repo, "BRIDGE_REPO")
    except RepoError as e:
        raise UsageError(str(e)) from None
    base = base or default_base(repo)
    try:
        repo.commit(base)
    except (git.BadName, ValueError, git.GitCommandError):
        raise UsageError(f"--base {base!r} is not a commit or branch of {repo.working_tree_dir}") from None
    bases = repo.merge_base(base, "HEAD")
    if not bases:
        raise UsageError(f"{base} and HEAD of {repo.working_tree_dir} share no history (no merge-base)")
    merge_base = bases[0].hexsha
    committed = _name_status(repo, merge_base, "HEAD")
    uncommitted = _name_status(repo, "HEAD")
    content = _diff_lines(repo, merge_base)
    files: dict[str, ChangedFile] = {}
    for origin, table in (("committed", committed), ("uncommitted", uncommitted)):
        for path, status in table.items():
            f = files.setdefault(path, ChangedFile(path, status))
            f.status = status if origin == "uncommitted" else f.status
            f.origins.append(origin)
    for path, f in files.items():
        f.lines = content.get(path, [])
    root = Path(repo.working_tree_dir or ".")
    for path in repo.untracked_files:
        files[path] = ChangedFile(path, "??", ["untracked"], _read_text(root / path))
    return Change(repo=str(root.resolve()), head=repo.head.commit.hexsha[:7], base=base,
                  merge_base=merge_base[:7], files=sorted(files.values(), key=lambda f: f.path))


# ---------------------------------------------------------------- matching rules


def _matches(path: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(path, p) for p in patterns)


def is_doc(path: str) -> bool:
    return _matches(path, plan_rules.DOC_PATTERNS)


_COMPILED: dict[str, re.Pattern | None] = {
    r.name: re.compile("|".join(f"(?:{c})" for c in r.content)) if r.content else None for r in plan_rules.RULES
}


def rule_fires(rule: Rule, f: ChangedFile) -> bool:
    if _matches(f.path, rule.exclude):
        return False
    if _matches(f.path, rule.paths):
        return True
    regex = _COMPILED[rule.name]
    return bool(regex and _matches(f.path, rule.content_scope) and any(regex.search(line) for line in f.lines))


@dataclass
class Reason:
    rule: str
    files: list[str]
    why: str


@dataclass
class Entry:
    level: int
    variant: str | None = None
    feature: str | None = None
    reasons: list[Reason] = field(default_factory=list)
    model: str | None = None  # proposed checkpoint for this entry
    dummy: dict | None = None  # the dummy-model path when no small public checkpoint exists

    @property
    def label(self) -> str:
        extra = f" --variant {self.variant}" if self.variant else f" --feature {self.feature}" if self.feature else ""
        return f"Level {self.level}{extra}"

    @property
    def title(self) -> str:
        return f"{self.label} ({presets.LEVELS[self.level].title})"

    def to_json(self) -> dict:
        out: dict[str, Any] = {"level": self.level}
        if self.variant:
            out["variant"] = self.variant
        if self.feature:
            out["feature"] = self.feature
        out["reasons"] = [asdict(r) for r in self.reasons]
        out["model"] = self.model
        if self.dummy:
            out["dummy"] = self.dummy
        return out


@dataclass
class FamilyHit:
    family: str
    files: list[str]
    checkpoint: str | None
    moe_checkpoint: str | None
    note: str
    dummy: dict | None

    def proposal(self) -> str:
        if self.checkpoint:
            return self.checkpoint
        assert self.dummy
        return (f"dummy model: USE_DUMMY_MODEL=True DUMMY_MODEL_CONFIG_PATH=<minimal_config.json> "
                f"MODEL_ID={self.dummy['MODEL_ID']}")


@dataclass
class Plan:
    change: Change
    entries: list[Entry]
    families: list[FamilyHit]
    message: str
    docs_only: bool
    unmatched: list[str]
    notes: list[str]

    def to_json(self) -> dict:
        return {
            "bridge_repo": self.change.repo, "head": self.change.head, "base": self.change.base,
            "merge_base": self.change.merge_base, "counts": self.change.counts(),
            "files": [{"path": f.path, "status": f.status, "origins": f.origins} for f in self.change.files],
            "docs_only": self.docs_only, "message": self.message,
            "recommendation": [e.to_json() for e in self.entries],
            "families": [asdict(h) for h in self.families], "unmatched_files": self.unmatched, "notes": self.notes,
        }


def _family_of(path: str) -> Family | None:
    if not path.startswith(plan_rules.MODELS):
        return None
    for fam in plan_rules.FAMILIES:
        if _matches(path, fam.paths):
            return fam
    rest = path[len(plan_rules.MODELS):]
    if "/" not in rest or rest.split("/")[0] in plan_rules.GENERIC_MODEL_DIRS:
        return plan_rules.GENERIC
    name = rest.split("/")[0]
    return Family(name, (), note=f"no small public checkpoint known for the new family {name!r}: use verl's "
                  "dummy-model path with a minimal config of this architecture")


def detect_families(files: list[ChangedFile]) -> list[FamilyHit]:
    """Families touched, the most-touched first; generic provider code only when no family is."""
    by_name: dict[str, tuple[Family, list[str]]] = {}
    for f in files:
        if is_doc(f.path):
            continue
        fam = _family_of(f.path)
        if fam is not None:
            by_name.setdefault(fam.name, (fam, []))[1].append(f.path)
    hits = []
    for fam, paths in sorted(by_name.values(), key=lambda x: -len(x[1])):
        dummy = None
        if not (fam.dense or fam.moe) or fam.representative:
            dummy = {"USE_DUMMY_MODEL": "True", "DUMMY_MODEL_CONFIG_PATH": "<minimal_config.json>",
                     "MODEL_ID": fam.representative or "<org>/<representative-model-name>",
                     "minimal_config": {**({"model_type": fam.model_type} if fam.model_type else {}),
                                        **plan_rules.MINIMAL_DUMMY_CONFIG}}
        hits.append(FamilyHit(fam.name, paths, fam.dense or fam.moe, fam.moe, fam.note, dummy))
    specific = [h for h in hits if h.family != plan_rules.GENERIC.name]
    return specific or hits


def _entry_model(entry: Entry, primary: FamilyHit | None) -> tuple[str | None, dict | None]:
    needs_moe = (entry.level == 2 and entry.variant == "moe") or (entry.level == 4 and entry.feature == "moe")
    if primary is None:
        return (plan_rules.DEFAULT_MOE if needs_moe else plan_rules.GENERIC.dense), None
    if needs_moe:
        return primary.moe_checkpoint or plan_rules.DEFAULT_MOE, None
    if primary.checkpoint is None:
        return None, primary.dummy
    return primary.checkpoint, None


def recommend(change: Change) -> Plan:
    code = [f for f in change.files if not is_doc(f.path)]
    families = detect_families(change.files)
    if not change.files:
        return Plan(change, [], families, f"no change against {change.base} (merge-base {change.merge_base}): "
                    "nothing to recommend", False, [], [])
    if not code:
        return Plan(change, [], families, f"documentation-only change ({len(change.files)} file(s)): no verl "
                    "level is required; nothing recommended", True, [], [])
    fired: dict[tuple[int, str | None, str | None], dict[str, list[str]]] = {}
    matched: set[str] = set()
    for rule in (r for r in plan_rules.RULES if not r.fallback):
        for f in code:
            if rule_fires(rule, f):
                fired.setdefault((rule.level, rule.variant, rule.feature), {}).setdefault(rule.name, []).append(f.path)
                matched.add(f.path)
    for rule in (r for r in plan_rules.RULES if r.fallback):
        for f in code:
            if f.path not in matched and rule_fires(rule, f):
                fired.setdefault((rule.level, rule.variant, rule.feature), {}).setdefault(rule.name, []).append(f.path)
                matched.add(f.path)
    unmatched = [f.path for f in code if f.path not in matched]
    entries = [Entry(level, variant, feature,
                     [Reason(name, files, plan_rules.BY_NAME[name].reason) for name, files in rules.items()])
               for (level, variant, feature), rules in fired.items()]
    if entries and not any(e.level == 0 for e in entries):
        entries.append(Entry(0, reasons=[Reason("level-0-first", [], "every coverage starts at Level 0: the smoke "
                                                "must pass before any other level means anything")]))
    rule_order = {r.name: i for i, r in enumerate(plan_rules.RULES)}
    entries.sort(key=lambda e: (e.level, min(rule_order.get(r.rule, -1) for r in e.reasons)))
    primary = families[0] if families else None
    for e in entries:
        e.model, e.dummy = _entry_model(e, primary)
    notes = []
    if entries and not any(e.level == 3 for e in entries):
        notes.append(plan_rules.FSDP_ON_REQUEST)
    if entries:
        docs = len(change.files) - len(code)
        message = (f"{len(entries)} level run(s) recommended for {len(code)} changed file(s)"
                   + (f" ({docs} documentation file(s) need none)" if docs else ""))
    else:
        message = (f"no rule matched the {len(code)} changed file(s) (none on verl's path through Bridge): no "
                   "level is required; nothing recommended")
    return Plan(change, entries, families, message, False, unmatched, notes)


# ---------------------------------------------------------------- showing the plan


def level_command(entry: Entry, passthrough: list[str], model: str | None) -> list[str]:
    args = [f"level{entry.level}"]
    if entry.variant:
        args += ["--variant", entry.variant]
    if entry.feature:
        args += ["--feature", entry.feature]
    if model:
        args += ["--model", model]
    return args + passthrough


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
        lines.append("")
        lines.append("Recommended levels:")
    for e in plan.entries:
        model = chosen_model or e.model
        cmd = "invoke " + shlex.join(level_command(e, passthrough or [], model))
        lines.append(f"- {e.title}: {cmd}")
        lines.append(f"    required when: {plan_rules.REQUIRED_WHEN[e.level]}")
        for r in e.reasons:
            files = ", ".join(r.files) if r.files else "-"
            lines.append(f"    [{r.rule}] {r.why}: {files}")
        moe_entry = (e.level, e.variant, e.feature) in ((2, "moe", None), (4, None, "moe"))
        if chosen_model and moe_entry and e.model and e.model != chosen_model:
            lines.append(f"    needs a MoE checkpoint: is {chosen_model} one? (proposed: {e.model})")
        if e.dummy and not chosen_model:
            lines.append(f"    no small public checkpoint: run with --dummy-config <minimal config JSON> "
                         f"--model {e.dummy['MODEL_ID']}")
    for n in plan.notes:
        lines += ["", n]
    if plan.unmatched:
        lines += ["", "Changed files no rule maps to a level: " + ", ".join(plan.unmatched)]
    if plan.entries:
        lines += ["", "Run them in order (stops at the first level that is not Pass): invoke plan --run"]
    return "\n".join(lines) + "\n"


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


RANK = {"Fail": 4, "Blocked": 3, "Skipped": 2, "Pass": 1, "Not requested": 0}
RUN_DIR_LINE = re.compile(re.escape(TOOL_PREFIX) + r" run directory: (.+)$")


def _invoke_argv(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "invoke", "--search-root", str(PROJECT), *args]


def run_one(entry: Entry, args: list[str], remainder: list[str], echo) -> LevelResult:
    """Run `invoke levelN ...` as a subprocess, streaming its output; read its run directory's summary.json."""
    argv = _invoke_argv(args + (["--", *remainder] if remainder else []))
    display = ["invoke", *args] + (["--", *remainder] if remainder else [])
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    run_dir = None
    tail: list[str] = []
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            echo(line.rstrip("\n"))
            tail = (tail + [line.rstrip("\n")])[-5:]
            m = RUN_DIR_LINE.search(line.rstrip("\n"))
            if m:
                run_dir = m.group(1).strip()
        code = proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait()
        raise
    summary = None
    if run_dir and (Path(run_dir) / "summary.json").is_file():
        summary = json.loads((Path(run_dir) / "summary.json").read_text())
    if summary is not None:
        return LevelResult(entry, summary["result"], display, run_dir, code, summary)
    last = next((t for t in reversed(tail) if t.strip()), "no output")
    return LevelResult(entry, "Blocked", display, run_dir, code, None,
                       f"invoke level{entry.level} exited {code} without a summary: {last}")


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
    from sessions.report import render_markdown

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
        res = run_one(entry, args, remainder, echo)
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

# Level flags `plan` forwards to every level it runs (name → takes a value).
PASSTHROUGH: dict[str, bool] = {
    "bridge_repo": True, "verl_repo": True, "log_dir": True, "num_gpus": True, "model_path": True,
    "bridge_tests": True, "dummy_config": True, "skip_bridge_checks": False, "no_reward_model": False,
    "enforce_eager": False, "allow_missing": False, "verbose": False,
}


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
        remainder = shlex.split(getattr(c, "remainder", "") or "")
    except ValueError as e:
        raise UsageError(f"cannot parse the overrides after --: {e}") from None
    plan = recommend(read_change(settings.bridge_repo, base))
    passthrough = passthrough_args(flags)
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
            res = run_one(entry, args, remainder, echo)
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
