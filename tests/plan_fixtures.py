"""Small fixture histories for the planner: a Megatron-Bridge-shaped source tree (the real layout and the real
kinds of wiring: a package `__init__` that imports every model, a decorator registry of bridges, mapping classes
whose `megatron_to_hf` gathers across ranks, PEFT loaded by name, a checkpointing module verl takes three
functions from, Bridge's own training loop) and a verl-shaped checkout that imports and calls it the way verl does.

`bridge_history(root, change)` commits the base on `main`, then `change` (path → text, None deletes) on a
`feature` branch; tests plan that branch against main.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.fixtures.repos import _init  # one way to start a fixture repo

B = "src/megatron/bridge/"

BRIDGE_BASE: dict[str, str] = {
    B + "__init__.py": """
        import megatron.bridge.models  # registers every bridge
        from megatron.bridge.models.conversion.auto_bridge import AutoBridge
        """,
    B + "models/__init__.py": """
        from megatron.bridge.models.gpt_provider import GPTModelProvider
        from megatron.bridge.models.qwen.qwen3_bridge import Qwen3Bridge
        from megatron.bridge.models.olmoe.olmoe_bridge import OlmoeBridge
        """,
    B + "models/gpt_provider.py": """
        from megatron.core import parallel_state


        class GPTModelProvider:
            num_moe_experts = None

            def finalize(self):
                self.ready = True

            def provide(self):
                return self.build()

            def build(self):
                return object()
        """,
    B + "models/conversion/__init__.py": "",
    B + "models/conversion/model_bridge.py": """
        _REGISTRY = {}


        def get_model_bridge(architecture):
            return _REGISTRY[architecture]()


        class MegatronModelBridge:
            @classmethod
            def register_bridge(cls, source):
                def deco(bridge):
                    _REGISTRY[source] = bridge
                    return bridge
                return deco

            def provider_bridge(self, hf_config):
                raise NotImplementedError

            def mapping_registry(self):
                raise NotImplementedError

            def load_weights_hf_to_megatron(self, model, weights):
                for mapping in self.mapping_registry():
                    mapping.hf_to_megatron(weights)

            def stream_weights_megatron_to_hf(self, model):
                for mapping in self.mapping_registry():
                    yield mapping.megatron_to_hf(model)
        """,
    B + "models/conversion/param_mapping.py": """
        class MegatronParamMapping:
            def hf_to_megatron(self, weights):
                return weights

            def megatron_to_hf(self, weights):
                return self.gather_from_tp_ranks(weights)

            def gather_from_tp_ranks(self, weights):
                if self.tp_size == 1:  # the real mappings gather only across more than one rank
                    return weights
                return [weights]

            def gather_from_ep_ranks(self, weights):
                if self.ep_size == 1:
                    return weights
                return [weights][:1]


        class AutoMapping(MegatronParamMapping):
            pass


        class QKVMapping(MegatronParamMapping):
            def head_sizes(self, config):
                # the real QKV mappings split by the model config's sizes (param_mapping.py reads them the same way)
                head_num = config.num_attention_heads
                return head_num, config.kv_channels or (config.hidden_size // head_num)


        class ExpertMapping(MegatronParamMapping):
            def megatron_to_hf(self, weights):
                return self.gather_from_ep_ranks(weights)
        """,
    B + "models/conversion/auto_bridge.py": """
        from megatron.bridge.models.conversion import model_bridge


        class AutoBridge:
            def __init__(self, architecture):
                self.architecture = architecture

            @property
            def _model_bridge(self):
                return model_bridge.get_model_bridge(self.architecture)

            def to_megatron_provider(self, hf_config):
                return self._model_bridge.provider_bridge(hf_config)

            def load_hf_weights(self, model, weights):
                self._model_bridge.load_weights_hf_to_megatron(model, weights)

            def export_hf_weights(self, model):
                return list(self._model_bridge.stream_weights_megatron_to_hf(model))

            def save_megatron_model(self, model, path):
                from megatron.bridge.training.checkpointing import save_checkpoint

                save_checkpoint(model, path)
        """,
    B + "models/qwen/__init__.py": "",
    B + "models/qwen/qwen3_bridge.py": """
        from megatron.bridge.models.conversion.model_bridge import MegatronModelBridge
        from megatron.bridge.models.conversion.param_mapping import AutoMapping
        from megatron.bridge.models.gpt_provider import GPTModelProvider


        @MegatronModelBridge.register_bridge(source="Qwen3ForCausalLM")
        class Qwen3Bridge(MegatronModelBridge):
            def provider_bridge(self, hf_config):
                provider = GPTModelProvider()
                provider.hidden_size = hf_config.hidden_size
                return provider

            def mapping_registry(self):
                return [AutoMapping()]
        """,
    B + "models/olmoe/__init__.py": "",
    B + "models/olmoe/olmoe_bridge.py": """
        from megatron.bridge.models.conversion.model_bridge import MegatronModelBridge
        from megatron.bridge.models.conversion.param_mapping import AutoMapping, ExpertMapping
        from megatron.bridge.models.gpt_provider import GPTModelProvider


        @MegatronModelBridge.register_bridge(source="OlmoeForCausalLM")
        class OlmoeBridge(MegatronModelBridge):
            def provider_bridge(self, hf_config):
                provider = GPTModelProvider()
                provider.num_moe_experts = hf_config.num_experts
                return provider

            def mapping_registry(self):
                return [AutoMapping(), ExpertMapping()]
        """,
    B + "peft/__init__.py": "",
    B + "peft/utils.py": """
        from importlib import import_module

        PEFT_CLASSES = {"lora": ("megatron.bridge.peft.lora", "LoRA")}


        def create_peft(config):
            module_name, class_name = PEFT_CLASSES[config["type"]]
            return getattr(import_module(module_name), class_name)(config)
        """,
    B + "peft/lora.py": """
        class LoRA:
            def __init__(self, config):
                self.dim = config.get("dim", 8)

            def __call__(self, model):
                return self.transform(model)

            def transform(self, module):
                return module
        """,
    B + "training/__init__.py": "",
    B + "training/checkpointing.py": """
        def save_fsdp_dtensor_checkpoint(state_dict, path):
            return _write(state_dict, path)


        def _write(state_dict, path):
            return path


        def save_checkpoint(model, path, ckpt_format="torch_dist"):
            if ckpt_format == "fsdp_dtensor":
                return _write({}, path)
            return _write({"model": model}, path)
        """,
    B + "training/config.py": """
        from megatron.bridge.training.flex_dispatcher_backend import validate_flex_dispatcher_backend


        class DistributedDataParallelConfig:
            overlap_grad_reduce = False


        class ConfigContainer:
            def validate(self):
                validate_flex_dispatcher_backend(self.model)
        """,
    B + "training/flex_dispatcher_backend.py": """
        def validate_flex_dispatcher_backend(model_config):
            if model_config.moe_token_dispatcher_type == "flex":
                return True
            return False
        """,
    B + "training/train.py": """
        from megatron.bridge.training.checkpointing import save_checkpoint


        def train(model, steps):
            for step in range(steps):
                model.step()
            save_checkpoint(model, "out")
        """,
    "tests/unit_tests/test_lora.py": "def test_lora():\n    assert True\n",
    "pyproject.toml": "[project]\nname = 'megatron-bridge'\n",
}

VERL_FILES: dict[str, str] = {
    "verl/models/mcore/bridge.py": """
        from megatron.bridge import AutoBridge
        from megatron.bridge.training.config import DistributedDataParallelConfig
        """,
    "verl/workers/engine.py": """
        from verl.models.mcore.bridge import AutoBridge


        def build(hf_config, model, weights):
            bridge = AutoBridge("Qwen3ForCausalLM")
            provider = bridge.to_megatron_provider(hf_config)
            provider.finalize()
            model = provider.provide()
            bridge.load_hf_weights(model, weights)
            return model


        def sync_weights(bridge, model):
            return bridge.export_hf_weights(model)
        """,
    "verl/workers/peft.py": """
        def peft(config):
            from megatron.bridge.peft.utils import create_peft

            return create_peft(config)
        """,
    "verl/utils/checkpoint.py": """
        def save(state_dict, path):
            from megatron.bridge.training.checkpointing import save_fsdp_dtensor_checkpoint

            return save_fsdp_dtensor_checkpoint(state_dict, path)
        """,
    "tests/test_uses_train.py": "from megatron.bridge.training.train import train  # verl's tests do not count\n",
}


def _write(root: Path, files: dict[str, str | None]) -> None:
    for rel, text in files.items():
        path = root / rel
        if text is None:
            path.unlink()
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))


def verl_checkout(root: Path, files: dict[str, str] | None = None) -> Path:
    path = root / "verl"
    _write(path, files if files is not None else VERL_FILES)
    repo = _init(path)
    repo.git.add("-A")
    repo.index.commit("verl fixture")
    return path


def bridge_history(root: Path, change: dict[str, str | None], base: dict[str, str] | None = None) -> Path:
    """A Bridge repo: the base on main, `change` committed on branch feature (checked out)."""
    path = root / "Megatron-Bridge"
    _write(path, base if base is not None else BRIDGE_BASE)
    repo = _init(path)
    repo.git.add("-A")
    repo.index.commit("Bridge fixture")
    repo.git.checkout("-b", "feature")
    if change:
        _write(path, change)
        repo.git.add("-A")
        repo.index.commit("change")
    return path


def edit(rel: str, old: str, new: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """The base file `rel` with the lines `old` replaced by `new`, at the indentation `old` has in the file."""
    lines = textwrap.dedent((base or BRIDGE_BASE)[rel]).lstrip("\n").splitlines()
    old_lines = textwrap.dedent(old).strip("\n").splitlines()
    new_lines = textwrap.dedent(new).strip("\n").splitlines()
    for i in range(len(lines) - len(old_lines) + 1):
        indent = lines[i][:len(lines[i]) - len(lines[i].lstrip())]
        if [x.strip() for x in lines[i:i + len(old_lines)]] == [x.strip() for x in old_lines] and \
                lines[i].lstrip() == old_lines[0].lstrip():
            out = lines[:i] + [(indent + x) if x else x for x in new_lines] + lines[i + len(old_lines):]
            return {rel: "\n".join(out) + "\n"}
    raise AssertionError(f"{old!r} not in {rel}")
