"""The wrapper's traced command (its `set -x` line running verl.trainer.main_ppo), read from a log: the Hydra
overrides it ran with, the keys the level rules compare (TRACE_KEYS, FSDP_KEY), and what a level-4 run does not
cover for its feature. Used by the level rules (sessions/run/level_rules.py) and by `invoke judge --level N`
(level_criteria.py)."""

from __future__ import annotations

import shlex
from pathlib import Path

TRACE_SCAN_BYTES = 64 * 2**20  # the wrapper traces its command before verl prints anything big


def traced_overrides(log: Path) -> dict[str, str] | None:
    """The Hydra overrides of the traced `... -m verl.trainer.main_ppo ...` line (later wins, as in Hydra)."""
    from sessions.judge.logstream import open_log_text

    try:
        f = open_log_text(log)
    except OSError:
        return None
    with f:
        read = 0
        for line in f:
            read += len(line)
            if read > TRACE_SCAN_BYTES:
                return None
            stripped = line.lstrip()
            if not stripped.startswith("+") or "verl.trainer.main_ppo" not in stripped:
                continue
            body = stripped.lstrip("+").strip()
            try:
                tokens = shlex.split(body)
            except ValueError:
                tokens = body.split()
            values: dict[str, str] = {}
            for token in tokens:
                if "=" in token and not token.startswith("-"):
                    key, _, value = token.partition("=")
                    values[key.lstrip("+")] = value
            return values
    return None


# wrapper variable -> the Hydra key its traced command sets
TRACE_KEYS = {
    "COMMON_TP": "actor_rollout_ref.actor.megatron.tensor_model_parallel_size",
    "COMMON_PP": "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size",
    "COMMON_CP": "actor_rollout_ref.actor.megatron.context_parallel_size",
    "COMMON_EP": "actor_rollout_ref.actor.megatron.expert_model_parallel_size",
    "COMMON_ETP": "actor_rollout_ref.actor.megatron.expert_tensor_parallel_size",
    "INFER_TP": "actor_rollout_ref.rollout.tensor_model_parallel_size",
    "ROUTING_REPLAY_MODE": "actor_rollout_ref.actor.megatron.router_replay.mode",
}
FSDP_KEY = "actor_rollout_ref.actor.megatron.use_megatron_fsdp"
EP_KEY = TRACE_KEYS["COMMON_EP"]


def feature_limitations(feature: str | None, script: str | None, trace: dict[str, str] | None,
                        overrides: list[str]) -> list[str]:
    """What this run does not cover for the feature (the procedure's 'do not claim' list)."""
    from env import presets

    wrapper = script in (None, presets.WRAPPER)
    via = "the generic wrapper" if wrapper else f"{script}"
    out: list[str] = []
    if feature is None:
        out.append("no --feature named: the report cannot say which architecture-specific path this run targets")
    elif feature == "vlm":
        if wrapper:
            out.append("VLM with text-only GSM8K: covers the language-side provider and verl's outer-loop wrapping, "
                       "not image/video preprocessing or the vision encoder (pair with Bridge's VLM conversion/"
                       "inference tests or a multimodal verl example via --script)")
        else:
            out.append(f"VLM via {script}: whether images reached the vision encoder is not checked from the log")
    elif feature == "moe":
        ep = (trace or {}).get(EP_KEY) or next((o.split("=", 1)[1] for o in reversed(overrides)
                                                if o.lstrip("+").startswith(EP_KEY + "=")), "1")
        if ep in ("1", "", None):
            out.append("MoE with COMMON_EP=1: catches provider and PEFT problems but does not stress expert-parallel "
                       "routing, the dispatcher or expert tensor parallelism (run level 2 --variant moe)")
        else:
            out.append(f"MoE with expert_model_parallel_size={ep}: routing replay and the dispatcher config are as "
                       "the run set them; no targeted routing check")
    elif feature in ("mtp", "qat", "quantized"):
        what = {"mtp": "multi-token prediction (MTP)", "qat": "QAT/ModelOpt quantization-aware training",
                "quantized": "quantized-checkpoint loading / quantized rollout"}[feature]
        if wrapper:
            out.append(f"{what}: the generic wrapper may not enable it; use the model family's verl example "
                       f"(--script) and record its extra overrides")
        else:
            out.append(f"{what}: enabled only as far as {via} and the recorded overrides enable it; the log is not "
                       "checked for the feature itself")
    elif feature == "custom-layer":
        out.append("custom layer: exercised only through the model's forward/backward in a short PPO run; no "
                   "targeted numerical check of the layer")
    return out
