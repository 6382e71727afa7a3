"""Every user setting in one table, resolved flag > environment > invoke.yaml > default.

A task passes its flags (None = not given); `resolve` returns the value of each setting together with where it
came from, so reports can say "MODEL_PATH (from env)" and dry-runs can show why a value was chosen.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class UsageError(Exception):
    """Bad invocation: printed as one line, exit code 2."""


@dataclass(frozen=True)
class Setting:
    name: str  # flag / invoke.yaml key (snake_case)
    env: str | None  # environment variable, None when flag/config only
    default: Any
    help: str
    kind: str = "str"  # str | path | int | float | bool


SETTINGS: tuple[Setting, ...] = (
    Setting("bridge_repo", "BRIDGE_REPO", None, "Megatron-Bridge checkout under test", "path"),
    Setting("verl_repo", "VERL_REPO", None, "verl checkout whose wrapper and package run the test", "path"),
    Setting("model_id", "MODEL_ID", "Qwen/Qwen2.5-0.5B", "HF model id (ORG/NAME)"),
    Setting("model_path", "MODEL_PATH", None, "local HF checkpoint (default: the wrapper's $HOME/models/$MODEL_ID)", "path"),
    Setting("train_files", "TRAIN_FILES", "~/data/gsm8k/train.parquet", "GSM8K train parquet", "path"),
    Setting("val_files", "VAL_FILES", "~/data/gsm8k/test.parquet", "GSM8K validation parquet", "path"),
    Setting("rm_model_path", "RM_MODEL_PATH", "~/models/Skywork/Skywork-Reward-V2-Llama-3.2-1B",
            "reward model checkpoint (absent: the run disables the reward model)", "path"),
    Setting("hf_home", "HF_HOME", None, "Hugging Face home (put it on scratch when $HOME is small)", "path"),
    Setting("scratch", "SCRATCH_DIR", None, "scratch root for model downloads (default: $HF_HOME/.. or ~/models)", "path"),
    Setting("log_dir", "LOG_DIR", "./verl_e2e_logs", "where run directories are written", "path"),
    Setting("gsm8k_dir", "GSM8K_DIR", "~/data/gsm8k", "output folder of prep-data", "path"),
    Setting("gsm8k_source", "GSM8K_SOURCE_DIR", None, "local raw copy of openai/gsm8k (used only if it exists)", "path"),
    # verl's stable vLLM image (docker/README.md of verl-project/verl, 2026-03: vllm==0.17.0); a moving tag
    Setting("verl_image", "VERL_IMAGE", "verlai/verl:vllm017.latest", "verl container image (vLLM flavour)"),
    Setting("num_gpus", "NUM_GPUS", None, "GPUs for the run (default: detected)", "int"),
    Setting("ray_address", "RAY_ADDRESS", None, "attach to this Ray cluster instead of a throwaway one"),
    Setting("stall_timeout", "STALL_TIMEOUT_MIN", 30.0, "minutes without output while running before it is stopped", "float"),
    Setting("modelopt_index_url", "MODELOPT_INDEX_URL", "https://pypi.nvidia.com", "extra index for nvidia-modelopt"),
    Setting("python", "VERL_PYTHON", None, "Python that runs verl (default: python3 on PATH)", "path"),
    Setting("ray_probe", "VERL_E2E_RAY_PROBE", True,
            "preflight 3: ask a Ray worker which megatron.bridge it imports (starts Ray when no --ray-address)", "bool"),
    Setting("verbose", "VERL_E2E_VERBOSE", False, "stream the whole verl log to the terminal, not a status line", "bool"),
)

BY_NAME = {s.name: s for s in SETTINGS}


@dataclass(frozen=True)
class Resolved:
    values: dict[str, Any]
    sources: dict[str, str]  # name -> flag | env | invoke.yaml | default

    def __getattr__(self, name: str) -> Any:
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(name) from None

    def source(self, name: str) -> str:
        return self.sources[name]

    def as_env(self) -> dict[str, str]:
        """The settings that have an environment variable, as strings (unset ones left out)."""
        out = {}
        for s in SETTINGS:
            v = self.values.get(s.name)
            if s.env and v is not None:
                out[s.env] = str(v)
        return out


def _convert(setting: Setting, raw: Any) -> Any:
    if raw is None:
        return None
    try:
        if setting.kind == "path":
            return Path(os.path.expandvars(os.path.expanduser(str(raw)))).absolute()
        if setting.kind == "int":
            return int(raw)
        if setting.kind == "float":
            return float(raw)
        if setting.kind == "bool":
            return str(raw).strip().lower() in ("1", "true", "yes", "on")
    except ValueError:
        raise UsageError(f"{setting.env or setting.name}={raw!r} is not a valid {setting.kind}") from None
    return str(raw)


def resolve(
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    config: Mapping[str, Any] | None = None,
) -> Resolved:
    """flag > environment > invoke.yaml > default, for every setting in SETTINGS."""
    flags = flags or {}
    environ = os.environ if environ is None else environ
    config = config or {}
    unknown = set(flags) - set(BY_NAME)
    if unknown:
        raise UsageError(f"unknown setting(s): {', '.join(sorted(unknown))}")
    values, sources = {}, {}
    for s in SETTINGS:
        for source, raw in (
            ("flag", flags.get(s.name)),
            ("env", environ.get(s.env) if s.env else None),
            ("invoke.yaml", config.get(s.name)),
            ("default", s.default),
        ):
            if raw is not None and raw != "":
                values[s.name], sources[s.name] = _convert(s, raw), source
                break
        else:
            values[s.name], sources[s.name] = None, "unset"
    if values["num_gpus"] is not None and values["num_gpus"] < 0:
        raise UsageError(f"NUM_GPUS must be >= 0, got {values['num_gpus']}")
    return Resolved(values, sources)


def config_section(invoke_config: Any) -> dict[str, Any]:
    """The invoke.yaml keys that name settings (top level, or under a `verl_e2e:` section)."""
    out: dict[str, Any] = {}
    if invoke_config is None:
        return out
    for source in (invoke_config, invoke_config.get("verl_e2e") or {}):
        for s in SETTINGS:
            if s.name in source and source[s.name] is not None:
                out[s.name] = source[s.name]
    return out
