"""Facts read from a model's HF config.json: how many routed experts it has (0: not MoE)."""

from __future__ import annotations

MOE_CONFIG_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


def expert_count(config: dict) -> int:
    """Routed experts in an HF config (also under text_config/language_config of a VLM); 0: not MoE."""
    for sub in (config, config.get("text_config") or {}, config.get("language_config") or {}):
        for key in MOE_CONFIG_KEYS:
            value = sub.get(key) if isinstance(sub, dict) else None
            if isinstance(value, int) and value > 1:
                return value
    return 0
