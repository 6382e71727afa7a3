"""Where a failure happened, from the structure of the log rather than from its message: small tables.

(a) the Ray actor method that raised (`ray::WorkerDict.actor_rollout_init_model()` and the like) -> an area of verl's
    loop (model-build, rollout, weight-sync, training, checkpoint, worker creation, setup);
(b) the packages of the traceback frames nearest the exception -> a category (provider, rollout, nccl, data, ...);
(c) the exception type and message stay with the pattern table (patterns.py).

`category_from_structure` combines (a) and (b); the verdict engine falls back to (c) and says in the JSON which of
the three it looked at and which decided. `failure_signature` is what bisect compares between commits.
"""

from __future__ import annotations

import re

# (a) verl's remote methods (verl/workers/*_workers.py, single_controller, TaskRunner in main_ppo.py) -> area.
# First match wins; WorkerDict methods are `<role>_<method>` (actor_rollout_init_model, critic_update_critic).
METHOD_AREAS = (
    (re.compile(r"update_weights|sync_weights|sync_rollout_weights|rollout_mode|send_weights|weight_sync"),
     "weight-sync"),
    (re.compile(r"save_checkpoint|load_checkpoint|checkpoint", re.I), "checkpoint"),
    (re.compile(r"init_model|build_model|_build_"), "model-build"),
    (re.compile(r"generate_sequences|AgentLoop|agent_loop|launch_server|vLLM|sglang|SGLang|wake_up|sleep|"
                r"generate\b"), "rollout"),
    (re.compile(r"update_actor|update_critic|compute_log_prob|compute_ref_log_prob|compute_values|compute_rm_score|"
                r"train"), "training"),
    (re.compile(r"WorkerDict\.__init__|Worker\w*\.__init__"), "worker-creation"),
    (re.compile(r"TaskRunner\w*\.run|main_task"), "setup"),
)
# area -> the phase it implies
AREA_PHASES = {
    "weight-sync": "rollout-up", "checkpoint": "checkpoint", "model-build": "model-build", "rollout": "rollout-up",
    "training": "training", "worker-creation": "ray-up", "setup": "launch",
}

# (b) frame file path -> category; the frame nearest the exception that any row classifies decides.
FRAME_PACKAGES = (
    (re.compile(r"bucketed_weight_transfer|weight_transfer|checkpoint_engine/|sharding_manager|weight_sync|"
                r"/megatron/bridge/.*export|export_weights|update_weights"), "weight-sync"),
    (re.compile(r"dist_checkpointing|/utils/checkpoint/|checkpoint_manager|checkpointing\.py|model_merger|"
                r"safetensors"), "checkpoint"),
    (re.compile(r"/megatron/bridge/|/mbridge/|/models/mcore/"), "provider"),
    (re.compile(r"/megatron/core/"), "megatron-core"),
    (re.compile(r"vllm|sglang|/rollout/|agent_loop"), "rollout"),
    (re.compile(r"/utils/dataset/|rl_dataset|sft_dataset|/datasets/|pyarrow|/dataset\.py"), "data"),
    (re.compile(r"reward_manager|reward_score|/reward/|reward_model|reward_loop"), "reward-model"),
    (re.compile(r"torch/distributed/(?!tensor/|fsdp/|_tensor/|checkpoint/)|/gloo/|nccl|c10d"), "nccl"),
)


def method_area(method: str | None) -> str | None:
    if not method:
        return None
    for method_re, area in METHOD_AREAS:
        if method_re.search(method):
            return area
    return None


def frame_category(path: str) -> str | None:
    for frame_re, category in FRAME_PACKAGES:
        if frame_re.search(path):
            return category
    return None


# Exception types that name a setup category by themselves when raised before any worker (TaskRunner.run()).
SETUP_TYPES = {
    "FileNotFoundError": "data", "IsADirectoryError": "data", "ArrowInvalid": "data", "ArrowIOError": "data",
    "ConfigAttributeError": "config", "ConfigKeyError": "config", "ValidationError": "config",
    "MissingMandatoryValue": "config", "InterpolationResolutionError": "config",
}


def category_from_structure(area: str | None, frames: str | None, exc_type: str | None,
                            building: bool) -> str | None:
    """The category (a) the method's area and (b) the nearest classified frame give together; None: they say
    nothing. `building`: the model is being built or converted (megatron/core frames then name the provider)."""
    if frames == "megatron-core":
        frames = "provider" if building or area in ("model-build", "weight-sync") else None
    if area == "weight-sync":
        return "weight-sync"
    if area == "checkpoint":
        return "checkpoint"
    if area == "setup":
        if frames in ("data", "reward-model", "provider", "rollout"):
            return frames
        return SETUP_TYPES.get(exc_type or "", "config")
    if area == "worker-creation":
        return frames or "config"
    if area == "model-build":
        return frames if frames and frames != "weight-sync" else "provider"
    if area == "rollout":
        return frames if frames in ("provider", "weight-sync", "nccl") else "rollout"
    if area == "training":
        return frames
    return frames


# -- the failure's signature (bisect: the same failure as the --bad endpoint?) ---------------------------------
_MASKS = (
    (re.compile(r"0x[0-9a-fA-F]+"), "<addr>"),
    (re.compile(r"(?:[\w.-]*/)+[\w.-]+"), "<path>"),
    (re.compile(r"\b(?:pid|ip|actor_id|node_id|job_id)=[^,)\s]+"), r"\g<0>"),
    (re.compile(r"\b[0-9a-f]{16,}\b"), "<id>"),
    (re.compile(r"\d+(?:\.\d+)*"), "N"),
)
_KEYED = re.compile(r"\b(pid|ip|actor_id|node_id|job_id)=[^,)\s]+")


def mask_line(text: str) -> str:
    """A first error line with numbers, paths, pids and addresses masked (stable across commits and runs)."""
    text = _KEYED.sub(lambda m: f"{m.group(1)}=_", text or "")
    for mask_re, repl in (_MASKS[0], _MASKS[1], _MASKS[3], _MASKS[4]):
        text = mask_re.sub(repl, text)
    return re.sub(r"\s+", " ", text).strip()[:300]


EXC_TYPE_RE = re.compile(r"(?:^|[\s(.:])(?P<exc>[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Invalid))\b")


def exception_type(text: str | None) -> str | None:
    match = EXC_TYPE_RE.search(text or "")
    return match.group("exc") if match else None


def failure_signature(category: str, first_error: str | None) -> str:
    """category | exception type | masked first error line."""
    return f"{category}|{exception_type(first_error) or '-'}|{mask_line(first_error or '')}"
