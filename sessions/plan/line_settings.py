"""Settings under which a changed line actually runs (beyond the procedure): read from the conditions the changed
lines sit under (`if ep_size > 1 and self.expert_tensor_parallel_size is None:`). When the level's default
settings would not reach the line, the plan says so and gives the Hydra overrides that do; `plan --run` appends
them to that level's command (later wins in Hydra).

Besides parallel sizes, a changed line may sit behind a switch of its own object that is off by default
(`if not self.normalize_moe_lora or not is_expert: return self.dim` in a PEFT class). verl builds its PEFT object
from `actor_rollout_ref.model.lora` through Bridge's `create_peft`, which passes every key that is a field of the
PEFT class: the override sets the switch. Level 0 keeps the procedure's defaults (the smoke of the default path)
and only says which level runs the line.
"""

from __future__ import annotations

import re

from sessions.plan.evidence import words_of

ROLES = ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic")

# (condition words, megatron key, value, why): the first matching row per key wins
SIZES: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (("etp", "expert tensor"), "expert_tensor_parallel_size", "2"),
    (("ep", "expert model", "expert parallel"), "expert_model_parallel_size", "2"),
    (("tp", "tensor model", "tensor parallel"), "tensor_model_parallel_size", "2"),
    (("pp", "pipeline model", "pipeline parallel"), "pipeline_model_parallel_size", "2"),
    (("cp", "context parallel"), "context_parallel_size", "2"),
)
NONE_TEST = re.compile(r"(\w*(?:etp|expert_tensor)\w*)\s+is\s+None", re.I)


def _has(words: set[str], phrase: str) -> bool:
    return set(phrase.split()) <= words


def settings_for(conditions: list[str], level: int, variant: str | None) -> list[tuple[str, list[str]]]:
    """(what, Hydra overrides) for each condition the level's preset does not meet."""
    out: list[tuple[str, list[str]]] = []
    for cond in conditions:
        words = {w for tok in re.findall(r"\w+", cond) for w in words_of(tok)}
        keys: dict[str, str] = {}
        if NONE_TEST.search(cond):
            keys["expert_tensor_parallel_size"] = "null"
        for table, key, value in SIZES:
            if key not in keys and any(_has(words, t) for t in table):
                keys[key] = value
        if _has(words, "fsdp") and level != 3:
            keys["use_megatron_fsdp"] = "True"
        if "expert_tensor_parallel_size" in keys and keys["expert_tensor_parallel_size"] == "null":
            keys.setdefault("expert_model_parallel_size", "2")
        preset = {2: {"dense": {"tensor_model_parallel_size": "2", "pipeline_model_parallel_size": "2"},
                      "moe": {"expert_model_parallel_size": "2", "expert_tensor_parallel_size": "1"}}.get(variant or "",
                                                                                                         {})}
        met = preset.get(level, {})
        need = {k: v for k, v in keys.items() if met.get(k) != v}
        if not need:
            continue
        overrides = [f"++{role}.megatron.{k}={v}" for k, v in need.items() for role in ROLES]
        what = ", ".join(f"{k}={v}" for k, v in need.items())
        out.append((f"the changed line runs only when `{cond}`: {what} (the level's defaults do not reach it)",
                    overrides))
    return out


PEFT_CONFIG = "actor_rollout_ref.model.lora"  # verl's PEFT config: create_peft(config) builds the PEFT object from it


def switch_settings(switches: list[dict], level: int, peft_from_config: bool) -> list[tuple[str, list[str]]]:
    """(what, Hydra overrides) for each switch of the changed code's own object that its default leaves off.
    `peft_from_config`: verl builds the PEFT object from its config through create_peft (read from verl's imports)."""
    out: list[tuple[str, list[str]]] = []
    for s in {(d["cls"], d["field"]): d for d in switches}.values():
        value = "True" if s["value"] else "False"
        line = f"the changed line of {s['cls']} runs only when {s['field']}={value}"
        if not s["peft"]:  # a provider field: the family's bridge may set it from the HF config
            out.append((line + f" (its class default is {s['default']}): a run reaches it only with a checkpoint "
                        f"whose bridge sets it, or with ++{ROLES[0]}.megatron.override_transformer_config."
                        f"{s['field']}={value}", []))
            continue
        line += f" (its default is {s['default']}: the level's defaults do not reach it)"
        if not peft_from_config:
            out.append((line + "; this verl builds its PEFT object without Bridge's create_peft: no verl setting "
                        "is known to set it", []))
        elif level == 0:
            out.append((line + "; Level 0 keeps the defaults (the smoke of the default path): a later level run "
                        f"with ++{PEFT_CONFIG}.{s['field']}={value} runs it", []))
        else:
            out.append((line + f"; verl passes {PEFT_CONFIG}.{s['field']} to {s['cls']} (for a class other than "
                        f"the default type's, also set {PEFT_CONFIG}.type)", [f"++{PEFT_CONFIG}.{s['field']}={value}"]))
    return out
