"""Levels are data: one table says what each level sets (SPEC "Levels"; the procedure's values are the contract).

A level has one or more wrapper runs (level 1 has two), optional variants (level 2), extra Hydra overrides (level 3)
and the deliverable text it claims when it passes. The runner (`sessions/run/level.py`) merges BASE, the level's env,
the variant's env and the run's env, in that order; no level has its own code path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path


def override_key(override: str) -> str:
    """`++a.b=c` / `+a.b=c` / `a.b=c` -> `a.b` (Hydra's key of an override)."""
    return override.lstrip("+~").split("=", 1)[0]


WRAPPER = "tests/special_e2e/run_ppo_trainer_megatron.sh"

# The procedure's Level 0 exports, shared by every level.
BASE_ENV: dict[str, str] = {
    "ENGINE": "vllm",
    "USE_MBRIDGE": "True",
    "VANILLA_MBRIDGE": "False",
    "VALUE_VANILLA_MBRIDGE": "False",
    "LORA_RANK": "4",
    "USE_MEGATRON_FSDP": "False",
    "COMMON_PP": "1",
    "COMMON_VPP": "null",
    "COMMON_CP": "1",
    "COMMON_TP": "1",
    "INFER_TP": "1",
    "ALL_OFFLOAD": "False",
    "TOTAL_TRAIN_STEPS": "1",
    "SAVE_FREQ": "-1",
    "VAL_BEFORE_TRAIN": "False",
    "TEST_FREQ": "-1",
}

# Without Apex's fused_weight_gradient_mlp_cuda (and for Megatron-FSDP) actor, ref and critic need
# gradient_accumulation_fusion=False. verl's ref config (v0.9.0, HEAD) takes the actor's whole
# override_transformer_config through `${oc.select:actor_rollout_ref.actor.megatron.override_transformer_config,{}}`:
# a key set on the ref replaces that inherited dict with one holding only the key, so the ref gets the actor's value
# by inheritance, and its own override only from a verl whose ref config has a dict of its own.
GRAD_ACCUM_FUSION_OFF: tuple[str, ...] = tuple(
    f"++{role}.megatron.override_transformer_config.gradient_accumulation_fusion=False"
    for role in ("actor_rollout_ref.actor", "critic")
)
REF_GRAD_ACCUM_FUSION_OFF = \
    "++actor_rollout_ref.ref.megatron.override_transformer_config.gradient_accumulation_fusion=False"
REF_CONFIG = "verl/trainer/config/ref/megatron_ref.yaml"
_REF_INHERITS = re.compile(r"^\s*override_transformer_config:\s*\$\{oc\.select:actor_rollout_ref\.actor\.megatron\."
                           r"override_transformer_config\b", re.M)


def ref_inherits(verl_repo: Path | str) -> bool:
    """verl's ref config takes the actor's override_transformer_config (v0.9.0 and HEAD do)."""
    try:
        text = (Path(verl_repo) / REF_CONFIG).read_text(errors="replace")
    except OSError:
        text = ""
    return bool(_REF_INHERITS.search(text))


def ref_fusion_override(verl_repo: Path | str) -> tuple[str, ...]:
    """The ref's own gradient_accumulation_fusion override: none where it inherits the actor's (see above)."""
    return () if ref_inherits(verl_repo) else (REF_GRAD_ACCUM_FUSION_OFF,)

# Without flash-attn in the run's Python, TE has no backend for verl's default attention_backend=flash ("No dot
# product attention backend is available" in the first forward): cuDNN's fused attention instead. The ref inherits
# the actor's override_transformer_config (see above; with LoRA the ref even runs inside the actor); it gets its
# own key only where verl's ref config does not inherit, or where another override already replaced that node.
ATTENTION_ROLES = ("actor_rollout_ref.actor", "critic")
REF_TRANSFORMER_CONFIG = "actor_rollout_ref.ref.megatron.override_transformer_config."


def attention_fused(verl_repo: Path | str, existing: list[str]) -> tuple[str, ...]:
    """The attention_backend=fused overrides for a run that already has `existing` overrides."""
    roles = list(ATTENTION_ROLES)
    if not ref_inherits(verl_repo) or any(override_key(o).startswith(REF_TRANSFORMER_CONFIG) for o in existing):
        roles.insert(1, "actor_rollout_ref.ref")
    return tuple(f"++{role}.megatron.override_transformer_config.attention_backend=fused" for role in roles)


def not_overridden(ours: tuple[str, ...] | list[str], user: list[str]) -> list[str]:
    """Our overrides minus those whose key the user sets after `--` (the user's own override wins)."""
    theirs = {override_key(o) for o in user}
    return [o for o in ours if override_key(o) not in theirs]


RUNTIME_ENV_PYTHONPATH = "++ray_kwargs.ray_init.runtime_env.env_vars.PYTHONPATH={}"
NO_PROFILER = "global_profiler.tool=null"
NO_REWARD_MODEL = "reward.reward_model.enable=False"
ENFORCE_EAGER = "actor_rollout_ref.rollout.enforce_eager=True"


@dataclass(frozen=True)
class RunSpec:
    """One invocation of the wrapper inside a level."""

    name: str  # "main", or "A"/"B" for save/resume
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Level:
    number: int
    title: str  # "LoRA + DDP smoke"
    proves: str  # what a Pass shows, for the Result sentence
    env: dict[str, str] = field(default_factory=dict)
    overrides: tuple[str, ...] = ()
    runs: tuple[RunSpec, ...] = (RunSpec("main"),)
    variants: dict[str, dict[str, str]] = field(default_factory=dict)
    default_variant: str | None = None
    # what "Requested variants" names for this level (None: level 0 requests no variant)
    variant_deliverable: str | None = None
    # the level needs its own checkpoint directory (trainer.default_local_dir) for the series
    owns_checkpoints: bool = False


LEVELS: dict[int, Level] = {
    0: Level(
        0,
        "LoRA + DDP smoke",
        "verl imported the local Bridge provider, applied LoRA, wrapped with Megatron DDP, built the optimizer, "
        "wired rollout/ref/critic and finished a PPO step",
    ),
    1: Level(
        1,
        "save/resume",
        "verl-owned checkpointing saved and reloaded the Bridge-built model state",
        runs=(
            RunSpec("A", {"SAVE_FREQ": "1", "TOTAL_TRAIN_STEPS": "1"}),
            RunSpec("B", {"RESUME_MODE": "auto", "SAVE_FREQ": "1", "TOTAL_TRAIN_STEPS": "2"}),
        ),
        variant_deliverable="save/resume",
        owns_checkpoints=True,
    ),
    2: Level(
        2,
        "parallel stress",
        "provider parameters stayed correct under non-trivial parallel Megatron state",
        variants={
            "dense": {"COMMON_TP": "2", "COMMON_PP": "2", "COMMON_VPP": "null", "COMMON_CP": "1", "INFER_TP": "2"},
            "moe": {"COMMON_EP": "2", "COMMON_ETP": "1", "ROUTING_REPLAY_MODE": "disabled"},
        },
        default_variant="dense",
        variant_deliverable="parallelism stress",
    ),
    3: Level(
        3,
        "Megatron-FSDP",
        "the same provider ran with verl selecting Megatron-FSDP instead of DDP",
        env={
            "USE_MEGATRON_FSDP": "True",
            "ALL_OFFLOAD": "False",
            "COMMON_PP": "1",
            "COMMON_VPP": "null",
            "COMMON_CP": "1",
            "COMMON_TP": "1",
            "INFER_TP": "1",
        },
        overrides=GRAD_ACCUM_FUSION_OFF,
        variant_deliverable="Megatron-FSDP",
    ),
    4: Level(
        4,
        "architecture-specific e2e",
        "the architecture-specific path ran end to end under verl",
        variant_deliverable="architecture-specific run",
    ),
    5: Level(
        5,
        "learning signal",
        "metrics moved in the expected direction over a short run without NaN, zero or frozen updates",
        env={"TOTAL_TRAIN_STEPS": "20", "SAVE_FREQ": "-1", "VAL_BEFORE_TRAIN": "True", "TEST_FREQ": "10"},
        variant_deliverable="learning-signal",
    ),
}


def level_env(level: Level, variant: str | None, run: RunSpec) -> dict[str, str]:
    """BASE < level < variant < run: the wrapper environment of one run of a level."""
    env = dict(BASE_ENV)
    env.update(level.env)
    if variant is not None:
        env.update(level.variants[variant])
    env.update(run.env)
    return env


def parallel_size(env: dict[str, str]) -> int:
    """GPUs one model replica needs: TP x PP x CP (the wrapper's defaults are 2 each when unset)."""
    size = 1
    for key in ("COMMON_TP", "COMMON_PP", "COMMON_CP"):
        size *= int(env.get(key, "2"))
    return size


# -- which code paths of verl a level's run takes (preflight gates a dependency only where the path needs it) -------

CHECKPOINT_KEYS = {"trainer.save_freq": "-1", "trainer.resume_mode": "disable"}  # Hydra key -> "off" value
# Level 4's features (`--feature`; the planner's Level 4 reasons use the same names)
FEATURES = ("vlm", "moe", "mtp", "qat", "quantized", "custom-layer")
QAT_FEATURES = ("qat", "quantized")


def level_paths(number: int, variant: str | None = None, feature: str | None = None,
                user_overrides: list[str] | tuple[str, ...] = ()) -> dict[str, str]:
    """path -> why this level takes it, for the paths beyond the model build every run takes: "checkpoint"
    (verl's save/load: a run with SAVE_FREQ != -1 or RESUME_MODE != disable, or the user's own trainer.save_freq /
    trainer.resume_mode after --) and "qat" (Level 4 --feature qat|quantized: ModelOpt)."""
    level = LEVELS[number]
    taken: dict[str, str] = {}
    for spec in level.runs:
        env = level_env(level, variant if variant in level.variants else None, spec)
        save, resume = env.get("SAVE_FREQ", "-1"), env.get("RESUME_MODE", "disable")
        if save != "-1" or resume != "disable":
            what = f"SAVE_FREQ={save}" + (f" RESUME_MODE={resume}" if resume != "disable" else "")
            run = f" run {spec.name}" if len(level.runs) > 1 else ""
            taken.setdefault("checkpoint", f"Level {number}{run} saves/loads checkpoints ({what})")
    for o in user_overrides:
        key, _, value = o.partition("=")
        key = override_key(key)
        if key in CHECKPOINT_KEYS and value.strip("'\"") not in (CHECKPOINT_KEYS[key], "null", ""):
            taken.setdefault("checkpoint", f"your override {o} saves/loads checkpoints")
    if number == 4 and feature in QAT_FEATURES:
        taken["qat"] = f"Level 4 --feature {feature} runs ModelOpt's quantization path"
    return taken


def path_not_taken(number: int, path: str) -> str:
    """Why a level does not take a path (for the warning that replaces a Blocked)."""
    if path == "checkpoint":
        return f"Level {number} saves nothing (SAVE_FREQ=-1) and resumes nothing"
    if path == "qat":
        return f"Level {number} runs no QAT/ModelOpt quantization (only Level 4 --feature qat|quantized does)"
    return f"Level {number} does not take the {path} path"


# wrapper variables a level sets that are not the level's own setting (preflight's, or the wrapper's launcher)
NOT_LEVEL_SETTINGS = ("NUM_GPUS", "VERL_USE_UV")
