"""Preflight checks of what the run reads: the wrapper script (does it read the level's settings), the model's
config for --feature, the GSM8K parquet files, the model checkpoint, the reward model. checklist.py orders and
runs them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

from data.gsm8k import validate_parquet
from data.models import checkpoint_problem
from env import presets
from env.preflight.checks import BLOCKED, OK, WARN, Check, RunContext

_READS = r"(\$\{{?{v}\b|\b{v}:-|\bexport\s+{v}\b|\b(?:os\.environ|getenv)\b[^\n]*['\"]{v}['\"])"
# what a script sets for itself that decides what it runs (shown when it ignores the level's settings)
_SCRIPT_KEYS = ("total_epochs", "total_training_steps", "n_gpus_per_node", "nnodes", "save_freq", "test_freq",
                "lora.rank", "lora_rank", "use_mbridge", "vanilla_mbridge", "use_megatron_fsdp",
                "tensor_model_parallel_size", "pipeline_model_parallel_size", "expert_model_parallel_size")
_HYDRA_ARG = re.compile(r"(?<![\w.$])\+{0,2}([A-Za-z_][\w]*(?:\.[\w@]+)+)=(\"[^\"]*\"|'[^']*'|[^\s\\]+)")


def reads_variable(text: str, name: str) -> bool:
    return re.search(_READS.format(v=re.escape(name)), text) is not None


def level_settings(ctx: RunContext) -> list[str]:
    """The wrapper variables this level sets (every run's preset, plus the dummy model's), in preset order."""
    names: dict[str, None] = {}
    for env in ctx.run_envs or [ctx.wrapper_env]:
        names.update(dict.fromkeys(env))
    if ctx.dummy_config is not None:
        names.update(dict.fromkeys(("USE_DUMMY_MODEL", "DUMMY_MODEL_CONFIG_PATH")))
    return [n for n in names if n not in presets.NOT_LEVEL_SETTINGS]


def script_settings(text: str) -> dict[str, str]:
    """Hydra arguments a script writes itself for the keys that decide what it runs (later wins)."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        for key, value in _HYDRA_ARG.findall(line):
            if any(key.endswith(k) for k in _SCRIPT_KEYS):
                found[key] = value.strip("'\"")
    return found


def check_wrapper_reads(ctx: RunContext) -> Iterable[Check]:
    """Preflight 1: the script the level runs reads the variables the level sets. verl's wrapper at an old release
    (v0.4.1: no USE_MBRIDGE, VANILLA_MBRIDGE or LORA_RANK; v0.5.0: no VANILLA_MBRIDGE or LORA_RANK) would silently
    run something else: Blocked. A Level 4 --script is the user's choice: what it ignores, and what it does
    instead, goes into the report."""
    script = ctx.script or presets.WRAPPER
    path = Path(script).expanduser()
    full = path if path.is_absolute() else Path(ctx.verl.path) / path
    try:
        text = full.read_text(errors="replace")
    except OSError:
        return  # a missing wrapper or script is refused before preflight (bad invocation)
    wanted = level_settings(ctx)
    ignored = [v for v in wanted if not reads_variable(text, v)]
    own = script_settings(text)
    ctx.evidence["script_reads"] = {"script": script, "ignored": ignored, "own_settings": own}
    save = next((v for k, v in own.items() if k.endswith("save_freq")), None)
    if ctx.script and save not in (None, "-1") and "checkpoint" not in ctx.taken:
        ctx.taken["checkpoint"] = f"--script {script} saves checkpoints (trainer.save_freq={save})"
    name = "wrapper reads the level's settings" if not ctx.script else "--script reads the level's settings"
    if not ignored:
        yield Check(name, OK, f"{script} reads all {len(wanted)} variables the level sets")
        return
    if not ctx.script:
        yield Check(name, BLOCKED, f"verl at {ctx.verl.head}: its wrapper ignores {', '.join(ignored)} "
                    f"({script} never reads {'it' if len(ignored) == 1 else 'them'}): Level {ctx.level}'s settings "
                    "would be silently dropped", "use a verl that has it (the procedure's verl: v0.9.0; set "
                    "VERL_REPO)", "config")
        return
    instead = ", ".join(f"{k}={v}" for k, v in own.items()) or "its own defaults"
    ctx.limitations.append(f"--script {script} ignores the level's settings {', '.join(ignored)}: it runs with "
                           f"{instead} instead (what the script itself sets)")
    yield Check(name, WARN, f"{script} ignores {', '.join(ignored)}; it will run with {instead}",
                "pass what you need as Hydra overrides after -- (later wins), or use a script that reads them")


def model_config(ctx: RunContext) -> tuple[dict, list[str]]:
    """The model's HF config.json merged with --dummy-config (what the run builds), and the files read."""
    config: dict = {}
    sources: list[str] = []
    for path in (Path(ctx.model_path) / "config.json" if ctx.model_path else None, ctx.dummy_config):
        if path is not None and Path(path).is_file():
            try:
                data = json.loads(Path(path).read_text())
            except (OSError, ValueError):
                continue
            if isinstance(data, dict):
                config.update(data)
                sources.append(str(path))
    return config, sources


VISION_KEYS = ("vision_config", "vision_tower", "mm_vision_tower", "visual", "vision_encoder", "vit_config")


def check_feature(ctx: RunContext) -> Iterable[Check]:
    """Level 4 --feature: the model has what the feature is about (a VLM a vision config, a MoE model experts)."""
    from env.preflight.model_config import MOE_CONFIG_KEYS, expert_count  # noqa: PLC0415

    if ctx.level != 4 or ctx.feature is None:
        return
    name = f"--feature {ctx.feature}"
    if ctx.feature not in ("vlm", "moe"):
        yield Check(name, OK, f"feature {ctx.feature}: no model-config check for it (see Limitations)")
        return
    config, sources = model_config(ctx)
    if not sources:
        yield Check(name, WARN, "no model config.json to read yet: cannot tell whether the model has the feature")
        return
    where = " + ".join(sources)
    if ctx.feature == "vlm":
        keys = [k for k in VISION_KEYS if k in config]
        if keys:
            yield Check(name, OK, f"vision config present ({', '.join(keys)} in {where})")
        else:
            yield Check(name, BLOCKED, f"{where} has no vision config ({'/'.join(VISION_KEYS)}): not a VLM, the "
                        "run would not exercise the feature", "use a VLM checkpoint for --feature vlm", "config")
        return
    experts = expert_count(config)
    if experts:
        yield Check(name, OK, f"{experts} routed experts ({where})")
    else:
        yield Check(name, BLOCKED, f"{where} has no {'/'.join(MOE_CONFIG_KEYS)}: not a MoE model, the run would "
                    "not exercise the feature", "use a MoE checkpoint for --feature moe", "config")


def check_data(ctx: RunContext) -> Iterable[Check]:
    """Preflight 5: the GSM8K parquet files open and have verl's columns."""
    for name in ("train_files", "val_files"):
        path = ctx.settings.values[name]
        problems = ctx.facts.get(f"data {name}", lambda p=path: validate_parquet(p))
        if problems:
            yield Check(f"data {name.upper()}", BLOCKED, "; ".join(problems[:3]),
                        "invoke prep-data (or set TRAIN_FILES / VAL_FILES)", "data")
        else:
            yield Check(f"data {name.upper()}", OK, str(path))


def check_model(ctx: RunContext) -> Iterable[Check]:
    s = ctx.settings
    path = s.model_path or Path.home() / "models" / s.model_id
    ctx.model_path = path
    if ctx.dummy_config is not None:
        if not ctx.dummy_config.is_file():
            yield Check("dummy model config", BLOCKED, f"{ctx.dummy_config} does not exist",
                        "pass --dummy-config a minimal HF config JSON", "data")
            return
        try:
            parsed = json.loads(ctx.dummy_config.read_text())
        except (OSError, ValueError) as e:
            yield Check("dummy model config", BLOCKED, f"{ctx.dummy_config} is not valid JSON: {e}",
                        "pass --dummy-config a minimal HF config JSON (an object of config keys)", "data")
            return
        if not isinstance(parsed, dict):
            yield Check("dummy model config", BLOCKED, f"{ctx.dummy_config} holds a JSON {type(parsed).__name__}, "
                        "not an object of HF config keys", "pass --dummy-config a minimal HF config JSON", "data")
            return
        ctx.limitations.append("dummy model (random weights): validates model construction and training "
                               "mechanics, not pretrained-weight compatibility")
        yield Check("dummy model config", OK, str(ctx.dummy_config))
    # a dummy model takes its weights from --dummy-config: config.json (and the tokenizer) is all it needs here
    problem = None if ctx.dummy_config is not None and (path / "config.json").is_file() else checkpoint_problem(path)
    if problem is None:
        yield Check("model", OK, f"{path} (MODEL_PATH {s.source('model_path')})")
    elif ctx.download:
        yield Check("model", WARN, f"{path}: {problem}: will be downloaded (--download)")
    else:
        yield Check("model", BLOCKED, f"no HF checkpoint at {path} ({problem})",
                    f"invoke download-model --model {s.model_id} (or --download, or set MODEL_PATH)", "data")


def reward_model_off_override(verl_repo: Path) -> str:
    """The key moved in Feb 2026 (reward_model.enable -> reward.reward_model.enable); follow the checkout."""
    try:
        wrapper = (verl_repo / presets.WRAPPER).read_text(errors="replace")
    except OSError:
        wrapper = ""
    if "reward.reward_model." in wrapper or "reward_model." not in wrapper:
        return presets.NO_REWARD_MODEL
    return "reward_model.enable=False"


def check_reward_model(ctx: RunContext) -> Iterable[Check]:
    rm = ctx.settings.rm_model_path
    off = reward_model_off_override(Path(ctx.verl.path))
    if ctx.no_reward_model:
        reason = "--no-reward-model"
    elif rm is not None and (rm_problem := checkpoint_problem(Path(rm))) is None:
        yield Check("reward model", OK, str(rm))
        return
    else:
        reason = f"no reward model at {rm}" + (f" ({rm_problem})" if rm is not None else "")
    ctx.overrides.append(off)
    ctx.limitations.append(f"reward model disabled ({reason}): GSM8K rule reward used; reward-model serving not tested")
    yield Check("reward model", WARN, f"{reason}: the run appends {off}")
