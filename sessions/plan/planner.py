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

import ast
import fnmatch
import json
import os
import re
import shlex
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import git

from env import presets
from env.protocol import lines as tool_lines
from env.protocol.cli import task_remainder
from env.protocol.exits import BY_RESULT as EXIT_BY_RESULT
from env.repos import RepoError, open_repo
from env.settings import PROJECT_ROOT, TOOL_PREFIX, UsageError, config_section, resolve
from sessions.plan import reach as plan_reach
from sessions.plan import rules as plan_rules
from sessions.plan.reach import BridgeIndex, Evidence, Reach, Unit
from sessions.plan.rules import Family, Rule
from sessions.plan.verl_surface import SurfaceError, VerlSurface, read_surface
from sessions.run.progress import Relay
from sessions.run.report import DELIVERABLES, Deliverable, overall_result, render_junit
from sessions.run.rundir import new_run_dir

PROJECT = PROJECT_ROOT
MAX_UNTRACKED_BYTES = 2_000_000  # larger untracked files count by path only
BASE_CANDIDATES = ("upstream/main", "origin/main")
HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


# ---------------------------------------------------------------- reading the change


@dataclass
class ChangedFile:
    path: str  # repo-relative POSIX path (the new path of a rename)
    status: str  # A | M | D | R | T | ?? (untracked)
    origins: list[str] = field(default_factory=list)  # committed | uncommitted | untracked
    added: list[int] = field(default_factory=list)  # new-side line numbers of added lines
    removed: list[int] = field(default_factory=list)  # old-side line numbers of removed lines
    old_path: str | None = None  # where it was at the merge-base (None: new file)
    old_text: str | None = None  # its text at the merge-base (Python under src/ only)


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


def _diff_lines(repo: git.Repo, merge_base: str) -> dict[str, tuple[str | None, list[int], list[int]]]:
    """Per file, merge-base → working tree: (old path, added line numbers, removed line numbers). Only the
    changed lines: hunk headers and context never count."""
    text = repo.git.diff("-U0", "--no-color", "--no-ext-diff", "-M", "--ignore-submodules=dirty", merge_base)
    out: dict[str, tuple[str | None, list[int], list[int]]] = {}
    old = current = None
    new_line = old_line = 0
    for raw in text.splitlines():
        if raw.startswith("diff --git "):
            old = current = None
        elif raw.startswith("--- ") and current is None:
            old = None if raw[4:] == "/dev/null" else _unquote(raw[4:])[2:]
        elif raw.startswith("+++ ") and current is None:
            current = old if raw[4:] == "/dev/null" else _unquote(raw[4:])[2:]
            if current is not None:
                out.setdefault(current, (old, [], []))
        elif current is None:
            continue
        elif m := HUNK.match(raw):
            old_line, new_line = int(m.group(1)), int(m.group(3))
        elif raw.startswith("+"):
            out[current][1].append(new_line)
            new_line += 1
        elif raw.startswith("-"):
            out[current][2].append(old_line)
            old_line += 1
    return out


def _read_text(path: Path) -> str | None:
    try:
        if path.stat().st_size > MAX_UNTRACKED_BYTES:
            return None
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None  # binary or unreadable: it still counts by its path


def _is_bridge_python(path: str) -> bool:
    return path.startswith(plan_rules.SRC) and path.endswith(".py")


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
    lines = _diff_lines(repo, merge_base)
    files: dict[str, ChangedFile] = {}
    for origin, table in (("committed", committed), ("uncommitted", uncommitted)):
        for path, status in table.items():
            f = files.setdefault(path, ChangedFile(path, status))
            f.status = status if origin == "uncommitted" else f.status
            f.origins.append(origin)
    root = Path(repo.working_tree_dir or ".")
    for path, f in files.items():
        f.old_path, f.added, f.removed = lines.get(path, (path if f.status != "A" else None, [], []))
        if f.old_path and f.removed and _is_bridge_python(f.old_path):
            try:
                f.old_text = repo.git.show(f"{merge_base}:{f.old_path}")
            except git.GitCommandError:
                f.old_text = None
    for path in repo.untracked_files:
        text = _read_text(root / path)
        files[path] = ChangedFile(path, "??", ["untracked"], list(range(1, len(text.splitlines()) + 1))
                                  if text else [])
    return Change(repo=str(root.resolve()), head=repo.head.commit.hexsha[:7], base=base,
                  merge_base=merge_base[:7], files=sorted(files.values(), key=lambda f: f.path))


# ---------------------------------------------------------------- what the change is, and what verl reaches of it


def _matches(path: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(path, p) for p in patterns)


def is_doc(path: str) -> bool:
    return _matches(path, plan_rules.DOC_PATTERNS)


TIERS = {
    "calls": "verl runs it",
    "api": "new public Bridge API in a module verl imports (no Bridge caller: it is there for frameworks like verl)",
    "imports": "in (or called from) a module verl imports, but only Bridge's own code calls it: counts by what it "
               "is about only",
    "none": "verl never reaches it (not imported, or deep in Bridge's own pipelines)",
}


@dataclass
class ChangedUnit:
    key: str  # plan_reach unit key
    file: str
    kind: str
    tier: str  # calls | api | imports | none
    path: list[tuple[str, str]]  # from verl's surface down to the unit (unit, how)
    words: dict[str, list[str]]  # subject / code: the identifiers that count
    new: bool = False
    entries: list[str] = field(default_factory=list)  # verl entry points whose calls run it
    export_only: bool = False  # the nearest verl entry points that move weights all export them
    nearest: list[str] = field(default_factory=list)  # those nearest entry points
    family: str | None = None  # the provider folder it belongs to (None: family-independent)

    @property
    def name(self) -> str:
        return self.key.split(":", 1)[-1] if ":" in self.key else f"{self.key} (module code)"

    def to_json(self) -> dict:
        return {"unit": self.name, "file": self.file, "tier": self.tier, "new": self.new,
                "path": [f"{plan_reach_label(k)} [{how}]" for k, how in self.path],
                "entries": self.entries, "export_only": self.export_only,
                "subject": sorted(set(self.words["subject"])), "code": sorted(set(self.words["code"]))[:40]}


def plan_reach_label(key: str) -> str:
    return key.split(":", 1)[1] if ":" in key else key


def _family_folder(path: str) -> str | None:
    if not path.startswith(plan_rules.MODELS):
        return None
    rest = path[len(plan_rules.MODELS):]
    if "/" not in rest:
        return None
    folder = rest.split("/")[0]
    return None if folder in plan_rules.GENERIC_MODEL_DIRS else folder


@dataclass
class Analysis:
    """The changed units with what verl reaches of them."""

    surface: VerlSurface
    units: list[ChangedUnit]
    modules_reached: set[str]


def topic_hits(rule: Rule, idents: list[str], topics: tuple[str, ...] | None = None) -> list[str]:
    """The identifiers a rule's topics match (every word of a topic among one identifier's words)."""
    topics = [set(t.split()) for t in (topics or rule.topics)]
    return [i for i in idents if any(t <= set(plan_reach.words_of(i)) for t in topics)]


def _direction(label: str) -> str | None:
    words = set(plan_reach.words_of(label.split(".")[-1]))
    hit = lambda table: any(set(t.split()) <= words for t in table)  # noqa: E731
    if hit(plan_rules.EXPORT_WORDS):
        return "export"
    if hit(plan_rules.IMPORT_WORDS):
        return "import"
    return None


def _has_bridge_caller(index: BridgeIndex, unit: Unit) -> bool:
    """Does any Bridge source name this unit outside its own definition (a call, a registration, an import)?"""
    name = unit.name.split(".")[-1]
    pattern = re.compile(rf"\b{re.escape(name)}\b")
    for rel in index.modules.files.values():
        text = index._text(rel) or ""
        for m in pattern.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            if rel == unit.file and unit.start <= line <= unit.end:
                continue
            return True
    return False


def _direct_modules(index: BridgeIndex, surface: VerlSurface) -> set[str]:
    """The Bridge modules verl names in its imports (and where the names it imports are defined)."""
    out = set()
    for s in surface.imports:
        out.add(s.module)
        t = index.resolve(s.module, s.name) if s.name else None
        if t:
            out.add(t[1].split(":", 1)[0])
    return out


def _beside_verl_imports(index: BridgeIndex, unit: Unit, direct: set[str]) -> bool:
    """Code verl does not call counts by its subject only when it sits in a module verl imports, or is called from
    one (checkpoint loading next to the checkpoint functions verl takes; a validator ConfigContainer calls). Code
    further down Bridge's own pipelines (its SFT data, its recipes) counts for nothing."""
    if unit.module in direct:
        return True
    name = unit.name.split(".")[-1]
    for m in direct:
        info = index.modules.get(m)
        for k in info.units if info else ():
            u = index.units[k]
            if unit.key in u.refs or (unit.kind == "method" and name in u.attrs):
                return True
    return False


def analyse(change: Change, verl_repo: Path | str) -> Analysis:
    """Changed functions/classes of Bridge's source, each with whether and how verl reaches it."""
    if not any(_is_bridge_python(f.path) for f in change.files):
        return Analysis(VerlSurface(str(verl_repo)), [], set())  # no Bridge source changed: nothing to reach
    try:
        surface = read_surface(verl_repo)
    except SurfaceError as e:
        raise UsageError(str(e)) from None
    index = BridgeIndex(change.repo)
    global_reach = plan_reach.reach(index, plan_reach.verl_seeds(index, surface), surface.attributes)
    modules = {k for k in global_reach.steps if ":" not in k}
    units: dict[str, ChangedUnit] = {}
    per_unit: dict[str, tuple[Unit, set[int], set[int], list[Evidence]]] = {}
    for f in change.files:
        if not _is_bridge_python(f.path):
            continue
        text = index._text(f.path)
        if text is not None and f.added:
            code = plan_reach.code_lines(text)
            added = set(f.added) & code
            for line in sorted(added):
                u = index.unit_at(f.path, line)
                if u is not None:
                    per_unit.setdefault(u.key, (u, set(), code, []))[1].add(line)
        if f.old_text and f.removed and f.old_path:
            old = BridgeIndex(change.repo, sources={f.old_path: f.old_text})
            code = plan_reach.code_lines(f.old_text)
            for line in sorted(set(f.removed) & code):
                u = old.unit_at(f.old_path, line)
                if u is None:
                    continue
                ev = plan_reach.evidence(u, {line}, code)
                now = index.unit(u.key if ":" in u.key else u.key)
                if now is None:
                    continue  # a removed function: its callers changed too
                per_unit.setdefault(now.key, (now, set(), plan_reach.code_lines(text or ""), []))[3].append(ev)
    direct = _direct_modules(index, surface)
    entries = plan_reach.verl_entries(index, surface, global_reach)
    entry_reach: dict[str, tuple[plan_reach.Entry, Reach]] = {}
    for key, (unit, lines, code, old_evs) in per_unit.items():
        ev = plan_reach.evidence(unit, lines, code)
        # a name on both sides of an edited line did not change: only names added or removed count as code
        for part in ("code", "guards"):
            before = Counter(i for old_ev in old_evs for i in getattr(old_ev, part))
            after = Counter(getattr(ev, part))
            setattr(ev, part, list(((after - before) + (before - after)).elements()))
        ev.subject += ev.guards
        for old_ev in old_evs:
            ev.subject += [w for w in old_ev.subject if w not in ev.subject]
        if unit.kind == "module" and key in global_reach and unit.module not in direct and not any(
                k in global_reach for k in index.modules[unit.module].units if k != key):
            global_reach.steps.pop(key)  # imported on the way, nothing of it runs: its module code is no verl path
        tier = ("calls" if key in global_reach else
                "none" if unit.module not in modules else
                "api" if ev.new and not unit.name.split(".")[-1].startswith("_")
                and not _has_bridge_caller(index, unit) else
                "imports" if _beside_verl_imports(index, unit, direct) else "none")
        cu = ChangedUnit(key, unit.file, unit.kind, tier, global_reach.path(key) if tier == "calls" else
                         global_reach.path(unit.module), {"subject": ev.subject, "code": ev.code}, ev.new,
                         family=_family_folder(unit.file))
        if tier == "calls" and unit.kind != "module":
            if not entry_reach:
                for e in entries:
                    entry_reach[e.key] = (e, plan_reach.calls_from(index, e, modules))
            hits = [(e, r) for e, r in entry_reach.values() if key in r]
            cu.entries = [e.label for e, _ in hits]
            # the direction of the nearest verl entry point that moves weights one way
            directed = [(len(r.path(key)), _direction(e.label)) for e, r in hits if _direction(e.label)]
            closest = min((n for n, _ in directed), default=0)
            nearest = {d for n, d in directed if n == closest}
            cu.export_only = nearest == {"export"}
            cu.nearest = [e.label for e, r in hits if _direction(e.label) and len(r.path(key)) == closest]
            if hits:  # the shortest path from one of verl's entry points
                cu.path = min((r.path(key) for _, r in hits), key=len)
        units[key] = cu
    return Analysis(surface, sorted(units.values(), key=lambda u: (u.file, u.key)), modules)


# ---------------------------------------------------------------- rules → levels


@dataclass
class Reason:
    rule: str
    files: list[str]
    why: str
    units: list[dict] = field(default_factory=list)  # the changed functions that fired it, with verl's path
    optional: str | None = None


@dataclass
class Entry:
    level: int
    variant: str | None = None
    feature: str | None = None
    reasons: list[Reason] = field(default_factory=list)
    model: str | None = None  # proposed checkpoint for this entry
    dummy: dict | None = None  # the dummy-model path when no small public checkpoint exists
    optional: str | None = None  # offered, not required: why

    @property
    def label(self) -> str:
        extra = f" --variant {self.variant}" if self.variant else f" --feature {self.feature}" if self.feature else ""
        return f"Level {self.level}{extra}"

    @property
    def key(self) -> str:
        return f"L{self.level}" + ({"dense": "d", "moe": "m"}.get(self.variant or "", "")) + (
            f":{self.feature}" if self.feature else "")

    @property
    def title(self) -> str:
        return f"{self.label} ({presets.LEVELS[self.level].title})"

    def to_json(self) -> dict:
        out: dict[str, Any] = {"level": self.level}
        if self.variant:
            out["variant"] = self.variant
        if self.feature:
            out["feature"] = self.feature
        out["reasons"] = [{k: v for k, v in asdict(r).items() if v not in (None, [])} | {"files": r.files}
                          for r in self.reasons]
        out["model"] = self.model
        if self.dummy:
            out["dummy"] = self.dummy
        if self.optional:
            out["optional"] = self.optional
        return out


@dataclass
class FamilyHit:
    family: str
    files: list[str]
    checkpoint: str | None
    moe_checkpoint: str | None
    note: str
    dummy: dict | None
    vlm: bool = False

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
    units: list[ChangedUnit] = field(default_factory=list)
    optional: list[Entry] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "bridge_repo": self.change.repo, "head": self.change.head, "base": self.change.base,
            "merge_base": self.change.merge_base, "counts": self.change.counts(),
            "files": [{"path": f.path, "status": f.status, "origins": f.origins} for f in self.change.files],
            "docs_only": self.docs_only, "message": self.message,
            "recommendation": [e.to_json() for e in self.entries],
            "optional": [e.to_json() for e in self.optional],
            "changed_units": [u.to_json() for u in self.units],
            "families": [asdict(h) for h in self.families], "unmatched_files": self.unmatched, "notes": self.notes,
        }


def family_for(path: str) -> Family | None:
    folder = _family_folder(path)
    if folder is None:
        return None
    rest = path[len(plan_rules.MODELS) + len(folder) + 1:]
    for fam in plan_rules.FAMILIES:
        if fam.folder == folder and any(rest.startswith(p) for p in fam.prefixes):
            return fam
    return Family(folder, folder, note=f"no small public checkpoint known for the family {folder!r}: use "
                  "verl's dummy-model path with a minimal config of this architecture")


def _is_vlm_family(path: str) -> bool:
    """A provider family whose models see images (the family table says so, or its folder is named so)."""
    fam = family_for(path)
    folder = _family_folder(path) or ""
    return bool(fam and fam.vlm) or bool({"vl", "vlm", "omni"} & set(plan_reach.words_of(folder)))


def _architectures(path: Path) -> list[str]:
    """HF architectures a bridge registers (`register_bridge(source="XForCausalLM", ...)`), for a dummy config."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return []
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "register_bridge":
            for kw in n.keywords:
                if kw.arg == "source":
                    v = kw.value
                    out.append(v.value if isinstance(v, ast.Constant) else getattr(v, "id", None) or
                               getattr(v, "attr", None))
    return [a for a in out if isinstance(a, str)]


def detect_families(change: Change, units: list[ChangedUnit]) -> list[FamilyHit]:
    """Provider families the change touches (verl-reached code first), the most-touched first."""
    by_name: dict[str, tuple[Family, list[str]]] = {}
    reached = {u.file for u in units if u.tier != "none"}
    candidates = [f.path for f in change.files if f.path in reached] or [
        f.path for f in change.files if _is_bridge_python(f.path)]
    for path in candidates:
        fam = family_for(path)
        if fam is not None:
            by_name.setdefault(fam.name, (fam, []))[1].append(path)
    hits = []
    for fam, paths in sorted(by_name.values(), key=lambda x: -len(x[1])):
        dummy = None
        if not (fam.dense or fam.moe) or fam.representative:
            archs = [a for p in paths for a in _architectures(Path(change.repo) / p)]
            dummy = {"USE_DUMMY_MODEL": "True", "DUMMY_MODEL_CONFIG_PATH": "<minimal_config.json>",
                     "MODEL_ID": fam.representative or f"<org>/<smallest {fam.name} checkpoint>",
                     "minimal_config": {**({"architectures": archs[:1]} if archs else {}),
                                        **plan_rules.MINIMAL_DUMMY_CONFIG}}
        hits.append(FamilyHit(fam.name, paths, fam.dense or fam.moe, fam.moe, fam.note, dummy, fam.vlm))
    return hits


def _entry_model(entry: Entry, primary: FamilyHit | None) -> tuple[str | None, dict | None]:
    """The changed family's checkpoint with the changed modules (MoE apart); else that family's dummy path."""
    needs_moe = (entry.level == 2 and entry.variant == "moe") or (entry.level == 4 and entry.feature == "moe")
    if primary is None:  # family-independent code: any provider of the right kind runs it
        return (plan_rules.GENERIC_MOE if needs_moe else plan_rules.GENERIC_DENSE), None
    if needs_moe:
        if primary.moe_checkpoint:
            return primary.moe_checkpoint, None
        return None, primary.dummy or {"USE_DUMMY_MODEL": "True", "DUMMY_MODEL_CONFIG_PATH": "<minimal_config.json>",
                                       "MODEL_ID": f"<org>/<{primary.family} MoE checkpoint>",
                                       "minimal_config": dict(plan_rules.MINIMAL_DUMMY_CONFIG)}
    if primary.checkpoint is None:
        return None, primary.dummy
    return primary.checkpoint, None


def _fires(rule: Rule, u: ChangedUnit) -> list[str]:
    """The identifiers by which a rule fires on a changed unit ([] = it does not)."""
    if u.tier == "none" or not rule.topics and not rule.areas:
        return []
    if rule.within and not _fires(plan_rules.BY_NAME[rule.within], u):
        return []
    if rule.areas and u.tier in ("calls", "api") and _matches(u.file, rule.areas):
        return [f"{u.file} ({rule.name} code)"]
    hits = topic_hits(rule, list(u.words["subject"]))
    if u.tier in ("calls", "api") and rule.evidence == "code":
        hits += topic_hits(rule, list(u.words["code"]), rule.code_topics or rule.topics)
    return hits


def recommend(change: Change, analysis: Analysis | None = None) -> Plan:
    code = [f for f in change.files if not is_doc(f.path)]
    if not change.files:
        return Plan(change, [], [], f"no change against {change.base} (merge-base {change.merge_base}): "
                    "nothing to recommend", False, [], [])
    if not code:
        return Plan(change, [], [], f"documentation-only change ({len(change.files)} file(s)): no verl "
                    "level is required; nothing recommended", True, [], [])
    units = analysis.units if analysis else []
    fired: dict[tuple, Entry] = {}

    def add(rule: Rule, files: list[str], details: list[dict]) -> None:
        key = (rule.level, rule.variant, rule.feature)
        entry = fired.setdefault(key, Entry(rule.level, rule.variant, rule.feature))
        reason = next((r for r in entry.reasons if r.rule == rule.name), None)
        if reason is None:
            reason = Reason(rule.name, [], rule.reason, optional=rule.optional)
            entry.reasons.append(reason)
        reason.files += [f for f in files if f not in reason.files]
        reason.units += details

    for u in units:
        if u.tier in ("calls", "api"):
            add(plan_rules.BY_NAME["verl-runs-it"], [u.file], [{**u.to_json(), "matched": []}])
        for rule in plan_rules.RULES:
            hits = _fires(rule, u)
            if rule.name == "vlm" and u.tier in ("calls", "api") and u.family and _is_vlm_family(u.file):
                hits = hits or [f"{u.family} is a vision-language provider family"]
            if rule.name == "hf-export" and u.tier == "calls" and u.export_only and u.family is None:
                hits = hits or [f"the nearest verl calls that move weights export them: {', '.join(u.nearest[:3])}"]
            if hits:
                add(rule, [u.file], [{**u.to_json(), "matched": sorted(set(hits))[:8]}])
    for f in code:
        if f.path == plan_rules.SUBMODULE:
            add(plan_rules.BY_NAME["megatron-lm"], [f.path], [])
        elif _matches(f.path, plan_rules.DEPENDENCY_FILES):
            add(plan_rules.BY_NAME["dependencies"], [f.path], [])
    keys = {k for k, e in fired.items() if any(not r.optional for r in e.reasons)}
    if (4, None, "moe") in keys and (2, "moe", None) not in keys:
        add(plan_rules.BY_NAME["moe-ep-follow-up"], fired[(4, None, "moe")].reasons[0].files, [])
    if any(r.rule == "peft" for e in fired.values() for r in e.reasons) and not any(k[0] == 5 for k in keys):
        peft_files = next(r.files for e in fired.values() for r in e.reasons if r.rule == "peft")
        add(plan_rules.BY_NAME["peft-learning"], peft_files, [])
    for entry in fired.values():
        required = [r for r in entry.reasons if not r.optional]
        if not required:
            entry.optional = "; ".join(r.optional for r in entry.reasons if r.optional)
    required = [e for e in fired.values() if not e.optional]
    if required and not any(e.level == 0 for e in required):
        lvl0 = fired.setdefault((0, None, None), Entry(0))
        lvl0.optional = None
        lvl0.reasons.insert(0, Reason("level-0-first", [], plan_rules.BY_NAME["level-0-first"].reason))
    rule_order = {r.name: i for i, r in enumerate(plan_rules.RULES)}
    ordered = sorted(fired.values(), key=lambda e: (e.level, e.variant or "", e.feature or "",
                                                   min(rule_order.get(r.rule, -1) for r in e.reasons)))
    entries = [e for e in ordered if not e.optional]
    optional = [e for e in ordered if e.optional]
    families = detect_families(change, units)
    primary = families[0] if families else None
    for e in entries + optional:
        e.model, e.dummy = _entry_model(e, primary)
    matched_files = {f for e in ordered for r in e.reasons for f in r.files}
    unmatched = [f.path for f in code if f.path not in matched_files and not _matches(f.path, plan_rules.BRIDGE_OWN)
                 and f.path not in {u.file for u in units if u.tier == "none"}]
    notes = []
    outside = sorted({u.file for u in units if u.tier == "none"})
    if outside:
        notes.append("not on verl's path (verl never imports these; Bridge's own training loop, recipes or "
                     f"scripts): {', '.join(outside)} — they justify no verl level. {plan_rules.BRIDGE_TESTS_HINT}")
    bridge_own = [f.path for f in code if _matches(f.path, plan_rules.BRIDGE_OWN)]
    if bridge_own:
        notes.append(f"Bridge's own tests/CI/examples changed ({len(bridge_own)} file(s)): they never run in "
                     "verl's process; run them with nox -s bridge_unit")
    if entries and not any(e.level == 3 for e in entries):
        notes.append(plan_rules.FSDP_ON_REQUEST)
    if entries:
        docs = len(change.files) - len(code)
        message = (f"{len(entries)} level run(s) recommended for {len(code)} changed file(s)"
                   + (f" ({docs} documentation file(s) need none)" if docs else ""))
    else:
        message = (f"no rule matched the {len(code)} changed file(s) on verl's path: no level is required; "
                   "nothing recommended")
    return Plan(change, entries, families, message, False, unmatched, notes, units, optional)


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


def _render_entry(e: Entry, passthrough: list[str], chosen_model: str | None) -> list[str]:
    model = chosen_model or e.model
    cmd = "invoke " + shlex.join(level_command(e, passthrough or [], model))
    lines = [f"- {e.title}: {cmd}"]
    if e.optional:
        lines.append(f"    optional: {e.optional}")
    lines.append(f"    required when: {plan_rules.REQUIRED_WHEN[e.level]}")
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

# Level flags `plan` forwards to every level it runs (name → takes a value): those marked `forward` in the level
# flag table (sessions/run/level.py), which also declares them as plan's own flags (tasks.py).
def _passthrough() -> dict[str, bool]:
    from sessions.run.level import LEVEL_FLAGS

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
