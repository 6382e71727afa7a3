"""The planner's rules, one fixture history each (tests/plan_fixtures.py: a Bridge-shaped tree and a verl-shaped
checkout that uses it). Every expectation is a literal level list; each case would come out differently if the
planner read diff text, file names or words instead of what verl reaches and what the changed code does.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sessions.plan import rules as plan_rules
from sessions.plan.planner import analyse, read_change, recommend
from sessions.plan.render import render_text
from tests.plan_fixtures import BRIDGE_BASE, VERL_FILES, B, bridge_history, edit, verl_checkout

ROOT = Path(__file__).resolve().parent.parent


def plan_for(tmp_path, change, verl_files=None, base=None):
    bridge = bridge_history(tmp_path, change, base)
    verl = verl_checkout(tmp_path, verl_files)
    ch = read_change(bridge, "main")
    return recommend(ch, analyse(ch, verl))


def levels(plan) -> list[str]:
    return [e.key for e in plan.entries]


def reason_units(plan, rule: str) -> list[dict]:
    return [u for e in plan.entries for r in e.reasons if r.rule == rule for u in r.units]


QWEN = B + "models/qwen/qwen3_bridge.py"
OLMOE = B + "models/olmoe/olmoe_bridge.py"
GPT = B + "models/gpt_provider.py"
MAPPING = B + "models/conversion/param_mapping.py"
AUTO = B + "models/conversion/auto_bridge.py"
LORA = B + "peft/lora.py"
CKPT = B + "training/checkpointing.py"

QWEN_PROVIDER = "provider.hidden_size = hf_config.hidden_size"


def qwen_provider_adds(line: str) -> dict:
    return edit(QWEN, QWEN_PROVIDER, f"{QWEN_PROVIDER}\n{line}")


def provide_guarded(test: str) -> dict:
    return edit(GPT, "return self.build()", f"if {test}:\n    self.build()\nreturn self.build()")


CASES = {
    # Level 0: a family's bridge verl builds its provider through (registry → AutoBridge.to_megatron_provider)
    "verl-runs-it": (qwen_provider_adds("provider.rope_theta = hf_config.rope_theta"), ["L0"]),
    # Bridge's own training loop: verl never imports it
    "not-on-verl-path": (edit(B + "training/train.py", "model.step()", "model.step(step)"), []),
    # Level 1
    "peft": (edit(LORA, "return module", "module.lora_dim = self.dim\nreturn module"), ["L0", "L1"]),
    "checkpointing": (edit(CKPT, 'return _write({"model": model}, path)',
                           'return _write({"model": model, "rng": None}, path)'), ["L0", "L1"]),
    "hf-export": (edit(MAPPING, "return [weights]", "return list([weights])"), ["L0", "L1", "L2d"]),
    # Level 2
    # finalization counts where it reads or sets parallel sizes / mpu state (issue 26: not by the word finalize)
    "provider-finalization": (edit(GPT, "self.ready = True", "self.ready = self.pipeline_model_parallel_size > 1"),
                              ["L0", "L2d"]),
    "mpu-derived": (provide_guarded("parallel_state.is_last_rank()"), ["L0", "L2d"]),
    "tp-pp-cp": (provide_guarded("self.sequence_parallel"), ["L0", "L2d"]),
    "expert-parallel": (edit(MAPPING, "return [weights][:1]", "return list([weights])[:1]"),
                        ["L0", "L1", "L2m", "L4:moe"]),
    # (067f987df's shape: inside the flex-dispatcher branch of a validator ConfigContainer calls)
    "dispatcher": (edit(B + "training/flex_dispatcher_backend.py", "return True",
                        'if model_config.moe_flex_dispatcher_backend is None:\n'
                        '    model_config.moe_token_dispatcher_type = "alltoall"\nreturn True'),
                   ["L0", "L2m", "L4:moe"]),
    # Level 3: only by the condition the change runs under (the string it compares with counts)
    "megatron-fsdp": (edit(CKPT, "return _write({}, path)", 'return _write({"optimizer": None}, path)'),
                      ["L0", "L1", "L3"]),
    # Level 4: what the changed code involves
    "vlm": (edit(QWEN, "return [AutoMapping()]", "vision_mappings = [AutoMapping()]\n"
                 "return [AutoMapping()] + vision_mappings"), ["L0", "L4:vlm"]),
    "moe": (edit(OLMOE, "provider.num_moe_experts = hf_config.num_experts",
                 "provider.num_moe_experts = hf_config.num_experts\n"
                 "provider.moe_router_topk = hf_config.num_experts_per_tok"), ["L0", "L4:moe"]),
    "mtp": (qwen_provider_adds("provider.mtp_num_layers = hf_config.num_nextn_predict_layers"), ["L0", "L4:mtp"]),
    "qat-modelopt": (qwen_provider_adds("provider.restore_modelopt_state = hf_config.restore"), ["L0", "L4:qat"]),
    "quantized-weights": (edit(AUTO, "return list(self._model_bridge.stream_weights_megatron_to_hf(model))",
                               "quant_cfg = self.quantization_config\n"
                               "return list(self._model_bridge.stream_weights_megatron_to_hf(model, quant_cfg))"),
                          ["L0", "L1", "L4:quantized"]),
    "scheduler": (provide_guarded("self.lr_scheduler"), ["L0", "L5"]),
    "loss": (provide_guarded("self.calculate_per_token_loss"), ["L0", "L5"]),
    "reward": (provide_guarded("self.reward_head"), ["L0", "L5"]),
    "peft-trainability": (edit(LORA, "return module", "if self.trainable_only:\n    module.frozen = True\n"
                               "return module"), ["L0", "L1", "L5"]),
    "gradient-flow": (provide_guarded("self.detach_embedding_grad"), ["L0", "L5"]),
}


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule_on_its_fixture_history(tmp_path, rule):
    change, expected = CASES[rule]
    plan = plan_for(tmp_path, change)
    assert levels(plan) == expected, [(e.key, [(r.rule, [u["unit"] for u in r.units]) for r in e.reasons])
                                      for e in plan.entries]
    if rule in {r.rule for e in plan.entries for r in e.reasons}:
        assert reason_units(plan, rule), "every recommendation names the changed unit"


def test_custom_layer_spec_in_a_new_module(tmp_path):
    # a new module the family bridge imports lazily: its layer spec is new code verl's provider build reaches
    spec = "def qwen3_layer_spec(config):\n    return config\n"
    change = edit(QWEN, "provider = GPTModelProvider()", "from megatron.bridge.models.qwen.qwen3_spec import "
                  "qwen3_layer_spec\n\nprovider = GPTModelProvider()\n"
                  "provider.transformer_layer_spec = qwen3_layer_spec")
    change[B + "models/qwen/qwen3_spec.py"] = spec
    plan = plan_for(tmp_path, change)
    assert levels(plan) == ["L0", "L4:custom-layer"]
    unit = next(u for u in reason_units(plan, "custom-layer") if u["unit"] == "qwen3_layer_spec")
    assert unit["unit"] == "qwen3_layer_spec" and unit["tier"] == "calls" and unit["new"] is True
    assert "Qwen3Bridge.provider_bridge" in " ".join(unit["path"])


def test_new_public_api_verl_can_call_counts_its_signature(tmp_path):
    # LoRA+-style: a new public function nothing in Bridge calls yet, in a module verl imports (through the PEFT
    # registry's lazy import table): its signature says optimizer → Level 5; PEFT package → Level 1
    lora = textwrap.dedent(BRIDGE_BASE[LORA]).lstrip("\n")
    change = {LORA: "from megatron.core.optimizer import OptimizerConfig\n\n\n"
              "def lora_plus_overrides(config: OptimizerConfig, ratio: float) -> dict:\n"
              "    return {'lr': config.lr * ratio}\n\n\n" + lora}
    plan = plan_for(tmp_path, change)
    assert levels(plan) == ["L0", "L1", "L5"]
    unit = reason_units(plan, "optimizer")[0]
    assert unit["unit"] == "lora_plus_overrides" and unit["tier"] == "api"
    assert unit["matched"] == ["OptimizerConfig"]


def test_internal_function_counts_by_what_it_is_about_only(tmp_path):
    # a new validator only Bridge's own ConfigContainer calls: its body names TP and MoE sizes and losses, but it
    # is about FSDP, and verl never calls it
    validator = ("def _validate_megatron_fsdp_v2(model):\n"
                 "    if model.tensor_model_parallel_size != 1 or model.num_moe_experts:\n"
                 "        raise ValueError('DP only')\n"
                 "    if model.calculate_per_token_loss:\n"
                 "        raise ValueError('no per-token loss')")
    change = edit(B + "training/config.py", "class ConfigContainer:\n    def validate(self):\n"
                  "        validate_flex_dispatcher_backend(self.model)",
                  f"{validator}\n\n\nclass ConfigContainer:\n    def validate(self):\n"
                  "        validate_flex_dispatcher_backend(self.model)\n        _validate_megatron_fsdp_v2(self.model)")
    plan = plan_for(tmp_path / "a", change)
    assert levels(plan) == ["L0", "L3"]
    assert reason_units(plan, "megatron-fsdp")[0]["tier"] == "imports"
    # the same validator as a method of ConfigContainer, a class verl never builds: it never runs in verl
    method = edit(B + "training/config.py", "def validate(self):\n    validate_flex_dispatcher_backend(self.model)",
                  "def validate(self):\n    validate_flex_dispatcher_backend(self.model)\n"
                  "    self._validate_megatron_fsdp_v2()\n\n"
                  "def _validate_megatron_fsdp_v2(self):\n"
                  "    if self.model.tensor_model_parallel_size != 1:\n"
                  "        raise ValueError('DP only')")
    assert levels(plan_for(tmp_path / "b", method)) == []


def test_pass_through_names_never_count(tmp_path):
    handed_on = edit(AUTO, "self._model_bridge.load_weights_hf_to_megatron(model, weights)",
                     "self._model_bridge.load_weights_hf_to_megatron(model, weights, fsdp_mode=self.fsdp_mode)")
    assert levels(plan_for(tmp_path / "a", handed_on)) == ["L0"]
    used = edit(AUTO, "self._model_bridge.load_weights_hf_to_megatron(model, weights)",
                "self._model_bridge.load_weights_hf_to_megatron(model, weights, mode=self.megatron_fsdp)")
    assert levels(plan_for(tmp_path / "b", used)) == ["L0", "L3"]


def test_a_feature_switched_off_does_not_involve_it(tmp_path):
    assert levels(plan_for(tmp_path / "a", qwen_provider_adds("provider.mtp_num_layers = None"))) == ["L0"]
    # words split at snake/camel case, case-insensitively: MTP_CONFIG_FIELDS is MTP
    fields = qwen_provider_adds("provider.extra = MTP_CONFIG_FIELDS")
    fields[QWEN] = "MTP_CONFIG_FIELDS = ('num_nextn_predict_layers',)\n" + fields[QWEN]
    assert levels(plan_for(tmp_path / "b", fields)) == ["L0", "L4:mtp"]


def test_hunk_header_comments_and_docstrings_never_count(tmp_path):
    # -U0 hunk header of this change is `from megatron.core import parallel_state`; the new line names nothing
    after_import = edit(GPT, "from megatron.core import parallel_state",
                        "from megatron.core import parallel_state\n\n_DEFAULT_HIDDEN = 8")
    # (and a new constant no code verl runs reads is no verl path at all)
    assert levels(plan_for(tmp_path / "a", after_import)) == []
    prose = edit(QWEN, "def mapping_registry(self):",
                 'def mapping_registry(self):\n    """Expert-parallel MoE mapping (tensor_model_parallel)."""\n'
                 "    # fsdp, lora, checkpoint: only words")
    plan = plan_for(tmp_path / "b", prose)
    assert levels(plan) == [] and plan.message.startswith("no rule matched")


def test_bridge_training_loop_points_at_bridge_tests(tmp_path):
    plan = plan_for(tmp_path, edit(B + "training/train.py", "model.step()", "model.step(step)"))
    assert plan.entries == [] and plan.optional == []
    assert plan.notes[0] == ("not on verl's path (verl never imports these; Bridge's own training loop, recipes or "
                             "scripts): src/megatron/bridge/training/train.py — they justify no verl level. no Bridge "
                             "test of its own was found for it: add one (nox -s bridge_unit -- <its test file>)")


def test_dependencies_are_optional_level0_with_the_reason(tmp_path):
    plan = plan_for(tmp_path, {"pyproject.toml": "[project]\nname = 'megatron-bridge'\nversion = '2'\n"})
    assert levels(plan) == []
    assert [(e.key, e.optional) for e in plan.optional] == [
        ("L0", "verl's image provides its own packages; Level 0 shows whether the change matters there")]


def test_moe_change_of_a_family_runs_on_that_familys_moe_checkpoint(tmp_path):
    change = edit(OLMOE, "provider.num_moe_experts = hf_config.num_experts",
                  "provider.num_moe_experts = hf_config.num_experts\nprovider.moe_router_topk = 2")
    plan = plan_for(tmp_path, change)
    assert [(e.key, e.model) for e in plan.entries] == [("L0", "allenai/OLMoE-1B-7B-0924"),
                                                        ("L4:moe", "allenai/OLMoE-1B-7B-0924")]


def test_each_level_of_a_change_to_several_families_runs_on_a_family_it_is_about(tmp_path):
    # Qwen 3 (dense, its own layers: the most-touched family) and OLMoE change together: the MoE level runs on
    # OLMoE's checkpoint, not on a MoE checkpoint Qwen 3 does not have; the custom-layer level on Qwen 3's
    base = _qwen_with_own_layers()
    layers = B + "models/qwen/qwen3_layers.py"
    change = {layers: base[layers].replace("out = hidden_states * 2", "out = hidden_states * 3"),
              QWEN: base[QWEN].replace("provider.hidden_size = hf_config.hidden_size",
                                       "provider.hidden_size = hf_config.hidden_size * 1"),
              **edit(OLMOE, "provider.num_moe_experts = hf_config.num_experts",
                   "provider.num_moe_experts = hf_config.n_routed_experts")}
    plan = plan_for(tmp_path, change, base=base)
    assert [h.family for h in plan.families][0] == "qwen3"
    models = {e.key: e.model for e in plan.entries}
    assert models["L4:moe"] == "allenai/OLMoE-1B-7B-0924"
    assert models["L4:custom-layer"] == models["L0"] == plan.families[0].checkpoint


def test_new_moe_family_gets_its_own_dummy_path_never_another_familys_model(tmp_path):
    new = B + "models/hyv9/hyv9_bridge.py"
    change = {
        new: "from megatron.bridge.models.conversion.model_bridge import MegatronModelBridge\n"
             "from megatron.bridge.models.gpt_provider import GPTModelProvider\n\n\n"
             "@MegatronModelBridge.register_bridge(source='HYV9ForCausalLM')\n"
             "class HYV9Bridge(MegatronModelBridge):\n"
             "    def provider_bridge(self, hf_config):\n"
             "        provider = GPTModelProvider()\n"
             "        provider.num_moe_experts = hf_config.num_experts\n"
             "        return provider\n",
        B + "models/hyv9/__init__.py": "",
        **edit(B + "models/__init__.py", "from megatron.bridge.models.olmoe.olmoe_bridge import OlmoeBridge",
               "from megatron.bridge.models.olmoe.olmoe_bridge import OlmoeBridge\n"
               "from megatron.bridge.models.hyv9.hyv9_bridge import HYV9Bridge"),
    }
    plan = plan_for(tmp_path, change)
    assert levels(plan) == ["L0", "L4:moe"]
    assert [h.family for h in plan.families] == ["hyv9"]
    for e in plan.entries:
        assert e.model is None
        assert e.dummy["MODEL_ID"] == "<org>/<smallest hyv9 checkpoint>"
        assert e.dummy["minimal_config"]["architectures"] == ["HYV9ForCausalLM"]


def test_family_generation_layout_finds_its_checkpoint(tmp_path):
    # models/exaone/exaone4_bridge.py (a generation as a file prefix, not a folder) is EXAONE 4.0
    base = {B + "models/exaone/__init__.py": "", B + "models/exaone/exaone4_bridge.py":
            "from megatron.bridge.models.conversion.model_bridge import MegatronModelBridge\n\n\n"
            "@MegatronModelBridge.register_bridge(source='Exaone4ForCausalLM')\n"
            "class Exaone4Bridge(MegatronModelBridge):\n"
            "    def provider_bridge(self, hf_config):\n        return hf_config\n"}
    full = {**BRIDGE_BASE, **base}
    full[B + "models/__init__.py"] = (textwrap.dedent(full[B + "models/__init__.py"]) +
                                      "from megatron.bridge.models.exaone.exaone4_bridge import Exaone4Bridge\n")
    change = {B + "models/exaone/exaone4_bridge.py": base[B + "models/exaone/exaone4_bridge.py"].replace(
        "return hf_config", "hf_config.sliding_window = 4\n        return hf_config")}
    plan = plan_for(tmp_path, change, base=full)
    assert [(e.key, e.model) for e in plan.entries] == [("L0", "LGAI-EXAONE/EXAONE-4.0-1.2B")]


def test_verl_checkout_without_bridge_imports_is_a_usage_error(tmp_path):
    from env.settings import UsageError
    bridge = bridge_history(tmp_path, qwen_provider_adds("provider.x = 1"))
    verl = verl_checkout(tmp_path, {"verl/__init__.py": "import torch\n"})
    with pytest.raises(UsageError, match="imports nothing from megatron.bridge"):
        analyse(read_change(bridge, "main"), verl)


def test_arguable_levels_are_offered_with_their_reason_not_required(tmp_path):
    moe = plan_for(tmp_path / "a", CASES["moe"][0])
    assert levels(moe) == ["L0", "L4:moe"]
    assert [(e.key, e.optional) for e in moe.optional] == [
        ("L2m", "the procedure asks for an expert-parallel run when expert layout, dispatcher, router replay or "
                "expert TP change, and keeps it a follow-up otherwise")]
    peft = plan_for(tmp_path / "b", CASES["peft"][0])
    assert levels(peft) == ["L0", "L1"]
    assert [(e.key, e.optional) for e in peft.optional] == [
        ("L5", "Level 5 is for PEFT trainability; this change does not name it, so whether it matters is arguable")]


def test_family_independent_export_code_with_its_reason_and_models(tmp_path):
    # gather_from_ep_ranks in shared conversion code: verl's export reaches it first; no family changed, so any
    # small MoE with a Bridge provider runs the MoE levels
    plan = plan_for(tmp_path, CASES["expert-parallel"][0])
    assert [(e.key, e.model) for e in plan.entries] == [
        ("L0", "Qwen/Qwen2.5-0.5B"), ("L1", "Qwen/Qwen2.5-0.5B"), ("L2m", "allenai/OLMoE-1B-7B-0924"),
        ("L4:moe", "allenai/OLMoE-1B-7B-0924")]
    assert reason_units(plan, "hf-export")[0]["matched"] == [
        "the nearest verl calls that move weights export them: AutoBridge.export_hf_weights"]


def _with_family(folder: str, module: str, cls: str, source: str) -> dict[str, str]:
    """BRIDGE_BASE plus one model family: its package, its bridge module, and the import models/__init__.py adds."""
    base = dict(BRIDGE_BASE)
    base[B + f"models/{folder}/__init__.py"] = ""
    base[B + f"models/{folder}/{module}.py"] = source
    base[B + "models/__init__.py"] = (textwrap.dedent(base[B + "models/__init__.py"])
                                      + f"from megatron.bridge.models.{folder}.{module} import {cls}\n")
    return base


def test_change_to_a_vision_language_family_involves_vlm(tmp_path):
    # a language-side fix (no vision name in it) in a VL family's own code still needs the multimodal check
    base = _with_family("qwen_vl", "qwen3_vl_bridge", "Qwen3TowerBridge", (
        "from megatron.bridge.models.conversion.model_bridge import MegatronModelBridge\n\n\n"
        "@MegatronModelBridge.register_bridge(source='Qwen3VLForConditionalGeneration')\n"
        "class Qwen3TowerBridge(MegatronModelBridge):\n"
        "    def provider_bridge(self, hf_config):\n        return hf_config\n\n"
        "    def mapping_registry(self):\n        return ['visual.blocks.*.attn.qkv.weight']\n"))
    change = {B + "models/qwen_vl/qwen3_vl_bridge.py": base[B + "models/qwen_vl/qwen3_vl_bridge.py"].replace(
        "return hf_config", "hf_config.rope_theta = 1.0\n        return hf_config")}
    plan = plan_for(tmp_path, change, base=base)
    assert [(e.key, e.model) for e in plan.entries] == [("L0", "Qwen/Qwen3-VL-2B-Instruct"),
                                                        ("L4:vlm", "Qwen/Qwen3-VL-2B-Instruct")]
    # the family's own code maps a vision tower (a fact of its code, not its folder's name)
    assert reason_units(plan, "vlm")[0]["matched"] == [
        "Qwen3TowerBridge is a vision-language family: visual.blocks.*.attn.qkv.weight "
        "(src/megatron/bridge/models/qwen_vl/qwen3_vl_bridge.py:11)"]


def _shared_gdn_split(family_names_gdn: bool) -> tuple[dict[str, str], dict[str, str]]:
    """Shared export code gains a GDN weight split; a Qwen3.5 VL family whose own mapping is a GDN one (or not)."""
    mapping = "GDNInProjMapping" if family_names_gdn else "InProjMapping"
    base = _with_family("qwen_vl", "qwen35_vl_bridge", "Qwen35VLBridge", (
        "from megatron.bridge.models.conversion.model_bridge import MegatronModelBridge\n"
        "from megatron.bridge.models.conversion.param_mapping import AutoMapping\n\n\n"
        f"class {mapping}(AutoMapping):\n    pass\n\n\n"
        "@MegatronModelBridge.register_bridge(source='Qwen3_5ForConditionalGeneration')\n"
        "class Qwen35VLBridge(MegatronModelBridge):\n"
        "    def provider_bridge(self, hf_config):\n        return hf_config\n\n"
        f"    def mapping_registry(self):\n        return [{mapping}()]\n"))
    mb = B + "models/conversion/model_bridge.py"
    base[mb] = textwrap.dedent(base[mb]) + "\n\ndef split_gdn_weights(weights):\n    return weights\n"
    base[mb] = base[mb].replace("yield mapping.megatron_to_hf(model)",
                                "yield split_gdn_weights(mapping.megatron_to_hf(model))")
    return base, edit(mb, "def split_gdn_weights(weights):\n    return weights",
                      "def split_gdn_weights(weights):\n    return list(weights)", base)


def test_shared_custom_layer_code_runs_on_a_family_whose_code_names_it(tmp_path):
    # a GDN weight split in shared export code (e049cc00c's shape): the custom-layer run loads a model whose own
    # code has GDN weights, not the default dense checkpoint (Qwen2.5 has none: its run never takes the lines)
    base, change = _shared_gdn_split(True)
    plan = plan_for(tmp_path / "a", change, base=base)
    entry = next(e for e in plan.entries if e.key == "L4:custom-layer")
    assert entry.model == "Qwen/Qwen3.5-0.8B"
    assert entry.settings == [
        "model of the qwen3.5-vl family: its own code (src/megatron/bridge/models/qwen_vl/qwen35_vl_bridge.py) names "
        "what the changed custom-layer code handles; Qwen/Qwen2.5-0.5B does not, its run would not take the changed "
        "lines"]
    assert next(e for e in plan.entries if e.key == "L0").model == "Qwen/Qwen2.5-0.5B"  # every family loads it
    # no family names GDN: the representative stays, with no claim about the model
    base, change = _shared_gdn_split(False)
    plan = plan_for(tmp_path / "b", change, base=base)
    entry = next(e for e in plan.entries if e.key == "L4:custom-layer")
    assert (entry.model, entry.settings) == ("Qwen/Qwen2.5-0.5B", [])


# ---------------------------------------------------------------- issue 26: Level 4 from the families' features


def _olmoe_with_config_mapping() -> dict[str, str]:
    base = dict(BRIDGE_BASE)
    base[OLMOE] = textwrap.dedent(BRIDGE_BASE[OLMOE]).replace(
        "class OlmoeBridge(MegatronModelBridge):\n",
        "class OlmoeBridge(MegatronModelBridge):\n"
        "    CONFIG_MAPPING = [(\"hidden_size\", \"hidden_size\"), (\"num_experts\", \"num_moe_experts\")]\n\n")
    return base


def test_moe_family_config_mapping_change_involves_moe(tmp_path):
    # only strings change (the HF key of the routed-expert count): the family's config mapping is MoE code
    base = _olmoe_with_config_mapping()
    change = {OLMOE: base[OLMOE].replace('("num_experts", "num_moe_experts")',
                                         '("n_routed_experts", "num_moe_experts")')}
    plan = plan_for(tmp_path, change, base=base)
    assert levels(plan) == ["L0", "L4:moe"]
    moe = next(e for e in plan.entries if e.key == "L4:moe")
    fams, feats = moe.justified_by()
    assert fams == ["OlmoeBridge"] and "moe" in feats
    assert any("n_routed_experts" in fact for fact in feats["moe"])


def test_shared_peft_change_acting_only_on_experts_is_moe_for_all_families(tmp_path):
    change = edit(LORA, "return module", "if getattr(module, \"is_expert\", False):\n"
                  "    module.expert_lora_dim = self.dim\nreturn module")
    plan = plan_for(tmp_path, change)
    assert levels(plan) == ["L0", "L1", "L4:moe"]
    moe = next(e for e in plan.entries if e.key == "L4:moe")
    assert moe.model == "allenai/OLMoE-1B-7B-0924"  # one representative MoE run for shared code
    data = moe.to_json()
    assert data["families"] == ["all families"] and set(data["features"]) == {"moe"}
    l1 = next(e for e in plan.entries if e.key == "L1").to_json()
    assert l1["families"] == ["all families"] and "moe" in l1["features"]


def test_new_bridge_defining_megatron_to_hf_config_is_no_level1_by_that_alone(tmp_path):
    base = dict(BRIDGE_BASE)
    base[B + "models/conversion/model_bridge.py"] = textwrap.dedent(base[B + "models/conversion/model_bridge.py"]) \
        .replace("        for mapping in self.mapping_registry():\n"
                 "            yield mapping.megatron_to_hf(model)",
                 "        self.megatron_to_hf_config(model)\n"
                 "        for mapping in self.mapping_registry():\n"
                 "            yield mapping.megatron_to_hf(model)")
    assert "self.megatron_to_hf_config(model)" in base[B + "models/conversion/model_bridge.py"]
    new = B + "models/densex/densex_bridge.py"
    change = {
        new: "from megatron.bridge.models.conversion.model_bridge import MegatronModelBridge\n"
             "from megatron.bridge.models.gpt_provider import GPTModelProvider\n\n\n"
             "@MegatronModelBridge.register_bridge(source='DenseXForCausalLM')\n"
             "class DenseXBridge(MegatronModelBridge):\n"
             "    def provider_bridge(self, hf_config):\n"
             "        provider = GPTModelProvider()\n"
             "        provider.hidden_size = hf_config.hidden_size\n"
             "        return provider\n\n"
             "    @classmethod\n"
             "    def megatron_to_hf_config(cls, provider):\n"
             "        return {'hidden_size': provider.hidden_size, 'save_format': 'safetensors'}\n",
        B + "models/densex/__init__.py": "",
        **edit(B + "models/__init__.py", "from megatron.bridge.models.olmoe.olmoe_bridge import OlmoeBridge",
               "from megatron.bridge.models.olmoe.olmoe_bridge import OlmoeBridge\n"
               "from megatron.bridge.models.densex.densex_bridge import DenseXBridge", base=base),
    }
    plan = plan_for(tmp_path, change, base=base)
    assert levels(plan) == ["L0"]
    unit = next(u for u in plan.units if u.name == "DenseXBridge.megatron_to_hf_config")
    assert unit.tier == "calls" and "AutoBridge.export_hf_weights" in unit.entries  # verl's export runs it


def _with_own_layers(bridge: str, layers: str, attention: str, spec: str, after: str) -> dict[str, str]:
    """BRIDGE_BASE with an attention module of the family's own (`layers`, in the family's folder) whose layer spec
    the family's bridge (`bridge`) sets after its `after` line."""
    base = dict(BRIDGE_BASE)
    module = layers[len("src/"):-len(".py")].replace("/", ".")
    base[layers] = (
        "from megatron.core.transformer.attention import SelfAttention\n"
        "from megatron.core.transformer.spec_utils import ModuleSpec\n\n\n"
        f"class {attention}(SelfAttention):\n"
        "    def forward(self, hidden_states):\n"
        "        out = hidden_states * 2\n"
        "        return out\n\n\n"
        f"def {spec}(config):\n"
        f"    return ModuleSpec(module={attention})\n")
    base[bridge] = textwrap.dedent(BRIDGE_BASE[bridge]).replace(
        "from megatron.bridge.models.gpt_provider import GPTModelProvider\n",
        "from megatron.bridge.models.gpt_provider import GPTModelProvider\n"
        f"from {module} import {spec}\n").replace(
        f"        {after}\n", f"        {after}\n        provider.transformer_layer_spec = {spec}\n")
    return base


def _qwen_with_own_layers() -> dict[str, str]:
    return _with_own_layers(QWEN, B + "models/qwen/qwen3_layers.py", "Qwen3GatedAttention", "qwen3_layer_spec",
                            "provider.hidden_size = hf_config.hidden_size")


def _olmoe_with_own_layers() -> dict[str, str]:
    """OLMoE (a family that builds experts in every model) with an attention module of its own in its folder."""
    return _with_own_layers(OLMOE, B + "models/olmoe/olmoe_layers.py", "OlmoeQKNormAttention", "olmoe_layer_spec",
                            "provider.num_moe_experts = hf_config.num_experts")


def test_own_layer_code_of_a_family_that_only_builds_moe_models_involves_moe(tmp_path):
    # an attention fix names no expert, but it runs only inside the family's MoE models (Level 0 loads one at EP=1):
    # the MoE run is required beside the custom-layer one; Qwen 3's same change (a dense family) is custom layer only
    base = _olmoe_with_own_layers()
    rel = B + "models/olmoe/olmoe_layers.py"
    change = {rel: base[rel].replace("out = hidden_states * 2", "out = hidden_states * 3")}
    plan = plan_for(tmp_path, change, base=base)
    assert levels(plan) == ["L0", "L4:custom-layer", "L4:moe"]
    fams, feats = next(e for e in plan.entries if e.key == "L4:moe").justified_by()
    assert fams == ["OlmoeBridge"]
    assert any("OlmoeBridge builds experts in every model it builds and its own code changed" in f
               for f in feats["moe"])


def test_change_to_a_familys_own_layer_module_is_custom_layer(tmp_path):
    base = _qwen_with_own_layers()
    change = {B + "models/qwen/qwen3_layers.py": base[B + "models/qwen/qwen3_layers.py"].replace(
        "out = hidden_states * 2", "out = hidden_states * 3")}
    plan = plan_for(tmp_path, change, base=base)
    assert levels(plan) == ["L0", "L4:custom-layer"]
    fams, feats = next(e for e in plan.entries if e.key == "L4:custom-layer").justified_by()
    assert fams == ["Qwen3Bridge"]
    # the same family's provider config, away from its layers, is no custom-layer change
    other = {QWEN: base[QWEN].replace("provider.hidden_size = hf_config.hidden_size",
                                      "provider.hidden_size = hf_config.hidden_size * 1")}
    assert levels(plan_for(tmp_path / "b", other, base=base)) == ["L0"]


def test_bridge_tests_are_the_changes_own_test_files(tmp_path):
    change = {**edit(LORA, "return module", "module.lora_dim = self.dim\nreturn module"),
              "tests/unit_tests/peft/test_lora_dim.py": "def test_dim():\n    assert True\n"}
    plan = plan_for(tmp_path / "a", change)
    assert plan.bridge_tests == ["tests/unit_tests/peft/test_lora_dim.py"]
    # without a test of its own, the nearest existing test of the changed module
    nearest = plan_for(tmp_path / "b", edit(LORA, "return module", "module.lora_dim = self.dim\nreturn module"))
    assert nearest.bridge_tests == ["tests/unit_tests/test_lora.py"]
    assert "nox -s bridge_unit -- tests/unit_tests/test_lora.py" in render_text(nearest)


def test_settings_that_run_the_changed_line(tmp_path):
    # a default that only applies with EP>1 and ETP unset: the MoE variant's COMMON_ETP=1 would hide it
    change = edit(MAPPING, "def megatron_to_hf(self, weights):\n    return self.gather_from_ep_ranks(weights)",
                  "def megatron_to_hf(self, weights):\n"
                  "    if self.ep_size > 1 and self.expert_tensor_parallel_size is None:\n"
                  "        weights = list(weights)\n"
                  "    return self.gather_from_ep_ranks(weights)")
    plan = plan_for(tmp_path, change)
    l2m = next(e for e in plan.entries if e.key == "L2m")
    assert l2m.settings and "expert_tensor_parallel_size=null" in l2m.settings[0]
    assert "++actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=null" in l2m.overrides
    assert l2m.to_json()["overrides"] == l2m.overrides


def test_classmethod_factory_makes_its_class_live():
    from sessions.plan.index import BridgeIndex
    from sessions.plan.reach import Step, reach

    src = {"src/megatron/bridge/__init__.py": "",
           "src/megatron/bridge/m.py": textwrap.dedent("""
               class Source:
                   def save(self):
                       return 1

               class Pretrained:
                   @classmethod
                   def from_path(cls, p):
                       return cls()

                   @property
                   def state(self):
                       return Source()

               def entry():
                   return Pretrained.from_path("x").state.save()
           """)}
    ix = BridgeIndex("/nonexistent", sources=src)
    r = reach(ix, [("megatron.bridge.m:entry", Step(None, "verl"))], {})
    assert "megatron.bridge.m:Pretrained" in r.live
    assert "megatron.bridge.m:Source.save" in r


def test_activation_checkpointing_is_no_checkpoint_save():
    from sessions.plan import rules as plan_rules
    from sessions.plan.analysis import topic_hits

    rule = plan_rules.BY_NAME["checkpointing"]
    assert topic_hits(rule, ["checkpoint_core_attention", "recompute_granularity"]) == []
    assert topic_hits(rule, ["save_checkpoint"]) == ["save_checkpoint"]


def test_amax_mapping_is_modelopt_state_not_fp8_scaling():
    from sessions.plan.features import feature_of_name

    assert "qat" in feature_of_name("MoeAmaxFanoutMapping")
    assert "qat" not in feature_of_name("fp8_amax_history_len")


def test_new_field_verl_sets_counts_even_when_declared_off():
    from sessions.plan.analysis import _fields_verl_names
    from sessions.plan.index import BridgeIndex
    from sessions.plan.verl_surface import VerlSurface

    src = {"src/megatron/bridge/__init__.py": "",
           "src/megatron/bridge/p.py": "class P:\n    a: int = 1\n    moe_enable_routing_replay: bool = False\n"}
    ix = BridgeIndex("/nonexistent", sources=src)
    unit = ix.unit("megatron.bridge.p:P")
    surface = VerlSurface("verl", attributes={"moe_enable_routing_replay": "verl/x.py:1"})
    assert _fields_verl_names(unit, {3}, surface) == ["moe_enable_routing_replay"]
    assert _fields_verl_names(unit, {2}, surface) == []


# ---------------------------------------------------------------- issue 26: what the changed lines read and run under


def test_level2_from_what_the_lines_read_not_the_units_name(tmp_path):
    # gather_from_tp_ranks: the changed line runs only past `if self.tp_size == 1: return` (L2d); the same
    # function's early exit itself, which runs at TP=1, is no parallel change
    past_exit = CASES["hf-export"][0]
    assert "L2d" in levels(plan_for(tmp_path / "a", past_exit))
    exit_line = "if self.tp_size == 1:  # the real mappings gather only across more than one rank\n"
    at_exit = edit(MAPPING, exit_line + "    return weights", exit_line + "    return list(weights)")
    assert levels(plan_for(tmp_path / "b", at_exit)) == ["L0", "L1"]
    # a module used as a namespace reads no parallel size; a line moved unchanged reads nothing new
    gpt = textwrap.dedent(BRIDGE_BASE[GPT])
    spaced = {GPT: gpt.replace("import parallel_state", "import parallel_state, tensor_parallel").replace(
        "return object()", "return tensor_parallel.ColumnParallelLinear()")}
    assert levels(plan_for(tmp_path / "c", spaced)) == ["L0"]
    base = {**BRIDGE_BASE, GPT: gpt.replace("        return self.build()",
                                            "        self.tp = parallel_state.get_tp_size()\n        return self.build()")}
    moved = {GPT: gpt.replace("        self.ready = True",
                              "        self.ready = True\n        self.tp = parallel_state.get_tp_size()")}
    assert levels(plan_for(tmp_path / "d", moved, base=base)) == ["L0"]


def test_lines_that_run_only_for_experts_ask_for_the_moe_variant(tmp_path):
    change = edit(LORA, "return module", "if module.is_expert:\n"
                  "    module.pad = module.config.tensor_model_parallel_size\nreturn module")
    plan = plan_for(tmp_path, change)
    assert "L2m" in levels(plan) and "L2d" not in levels(plan)


def test_imports_logging_and_classes_verl_never_builds_count_for_nothing(tmp_path):
    only_import = edit(GPT, "from megatron.core import parallel_state",
                       "from megatron.core import parallel_state\nimport warnings")
    assert levels(plan_for(tmp_path / "a", only_import)) == []
    logging_only = edit(GPT, "return self.build()", "logger.info('providing %s', self.ready)\nreturn self.build()")
    assert levels(plan_for(tmp_path / "b", logging_only)) == ["L0"]
    # a config dataclass in a module verl imports, never built by verl: its field is no verl path
    unused = edit(B + "training/config.py", "class DistributedDataParallelConfig:",
                  "class SchedulerConfig:\n    lr_decay_iters = 4\n\n\nclass DistributedDataParallelConfig:")
    assert levels(plan_for(tmp_path / "c", unused)) == []


def test_verl_branches_for_the_legacy_mbridge_are_no_verl_path(tmp_path):
    from sessions.plan.verl_surface import read_surface

    verl = verl_checkout(tmp_path, {**VERL_FILES, "verl/workers/legacy.py": textwrap.dedent("""
        from megatron.bridge import AutoBridge


        def load(bridge, provider, model):
            if provider is None:
                return bridge.get_model_legacy(model)
            if self.vanilla_bridge:
                bridge.save_weights_legacy(model)
            else:
                bridge.save_hf_weights(model)
        """)})
    attrs = read_surface(verl).attributes
    assert "save_hf_weights" in attrs and "get_model_legacy" not in attrs and "save_weights_legacy" not in attrs


def test_only_the_modules_verls_rl_job_loads_count(tmp_path):
    # the wrapper runs `python3 -m verl.trainer.main_ppo`: what it imports (lazily, relatively), names in a string
    # or in a Hydra config is its code; verl's model merger is another program (`python -m verl.model_merger`)
    from sessions.plan.verl_surface import read_surface

    files = {
        **VERL_FILES,
        "verl/__init__.py": "",
        "verl/trainer/__init__.py": "",
        "verl/trainer/main_ppo.py": """
            WORKER = "verl.workers.peft.peft"


            def main():
                from verl.workers import engine
                return engine.build
            """,
        "verl/trainer/config/ppo.yaml": "checkpoint:\n  _target_: verl.utils.checkpoint.save\n",
        "verl/workers/__init__.py": "from . import resume\n",
        "verl/workers/resume.py": """
            from verl.models.mcore.bridge import AutoBridge


            def resume(bridge: AutoBridge):
                return bridge.load_from_resume_dir()
            """,
        "verl/model_merger/__init__.py": "",
        "verl/model_merger/megatron_model_merger.py": """
            from verl.models.mcore.bridge import AutoBridge


            def merge(config, bridge):
                bridge.merge_into_hf_dir(config.target_dir)
            """,
    }
    surface = read_surface(verl_checkout(tmp_path / "a", files))
    attrs, imported = surface.attributes, {s.dotted for s in surface.imports}
    assert {"to_megatron_provider", "load_from_resume_dir"} <= set(attrs)  # lazy import; `from . import resume`
    assert "megatron.bridge.peft.utils.create_peft" in imported  # named by a string of the job
    assert "megatron.bridge.training.checkpointing.save_fsdp_dtensor_checkpoint" in imported  # by its Hydra config
    assert "merge_into_hf_dir" not in attrs and "target_dir" not in attrs  # the merger CLI: not the RL job
    # a job that loads none of the files importing the Bridge: said, not taken for "verl uses no Bridge"
    from sessions.plan.verl_surface import SurfaceError

    unloaded = {**files, "verl/trainer/main_ppo.py": "def main():\n    return 0\n", "verl/trainer/config/ppo.yaml": ""}
    with pytest.raises(SurfaceError, match=r"its RL job \(verl.trainer.main_ppo\) loads none of the \d+ file"):
        read_surface(verl_checkout(tmp_path / "c", unloaded))
    # a checkout without the job's module (an older layout): every file of the package counts
    del files["verl/trainer/main_ppo.py"]
    assert "merge_into_hf_dir" in read_surface(verl_checkout(tmp_path / "b", files)).attributes


def test_a_helper_only_feature_code_calls_serves_that_feature(tmp_path):
    change = edit(AUTO, "def export_hf_weights(self, model):",
                  "def _dequantize_blocks(self, model):\n    return self._unpack(model)\n\n"
                  "def _unpack(self, model):\n    return model\n\n"
                  "def export_hf_weights(self, model):\n    model = self._dequantize_blocks(model)")
    plan = plan_for(tmp_path / "a", change)
    unit = next(u for u in plan.units if u.name == "AutoBridge._unpack")
    assert any("called only from quantized code" in f for f in unit.touched.get("quantized", []))


def test_a_layer_spec_table_the_provider_reads_builds_its_layers(tmp_path):
    # `QWEN3_SPEC = ModuleSpec(module=Qwen3GatedAttention)` at module level, read by the bridge: the layer it names
    # is built, so its forward is verl's path and the family's own layer code; a constant nothing reads is not
    base = _qwen_with_own_layers()
    base[B + "models/qwen/qwen3_layers.py"] += "\n\nQWEN3_SPEC = ModuleSpec(module=Qwen3GatedAttention)\nUNUSED = 1\n"
    base[QWEN] = base[QWEN].replace("import qwen3_layer_spec", "import QWEN3_SPEC").replace(
        "provider.transformer_layer_spec = qwen3_layer_spec", "provider.transformer_layer_spec = QWEN3_SPEC")
    layers = base[B + "models/qwen/qwen3_layers.py"]
    change = {B + "models/qwen/qwen3_layers.py": layers.replace("out = hidden_states * 2", "out = hidden_states * 3")}
    assert levels(plan_for(tmp_path / "a", change, base=base)) == ["L0", "L4:custom-layer"]
    unused = {B + "models/qwen/qwen3_layers.py": layers.replace("UNUSED = 1", "UNUSED = 2")}
    assert levels(plan_for(tmp_path / "b", unused, base=base)) == []


# ---------------------------------------------------------------- issue 26: what a family builds, from its bridge


def test_any_config_change_of_a_moe_family_involves_moe(tmp_path):
    # no MoE word in the change: the family's bridge maps experts, so every model it builds routes to experts
    change = edit(OLMOE, "provider.num_moe_experts = hf_config.num_experts",
                  "provider.num_moe_experts = hf_config.num_experts\nprovider.rotary_base = hf_config.rope_theta")
    plan = plan_for(tmp_path, change)
    assert levels(plan) == ["L0", "L4:moe"]
    moe = next(e for e in plan.entries if e.key == "L4:moe")
    fams, feats = moe.justified_by()
    assert fams == ["OlmoeBridge"]
    assert any("OlmoeBridge's bridge/provider changed and it builds moe" in f for f in feats["moe"])
    # a dense family's same change is Level 0 alone
    dense = qwen_provider_adds("provider.rotary_base = hf_config.rope_theta")
    assert levels(plan_for(tmp_path / "dense", dense)) == ["L0"]


# the imports of a family bridge module that declares weight mappings (the fixture families below)
MAPPING_BRIDGE_IMPORTS = (
    "from megatron.bridge.models.conversion.model_bridge import MegatronModelBridge\n"
    "from megatron.bridge.models.conversion.param_mapping import AutoMapping\n"
    "from megatron.bridge.models.gpt_provider import GPTModelProvider\n\n\n"
)


def _one_bridge_family(folder: str, cls: str, arch: str, provider_lines: list[str], mappings: list[str] | None = None,
                       provider: str = "GPTModelProvider", before: str = "", after: str = "",
                       head: str = "") -> dict[str, str]:
    """BRIDGE_BASE plus a family of one bridge (`models/<folder>/<folder>_bridge.py`) whose provider_bridge sets
    `provider_lines` on a `provider` and whose mapping_registry maps `mappings` (AutoMapping each); `before`: module
    code above the bridge, `after`: its further methods, `head`: lines above the imports."""
    maps = ",\n                ".join(f"AutoMapping({m!r})" for m in mappings) if mappings else "AutoMapping()"
    return _with_family(folder, f"{folder}_bridge", cls, (
        head + MAPPING_BRIDGE_IMPORTS + before +
        f"@MegatronModelBridge.register_bridge(source={arch!r})\n"
        f"class {cls}(MegatronModelBridge):\n"
        "    def provider_bridge(self, hf_config):\n"
        f"        provider = {provider}()\n" + "".join(f"        {line}\n" for line in provider_lines) +
        "        return provider\n\n"
        "    def mapping_registry(self):\n"
        f"        return [{maps}]\n" + after))


def _vl_moe_family() -> dict[str, str]:
    return _one_bridge_family("step_vl", "StepVLBridge", "StepVLForConditionalGeneration",
                              ["provider.num_moe_experts = hf_config.text_config.num_experts"],
                              ["language_model.layers.*.mlp.experts.*.up_proj.weight", "vision_model.ln_pre.weight"])


def test_vision_only_change_of_a_vl_moe_family_is_vlm_not_moe(tmp_path):
    base = _vl_moe_family()
    rel = B + "models/step_vl/step_vl_bridge.py"
    vision = {rel: base[rel].replace("AutoMapping('vision_model.ln_pre.weight')]",
                                     "AutoMapping('vision_model.ln_pre.weight'),\n"
                                     "                AutoMapping('vision_model.ln_post.weight')]")}
    assert levels(plan_for(tmp_path, vision, base=base)) == ["L0", "L4:vlm"]  # a vision encoder has no experts
    language = {rel: base[rel].replace("return provider", "provider.rotary_base = 1.0\n        return provider")}
    assert levels(plan_for(tmp_path / "lang", language, base=base)) == ["L0", "L4:moe", "L4:vlm"]


def test_own_layer_code_of_a_vl_moe_family_is_its_vlm_run_not_a_moe_one(tmp_path):
    # the VL family's Level 4 VLM run loads its MoE checkpoint; a text-only MoE family's same change is MoE
    # (test_own_layer_code_of_a_family_that_only_builds_moe_models_involves_moe)
    layer = ("from megatron.core.transformer.attention import SelfAttention\n\n\n"
             "class StepVLAttention(SelfAttention):\n"
             "    def forward(self, hidden_states):\n        return hidden_states * 2\n\n\n"
             "def step_vl_layer_spec(config):\n    return StepVLAttention\n\n\n")
    base = _one_bridge_family("step_vl", "StepVLBridge", "StepVLForConditionalGeneration",
                              ["provider.num_moe_experts = hf_config.text_config.num_experts",
                               "provider.transformer_layer_spec = step_vl_layer_spec"],
                              ["language_model.layers.*.mlp.experts.*.up_proj.weight", "vision_model.ln_pre.weight"],
                              before=layer)
    rel = B + "models/step_vl/step_vl_bridge.py"
    change = {rel: base[rel].replace("return hidden_states * 2", "return hidden_states * 3")}
    assert levels(plan_for(tmp_path, change, base=base)) == ["L0", "L4:custom-layer", "L4:vlm"]


def _family_with_quantized_checkpoint() -> dict[str, str]:
    return _one_bridge_family(
        "dsq", "DsqBridge", "DsqForCausalLM", ["provider.hidden_size = hf_config.hidden_size"],
        ["model.layers.*.self_attn.q_proj.weight"],
        before="def _dequant_fp8_blockwise(weight, scale_inv):\n    return weight * scale_inv\n\n\n",
        after="\n    def maybe_modify_loaded_hf_weight(self, name, weights):\n"
              "        return _dequant_fp8_blockwise(weights[name], weights[name + '_scale_inv'])\n")


def test_quantized_checkpoint_family_on_its_weight_import_is_quant(tmp_path):
    # the family's HF weights are quantized (its bridge dequantizes them): a change verl's weight import runs
    # involves them; the same family's provider config does not
    base = _family_with_quantized_checkpoint()
    rel = B + "models/dsq/dsq_bridge.py"
    mapping = {rel: base[rel].replace("AutoMapping('model.layers.*.self_attn.q_proj.weight')]",
                                      "AutoMapping('model.layers.*.self_attn.q_a_proj.weight')]")}
    plan = plan_for(tmp_path, mapping, base=base)
    assert "L4:quantized" in levels(plan)
    fams, feats = next(e for e in plan.entries if e.key == "L4:quantized").justified_by()
    assert fams == ["DsqBridge"] and any("AutoBridge.load_hf_weights" in f or "AutoBridge.export_hf_weights" in f for f in feats["quantized"])
    config = {rel: base[rel].replace("provider.hidden_size = hf_config.hidden_size",
                                     "provider.hidden_size = hf_config.hidden_size\n"
                                     "        provider.rotary_base = hf_config.rope_theta")}
    assert levels(plan_for(tmp_path / "cfg", config, base=base)) == ["L0"]


def test_provider_field_the_familys_own_layer_reads_is_custom_layer(tmp_path):
    base = _qwen_with_own_layers()
    base[B + "models/qwen/qwen3_layers.py"] = base[B + "models/qwen/qwen3_layers.py"].replace(
        "out = hidden_states * 2", "out = hidden_states * self.config.window_size[0]")
    change = {QWEN: base[QWEN].replace("provider.hidden_size = hf_config.hidden_size",
                                       "provider.hidden_size = hf_config.hidden_size\n"
                                       "        provider.window_size = (hf_config.sliding_window - 1, 0)")}
    plan = plan_for(tmp_path, change, base=base)
    assert levels(plan) == ["L0", "L4:custom-layer"]
    _, feats = next(e for e in plan.entries if e.key == "L4:custom-layer").justified_by()
    assert any("sets window_size, read by Qwen3Bridge's own layer modules" in f for f in feats["custom-layer"])


def test_loss_setting_an_existing_provider_changes_is_level5_a_new_ones_is_not(tmp_path):
    change = edit(OLMOE, "provider.num_moe_experts = hf_config.num_experts",
                  "provider.num_moe_experts = hf_config.num_experts\nprovider.calculate_per_token_loss = True")
    assert levels(plan_for(tmp_path / "loss", change)) == ["L0", "L4:moe", "L5"]
    # a MoE router's auxiliary-loss coefficient is the router's setting: MoE, with the learning signal offered
    aux = edit(OLMOE, "provider.num_moe_experts = hf_config.num_experts",
               "provider.num_moe_experts = hf_config.num_experts\nprovider.moe_aux_loss_coeff = 0.01")
    plan = plan_for(tmp_path / "aux", aux)
    assert levels(plan) == ["L0", "L4:moe"] and "L5" in [e.key for e in plan.optional]
    base = _vl_moe_family()
    rel = B + "models/step_vl/step_vl_bridge.py"
    new = {k: v for k, v in base.items() if "step_vl" in k or k == B + "models/__init__.py"}
    new[rel] = new[rel].replace("return provider", "provider.moe_aux_loss_coeff = 0.01\n        return provider")
    plan = plan_for(tmp_path / "new", new)  # the whole family is new: its loss settings are Level 0's
    assert "L5" not in levels(plan) and "L4:moe" in levels(plan)


def test_a_line_moved_into_a_moe_familys_bridge_is_placement_only(tmp_path):
    # an import deferred into provider_bridge: the same text on both sides, no feature's behaviour changed
    base = dict(BRIDGE_BASE)
    base[OLMOE] = textwrap.dedent(BRIDGE_BASE[OLMOE]).replace(
        "from megatron.bridge.models.gpt_provider import GPTModelProvider\n",
        "from megatron.bridge.models.gpt_provider import GPTModelProvider\nimport math\n")
    change = {OLMOE: base[OLMOE].replace("import math\n", "").replace(
        "        provider = GPTModelProvider()\n", "        import math\n\n        provider = GPTModelProvider()\n")}
    plan = plan_for(tmp_path, change, base=base)
    assert "L4:moe" not in levels(plan)


def test_a_familys_export_hook_is_hf_export_and_its_quantized_weights(tmp_path):
    # re-quantizing on the way out: only verl's exports run the hook (Level 1), and the family's HF weights are
    # quantized (Level 4 quantized); no export word in the change
    base = _family_with_quantized_checkpoint()
    mb = B + "models/conversion/model_bridge.py"
    base[mb] = textwrap.dedent(base[mb]).replace(
        "            yield mapping.megatron_to_hf(model)",
        "            yield self.maybe_modify_converted_hf_weight(mapping.megatron_to_hf(model))").replace(
        "    def mapping_registry(self):\n        raise NotImplementedError\n",
        "    def mapping_registry(self):\n        raise NotImplementedError\n\n"
        "    def maybe_modify_converted_hf_weight(self, weights):\n        return weights\n")
    assert "self.maybe_modify_converted_hf_weight(" in base[mb] and "return weights\n" in base[mb]
    rel = B + "models/dsq/dsq_bridge.py"
    base[rel] += ("\n    def maybe_modify_converted_hf_weight(self, weights):\n"
                  "        return [w.to(torch.float8_e4m3fn) for w in weights]\n")
    change = {rel: base[rel].replace("return [w.to(torch.float8_e4m3fn) for w in weights]",
                                     "if not weights:\n            return weights\n"
                                     "        return [w.to(torch.float8_e4m3fn) for w in weights]")}
    plan = plan_for(tmp_path, change, base=base)
    assert levels(plan) == ["L0", "L1", "L4:quantized"]


def _mapping_with_dtensor_exit(negated: bool) -> dict[str, str]:
    base = dict(BRIDGE_BASE)
    test = "not isinstance(weights, DTensor)" if negated else "isinstance(weights, DTensor)"
    base[MAPPING] = textwrap.dedent(BRIDGE_BASE[MAPPING]).replace(
        "class MegatronParamMapping:\n    def hf_to_megatron(self, weights):\n        return weights\n",
        "from torch.distributed._tensor import DTensor\n\n\n"
        "class MegatronParamMapping:\n    def hf_to_megatron(self, weights):\n"
        f"        if {test}:\n            return weights\n        return weights.reshape(-1)\n")
    assert "return weights.reshape(-1)" in base[MAPPING]
    return base


def test_lines_after_a_negated_exit_are_about_what_it_requires(tmp_path):
    # `if not isinstance(weights, DTensor): return`: the lines after it run only for Megatron-FSDP's DTensors
    base = _mapping_with_dtensor_exit(negated=True)
    change = {MAPPING: base[MAPPING].replace("return weights.reshape(-1)", "return weights.reshape(-1).clone()")}
    assert levels(plan_for(tmp_path, change, base=base)) == ["L0", "L3"]
    # the other way round the lines after it run only without FSDP
    base = _mapping_with_dtensor_exit(negated=False)
    change = {MAPPING: base[MAPPING].replace("return weights.reshape(-1)", "return weights.reshape(-1).clone()")}
    assert levels(plan_for(tmp_path / "b", change, base=base)) == ["L0"]


def test_a_parallel_setting_switched_off_still_is_level2(tmp_path):
    # off, a parallel setting changes what runs under TP > 1 (a feature switched off is that feature's absence)
    plan = plan_for(tmp_path, qwen_provider_adds("provider.sequence_parallel = False"))
    assert levels(plan) == ["L0", "L2d"]
    assert levels(plan_for(tmp_path / "b", qwen_provider_adds("provider.mtp_num_layers = None"))) == ["L0"]


def test_a_shared_layer_module_is_custom_layer_of_the_families_that_build_it(tmp_path):
    base = _qwen_with_own_layers()
    te = B + "models/common/te_layers.py"
    base[B + "models/common/__init__.py"] = ""
    base[te] = ("from megatron.core.extensions.transformer_engine import TERowParallelLinear\n\n\n"
                "class TERowParallelLinearLayerNorm(TERowParallelLinear):\n"
                "    def forward(self, x):\n        out = x + 1\n        return out\n")
    layers = B + "models/qwen/qwen3_layers.py"
    base[layers] = base[layers].replace(
        "from megatron.core.transformer.spec_utils import ModuleSpec\n",
        "from megatron.core.transformer.spec_utils import ModuleSpec\n"
        "from megatron.bridge.models.common.te_layers import TERowParallelLinearLayerNorm\n").replace(
        "    return ModuleSpec(module=Qwen3GatedAttention)\n",
        "    return ModuleSpec(module=Qwen3GatedAttention, submodules=TERowParallelLinearLayerNorm)\n")
    change = {te: base[te].replace("out = x + 1", "out = x + 2")}
    plan = plan_for(tmp_path, change, base=base)
    assert levels(plan) == ["L0", "L4:custom-layer"]
    custom = next(e for e in plan.entries if e.key == "L4:custom-layer")
    assert custom.justified_by()[0] == ["Qwen3Bridge"]
    assert custom.model == "Qwen/Qwen3-0.6B"  # a family that builds the layer runs it


def test_setting_a_parameters_gradient_state_is_gradient_flow(tmp_path):
    # no gradient word in the function's name: what the changed line sets is the parameter's trainability
    change = edit(MAPPING, "return weights", "weights.requires_grad = False\nreturn weights")
    assert levels(plan_for(tmp_path, change)) == ["L0", "L5"]


def test_the_experts_one_rank_holds_are_the_ep_layout(tmp_path):
    change = edit(MAPPING, "return weights", "weights = weights[: self.num_local_experts]\nreturn weights")
    assert "L2m" in levels(plan_for(tmp_path, change))


def test_a_statement_moved_out_of_its_block_still_changes_behaviour(tmp_path):
    # same text on both sides, but it now runs for every call: only an import moved is placement alone
    base = _qwen_with_own_layers()
    layers = B + "models/qwen/qwen3_layers.py"
    base[layers] = base[layers].replace(
        "        out = hidden_states * 2\n",
        "        out = hidden_states * 2\n        if self.flag:\n            out = out.clone()\n            out.flag = 1\n")
    change = {layers: base[layers].replace(
        "        if self.flag:\n            out = out.clone()\n",
        "        out = out.clone()\n        if self.flag:\n")}
    assert "L4:custom-layer" in levels(plan_for(tmp_path, change, base=base))


def test_bridge_registered_by_a_module_level_call_is_a_family_verl_builds(tmp_path):
    # `X = MegatronModelBridge.register_bridge(...)(X)` under an `if` that checks the HF class exists registers the
    # bridge as the decorator does: its methods are verl's (AutoBridge hands it out), its folder a family
    base = _with_family("tower", "tower_bridge", "TowerBridge", (
        "from megatron.bridge.models.conversion.model_bridge import MegatronModelBridge\n\n"
        "HAS_TOWER = True\n\n\n"
        "class TowerBridge(MegatronModelBridge):\n"
        "    def provider_bridge(self, hf_config):\n        return hf_config\n\n"
        "    def mapping_registry(self):\n        return ['model.layers.*.mlp.experts.*.up_proj.weight']\n\n\n"
        "if HAS_TOWER:\n"
        "    TowerBridge = MegatronModelBridge.register_bridge(source='TowerForCausalLM')(TowerBridge)\n"))
    change = {B + "models/tower/tower_bridge.py": base[B + "models/tower/tower_bridge.py"].replace(
        "return hf_config", "hf_config.rope_theta = 1.0\n        return hf_config")}
    plan = plan_for(tmp_path, change, base=base)
    assert levels(plan) == ["L0", "L4:moe"]
    assert reason_units(plan, "verl-runs-it")[0]["unit"] == "TowerBridge.provider_bridge"
    assert reason_units(plan, "moe")[0]["families"] == ["TowerBridge"]


def test_removed_method_override_changes_its_class(tmp_path):
    # a provider drops its `finalize` override (a TP guard): the base class's finalize runs in its place, so the
    # provider verl builds changed where it reads the parallel sizes: Level 2, not nothing
    source = (
        "from megatron.bridge.models.conversion.model_bridge import MegatronModelBridge\n"
        "from megatron.bridge.models.gpt_provider import GPTModelProvider\n\n\n"
        "class TowerProvider(GPTModelProvider):\n"
        "    num_query_groups = 2\n\n"
        "    def finalize(self):\n"
        "        if self.num_query_groups < self.tensor_model_parallel_size:\n"
        "            raise ValueError('TP too large')\n"
        "        super().finalize()\n\n"
        "    def provide(self):\n        return self.build()\n\n\n"
        "@MegatronModelBridge.register_bridge(source='TowerForCausalLM')\n"
        "class TowerBridge(MegatronModelBridge):\n"
        "    def provider_bridge(self, hf_config):\n        return TowerProvider()\n")
    base = _with_family("tower", "tower_bridge", "TowerBridge", source)
    start = source.index("    def finalize(self):")
    change = {B + "models/tower/tower_bridge.py": source[:start] + source[source.index("    def provide(self):"):]}
    plan = plan_for(tmp_path, change, base=base)
    assert levels(plan) == ["L0", "L2d"]
    assert [u["unit"] for u in reason_units(plan, "tp-pp-cp")] == ["TowerProvider"]


def test_a_function_verl_calls_is_no_helper_of_its_bridge_callers_feature(tmp_path):
    # export_hf_weights's only Bridge caller is a ModelOpt export, but verl calls it itself: a change to it serves
    # every export verl does, not ModelOpt's
    base = edit(AUTO, "def save_megatron_model(self, model, path):",
                "def export_hf_weights_modelopt(self, model):\n    return self.export_hf_weights(model)\n\n"
                "def save_megatron_model(self, model, path):")
    change = edit(AUTO, "return list(self._model_bridge.stream_weights_megatron_to_hf(model))",
                  "return [w for w in self._model_bridge.stream_weights_megatron_to_hf(model)]",
                  base={**BRIDGE_BASE, **base})
    plan = plan_for(tmp_path, change, base={**BRIDGE_BASE, **base})
    assert "L4:qat" not in levels(plan)
    unit = next(u for u in plan.units if u.name == "AutoBridge.export_hf_weights")
    assert "qat" not in unit.touched


def test_a_parameter_handed_on_involves_no_feature_of_the_family(tmp_path):
    # a MoE family's mapping method gains a parameter and hands it to the shared code: plumbing; the shared code
    # that uses it decides the features (here none), not the family's experts
    base = edit(OLMOE, "def mapping_registry(self):\n    return [AutoMapping(), ExpertMapping()]",
                "def mapping_registry(self):\n    return [AutoMapping(), ExpertMapping()]\n\n"
                "def stream_weights_megatron_to_hf(self, model):\n"
                "    return super().stream_weights_megatron_to_hf(model)")
    change = edit(OLMOE, "def stream_weights_megatron_to_hf(self, model):\n"
                  "    return super().stream_weights_megatron_to_hf(model)",
                  "def stream_weights_megatron_to_hf(self, model, weight_dtype=None):\n"
                  "    return super().stream_weights_megatron_to_hf(model, weight_dtype=weight_dtype)",
                  base={**BRIDGE_BASE, **base})
    plan = plan_for(tmp_path, change, base={**BRIDGE_BASE, **base})
    assert not [k for k in levels(plan) if k.startswith("L4")], levels(plan)
    unit = next(u for u in plan.units if u.name == "OlmoeBridge.stream_weights_megatron_to_hf")
    assert unit.tier == "calls" and unit.passes_through


# the HF weight import hiding the loss modules while it loads (old text, new text of model_bridge.py)
HIDE_LOSS_MODULES = ("def load_weights_hf_to_megatron(self, model, weights):\n"
                     "    for mapping in self.mapping_registry():\n        mapping.hf_to_megatron(weights)",
                     "def load_weights_hf_to_megatron(self, model, weights):\n"
                     "    if hasattr(model[0], 'hide_loss_modules'):\n"
                     "        model[0].hide_loss_modules()\n"
                     "    for mapping in self.mapping_registry():\n        mapping.hf_to_megatron(weights)")


def test_weight_import_path_changes_no_loss(tmp_path):
    # the HF weight import hides the loss modules while it loads: only verl's weight load runs the line, and moving
    # weights computes no loss or gradient, so Level 5 is not for it (the words of a name say nothing)
    bridge = B + "models/conversion/model_bridge.py"
    change = edit(bridge, *HIDE_LOSS_MODULES)
    plan = plan_for(tmp_path, change)
    assert levels(plan) == ["L0"], [(e.key, [r.rule for r in e.reasons]) for e in plan.entries]
    unit = next(u for u in plan.units if u.name == "MegatronModelBridge.load_weights_hf_to_megatron")
    assert unit.tier == "calls" and unit.entries == ["AutoBridge.load_hf_weights"]


def test_a_layer_a_text_family_also_builds_is_no_vision_code(tmp_path):
    # the folder's text family and its VL sibling both build the decoder layer: a text-only run of the text family
    # exercises the change; the VL family's vision side has nothing to do with it
    source = (
        "from megatron.bridge.models.conversion.model_bridge import MegatronModelBridge\n"
        "from megatron.bridge.models.gpt_provider import GPTModelProvider\n\n\n"
        "class StepDecoderLayer(TransformerLayer):\n"
        "    def __init__(self, config):\n        self.scale = 1\n\n\n"
        "def step_layer_spec(config):\n    return StepDecoderLayer\n\n\n"
        "@MegatronModelBridge.register_bridge(source='StepForCausalLM')\n"
        "class StepBridge(MegatronModelBridge):\n"
        "    def provider_bridge(self, hf_config):\n"
        "        provider = GPTModelProvider()\n"
        "        provider.transformer_layer_spec = step_layer_spec\n"
        "        return provider\n\n\n"
        "@MegatronModelBridge.register_bridge(source='StepVLForConditionalGeneration')\n"
        "class StepVLBridge(MegatronModelBridge):\n"
        "    def provider_bridge(self, hf_config):\n"
        "        provider = GPTModelProvider()\n"
        "        provider.transformer_layer_spec = step_layer_spec\n"
        "        return provider\n\n"
        "    def mapping_registry(self):\n        return ['vision_model.ln_pre.weight']\n")
    base = _with_family("step", "step_bridge", "StepBridge", source)
    base[B + "models/__init__.py"] += "from megatron.bridge.models.step.step_bridge import StepVLBridge\n"
    change = {B + "models/step/step_bridge.py": source.replace("self.scale = 1", "self.scale = 2")}
    plan = plan_for(tmp_path, change, base=base)
    assert levels(plan) == ["L0", "L4:custom-layer"], [(e.key, [r.rule for r in e.reasons]) for e in plan.entries]


def test_megatron_to_hf_is_the_export_direction_not_its_config_translation():
    # a function about streaming weights Megatron → HF is HF export whatever verl entry reaches it (the ModelOpt
    # quantized export stream); the reverse translation of the config is not weight export
    from sessions.plan.analysis import topic_hits
    from sessions.plan.rules import BY_NAME

    names = ["stream_weights_megatron_to_hf_quant", "megatron_to_hf_config", "hf_to_megatron"]
    assert topic_hits(BY_NAME["hf-export"], names) == ["stream_weights_megatron_to_hf_quant"]


def test_weight_import_also_run_by_the_provider_build_changes_no_loss(tmp_path):
    # verl's provider build loads the HF weights too (a pre-wrap hook): the changed function is still a weight
    # import by what it is, and moving weights computes no loss
    base = edit(AUTO, "return self._model_bridge.provider_bridge(hf_config)",
                "provider = self._model_bridge.provider_bridge(hf_config)\n"
                "self._model_bridge.load_weights_hf_to_megatron(None, None)\nreturn provider")
    full = {**BRIDGE_BASE, **base}
    bridge = B + "models/conversion/model_bridge.py"
    change = edit(bridge, *HIDE_LOSS_MODULES, base=full)
    plan = plan_for(tmp_path, change, base=full)
    unit = next(u for u in plan.units if u.name == "MegatronModelBridge.load_weights_hf_to_megatron")
    assert "AutoBridge.to_megatron_provider" in unit.entries
    assert levels(plan) == ["L0"], [(e.key, [r.rule for r in e.reasons]) for e in plan.entries]


def test_a_fused_kernel_for_the_same_gradients_is_no_gradient_flow_change(tmp_path):
    # gradient_accumulation_fusion picks a fused wgrad kernel: the gradients are the same, Level 0 runs it
    assert levels(plan_for(tmp_path, provide_guarded("self.gradient_accumulation_fusion"))) == ["L0"]


def test_verls_standalone_scripts_are_not_its_rl_job(tmp_path):
    # a checkpoint-merger CLI under verl's scripts/ that calls Bridge's training loop: users run it by hand, the
    # procedure's run never does
    verl = dict(VERL_FILES)
    verl["scripts/merger.py"] = ("from megatron.bridge.training.train import train\n\n\n"
                                 "def main(model):\n    train(model, 1)\n")
    change = edit(B + "training/train.py", "model.step()", "model.step(step)")
    assert levels(plan_for(tmp_path, change, verl_files=verl)) == []


def _norm_mapping_of_olmoe() -> dict[str, str]:
    # a mapping class in shared conversion code that only the OLMoE (MoE) family's bridge registers
    base = dict(BRIDGE_BASE)
    base[MAPPING] = textwrap.dedent(base[MAPPING]) + (
        "\n\nclass ZeroCenteredNormMapping(MegatronParamMapping):\n"
        "    def hf_to_megatron(self, weights):\n"
        "        return weights\n")
    base[OLMOE] = textwrap.dedent(base[OLMOE]).replace(
        "import AutoMapping, ExpertMapping", "import AutoMapping, ExpertMapping, ZeroCenteredNormMapping").replace(
        "return [AutoMapping(), ExpertMapping()]", "return [AutoMapping(), ExpertMapping(), ZeroCenteredNormMapping()]")
    return base


def test_shared_code_only_one_familys_bridge_uses_serves_that_family(tmp_path):
    base = _norm_mapping_of_olmoe()
    change = {MAPPING: base[MAPPING].replace("class ZeroCenteredNormMapping(MegatronParamMapping):\n"
                                             "    def hf_to_megatron(self, weights):\n        return weights",
                                             "class ZeroCenteredNormMapping(MegatronParamMapping):\n"
                                             "    def hf_to_megatron(self, weights):\n        return weights - 1")}
    plan = plan_for(tmp_path, change, base=base)
    assert levels(plan) == ["L0", "L4:moe"]  # a MoE family's conversion: every model of it is MoE
    fams, _ = next(e for e in plan.entries if e.key == "L4:moe").justified_by()
    assert fams == ["OlmoeBridge"]
    # the same edit in a mapping every family uses (the base class) is shared code: no family's features
    shared = edit(MAPPING, "def hf_to_megatron(self, weights):\n    return weights",
                  "def hf_to_megatron(self, weights):\n    return weights - 1")
    assert "L4:moe" not in levels(plan_for(tmp_path / "shared", shared))


def _new_family_reading_tp() -> dict[str, str]:
    return _one_bridge_family(
        "newarch", "NewArchBridge", "NewArchForCausalLM",
        ["provider.heads = hf_config.heads // parallel_state.get_tensor_model_parallel_world_size()"],
        head="from megatron.core import parallel_state\n")


def test_a_new_providers_own_parallel_code_offers_level2_as_a_follow_up(tmp_path):
    new = {k: v for k, v in _new_family_reading_tp().items() if "newarch" in k or k == B + "models/__init__.py"}
    plan = plan_for(tmp_path, new)
    assert levels(plan) == ["L0"]
    follow = next(e for e in plan.optional if e.key == "L2d")
    assert follow.reasons[0].rule == "new-provider-parallel-follow-up"
    # the same line changed in an existing family: parallel stress is required
    base = _new_family_reading_tp()
    rel = B + "models/newarch/newarch_bridge.py"
    changed = {rel: base[rel].replace("hf_config.heads //", "hf_config.num_heads //")}
    assert "L2d" in levels(plan_for(tmp_path / "existing", changed, base=base))


def test_quantization_in_a_layer_spec_is_qat_not_quantized_weights(tmp_path):
    # a layer spec the provider build runs that swaps in quantized modules: ModelOpt's quantized layers (QAT)
    base = dict(BRIDGE_BASE)
    base[GPT] = textwrap.dedent(base[GPT]).replace(
        "class GPTModelProvider:",
        "def quantization_layer_spec(config):\n    return config\n\n\nclass GPTModelProvider:").replace(
        "return object()", "return quantization_layer_spec(self)")
    change = {GPT: base[GPT].replace("def quantization_layer_spec(config):\n    return config",
                                     "def quantization_layer_spec(config):\n"
                                     "    return config.quant_modules if config.quantize else config")}
    assert levels(plan_for(tmp_path, change, base=base)) == ["L0", "L4:qat"]


def test_a_new_providers_own_layer_module_reading_tp_keeps_level2_required(tmp_path):
    # a new family whose own attention module divides by the TP size: custom layer behaviour that only a TP run
    # exercises, not the provider's config read under parallel sizes (that one is a follow-up)
    base = _with_family("newarch", "newarch_bridge", "NewArchBridge", (
        "from megatron.bridge.models.conversion.model_bridge import MegatronModelBridge\n"
        "from megatron.bridge.models.conversion.param_mapping import AutoMapping\n"
        "from megatron.bridge.models.gpt_provider import GPTModelProvider\n"
        "from megatron.bridge.models.newarch.newarch_layers import newarch_layer_spec\n\n\n"
        "@MegatronModelBridge.register_bridge(source='NewArchForCausalLM')\n"
        "class NewArchBridge(MegatronModelBridge):\n"
        "    def provider_bridge(self, hf_config):\n"
        "        provider = GPTModelProvider()\n"
        "        provider.transformer_layer_spec = newarch_layer_spec\n"
        "        return provider\n\n"
        "    def mapping_registry(self):\n"
        "        return [AutoMapping()]\n"))
    base[B + "models/newarch/newarch_layers.py"] = (
        "from megatron.core import parallel_state\n"
        "from megatron.core.transformer.attention import SelfAttention\n"
        "from megatron.core.transformer.spec_utils import ModuleSpec\n\n\n"
        "class NewArchAttention(SelfAttention):\n"
        "    def forward(self, hidden_states):\n"
        "        heads = self.config.num_attention_heads // parallel_state.get_tensor_model_parallel_world_size()\n"
        "        return hidden_states * heads\n\n\n"
        "def newarch_layer_spec(config):\n"
        "    return ModuleSpec(module=NewArchAttention)\n")
    new = {k: v for k, v in base.items() if "newarch" in k or k == B + "models/__init__.py"}
    plan = plan_for(tmp_path, new)
    assert "L2d" in levels(plan), [(e.key, [r.rule for r in e.reasons]) for e in plan.entries]
    assert "L2d" not in [e.key for e in plan.optional]


def test_shared_mapping_a_vl_family_registers_is_no_vision_code(tmp_path):
    # a shared expert mapping only a VL MoE family registers: any load of the checkpoint runs it (vision weights
    # included), so text-only GSM8K covers it; the family's experts still count, its vision side does not
    base = _vl_moe_family()
    rel = B + "models/step_vl/step_vl_bridge.py"
    base[MAPPING] = textwrap.dedent(base[MAPPING]) + (
        "\n\nclass FusedExpertMapping(MegatronParamMapping):\n"
        "    def hf_to_megatron(self, weights):\n"
        "        return weights\n")
    base[rel] = base[rel].replace("import AutoMapping\n", "import AutoMapping, FusedExpertMapping\n").replace(
        "AutoMapping('vision_model.ln_pre.weight')]", "AutoMapping('vision_model.ln_pre.weight'), FusedExpertMapping()]")
    change = {MAPPING: base[MAPPING][:base[MAPPING].rindex("return weights")] + "return weights.T\n"}
    plan = plan_for(tmp_path, change, base=base)
    assert levels(plan) == ["L0", "L4:moe"]
    # the same family's own bridge code is the whole VL model's config: its vision side counts
    own = {rel: base[rel].replace("return provider", "provider.rotary_base = 1.0\n        return provider")}
    assert levels(plan_for(tmp_path / "own", own, base=base)) == ["L0", "L4:moe", "L4:vlm"]


def test_expert_tensor_parallelism_is_the_moe_variant_not_dense_tp(tmp_path):
    # finalize defaulting the experts' TP size (ETP) changes the expert layout: EP=2 stresses it, TP=2 alone does not
    change = edit(GPT, "self.ready = True", "self.ready = True\n"
                  "if self.expert_tensor_parallel_size is None:\n"
                  "    self.expert_tensor_parallel_size = 1")
    assert levels(plan_for(tmp_path, change)) == ["L0", "L2m", "L4:moe"]
    # the dense tensor-parallel size in the same place is dense TP
    dense = edit(GPT, "self.ready = True", "self.ready = True\n"
                 "if self.tensor_model_parallel_size is None:\n"
                 "    self.tensor_model_parallel_size = 1")
    assert levels(plan_for(tmp_path / "dense", dense)) == ["L0", "L2d"]


def _family_with_linear_attention() -> dict[str, str]:
    # its provider selects Megatron-Core's linear-attention layers (gated delta net) through the standard GPT spec
    return _one_bridge_family(
        "nextarch", "NextArchBridge", "NextArchForCausalLM", ["provider.hidden_size = hf_config.hidden_size"],
        ["model.layers.*.linear_attn.in_proj_qkvz.weight"], provider="NextArchModelProvider",
        before="class NextArchModelProvider(GPTModelProvider):\n"
               "    linear_attention_type: str = 'gated_delta_net'\n"
               "    linear_attention_freq: int = 4\n\n\n")


def test_a_new_family_with_linear_attention_layers_is_custom_layer(tmp_path):
    # its layers are not the standard softmax-attention transformer layer, whatever spec function builds them
    new = {k: v for k, v in _family_with_linear_attention().items() if "nextarch" in k
           or k == B + "models/__init__.py"}
    assert levels(plan_for(tmp_path, new)) == ["L0", "L4:custom-layer"]
    # the same family with softmax attention only is Level 0 alone
    plain = {k: v.replace("    linear_attention_type: str = 'gated_delta_net'\n    linear_attention_freq: int = 4\n",
                          "    rotary_base: float = 1.0\n") for k, v in new.items()}
    assert levels(plan_for(tmp_path / "plain", plain)) == ["L0"]


def test_linear_attention_words_must_follow_each_other():
    from sessions.plan.features import feature_of_name
    assert feature_of_name("linear_attention_type") == ["custom-layer"]
    assert feature_of_name("decoder.layers.*.self_attention.linear_qkv.weight") == []
    # Megatron-Core's linear-attention layer (GatedDeltaNet) by its name and its abbreviation in Bridge's code
    assert feature_of_name("split_gdn_linear_weights") == ["custom-layer"]
    assert feature_of_name("gated_delta_net") == ["custom-layer"]
    assert feature_of_name("net_delta_gated") == []


def test_a_parallel_read_kept_as_it_was_by_the_edit_is_no_parallel_change(tmp_path):
    # an override put in front of an unchanged `get_context_parallel_world_size() == 1`: under every CP size the
    # default computes what it did; only what the edit adds counts
    gpt = textwrap.dedent(BRIDGE_BASE[GPT])
    base = {**BRIDGE_BASE, GPT: gpt.replace(
        "        return self.build()",
        "        self.causal = parallel_state.get_context_parallel_world_size() == 1\n        return self.build()")}
    override = {GPT: base[GPT].replace(
        "self.causal = parallel_state.get_context_parallel_world_size() == 1",
        "self.causal = (\n            self.causal_override if self.causal_override is not None\n"
        "            else parallel_state.get_context_parallel_world_size() == 1\n        )")}
    assert levels(plan_for(tmp_path, override, base=base)) == ["L0"]
    # what the CP size is compared with changed: the lines compute something else under CP > 1
    compared = {GPT: base[GPT].replace("get_context_parallel_world_size() == 1",
                                       "get_context_parallel_world_size() <= 2")}
    assert levels(plan_for(tmp_path / "compared", compared, base=base)) == ["L0", "L2d"]


LORA_WITH_ADAPTER = {**BRIDGE_BASE, LORA: """
    class LoRALinear:
        def __init__(self, base, dim):
            self.base, self.dim = base, dim
            self.scale = self.init_weights()

        def init_weights(self):
            return 0.0

        def forward(self, x):
            return self.base(x) + self.scale * self.dim * x


    class LoRA:
        def __init__(self, config):
            self.dim = config.get("dim", 8)

        def _init_target_state(self):
            return {"linear_qkv": self.dim}

        def __call__(self, model):
            return self.transform(model)

        def transform(self, module):
            return LoRALinear(module, self._init_target_state()["linear_qkv"])
    """}


def test_an_adapters_forward_or_weight_initialisation_is_level_5_its_wiring_is_not(tmp_path):
    # what a LoRA adapter adds to its layer's output (or where its weights start) decides whether it learns: the
    # procedure's "trainabilité PEFT"; which modules get adapters, or setting up name matching, leaves L5 arguable
    def plan(name, old, new):
        return plan_for(tmp_path / name, edit(LORA, old, new, LORA_WITH_ADAPTER), base=LORA_WITH_ADAPTER)

    forward = plan("forward", "return self.base(x) + self.scale * self.dim * x",
                   "return self.base(x) + (self.scale * self.dim * x) / 2")
    assert levels(forward) == ["L0", "L1", "L5"]
    assert [u["unit"] for u in reason_units(forward, "adapter-numerics")] == ["LoRALinear.forward"]
    init = plan("init", "return 0.0", "return 0.01")
    assert levels(init) == ["L0", "L1", "L5"]
    assert [u["unit"] for u in reason_units(init, "adapter-numerics")] == ["LoRALinear.init_weights"]
    for name, old, new in (("wiring", "return LoRALinear(module, self._init_target_state()[\"linear_qkv\"])",
                            "return LoRALinear(module, dim=self._init_target_state()[\"linear_qkv\"])"),
                           ("matching", 'return {"linear_qkv": self.dim}', 'return {"linear_qkv": self.dim + 0}')):
        other = plan(name, old, new)
        assert levels(other) == ["L0", "L1"] and "L5" in [e.key for e in other.optional], name


def test_an_adapters_initialisation_switch_in_its_code_is_level_5(tmp_path):
    # Megatron's perform_initialization decides whether the adapter's layers start from their init methods: set in
    # the adapter's own code, it moves where the adapter's weights start (the unit's name says nothing of it)
    switched = plan_for(tmp_path, edit(LORA, "self.base, self.dim = base, dim",
                                       "self.base, self.dim = base, dim\n"
                                       "base.config.perform_initialization = True", LORA_WITH_ADAPTER),
                        base=LORA_WITH_ADAPTER)
    assert levels(switched) == ["L0", "L1", "L5"]
    assert [u["unit"] for u in reason_units(switched, "adapter-numerics")] == ["LoRALinear.__init__"]
    # `forward` counts as what the unit is, never as a name its code uses (every layer call names it)
    called = plan_for(tmp_path / "called", edit(LORA, "self.base, self.dim = base, dim",
                                                "self.base, self.dim = base, dim\n"
                                                "self.hook = base.forward", LORA_WITH_ADAPTER),
                      base=LORA_WITH_ADAPTER)
    assert levels(called) == ["L0", "L1"]


def _gated_attention_family() -> dict[str, str]:
    return _one_bridge_family("gat", "GatBridge", "GatForCausalLM",
                              ["provider.hidden_size = hf_config.hidden_size",
                               "provider.attention_output_gate = False"],
                              ["model.layers.*.self_attn.q_proj.weight"])


def test_gated_attention_is_words_of_its_own():
    from sessions.plan.features import feature_of_name
    assert feature_of_name("attention_output_gate") == ["custom-layer"]
    assert feature_of_name("use_head_wise_attn_gate") == ["custom-layer"]
    assert feature_of_name("gate_proj") == []  # an MLP's gate projection is no attention gate


def test_family_code_its_layer_modules_call_is_custom_layer_wherever_it_is_defined(tmp_path):
    # a helper in another file of the family's folder that its attention's forward calls runs inside the layer;
    # one only its bridge calls (config translation) does not
    base = _qwen_with_own_layers()
    base[B + "models/qwen/qwen3_helpers.py"] = (
        "def rotate_half(x):\n"
        "    return x * 2\n\n\n"
        "def hf_head_dim(hf_config):\n"
        "    return hf_config.hidden_size // 2\n")
    layers = B + "models/qwen/qwen3_layers.py"
    base[layers] = ("from megatron.bridge.models.qwen.qwen3_helpers import rotate_half\n" + base[layers]).replace(
        "out = hidden_states * 2", "out = rotate_half(hidden_states)")
    base[QWEN] = base[QWEN].replace(
        "from megatron.bridge.models.qwen.qwen3_layers import qwen3_layer_spec\n",
        "from megatron.bridge.models.qwen.qwen3_layers import qwen3_layer_spec\n"
        "from megatron.bridge.models.qwen.qwen3_helpers import hf_head_dim\n").replace(
        "provider.hidden_size = hf_config.hidden_size\n",
        "provider.hidden_size = hf_config.hidden_size\n        provider.kv_channels = hf_head_dim(hf_config)\n")
    helpers = base[B + "models/qwen/qwen3_helpers.py"]
    in_layer = {B + "models/qwen/qwen3_helpers.py": helpers.replace("return x * 2", "return x * 3")}
    plan = plan_for(tmp_path / "a", in_layer, base=base)
    assert levels(plan) == ["L0", "L4:custom-layer"]
    fams, feats = next(e for e in plan.entries if e.key == "L4:custom-layer").justified_by()
    assert fams == ["Qwen3Bridge"]
    assert any("Qwen3GatedAttention" in f and "runs the changed code" in f for f in feats["custom-layer"]), feats
    in_config = {B + "models/qwen/qwen3_helpers.py": helpers.replace("// 2", "// 4")}
    assert levels(plan_for(tmp_path / "b", in_config, base=base)) == ["L0"]



def _families_naming_their_weights() -> dict[str, str]:
    # Qwen3 maps a dense MLP weight, OLMoE an expert weight under a name of its own (`w1`, like MiniMax-M2's)
    base = dict(BRIDGE_BASE)
    base[QWEN] = textwrap.dedent(base[QWEN]).replace(
        "return [AutoMapping()]", 'return [AutoMapping(hf_param="model.layers.*.mlp.gate_proj.weight")]')
    base[OLMOE] = textwrap.dedent(base[OLMOE]).replace(
        "return [AutoMapping(), ExpertMapping()]",
        'return [AutoMapping(hf_param="model.layers.*.mlp.gate_proj.weight"),\n'
        '                ExpertMapping(hf_param="model.layers.*.mlp.experts.*.w1.weight")]')
    return base


@pytest.mark.parametrize("fragment, moe", [(".w1.", True), ("gate_proj", False)])
def test_shared_code_picking_weights_by_a_name_fragment_serves_the_weights_holding_it(tmp_path, fragment, moe):
    # shared conversion code that recognises a weight-name fragment: the weights the bridges map under it decide
    # the feature — only experts hold `.w1.`; dense and expert weights both hold `gate_proj`
    base = _families_naming_their_weights()
    change = edit(MAPPING, "def hf_to_megatron(self, weights):\n    return weights",
                  f'def hf_to_megatron(self, weights):\n    if "{fragment}" in self.hf_param:\n'
                  "        return weights[::-1]\n    return weights", base=base)
    plan = plan_for(tmp_path, change, base=base)
    assert ("L4:moe" in levels(plan)) is moe
    if moe:
        _, feats = next(e for e in plan.entries if e.key == "L4:moe").justified_by()
        assert any("'.w1.' names only moe weights" in fact and "olmoe" in fact for fact in feats["moe"])


def _hybrid_family() -> dict[str, str]:
    # a hybrid family: its provider builds Megatron-Core's Mamba mixers in the layers its pattern marks `M`
    return _one_bridge_family(
        "hyb", "HybBridge", "HybForCausalLM",
        ["provider.hidden_size = hf_config.hidden_size", "provider.mamba_num_heads = hf_config.mamba_num_heads"],
        ["backbone.layers.*.mixer.in_proj.weight"], provider="HybModelProvider",
        before="class HybModelProvider(GPTModelProvider):\n    hybrid_layer_pattern: str = 'M*M*'\n\n\n")


# a layer kind of its own that Megatron-Core builds from the provider's settings (Mamba mixers in place of attention;
# a gate on the attention output, Qwen3-Next's or Step's head-wise one): Level 0's dense default model has neither
LAYER_KIND_SETTINGS = {
    "mamba": (lambda: _hybrid_family(), "hyb", "provider.mamba_num_heads = hf_config.mamba_num_heads",
              "provider.mamba_num_heads = hf_config.mamba_num_heads\nprovider.mamba_chunk_size = hf_config.chunk_size"),
    "gated-attention": (lambda: _gated_attention_family(), "gat", "provider.attention_output_gate = False",
                        "provider.attention_output_gate = getattr(hf_config, 'head_wise_attn_gate', False)"),
}


@pytest.mark.parametrize("kind", sorted(LAYER_KIND_SETTINGS))
def test_a_layer_kind_setting_is_custom_layer_like_linear_attention(tmp_path, kind):
    # a change to what the layer kind is built with involves it; the same family's hidden size does not
    family, folder, old, new = LAYER_KIND_SETTINGS[kind]
    base = family()
    rel = B + f"models/{folder}/{folder}_bridge.py"
    setting = edit(rel, old, new, base=base)
    assert "L4:custom-layer" in levels(plan_for(tmp_path, setting, base=base))
    hidden = edit(rel, "provider.hidden_size = hf_config.hidden_size",
                  "provider.hidden_size = int(hf_config.hidden_size)", base=base)
    assert "L4:custom-layer" not in levels(plan_for(tmp_path / "hidden", hidden, base=base))


def test_mamba_is_a_word_of_its_own():
    from sessions.plan.features import feature_of_name
    assert feature_of_name("mamba_chunk_size") == ["custom-layer"]
    assert feature_of_name("MambaModelProvider") == ["custom-layer"]


def _qwen_reading_mtp_layers(binding: str, read: str) -> dict[str, str]:
    # the family's mapping_registry (verl's weight load and export build it) binds the HF config, then reads from it
    base = dict(BRIDGE_BASE)
    body = " " * 16  # the method body's indentation in the fixture's source
    base[QWEN] = base[QWEN].replace(
        f"def mapping_registry(self):\n{body}return [AutoMapping()]",
        f"def mapping_registry(self):\n{body}hf_config = {binding}\n{body}mappings = [AutoMapping()]\n"
        f"{body}for _ in range({read}):\n{body}    mappings.append(AutoMapping())\n{body}return mappings")
    assert base[QWEN] != BRIDGE_BASE[QWEN]
    return base


@pytest.mark.parametrize("read, mtp", [('getattr(hf_config, "num_nextn_predict_layers", 0)', True),
                                       ("hf_config.num_nextn_predict_layers", True),
                                       ('hf_config.get("num_nextn_predict_layers", 0)', True),
                                       ('hf_config["num_nextn_predict_layers"]', True),
                                       ("hf_config.num_hidden_layers", False)])
def test_the_settings_read_from_what_a_changed_line_binds_are_what_changed(tmp_path, read, mtp):
    # d9665446a's shape: `hf_config = getattr(self, "_hf_config", None)` -> `hf_config = self.hf_config`; the MTP
    # mappings after it are built from what the changed line binds, so MTP is involved (a layer count is no feature)
    base = _qwen_reading_mtp_layers('getattr(self, "_hf_config", None)', read)
    change = edit(QWEN, 'hf_config = getattr(self, "_hf_config", None)', "hf_config = self.hf_config", base=base)
    assert ("L4:mtp" in levels(plan_for(tmp_path, change, base=base))) is mtp


def test_a_setting_read_before_the_changed_binding_is_not_what_it_changed(tmp_path):
    # the same read on a line before the binding reads the earlier value: the change is none of its business
    base = dict(BRIDGE_BASE)
    body = " " * 16
    base[QWEN] = base[QWEN].replace(
        f"def mapping_registry(self):\n{body}return [AutoMapping()]",
        f"def mapping_registry(self):\n{body}n = self.hf_config.num_nextn_predict_layers\n"
        f"{body}hf_config = getattr(self, '_hf_config', None)\n{body}return [AutoMapping()] * (n + 1)")
    assert base[QWEN] != BRIDGE_BASE[QWEN]
    change = edit(QWEN, "hf_config = getattr(self, '_hf_config', None)", "hf_config = self.hf_config", base=base)
    assert "L4:mtp" not in levels(plan_for(tmp_path, change, base=base))


def test_a_pipeline_size_read_on_expert_lines_asks_for_the_dense_variant(tmp_path):
    # the MoE variant sets only EP and ETP (PP stays 1): a pipeline size read for experts needs the dense run
    change = edit(LORA, "return module", "if module.is_expert:\n"
                  "    module.pad = module.config.pipeline_model_parallel_size\nreturn module")
    plan = plan_for(tmp_path, change)
    assert "L2d" in levels(plan) and "L2m" not in levels(plan)


def _family_with_a_moe_switch() -> dict[str, str]:
    """One bridge for dense and MoE checkpoints: it sets the expert fields only when the HF config's flag says MoE."""
    return _one_bridge_family("g4", "G4Bridge", "G4ForCausalLM", [
        "provider.num_moe_experts = 128",
        "if getattr(hf_config, 'enable_moe_block', False):",
        "    provider.num_moe_experts = hf_config.num_experts",
        "else:",
        "    provider.num_moe_experts = None"])


def test_a_family_branching_on_a_moe_flag_involves_moe_only_where_the_change_touches_it(tmp_path):
    # its dense checkpoints are built by the same bridge: experts are no property of every model of the family
    base = _family_with_a_moe_switch()
    rel = B + "models/g4/g4_bridge.py"
    rope = {rel: base[rel].replace("        return provider", "        provider.rotary_base = 1.0\n        return provider")}
    plan = plan_for(tmp_path / "rope", rope, base=base)
    assert levels(plan) == ["L0"]
    # a MoE run stays offered, with why it is not required
    follow = next(e for e in plan.optional if e.key == "L4:moe")
    assert [r.rule for r in follow.reasons] == ["moe-family-follow-up"]
    assert "enable_moe_block" in follow.reasons[0].units[0]["matched"][0]
    experts = {rel: base[rel].replace("hf_config.num_experts", "hf_config.n_routed_experts")}
    plan = plan_for(tmp_path / "experts", experts, base=base)
    assert levels(plan) == ["L0", "L4:moe"]
    assert "moe-family-follow-up" not in [r.rule for e in plan.entries for r in e.reasons]


def _deepseek_with_outside_layer_spec() -> dict[str, str]:
    """A family whose provider picks a layer spec Megatron-Core builds (DeepSeek-V4's experimental attention
    variant) and sets that spec's own fields, beside Qwen 3 (standard layers) setting the standard ones."""
    base = dict(BRIDGE_BASE)
    base[B + "models/deepseek/__init__.py"] = ""
    base[B + "models/__init__.py"] = textwrap.dedent(BRIDGE_BASE[B + "models/__init__.py"]) + \
        "from megatron.bridge.models.deepseek.deepseek_v4_bridge import DeepSeekV4Bridge\n"
    base[B + "models/deepseek/deepseek_v4_bridge.py"] = (
        "from megatron.bridge.models.conversion.model_bridge import MegatronModelBridge\n"
        "from megatron.bridge.models.conversion.param_mapping import AutoMapping\n"
        "from megatron.bridge.models.gpt_provider import GPTModelProvider\n"
        "from megatron.core.models.gpt.experimental_attention_variant_module_specs import (\n"
        "    get_transformer_block_with_experimental_attention_variant_spec as _get_exp_attn_spec,\n"
        ")\n\n\n"
        "@MegatronModelBridge.register_bridge(source=\"DeepseekV4ForCausalLM\")\n"
        "class DeepSeekV4Bridge(MegatronModelBridge):\n"
        "    def provider_bridge(self, hf_config):\n"
        "        provider = GPTModelProvider()\n"
        "        provider.transformer_layer_spec = _get_exp_attn_spec\n"
        "        provider.hidden_size = hf_config.hidden_size\n"
        "        provider.csa_compress_rotary_base = float(hf_config.compress_rope_theta)\n"
        "        return provider\n\n"
        "    def mapping_registry(self):\n"
        "        return [AutoMapping()]\n")
    return base


def test_field_only_families_with_their_own_layers_set_is_custom_layer(tmp_path):
    """A field of the provider that no family with standard layers sets and no shared code reads is a setting of
    the layers Megatron-Core builds from the family's own spec: a change to it involves custom layer behaviour.
    A field standard families set too (`hidden_size`) is no custom-layer change, in the same family."""
    base = _deepseek_with_outside_layer_spec()
    dsv4 = B + "models/deepseek/deepseek_v4_bridge.py"
    own = {dsv4: base[dsv4].replace("float(hf_config.compress_rope_theta)",
                                    "float(getattr(hf_config, 'compress_rope_theta', 160000))")}
    plan = plan_for(tmp_path / "a", own, base=base)
    assert levels(plan) == ["L0", "L4:custom-layer"]
    assert "the change sets csa_compress_rotary_base, which only families with layers of their own set" \
        in render_text(plan)
    standard = {dsv4: base[dsv4].replace("provider.hidden_size = hf_config.hidden_size",
                                         "provider.hidden_size = hf_config.hidden_size * 1")}
    assert levels(plan_for(tmp_path / "b", standard, base=base)) == ["L0"]


def test_method_of_a_generic_base_verl_calls_through_the_provider(tmp_path):
    # `class GPTModelProvider(ModelProviderMixin[MCoreGPTModel])`, as the real provider is declared: the subscript
    # is typing only, the mixin's methods are the provider's, and verl's `provider.provide()` on the family's
    # provider (a subclass of GPTModelProvider, as real families' are) runs the mixin's
    mixin = B + "models/model_provider_mixin.py"
    base = _with_family("tower", "tower_bridge", "TowerBridge", (
        "from megatron.bridge.models.conversion.model_bridge import MegatronModelBridge\n"
        "from megatron.bridge.models.gpt_provider import GPTModelProvider\n\n\n"
        "class TowerProvider(GPTModelProvider):\n    hidden_size = 8\n\n\n"
        "@MegatronModelBridge.register_bridge(source='TowerForCausalLM')\n"
        "class TowerBridge(MegatronModelBridge):\n"
        "    def provider_bridge(self, hf_config):\n        return TowerProvider()\n"))
    for path in (QWEN, OLMOE):  # the only families: GPTModelProvider itself is never built
        base[path] = base[path].replace("GPTModelProvider()", "object()")
    base[mixin] = ("from typing import Generic, TypeVar\n\nModelT = TypeVar('ModelT')\n\n\n"
                   "class ModelProviderMixin(Generic[ModelT]):\n"
                   "    def provide(self):\n        return self.build()\n")
    base[GPT] = ("from megatron.bridge.models.model_provider_mixin import ModelProviderMixin\n\n\n"
                 "class GPTModelProvider(ModelProviderMixin[object]):\n"
                 "    num_moe_experts = None\n\n"
                 "    def finalize(self):\n        self.ready = True\n\n"
                 "    def build(self):\n        return object()\n")
    change = {mixin: base[mixin].replace("return self.build()", "self.built = True\n        return self.build()")}
    plan = plan_for(tmp_path, change, base=base)
    assert levels(plan) == ["L0"]
    assert [u["unit"] for u in reason_units(plan, "verl-runs-it")] == ["ModelProviderMixin.provide"]


@pytest.mark.parametrize("registry, expected", [("AutoConfig", ["L0"]), ("AutoModelForCausalLM", []),
                                                  ("ConfigTable", [])])
def test_config_class_registered_with_transformers_is_built_when_verl_loads(tmp_path, registry, expected):
    # `AutoConfig.register("tower", TowerConfig)` in a bridge module: HF builds TowerConfig when verl's
    # AutoBridge.from_hf_pretrained loads a tower checkpoint, so its __init__ is verl's; handed to an HF model
    # registry (HF builds the class only when the HF model is instantiated, which verl's Megatron path never does)
    # or to a registry of Bridge's own that nothing reads, the class is built by no one
    config = B + "models/tower/configuration_tower.py"
    source = (
        "from transformers import AutoConfig, AutoModelForCausalLM\n"
        "from megatron.bridge.models.conversion.model_bridge import MegatronModelBridge\n"
        "from megatron.bridge.models.gpt_provider import GPTModelProvider\n"
        "from megatron.bridge.models.tower.configuration_tower import TowerConfig\n\n"
        + ("" if registry == "AutoConfig" else "class ConfigTable:\n    @staticmethod\n"
           "    def register(name, cls):\n        pass\n\n\n")
        + f"{registry}.register('tower', TowerConfig)\n\n\n"
        "@MegatronModelBridge.register_bridge(source='TowerForCausalLM')\n"
        "class TowerBridge(MegatronModelBridge):\n"
        "    def provider_bridge(self, hf_config):\n        return GPTModelProvider()\n")
    base = _with_family("tower", "tower_bridge", "TowerBridge", source)
    base[config] = ("from transformers import PretrainedConfig\n\n\n"
                    "class TowerConfig(PretrainedConfig):\n"
                    "    model_type = 'tower'\n\n"
                    "    def __init__(self, **kwargs):\n        super().__init__(**kwargs)\n")
    change = {config: base[config].replace("super().__init__(**kwargs)",
                                           "kwargs.setdefault('rope_theta', 1.0)\n        super().__init__(**kwargs)")}
    plan = plan_for(tmp_path, change, base=base)
    assert levels(plan) == expected
    if expected:
        assert [u["unit"] for u in reason_units(plan, "verl-runs-it")] == ["TowerConfig.__init__"]


@pytest.mark.parametrize("caller, expected", [("mpu", []), ("provider", ["L0"])])
def test_attribute_verl_uses_on_another_librarys_module_is_no_bridge_call(tmp_path, caller, expected):
    # verl's `mpu.initialize_model_parallel(...)` (mpu: megatron.core's) calls Megatron-Core, not the method of the
    # same name on Bridge's provider; `provider.initialize_model_parallel()` on the provider verl built does
    gpt = textwrap.dedent(BRIDGE_BASE[GPT])
    base = {**BRIDGE_BASE, GPT: gpt.replace("    def provide(self):",
                                            "    def initialize_model_parallel(self):\n        self.seed = 1\n\n"
                                            "    def provide(self):")}
    engine = textwrap.dedent(VERL_FILES["verl/workers/engine.py"])
    verl = {**VERL_FILES, "verl/workers/engine.py": "from megatron.core import mpu\n" + engine.replace(
        "    provider.finalize()\n", f"    provider.finalize()\n    {caller}.initialize_model_parallel()\n")}
    change = {GPT: base[GPT].replace("self.seed = 1", "self.seed = 2")}
    assert levels(plan_for(tmp_path, change, verl_files=verl, base=base)) == expected


def test_foreign_names_keep_a_root_a_bridge_import_binds_too():
    from sessions.plan.verl_surface import _foreign_names

    tree = ast.parse("import megatron.core\nimport megatron.bridge\nfrom megatron.core import mpu\n"
                     "import torch.distributed as dist\nfrom verl.utils import helpers\n")
    assert _foreign_names(list(ast.walk(tree))) == {"mpu", "dist"}  # `megatron.bridge.X.y` stays an attribute chain of Bridge's


DATACLASS_LORA = {**BRIDGE_BASE, LORA: """
    from dataclasses import dataclass


    class PEFT:
        pass


    @dataclass
    class LoRA(PEFT):
        dim: int = 8
        normalize_moe_lora: bool = False

        def __call__(self, model):
            return self.transform(model)

        def transform(self, module):
            module.lora_dim = self.dim
            return module
    """}


def test_a_changed_line_behind_a_peft_switch_off_by_default_gets_the_setting_that_runs_it(tmp_path):
    # (Bridge ae9b8c354's shape) the new rank rule runs only with normalize_moe_lora=True, which defaults to False:
    # verl builds the PEFT object from actor_rollout_ref.model.lora through create_peft, so that key sets it
    change = edit(LORA, "module.lora_dim = self.dim",
                  "module.lora_dim = self._effective_dim(module)", DATACLASS_LORA)
    change[LORA] = change[LORA].replace(
        "    def __call__(self, model):",
        "    def _effective_dim(self, module):\n"
        "        if not self.normalize_moe_lora or not getattr(module, 'is_expert', False):\n"
        "            return self.dim\n"
        "        return self.dim // 2\n\n"
        "    def __call__(self, model):")
    plan = plan_for(tmp_path / "off", change, base=DATACLASS_LORA)
    l1 = next(e for e in plan.entries if e.level == 1)
    assert l1.overrides == ["++actor_rollout_ref.model.lora.normalize_moe_lora=True"]
    assert "runs only when normalize_moe_lora=True (its default is False" in l1.settings[0]
    assert "-- ++actor_rollout_ref.model.lora.normalize_moe_lora=True" in render_text(plan)
    l0 = next(e for e in plan.entries if e.level == 0)
    assert l0.overrides == [] and "Level 0 keeps the defaults" in l0.settings[0]  # the smoke stays the default path
    # the same lines behind a switch that is on by default: the defaults run them, nothing to set
    on = {LORA: change[LORA].replace("normalize_moe_lora: bool = False", "normalize_moe_lora: bool = True")}
    on_base = {**DATACLASS_LORA, LORA: DATACLASS_LORA[LORA].replace("normalize_moe_lora: bool = False",
                                                                    "normalize_moe_lora: bool = True")}
    assert all(not e.settings for e in plan_for(tmp_path / "on", on, base=on_base).entries)


def test_a_provider_switch_off_by_default_is_named_without_an_override_it_cannot_vouch_for(tmp_path):
    # a provider field may be set by the family's bridge from the HF config: the plan names the switch, sets nothing
    base = {**BRIDGE_BASE, GPT: "from dataclasses import dataclass\n\n\n@dataclass\nclass GPTModelProvider:\n"
            "    num_moe_experts: int = None\n    fused_norm: bool = False\n\n    def finalize(self):\n"
            "        self.ready = True\n\n    def provide(self):\n        return self.build()\n\n"
            "    def build(self):\n        return object()\n"}
    change = {GPT: base[GPT].replace("        return object()\n",
                                     "        if self.fused_norm:\n            return [object()]\n"
                                     "        return object()\n")}
    plan = plan_for(tmp_path, change, base=base)
    l0 = next(e for e in plan.entries if e.level == 0)
    assert l0.overrides == [] and "runs only when fused_norm=True" in l0.settings[0]
    assert "override_transformer_config" in l0.settings[0]


def _provider_with_load_weights_branch() -> dict[str, str]:
    # Bridge's real shape (AutoBridge.to_megatron_provider): what runs only when weights are loaded through the
    # provider sits under `if load_weights:`
    base = dict(BRIDGE_BASE)
    base.update(edit(AUTO, """
        def to_megatron_provider(self, hf_config):
            return self._model_bridge.provider_bridge(hf_config)
        """, """
        def to_megatron_provider(self, hf_config, load_weights=True):
            provider = self._model_bridge.provider_bridge(hf_config)
            if load_weights:
                provider.perform_initialization = False
            return provider
        """))
    return base


def _initialization_kept(base: dict[str, str]) -> dict[str, str]:
    # e7d349a35's edit: the one line under `if load_weights:`
    return edit(AUTO, "provider.perform_initialization = False", "provider.perform_initialization = True", base)


def _verl_calling_provider(arguments: str) -> dict[str, str]:
    engine = textwrap.dedent(VERL_FILES["verl/workers/engine.py"]).replace(
        "bridge.to_megatron_provider(hf_config)", f"bridge.to_megatron_provider({arguments})")
    assert arguments in engine
    return {**VERL_FILES, "verl/workers/engine.py": engine}


@pytest.mark.parametrize(("arguments", "runs"), [
    ("hf_config, load_weights=False", False),  # verl's real call: the branch never runs in verl
    ("hf_config, False", False),  # the same, positional
    ("hf_config", True),  # the default takes the branch
    ("hf_config, load_weights=flag", True),  # computed: it may
    ("hf_config, **options", True),  # spread: any parameter may be bound
])
def test_a_branch_verls_every_call_skips_justifies_no_level(tmp_path, arguments, runs):
    base = _provider_with_load_weights_branch()
    change = _initialization_kept(base)
    plan = plan_for(tmp_path, change, _verl_calling_provider(arguments), base=base)
    assert bool(levels(plan)) == runs, levels(plan)
    skipped = [n for n in plan.notes if "load_weights=False" in n and "run only with load_weights true" in n]
    assert bool(skipped) != runs, plan.notes
    assert not any("not on verl's path" in n for n in plan.notes)  # verl runs the function: it is on the path


def test_a_bridge_caller_on_verls_path_that_passes_its_own_parameter_may_take_the_branch(tmp_path):
    base = _provider_with_load_weights_branch()
    base.update(edit(AUTO, "def load_hf_weights(self, model, weights):", """
        def load_hf_weights(self, model, weights, load=True):
            self.to_megatron_provider(None, load)""", base))
    change = _initialization_kept(base)
    plan = plan_for(tmp_path, change, _verl_calling_provider("hf_config, load_weights=False"), base=base)
    assert levels(plan), plan.notes  # verl's load_hf_weights reaches it with a value verl does not show


def test_a_function_verl_hands_on_as_a_value_may_take_the_branch(tmp_path):
    base = _provider_with_load_weights_branch()
    change = _initialization_kept(base)
    verl = _verl_calling_provider("hf_config, load_weights=False")
    verl["verl/workers/engine.py"] += "\n\ndef provider_factory(bridge):\n    return bridge.to_megatron_provider\n"
    assert levels(plan_for(tmp_path, change, verl, base=base))  # called elsewhere, with arguments not shown


_PLAN_IN_A_CHILD = """
import json, sys
from sessions.plan import rules as plan_rules
from sessions.plan.planner import analyse, read_change, recommend
change = read_change(sys.argv[1], "main")
print(json.dumps(recommend(change, analyse(change, sys.argv[2])).to_json(), sort_keys=True))
"""


def test_a_plan_comes_out_the_same_under_every_hash_seed(tmp_path):
    # family code several bridges use: the families that reach it come from sets, whose order follows the
    # interpreter's string hash; the plan (text and JSON) must not
    base = dict(BRIDGE_BASE)
    base[B + "models/qwen/rope.py"] = "def rope_scale(hf_config):\n    return hf_config.rope_theta\n"
    base[B + "models/__init__.py"] += "from megatron.bridge.models.llama.llama_bridge import LlamaBridge\n"
    base[B + "models/llama/__init__.py"] = ""
    base[B + "models/llama/llama_bridge.py"] = base[QWEN].replace("Qwen3", "Llama")
    for rel in (QWEN, OLMOE, B + "models/llama/llama_bridge.py"):
        base.update(edit(rel, "return provider", """
            from megatron.bridge.models.qwen.rope import rope_scale

            provider.rotary_base = rope_scale(hf_config)
            return provider""", base))
    bridge = bridge_history(tmp_path, {B + "models/qwen/rope.py": "def rope_scale(hf_config):\n"
                                                                  "    return hf_config.rope_theta * 2\n"}, base)
    verl = verl_checkout(tmp_path)
    outputs = set()
    for seed in ("0", "1", "2", "3", "4", "5"):
        proc = subprocess.run([sys.executable, "-c", _PLAN_IN_A_CHILD, str(bridge), str(verl)], capture_output=True,
                              text=True, cwd=ROOT, env={**os.environ, "PYTHONHASHSEED": seed}, timeout=300)
        assert proc.returncode == 0, proc.stderr
        outputs.add(proc.stdout)
    assert len(outputs) == 1, "the plan depends on the hash seed"
    text = outputs.pop()
    assert all(name in text for name in ("Qwen3Bridge", "OlmoeBridge", "LlamaBridge")), text  # all three reach it


def test_a_default_in_the_body_of_a_base_of_a_provider_verl_builds_is_a_provider_change(tmp_path):
    # Bridge 6ef001d6b: MambaProvider's dataclass default changed, and verl builds its subclass
    # NemotronHModelProvider; a base class nobody constructs itself still gives every instance of its subclass
    # the values its body sets
    base = dict(BRIDGE_BASE)
    base.update(edit(GPT, "class GPTModelProvider:", "class ProviderDefaults:\n    seq_length = 2048\n\n\n"
                                                     "class GPTModelProvider(ProviderDefaults):", base))
    change = edit(GPT, "seq_length = 2048", "seq_length = 4096", base)
    assert levels(plan_for(tmp_path, change, base=base)) == ["L0"]


def test_a_default_in_the_body_of_a_class_only_imported_justifies_no_level(tmp_path):
    # the same base, used by no class verl builds: its module is imported, its body's values reach no instance
    base = dict(BRIDGE_BASE)
    base[GPT] = base[GPT] + "\n\nclass UnusedDefaults:\n    seq_length = 2048\n"
    change = edit(GPT, "seq_length = 2048", "seq_length = 4096", base)
    assert levels(plan_for(tmp_path, change, base=base)) == []


def _hybrid_family_in_a_shared_folder(with_bridge: bool) -> dict[str, str]:
    # models/mamba is shared model code (the Mamba base provider); before NemotronH moved to models/nemotronh
    # (Bridge 6ef001d6b) its bridge sat beside that provider
    base = dict(BRIDGE_BASE)
    base[B + "models/mamba/__init__.py"] = ""
    base[B + "models/mamba/mamba_provider.py"] = textwrap.dedent("""
        from megatron.bridge.models.gpt_provider import GPTModelProvider


        class MambaProvider(GPTModelProvider):
            mamba_num_heads = 8
        """)
    base[B + "models/mamba/nemotron_h_provider.py"] = textwrap.dedent("""
        from megatron.bridge.models.mamba.mamba_provider import MambaProvider


        class NemotronHModelProvider(MambaProvider):
            hybrid_override_pattern = "M-M-"
        """)
    bridge_at = B + ("models/mamba/" if with_bridge else "models/nemotronh/") + "nemotron_h_bridge.py"
    base[bridge_at] = base[QWEN].replace("Qwen3ForCausalLM", "NemotronHForCausalLM").replace(
        "Qwen3Bridge", "NemotronHBridge").replace("provider = GPTModelProvider()", "provider = NemotronHModelProvider()"
    ).replace("from megatron.bridge.models.gpt_provider import GPTModelProvider",
              "from megatron.bridge.models.mamba.nemotron_h_provider import NemotronHModelProvider")
    if not with_bridge:
        base[B + "models/nemotronh/__init__.py"] = ""
    module = bridge_at[len("src/"):-len(".py")].replace("/", ".")
    base[B + "models/__init__.py"] += f"from {module} import NemotronHBridge\n"
    return base


@pytest.mark.parametrize("with_bridge", [True, False])
def test_a_base_provider_in_shared_model_code_serves_the_family_that_builds_it(tmp_path, with_bridge):
    base = _hybrid_family_in_a_shared_folder(with_bridge)
    change = edit(B + "models/mamba/mamba_provider.py", "mamba_num_heads = 8", "mamba_num_heads = 16", base)
    plan = plan_for(tmp_path, change, base=base)
    assert levels(plan)[0] == "L0"
    l0 = next(e for e in plan.entries if e.key == "L0").to_json()
    # beside a bridge, the folder is that family's; alone, a base provider is shared framework code (families
    # derive from it, none calls it): every family verl can load through it
    assert l0["families"] == (["NemotronHBridge"] if with_bridge else ["all families"]), l0["families"]
    # the run takes that family's checkpoint (the family folder named as its bridge module is), not the default
    # dense model; shared framework code takes the default one
    nemotron_h = next(f for f in plan_rules.FAMILIES if f.folder == "nemotronh").dense
    assert l0["model"] == (nemotron_h if with_bridge else plan_rules.GENERIC_DENSE), l0["model"]


@pytest.mark.parametrize("callee, parallel", [("gather_from_tp_ranks", True), ("renamed_copy", False)])
def test_a_changed_value_passed_to_a_parallel_call_is_level2(tmp_path, callee, parallel):
    # Bridge 92955f30e: `config = remove_non_pickleables(config)` before the unchanged
    # `self.broadcast_obj_from_pp_rank(config)`: what the PP broadcast sends changed, although no changed line
    # names a parallel size; the same edit whose value goes to a call about nothing parallel is no Level 2
    base = dict(BRIDGE_BASE)
    base.update(edit(MAPPING, "def megatron_to_hf(self, weights):\n    return self.gather_from_tp_ranks(weights)",
                     f"def megatron_to_hf(self, weights):\n    return self.{callee}(weights)\n\n"
                     "def renamed_copy(self, weights):\n    return weights"))
    change = edit(MAPPING, f"return self.{callee}(weights)",
                  f"weights = dict(weights)\nreturn self.{callee}(weights)", base)
    got = levels(plan_for(tmp_path, change, base=base))
    assert ("L2d" in got) == parallel, got
