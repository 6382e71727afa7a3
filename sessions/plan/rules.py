"""Which coverage levels a Bridge change justifies, as data: the procedure's "Portée" table ("Requis quand").

`sessions/plan/planner.py` finds the changed functions/classes of a change, whether verl reaches them (what verl imports
and calls of Megatron-Bridge, followed through Bridge's own calls: sessions/plan/reach.py), and the words of what
each does (identifiers split at snake/camel case, lower-cased). A rule fires for a changed unit verl reaches when
one of its `topics` matches:
- a topic is one or more words that must all be words of one identifier (`expert parallel` matches
  `expert_model_parallel_size`; `ep` matches `gather_from_ep_ranks`, not `step`);
- `evidence="subject"`: only what the unit is about counts (its name and class, the conditions its changed lines
  run under, a new function's signature) — the table's "... changed" columns (L1, L2, L5);
  `evidence="code"`: any name its changed code uses counts — the table's "involved" / "touches" (L3, L4).
Code verl imports but never calls counts by its subject only, and only where code of a module verl imports calls
it; code verl never imports, methods of classes verl never builds, changed imports, module tables no reached code
reads and calls that only log count for nothing.
Level 2 reads what the changed lines read or set of the parallel state and the conditions they run under (an early
exit on a trivial size, `if self.ep_size == 1: return`, makes the lines after it need EP > 1), never the unit's
name; lines that run only for experts, or units named for experts, ask for the MoE variant.
`areas` are packages whose every change verl reaches is about the rule (all of `peft/` is PEFT).
"""

from __future__ import annotations

from dataclasses import dataclass

SRC = "src/megatron/bridge/"
MODELS = SRC + "models/"

# What each level is required for (the procedure's "Requis quand" column).
REQUIRED_WHEN: dict[int, str] = {
    0: "any new provider or provider config change that claims verl compatibility",
    1: "PEFT, checkpointing, HF export, adapter export, optimizer state or resume behaviour changed",
    2: "provider finalization, mpu-derived parameters, TP/PP/CP/EP, sequence parallelism or dispatcher "
       "behaviour changed",
    3: "only when Megatron-FSDP coverage is explicitly requested or the change directly touches that integration "
       "path (FSDP wrapping, sharding, checkpoint format, distributed optimizer)",
    4: "VLM, MoE, MTP, QAT/ModelOpt, quantized weights or custom layer behaviour involved",
    5: "optimizer, scheduler, loss, reward, PEFT trainability, gradient flow or model-specific training "
       "stability changed",
}

# Files that are documentation: a change made only of these recommends nothing.
DOC_PATTERNS: tuple[str, ...] = (
    "docs/*", "*.md", "*.rst", "LICENSE*", "NOTICE*", "CHANGELOG*", "*.png", "*.jpg", "*.jpeg", "*.svg", "*.gif",
)
# Bridge's own tests, CI and examples: they never run in verl's process; `nox -s bridge_unit` runs Bridge's tests.
BRIDGE_OWN = ("tests/*", ".github/*", "examples/*", "scripts/*", "docker/*", "tutorials/*", "skills/*", ".*")


@dataclass(frozen=True)
class Rule:
    name: str
    level: int
    reason: str  # why the level is required, in the procedure's words
    topics: tuple[str, ...] = ()
    evidence: str = "subject"  # subject | code
    areas: tuple[str, ...] = ()  # fnmatch globs: a reached change there is about this rule whatever its words
    variant: str | None = None  # level 2: dense | moe
    feature: str | None = None  # level 4: vlm | moe | mtp | qat | quantized | custom-layer
    optional: str | None = None  # offered, not required: why it is arguable
    within: str | None = None  # fires only where this other rule fires too (PEFT trainability: in PEFT code)
    code_topics: tuple[str, ...] = ()  # evidence="code": topics for the code's names when narrower than `topics`
    code_in: tuple[str, ...] = ()  # globs where the names of changed code verl runs count, not only its subject
    unless: tuple[str, ...] = ()  # topics that make an identifier mean something else (activation checkpointing)
    only_in: tuple[str, ...] = ()  # globs outside which the rule never fires (PEFT's own modules)
    sets_in: tuple[str, ...] = ()  # globs where a field the changed code *sets* counts (`moe_aux_loss_coeff = ...`
    # in a provider changes the loss), not only its subject


# Megatron's modules whose functions are the mpu state itself (`parallel_state.get_tensor_model_parallel_rank()`);
# any other module name used as a namespace (`tensor_parallel.ColumnParallelLinear`) reads no parallel size.
MPU_STATE_MODULES = ("parallel_state", "mpu")

# Where the parallel sizes and mpu state that changed code reads or sets count (provider, finalize, mapping and
# PEFT adapter code verl runs), not only what the code is about.
PARALLEL_CODE = (SRC + "models/*", SRC + "peft/*")
# The sizes Level 2's MoE variant never varies (env/presets.py: it sets only COMMON_EP and COMMON_ETP; PP, VPP and CP
# are the dense variant's, rule tp-pp-cp): read on lines that run only for experts, they still ask for the dense run.
DENSE_VARIANT_SIZES = ("pp", "cp", "vpp", "pipeline parallel", "context parallel", "virtual pipeline", "pipeline stage")

RULES: tuple[Rule, ...] = (
    # ---- Level 0: the provider itself (fired by reachability, see sessions/plan/planner.py)
    Rule("verl-runs-it", 0, "Bridge code verl runs changed (provider, bridge, conversion or a function verl "
         "calls): verl must still import it, apply PEFT, wrap with DDP and finish a PPO step"),
    Rule("level-0-first", 0, "every coverage starts at Level 0: the smoke must pass before any other level "
         "means anything"),
    Rule("megatron-lm", 0, "the Megatron-LM submodule moved: every provider builds on megatron.core",
         optional="the procedure names no level for a Megatron-LM bump; Level 0 is the cheapest check that verl "
                  "still builds and updates the model on the new megatron.core"),
    Rule("dependencies", 0, "Bridge's dependencies changed (pyproject.toml / uv.lock)",
         optional="verl's image provides its own packages; Level 0 shows whether the change matters there"),
    # ---- offered, never required: the procedure leaves them to judgement (fired by sessions/plan/planner.py)
    Rule("moe-ep-follow-up", 2, "MoE involved: an EP=2 run stresses expert-parallel routing", variant="moe",
         optional="the procedure asks for an expert-parallel run when expert layout, dispatcher, router replay or "
                  "expert TP change, and keeps it a follow-up otherwise"),
    Rule("new-provider-parallel-follow-up", 2, "a new provider's own code reads or sets parallel sizes: a "
         "TP/PP run stresses it", variant="dense",
         optional="the procedure keeps parallel stress runs a follow-up for a new provider, never its first "
                  "debugging surface"),
    Rule("peft-learning", 5, "PEFT changed: whether adapters still learn is shown only by a learning-signal run",
         optional="Level 5 is for PEFT trainability; this change does not name it, so whether it matters is "
                  "arguable"),
    # ---- Level 1: save / resume
    Rule("peft", 1, "PEFT changed: LoRA adapters must survive verl's checkpoint save and resume",
         topics=("peft", "lora", "dora", "adapter", "adapters"),
         areas=(SRC + "peft/*", MODELS + "conversion/peft_bridge.py")),
    Rule("checkpointing", 1, "checkpointing changed: verl-owned checkpoint save/load of the Bridge-built model",
         topics=("checkpoint", "checkpointing", "checkpoints", "ckpt", "save", "resume", "rng state",
                 "sharded state dict"),
         unless=("core attention", "activation", "activations", "recompute", "recomputation")),
    Rule("optimizer-state", 1, "optimizer state changed: it is saved and reloaded on resume",
         topics=("optimizer state", "optim state", "load optim", "save optim", "optimizer state dict")),
    Rule("hf-export", 1, "HF export changed: verl exports weights through it (rollout sync, model/huggingface/ "
         "with every checkpoint)", topics=("export", "exports", "exporter", "megatron to hf"),
         unless=("config",)),  # Megatron → HF is the export direction; the reverse *config* translation is not
    # ---- Level 2: parallel stress
    Rule("provider-finalization", 2, "provider finalization changed: the provider must be finalized with the "
         "parallel sizes verl initialized through Megatron mpu", topics=("finalize",), variant="dense"),
    Rule("mpu-derived", 2, "parameters derived from Megatron mpu changed: they must stay right under TP/PP > 1",
         topics=("mpu", "parallel state", "model parallel rank", "model parallel world", "pg collection"),
         variant="dense", code_in=PARALLEL_CODE),
    Rule("tp-pp-cp", 2, "tensor / pipeline / context / sequence parallel sizes or layout changed",
         topics=("tp", "pp", "cp", "vpp", "tensor parallel", "pipeline parallel", "context parallel",
                 "sequence parallel", "virtual pipeline", "pipeline stage"), variant="dense", code_in=PARALLEL_CODE,
         unless=("expert", "experts")),  # the experts' TP size (ETP) is the expert layout: the MoE variant's
    Rule("expert-parallel", 2, "expert layout / expert parallelism changed: stress EP=2 on a MoE checkpoint",
         topics=("ep", "etp", "expert parallel", "expert tensor parallel", "expt tp", "expert layout", "ep group",
                 "ep rank", "ep size", "num local experts", "local expert indices"), variant="moe", code_in=PARALLEL_CODE),
    # (the experts one rank holds — `num_local_experts`, `local_expert_indices` — are the EP layout itself)
    Rule("dispatcher", 2, "MoE dispatcher / router replay changed: stress expert-parallel routing",
         topics=("dispatcher", "deepep", "hybridep", "alltoall", "router replay", "routing replay", "flex dispatcher"), variant="moe",
         code_in=PARALLEL_CODE),
    # ---- Level 3: Megatron-FSDP (only when the change touches that path directly)
    Rule("megatron-fsdp", 3, "Megatron-FSDP wrapping, sharding, checkpoint format or distributed optimizer "
         "touched: the provider must also work when verl selects Megatron-FSDP",
         topics=("fsdp", "mfsdp", "fully shard", "fully sharded", "distributed optimizer", "sharding strategy",
                 "dtensor", "d tensor"),
         evidence="code"),
    # ---- Level 4: architecture-specific e2e
    Rule("vlm", 4, "vision-language model involved: text-only GSM8K does not run the vision encoder or image "
         "preprocessing", topics=("vision", "visual", "vit", "image", "images", "pixel", "video", "vl", "vlm",
                                   "multimodal"), evidence="code", feature="vlm"),
    Rule("moe", 4, "MoE involved: Level 0 with COMMON_EP=1 does not exercise expert routing",
         topics=("moe", "expert", "experts", "router", "ep"), evidence="code", feature="moe"),
    Rule("moe-family-follow-up", 4, "the family builds MoE models too: a run on its MoE checkpoint runs the change "
         "with experts", feature="moe",
         optional="the family's bridge branches on a MoE flag, so it also builds dense models, and the change touches "
                  "no MoE code: Level 0 shows it; a MoE run is a follow-up"),
    Rule("mtp", 4, "multi-token prediction involved: the generic wrapper may not enable MTP",
         topics=("mtp", "nextn", "multi token prediction"), evidence="code", feature="mtp"),
    Rule("qat-modelopt", 4, "QAT / ModelOpt involved: run the verl example that enables it",
         topics=("modelopt", "qat", "mtq"), evidence="code", feature="qat"),
    Rule("quantized-weights", 4, "quantized weights involved (FP8/FP4 weights, scales)",
         topics=("quant", "quantization", "quantized", "quantize", "dequant", "dequantize", "fp8", "fp4", "nvfp4",
                 "mxfp4", "weight scale"), evidence="code", feature="quantized"),
    Rule("custom-layer", 4, "custom layer behaviour involved: a layer spec or module of its own",
         topics=("layer spec", "module spec", "submodules", "modeling"), evidence="code",
         code_topics=("module spec", "submodules"), feature="custom-layer"),
    # ---- Level 5: learning signal
    Rule("optimizer", 5, "optimizer changed: check that metrics still move without NaN or frozen updates",
         topics=("optimizer config", "param group", "param groups", "lr", "learning rate", "weight decay",
                 "clip grad", "adam", "get megatron optimizer")),
    Rule("scheduler", 5, "learning-rate scheduler changed", topics=("scheduler", "lr decay", "lr warmup")),
    Rule("loss", 5, "loss changed: actor/critic losses must stay finite and move",
         topics=("loss", "losses", "cross entropy"), sets_in=PARALLEL_CODE,
         unless=("moe",)),  # a MoE router's auxiliary loss settings are the router's (Level 4 MoE)
    Rule("router-aux-loss", 5, "a MoE router's auxiliary (load-balancing) loss setting changed",
         topics=("aux loss", "z loss"), sets_in=PARALLEL_CODE,
         optional="an auxiliary loss balances the router rather than the training objective (the MoE run checks "
                  "the router); whether it moves the learning signal under verl is arguable"),
    Rule("reward", 5, "reward computation changed", topics=("reward", "rewards")),
    Rule("peft-trainability", 5, "PEFT trainability changed: adapters must stay trainable (non-zero trainable "
         "parameters, non-frozen LoRA)", topics=("requires grad", "freeze", "frozen", "trainable", "unfreeze"),
         within="peft"),
    # what an adapter adds to its layer's output and where its weights start decide whether it learns: not shown
    # by one update (Level 0) nor by a save/resume (Level 1). Only PEFT's own modules (a model's vision "adapter"
    # is no PEFT adapter), and only weight initialisation (`_init_target_match_state` sets up name matching)
    Rule("adapter-numerics", 5, "a PEFT adapter's forward computation or weight initialisation changed: whether "
         "the adapters still learn (moving, finite updates from their starting weights) is shown only by a "
         "learning-signal run", topics=("forward", "init weights", "init weight", "init method", "weight init",
                                         "weights init", "initialize weights", "reset parameters"),
         only_in=(SRC + "peft/*",), code_in=(SRC + "peft/*",),
         # in the changed code: Megatron's switch that turns a layer's weight initialisation on or off, and the
         # init methods its layers are built with (never `forward` in the code: every layer call names it)
         code_topics=("perform initialization", "init method", "init weights", "init weight", "weight init",
                      "weights init", "initialize weights", "reset parameters")),
    Rule("gradient-flow", 5, "gradient flow changed: no repeated zero grad norms, detached or frozen parameters",
         topics=("grad", "grads", "gradient", "gradients", "detach"), sets_in=(SRC + "*",),
         unless=("fusion", "fused")),  # a fused kernel for the same gradients (gradient_accumulation_fusion)
)

BY_NAME = {r.name: r for r in RULES}
FEATURE_RULE = {r.feature: r for r in RULES if r.level == 4 and r.feature and not r.optional}

# Paths that move dependencies rather than code.
SUBMODULE = "3rdparty/Megatron-LM"
DEPENDENCY_FILES = ("pyproject.toml", "uv.lock", "requirements*.txt")

# verl's entry points by the direction of the weights they move: an entry whose name has one of these words.
EXPORT_WORDS = ("export", "save", "megatron to hf")
IMPORT_WORDS = ("load", "import", "hf to megatron", "from hf", "to megatron", "provider", "get model")

# Level 3 when no rule asked for it: the procedure keeps it out of the default validation.
FSDP_ON_REQUEST = ("Level 3 (Megatron-FSDP) is not required by this change; run it only when Megatron-FSDP "
                   "coverage is explicitly requested: invoke level3")


# ---------------------------------------------------------------- models to run the changed code


@dataclass(frozen=True)
class Family:
    """A provider family (one generation of it): where its files live and its smallest public checkpoints."""

    name: str
    folder: str  # its folder under src/megatron/bridge/models/
    prefixes: tuple[str, ...] = ("",)  # path under the folder starts with one of these (a generation)
    dense: str | None = None  # smallest public dense checkpoint
    moe: str | None = None  # smallest public MoE checkpoint of this generation
    mtp: str | None = None  # smallest public checkpoint with MTP layers
    vlm: bool = False
    note: str = ""
    representative: str | None = None  # MODEL_ID for the dummy-model path when no small checkpoint fits


# Ordered specific → generic within a folder. Names are the ones Megatron-Bridge's own tests and examples use.
FAMILIES: tuple[Family, ...] = (
    Family("qwen3-moe", "qwen", ("qwen3_moe",), moe="Qwen/Qwen3-30B-A3B",
           note="the smallest public Qwen3 MoE is 30B total / 3B active"),
    Family("qwen3-next", "qwen", ("qwen3_next",), moe="Qwen/Qwen3-Next-80B-A3B-Instruct", mtp=None,
           note="80B total: prefer the dummy-model path on small machines",
           representative="Qwen/Qwen3-Next-80B-A3B-Instruct"),
    Family("qwen3.5", "qwen", ("qwen35",), dense="Qwen/Qwen3.5-0.8B", moe="Qwen/Qwen3.5-35B-A3B"),
    Family("qwen3", "qwen", ("qwen3",), dense="Qwen/Qwen3-0.6B", moe="Qwen/Qwen3-30B-A3B"),
    Family("qwen2-moe", "qwen", ("qwen2_moe",), moe="Qwen/Qwen1.5-MoE-A2.7B"),
    Family("qwen2", "qwen", ("qwen2", ""), dense="Qwen/Qwen2.5-0.5B"),
    Family("qwen2.5-vl", "qwen_vl", ("qwen25", "modeling_qwen25"), dense="Qwen/Qwen2.5-VL-3B-Instruct", vlm=True),
    Family("qwen3.5-vl", "qwen_vl", ("qwen35",), dense="Qwen/Qwen3.5-0.8B", moe="Qwen/Qwen3.5-35B-A3B", vlm=True),
    Family("qwen3-vl", "qwen_vl", ("",), dense="Qwen/Qwen3-VL-2B-Instruct", moe="Qwen/Qwen3-VL-30B-A3B-Instruct",
           vlm=True),
    Family("llama-nemotron", "llama_nemotron", dense="nvidia/Llama-3.1-Nemotron-Nano-8B-v1"),
    Family("llama", "llama", dense="meta-llama/Llama-3.2-1B", note="gated on the Hub: needs HF_TOKEN with access"),
    Family("gemma3-vl", "gemma_vl", dense="google/gemma-3-4b-it", vlm=True,
           note="gated on the Hub: needs HF_TOKEN with access"),
    Family("gemma4", "gemma", ("gemma4", "modeling_gemma4"), moe="google/gemma-4-26B-A4B-it",
           representative="google/gemma-4-E4B-it"),
    Family("gemma3", "gemma", ("gemma3",), dense="google/gemma-3-1b-it",
           note="gated on the Hub: needs HF_TOKEN with access"),
    Family("gemma2", "gemma", ("gemma2",), dense="google/gemma-2-2b",
           note="gated on the Hub: needs HF_TOKEN with access"),
    Family("gemma", "gemma", ("",), dense="google/gemma-2b", note="gated on the Hub: needs HF_TOKEN with access"),
    Family("deepseek-v2", "deepseek", ("deepseek_v2",), moe="deepseek-ai/DeepSeek-V2-Lite"),
    Family("deepseek-v3", "deepseek", ("deepseek_v3", "deepseek_v4", ""),
           note="no small public V3/V4 checkpoint: the dummy-model path with a minimal V3 config (MoE, MLA, MTP)",
           representative="deepseek-ai/DeepSeek-V3"),
    Family("olmoe", "olmoe", moe="allenai/OLMoE-1B-7B-0924"),
    Family("gpt-oss", "gpt_oss", moe="openai/gpt-oss-20b"),
    Family("mistral", "mistral", dense="mistralai/Mistral-7B-v0.1", note="the smallest public Mistral is 7B"),
    Family("ministral3", "ministral3", dense="mistralai/Ministral-3-3B-Base-2512"),
    Family("ernie4.5", "ernie", dense="baidu/ERNIE-4.5-0.3B-PT", moe="baidu/ERNIE-4.5-21B-A3B-PT"),
    Family("ernie4.5-vl", "ernie_vl", moe="baidu/ERNIE-4.5-VL-28B-A3B-PT", vlm=True,
           note="the smallest public ERNIE 4.5 VL is 28B total / 3B active"),
    Family("exaone4", "exaone", ("exaone4/", "exaone4_"), dense="LGAI-EXAONE/EXAONE-4.0-1.2B"),
    Family("nemotron-h", "nemotronh", dense="nvidia/Nemotron-H-4B-Base-8K"),
    Family("glm4.7-flash", "glm", ("glm47",), moe="zai-org/GLM-4.7-Flash"),
    Family("kimi", "kimi", moe="moonshotai/Moonlight-16B-A3B"),
    Family("bailing", "bailing", moe="inclusionAI/Ling-mini-2.0"),
    Family("falcon-h1", "falcon_h1", dense="tiiuae/Falcon-H1-7B-Instruct",
           note="the smallest Falcon-H1 Megatron-Bridge tests use is 7B"),
)

# Family-independent provider code: files directly under models/ and these folders of it.
GENERIC_MODEL_DIRS = ("conversion", "common", "hf_pretrained", "gpt", "decorators", "mamba", "hybrid")
# Per-model configuration outside models/ (training recipes of one family): they set a family's fields, they are
# no shared code that reads them.
PER_MODEL_DIRS = (SRC + "recipes/", SRC + "perf_recipes/")
GENERIC_DENSE = "Qwen/Qwen2.5-0.5B"  # the wrapper's default dense checkpoint, for family-independent code
GENERIC_VLM = "Qwen/Qwen3-VL-2B-Instruct"  # a small public VLM with a Bridge provider, for shared code
GENERIC_MOE = "allenai/OLMoE-1B-7B-0924"  # a small public MoE with a Bridge provider, for family-independent code

# The dummy-model path (USE_DUMMY_MODEL=True): these values are merged onto the real HF config of MODEL_ID by
# verl's scripts/init_random_model.py, giving a tiny model of the same architecture with random weights.
MINIMAL_DUMMY_CONFIG: dict[str, int] = {
    "num_hidden_layers": 2, "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
