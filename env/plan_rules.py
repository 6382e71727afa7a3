"""Which coverage levels a Bridge change justifies, as data: the procedure's "Portée" table ("Requis quand").

A rule fires for a changed file when the file's path matches one of its `paths`, or when one of its `content`
regexes matches a changed line (added or removed; a new untracked file counts whole) of a file under its
`content_scope`. Patterns are fnmatch globs over the repo-relative POSIX path (`*` also crosses `/`).
Paths follow Megatron-Bridge's layout (src/megatron/bridge/{models,peft,training}/...). Documentation files never
fire a rule. `sessions/plan.py` reads the change and applies these tables; nothing here runs anything.
"""

from __future__ import annotations

from dataclasses import dataclass

SRC = "src/megatron/bridge/"
MODELS = SRC + "models/"
CONVERSION = MODELS + "conversion/"
TRAINING = SRC + "training/"
PEFT = SRC + "peft/"

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
    "docs/*", "*.md", "*.rst", "*.txt.md", "LICENSE*", "NOTICE*", "CHANGELOG*", "*.png", "*.jpg", "*.jpeg",
    "*.svg", "*.gif",
)


@dataclass(frozen=True)
class Rule:
    name: str
    level: int
    reason: str  # why the level is required, in the procedure's words
    paths: tuple[str, ...] = ()
    content: tuple[str, ...] = ()  # regexes over changed lines
    content_scope: tuple[str, ...] = (SRC + "*.py",)
    exclude: tuple[str, ...] = ()  # paths this rule never fires on
    variant: str | None = None  # level 2: dense | moe
    feature: str | None = None  # level 4: vlm | moe | mtp | qat | quantized | custom-layer
    fallback: bool = False  # fires only for files no other rule matched


# Bridge code verl never runs (training recipes, diffusion, Bridge's own data pipelines).
NOT_ON_VERL_PATH = (SRC + "recipes/*", SRC + "diffusion/*", SRC + "data/*")

RULES: tuple[Rule, ...] = (
    # ---- Level 0: the provider itself
    Rule("provider", 0, "model provider / bridge / config changed: verl must still import it, apply PEFT, wrap "
         "with DDP and finish a PPO step",
         paths=(MODELS + "*.py",), exclude=(CONVERSION + "*", MODELS + "hf_pretrained/*")),
    Rule("hf-import", 0, "HF → Megatron import path changed (AutoBridge, parameter mapping, HF loading): verl "
         "builds its actor/ref/critic through it",
         paths=(CONVERSION + "*.py", MODELS + "hf_pretrained/*.py")),
    Rule("megatron-lm", 0, "the Megatron-LM submodule moved: every provider builds on megatron.core",
         paths=("3rdparty/Megatron-LM",)),
    Rule("bridge-source", 0, "Bridge code on verl's import path changed outside the mapped areas: Level 0 is the "
         "cheapest proof that verl still builds and updates the model",
         paths=(SRC + "*.py",), exclude=NOT_ON_VERL_PATH, fallback=True),
    # ---- Level 1: save / resume
    Rule("peft", 1, "PEFT changed: LoRA adapters must survive verl's checkpoint save and resume",
         paths=(PEFT + "*.py", CONVERSION + "peft_bridge.py")),
    Rule("checkpointing", 1, "checkpointing changed: verl-owned checkpoint save/load of the Bridge-built model",
         paths=(TRAINING + "checkpointing.py", TRAINING + "utils/checkpoint_utils.py",
                TRAINING + "model_load_save.py", TRAINING + "post_training/checkpointing.py"),
         content=(r"\b(save|load)_checkpoint\b", r"dist_checkpointing", r"sharded_state_dict", r"\bckpt_format\b")),
    Rule("hf-export", 1, "HF export changed: verl saves model/huggingface/ with every checkpoint",
         paths=(CONVERSION + "model_bridge.py", CONVERSION + "param_mapping.py", CONVERSION + "auto_bridge.py"),
         content=(r"save_hf_pretrained", r"save_hf_weights", r"export_hf", r"export_ckpt", r"megatron_to_hf",
                  r"export_weights")),
    Rule("adapter-export", 1, "adapter export changed: verl saves LoRA adapters under model/huggingface/adapter/",
         paths=(PEFT + "lora_merge.py",),
         content=(r"export_adapter", r"save_adapter", r"adapter_config", r"export_peft")),
    Rule("optimizer-state", 1, "optimizer state changed: it is saved and reloaded on resume",
         paths=(TRAINING + "optim.py",),
         content=(r"optimizer\.(load_)?state_dict", r"\bparam_groups\b", r"load_optim", r"optimizer_state"),
         content_scope=(TRAINING + "*.py", PEFT + "*.py", MODELS + "*.py")),
    Rule("resume", 1, "resume behaviour changed: run B must resume from run A's global_step",
         content=(r"\bresum", r"latest_checkpointed_iteration", r"load_rng", r"finetune_from", r"pretrained_checkpoint")),
    # ---- Level 2: parallel stress
    Rule("provider-finalization", 2, "provider finalization changed: the provider must be finalized with the "
         "parallel sizes verl initialized through Megatron mpu",
         paths=(MODELS + "model_provider.py",),
         content=(r"\bfinalize\b", r"provide_distributed_model", r"__post_init__"),
         content_scope=(MODELS + "*.py",), exclude=(CONVERSION + "*",), variant="dense"),
    Rule("mpu-derived", 2, "parameters derived from Megatron mpu changed: they must stay right under TP/PP > 1",
         content=(r"\bparallel_state\b", r"\bmpu\.", r"get_(tensor|pipeline|context|data)_model_parallel_\w+",
                  r"get_(tensor|pipeline|context|data)_parallel_\w+"),
         variant="dense"),
    Rule("tp-pp-cp", 2, "tensor / pipeline / context parallel sizes or layout changed",
         content=(r"tensor_model_parallel_size", r"pipeline_model_parallel_size",
                  r"virtual_pipeline_model_parallel", r"context_parallel_size", r"pipeline_dtype",
                  r"num_layers_in_(first|last)_pipeline_stage", r"\bpipeline_model_parallel_layout"),
         variant="dense"),
    Rule("sequence-parallel", 2, "sequence parallelism changed", content=(r"sequence_parallel",), variant="dense"),
    Rule("expert-parallel", 2, "expert layout / expert parallelism changed: stress EP=2 on a MoE checkpoint",
         content=(r"expert_model_parallel", r"expert_tensor_parallel", r"\bnum_moe_experts\b",
                  r"moe_grouped_gemm", r"local_experts", r"\.experts\.", r"moe_router", r"router_replay",
                  r"routing_replay"),
         variant="moe"),
    Rule("dispatcher", 2, "MoE dispatcher changed: stress expert-parallel routing",
         paths=(TRAINING + "flex_dispatcher_backend.py", TRAINING + "utils/moe_token_drop.py"),
         content=(r"token_dispatcher", r"moe_token_dispatcher_type", r"flex_dispatcher", r"\bdeepep\b",
                  r"moe_enable_deepep"),
         variant="moe"),
    # ---- Level 3: Megatron-FSDP (only when the change touches that path directly)
    Rule("megatron-fsdp", 3, "Megatron-FSDP wrapping, sharding, checkpoint format or distributed optimizer "
         "changed: the provider must also work when verl selects Megatron-FSDP",
         paths=(TRAINING + "fsdp_compat.py",),
         content=(r"megatron_fsdp", r"MegatronFSDP", r"FullyShardedDataParallel", r"\bfully_shard",
                  r"data_parallel_sharding_strategy", r"use_distributed_optimizer", r"DistributedOptimizer",
                  r"fsdp_dtensor", r"\bckpt_format\b")),
    # ---- Level 4: architecture-specific e2e
    Rule("vlm", 4, "vision-language model involved: text-only GSM8K does not run the vision encoder or image "
         "preprocessing", feature="vlm",
         paths=(MODELS + "*_vl/*", MODELS + "*vl_provider*.py", MODELS + "*vl_bridge*.py", MODELS + "*omni*/*",
                MODELS + "hf_pretrained/vlm.py", SRC + "inference/vlm/*", TRAINING + "vlm_step.py",
                TRAINING + "llava_step.py"),
         content=(r"vision_config", r"vision_model", r"pixel_values", r"image_token", r"VisionTransformer"),
         content_scope=(MODELS + "*.py",)),
    Rule("moe", 4, "MoE involved: Level 0 with COMMON_EP=1 does not exercise expert routing", feature="moe",
         paths=(MODELS + "*moe*", MODELS + "olmoe/*", MODELS + "deepseek/*", MODELS + "gpt_oss/*",
                TRAINING + "flex_dispatcher_backend.py", TRAINING + "utils/moe_token_drop.py"),
         content=(r"\bnum_moe_experts\b", r"\bmoe_\w+", r"\bexperts?\b.*\brouter\b", r"shared_expert"),
         content_scope=(MODELS + "*.py",)),
    Rule("mtp", 4, "multi-token prediction involved: the generic wrapper may not enable MTP", feature="mtp",
         paths=(SRC + "*mtp*",),
         content=(r"\bmtp_\w+", r"multi_token_prediction", r"MultiTokenPrediction")),
    Rule("qat-modelopt", 4, "QAT / ModelOpt involved: run the verl example that enables it", feature="qat",
         paths=(CONVERSION + "modelopt_utils.py", TRAINING + "post_training/*"),
         content=(r"\bmodelopt\b", r"\bmtq\.", r"\bqat\b", r"quant_cfg")),
    Rule("quantized-weights", 4, "quantized checkpoint support involved (FP8/FP4 weights, scales)",
         feature="quantized",
         paths=(CONVERSION + "quant_bridge.py", CONVERSION + "quant_mapping.py",
                CONVERSION + "quantization_utils.py"),
         content=(r"quantization_config", r"weight_scale", r"\bdequant", r"\bnvfp4\b", r"\bmxfp4\b",
                  r"fp8_(weight|param)"),
         content_scope=(MODELS + "*.py",)),
    Rule("custom-layer", 4, "custom layer behaviour involved: a layer spec or modeling module of its own",
         feature="custom-layer",
         paths=(MODELS + "*modeling_*", MODELS + "*modelling_*", MODELS + "*layer_spec*.py",
                MODELS + "*_layers.py", MODELS + "*/modules.py", MODELS + "common/te_layers.py",
                MODELS + "gpt_full_te_layer_autocast_spec.py"),
         content=(r"\bModuleSpec\b", r"\bTransformerLayerSubmodules\b", r"\bSelfAttentionSubmodules\b"),
         content_scope=(MODELS + "*.py",)),
    # ---- Level 5: learning signal
    Rule("optimizer", 5, "optimizer changed: check that metrics still move without NaN or frozen updates",
         paths=(TRAINING + "optim.py",),
         content=(r"OptimizerConfig", r"get_megatron_optimizer", r"\bweight_decay\b", r"adam_(beta|eps)",
                  r"clip_grad"),
         content_scope=(TRAINING + "*.py", MODELS + "*.py", PEFT + "*.py")),
    Rule("scheduler", 5, "learning-rate scheduler changed",
         content=(r"OptimizerParamScheduler", r"lr_decay", r"lr_warmup", r"\bscheduler\b")),
    Rule("loss", 5, "loss changed: actor/critic losses must stay finite and move",
         paths=(TRAINING + "losses.py",),
         content=(r"loss_func", r"cross_entropy", r"\bloss_mask\b", r"calculate_per_token_loss",
                  r"masked_next_token_loss")),
    Rule("reward", 5, "reward computation changed", content=(r"\breward",)),
    Rule("peft-trainability", 5, "PEFT trainability changed: adapters must stay trainable (non-zero trainable "
         "parameters, non-frozen LoRA)",
         content=(r"requires_grad", r"\bfreeze", r"trainable", r"\balpha\b", r"\bdropout\b", r"init_method",
                  r"\bscale\b"),
         content_scope=(PEFT + "*.py", CONVERSION + "peft_bridge.py")),
    Rule("gradient-flow", 5, "gradient flow changed: no repeated zero grad norms, detached or frozen parameters",
         content=(r"requires_grad", r"\.grad\b", r"main_grad", r"\.detach\(", r"no_grad",
                  r"gradient_accumulation_fusion", r"register_hook", r"finalize_model_grads", r"grad_scale")),
)

BY_NAME = {r.name: r for r in RULES}

# Level 3 when no rule asked for it: the procedure keeps it out of the default validation.
FSDP_ON_REQUEST = ("Level 3 (Megatron-FSDP) is not required by this change; run it only when Megatron-FSDP "
                   "coverage is explicitly requested: invoke level3")


@dataclass(frozen=True)
class Family:
    """A provider family: its files in Bridge and the smallest public checkpoints to test it with."""

    name: str
    paths: tuple[str, ...]  # fnmatch globs of its files
    dense: str | None = None  # smallest public dense checkpoint (0.5B/0.6B first)
    moe: str | None = None  # smallest public MoE checkpoint of the family
    vlm: bool = False
    note: str = ""
    # HF config `model_type` and a representative id for the dummy-model path when no small checkpoint exists
    model_type: str | None = None
    representative: str | None = None


# Ordered specific → generic: the first family whose pattern matches a file wins. Names are the ones
# Megatron-Bridge's own tests and examples use.
FAMILIES: tuple[Family, ...] = (
    Family("qwen3-moe", (MODELS + "qwen/qwen3_moe*",), moe="Qwen/Qwen3-30B-A3B",
           note="the smallest public Qwen3 MoE is 30B total / 3B active"),
    Family("qwen3-next", (MODELS + "qwen/qwen3_next*",), moe="Qwen/Qwen3-Next-80B-A3B-Instruct",
           note="80B total: prefer the dummy-model path on small machines", model_type="qwen3_next",
           representative="Qwen/Qwen3-Next-80B-A3B-Instruct"),
    Family("qwen3.5", (MODELS + "qwen/qwen35*",), dense="Qwen/Qwen3.5-0.8B", moe="Qwen/Qwen3.5-35B-A3B"),
    Family("qwen3", (MODELS + "qwen/qwen3_*", MODELS + "qwen/qwen3.py"), dense="Qwen/Qwen3-0.6B",
           moe="Qwen/Qwen3-30B-A3B"),
    Family("qwen2-moe", (MODELS + "qwen*/qwen2_moe*",), moe="Qwen/Qwen1.5-MoE-A2.7B"),
    Family("qwen2", (MODELS + "qwen/qwen2*", MODELS + "qwen/*"), dense="Qwen/Qwen2.5-0.5B"),
    Family("qwen2.5-vl", (MODELS + "qwen_vl/qwen25*", MODELS + "qwen_vl/modeling_qwen25*"),
           dense="Qwen/Qwen2.5-VL-3B-Instruct", vlm=True),
    Family("qwen3-vl", (MODELS + "qwen_vl/*",), dense="Qwen/Qwen3-VL-8B-Instruct",
           moe="Qwen/Qwen3-VL-30B-A3B-Instruct", vlm=True),
    Family("llama-nemotron", (MODELS + "llama_nemotron/*",), dense="nvidia/Llama-3.1-Nemotron-Nano-8B-v1"),
    Family("llama", (MODELS + "llama/*",), dense="meta-llama/Llama-3.2-1B",
           note="gated on the Hub: needs HF_TOKEN with access"),
    Family("gemma3-vl", (MODELS + "gemma_vl/*",), dense="google/gemma-3-4b-it", vlm=True,
           note="gated on the Hub: needs HF_TOKEN with access"),
    Family("gemma3", (MODELS + "gemma/gemma3*",), dense="google/gemma-3-1b-it",
           note="gated on the Hub: needs HF_TOKEN with access"),
    Family("gemma2", (MODELS + "gemma/gemma2*",), dense="google/gemma-2-2b",
           note="gated on the Hub: needs HF_TOKEN with access"),
    Family("gemma4", (MODELS + "gemma/gemma4*", MODELS + "gemma/modeling_gemma4*"), moe="google/gemma-4-26B-A4B-it",
           model_type="gemma4", representative="google/gemma-4-E4B-it"),
    Family("gemma", (MODELS + "gemma/*",), dense="google/gemma-2b",
           note="gated on the Hub: needs HF_TOKEN with access"),
    Family("deepseek-v3", (MODELS + "deepseek/deepseek_v3*", MODELS + "deepseek/deepseek_v4*"),
           moe="deepseek-ai/DeepSeek-V2-Lite",
           note="no small public V3/V4 checkpoint: DeepSeek-V2-Lite (16B MoE) shares MLA + MoE; or the dummy "
                "path with a minimal V3 config", model_type="deepseek_v3", representative="deepseek-ai/DeepSeek-V3"),
    Family("deepseek", (MODELS + "deepseek/*", MODELS + "mla_provider.py"), moe="deepseek-ai/DeepSeek-V2-Lite"),
    Family("olmoe", (MODELS + "olmoe/*",), moe="allenai/OLMoE-1B-7B-0924"),
    Family("gpt-oss", (MODELS + "gpt_oss/*",), moe="openai/gpt-oss-20b"),
    Family("mistral", (MODELS + "mistral/*",), dense="mistralai/Mistral-7B-v0.1",
           note="the smallest public Mistral is 7B"),
    Family("ministral3", (MODELS + "ministral3/*",), dense="mistralai/Ministral-3-3B-Base-2512"),
    Family("ernie", (MODELS + "ernie/*",), dense="baidu/ERNIE-4.5-0.3B-PT"),
    Family("exaone4", (MODELS + "exaone/exaone4/*",), dense="LGAI-EXAONE/EXAONE-4.0-1.2B"),
    Family("nemotron-h", (MODELS + "nemotronh/*", MODELS + "mamba/*", MODELS + "hybrid/*"),
           dense="nvidia/Nemotron-H-4B-Base-8K"),
    Family("glm", (MODELS + "glm/*",), moe="zai-org/GLM-4.7-Flash"),
    Family("kimi", (MODELS + "kimi/*",), moe="moonshotai/Moonlight-16B-A3B"),
    Family("bailing", (MODELS + "bailing/*",), moe="inclusionAI/Ling-mini-2.0"),
    Family("falcon-h1", (MODELS + "falcon_h1/*",), dense="tiiuae/Falcon-H1-7B-Instruct",
           note="the smallest Falcon-H1 Megatron-Bridge tests use is 7B"),
)

# Family-independent provider code: files directly under models/ and these folders of it.
GENERIC_MODEL_DIRS = ("conversion", "common", "hf_pretrained", "gpt", "decorators")
GENERIC = Family("generic", (), dense="Qwen/Qwen2.5-0.5B",
                 note="family-independent provider code: the wrapper's default dense checkpoint")

# The dummy-model path (USE_DUMMY_MODEL=True): these values are merged onto the real HF config of MODEL_ID by
# verl's scripts/init_random_model.py, giving a tiny model of the same architecture with random weights.
MINIMAL_DUMMY_CONFIG: dict[str, int] = {
    "num_hidden_layers": 2, "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4,
    "num_key_value_heads": 2,
}

# When a MoE checkpoint is needed and the touched family has none: small public MoE with a Bridge provider.
DEFAULT_MOE = "allenai/OLMoE-1B-7B-0924"
