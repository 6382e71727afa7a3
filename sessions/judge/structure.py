"""Where a failure happened, from the structure of the log rather than from its message: small tables.

(a) the Ray actor method that raised (`ray::WorkerDict.actor_rollout_init_model()` and the like) -> an area of verl's
    loop (model-build, rollout, weight-sync, training, checkpoint, reward, worker creation, setup); the function of
    the innermost verl frame (frames.py) names a finer area where it has one (`_build_rollout` inside init_model);
(b) the packages of the traceback frames nearest the exception (frames.py) -> a category (provider, rollout, nccl,
    data, ...);
(c) the exception type and message stay with the pattern table (patterns.py).

`category_from_structure` combines (a) and (b); the verdict engine falls back to (c) and says in the JSON which of
the three it looked at and which decided. `failure_signature` is what bisect compares between commits.
"""

from __future__ import annotations

import re

# (a) verl's remote methods (verl/workers/*_workers.py, single_controller, TaskRunner in main_ppo.py) -> area.
# First match wins; WorkerDict methods are `<role>_<method>` (actor_rollout_init_model, critic_update_critic,
# rm_compute_rm_score: the role `rm` is the reward model whatever the method).
METHOD_AREAS = tuple((re.compile(rx), area) for rx, area in (
    (r"\.rm_|[Rr]eward", "reward"),
    # verl's checkpoint engine is the actor -> rollout weight transfer, not a checkpoint save
    (r"update_weights|sync_weights|sync_rollout_weights|rollout_mode|send_weights|receive_weights|weight_sync|"
     r"CheckpointEngine|checkpoint_engine", "weight-sync"),
    (r"save_checkpoint|load_checkpoint", "checkpoint"),
    (r"init_model|build_model|_build_", "model-build"),
    (r"generate_sequences|AgentLoop|agent_loop|launch_server|init_engine|vLLM|vllm|SGLang|sglang|Rollout\w*\.|"
     r"Replica|wake_up|\.sleep|generate\b", "rollout"),
    (r"update_actor|update_critic|compute_log_prob|compute_ref_log_prob|compute_values|train_\w+|Trainer\w*\.",
     "training"),
    (r"\.__init__$", "worker-creation"),
    (r"TaskRunner\w*\.run|main_task", "setup"),
))
# area -> the phase it implies
AREA_PHASES = {
    "weight-sync": "rollout-up", "checkpoint": "checkpoint", "model-build": "model-build", "rollout": "rollout-up",
    "training": "training", "worker-creation": "ray-up", "setup": "launch", "reward": "training", "data": "launch",
    "config": "launch", "resources": "ray-up",
}
# areas that name a category wherever their frames are
AREA_CATEGORIES = {
    "weight-sync": "weight-sync", "checkpoint": "checkpoint", "reward": "reward-model", "data": "data",
    "config": "config", "resources": "env-no-gpu",
}


def method_area(method: str | None) -> str | None:
    if not method:
        return None
    for method_re, area in METHOD_AREAS:
        if method_re.search(method):
            return area
    return None


# Exception types that name a setup category by themselves when raised before any worker (TaskRunner.run()).
SETUP_TYPES = {
    "FileNotFoundError": "data", "IsADirectoryError": "data", "ArrowInvalid": "data", "ArrowIOError": "data",
    "ConfigAttributeError": "config", "ConfigKeyError": "config", "ValidationError": "config",
    "MissingMandatoryValue": "config", "InterpolationResolutionError": "config",
}


# Exception types that name a category by themselves while a model is built (no classified frame says more).
BUILD_TYPES = {"FileNotFoundError": "data", "IsADirectoryError": "data"}


def category_from_structure(area: str | None, frames: str | None, exc_type: str | None,
                            building: bool, communication: bool = True) -> str | None:
    """The category (a) the area of verl's loop and (b) the nearest classified frame give together; None: they
    say nothing. `building`: the model is being built or converted (megatron/core frames then name the provider);
    `communication`: the exception is a communication fault (a distributed error type, the backend or a timeout
    named), see communication_fault."""
    if frames == "megatron-core":
        frames = "provider" if building or area in ("model-build", "weight-sync") else None
    if area in AREA_CATEGORIES:
        return AREA_CATEGORIES[area]
    if area == "setup":
        if frames in ("data", "reward-model", "provider", "rollout", "config", "checkpoint", "env-no-gpu"):
            return frames
        # setup is data, config or GPUs: only the exception type can say which (TaskRunner.run() also runs fit())
        return SETUP_TYPES.get(exc_type or "")
    if area == "worker-creation":
        return frames or "config"
    if area == "model-build":  # init_model builds actor, ref, critic and rollout: the frames say which failed
        if frames is None:  # else the exception: a file missing while building is the model path's
            return BUILD_TYPES.get(exc_type or "")
        return frames if frames != "weight-sync" else "provider"
    if area == "rollout":  # torch.distributed's frames prove a communication fault only when the error is one
        if frames == "nccl" and not communication:  # the engine misusing a collective (a CPU tensor, no group)
            return "rollout"
        return frames if frames in ("provider", "weight-sync", "nccl", "reward-model") else "rollout"
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


# what a failure inside torch.distributed says when the communication itself failed
DIST_ERROR_TYPES = {"DistBackendError", "DistNetworkError", "DistStoreError", "DistError", "TimeoutError"}
_COMMUNICATION_RE = re.compile(r"(?i)nccl|gloo|hccl|timed? ?out|connection|socket|rendezvous|TCPStore|watchdog")


def communication_fault(exc_type: str | None, text: str) -> bool:
    return exc_type in DIST_ERROR_TYPES or bool(_COMMUNICATION_RE.search(text))
