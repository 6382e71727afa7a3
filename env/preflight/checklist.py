"""Preflight (SPEC "Preflight"): every check that can stop a run before verl starts, each with its fix.

A check returns `Check`s and may adjust the run (env to set or drop, Hydra overrides, Limitations) — e.g. no nsys
appends `global_profiler.tool=null`. Checks are a list of functions so that `doctor` runs them all and a level stops
at the first Blocked one. With `probe=False` (dry-run) nothing is executed: only environment, PATH and file checks.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Iterable
from pathlib import Path

from data.gsm8k import validate_parquet
from data.models import check_download_model, checkpoint_problem
from env import presets
from env.preflight import probe_cache
from env.preflight.checks import BLOCKED, OK, SKIPPED, WARN, Check, CheckFn, ImportProbe, RunContext
from env.preflight.gpus import detect_gpus
from env.preflight.modelopt import PACKAGE as MODELOPT_PACKAGE
from env.preflight.modelopt import check_container_setup, modelopt_install_hint
from env.preflight.pythonpath import (
    APEX_FUSED,
    FLASH_ATTN_MODULES,
    ProbeError,
    bridge_modelopt_imports,
    is_under,
    located,
    megatron_lm_empty,
    module_paths,
    package_of,
    probe_imports,
    run_entries,
    submodule_fix,
    verl_bridge_imports,
    verl_bridge_sites,
)
from env.preflight.ray_probe import RayProbe, check_ray_worker, ray_probe_on, start_ray_probe
from env.repos import MEGATRON_LM

__all__ = ["BLOCKED", "OK", "SKIPPED", "WARN", "Check", "CheckFn", "RunContext", "run_checks", "status_table"]

IMAGE_MEGATRON_LM = Path("/workspace/Megatron-LM")  # the wrapper prepends it to PYTHONPATH
MIN_FREE_GIB, WARN_FREE_GIB = 1.0, 20.0


def check_repos(ctx: RunContext) -> Iterable[Check]:
    yield Check("Bridge checkout", OK, f"{ctx.bridge.path} @ {ctx.bridge.describe()}")
    yield Check("verl checkout", OK, f"{ctx.verl.path} @ {ctx.verl.describe()} (has {presets.WRAPPER})")


def _located(ctx: RunContext) -> ImportProbe | Check:
    """The cheap probe's answer, or the check that says why there is none."""
    if ctx.evidence.get("launcher", {}).get("status") == BLOCKED:
        return Check("run's Python", SKIPPED, "not probed: the launcher is Blocked (no Python to ask yet)")
    try:
        return located(ctx)
    except ProbeError as e:
        return Check("run's Python", BLOCKED, str(e), "set VERL_PYTHON / --python to the Python that runs verl",
                     "env-dependency")


def check_locations(ctx: RunContext) -> Iterable[Check]:
    """Preflight 2, cheap half: where megatron.bridge, megatron.core and verl would load from (find_spec: no module
    code runs), and that the run's Python has ray."""
    if not ctx.probe:
        yield Check("driver imports", SKIPPED, "probes off: where modules load from not checked")
        return
    found = _located(ctx)
    if isinstance(found, Check):
        yield found
        return
    ctx.evidence["python"] = {"python": found.raw.get("python"), "version": found.raw.get("version")}
    bridge_src = Path(ctx.bridge.path) / "src"
    bridge_file = found.file_of("megatron.bridge")
    ctx.evidence["bridge_file"] = bridge_file
    if not is_under(bridge_file, bridge_src):
        where = bridge_file or found.error_of("megatron.bridge")
        yield Check("megatron.bridge is the local checkout", BLOCKED, f"megatron.bridge resolves to {where}",
                    f"put {bridge_src} first on PYTHONPATH (or uninstall the megatron-bridge wheel)", "wrong-bridge")
    else:
        yield Check("megatron.bridge is the local checkout", OK, bridge_file)

    core_file = found.file_of("megatron.core")
    expected_core = Path(ctx.bridge.path) / MEGATRON_LM
    ctx.evidence["core_file"] = core_file
    if is_under(core_file, expected_core):
        yield Check("megatron.core origin", OK, f"{core_file} (Bridge's {MEGATRON_LM})")
    elif core_file is None and megatron_lm_empty(Path(ctx.bridge.path)):
        yield Check("megatron.core origin", BLOCKED, f"no megatron.core anywhere, and {expected_core} is empty (the "
                    "submodule is not initialised)", submodule_fix(Path(ctx.bridge.path)), "env-dependency")
    else:
        yield Check("megatron.core origin", WARN, f"megatron.core comes from {core_file or found.error_of('megatron.core')}, "
                    f"not {expected_core}", submodule_fix(Path(ctx.bridge.path)))
    if (IMAGE_MEGATRON_LM / "megatron" / "core").is_dir():
        ctx.notes.append(f"the wrapper prepends {IMAGE_MEGATRON_LM} to PYTHONPATH: megatron.core in the run comes from there")
        yield Check("image Megatron-LM shadowing", WARN, f"{IMAGE_MEGATRON_LM} exists and the wrapper puts it first",
                    "expected in the verl image; record which megatron.core the run used")

    verl_file = found.file_of("verl")
    ctx.evidence["verl_file"] = verl_file
    if not is_under(verl_file, Path(ctx.verl.path)):
        yield Check("verl is the local checkout", BLOCKED,
                    f"verl resolves to {verl_file or found.error_of('verl')}, not {ctx.verl.path}",
                    "the wrapper and the verl package must be one release: put VERL_REPO on PYTHONPATH",
                    "env-dependency")
    else:
        yield Check("verl is the local checkout", OK, verl_file)
    if not found.present("ray"):
        yield Check("ray", BLOCKED, f"ray is not installed in {ctx.python} (verl's trainer runs on it)",
                    f"{ctx.python} -m pip install ray (or run inside the verl image)", "env-dependency")


def _import_request(ctx: RunContext) -> list[str]:
    """What the heavy probe imports besides Bridge/core/verl: verl's Bridge modules and modelopt's save path."""
    return ctx.facts.get("import list", lambda: verl_bridge_imports(Path(ctx.verl.path))
                         + bridge_modelopt_imports(Path(ctx.bridge.path)))


def _heavy_imports(ctx: RunContext) -> ImportProbe:
    """The heavy probe (one process: every import question), through the probe cache."""
    modules = _import_request(ctx)

    def run() -> tuple[dict, bool]:
        probe = probe_imports(ctx.python, ctx.pythonpath, cwd=Path(ctx.verl.path), imports=modules)
        return probe.raw, True

    return ImportProbe(ctx.python, probe_cache.through(ctx, "imports", modules, run))


def check_imports(ctx: RunContext) -> Iterable[Check]:
    """Preflight 2, heavy half: the driver really imports this Bridge, Megatron-LM and verl, and what verl's model
    build, LoRA and checkpoint code import from Bridge."""
    if not ctx.probe:
        return
    try:
        ctx.imports = ctx.facts.get("imports", lambda: _heavy_imports(ctx))
    except ProbeError as e:
        yield Check("megatron.bridge imports", BLOCKED, str(e),
                    "set VERL_PYTHON / --python to the Python that runs verl", "env-dependency")
        return
    bridge_file = ctx.imports.file_of("megatron.bridge")
    for module in ("megatron.bridge", "verl"):
        err = ctx.imports.error_of(module)
        if err:
            yield Check(f"{module} imports", BLOCKED, f"{ctx.imports.file_of(module)}: {err}",
                        _missing_fix(ctx, ctx.imports.raw[module]), "env-dependency")
            return
    yield Check("megatron.bridge imports", OK, f"{bridge_file} imports in {ctx.imports.raw.get('python')} "
                f"({ctx.imports.raw.get('version')}), with megatron.core and verl")
    yield from _build_imports(ctx)


def _missing_fix(ctx: RunContext, result: dict) -> str:
    """The fix for a failed import: the package that provides the missing module, by name."""
    missing = result.get("missing")
    if missing and missing.startswith("megatron.core") and megatron_lm_empty(Path(ctx.bridge.path)):
        return submodule_fix(Path(ctx.bridge.path))
    if _through_modelopt(result) or (missing or "").split(".")[0] == "modelopt":
        why = f"{package_of(missing)} is missing" if missing and not missing.startswith("modelopt") else None
        return install_hint(ctx, why)
    if missing:
        return f"{ctx.python} -m pip install {package_of(missing)} (provides {missing}; or run inside the verl image)"
    return "install the missing dependency in the run's Python (or run inside the verl image: nox -s verl -- ...)"


def _through_modelopt(result: dict) -> bool:
    """The failing import chain runs through modelopt's own files (a dependency of modelopt is missing)."""
    missing = result.get("missing") or ""
    return missing.split(".")[0] != "modelopt" and any(
        f"{os.sep}modelopt{os.sep}" in f for f in result.get("via", []))


def _gate(ctx: RunContext, paths: set[str]) -> str | None:
    """The first of these run paths this level takes (its reason), None when it takes none of them."""
    if not paths or "model" in paths:
        return "every run builds the model" if paths else None
    return next((ctx.taken[p] for p in sorted(paths) if p in ctx.taken), None)


def _not_taken(ctx: RunContext, paths: set[str]) -> str:
    return "; ".join(presets.path_not_taken(ctx.level, p) for p in sorted(paths))


def _off_path_warning(ctx: RunContext, what: str, paths: set[str], fix: str) -> None:
    """A dependency missing only on a path this level does not take: said in the report, not Blocked."""
    ctx.limitations.append(f"{what} — needed only on verl's {'/'.join(sorted(paths))} path, which this run does not "
                           f"take ({_not_taken(ctx, paths)}); a run that takes it needs: {fix}")


def _module_paths(ctx: RunContext) -> dict[str, set[str]]:
    return ctx.facts.get("verl sites", lambda: module_paths(verl_bridge_sites(Path(ctx.verl.path))))


def _build_imports(ctx: RunContext) -> Iterable[Check]:
    """What verl imports from Bridge (read from the verl checkout, with where: module level or inside which function)
    must import in the run's Python — where the level's path needs it: a module verl imports only inside its
    checkpoint save/load (or QAT) code fails the run only when the level saves/loads (or runs QAT); otherwise it is
    a warning in the report. A failure through modelopt is check_modelopt's to report (same import, one fix)."""
    name = "Bridge modules verl imports"
    paths_of = _module_paths(ctx)
    modules = [m for m in sorted(paths_of) if m != "megatron.bridge"]
    if not modules:
        return
    off_path: list[str] = []
    for module in modules:
        result = ctx.imports.import_result(module)
        if not result.get("error") or _through_modelopt(result) or \
                (result.get("missing") or "").split(".")[0] == "modelopt":
            continue
        missing = result.get("missing")
        what = f"the package {package_of(missing)} is missing" if missing else "it fails"
        paths = paths_of[module]
        why = _gate(ctx, paths)
        if why is not None:
            yield Check(name, BLOCKED, f"import {module} (verl imports it {_where(ctx, module)}; {why}): "
                        f"{result['error']} — {what}", _missing_fix(ctx, result), "env-dependency")
            return
        off_path.append(f"{module} ({'/'.join(sorted(paths))} path: {result['error']})")
        _off_path_warning(ctx, f"import {module} fails in the run's Python: {result['error']}", paths,
                          _missing_fix(ctx, result))
    short = ", ".join(m.removeprefix("megatron.bridge.") for m in modules)
    if off_path:
        yield Check(name, WARN, f"{len(modules) - len(off_path)}/{len(modules)} modules import; only on paths this "
                    f"level does not take: {'; '.join(off_path)}", "see Limitations: a level that takes that path "
                    "is Blocked until it imports")
        return
    yield Check(name, OK, f"{len(modules)} modules import ({short})")


def _where(ctx: RunContext, module: str) -> str:
    sites = [s for s in verl_bridge_sites(Path(ctx.verl.path)) if s.module == module]
    return ", ".join(s.where() for s in sites[:2]) or "somewhere"


def _modelopt_paths(ctx: RunContext) -> set[str]:
    """The run paths that need modelopt: Bridge's training/checkpointing.py imports it at module level (verl imports
    that file inside its checkpoint manager: the checkpoint path), QAT always, and whatever verl module the heavy
    probe saw failing through modelopt (its own paths)."""
    paths = {"qat"}
    save_modules = [m for m, p in _module_paths(ctx).items() if "checkpointing" in m]
    for m in save_modules:
        paths |= _module_paths(ctx)[m]
    if not save_modules and bridge_modelopt_imports(Path(ctx.bridge.path)):
        paths.add("checkpoint")
    if ctx.imports is not None:
        for module, p in _module_paths(ctx).items():
            result = ctx.imports.import_result(module)
            if result.get("error") and (_through_modelopt(result)
                                        or (result.get("missing") or "").split(".")[0] == "modelopt"):
                paths |= p
    return paths


def install_hint(ctx: RunContext, why: str | None = None) -> str:
    return modelopt_install_hint(ctx.environ, ctx.settings.modelopt_index_url, why)


def check_modelopt_present(ctx: RunContext) -> Iterable[Check]:
    """Preflight 4, cheap half: nvidia-modelopt in the run's Python — Blocked only where the level's path needs it
    (checkpoint save/load, QAT); elsewhere a warning in the report."""
    found = _located(ctx) if ctx.probe else None
    if not isinstance(found, ImportProbe):
        return  # check_locations said why
    if found.present("modelopt"):
        yield Check("modelopt", OK, f"{MODELOPT_PACKAGE} installed ({found.raw['present']['modelopt']})")
        return
    paths = _modelopt_paths(ctx)
    why = _gate(ctx, paths)
    fix = install_hint(ctx)
    if why is not None:
        yield Check("modelopt", BLOCKED, f"{MODELOPT_PACKAGE} is not installed in the run's Python, and {why} "
                    "(Bridge's training/checkpointing.py imports modelopt)", fix, "env-dependency")
        return
    _off_path_warning(ctx, f"{MODELOPT_PACKAGE} is not installed in the run's Python", paths, fix)
    yield Check("modelopt", WARN, f"{MODELOPT_PACKAGE} is not installed in the run's Python: needed only on verl's "
                f"{'/'.join(sorted(paths))} path ({_not_taken(ctx, paths)})", fix)


def check_modelopt(ctx: RunContext) -> Iterable[Check]:
    """Preflight 4, heavy half: what Bridge's checkpointing imports from modelopt (verl's LoRA save path) imports —
    a modelopt installed without its dependencies (pulp) is Blocked where the level saves/loads, a warning
    elsewhere."""
    if ctx.imports is None:
        return
    name = "modelopt (LoRA save path)"
    located_probe = _located(ctx)
    if isinstance(located_probe, ImportProbe) and not located_probe.present("modelopt"):
        yield Check(name, SKIPPED if _gate(ctx, _modelopt_paths(ctx)) is None else BLOCKED,
                    f"{MODELOPT_PACKAGE} not installed (see 'modelopt')", install_hint(ctx),
                    None if _gate(ctx, _modelopt_paths(ctx)) is None else "env-dependency")
        return
    save_path = bridge_modelopt_imports(Path(ctx.bridge.path))
    failure = None
    for module in save_path:
        result = ctx.imports.import_result(module)
        if result.get("error"):
            failure = (f"import {module} (Bridge's training/checkpointing.py, on verl's LoRA save path) fails: "
                       f"{result['error']}", result)
            break
    if failure is None:
        for module, result in ctx.imports.raw.get("imports", {}).items():
            if result.get("error") and _through_modelopt(result):
                failure = (f"import {module} fails inside modelopt: {result['error']}", result)
                break
    if failure is not None:
        detail, result = failure
        paths = _modelopt_paths(ctx)
        why = _gate(ctx, paths)
        if why is not None:
            yield Check(name, BLOCKED, f"{detail} ({why})", _missing_fix(ctx, result), "env-dependency")
            return
        _off_path_warning(ctx, detail, paths, _missing_fix(ctx, result))
        yield Check(name, WARN, f"{detail}: needed only on verl's {'/'.join(sorted(paths))} path "
                    f"({_not_taken(ctx, paths)})", _missing_fix(ctx, result))
        return
    if save_path:
        yield Check(name, OK, f"{', '.join(save_path)} imports (Bridge's training/checkpointing.py)")


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


MOE_KERNELS = ("_moe_C_stable_libtorch", "_moe_C")  # vLLM's MoE ops: stable-ABI builds, then older ones


def check_vllm_moe_kernels(ctx: RunContext) -> Iterable[Check]:
    """A MoE model's rollout needs vLLM's compiled MoE ops (`ops.topk_softmax`): vLLM only warns when
    `vllm._moe_C_stable_libtorch` is missing, and the engine dies later. Listed without importing vLLM."""
    from env.preflight.model_config import expert_count  # noqa: PLC0415

    name = "vLLM MoE kernels"
    found = _located(ctx) if ctx.probe else None
    if not isinstance(found, ImportProbe) or not found.present("vllm"):
        return
    if ctx.wrapper_env.get("ENGINE", "vllm") != "vllm":
        return
    exts = found.raw.get("extensions", {}).get("vllm") or []
    stable = any(e.endswith("_stable_libtorch") for e in exts)
    kernel = MOE_KERNELS[0] if stable else MOE_KERNELS[1]
    present = kernel in exts
    config, sources = model_config(ctx)
    experts = expert_count(config)
    if present:
        yield Check(name, OK, f"vllm.{kernel} present")
        return
    detail = f"vllm.{kernel} not found next to {found.raw['present']['vllm']}"
    if experts:
        yield Check(name, BLOCKED, f"{detail}, and the model has {experts} experts: vLLM's MoE ops "
                    "(ops.topk_softmax) are missing, the rollout engine would die", f"install a vLLM build that "
                    f"ships vllm/{kernel}*.so (the image's own vLLM)", "env-dependency")
    else:
        yield Check(name, WARN, f"{detail}: not needed for this dense model"
                    + ("" if sources else " (no model config read)"))


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


def check_gpus(ctx: RunContext) -> Iterable[Check]:
    """Preflight 6: enough GPUs for TP x PP x CP, and a multiple of it."""
    need = presets.parallel_size(ctx.wrapper_env)
    if ctx.settings.num_gpus is not None:
        count, how = ctx.settings.num_gpus, f"NUM_GPUS ({ctx.settings.source('num_gpus')})"
    else:
        count, how = ctx.facts.get("gpus", detect_gpus)
    ctx.env["NUM_GPUS"] = str(count)
    detail = f"{count} GPU(s) from {how}; TP x PP x CP = {need}"
    if count < need or count % need:
        yield Check("GPUs", BLOCKED, detail, f"run on a host with a multiple of {need} GPUs (or set NUM_GPUS)",
                    "env-no-gpu")
    else:
        yield Check("GPUs", OK, detail)


def check_nsys(ctx: RunContext) -> Iterable[Check]:
    if shutil.which("nsys", path=ctx.environ.get("PATH")):
        yield Check("nsys", OK, "nsys on PATH (the wrapper starts Ray processes under it)")
        return
    ctx.overrides.append(presets.NO_PROFILER)
    ctx.limitations.append(f"no nsys: profiler disabled ({presets.NO_PROFILER})")
    yield Check("nsys", WARN, f"nsys not found: appending {presets.NO_PROFILER}")


def _existing_parent(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_disk(ctx: RunContext) -> Iterable[Check]:
    s = ctx.settings
    paths = {"log": s.log_dir, "model": ctx.model_path or s.model_path, "data": s.train_files, "verl checkpoints": Path(ctx.verl.path)}
    for what, path in paths.items():
        if path is None:
            continue
        where = _existing_parent(Path(path))
        free = shutil.disk_usage(where).free / 2**30
        detail = f"{free:.1f} GiB free under {where}"
        if free < MIN_FREE_GIB:
            yield Check(f"disk ({what})", BLOCKED, detail,
                        "move HF_HOME, HF_HUB_CACHE and MODEL_PATH to a larger scratch path", "env-disk")
        elif free < WARN_FREE_GIB:
            yield Check(f"disk ({what})", WARN, detail)
        else:
            yield Check(f"disk ({what})", OK, detail)


def check_visible_devices(ctx: RunContext) -> Iterable[Check]:
    if "ROCR_VISIBLE_DEVICES" in ctx.environ and "CUDA_VISIBLE_DEVICES" in ctx.environ:
        ctx.drop_env.append("ROCR_VISIBLE_DEVICES")
        ctx.notes.append("ROCR_VISIBLE_DEVICES was set next to CUDA_VISIBLE_DEVICES: dropped for the run")
        yield Check("visible devices", WARN, "ROCR_VISIBLE_DEVICES set next to CUDA_VISIBLE_DEVICES: dropped for the run")
    else:
        yield Check("visible devices", OK, "no ROCR/CUDA visible-devices clash")


def uv_environment(ctx: RunContext) -> Path:
    """The interpreter environment `uv run --frozen` runs verl in: UV_PROJECT_ENVIRONMENT, else VERL_REPO/.venv."""
    env = ctx.environ.get("UV_PROJECT_ENVIRONMENT")
    return Path(env) if env else Path(ctx.verl.path) / ".venv"


def choose_launcher(ctx: RunContext) -> Check:
    """Which Python runs verl, decided before any probe so the probes ask that Python (never one probed and another
    run). Default: the image's Python with PYTHONPATH (the procedure; VERL_USE_UV=0, which verl HEAD's wrapper reads
    and v0.9.0's ignores). VERL_USE_UV=1 asks for verl's uv launcher: the probes then run uv's project interpreter."""
    if "launcher" in ctx.evidence:
        return Check(**ctx.evidence["launcher"])
    wanted = ctx.environ.get("VERL_USE_UV", "0") != "0" and not ctx.image_python
    if not wanted:
        why = ("running in the image's own Python (nox -s verl)" if ctx.image_python else
               "the image's Python with PYTHONPATH, as the procedure runs verl; VERL_USE_UV=1 for verl's uv launcher")
        ctx.env["VERL_USE_UV"] = "0"
        ctx.notes.append(f"VERL_USE_UV=0: {why}")
        check = Check("launcher", OK, f"VERL_USE_UV=0 ({why})")
    elif not shutil.which("uv", path=ctx.environ.get("PATH")):
        check = Check("launcher", BLOCKED, "VERL_USE_UV=1 asks for `uv run --frozen`, but there is no uv on PATH",
                      "install uv, or unset VERL_USE_UV to run the image's Python", "env-dependency")
    elif not (Path(ctx.verl.path) / "uv.lock").is_file():
        check = Check("launcher", BLOCKED, "VERL_USE_UV=1 asks for `uv run --frozen`, but the verl checkout has no "
                      "uv.lock", "use a verl with uv.lock, or unset VERL_USE_UV", "env-dependency")
    else:
        venv = uv_environment(ctx)
        python = venv / "bin" / "python"
        if not python.exists():
            check = Check("launcher", BLOCKED, f"VERL_USE_UV=1: `uv run --frozen` would build {venv} when verl "
                          "starts; preflight cannot check an interpreter that does not exist yet",
                          f"cd {ctx.verl.path} && uv sync --frozen --all-packages --extra vllm --extra megatron "
                          "--extra math (then rerun), or unset VERL_USE_UV", "env-dependency")
        else:
            ctx.python = str(python)
            ctx.notes.append(f"VERL_USE_UV=1: verl runs in uv's environment {venv}; the probes ran {python}")
            check = Check("launcher", OK, f"VERL_USE_UV=1: `uv run --frozen` in {venv}; every probe runs {python}")
    ctx.evidence["launcher"] = check.to_json()
    return check


def check_uv(ctx: RunContext) -> Iterable[Check]:
    yield choose_launcher(ctx)


def check_apex(ctx: RunContext) -> Iterable[Check]:
    found = _located(ctx) if ctx.probe else None
    if not isinstance(found, ImportProbe):
        yield Check("Apex fused kernel", SKIPPED, "needs the run's Python")
        return
    if found.present(APEX_FUSED):
        yield Check("Apex fused kernel", OK, "fused_weight_gradient_mlp_cuda importable")
        return
    ours = [o for o in presets.not_overridden(presets.GRAD_ACCUM_FUSION_OFF, ctx.user_overrides)
            if o not in ctx.overrides]
    if not ours:
        yield Check("Apex fused kernel", WARN, "fused_weight_gradient_mlp_cuda missing; your own overrides after -- "
                    "set gradient_accumulation_fusion")
        return
    ctx.overrides.extend(ours)
    ctx.limitations.append("Apex fused_weight_gradient_mlp_cuda missing: gradient_accumulation_fusion=False "
                           "for actor, ref and critic")
    yield Check("Apex fused kernel", WARN, "fused_weight_gradient_mlp_cuda missing: appending the "
                "gradient_accumulation_fusion=False overrides")


def check_flash_attn(ctx: RunContext) -> Iterable[Check]:
    """verl asks TE for attention_backend=flash; without flash-attn TE has no backend and the first forward raises
    "No dot product attention backend is available": use cuDNN's fused attention (a Limitation)."""
    name = "flash-attn"
    probe = _located(ctx) if ctx.probe else None
    if not isinstance(probe, ImportProbe):
        yield Check(name, SKIPPED, "needs the run's Python")
        return
    found = [m for m in FLASH_ATTN_MODULES if probe.present(m)]
    if found:
        yield Check(name, OK, f"{', '.join(found)} present (verl's attention_backend=flash)")
        return
    existing = [*ctx.base_overrides, *ctx.overrides, *ctx.user_overrides]
    ours = presets.not_overridden(presets.attention_fused(ctx.verl.path, existing), ctx.user_overrides)
    if not ours:
        yield Check(name, WARN, "flash-attn not installed in the run's Python; your own overrides after -- set "
                    "attention_backend")
        return
    ctx.overrides.extend(o for o in ours if o not in ctx.overrides)
    roles = ", ".join(o.split(".megatron.")[0].removeprefix("++").split(".")[-1] for o in ours)
    ctx.limitations.append(f"flash-attn not installed in the run's Python: attention_backend=fused (cuDNN fused "
                           f"attention) for {roles}; flash attention not exercised")
    yield Check(name, WARN, f"flash-attn not installed ({', '.join(FLASH_ATTN_MODULES)} not found): appending "
                f"attention_backend=fused for {roles}")


def check_ray_cpus(ctx: RunContext) -> Iterable[Check]:
    """verl's transfer queue takes 8 CPU slots: a Ray cluster with fewer than ~10 hangs silently."""
    if ctx.settings.ray_address:
        cpus = ctx.evidence.get("ray_cluster_cpus")
        if cpus is None:
            return
        how = f"Ray cluster at {ctx.settings.ray_address} has {cpus:g} CPUs"
    else:
        cpus = os.cpu_count() or 0
        how = f"a local Ray cluster gets {cpus} CPUs"
    if cpus < 10:
        yield Check("Ray CPUs", WARN, f"{how}: fewer than ~10 hangs silently (verl's transfer queue takes 8)",
                    "run on a host with more CPUs or raise ray_kwargs.ray_init.num_cpus")
    else:
        yield Check("Ray CPUs", OK, how)


def check_container_image(ctx: RunContext) -> Iterable[Check]:
    """In an `invoke slurm` container step: the exact image tag, into the run record (the procedure: pin it)."""
    image = ctx.environ.get("VERL_E2E_CONTAINER_IMAGE")
    if not image:
        return
    ctx.notes.append(f"container image: {image} (invoke slurm pyxis step)")
    ctx.evidence["container_image"] = image
    yield Check("container image", OK, f"{image} (the exact tag of this Slurm container step)")


# Phase 1, cheap: no module code of the stack runs (find_spec, files, git, nvidia-smi, disk); what takes time in
# them (the find_spec probe process, parquet reads, nvidia-smi) is started up front and overlaps. A Blocked result
# here stops the run before any heavy probe starts. Order = the table's order; later checks read what earlier ones
# decided (model path; check_apex before check_flash_attn).
CHEAP: list[CheckFn] = [
    check_repos,
    check_wrapper_reads,
    check_uv,
    check_locations,
    check_modelopt_present,
    check_container_setup,
    check_data,
    check_model,
    check_download_model,
    check_feature,
    check_vllm_moe_kernels,
    check_reward_model,
    check_gpus,
    check_nsys,
    check_disk,
    check_visible_devices,
    check_apex,
    check_flash_attn,
    check_container_image,
]
# Phase 2, heavy: the driver's imports (one probe process) and the Ray worker probe, started together.
HEAVY: list[CheckFn] = [check_imports, check_ray_worker, check_modelopt, check_ray_cpus]
CHECKS: list[CheckFn] = CHEAP + HEAVY
# which facts a check's answer comes from (for "cached from <time>" in the table)
USES = {check_imports: ("imports",), check_modelopt: ("imports",), check_ray_worker: ("ray",),
        check_ray_cpus: ("ray",)}


def _prefetch_cheap(ctx: RunContext) -> None:
    launcher = choose_launcher(ctx)  # the probes below must ask the Python that will run verl
    if ctx.probe and launcher.status != BLOCKED:
        ctx.facts.start("locate", lambda: located(ctx))
    for name in ("train_files", "val_files"):
        path = ctx.settings.values[name]
        ctx.facts.start(f"data {name}", lambda p=path: validate_parquet(p))
    if ctx.settings.num_gpus is None:
        ctx.facts.start("gpus", detect_gpus)


def _start_heavy(ctx: RunContext) -> None:
    """The driver's imports and the Ray worker probe, at once. When neither answer is cached and the worker probe is
    on, one process does both (the cluster starts while the stack imports: the stack is imported once, by the
    driver; the worker only resolves where megatron.bridge comes from); else each fact on its own."""
    if not ctx.probe:
        return
    if ray_probe_on(ctx) and not ctx.settings.ray_address and not probe_cache.peek(ctx, "imports", _import_request(ctx)) \
            and not probe_cache.peek(ctx, "ray", ["local"]):
        ctx.facts.start("heavy", lambda: _combined(ctx))
        ctx.facts.start("imports", lambda: ImportProbe(ctx.python, probe_cache.through(
            ctx, "imports", _import_request(ctx), lambda: (ctx.facts.get("heavy", lambda: _combined(ctx))[0], True))))
        ctx.facts.start("ray", lambda: RayProbe(**probe_cache.through(
            ctx, "ray", ["local"], lambda: ctx.facts.get("heavy", lambda: _combined(ctx))[1])))
        return
    ctx.facts.start("imports", lambda: _heavy_imports(ctx))
    start_ray_probe(ctx)


def _combined(ctx: RunContext) -> tuple[dict, tuple[dict, bool]]:
    """(import answer, (Ray answer, complete)) from the one heavy process."""
    from env.preflight.ray_probe import _driver_pythonpath  # noqa: PLC0415

    own = run_entries(Path(ctx.bridge.path), Path(ctx.verl.path))
    probe = probe_imports(ctx.python, ctx.pythonpath, cwd=Path(ctx.verl.path), imports=_import_request(ctx),
                          environ=ctx.environ,
                          ray={"address": "", "pythonpath": ctx.pythonpath,
                               "driver_pythonpath": _driver_pythonpath(ctx.environ, own)})
    raw = dict(probe.raw)
    answer = raw.pop("ray", None) or {"driver_error": "the heavy probe gave no Ray answer"}
    ray = {"address": None, "workers": answer.get("workers") or [], "cluster_cpus": answer.get("cluster_cpus"),
           "driver_error": answer.get("driver_error")}
    return raw, (ray, ray["driver_error"] is None)


def _run(fn: CheckFn, ctx: RunContext) -> list[Check]:
    began = time.monotonic()
    checks = list(fn(ctx))
    took = round(time.monotonic() - began, 3)
    cached = next((ctx.facts.cached_from[f] for f in USES.get(fn, ()) if f in ctx.facts.cached_from), None)
    for c in checks:
        c.duration_s = took
        c.cached = cached
    return checks


def run_checks(ctx: RunContext, stop_at_blocked: bool = True) -> list[Check]:
    """Every cheap check, always: a cheap Blocked stops the run, not the diagnosis — and every check that shapes the
    run (overrides, env) has run, so the planned command is the one a fixed environment would start. Then the heavy
    probes: a level (stop_at_blocked) starts them only when no cheap check is Blocked; doctor starts them whenever
    the run's Python can answer, and marks them as not run, with the reason, when it cannot.
    Wall times per phase and per probe, and which probes started, land in ctx.evidence["preflight_timings"]."""
    began = time.monotonic()
    checks: list[Check] = []
    timings: dict = {}
    _prefetch_cheap(ctx)
    try:
        for fn in CHEAP:
            checks += _run(fn, ctx)
        timings["cheap_s"] = round(time.monotonic() - began, 3)
        if not ctx.probe:
            return checks
        blocked = first_blocked(checks)
        cannot = _heavy_cannot_run(ctx)
        if cannot is not None or (blocked is not None and stop_at_blocked):
            why = (f"cannot run yet: {cannot}" if cannot is not None else
                   f"not started: '{blocked.name}' is Blocked (heavy probes run once the cheap checks pass; "
                   "`invoke doctor` runs them anyway)")
            checks += [Check(name, SKIPPED, why) for name in HEAVY_NAMES]
            return checks
        _start_heavy(ctx)
        for fn in HEAVY:
            checks += _run(fn, ctx)
        return checks
    finally:
        timings.setdefault("cheap_s", round(time.monotonic() - began, 3))
        ctx.evidence["preflight_timings"] = {
            **timings, "total_s": round(time.monotonic() - began, 3), "started": ctx.facts.names(),
            "facts_s": dict(sorted(ctx.facts.seconds.items())), "cached": dict(ctx.facts.cached_from)}
        ctx.facts.close()


def _heavy_cannot_run(ctx: RunContext) -> str | None:
    """Why the heavy probes cannot run at all (no Python to ask), None when they can."""
    found = _located(ctx)
    if isinstance(found, Check):
        return found.detail
    return None


HEAVY_NAMES = ("megatron.bridge imports", "Ray worker imports the local Bridge", "modelopt (LoRA save path)")


def first_blocked(checks: list[Check]) -> Check | None:
    return next((c for c in checks if c.status == BLOCKED), None)


def status_table(checks: list[Check], timings: bool = False) -> str:
    marks = {OK: "✔", WARN: "!", BLOCKED: "✘", SKIPPED: "-"}
    width = max((len(c.name) for c in checks), default=10)
    lines = []
    for c in checks:
        took = f"{c.duration_s:6.2f}s " if timings and c.duration_s is not None else ("        " if timings else "")
        cached = f" ({c.cached})" if c.cached else ""
        lines.append(f"{marks[c.status]} {took}{c.name:<{width}}  {c.detail}{cached}")
        if c.fix and c.status in (BLOCKED, WARN):
            lines.append(f"  {'':<{width + (8 if timings else 0)}}  fix: {c.fix}")
    return "\n".join(lines)


def timings_text(evidence: dict) -> str:
    """`doctor --timings`: the phases and each probe's own wall time (they overlap: the sum is not the total)."""
    t = evidence.get("preflight_timings")
    if not t:
        return "# timings: none recorded"
    lines = [f"# timings (s): total {t['total_s']:.2f}, cheap phase {t['cheap_s']:.2f}"]
    for name, secs in t["facts_s"].items():
        lines.append(f"  {secs:6.2f}  {name}" + (f" ({t['cached'][name]})" if name in t["cached"] else ""))
    return "\n".join(lines)
