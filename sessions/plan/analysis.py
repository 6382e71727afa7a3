"""The changed functions/classes of a Bridge change and what verl reaches of each: whether verl runs it (and through
which of its calls), imports it only, or never reaches it (sessions/plan/reach.py follows verl's surface).
"""

from __future__ import annotations

import ast
import fnmatch
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from env.settings import UsageError
from sessions.plan import features as plan_features
from sessions.plan import reach as plan_reach
from sessions.plan import rules as plan_rules
from sessions.plan import stand_in as plan_stand_in
from sessions.plan.change import Change, _is_bridge_python
from sessions.plan.evidence import topic_in
from sessions.plan.index import _unit_nodes
from sessions.plan.reach import BridgeIndex, Evidence, Reach, Unit
from sessions.plan.rules import Rule
from sessions.plan.verl_surface import NOT_CONSTANT, SurfaceError, VerlSurface, calls_by_name, read_surface


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
    exports_only: bool = False  # every verl entry point that moves weights and runs it exports them
    nearest: list[str] = field(default_factory=list)  # those nearest entry points
    family: str | None = None  # the provider folder it belongs to (None: family-independent)
    touched: dict[str, list[str]] = field(default_factory=dict)  # feature → facts of it on the changed lines
    served: list[dict] = field(default_factory=list)  # the families whose own code it is (none: shared code)
    # shared code: feature → bridge files of the families whose own code names what its changed lines name of it
    named_by: dict[str, list[str]] = field(default_factory=dict)
    strings: list[str] = field(default_factory=list)  # name-like strings of the changed code
    conditions: list[str] = field(default_factory=list)  # conditions its changed lines run under
    edited: list[str] = field(default_factory=list)  # every name of its edited statements (both sides, undiffed)
    edited_expert: list[str] = field(default_factory=list)  # those on lines that run only for experts
    reporting: bool = False  # every changed statement only reports (logging, metrics): no behaviour changed
    sets: list[str] = field(default_factory=list)  # what its changed statements set (targets, keyword arguments)
    only_moved: bool = False  # every changed line is an import moved here (deferred into a function): placement only
    passes_through: bool = False  # it only gains parameters and hands them on: plumbing for the code that uses them
    config_code: bool = False  # a bridge's or provider's code (what a model is configured from)
    verl_skips: str = ""  # why verl's calls never run the changed lines (its every call passes a value that skips them)
    switches: list[dict] = field(default_factory=list)  # settings of its own object that changed lines need and
    # the defaults do not give: {"field", "value", "default", "cls", "peft"} (line_settings turns them into overrides)

    @property
    def name(self) -> str:
        return self.key.split(":", 1)[-1] if ":" in self.key else f"{self.key} (module code)"

    def to_json(self) -> dict:
        return {"unit": self.name, "file": self.file, "tier": self.tier, "new": self.new,
                "path": [f"{plan_reach_label(k)} [{how}]" for k, how in self.path],
                "entries": self.entries, "export_only": self.export_only,
                "subject": sorted(set(self.words["subject"])), "code": sorted(set(self.words["code"]))[:40],
                "touched": self.touched, "conditions": self.conditions, "switches": self.switches,
                "verl_skips": self.verl_skips,
                "families": [f["family"] for f in self.served] or ["all families"],
                "served_by": [{"family": f["family"], "file": f["bridge_file"]} for f in self.served],
                **({"named_by": self.named_by} if self.named_by else {})}


def _gates_of_change(ev: Evidence, lines: set[int], old_evs: list[Evidence]) -> dict[str, bool]:
    """The parameter values every changed line needs, added (`ev`) and removed (`old_evs`) alike."""
    sides = ([ev.param_gates] if lines else []) + [o.param_gates for o in old_evs]
    if not sides:
        return {}
    return {k: v for k, v in sides[0].items() if all(side.get(k) == v for side in sides[1:])}


def _verl_never_takes(index: BridgeIndex, unit: Unit, key: str, gates: dict[str, bool], hits: list,
                      surface: VerlSurface) -> str:
    """Why verl never runs the changed lines of a function it calls, or "": every changed line needs a parameter's
    truth value (`if load_weights:`) and every call of the function on verl's path binds that parameter to a
    literal of the other value, or leaves a default that is one: verl's own calls
    (`to_megatron_provider(load_weights=False)`) and those in the Bridge code verl reaches
    (`transformer_config`'s `self.to_megatron_provider(load_weights=False)`). A call that passes a computed value,
    `**kwargs` or a parameter of its own may run them; so may the function handed on as a value, and a method that
    runs under another name (`__init__` through its class, `forward` through the module's call)."""
    if not gates or not hits or unit.node is None:
        return ""
    name = unit.name.rsplit(".", 1)[-1]
    if name.startswith("__") or name == "forward" or name in surface.uncalled:
        return ""  # called under another name, or handed on as a value: where its arguments are not shown
    sites = list(surface.calls.get(name, [])) if any(e.key == key for e, _ in hits) else []
    on_path = {k for _, r in hits for k in r.steps} - {key}
    for k in sorted(on_path):
        caller = index.units.get(k)
        if caller is None or caller.node is None:
            continue
        its_calls, its_values = calls_by_name(_unit_nodes(caller), caller.file, bare_names=True)
        if name in its_values:
            return ""  # handed on as a value (a callback): called where its arguments are not shown
        sites += its_calls.get(name, [])
    args = unit.node.args
    positional = [x.arg for x in args.posonlyargs + args.args]
    defaults = dict(zip(positional[len(positional) - len(args.defaults):], args.defaults, strict=True))
    defaults.update({x.arg: d for x, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None})
    if unit.kind == "method" and positional[:1] and positional[0] in ("self", "cls"):
        positional = positional[1:]
    shown = []
    for site in sites:
        bound = dict(zip(positional, site.args, strict=False)) | dict(site.kwargs)
        skipped = None
        for param, needed in gates.items():
            if param in bound:
                value = bound[param]
            elif not site.spread and isinstance(defaults.get(param), ast.Constant):
                value = defaults[param].value
            else:
                continue
            if value is not NOT_CONSTANT and bool(value) != needed:
                skipped = f"{param}={value!r}"
                break
        if skipped is None:
            return ""  # this call may run them
        shown.append(f"{skipped} at {site.where}")
    if not shown:
        return ""
    needs = ", ".join(f"{p} {'true' if v else 'false'}" for p, v in gates.items())
    return f"every call of {unit.name} on verl's path passes a value that skips the changed lines " \
           f"({'; '.join(shown)}): they run only with {needs}"


def _switches_off_by_default(index: BridgeIndex, cls: Unit, provider: bool,
                             needed: list[tuple[str, bool]]) -> list[dict]:
    """Of the `self.X` values a method's changed lines need, those its class (`cls`, a dataclass) declares with
    another default (`normalize_moe_lora: bool = False` where the lines need True): the default run never executes
    those lines. Declared on the class or a Bridge base it inherits from; only PEFT classes (`peft`: in Bridge's PEFT
    package, deriving from its `PEFT` base: what create_peft builds) and providers, whose fields verl's config
    reaches."""
    if not needed:
        return []
    peft = cls.file.startswith(plan_rules.SRC + "peft/") and any(
        index.units[b].name == "PEFT" for b in [cls.key, *plan_reach._ancestors(index, cls.key)])
    if not peft and not provider:
        return []
    out = []
    for name, value in needed:
        default = _bool_field_default(index, cls.key, name, set())
        if default is not None and default != value:
            out.append({"field": name, "value": value, "default": default, "cls": cls.name, "peft": peft})
    return out


def _bool_field_default(index: BridgeIndex, cls_key: str, name: str, seen: set[str]) -> bool | None:
    """The default of a dataclass field `name: bool = True|False` of the class or its Bridge bases (None: none)."""
    cls = index.units.get(cls_key)
    if cls is None or cls_key in seen or not isinstance(cls.node, ast.ClassDef):
        return None
    seen.add(cls_key)
    is_dataclass = any("dataclass" in ast.unparse(d) for d in cls.node.decorator_list)
    for s in cls.node.body:
        if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.target.id == name:
            ok = is_dataclass and isinstance(s.value, ast.Constant) and type(s.value.value) is bool
            return s.value.value if ok else None
    return next((d for b in cls.bases if (d := _bool_field_default(index, b, name, seen)) is not None), None)


def plan_reach_label(key: str) -> str:
    return key.split(":", 1)[1] if ":" in key else key


@dataclass
class Analysis:
    """The changed units with what verl reaches of them."""

    surface: VerlSurface
    units: list[ChangedUnit]
    modules_reached: set[str]


def topic_hits(rule: Rule, idents: list[str], topics: tuple[str, ...] | None = None) -> list[str]:
    """The identifiers a rule's topics match (every word of a topic among one identifier's words)."""
    out = []
    for i in idents:
        words = plan_reach.words_of(i)
        if any(topic_in(t, words) for t in (topics or rule.topics)) and not any(topic_in(t, words)
                                                                                 for t in rule.unless):
            out.append(i)
    return out


def _direction(label: str) -> str | None:
    words = plan_reach.words_of(label.split(".")[-1])
    hit = lambda table: any(topic_in(t, words) for t in table)  # noqa: E731
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


def _fields_verl_names(unit: Unit, lines: set[int], surface: VerlSurface) -> list[str]:
    """Fields a changed class declares on the changed lines whose names verl reads or sets on Bridge objects
    (`hasattr(provider, "moe_enable_routing_replay")`): a new knob verl turns on counts even when its default is
    off (`= False` / `= None`), since verl's own code takes the new branch."""
    if unit.kind != "class" or not isinstance(unit.node, ast.ClassDef):
        return []
    out = []
    for n in unit.node.body:
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.lineno in lines \
                and n.target.id in surface.attributes:
            out.append(n.target.id)
    return out


def _moved(f, text: str | None) -> tuple[set[int], set[int]]:
    """Changed lines whose text is on both sides of the diff (new-side and old-side numbers): a statement moved or
    kept while its neighbours changed reads nothing new."""
    new = (text or "").splitlines()
    old = (f.old_text or "").splitlines()
    at = lambda src, i: src[i - 1].strip() if 0 < i <= len(src) else ""  # noqa: E731
    added = {i: at(new, i) for i in f.added}
    removed = {i: at(old, i) for i in f.removed}
    both = ({t for t in added.values() if re.search(r"\w", t)} & set(removed.values()))
    return {i for i, t in added.items() if t in both}, {i for i, t in removed.items() if t in both}


def _is_import_text(text: str | None, line: int) -> bool:
    src = (text or "").splitlines()
    t = src[line - 1].strip() if 0 < line <= len(src) else ""
    return t.startswith(("import ", "from "))


def _namespaces(index: BridgeIndex, path: str) -> set[str]:
    """Names a file binds by import (`from megatron.core import tensor_parallel`): used as `name.attr` they are a
    namespace, not a value the code reads, except Megatron's parallel-state modules (`parallel_state.X()` reads mpu
    state)."""
    info = index.modules.get(plan_reach.module_name(path) or "")
    if info is None:
        return set()
    tree = index.units[info.name].node
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            out.update((a.asname or a.name).split(".")[0] for a in n.names)
    return out - set(plan_rules.MPU_STATE_MODULES)


def _module_code_runs(index: BridgeIndex, unit: Unit, lines: set[int], reached: Reach) -> bool:
    """Does module-level code verl imports matter to verl? A changed statement with an effect on import (a call, a
    registration) runs; a changed table, spec or constant matters only when code verl runs reads it."""
    bound: set[str] = set()
    for stmt in unit.node.body:
        if not set(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1)) & lines:
            continue
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            bound.update(f"{unit.module}.{x.id}" for t in targets for x in ast.walk(t) if isinstance(x, ast.Name))
        elif not isinstance(stmt, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                and not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
            return True
    if not bound:
        return False
    for k in reached.steps:
        u = index.units.get(k)
        if u is not None and u.key != unit.key and (u.kind != "class" or k in reached.live) and u.var_refs & bound:
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
    """Code verl does not call counts by its subject only when code of a module verl imports calls it (checkpoint
    loading that the checkpoint functions verl takes sit next to and call; a validator ConfigContainer calls). Code
    only Bridge's own pipelines call (its training loop's metrics, its SFT data, its recipes) counts for nothing,
    also when it sits in a module verl imports."""
    name = unit.name.split(".")[-1]
    for m in direct:
        info = index.modules.get(m)
        for k in info.units if info else ():
            u = index.units[k]
            if k != unit.key and (unit.key in u.refs or (unit.kind == "method" and name in u.attrs)):
                return True
    return False


def _same_uses(ev: Evidence, old_evs: list[Evidence]) -> set[str]:
    """Names of an edited statement used in the very same expressions on both sides of the diff (a parallel size read
    as `get_context_parallel_world_size() == 1` before and after an override put in front of it): the edit changed
    what surrounds them, not what they compute. A name a statement uses directly counts as edited."""
    new = Counter(ev.uses)
    old = Counter(u for old_ev in old_evs for u in old_ev.uses)
    out = set()
    for name in {n for n, _ in new} & {n for n, _ in old}:
        after = Counter({k: v for k, v in new.items() if k[0] == name})
        before = Counter({k: v for k, v in old.items() if k[0] == name})
        if after == before and all(use is not None for _, use in after):
            out.add(name)
    return out


def _passes_through(unit: Unit, lines: set[int], ev: Evidence) -> bool:
    """Does the change only add parameters to the function's signature and hand them on (`weight_dtype=None` in
    the signature, `super().f(..., weight_dtype=weight_dtype)` in the body)? Every name the edit adds or removes is
    one of its parameters, and its signature changed: what the parameter does is decided where it is used."""
    node = unit.node
    if unit.kind not in ("function", "method") or not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    a = node.args
    params = {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs, *([a.vararg] if a.vararg else []),
                              *([a.kwarg] if a.kwarg else [])]}
    body = node.body[0].lineno if node.body else node.lineno
    signature = set(range(node.lineno, body))
    return bool(ev.code) and not ev.strings and set(ev.code) <= params and bool(lines & signature)


def _callers_feature(index: BridgeIndex, unit: Unit) -> dict[str, list[str]]:
    """The features every Bridge caller of a helper is about (`_unpack_e2m1` called only by `_dequantize_mxfp4`):
    the helper serves those features whatever its own names say."""
    name = unit.name.split(".")[-1]
    callers = [u for u in index.units.values() if u.key != unit.key and u.kind != "module" and (
        unit.key in u.refs or (unit.kind == "method" and u.cls == unit.cls and name in u.attrs))]
    if not callers:
        return {}
    common: set[str] | None = None
    for u in callers:
        feats = {f for part in u.name.split(".") for f in plan_features.feature_of_name(part)
                 if not (f == "vlm" and plan_features.FLAG.match(part))}
        common = feats if common is None else common & feats
    return {f: [u.name for u in callers] for f in sorted(common or ())}


def _builds_layers(index: BridgeIndex, unit: Unit) -> bool:
    """A layer spec function, or a layer module (or its method)."""
    if unit.kind == "function" and plan_features.is_spec_function(unit.node):
        return True
    return plan_features.is_layer_unit(index, unit)


def _features(index: BridgeIndex, unit: Unit, lines: set[int], ev: Evidence, targets: list[str], tier: str,
              cache: dict, added_by_file: dict[str, set[int]], verl_calls: bool = False
              ) -> tuple[dict[str, list[str]], list[dict]]:
    """The features the changed lines touch (facts of them on those lines: names and name-like strings, a layer spec
    set, a layer module or spec defined), and the families whose own code the unit is, with each family's features
    (from its whole code) and whether the family itself is new. Code verl imports but does not call counts by what
    it is about only."""
    touched = plan_features.Sites()
    names = ev.subject + ev.requires + (ev.code + ev.strings + targets + ev.bound_reads
                                        if tier in ("calls", "api") else [])
    for name in names:
        for f in plan_features.feature_of_name(name):
            if not (f == "vlm" and plan_features.FLAG.match(name)):
                touched.add(f, name)
    # a layer module of the model code (PEFT's adapter modules are PEFT, not a model's own layer behaviour)
    if tier in ("calls", "api") and unit.node is not None and unit.file.startswith(plan_rules.MODELS):
        structural = plan_features.sites_in(plan_features.unit_nodes(unit), lines, unit.file)
        for w in structural.by_feature.get("custom-layer", []):
            touched.add("custom-layer", w)
    if tier in ("calls", "api") and plan_features.folder_of(unit.file, index) is None:
        # shared conversion code that picks weights by a name fragment serves the weights holding it: the
        # features all of them are of (`".w1."` only in a MoE family's expert names), not the fragment's words
        for fragment in dict.fromkeys(ev.strings):
            if plan_features.feature_of_name(fragment):
                continue  # its own words already say it
            feats, folders = plan_features.weight_fragment_features(index, fragment)
            for f, names in feats.items():
                touched.add(f, f"'{fragment}' names only {f} weights: {names[0]}"
                               + (f" and {len(folders) - 1} more folders" if len(folders) > 1 else ""))
    if tier == "calls" and unit.kind in ("function", "method") and not verl_calls:
        # (a function verl calls itself is no helper of its Bridge callers' features: verl is a caller too)
        for f, callers in _callers_feature(index, unit).items():
            touched.add(f, f"called only from {f} code: {', '.join(callers[:2])}")
    if "quantized" in touched.by_feature and _builds_layers(index, unit):
        # quantization in the code that builds layers (a layer spec swapping in quantized modules, a layer
        # module) is ModelOpt's quantized layers (QAT), not quantized checkpoint weights moved in or out
        for what in touched.by_feature.pop("quantized"):
            touched.add("qat", f"{what} (in layer construction)")
    served = []
    shared_layer = plan_features.is_shared_layer(index, unit)  # its families' layer specs build it
    key = unit.cls if unit.kind == "method" and unit.cls else unit.key
    # shared-folder code only family code uses is those families' own code (a mapping class one bridge registers)
    users = plan_features.family_users(index, key) if plan_features.folder_of(unit.file, index) is None \
        and not shared_layer else set()
    for fam in plan_features.families_serving(index, unit, cache):
        bridge = index.units[fam.bridge]
        span = set(range(bridge.start, bridge.end + 1)) & plan_reach.code_lines(index._text(bridge.file) or "")
        served.append({"family": fam.name, "folder": fam.folder, "bridge_file": bridge.file, "features": {
            f: fam.sites.by_feature[f][:3] for f in fam.features()},
            "new": bool(span) and span <= added_by_file.get(bridge.file, set()),
            "layer": unit.key in fam.layer_units or (unit.kind == "function" and unit.file in fam.layer_files)
            or shared_layer or key in fam.layer_helpers,
            "layer_via": fam.layer_helpers.get(key, "").split(":", 1)[-1],  # the layer code that calls it
            "own": fam.folder == plan_features.folder_of(unit.file, index) or bool(users & fam.units),
            # (else it calls into another family's code)
            "config": unit.key in fam.config_units or (unit.kind == "method" and unit.cls in fam.config_units)
            or bool(users & fam.config_units),
            "builds": {f: fam.builds.by_feature[f][:3] for f in fam.builds.features()},
            "layer_reads": sorted(set(targets) & fam.layer_reads), "moe_switch": fam.moe_switch[:2],
            "layer_fields": plan_features.own_layer_fields(index, fam, targets, cache)})
    return touched.by_feature, served


IDENTIFIER = re.compile(r"[A-Za-z_][\w.]*")


def _families_naming(index: BridgeIndex, touched: dict[str, list[str]], cache: dict) -> dict[str, list[str]]:
    """For shared code: per feature its changed lines touch, the families whose own code names the same thing
    (`split_gdn_linear_weights` → the families naming "gdn": Qwen3-Next, Qwen3.5), so that the run proposed for
    the feature loads a model that runs it."""
    out: dict[str, list[str]] = {}
    for feature, facts in touched.items():
        for fact in facts:
            if not IDENTIFIER.fullmatch(fact):
                continue  # a description ("called only from moe code: ..."), not a name the changed code has
            for f, phrase in plan_features.feature_phrases(fact):
                if f == feature:
                    for b in plan_features.families_naming(index, f, phrase, cache):
                        if b not in out.setdefault(f, []):
                            out[f].append(b)
    return out


def analyse(change: Change, verl_repo: Path | str) -> Analysis:
    """Changed functions/classes of Bridge's source, each with whether and how verl reaches it."""
    if not any(_is_bridge_python(f.path) for f in change.files):
        return Analysis(VerlSurface(str(verl_repo)), [], set())  # no Bridge source changed: nothing to reach
    try:
        surface = read_surface(verl_repo)
    except SurfaceError as e:
        raise UsageError(str(e)) from None
    index = BridgeIndex(change.repo)
    seeds = plan_reach.verl_seeds(index, surface) + plan_stand_in.stand_ins(index, surface)
    global_reach = plan_reach.reach(index, seeds, surface.attributes)
    modules = {k for k in global_reach.steps if ":" not in k}
    units: dict[str, ChangedUnit] = {}
    per_unit: dict[str, tuple[Unit, set[int], set[int], list[Evidence], set[int], set[str]]] = {}
    removed_for: set[str] = set()  # units a removed line (not moved elsewhere) belongs to
    for f in change.files:
        if not _is_bridge_python(f.path):
            continue
        text = index._text(f.path)
        moved_new, moved_old = _moved(f, text)
        spaces = _namespaces(index, f.path)
        if text is not None and f.added:
            code = plan_reach.code_lines(text)
            added = set(f.added) & code
            for line in sorted(added):
                u = index.unit_at(f.path, line)
                if u is not None:
                    per_unit.setdefault(u.key, (u, set(), code, [], moved_new, spaces))[1].add(line)
        if f.old_text and f.removed and f.old_path:
            old = BridgeIndex(change.repo, sources={f.old_path: f.old_text})
            code = plan_reach.code_lines(f.old_text)
            old_spaces = _namespaces(old, f.old_path)
            for line in sorted(set(f.removed) & code):
                u = old.unit_at(f.old_path, line)
                if u is None:
                    continue
                ev = plan_reach.evidence(u, {line}, code, moved_old, old_spaces)
                now = index.unit(u.key if ":" in u.key else u.key)
                if now is None and u.kind == "method" and u.cls:
                    # a method removed from a class that stays (an override dropped: the base class's runs in its
                    # place): the class's behaviour changed, wherever the class is built
                    now = index.unit(u.cls)
                    now = now if now is not None and now.kind == "class" else None
                if now is None:
                    continue  # a removed function: its callers changed too
                per_unit.setdefault(now.key, (now, set(), plan_reach.code_lines(text or ""), [], moved_new,
                                              spaces))[3].append(ev)
                if line not in moved_old or not _is_import_text(f.old_text, line):
                    removed_for.add(now.key)
    direct = _direct_modules(index, surface)
    fam_cache: dict[str, list[plan_features.FamilyModel]] = {}
    added_by_file = {f.path: set(f.added) for f in change.files}
    entries = plan_reach.verl_entries(index, surface, global_reach)
    entry_keys = {e.key for e in entries}  # what verl itself calls (an imported function, a method it names)
    entry_reach: dict[str, tuple[plan_reach.Entry, Reach]] = {}
    for key, (unit, lines, code, old_evs, moved, spaces) in per_unit.items():
        ev = plan_reach.evidence(unit, lines, code, moved, spaces)
        sides = [e for e in [ev, *old_evs] if e.statements]
        if sides and all(e.only_imports for e in sides):
            continue  # only import statements changed: an import is no call path, what it imports counts itself
        ev.code += _fields_verl_names(unit, lines, surface)
        same = _same_uses(ev, old_evs)  # read the same way on both sides: what it computes did not change
        raw = [n for n in ev.code + ev.strings + [n for old_ev in old_evs for n in old_ev.code + old_ev.strings]
               if n not in same]
        expert = Counter(n for n in ev.expert_code + [n for old_ev in old_evs for n in old_ev.expert_code]
                         if n not in same)
        if plan_reach.words_hit(ev.name, plan_reach.EXPERT_WORDS):
            expert = Counter(raw)  # code that only serves experts (`MoeAmaxFanoutMapping`): the MoE variant stresses it
        spaced = Counter(ev.namespaced + [n for old_ev in old_evs for n in old_ev.namespaced])
        targets = ev.targets + [n for old_ev in old_evs for n in old_ev.targets]
        # a name on both sides of an edited line did not change: only names added or removed count as code
        for part in ("code", "guards", "strings"):
            before = Counter(i for old_ev in old_evs for i in getattr(old_ev, part))
            after = Counter(getattr(ev, part))
            setattr(ev, part, list(((after - before) + (before - after)).elements()))
        ev.subject += ev.guards
        for old_ev in old_evs:
            ev.subject += [w for w in old_ev.subject if w not in ev.subject]
        if unit.kind == "module" and key in global_reach and lines and not _module_code_runs(
                index, unit, lines, global_reach):
            global_reach.steps.pop(key)  # tables or constants no code verl runs reads: no verl path
        # a class statement that only runs because its module is imported is no verl call: its body's values
        # matter once the class is used, built itself or as the base of a class that is built (its defaults are
        # the values of its subclasses' instances: MambaProvider's under NemotronHModelProvider). A method of a
        # class verl never builds (ConfigContainer) never runs, and module code verl's imports never load never
        # runs either.
        imported_only = unit.kind == "class" and key in global_reach and key not in global_reach.dispatch
        if key in global_reach and not imported_only:
            tier = "calls"
        elif imported_only or unit.module not in modules:
            tier = "none"
        elif ev.new and not unit.name.split(".")[-1].startswith("_") and not _has_bridge_caller(index, unit):
            tier = "api"
        elif unit.kind == "module" or (unit.kind == "method" and unit.cls not in global_reach.dispatch):
            tier = "none"
        else:
            tier = "imports" if _beside_verl_imports(index, unit, direct) else "none"
        cu = ChangedUnit(key, unit.file, unit.kind, tier, global_reach.path(key) if tier == "calls" else
                         global_reach.path(unit.module), {"subject": ev.subject, "code": ev.code, "name": ev.name,
                          "exits": ev.exits + [n for old_ev in old_evs for n in old_ev.exits],
                          "requires": ev.requires + [n for old_ev in old_evs for n in old_ev.requires]}, ev.new,
                         family=plan_features.folder_of(unit.file, index), strings=ev.strings, conditions=ev.conditions,
                         # the calls a changed value is then passed to are where the edit acts (a PP broadcast)
                         edited=sorted(set((Counter(raw) - expert - spaced).elements()) | set(ev.bound_into)),
                         edited_expert=sorted(set((expert - spaced).elements())),
                         reporting=bool(sides) and all(e.only_logging for e in sides),
                         sets=sorted(set(targets)))
        text = index._text(unit.file) or ""
        cu.only_moved = bool(lines) and all(ln in moved and _is_import_text(text, ln) for ln in lines) \
            and key not in removed_for
        cu.passes_through = _passes_through(unit, lines, ev)
        if unit.kind in ("class", "method"):
            cls = index.units.get(unit.cls if unit.kind == "method" else key)
            cu.config_code = cls is not None and plan_features.is_provider_class(index, cls)
            if unit.kind == "method" and cls is not None:
                cu.switches = _switches_off_by_default(index, cls, cu.config_code, ev.switches)
        if tier != "none":
            cu.touched, cu.served = _features(index, unit, lines, ev, targets, tier, fam_cache, added_by_file,
                                              verl_calls=key in entry_keys)
            cu.config_code = cu.config_code or any(f["config"] and f["own"] for f in cu.served)
            if cu.touched and not cu.served and plan_features.folder_of(unit.file, index) is None:
                cu.named_by = _families_naming(index, cu.touched, fam_cache)
            if cu.edited_expert and tier in ("calls", "api"):  # lines under `if is_expert:`: the MoE path only
                cu.touched.setdefault("moe", []).append(
                    f"lines that run only for experts: {', '.join(cu.edited_expert[:3])}")
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
            cu.exports_only = bool(directed) and {d for _, d in directed} == {"export"}
            cu.nearest = [e.label for e, r in hits if _direction(e.label) and len(r.path(key)) == closest]
            if hits:  # the shortest path from one of verl's entry points
                cu.path = min((r.path(key) for _, r in hits), key=len)
            cu.verl_skips = _verl_never_takes(index, unit, key, _gates_of_change(ev, lines, old_evs), hits, surface)
            if cu.verl_skips:
                cu.tier = "none"  # verl runs the function, never the changed lines
        units[key] = cu
    return Analysis(surface, sorted(units.values(), key=lambda u: (u.file, u.key)), modules)
