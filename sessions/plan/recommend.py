"""Rules → levels: which coverage levels the analysed change justifies, each with its reasons.
"""

from __future__ import annotations

import ast
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from env import presets
from sessions.plan import bridge_tests as plan_bridge_tests
from sessions.plan import features as plan_features
from sessions.plan import line_settings
from sessions.plan import rules as plan_rules
from sessions.plan.analysis import Analysis, ChangedUnit, _matches, is_doc, topic_hits
from sessions.plan.change import Change, ChangedFile, _is_bridge_python
from sessions.plan.evidence import topic_in
from sessions.plan.rules import Family, Rule


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
    settings: list[str] = field(default_factory=list)  # what it takes to run the changed line (beyond the preset)
    overrides: list[str] = field(default_factory=list)  # the Hydra overrides that do it (plan --run appends them)
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

    def justified_by(self) -> tuple[list[str], dict[str, list[str]]]:
        """The families whose changed code justified this level ("all families" for shared code) and the features
        (with their facts) it involves: Level 4 its own feature, the other levels what the changed code touches."""
        fams: list[str] = []
        feats: dict[str, list[str]] = {}
        for r in self.reasons:
            for u in r.units:
                fams += [f for f in u.get("families", []) if f not in fams]
                if self.feature:
                    feats.setdefault(self.feature, []).extend(x for x in u.get("matched", [])
                                                              if x not in feats[self.feature])
                else:
                    for f, facts in (u.get("touched") or {}).items():
                        feats.setdefault(f, []).extend(x for x in facts if x not in feats.get(f, []))
        return fams, {f: v[:6] for f, v in feats.items()}

    def to_json(self) -> dict:
        out: dict[str, Any] = {"level": self.level}
        if self.variant:
            out["variant"] = self.variant
        if self.feature:
            out["feature"] = self.feature
        out["reasons"] = [{k: v for k, v in asdict(r).items() if v not in (None, [])} | {"files": r.files}
                          for r in self.reasons]
        out["families"], out["features"] = self.justified_by()
        out["model"] = self.model
        if self.dummy:
            out["dummy"] = self.dummy
        if self.optional:
            out["optional"] = self.optional
        if self.settings:
            out["settings"], out["overrides"] = self.settings, self.overrides
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
    bridge_tests: list[str] = field(default_factory=list)  # the change's own (or nearest) Bridge test files

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
            "bridge_tests": self.bridge_tests,
        }


def family_for(path: str) -> Family | None:
    folder = plan_features.folder_of(path)
    if folder is None:
        return _family_of_bridge_file(path)
    rest = path[len(plan_rules.MODELS) + len(folder) + 1:]
    for fam in plan_rules.FAMILIES:
        if fam.folder == folder and any(rest.startswith(p) for p in fam.prefixes):
            return fam
    return Family(folder, folder, note=f"no small public checkpoint known for the family {folder!r}: use "
                  "verl's dummy-model path with a minimal config of this architecture")


def _family_of_bridge_file(path: str) -> Family | None:
    """A bridge module in a folder of shared model code (models/mamba/nemotron_h_bridge.py, before NemotronH had
    its own folder): the family whose folder is named as the module is (nemotronh)."""
    name = Path(path).stem
    if not path.startswith(plan_rules.MODELS) or not name.endswith("_bridge"):
        return None
    compact = name[: -len("_bridge")].replace("_", "")
    return next((fam for fam in plan_rules.FAMILIES if fam.folder == compact), None)


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
    live = [u for u in units if u.tier != "none"]
    reached = {u.file for u in live}
    candidates = [f.path for f in change.files if f.path in reached] or [
        f.path for f in change.files if _is_bridge_python(f.path)]
    found = [(path, fam) for path in candidates if (fam := family_for(path)) is not None]
    # shared-folder code that is only some families' own (a base provider their bridges build): those families;
    # code every family loads through keeps the representative checkpoint
    if not found and live and all(u.served for u in live):
        served = dict.fromkeys(f["bridge_file"] for u in live for f in u.served)
        found = [(path, fam) for path in served if (fam := family_for(path)) is not None]
    for path, fam in found:
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


def _serving_family(change: Change, entry: Entry) -> FamilyHit | None:
    """For a Level 4 entry of shared code that some families build (a shared layer module their specs use): the
    first of those families, so the run exercises the changed code."""
    if entry.level != 4:
        return None
    files = [f["file"] for r in entry.reasons for u in r.units for f in u.get("served_by", [])]
    if not files:
        return None
    hits = _families_of_file(change, files[0])
    return hits[0] if hits else None


def _families_of_file(change: Change, path: str) -> list[FamilyHit]:
    """The family a bridge file of the change's checkout is (with its checkpoints), as if only it had changed."""
    return detect_families(Change(change.repo, change.head, change.base, change.merge_base,
                                  [ChangedFile(path, "M")]), [])


def _naming_family(change: Change, entry: Entry) -> tuple[FamilyHit, str] | None:
    """For a Level 4 entry of shared code that no family's code calls (a GDN weight split in the conversion
    module): a family whose own code names what the changed code handles, with the reason, when the representative
    model of the feature is none of them (Qwen2.5 has no GDN layer: its run would never take the changed lines)."""
    if entry.level != 4:
        return None
    files = list(dict.fromkeys(b for r in entry.reasons for u in r.units
                               for b in u.get("named_by", {}).get(entry.feature, [])))
    hits = [h for b in files for h in _families_of_file(change, b)]
    generic = _generic_model(entry)
    if not hits or any(generic in (h.checkpoint, h.moe_checkpoint) for h in hits):
        return None
    best = _best_family(hits, _needs_moe(entry))
    return best, (f"model of the {best.family} family: its own code ({best.files[0]}) names what the changed "
                  f"{entry.feature} code handles; {generic} does not, its run would not take the changed lines")


def _best_family(hits: list[FamilyHit], moe: bool) -> FamilyHit:
    """A public checkpoint of the kind the entry runs first (a small dense one unless MoE), the dummy path last;
    among equals the first (the change's most-touched family)."""
    return min(hits, key=lambda h: (h.dummy is not None, (h.moe_checkpoint is None) if moe
                                    else (h.checkpoint in (None, h.moe_checkpoint))))


def _entry_family(entry: Entry, families: list[FamilyHit]) -> FamilyHit | None:
    """Of the change's families, the one an entry runs on: among those whose code its reasons are about (the
    changed units' own files and the bridges serving them; for shared code, all of the change's), the best of the
    kind it runs. A change to several families (GLM-4.5's and GPT-OSS's bridges) runs GPT-OSS's quantized-weight
    level on GPT-OSS's checkpoint, not on the most-touched family's dummy model: that run would never take the
    changed lines."""
    names = {fam.name for r in entry.reasons for u in r.units
             for path in [u.get("file", ""), *(f["file"] for f in u.get("served_by", []))]
             if path and (fam := family_for(path)) is not None}
    hits = [h for h in families if h.family in names] or families  # shared code: any family of the change runs it
    return _best_family(hits, _needs_moe(entry)) if hits else None


def _generic_model(entry: Entry) -> str:
    """The representative checkpoint for shared code: one family with the entry's feature runs it."""
    if entry.level == 4 and entry.feature == "vlm":
        return plan_rules.GENERIC_VLM
    return plan_rules.GENERIC_MOE if _needs_moe(entry) else plan_rules.GENERIC_DENSE


def _needs_moe(entry: Entry) -> bool:
    """The entry runs experts: Level 2's MoE variant, Level 4's MoE feature."""
    return (entry.level == 2 and entry.variant == "moe") or (entry.level == 4 and entry.feature == "moe")


def _entry_model(entry: Entry, family: FamilyHit | None) -> tuple[str | None, dict | None]:
    """The changed family's checkpoint with the changed modules (MoE apart); else that family's dummy path."""
    needs_moe = _needs_moe(entry)
    if family is None:  # shared code: one representative family with the feature runs it
        return _generic_model(entry), None
    if needs_moe:
        if family.moe_checkpoint:
            return family.moe_checkpoint, None
        return None, family.dummy or {"USE_DUMMY_MODEL": "True", "DUMMY_MODEL_CONFIG_PATH": "<minimal_config.json>",
                                      "MODEL_ID": f"<org>/<{family.family} MoE checkpoint>",
                                      "minimal_config": dict(plan_rules.MINIMAL_DUMMY_CONFIG)}
    if family.checkpoint is None:
        return None, family.dummy
    return family.checkpoint, None


def _fires(rule: Rule, u: ChangedUnit, expert: bool = False) -> list[str]:
    """The identifiers by which a rule fires on a changed unit ([] = it does not). Level 2 reads what the code
    reads or sets of the parallel state and the conditions it runs under, never the unit's name alone (a function
    that gathers across PP ranks may change a line PP never touches); `expert`: only the names of lines that run
    for experts."""
    if u.tier == "none" or not rule.topics and not rule.areas:
        return []
    if rule.within and not _fires(plan_rules.BY_NAME[rule.within], u):
        return []
    if rule.only_in and not _matches(u.file, rule.only_in):
        return []
    if expert:
        return sorted(set(topic_hits(rule, list(u.edited_expert), rule.code_topics or rule.topics))) \
            if u.tier == "calls" and rule.code_in and _matches(u.file, rule.code_in) else []
    if rule.areas and u.tier in ("calls", "api") and _matches(u.file, rule.areas):
        return [f"{u.file} ({rule.name} code)"]
    subject = list(u.words["subject"])
    if rule.level == 2:
        subject = [w for w in subject if w not in u.words.get("name", [])] + list(u.words.get("exits", []))
    else:
        subject += u.words.get("requires", [])  # what a negated early exit before the lines requires
    hits = topic_hits(rule, subject)
    if u.tier in ("calls", "api") and rule.evidence == "code":
        hits += topic_hits(rule, list(u.words["code"]), rule.code_topics or rule.topics)
    if u.tier == "calls" and rule.code_in and _matches(u.file, rule.code_in):
        hits += topic_hits(rule, list(u.edited), rule.code_topics or rule.topics)
    new_family = bool(u.served) and all(f["new"] for f in u.served)
    if u.tier == "calls" and rule.sets_in and not (u.new or new_family) and _matches(u.file, rule.sets_in):
        # a field an existing provider now sets differently (a new one's defaults are Level 0's); anywhere verl
        # calls, what a parameter's gradient state is set to (`p.requires_grad = False`, `p.main_grad = ...`)
        sets = [s for s in u.sets if not plan_features.FLAG.match(s)
                and (u.config_code or "grad" in plan_features.words_of(s))]
        hits += topic_hits(rule, sets)
    return sorted(set(hits))


def _parallel(u: ChangedUnit) -> dict[str, list[str]]:
    """Level 2 rules on one changed unit: what the code reads or sets of the parallel state. Finalization counts
    only where the finalize change itself reads or sets parallel sizes or mpu state; Megatron mpu state that only
    serves expert parallelism (or is read on lines that run only for experts) asks for the MoE variant, not the
    dense one."""
    rules = [r for r in plan_rules.RULES if r.level == 2 and not r.optional]
    hits = {r.name: h for r in rules if (h := _fires(r, u))}
    for r in rules:
        for x in _fires(r, u, expert=True):
            # a pipeline/context size stays the dense variant's (the MoE variant keeps PP and CP at 1)
            dense = r.name == "tp-pp-cp" and topic_hits(r, [x], plan_rules.DENSE_VARIANT_SIZES)
            name = r.name if dense else "expert-parallel"
            hits[name] = sorted(set(hits.get(name, [])) | {x})
    if "provider-finalization" in hits and not set(hits) - {"provider-finalization"}:
        hits.pop("provider-finalization")
    moe = {"expert-parallel", "dispatcher"} & set(hits)
    if moe and "tp-pp-cp" not in hits:
        hits.pop("mpu-derived", None)
        if "provider-finalization" in hits:
            hits["expert-parallel"] = hits.get("expert-parallel", []) + hits.pop("provider-finalization")
    return hits


def involved_features(u: ChangedUnit, offered: dict[str, list[str]] | None = None) -> dict[str, list[str]]:
    """The Level 4 features a changed unit involves, each with the facts that say so.

    Shared code (no family's own): the features its changed lines touch, for every family verl loads through it.
    A family's own code: the features its changed lines touch; the family's whole feature set when the family is new;
    VLM when the family is a vision-language one and no text-only family of its folder runs the code too (text-only
    GSM8K never runs its vision side); custom layer when the
    changed code is the family's own layer module or layer spec. A family of another folder that reuses the code
    (Gemma 3 VL building Gemma 3's attention) adds only that: the code is a layer of it.
    The family's bridge or provider config that verl calls: what the family builds as a whole (MoE, VLM; not MoE
    when the change is vision-only, nor when the family branches on a MoE flag and so builds dense models too), its
    quantized HF weights when the change is on a way verl moves weights, custom layer when the change sets a field
    its own layer modules read or one only families with layers of their own set; none of these when the change
    only gains a parameter and hands it on (plumbing: where the parameter is used decides). Lines only moved involve nothing. `offered` collects the optional Level 4
    follow-ups (rule name → facts): a MoE run for a family that builds dense and MoE models. Any other own code verl
    calls of a text-only family that builds only MoE models (no dense family of the folder runs it) involves MoE:
    it runs only inside MoE models (a VL family's is its VLM run's, which loads the same checkpoint)."""
    if u.tier == "none" or (not u.served and u.tier == "api"):
        return {}  # new code nothing calls yet: shared, or in a family folder no registered bridge reaches
    if not u.served and u.family and u.tier != "calls":
        return {}
    if u.only_moved:
        return {}  # an import moved (deferred into the function): placement, no feature's behaviour
    # code only new families serve: what it involves is those families' features (read from their code), not the
    # words of its lines (a new mapping's boilerplate `maybe_dequantize` call is no quantized-weight support)
    new_only = u.tier in ("calls", "api") and bool(u.served) and all(f["new"] and f.get("own", True)
                                                                     for f in u.served)
    out: dict[str, list[str]] = {} if new_only else {
        f: [f"changed code: {', '.join(facts[:4])}"] for f, facts in u.touched.items()}
    takes: list[dict[str, tuple[str, list[str]]]] = []
    # a text-only family of its own folder runs the changed code too (Step 3.5's decoder layer, which Step 3.7's VL
    # model also builds): a text-only run exercises it, being a VL family's code does not make it vision code
    text_family = u.tier in ("calls", "api") and any(
        f.get("own", True) and "vlm" not in f["features"] for f in u.served)
    # shared-folder code that VL families only use (a weight mapping they register) converts the weights it is handed;
    # any load of the checkpoint runs it, vision weights included, so a text-only run covers it: its families'
    # vision side is involved only where the changed code is vision code itself (`touched`)
    vision_family_wide = not (u.family is None and u.served)
    vision_only = "vlm" in u.touched and not set(u.touched) - {"vlm"}
    # a text-only family's own code that no dense family runs (no own served family builds dense models: none lacks
    # experts or branches on a MoE flag) runs only inside MoE models: the family's Level 0 already loads a MoE
    # checkpoint at EP=1, and the MoE run is the Level 4 run of where the family's models live
    only_moe_families = all("moe" in f.get("builds", {}) and not f.get("moe_switch")
                            for f in u.served if f.get("own", True))
    for fam in u.served if u.tier in ("calls", "api") else ():
        feats = fam["features"]
        own = fam.get("own", True)  # a family reusing another family's code: only that code's layer counts
        builds = fam.get("builds", {})
        take: dict[str, tuple[str, list[str]]] = {}
        if fam["new"] and own:
            # what a new family builds (its bridge and provider: the HF config and weights it maps), and its own
            # layers; a modelling file it shares with siblings that forwards a sibling's feature (an MTP block
            # spec handed on) is no part the new family builds
            take.update({f: (f"{fam['family']} is new and builds {f}", facts) for f, facts in builds.items()})
            if "custom-layer" in feats:
                take["custom-layer"] = (f"{fam['family']} is new and has its own layers", feats["custom-layer"])
        if "vlm" in feats and own and not text_family and vision_family_wide:
            take.setdefault("vlm", (f"{fam['family']} is a vision-language family", feats["vlm"]))
        if own and fam.get("config") and u.tier == "calls" and u.entries and not u.passes_through:
            # (a parameter the bridge only gains and hands on sets no field of what the family builds: the code that
            # uses the parameter decides what it involves)
            # its bridge or provider config (what verl's provider and weight calls build every model of the family
            # from) changed: a MoE family builds experts in its MoE layers, a VLM family its vision side, whatever
            # the changed field is — unless the change is on the vision side only (a vision encoder has no experts),
            # or the family branches on a MoE flag (it builds dense models too: MoE counts where the change touches it)
            some_dense = bool(fam.get("moe_switch"))
            for f in WHOLE_MODEL:
                if f in builds and not (f == "moe" and (vision_only or some_dense)) \
                        and not (f == "vlm" and not vision_family_wide):
                    take.setdefault(f, (f"{fam['family']}'s bridge/provider changed and it builds {f}", builds[f]))
            if "moe" in builds and some_dense and not vision_only and "moe" not in u.touched and offered is not None:
                offered.setdefault("moe-family-follow-up", []).append(
                    f"{fam['family']} builds dense and MoE models: {', '.join(fam['moe_switch'][:1])}")
            moving = [e for e in u.entries if _moves_weights(e)]
            if "quantized" in builds and moving:
                take.setdefault("quantized", (
                    f"{fam['family']}'s HF weights are quantized and the change is on the way verl moves them "
                    f"({moving[0]})", builds["quantized"]))
        if own and u.tier == "calls" and u.kind != "module" and "moe" in builds and "vlm" not in feats \
                and only_moe_families and not vision_only and not u.passes_through:
            # (module code: imports, tables; a call runs.) A VL family's own code is its VLM run's, which loads
            # the same MoE checkpoint: a VL model's forward or provide is vision-language integration
            take.setdefault("moe", (f"{fam['family']} builds experts in every model it builds and its own code "
                                    "changed: it runs only inside MoE models", builds["moe"]))
        if fam["layer"]:
            take["custom-layer"] = (f"{fam['family']}'s layer code {fam['layer_via']} runs the changed code"
                                    if fam.get("layer_via") else
                                    f"{fam['family']}'s own layer code changed" if own else
                                    f"{fam['family']}'s layer specs build the changed layer module",
                                    feats.get("custom-layer") or ["its own layer code"])
        elif own and fam.get("layer_reads") and not u.passes_through:
            take.setdefault("custom-layer", (
                f"the change sets {', '.join(fam['layer_reads'][:3])}, read by {fam['family']}'s own layer modules",
                feats.get("custom-layer") or []))
        elif own and fam.get("config") and fam.get("layer_fields") and not u.passes_through:
            take.setdefault("custom-layer", (
                f"the change sets {', '.join(fam['layer_fields'][:3])}, which only families with layers of their own "
                f"set: a setting of {fam['family']}'s own layers", fam.get("builds", {}).get("custom-layer") or []))
        takes.append(take)
    if u.family is None and takes:
        # shared-folder code that only family code uses: a feature of the whole model counts when every family
        # running the code has it (a mapping class every family registers is no MoE code because some are MoE)
        common = set.intersection(*(set(t) for t in takes))
        takes = [{f: v for f, v in t.items() if f in common} for t in takes]
    for take in takes:
        for f, (why, facts) in take.items():
            out.setdefault(f, []).append(f"{why}: {', '.join(facts[:2])}" if facts else why)
    return out


# Features of what a whole model is: every layer of a MoE family routes to experts, a VLM always has its vision
# side. Any change to such a family's bridge or provider involves them. MTP, quantized weights, ModelOpt and
# custom layers are parts of a model: a change involves them only where it touches them.
WHOLE_MODEL = ("moe", "vlm")
# Level 2 variant → the follow-up rule that offers it for a new provider's own parallel code
NEW_FAMILY_FOLLOW_UP = {"dense": "new-provider-parallel-follow-up", "moe": "moe-ep-follow-up"}
WEIGHT_IMPORT = ("load hf weights", "load weights", "hf to megatron", "import ckpt", "import hf")


def _exports(label: str) -> bool:
    words = plan_features.words_of(label.split(".")[-1])
    return any(topic_in(t, words) for t in plan_rules.EXPORT_WORDS)


def _moves_weights(label: str) -> bool:
    """A verl entry point that moves weights between HF and Megatron, either way."""
    return _weight_import(label) or (_exports(label) and "weights" in plan_features.words_of(label.split(".")[-1]))


def _weight_import(label: str) -> bool:
    """A verl entry point that loads HF weights into the Megatron model (`AutoBridge.load_hf_weights`)."""
    words = plan_features.words_of(label.split(".")[-1])
    return any(topic_in(t, words) for t in WEIGHT_IMPORT)


def recommend(change: Change, analysis: Analysis | None = None) -> Plan:
    code = [f for f in change.files if not is_doc(f.path)]
    if not change.files:
        return Plan(change, [], [], f"no change against {change.base} (merge-base {change.merge_base}): "
                    "nothing to recommend", False, [], [])
    if not code:
        return Plan(change, [], [], f"documentation-only change ({len(change.files)} file(s)): no verl "
                    "level is required; nothing recommended", True, [], [])
    units = analysis.units if analysis else []
    # verl builds its PEFT object through Bridge's create_peft from its config (every key a field of the class)
    peft_from_config = bool(analysis) and any(s.name == "create_peft" for s in analysis.surface.imports)
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
        if u.reporting:
            continue  # it only logs or reports: the smoke shows it still runs, no level checks what it prints
        offered: dict[str, list[str]] = {}
        for feature, facts in involved_features(u, offered).items():
            add(plan_rules.FEATURE_RULE[feature], [u.file], [{**u.to_json(), "matched": facts[:8]}])
        for name, facts in offered.items():
            add(plan_rules.BY_NAME[name], [u.file], [{**u.to_json(), "matched": facts[:8]}])
        parallel = _parallel(u)
        new_family_only = bool(u.served) and all(f["new"] for f in u.served)
        # code that moves weights: the changed function is itself a weight import/export (`load_weights_hf_to_megatron`,
        # `stream_weights_megatron_to_hf`), whichever verl call runs it (verl's entry points are not all known: a PEFT
        # object verl calls runs its freeze code whatever export also reaches it)
        weights_only = u.tier == "calls" and (_weight_import(u.name) or _exports(u.name))
        for rule in plan_rules.RULES:
            if rule.level == 4:
                continue  # Level 4 comes from the families' features (involved_features)
            if rule.level == 1 and new_family_only:
                continue  # a new family's own save/export hooks: every family has them; L1 is for changes to them
            hits = parallel.get(rule.name, []) if rule.level == 2 else _fires(rule, u)
            if rule.level == 2 and new_family_only and not any(f.get("layer") for f in u.served):
                # a new provider's own config/conversion code under parallel sizes: the procedure keeps parallel
                # stress a follow-up for it ("Gardez ceux-ci comme des runs de suivi"); offered, not required.
                # Its own layer modules reading TP/PP state are custom layer behaviour only a parallel run runs.
                if hits:
                    add(plan_rules.BY_NAME[NEW_FAMILY_FOLLOW_UP[rule.variant]], [u.file],
                        [{**u.to_json(), "matched": sorted(set(hits))[:8]}])
                continue
            if rule.level == 5 and weights_only:
                # only verl's weight import/export runs it: moving weights computes no loss or gradient; what it
                # sets on the parameters it loads (`p.requires_grad = False`) still decides their gradients
                hits = [h for h in hits if h in u.sets]
            if rule.name == "hf-export" and u.tier == "calls" and u.export_only and u.family is None:
                hits = hits or [f"the nearest verl calls that move weights export them: {', '.join(u.nearest[:3])}"]
            if rule.name == "hf-export" and u.tier == "calls" and u.exports_only and u.family and not u.only_moved:
                # a family's export hook (re-quantizing, renaming on the way out): only verl's exports run it
                hits = hits or [f"only verl's exports run it: {', '.join(e for e in u.entries if _exports(e))}"]
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
    for e in entries + optional:
        family = _entry_family(e, families) or _serving_family(change, e)
        found = []
        if family is None and (named := _naming_family(change, e)):
            family = named[0]
            found.append((named[1], []))
        e.model, e.dummy = _entry_model(e, family)
        if e.level in (2, 3, 4):
            conds = list(dict.fromkeys(c for r in e.reasons for u in r.units for c in u.get("conditions", [])))
            found += line_settings.settings_for(conds, e.level, e.variant)
        switches = [s for r in e.reasons for u in r.units for s in u.get("switches", [])]
        found += line_settings.switch_settings(switches, e.level, peft_from_config)
        for what, overrides in found:
            e.settings.append(what)
            e.overrides += [o for o in overrides if o not in e.overrides]
    matched_files = {f for e in ordered for r in e.reasons for f in r.files}
    unmatched = [f.path for f in code if f.path not in matched_files and not _matches(f.path, plan_rules.BRIDGE_OWN)
                 and f.path not in {u.file for u in units if u.tier == "none"}]
    notes = []
    reached_files = {u.file for u in units if u.tier != "none"}
    # never on and off at once; a function verl runs whose changed lines it never takes is on its path: noted apart
    outside = sorted({u.file for u in units if u.tier == "none" and not u.verl_skips} - reached_files)
    tests = plan_bridge_tests.own_tests(change)
    skipped = [u for u in units if u.verl_skips and u.file not in reached_files]
    for u in skipped:  # verl runs the function, not the changed lines: no level would run them either
        notes.append(f"{u.name} ({u.file}): {u.verl_skips} — they justify no verl level. "
                     f"{plan_bridge_tests.hint(plan_bridge_tests.own_tests(change, [u.file]))}")
    if outside:
        notes.append("not on verl's path (verl never imports these; Bridge's own training loop, recipes or "
                     f"scripts): {', '.join(outside)} — they justify no verl level. "
                     f"{plan_bridge_tests.hint(plan_bridge_tests.own_tests(change, outside))}")
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
    return Plan(change, entries, families, message, False, unmatched, notes, units, optional, tests)
