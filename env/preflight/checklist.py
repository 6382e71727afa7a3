"""Preflight (SPEC "Preflight"): every check that can stop a run before verl starts, each with its fix.

A check returns `Check`s and may adjust the run (env to set or drop, Hydra overrides, Limitations) — e.g. no nsys
appends `global_profiler.tool=null`. Checks are a list of functions so that `doctor` runs them all and a level stops
at the first Blocked one. With `probe=False` (dry-run) nothing is executed: only environment, PATH and file checks.

This module orders and runs them (the cheap phase, then the heavy probes) and prints the table; the checks
themselves are by area: checks_python.py (checkouts, the run's Python, imports), checks_inputs.py (wrapper,
model, data), checks_host.py (GPUs, disk, devices, container image), modelopt.py, ray_probe.py.
"""

from __future__ import annotations

import time
from pathlib import Path

from data.gsm8k import validate_parquet
from data.models import check_download_model
from env.preflight import probe_cache
from env.preflight.checks import BLOCKED, OK, SKIPPED, WARN, Check, CheckFn, ImportProbe, RunContext
from env.preflight.checks_host import (
    check_container_image,
    check_disk,
    check_gpus,
    check_nsys,
    check_visible_devices,
)
from env.preflight.checks_inputs import (
    check_data,
    check_feature,
    check_model,
    check_reward_model,
    check_wrapper_reads,
)
from env.preflight.checks_python import (
    _heavy_imports,
    _import_request,
    _located,
    check_apex,
    check_flash_attn,
    check_imports,
    check_locations,
    check_modelopt,
    check_modelopt_present,
    check_ray_cpus,
    check_repos,
    check_uv,
    check_vllm_moe_kernels,
    choose_launcher,
)
from env.preflight.gpus import detect_gpus
from env.preflight.modelopt import check_container_setup
from env.preflight.pythonpath import located, probe_imports, run_entries
from env.preflight.ray_probe import RayProbe, check_ray_worker, ray_probe_on, start_ray_probe

__all__ = ["BLOCKED", "OK", "SKIPPED", "WARN", "Check", "CheckFn", "RunContext", "run_checks", "status_table"]


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
            "facts_s": dict(sorted(ctx.facts.seconds.items())), "cached": dict(ctx.facts.cached_from),
            "inside_probe_s": _inside_probe(ctx)}
        ctx.facts.close()


def _inside_probe(ctx: RunContext) -> dict:
    """Where the heavy probe's own time went: the imports and the Ray cluster start, side by side."""
    if ctx.imports is None or "imports" in ctx.facts.cached_from:  # a cached answer's timings are not this run's
        return {}
    raw = ctx.imports.raw
    inside = {k: raw[k] for k in ("imports_s", "ray_s") if k in raw}
    return inside


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
    if t.get("inside_probe_s"):
        lines.append("  inside the heavy probe: " + ", ".join(f"{k[:-2]} {v:.2f}" for k, v in t["inside_probe_s"].items()))
    for name, secs in t["facts_s"].items():
        lines.append(f"  {secs:6.2f}  {name}" + (f" ({t['cached'][name]})" if name in t["cached"] else ""))
    return "\n".join(lines)
