"""Preflight checks of the host: GPUs, nsys, free disk, the visible-devices variables, the container image of a
Slurm step. checklist.py orders and runs them.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

from env import presets
from env.preflight.checks import BLOCKED, OK, WARN, Check, RunContext
from env.preflight.gpus import detect_gpus

MIN_FREE_GIB, WARN_FREE_GIB = 1.0, 20.0


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


def check_container_image(ctx: RunContext) -> Iterable[Check]:
    """In an `invoke slurm` container step: the exact image tag, into the run record (the procedure: pin it)."""
    image = ctx.environ.get("VERL_E2E_CONTAINER_IMAGE")
    if not image:
        return
    ctx.notes.append(f"container image: {image} (invoke slurm pyxis step)")
    ctx.evidence["container_image"] = image
    yield Check("container image", OK, f"{image} (the exact tag of this Slurm container step)")
