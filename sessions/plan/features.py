"""Model families and their features, read from the Bridge's own code at the commit (never from the diff's words).

A *family* is one registered bridge class (`@MegatronModelBridge.register_bridge(...)`) with the code of its own
folder that it reaches through its references (and the module tables it reads): its provider, its layer specs and
layer modules, its helpers. A family of another model folder whose code calls into a unit serves it too (Gemma 4 VL
building Gemma 4's attention); shared code (outside family folders) serves every family.
Its *features* are facts of that code:
- moe: expert counts or MoE settings the provider sets (`num_moe_experts`, `moe_*`), expert weight mappings
  (`...mlp.experts...`), routed-expert config keys;
- mtp: `mtp_num_layers` set to something, MTP weight mappings (`mtp.layers...`), `nextn` config keys;
- vlm: a vision config, a vision model or vision weight mappings;
- custom-layer: a layer spec of its own (`transformer_layer_spec = ...`, a `*_layer_spec`/`*_block_spec` function,
  `ModuleSpec(...)`), layer modules of its own (classes deriving from an attention / MLP / norm / linear /
  transformer-layer class), or a layer kind of its own selected by setting (`linear_attention_*`);
- quantized: quantized checkpoint weights (`quantization_config`, dequantizing import, `weight_scale_inv`, FP8/FP4);
- qat: ModelOpt / QAT state (quantizer modules, amax mappings).

The same detectors, applied to the changed lines of a unit, say which features a change *touches*.

What a family *builds* is read from its bridge class and provider classes alone (`builds`): the HF config and
weights it maps. Modelling code of its folder that handles a sibling's feature (a VL model class reading
`moe_layer_freq` for the MoE variant) is no property of it. `layer_reads` are the config fields its own layer
modules read (`self.config.window_size`): a change that sets one changes its custom layer's behaviour. A layer
module of shared model code (`models/common/`) serves the families whose layer specs build it.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from env.presets import FEATURES
from sessions.plan import rules as plan_rules
from sessions.plan.evidence import _names_in, words_of
from sessions.plan.index import BridgeIndex, Unit

# words of an identifier or a name-like string (split at '_', '.', case) that are facts of a feature
FEATURE_WORDS: dict[str, tuple[str, ...]] = {
    "moe": ("moe", "expert", "experts", "router", "routed", "ep", "etp", "n routed experts", "num experts"),
    "mtp": ("mtp", "nextn"),
    "vlm": ("vision", "visual", "vit", "image", "images", "pixel", "video", "vlm", "multimodal"),
    "quantized": ("quant", "quantization config", "quantization", "quantized", "dequant", "dequantize", "fp8", "fp4",
                  "nvfp4", "mxfp4", "weight scale inv", "scale inv", "e8m0"),
    # amax converted between checkpoints is ModelOpt's calibrated quantizer state (TE's FP8 amax history is
    # training-time scaling, never mapped)
    "qat": ("modelopt", "qat", "mtq", "weight quantizer", "input quantizer", "amax mapping", "amax map",
            "quantizer amax"),
}
# words that must follow each other in the name (`linear_attention_type`, not `self_attention.linear_qkv`)
ORDERED_FEATURE_WORDS: dict[str, tuple[str, ...]] = {
    # a layer kind of its own that Megatron-Core builds from the provider's settings (`linear_attention_type =
    # "gated_delta_net"`): linear-attention layers in place of softmax attention, whatever spec function is used
    # Mamba (SSM) mixers in place of attention, built the same way from the provider's settings (`mamba_num_heads`,
    # `mamba_chunk_size`, a hybrid layer pattern's `M` layers); gated attention, a gate Megatron-Core puts on the
    # attention output from the provider's settings (`attention_output_gate`, a head-wise `..._attn_gate`)
    # (Megatron-Core's linear-attention layer is megatron.core.ssm.gated_delta_net.GatedDeltaNet: Bridge names its
    # weights' conversion after it, `split_gdn_linear_weights`)
    "custom-layer": ("linear attention", "gated delta net", "gdn", "mamba", "attention output gate", "attn gate"),
}
# custom layer: a class deriving from one of these kinds of layer (the base's name words), or a layer spec
LAYER_BASE_WORDS = ("attention", "layer", "mlp", "norm", "linear", "block", "embedding", "rotary", "mixer")
NOT_A_LAYER = ("bridge", "provider", "config", "mapping", "model", "state", "source", "registry", "dataset",
               "processor", "tokenizer", "loss", "step", "spec")
FLAG = re.compile(r"(is|has|use|enable|skip)_", re.I)
STANDARD_SPEC_PREFIX = "get_gpt_"  # Megatron-Core's GPT layer/block/MTP specs
SPEC_WORDS = ("layer spec", "block spec", "module spec", "transformer layer spec")


def _hit(words: list[str], table: tuple[str, ...]) -> str | None:
    ws = set(words)
    return next((t for t in table if set(t.split()) <= ws), None)


def feature_phrases(name: str) -> list[tuple[str, str]]:
    """(feature, the table phrase that says so) for each feature an identifier or a name-like string is a fact of
    (`split_gdn_linear_weights` → custom-layer by "gdn"). A string that ends in a dot is a prefix some code filters
    by (`"vision_tower."` skipped on import), no part the family builds."""
    if name.endswith("."):
        return []
    words = words_of(name.replace(".", "_"))
    joined = f" {' '.join(words)} "
    out = [(f, t) for f, table in FEATURE_WORDS.items() if (t := _hit(words, table))]
    for f, table in ORDERED_FEATURE_WORDS.items():
        t = next((t for t in table if f" {t} " in joined), None)
        if t:
            out.append((f, t))
    return out


def feature_of_name(name: str) -> list[str]:
    """The features an identifier or a name-like string is a fact of (`num_moe_experts` → moe)."""
    return [f for f, _ in feature_phrases(name)]


def _switched_off(value: ast.AST | None) -> bool:
    return isinstance(value, ast.Constant) and value.value in (None, False, 0)


def _last_name(n: ast.AST) -> str | None:
    return n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else None


def is_layer_class(node: ast.ClassDef) -> bool:
    """A layer module of the family's own: derives from an attention/MLP/norm/linear/layer class, and is not a
    bridge, provider, config, mapping or model wrapper."""
    words = words_of(node.name)
    if words and words[-1] in NOT_A_LAYER:  # what it is, by its last word (`Step35DecoderLayer` is a layer)
        return False
    own_kind = _hit(words_of(node.name), LAYER_BASE_WORDS)
    for b in node.bases:
        name = _last_name(b)
        if name and _hit(words_of(name), LAYER_BASE_WORDS) and not _hit(words_of(name), NOT_A_LAYER):
            return True
        if name and own_kind and name.endswith("Module"):  # `Gemma2DotProductAttention(MegatronModule)`
            return True
    return False


def is_bridge_class(node: ast.AST) -> bool:
    """`@MegatronModelBridge.register_bridge(...)`: a class verl's AutoBridge can hand out for an HF architecture."""
    return isinstance(node, ast.ClassDef) and any(
        _last_name(d.func if isinstance(d, ast.Call) else d) == "register_bridge" for d in node.decorator_list)


def is_bridge_unit(unit: Unit) -> bool:
    """A registered bridge class, by its decorator or by module code that applies `register_bridge(...)` to it."""
    return unit.kind == "class" and (unit.bridge_call or is_bridge_class(unit.node))


def is_spec_function(node: ast.AST) -> bool:
    return isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and bool(_hit(words_of(node.name), SPEC_WORDS))


@dataclass
class Sites:
    """feature → evidence (a short description of the code fact, with its line)."""

    by_feature: dict[str, list[str]] = field(default_factory=dict)

    def add(self, feature: str, what: str) -> None:
        lst = self.by_feature.setdefault(feature, [])
        if what not in lst and len(lst) < 6:
            lst.append(what)

    def update(self, other: Sites) -> None:
        for f, whats in other.by_feature.items():
            for w in whats:
                self.add(f, w)

    def features(self) -> list[str]:
        return [f for f in FEATURES if f in self.by_feature]


def sites_in(nodes: list[ast.AST], lines: set[int] | None = None, file: str = "") -> Sites:
    """Feature facts among these AST nodes (only those on `lines`, when given): names and name-like strings that
    are a feature's, a layer spec set, layer classes and spec functions defined. A feature set to None/False/0
    (`mtp_num_layers = None`) is no fact of it."""
    out = Sites()
    off: set[int] = set()
    for n in nodes:
        if isinstance(n, (ast.Assign, ast.AnnAssign)) and _switched_off(n.value):
            off.update(id(x) for x in ast.walk(n))
        elif isinstance(n, ast.keyword) and _switched_off(n.value):
            off.update(id(x) for x in ast.walk(n))
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            off.update(id(x) for x in ast.walk(n))
    for n in nodes:
        line = getattr(n, "lineno", None)
        if line is None or id(n) in off:
            continue
        where = f"{file}:{line}" if file else f"line {line}"
        if isinstance(n, ast.Call) and _last_name(n.func) == "ModuleSpec" and lines is not None and \
                line not in lines and set(range(line, (n.end_lineno or line) + 1)) & lines:
            out.add("custom-layer", f"ModuleSpec(...) edited ({where})")  # a submodule of a layer spec swapped
        if lines is not None and line not in lines:
            continue
        name = _name_of(n)
        if isinstance(n, ast.ClassDef) and is_layer_class(n):
            out.add("custom-layer", f"layer module {n.name} ({where})")
        elif is_spec_function(n):
            out.add("custom-layer", f"layer spec {n.name} ({where})")
        elif isinstance(n, ast.Call) and _last_name(n.func) == "ModuleSpec":
            out.add("custom-layer", f"ModuleSpec(...) built ({where})")
        if isinstance(n, (ast.Assign, ast.AnnAssign)):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            if any(_last_name(t) == "transformer_layer_spec" for t in targets) and _own_spec(n.value):
                out.add("custom-layer", f"transformer_layer_spec set ({where})")
        if isinstance(n, ast.keyword) and n.arg == "transformer_layer_spec" and _own_spec(n.value):
            out.add("custom-layer", f"transformer_layer_spec set ({where})")
        if name:
            for f in feature_of_name(name):
                if f == "vlm" and FLAG.match(name):
                    continue  # `is_vision_language`: a switch that describes, it builds no vision part
                out.add(f, f"{name} ({where})")
    return out


def _name_of(n: ast.AST) -> str | None:
    """The identifier or name-like string a node is (a name, an attribute, a keyword, a short string without spaces)."""
    if isinstance(n, ast.Name):
        return n.id
    if isinstance(n, ast.Attribute):
        return n.attr
    if isinstance(n, ast.keyword):
        return n.arg
    if isinstance(n, ast.Constant) and isinstance(n.value, str) and " " not in n.value and len(n.value) <= 120:
        return n.value
    return None


def _own_spec(value: ast.AST | None) -> bool:
    """A layer spec other than Megatron-Core's standard GPT ones (`get_gpt_decoder_block_spec`, ...): those build
    the default layers every GPT-style family has."""
    if value is None:
        return False
    names = [x for x in (_last_name(n) for n in ast.walk(value)) if x and "spec" in x]
    return not (names and all(x.startswith(STANDARD_SPEC_PREFIX) for x in names))


def unit_nodes(unit: Unit) -> list[ast.AST]:
    """Every node of a unit, its nested defs included (a class with its methods)."""
    return list(ast.walk(unit.node)) if unit.node is not None else []


# ---------------------------------------------------------------- families


@dataclass
class FamilyModel:
    """One registered bridge class and the code of its own folder it reaches."""

    bridge: str  # unit key of the bridge class
    folder: str  # its folder under models/
    units: set[str] = field(default_factory=set)  # unit keys of its closure (same folder)
    sites: Sites = field(default_factory=Sites)
    layer_units: set[str] = field(default_factory=set)  # its own layer modules / specs (and their methods)
    layer_files: set[str] = field(default_factory=set)  # files defining them
    config_units: set[str] = field(default_factory=set)  # its bridge and provider classes (with their methods)
    builds: Sites = field(default_factory=Sites)  # features of what that code builds from the HF config
    layer_reads: set[str] = field(default_factory=set)  # config fields its own layer modules read
    config_fields: set[str] = field(default_factory=set)  # the model-config fields its bridge and providers set
    layer_helpers: dict[str, str] = field(default_factory=dict)  # unit → the layer unit that reaches it (not config)
    moe_switch: list[str] = field(default_factory=list)  # its config code branches on a MoE flag: dense models too

    @property
    def name(self) -> str:
        return self.bridge.split(":", 1)[1]

    def features(self) -> list[str]:
        return self.sites.features()


def folder_of(path: str, index: BridgeIndex | None = None) -> str | None:
    """The model folder whose family code `path` is (None: shared code). A folder of shared model code (a base
    provider's) that holds a registered bridge at the commit, read from `index`, is that family's folder: before a
    family moved out, models/mamba held NemotronHBridge beside the MambaProvider it builds."""
    if not path.startswith(plan_rules.MODELS):
        return None
    rest = path[len(plan_rules.MODELS):]
    if "/" not in rest:
        return None
    folder = rest.split("/")[0]
    if folder not in plan_rules.GENERIC_MODEL_DIRS:
        return folder
    return folder if index is not None and folder in _shared_folders_with_bridges(index) else None


def _shared_folders_with_bridges(index: BridgeIndex) -> set[str]:
    return _per_index(index, "_shared_bridge_folders_cache", lambda ix: {
        folder for folder in plan_rules.GENERIC_MODEL_DIRS
        if any(is_bridge_unit(ix.units[k]) for m in _folder_modules(ix, folder)
               if (info := ix.modules.get(m)) for k in info.units)})


def _folder_modules(index: BridgeIndex, folder: str) -> list[str]:
    prefix = plan_rules.MODELS + folder + "/"
    return [m for m, rel in index.modules.files.items() if rel.startswith(prefix)]


def families_in(index: BridgeIndex, folder: str) -> list[FamilyModel]:
    """The registered bridges of one model folder, each with its closure and features."""
    mods = _folder_modules(index, folder)
    infos = [index.modules.get(m) for m in mods]
    units = [index.units[k] for info in infos if info for k in info.units]
    in_folder = {u.key for u in units}
    out = []
    for u in units:
        if not is_bridge_unit(u):
            continue
        fam = FamilyModel(u.key, folder)
        stack = [u.key]
        while stack:
            k = stack.pop()
            if k in fam.units or k not in in_folder:
                continue
            fam.units.add(k)
            unit = index.units[k]
            stack += [r for r in unit.refs if r in in_folder]
            stack += [b for b in unit.bases if b in in_folder]
            for var in unit.var_refs:  # the module-level tables it reads (a layer spec table)
                mod, _, name = var.rpartition(".")
                info = index.modules.get(mod)
                stack += [r for r in (info.table_refs.get(name, ()) if info else ()) if r in in_folder]
            if unit.kind == "class":
                stack += list(unit.methods.values())
        for k in sorted(fam.units):
            unit = index.units[k]
            if unit.kind in ("class", "function") and (
                    (unit.kind == "class" and is_layer_class(unit.node)) or is_spec_function(unit.node)):
                fam.layer_units.add(k)
                fam.layer_units.update(unit.methods.values())
                fam.layer_files.add(unit.file)
        for file, nodes in _own_code(index, fam):
            fam.sites.update(sites_in(nodes, file=file))
        _config_code(index, fam)
        _layer_helpers(index, fam)
        out.append(fam)
    return out


def _own_code(index: BridgeIndex, fam: FamilyModel) -> list[tuple[str, list[ast.AST]]]:
    """(file, nodes) of a family's own code: the module-level tables of the modules its code is in, then each of its
    units (a class without its methods: they are units of their own)."""
    out = []
    for m in sorted({k.split(":", 1)[0] for k in fam.units}):
        info = index.modules.get(m)
        if info is not None:
            mod = index.units[info.name]
            out.append((mod.file, [x for r in _module_own(mod) for x in ast.walk(r)]))
    for k in sorted(fam.units):
        unit = index.units[k]
        if unit.kind != "module":
            out.append((unit.file, _class_own(unit) if unit.kind == "class" else list(ast.walk(unit.node))))
    return out


def _layer_helpers(index: BridgeIndex, fam: FamilyModel) -> None:
    """The family's own code its layer modules and specs reach through their calls (a rotary helper its attention's
    forward calls, a norm its spec builds from another file): run inside the layers, so a change there is custom
    layer behaviour wherever the helper is defined. The bridge and provider classes a layer refers to (its config's
    type) are config code, not part of the layer."""
    stack = [(r, k) for k in sorted(fam.layer_units) for r in index.units[k].refs]
    while stack:
        k, via = stack.pop()
        if k not in fam.units or k in fam.layer_units or k in fam.layer_helpers or k in fam.config_units \
                or k == fam.bridge:
            continue
        unit = index.units[k]
        if unit.kind == "module":
            continue
        fam.layer_helpers[k] = via
        stack += [(r, via) for r in unit.refs]
        if unit.kind == "class":
            stack += [(m, via) for m in unit.methods.values()]


# What the family *builds*: its bridge (provider_bridge, mapping_registry: the HF config and weights it maps) and its
# provider classes. A feature there is a property of every model of the family (a MoE family builds experts in every
# MoE layer), unlike a feature of shared modelling code the family's folder also holds (a VL model class that
# handles `moe_layer_freq` for its MoE sibling).
PROVIDER_WORDS = ("provider", "model config")


def is_provider_class(index: BridgeIndex, unit: Unit) -> bool:
    if unit.kind != "class" or not isinstance(unit.node, ast.ClassDef):
        return False
    names = [unit.node.name] + [x for x in (_last_name(b) for b in unit.node.bases) if x]
    return any(_hit(words_of(n), PROVIDER_WORDS) for n in names)


def _config_code(index: BridgeIndex, fam: FamilyModel) -> None:
    """The family's bridge and provider classes (its config code), the features they build, and the config fields
    its own layer modules read (`self.config.window_size` in its attention class)."""
    bridge = index.units[fam.bridge]
    classes = [bridge] + [index.units[k] for k in sorted(fam.units)
                          if k != fam.bridge and is_provider_class(index, index.units[k])]
    for cls in classes:
        fam.config_units.add(cls.key)
        fam.config_units.update(cls.methods.values())
        fam.builds.update(sites_in(_class_own(cls), file=cls.file))
        for m in cls.methods.values():
            fam.builds.update(sites_in(list(ast.walk(index.units[m].node)), file=index.units[m].file))
        fam.moe_switch += _moe_switches(cls)
        fam.config_fields |= config_fields_set(cls, index)
    for k in fam.layer_units:
        u = index.units[k]
        if u.kind == "function" or (u.kind == "class" and not is_layer_class(u.node)):
            continue  # a spec function reads sizes to pick modules; the layer modules' own reads are its behaviour
        for n in ast.walk(u.node):
            if isinstance(n, ast.Attribute) and _last_name(n.value) == "config" and isinstance(n.ctx, ast.Load):
                fam.layer_reads.add(n.attr)


def config_fields_set(cls: Unit, index: BridgeIndex) -> set[str]:
    """The model-config fields a bridge or provider class sets: attribute assignments in its methods
    (`provider.window_size = ...`; a bridge's `self.x` is the bridge's own state), keyword arguments to a provider or
    config class (`Qwen3ModelProvider(window_size=...)`), and a provider's own declared fields (`window_size: int`)."""
    provider = is_provider_class(index, cls)
    out: set[str] = set()
    for n in [x for m in cls.methods.values() for x in ast.walk(index.units[m].node)] + _class_own(cls):
        if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                out.update(x.attr for x in ast.walk(t) if isinstance(x, ast.Attribute)
                           and (provider or _last_name(x.value) != "self"))
        elif isinstance(n, ast.Call) and _hit(words_of(_last_name(n.func) or ""), PROVIDER_WORDS + ("config",)):
            out.update(k.arg for k in n.keywords if k.arg)
    if provider:
        out.update(s.target.id for s in cls.node.body
                   if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name))
    return out


def standard_layer_fields(index: BridgeIndex, cache: dict[str, list[FamilyModel]]) -> set[str]:
    """Config fields that are no family's own layers' settings as far as Bridge's code shows: fields a family with
    no layers of its own sets, and every name Bridge's shared code (outside the model folders' families and the
    per-model recipes: conversion, training, the shared providers) reads or sets. A field that only families with
    their own layers set (`csa_compress_rotary_base`, `dsa_indexer_topk`) is a setting of those layers:
    Megatron-Core builds them from it, out of the Bridge's sight. `cache`: the caller's families per folder."""
    return _per_index(index, "_standard_fields_cache", lambda i: _build_standard_layer_fields(i, cache))


def _build_standard_layer_fields(index: BridgeIndex, cache: dict[str, list[FamilyModel]]) -> set[str]:
    out: set[str] = set()
    for folder in _family_folders(index):
        for fam in _families(index, folder, cache):
            if "custom-layer" not in fam.builds.by_feature:
                out |= fam.config_fields
    for u in list(index.units.values()):
        if u.kind == "module" and u.node is not None and folder_of(u.file, index) is None \
                and not u.file.startswith(plan_rules.PER_MODEL_DIRS):
            for n in ast.walk(u.node):
                if isinstance(n, ast.Attribute):
                    out.add(n.attr)
                elif isinstance(n, ast.keyword) and n.arg:
                    out.add(n.arg)
    return out


def own_layer_fields(index: BridgeIndex, fam: FamilyModel, fields: list[str],
                     cache: dict[str, list[FamilyModel]]) -> list[str]:
    """Of the fields a change sets, those that configure the family's own layers: it builds layers of its own
    and no family with standard layers sets the field (a field of a feature's own, an expert count, is that
    feature's)."""
    if "custom-layer" not in fam.builds.by_feature:
        return []
    standard = standard_layer_fields(index, cache)
    return sorted({f for f in fields if f in fam.config_fields and f not in standard and not f.startswith("_")
                   and not feature_of_name(f)})


def _moe_switches(cls: Unit) -> list[str]:
    """Branches of a config class on a MoE flag (`if getattr(hf_config, "enable_moe_block", False):`, `if is_moe:`):
    the family builds dense models from the same code, so experts are not a property of every model of it."""
    out = []
    for n in ast.walk(cls.node):
        if isinstance(n, (ast.If, ast.IfExp)):
            names = _names_in(n.test, set(), strings=True)
            # a flag that names MoE itself; not one about expert weights (`use_fused_experts`: their layout) or
            # layers (`is_moe_layer`: the MoE layer schedule of a MoE model)
            out += [f"{x} ({cls.file}:{n.lineno})" for x in names if FLAG.match(x)
                    and "moe" in (ws := set(words_of(x))) and not {"layer", "layers"} & ws]
    return out


def _module_own(unit: Unit) -> list[ast.AST]:
    return [s for s in unit.node.body if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]


def _class_own(unit: Unit) -> list[ast.AST]:
    """A class statement's own nodes (its methods are units of their own) plus the class node itself."""
    node = unit.node
    out: list[ast.AST] = [node]
    for part in [*node.bases, *node.keywords, *node.decorator_list,
                 *[s for s in node.body if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]]:
        out.extend(ast.walk(part))
    return out


def families_serving(index: BridgeIndex, unit: Unit, cache: dict[str, list[FamilyModel]]) -> list[FamilyModel]:
    """The families whose own code holds this unit (empty: the unit is shared code, or no family reaches it): the
    bridges of its folder that reach it, and bridges of other model folders whose code calls into it (Gemma 4 VL
    building Gemma 4's attention). Shared-folder code that only family code uses serves those families."""
    folder = folder_of(unit.file, index)
    key = unit.cls if unit.kind == "method" and unit.cls else unit.key
    if folder is not None:
        return _serving_family_code(index, unit, key, cache)
    if is_shared_layer(index, unit):
        # a layer module Bridge defines in shared model code (a TE linear with a fused norm): the families whose
        # own layer specs build it
        hits = []
        for bridge in _bridges_using(index, key):
            other = folder_of(index.units[bridge].file, index)
            hits += [f for f in _families(index, other, cache) if f.bridge == bridge and f not in hits] if other else []
        return hits
    hits = []
    for u in sorted(family_users(index, key)):
        user = index.units[u]
        hits += [f for f in _serving_family_code(index, user, user.cls if user.kind == "method" and user.cls else u,
                                                 cache) if f not in hits]
    return hits


def _serving_family_code(index: BridgeIndex, unit: Unit, key: str, cache: dict[str, list[FamilyModel]]
                         ) -> list[FamilyModel]:
    folder = folder_of(unit.file, index)
    hits = [f for f in _families(index, folder, cache) if unit.key in f.units or key in f.units]
    if not hits and unit.kind == "module":
        hits = [f for f in cache[folder] if any(k.split(":", 1)[0] == unit.module for k in f.units)]
    for bridge in _bridges_using(index, key):
        other = folder_of(index.units[bridge].file, index)
        if other and other != folder:
            hits += [f for f in _families(index, other, cache) if f.bridge == bridge and f not in hits]
    return hits


def family_users(index: BridgeIndex, key: str, seen: frozenset[str] = frozenset()) -> set[str]:
    """The family-code units that use `key` when every use of it ends in family code, through shared code that
    only family code uses (empty otherwise). A base class the families derive from is shared framework code: only
    references (calls, registrations) count as uses."""
    unit = index.units.get(key)
    if unit is None or unit.kind == "module" or key in seen:
        return set()
    _load_all(index)  # a use may sit in any module
    users = {u for u in _referrers(index).get(key, ()) if index.units[u].cls != key and u != key}
    out: set[str] = set()
    for u in users:
        user = index.units[u]
        if folder_of(user.file, index) is not None:
            out.add(u)
            continue
        via = family_users(index, user.cls if user.kind == "method" and user.cls else u, seen | {key})
        if not via:
            return set()
        out |= via
    return out


# a weight name a bridge maps: dotted parts with a layer wildcard or a weight/bias leaf
# (`model.layers.*.block_sparse_moe.experts.*.w1.weight`, `decoder.layers.*.mlp.linear_fc1.weight`)
WEIGHT_NAME = re.compile(r"[\w*]+(?:\.[\w*]+)*\.(?:\*|weight|bias)(?:\.[\w*]+)*|[\w]+(?:\.[\w*]+)*\.\*\.[\w.*]+")


def weight_names(index: BridgeIndex) -> list[tuple[str, str, frozenset[str]]]:
    """(weight name, model folder, its features) for every weight-name string in a model folder's code: the HF and
    Megatron names its bridges map. Shared conversion code that matches a fragment of them serves those weights."""
    return _per_index(index, "_weight_names_cache", _build_weight_names)


def _build_weight_names(index: BridgeIndex) -> list[tuple[str, str, frozenset[str]]]:
    _load_all(index)
    out = set()
    for u in list(index.units.values()):
        folder = folder_of(u.file, index)
        if folder is None or u.kind != "module" or u.node is None:
            continue
        for n in ast.walk(u.node):
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and WEIGHT_NAME.fullmatch(n.value):
                out.add((n.value, folder))
    return [(w, folder, frozenset(feature_of_name(w))) for w, folder in sorted(out)]


def weight_fragment_features(index: BridgeIndex, fragment: str) -> tuple[dict[str, list[str]], list[str]]:
    """The features every weight name holding `fragment` is a fact of (`".w1."` is only in MiniMax-M2's expert
    names → moe), with the names it matched: code that picks weights by the fragment handles those weights only.
    A fragment some dense weight also holds (`gate_proj`) is of no feature; a prefix filter (`"vision_tower."`
    at the start of names: which sub-model's weights to skip) is not a kind of weight."""
    if len(fragment.strip("._*")) < 2:
        return {}, []
    hits = [hit for hit in weight_names(index) if fragment in hit[0]]
    if not hits or (fragment.endswith(".") and any(w.startswith(fragment) for w, _, _ in hits)):
        return {}, []
    common = frozenset.intersection(*(features for _, _, features in hits))
    return ({f: [f"{w} ({folder})" for w, folder, _ in hits[:2]] for f in sorted(common)},
            sorted({folder for _, folder, _ in hits}))


def _family_folders(index: BridgeIndex) -> list[str]:
    """Every model folder of family code, every module loaded."""
    _load_all(index)
    return sorted({f for rel in index.modules.files.values() if (f := folder_of(rel, index))})


def _load_all(index: BridgeIndex) -> None:
    if not getattr(index, "_all_loaded", False):
        for m in list(index.modules.files):
            index.modules.get(m)
        index._all_loaded = True


def _per_index(index: BridgeIndex, name: str, build):
    """build(index), kept on the index until it holds more units (its modules load lazily)."""
    cached = getattr(index, name, None)
    if cached is not None and cached[0] == len(index.units):
        return cached[1]
    value = build(index)
    setattr(index, name, (len(index.units), value))
    return value


def _referrers(index: BridgeIndex) -> dict[str, set[str]]:
    """unit key → the units whose code references it (no base-class relations, no module tables)."""
    return _per_index(index, "_referrers_cache", _build_referrers)


def _build_referrers(index: BridgeIndex) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for u in list(index.units.values()):
        for r in u.refs:
            out.setdefault(r, set()).add(u.key)
    return out


def is_shared_layer(index: BridgeIndex, unit: Unit) -> bool:
    """A layer module (or its method) of Bridge's shared model code: Bridge's own layer behaviour, not Megatron-Core's."""
    if not unit.file.startswith(plan_rules.MODELS) or folder_of(unit.file, index) is not None:
        return False
    return is_layer_unit(index, unit)


def is_layer_unit(index: BridgeIndex, unit: Unit) -> bool:
    """A layer module, or a method of one."""
    cls = index.units.get(unit.cls) if unit.kind == "method" and unit.cls else unit if unit.kind == "class" else None
    return cls is not None and isinstance(cls.node, ast.ClassDef) and is_layer_class(cls.node)


def _families(index: BridgeIndex, folder: str, cache: dict[str, list[FamilyModel]]) -> list[FamilyModel]:
    if folder not in cache:
        cache[folder] = families_in(index, folder)
    return cache[folder]


def families_naming(index: BridgeIndex, feature: str, phrase: str, cache: dict[str, list[FamilyModel]]
                    ) -> list[str]:
    """The bridge files of the registered families whose own code names `phrase` as a fact of `feature` (a
    `GDNLinearMapping` Qwen3-Next's bridge registers names "gdn"): the models whose load runs shared code that
    handles what the phrase names. Built once per index, over every family folder."""
    table = _per_index(index, "_family_phrases_cache", lambda ix: _build_family_phrases(ix, cache))
    return table.get((feature, phrase), [])


def _build_family_phrases(index: BridgeIndex, cache: dict[str, list[FamilyModel]]
                          ) -> dict[tuple[str, str], list[str]]:
    out: dict[tuple[str, str], list[str]] = {}
    for folder in _family_folders(index):
        for fam in _families(index, folder, cache):
            bridge_file = index.units[fam.bridge].file
            found: set[tuple[str, str]] = set()
            for _, nodes in _own_code(index, fam):
                for n in nodes:
                    if name := _name_of(n):
                        found.update(feature_phrases(name))
            for key in found:
                if bridge_file not in out.setdefault(key, []):
                    out[key].append(bridge_file)
    return out


def _bridges_using(index: BridgeIndex, key: str) -> list[str]:
    """Registered bridge classes of any model folder whose code reaches `key` through family code only (never
    through shared code: that serves every family)."""
    users = _users(index)
    seen, stack, out = {key}, [key], []
    while stack:
        k = stack.pop()
        for u in sorted(users.get(k, ())):  # (a set: sorted, so the families come out in one order every run)
            if u in seen or folder_of(index.units[u].file, index) is None:
                continue
            seen.add(u)
            if is_bridge_unit(index.units[u]):
                out.append(u)
            stack.append(u)
    return out


def _users(index: BridgeIndex) -> dict[str, set[str]]:
    """unit key → the units that reference it (a method: its class; a table's entries: who reads the table)."""
    return _per_index(index, "_users_cache", _build_users)


def _build_users(index: BridgeIndex) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for u in list(index.units.values()):
        for r in u.refs | set(u.bases):
            out.setdefault(r, set()).add(u.key)
        if u.kind == "method" and u.cls:
            out.setdefault(u.key, set()).add(u.cls)
        for var in u.var_refs:
            mod, _, name = var.rpartition(".")
            info = index.modules.get(mod)
            for r in (info.table_refs.get(name, ()) if info else ()):
                out.setdefault(r, set()).add(u.key)
    return out
