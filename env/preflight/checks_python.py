"""Preflight checks of the checkouts and the run's Python: the repos, where Bridge/core/verl load from, the
driver's imports (the heavy probe), modelopt on the LoRA save path, vLLM's MoE kernels, which launcher runs verl
(uv or the image's Python), apex, flash-attn, Ray's CPUs. checklist.py orders and runs them.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from env import presets
from env.preflight import probe_cache
from env.preflight.checks import BLOCKED, OK, SKIPPED, WARN, Check, ImportProbe, RunContext
from env.preflight.checks_inputs import model_config
from env.preflight.modelopt import PACKAGE as MODELOPT_PACKAGE
from env.preflight.modelopt import modelopt_install_hint
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
    submodule_fix,
    verl_bridge_imports,
    verl_bridge_sites,
)
from env.repos import MEGATRON_LM

IMAGE_MEGATRON_LM = Path("/workspace/Megatron-LM")  # the wrapper prepends it to PYTHONPATH


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
