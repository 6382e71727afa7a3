"""What a traceback frame says about where a failure happened: small tables, read by structure.py and evidence.py.

A frame's file path is first reduced to its module path (`verl/workers/fsdp_workers.py`,
`vllm/v1/engine/core.py`) whatever the install prefix: a conda env or a checkout folder named `vllm`, `megatron` or
`datasets` must not make every frame under it look like that package. Then:

- MODULE_CATEGORIES: the module path -> a category (the package of the frame: provider, rollout, data, ...);
- FUNCTION_AREAS: the function of a verl frame -> an area of verl's loop (the same areas as the Ray methods in
  structure.py): a driver traceback or frames relayed by the TaskRunner name `_load_checkpoint`, `_build_rollout`,
  `create_rl_dataset` even where no `ray::Worker.method()` line is shown.
"""

from __future__ import annotations

import re
from functools import lru_cache

from sessions.judge.literals import required_words

# Outside site-/dist-packages only the packages people run from source checkouts start a module path (a folder
# `/data/datasets/` holding a user's reward function is no `datasets` frame); inside, the tail is the module path.
SOURCE_ROOTS = ("verl", "megatron", "mbridge", "vllm", "sglang", "transformers", "tensorrt_llm")
# verl's own subpackages: the rightmost `verl/` followed by one of them starts the module path (`/root/verl/verl/...`,
# `/_work/verl/verl/verl/...`, a Ray working_dir copy)
VERL_SUBPACKAGES = (
    "workers", "trainer", "utils", "single_controller", "models", "experimental", "checkpoint_engine", "third_party",
    "model_merger", "tools", "interactions", "protocol.py", "recipe",
)
# site-/dist-packages, or a redacted prefix (`<stack>/torch/...`, `<verl>/verl/...`)
_SITE_RE = re.compile(r"^(?:.*/(?:site|dist)-packages/|<[\w.-]+>/)(?:[^/]+\.egg/)?")
# greedy `(?:.*/)?`: the rightmost `verl/<subpackage>` (a checkout's `verl/verl/...`)
_VERL_RE = re.compile(r"^(?:.*/)?(verl/(?:{})\b.*)$".format("|".join(map(re.escape, VERL_SUBPACKAGES))))
_SOURCE_RE = re.compile(r"(?:^|/)((?:{})/.*)$".format("|".join(SOURCE_ROOTS)))


def module_path(path: str) -> str | None:
    """`/opt/conda/envs/vllm/lib/python3.10/site-packages/torch/distributed/x.py` -> `torch/distributed/x.py`;
    `/root/verl/verl/workers/fsdp_workers.py` -> `verl/workers/fsdp_workers.py`; None: no known package."""
    path = path.replace("\\", "/")
    site = _SITE_RE.match(path)
    if site:
        tail = path[site.end():]
        verl = _VERL_RE.match(tail)
        return verl.group(1) if verl else tail  # an installed package: its own name starts the tail
    verl = _VERL_RE.match(path)
    if verl:
        return verl.group(1)
    found = _SOURCE_RE.search(path)
    return found.group(1) if found else None


# (b) module path -> category; the first row that matches wins (specific before general).
MODULE_CATEGORIES = tuple((re.compile(rx), category) for rx, category in (
    # the actor -> rollout weight transfer (verl's side of the export boundary)
    (r"^verl/workers/sharding_manager/|^verl/checkpoint_engine/|^verl/.*(?:weight_transfer|weight_sync)", "weight-sync"),
    (r"^verl/utils/checkpoint/|^verl/model_merger/|^verl/scripts/model_merger|dist_checkpointing|"
     r"^torch/distributed/checkpoint/|^safetensors/|^megatron/(?:training|bridge/training)/checkpointing", "checkpoint"),
    (r"^verl/workers/reward_manager/|^verl/workers/reward_model/|^verl/utils/reward_score/|^verl/trainer/ppo/reward|"
     r"^verl/experimental/reward|^math_verify/", "reward-model"),
    (r"^verl/utils/dataset(?:/|\.py$)|^verl/experimental/(?:dynamic_)?dataset/|^datasets/|^pyarrow/", "data"),
    (r"^verl/workers/config/|^verl/trainer/config/|^omegaconf/", "config"),
    # the model provider: Megatron-Bridge, mbridge, verl's own mcore model registry, builders and weight loaders
    # (not verl's forward glue in verl/models/mcore/: model_forward*, util, patches run in training)
    (r"^megatron/bridge/|^mbridge/|^verl/models/mcore/(?!model_forward|util\.py|patch\.py|mtp_patch)|"
     r"^verl/models/\w+/megatron/|"
     r"^verl/models/(?:registry|weight_loader_registry)\.py", "provider"),
    (r"^megatron/core/|^mindspeed(?:_llm)?/", "megatron-core"),  # MindSpeed: Megatron core on Ascend
    (r"^(?:vllm|vllm_ascend|sglang|sgl_kernel|tensorrt_llm)/|^verl/workers/rollout/|^verl/.*agent_loop|^verl/third_party/(?:vllm|sglang)|"
     r"^verl/utils/(?:vllm|sglang)|^verl/tools/|^verl/interactions/", "rollout"),
    # collectives and rendezvous (FSDP's own torch.distributed modules are not collectives)
    (r"^torch/distributed/(?:distributed_c10d|c10d_logger|rendezvous|_functional_collectives)|"
     r"^torch_npu/distributed/|^deep_ep/|/gloo|nccl|hccl", "nccl"),
))

SHARDING_MANAGERS = "verl/workers/sharding_manager/"
# (a) for frames: the function of a verl frame -> area. Only verl's own frames: `update_weights` in vLLM is vLLM's.
FUNCTION_AREAS = tuple((re.compile(rx), area) for rx, area in (
    (r"^(?:update_weights|sync_weights|update_params|rollout_mode|sync_rollout_weights|send_weights|"
     r"receive_weights|async_send_weights|_update_weights\w*|_sync_\w*weights|update_weights_from_\w+)$",
     "weight-sync"),
    # (HF weights and adapters saved with a checkpoint: verl's checkpoint managers call save_weights /
    # save_pretrained / save_hf_adapter; loading HF weights is the model build's, not a checkpoint's)
    (r"^_?(?:save|load)_checkpoint$|^load_pretrained_model$|^save_(?:weights|hf_weights|pretrained|hf_adapter|"
     r"lora_adapter)$", "checkpoint"),
    # (`reward_fn` / `val_reward_fn`: the reward managers the trainer calls in fit() and _validate())
    (r"^(?:compute_rm_score|compute_reward\w*|_compute_reward\w*|compute_score\w*|load_reward_manager|"
     r"get_custom_reward_fn|reward_fn|val_reward_fn)$", "reward"),
    (r"^(?:create_rl_dataset|create_rl_sampler|_create_dataloader|_read_files_and_tokenize)$", "data"),
    (r"^(?:_?validate_config|check_mutually_exclusive|omega_conf_to_dataclass)$", "config"),
    (r"^(?:_check_resource_available|create_resource_pool|get_placement_groups)$",
     "resources"),
    (r"^(?:_build_rollout|init_rollout|launch_servers?|_init_inference_engine|init_engine|generate_sequences|"
     r"_generate\w*|wake_up)$", "rollout"),
    (r"^(?:_build_model_optimizer|_build_critic_model_optimizer|_build_rm_model|_build_model|"
     r"make_megatron_module|init_model)$", "model-build"),
    (r"^(?:update_actor|update_policy|update_critic|compute_log_prob|compute_ref_log_prob|compute_values|"
     r"train_batch|train_mini_batch|infer_batch|forward_backward_batch)$", "training"),
))


# A frame's statement (the source line printed under it) names the function it calls, which is the next frame:
# where a traceback is cut (a paste, a truncated log) right after a verl frame, the function its statement calls
# names the area the way that next frame would (`train_dataset = create_rl_dataset(...)` in TaskRunner.run: data).
CALL_RE = re.compile(r"([A-Za-z_]\w*)\s*\(")


def _call_needles() -> tuple[str, ...]:
    """`name(` for each whole function name FUNCTION_AREAS names: a statement calling one holds it (the prefilter
    feeds such lines; the names come from the table, as ripgrep derives its literals)."""
    names = set()
    for function_re, _ in FUNCTION_AREAS:
        for words in required_words(function_re.pattern) or ():
            names.update(w for w in words if function_re.fullmatch(w))
    return tuple(sorted(f"{name}(" for name in names))


CALL_NEEDLES = _call_needles()


def called_area(frame_path: str | None, statement: str) -> str | None:
    """The area of the first function with one that a verl frame's statement calls (None: none named)."""
    if frame_path is None:
        return None
    for name in CALL_RE.findall(statement):
        area = frame_area(frame_path, name)
        if area:
            return area
    return None


# A call that does not fit the callee's signature names the callee: where the error was raised is its call, as a
# frame of that function would say (a paste that kept only the exception line: `TypeError: Bridge.save_weights()
# got an unexpected keyword argument ...`, an API mismatch between verl and the package it calls)
SIGNATURE_ERROR_RE = re.compile(
    r"TypeError: (?:[\w.]+\.)?(\w+)\(\) (?:got an unexpected keyword argument|missing \d+ required|takes \d+|"
    r"got multiple values)")


def callee_area(text: str) -> str | None:
    """The area of the function a signature TypeError names (None: no such error, or a function of no area)."""
    match = SIGNATURE_ERROR_RE.search(text) if "TypeError" in text else None
    if match is None:
        return None
    return function_area(match.group(1))


def function_area(function: str) -> str | None:
    """The area of verl's loop a function's name says (FUNCTION_AREAS; None: none)."""
    return next((area for function_re, area in FUNCTION_AREAS if function_re.search(function)), None)


@lru_cache(maxsize=4096)  # a traceback's paths repeat (every rank, every echo of the chain)
def classify_frame(path: str, function: str | None) -> tuple[str | None, str | None]:
    """(frame_category, frame_area) of one frame line."""
    return frame_category(path, function), frame_area(path, function)


# functions of Megatron core that run a built model: its frames say nothing about the provider
RUNNING_RE = re.compile(r"_?forward|backward|forward_backward|custom_forward|checkpointed_forward|"
                        r"(?:train|optimizer)_step|step$")


# the function that makes a process's accelerator usable: an exception raised in it means the process has none it
# can use (no driver, no visible device, a torch built without CUDA) — the environment, wherever it was called from
DEVICE_INIT_FRAMES = {("torch/cuda/__init__.py", "_lazy_init"), ("torch_npu/npu/__init__.py", "_lazy_init")}


# a rollout engine's functions that exist only to receive the trainer's weights (SGLang's update API): a frame of
# one is the engine's side of verl's weight push, not its generation (its own model loading is `load_weights`)
ROLLOUT_ENGINE_RE = re.compile(r"^(?:vllm|sglang)/")
WEIGHT_RECEIVER_RE = re.compile(r"^update_weights_from_(?:tensor|distributed|ipc)")


def frame_category(path: str, function: str | None = None) -> str | None:
    """The category of a frame's package (None: the frame says nothing)."""
    module = module_path(path)
    if module is None:
        return None
    if (module, function) in DEVICE_INIT_FRAMES:
        return "env-no-gpu"
    for module_re, category in MODULE_CATEGORIES:
        if module_re.search(module):
            if category == "megatron-core" and function and RUNNING_RE.match(function):
                return None  # Megatron core running the model (forward, schedules), not building it
            if function == "__exit__" and module.startswith(SHARDING_MANAGERS):
                # a sharding manager pushes the weights on __enter__; its __exit__ puts the engine to sleep and
                # frees its cache after generation: the rollout side, no weight transfer
                return "rollout"
            return category
    return None


def frame_area(path: str, function: str | None) -> str | None:
    """The area of verl's loop a verl frame's function names (None: not a verl frame, or a function of no area); of
    a rollout engine's frames, only those receiving the trainer's weights name one (WEIGHT_RECEIVER_RE)."""
    if not function:
        return None
    module = module_path(path)
    if module is None:
        return None
    if ROLLOUT_ENGINE_RE.match(module):
        return "weight-sync" if WEIGHT_RECEIVER_RE.match(function) else None
    if not module.startswith("verl/"):
        return None
    return function_area(function)


# a raise statement formatting an attribute of the run's config object (`{self.config.optim.lr_scheduler}`,
# `config["rollout"]`); `model_config`/`hf_config` are the model's, not the run's settings
_CONFIG_READ_RE = re.compile(r"(?<![\w.])(?:self\.)?(?:config|cfg)(?:\.\w|\[)")


def raises_a_config_value(source_line: str, frame_path: str | None) -> bool:
    """The innermost frame's own source line raises with a value read from the run's configuration, in verl's code
    (a Bridge or Megatron provider reading `self.config` reads the model's TransformerConfig: not this)."""
    if frame_path is None or not _CONFIG_READ_RE.search(source_line):
        return False
    module = module_path(frame_path)
    return module is not None and module.startswith("verl/")
