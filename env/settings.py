"""Every user setting in one table, resolved flag > environment > invoke.yaml > default.

A task passes its flags (None = not given); `resolve` returns the value of each setting together with where it
came from, so reports can say "MODEL_PATH (from env)" and dry-runs can show why a value was chosen.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# This checkout's root: the tool syncs, mounts and re-invokes itself from here.
PROJECT_ROOT = Path(__file__).resolve().parent.parent

# The prefix of this tool's own lines (terminal, logs): the verdict never takes them as the run's evidence.
TOOL_PREFIX = "[verl-e2e]"


class UsageError(Exception):
    """Bad invocation: printed as one line, exit code 2."""


@dataclass(frozen=True)
class Setting:
    name: str  # flag / invoke.yaml key (snake_case)
    env: str | None  # environment variable, None when flag/config only
    default: Any
    help: str
    kind: str = "str"  # str | path | int | float | bool
    minimum: float | None = None  # int/float settings: smallest accepted value


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
    Setting("num_gpus", "NUM_GPUS", None, "GPUs for the run (default: detected)", "int", minimum=0),
    Setting("ray_address", "RAY_ADDRESS", None, "attach to this Ray cluster instead of a throwaway one"),
    Setting("stall_timeout", "STALL_TIMEOUT_MIN", 30.0,
            "minutes without output while running before it is stopped (0: never)", "float", minimum=0),
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


def _label(setting: Setting, source: str) -> str:
    """How the user gave it: `--stall-timeout` for a flag, STALL_TIMEOUT_MIN from the environment, else the key."""
    if source == "flag":
        return f"--{setting.name.replace('_', '-')}"
    return setting.env if source == "env" and setting.env else setting.name


def _number(setting: Setting, raw: Any, source: str) -> int | float:
    value = int(raw) if setting.kind == "int" else float(raw)
    if math.isnan(value):  # no order, no meaning
        raise ValueError(raw)
    if setting.minimum is not None and not value >= setting.minimum:
        raise UsageError(f"{_label(setting, source)} must be >= {setting.minimum:g}, got {raw}")
    return value


def _convert(setting: Setting, raw: Any, source: str = "flag") -> Any:
    if raw is None:
        return None
    try:
        if setting.kind == "path":
            return Path(os.path.expandvars(os.path.expanduser(str(raw)))).absolute()
        if setting.kind in ("int", "float"):
            return _number(setting, raw, source)
        if setting.kind == "bool":
            return str(raw).strip().lower() in ("1", "true", "yes", "on")
    except ValueError:
        raise UsageError(f"{_label(setting, source)}={raw!r} is not a valid {setting.kind}") from None
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
                values[s.name], sources[s.name] = _convert(s, raw, source), source
                break
        else:
            values[s.name], sources[s.name] = None, "unset"
    return Resolved(values, sources)


def config_section(invoke_config: Any) -> dict[str, Any]:
    """The invoke.yaml keys that name settings (top level, or under a `verl_e2e:` section).

    A key of the project's invoke.yaml that is neither a setting nor one of invoke's own is refused (UsageError:
    a misspelt `nmu_gpus` must not silently fall back to the default)."""
    out: dict[str, Any] = {}
    if invoke_config is None:
        return out
    for layer in ("_project", "_runtime"):  # invoke.yaml beside tasks.py, `invoke -f FILE`
        check_config_keys(getattr(invoke_config, layer, None))
    for source in (invoke_config, invoke_config.get("verl_e2e") or {}):
        for s in SETTINGS:
            if s.name in source and source[s.name] is not None:
                out[s.name] = source[s.name]
    return out


SECTION = "verl_e2e"


def check_config_keys(project: Any) -> None:
    """Unknown keys of the project config file (top level, or in its `verl_e2e:` section) → UsageError."""
    import difflib

    if not isinstance(project, Mapping) or not project:
        return
    try:
        from invoke.config import Config

        invoke_keys = set(Config.global_defaults())
    except Exception:  # noqa: BLE001 - no invoke (a library use of this module): settings only
        invoke_keys = set()
    names = set(BY_NAME)
    problems = []
    for key in project:
        if key == SECTION:
            section = project[key]
            if section is not None and not isinstance(section, Mapping):
                problems.append(f"{SECTION}: must be a mapping of settings")
                continue
            problems += [f"{SECTION}.{k}" for k in (section or {}) if k not in names]
        elif key not in names and key not in invoke_keys:
            problems.append(str(key))
    if problems:
        hints = []
        for p in problems:
            close = difflib.get_close_matches(p.split(".")[-1], sorted(names), n=1)
            hints.append(f"{p} (did you mean {close[0]}?)" if close else p)
        raise UsageError(f"invoke.yaml: unknown key(s): {', '.join(hints)}; settings are: {', '.join(sorted(names))}")


def writable_dir_problem(path: Path) -> str | None:
    """Why a folder cannot be created (or written) at `path`, found without writing anything; None when it can.

    Root passes permission checks everywhere, so a pseudo filesystem (/proc, /sys: no blocks) or a read-only
    mount is told from the filesystem itself.
    """
    existing = Path(path)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a directory"
    try:
        fs = os.statvfs(existing)
    except OSError as e:
        return f"{existing}: {e.strerror}"
    if fs.f_flag & os.ST_RDONLY:
        return f"{existing} is on a read-only filesystem"
    if fs.f_blocks == 0:
        return f"{existing} is on a pseudo filesystem (no storage)"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    return None


def require_writable_dir(settings: Resolved, name: str) -> Path:
    """A path setting that runs write under (LOG_DIR, ...): a one-line UsageError when it cannot be used."""
    setting = BY_NAME[name]
    path = Path(settings.values[name])
    problem = writable_dir_problem(path)
    if problem:
        raise UsageError(f"{_label(setting, settings.source(name))} {path} cannot be used: {problem}")
    return path
