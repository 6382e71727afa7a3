"""Pass rules per level, on top of the per-log verdicts. Level 0's rule is the verdict of its one run; other
levels add their own evidence through RULES (checkpoints for level 1, the wrapper's traced parallel sizes for
level 2, Megatron-FSDP for level 3, the feature's limits for level 4, metrics for level 5).

A rule sees the run record (run.json, plus `run_dir`: where the run directory is now) and the judged logs; it
says what passed and never more: "Requested variants" names the exact variant, level 5 says "learning-signal
passed" and "converged" only when the requested threshold is met.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from env.preflight.model_config import MOE_CONFIG_KEYS, expert_count
from env.presets import FEATURES  # noqa: F401 - Level 4's features, re-exported for the level rules
from sessions.judge.trace import (
    FSDP_KEY,
    TRACE_KEYS,
    feature_limitations,
    traced_overrides,
)
from sessions.judge.verdict import Verdict

SAVE_FREQ_FOLLOW_UP = ("checkpoint save/load failed: rerun without save/resume (SAVE_FREQ=-1, e.g. `invoke level0` "
                       "with the same model) to separate model construction from checkpoint behaviour")


@dataclass
class LevelOutcome:
    run_status: str  # "verl Megatron backend run" deliverable
    run_detail: str
    variant_status: str  # "Requested variants" deliverable (ignored when the level requests none)
    variant_detail: str
    category: str
    key_lines: list[str] = field(default_factory=list)
    limitations: list[str] = field(default_factory=list)
    follow_ups: list[str] = field(default_factory=list)
    coverage: str = ""  # appended to "Requested coverage" (what exactly was requested and passed)
    proves: str = ""  # replaces the level's `proves` in the Result sentence when the level passes
    facts: dict[str, Any] = field(default_factory=dict)  # level evidence for summary.json


def describe_verdict(v: Verdict) -> str:
    """The run's answer, then the level's criteria (each Pass / Fail / not shown) when the level judged them."""
    expected = f"/{v.steps_expected}" if v.steps_expected is not None else ""
    criteria = "; level criteria: " + ", ".join(f"{c.name} {c.status}" for c in v.criteria) if v.criteria else ""
    if v.result == "Pass" and v.final_result != "Pass":  # the run passed, a level criterion did not
        return f"run Pass ({v.steps_completed}{expected} step(s) completed), but {v.level_summary}{criteria}"
    if v.result == "Pass":
        return f"run Pass ({v.steps_completed}{expected} step(s) completed, exit {v.exit_code}){criteria}"
    where = f"run {v.result} in {v.phase} ({v.category})"
    err = f": {v.first_error}" if v.first_error else ""
    hint = f" — hint: {v.hint}" if v.hint else ""
    return f"{where}{err}; {v.steps_completed}{expected} step(s) completed{hint}"


def single_run(record: dict, judged: list[tuple[dict, Verdict]]) -> LevelOutcome:
    """The level passes when its one run passes (level 0; the base of levels 2 to 5)."""
    entry, v = judged[-1]
    detail = describe_verdict(v)
    follow_ups = [f for f in v.follow_ups if f != "none"]
    return LevelOutcome(v.final_result, detail, v.final_result, detail, v.final_category, list(v.key_lines),
                        list(v.limitations), follow_ups)


def _fail_variant(out: LevelOutcome, detail: str, category: str | None = None) -> LevelOutcome:
    out.variant_status, out.variant_detail = "Fail", detail
    if out.run_status == "Pass":
        out.category = category or out.category
    return out


# -- the wrapper's traced command (set -x) ------------------------------------------------------------------------

def _trace_of(record: dict, entry: dict) -> dict[str, str] | None:
    run_dir = record.get("run_dir")
    return traced_overrides(Path(run_dir) / entry["log"]) if run_dir else None


# -- level 1: save/resume -----------------------------------------------------------------------------------------

def _same_path(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and os.path.normpath(a) == os.path.normpath(b)


def _step_dir(series: str, step: int) -> str:
    return os.path.join(series, f"global_step_{step}")


TRACKER_FILE = "latest_checkpointed_iteration.txt"


def checkpoint_state(series: Path) -> dict[str, Any]:
    """The series' checkpoint directory as one run left it: the tracker file's step, the global_step_N folders,
    and which of them are complete (`ckpt_contents.json` is written last, in actor/ and critic/)."""
    tracker = series / TRACKER_FILE
    steps, complete = [], []
    if series.is_dir():
        for child in series.iterdir():
            name = child.name
            if child.is_dir() and name.startswith("global_step_") and name[12:].isdigit():
                steps.append(int(name[12:]))
                if (child / "actor" / "ckpt_contents.json").is_file():
                    complete.append(int(name[12:]))
    try:
        tracked = tracker.read_text().strip()
    except OSError:
        tracked = None
    return {"dir": str(series), "tracker": tracked, "global_steps": sorted(steps), "complete": sorted(complete)}


def save_resume(record: dict, judged: list[tuple[dict, Verdict]]) -> LevelOutcome:
    """A saved global_step_1 (tracker 1) in this series' directory; B resumed from that folder, trained step 2
    (not step 1 again) and saved global_step_2 (tracker 2)."""
    series = record.get("checkpoint_dir")
    runs = {e["name"]: (e, v) for e, v in judged}
    key_lines = [line for _, v in judged for line in v.key_lines]
    limitations = [x for _, v in judged for x in v.limitations]

    # both runs completed cleanly: a missing save/resume fact fails the variant, not the backend run
    runs_ok = set(runs) == {"A", "B"} and all(v.final_result == "Pass" for _, v in judged)

    def outcome(status: str, detail: str, category: str, follow: list[str] | None = None) -> LevelOutcome:
        run_status, run_detail = status, detail
        if runs_ok and status == "Fail":
            run_status = "Pass"
            run_detail = f"run A: {describe_verdict(runs['A'][1])}; run B: {describe_verdict(runs['B'][1])}"
        return LevelOutcome(run_status, run_detail, status, detail, category, key_lines, limitations, follow or [],
                            facts={"checkpoint_dir": series,
                                   "checkpoints": {e["name"]: e.get("checkpoints") for e, _ in judged}})

    def run_failed(v: Verdict, what: str, tail: str = "") -> LevelOutcome:
        """A run of the series did not pass: its own verdict, plus the procedure's checkpoint triage."""
        follow = [SAVE_FREQ_FOLLOW_UP] if "checkpoint" in (v.category, v.phase) else []
        follow += [f for f in v.follow_ups if f != "none"]
        return outcome(v.final_result, f"{what}: {describe_verdict(v)}{tail}", v.category, follow)

    if "A" not in runs:
        return outcome("Fail", "run A (save) has no log", "unknown")
    a_entry, a = runs["A"]
    if a.final_result != "Pass":
        return run_failed(a, "run A (save)", "; run B not started")
    want1 = _step_dir(series, 1) if series else None
    a_ckpt = a_entry.get("checkpoints") or {}
    if not any(_same_path(p, want1) for p in a.checkpoints_saved):
        saved = ", ".join(a.checkpoints_saved) or "nothing"
        return outcome("Fail", f"run A did not log a save of {want1} (logged: {saved})", "checkpoint",
                       [SAVE_FREQ_FOLLOW_UP])
    if a_ckpt.get("tracker") != "1" or 1 not in a_ckpt.get("complete", []):
        return outcome("Fail", f"after run A the series' tracker file says {a_ckpt.get('tracker')!r} (want '1') and "
                               f"complete checkpoint folders are {a_ckpt.get('complete', [])} in {series}",
                       "checkpoint", [SAVE_FREQ_FOLLOW_UP])
    if "B" not in runs:
        return outcome("Fail", "run A saved global_step_1 but run B (resume) has no log", "unknown")
    b_entry, b = runs["B"]
    if b.final_result != "Pass":
        return run_failed(b, f"run A saved {want1}; run B (resume)")
    if b.resumed_from is None:
        why = "it logged a fresh start (tracker file not found)" if b.fresh_start else "it logged no resume"
        return outcome("Fail", f"run B did not resume from {want1}: {why}", "checkpoint", [SAVE_FREQ_FOLLOW_UP])
    if not _same_path(b.resumed_from, want1):
        return outcome("Fail", f"run B logged a resume from {b.resumed_from}, not from run A's checkpoint {want1} "
                               f"(this series' directory {series}): it resumed from nothing this series saved",
                       "checkpoint", [SAVE_FREQ_FOLLOW_UP])
    trained = sorted(s for s in b.step_metrics if s > 0)
    if trained and trained[0] != 2:
        return outcome("Fail", f"run B logged a resume from {b.resumed_from} but trained step {trained[0]} again: "
                               "the global step (and likely the weights) were not restored", "checkpoint",
                       [SAVE_FREQ_FOLLOW_UP])
    if b.steps_completed < 2:
        return outcome("Fail", f"run B resumed but completed {b.steps_completed}/2 steps", "checkpoint")
    want2 = _step_dir(series, 2)
    b_ckpt = b_entry.get("checkpoints") or {}
    if not any(_same_path(p, want2) for p in b.checkpoints_saved) or b_ckpt.get("tracker") != "2" \
            or 2 not in b_ckpt.get("complete", []):
        return outcome("Fail", f"run B completed step 2 but did not save {want2} (tracker "
                               f"{b_ckpt.get('tracker')!r}, complete folders {b_ckpt.get('complete', [])})",
                       "checkpoint", [SAVE_FREQ_FOLLOW_UP])
    detail = (f"run A saved {want1} (tracker 1); run B resumed from it, trained step 2 and saved {want2} "
              f"(tracker 2)")
    return outcome("Pass", detail, "success")


# -- level 2: parallel stress --------------------------------------------------------------------------------------

def parallel_stress(record: dict, judged: list[tuple[dict, Verdict]]) -> LevelOutcome:
    """The run passed and the wrapper's own traced command used the variant's parallel sizes."""
    from env import presets

    out = single_run(record, judged)
    entry, v = judged[-1]
    variant = record.get("variant") or "dense"
    want = {k: val for k, val in presets.LEVELS[2].variants[variant].items() if k in TRACE_KEYS}
    out.coverage = f"variant {variant}"
    if v.final_result != "Pass":
        return out
    trace = _trace_of(record, entry)
    if trace is None:
        return _fail_variant(out, f"{variant}: the wrapper's traced command (set -x) is not in the log: the parallel "
                                  "sizes it ran with are unknown")
    wrong = [f"{TRACE_KEYS[k]}={trace.get(TRACE_KEYS[k], 'unset')} (want {val})" for k, val in want.items()
             if trace.get(TRACE_KEYS[k]) != val]
    if wrong:
        return _fail_variant(out, f"{variant}: the run did not use the variant's sizes: {'; '.join(wrong)}",
                             "unknown")
    sizes = " ".join(f"{k.replace('COMMON_', '')}={val}" for k, val in want.items())
    gpus = trace.get("trainer.n_gpus_per_node", "?")
    out.variant_detail = f"{variant} ({sizes}) on {gpus} GPU(s), from the wrapper's traced command: {out.run_detail}"
    out.proves = (f"provider parameters stayed correct under {variant} parallel Megatron state ({sizes}, "
                  f"{gpus} GPUs)")
    out.facts = {"variant": variant, "traced_sizes": {TRACE_KEYS[k]: trace.get(TRACE_KEYS[k]) for k in want}}
    return out


def check_experts(ctx: Any) -> list[Any]:
    """Level 2 --variant moe: GPUs a multiple of EP x ETP x PP (Megatron's expert groups), and a model that has
    experts (else the variant stresses nothing expert-specific: warn, and say so under Limitations)."""
    import json

    from env.preflight.checklist import BLOCKED, OK, WARN, Check

    env = ctx.wrapper_env
    ep, etp, pp = (int(env.get(k, "1")) for k in ("COMMON_EP", "COMMON_ETP", "COMMON_PP"))
    if ep * etp <= 1:
        return []
    checks = []
    need = ep * etp * pp
    gpus = int(ctx.env.get("NUM_GPUS") or 0)
    detail = f"{gpus} GPU(s); EP x ETP x PP = {ep} x {etp} x {pp} = {need}"
    if gpus < need or gpus % need:
        return [Check("GPUs for expert parallelism", BLOCKED, detail,
                      f"run on a host with a multiple of {need} GPUs (or set NUM_GPUS)", "env-no-gpu")]
    checks.append(Check("GPUs for expert parallelism", OK, detail))
    config: dict = {}
    sources = []
    for path in (Path(ctx.model_path) / "config.json" if ctx.model_path else None, ctx.dummy_config):
        if path is not None and Path(path).is_file():
            try:
                config.update(json.loads(Path(path).read_text()))
                sources.append(str(path))
            except (OSError, ValueError):
                pass
    experts = expert_count(config)
    if not sources:
        checks.append(Check("MoE model", WARN, "no model config.json to read: cannot tell whether the model is MoE"))
    elif experts == 0:
        ctx.limitations.append("--variant moe on a model whose config has no experts (no "
                               f"{'/'.join(MOE_CONFIG_KEYS)}): expert parallelism is not exercised")
        checks.append(Check("MoE model", WARN, f"{' + '.join(sources)} has no {'/'.join(MOE_CONFIG_KEYS)}: not an "
                            "MoE model, the moe variant stresses nothing expert-specific",
                            "use an MoE checkpoint for --variant moe (or --variant dense)"))
    else:
        checks.append(Check("MoE model", OK, f"{experts} routed experts ({' + '.join(sources)})"))
    return checks


def level_checks(number: int, ctx: Any) -> list[Any]:
    """Preflight checks only one level needs (after the common ones)."""
    return check_experts(ctx) if number == 2 else []


# -- level 3: Megatron-FSDP ---------------------------------------------------------------------------------------

def megatron_fsdp(record: dict, judged: list[tuple[dict, Verdict]]) -> LevelOutcome:
    """The run passed, and the wrapper's traced command selected Megatron-FSDP with gradient_accumulation_fusion
    off for actor, ref and critic."""
    from env import presets

    out = single_run(record, judged)
    entry, v = judged[-1]
    if str((entry.get("wrapper_env") or {}).get("NUM_GPUS", "1")) == "1":  # said for a Fail too: what it covered
        out.limitations.append("Megatron-FSDP on one GPU: nothing is sharded across ranks (no cross-rank "
                               "all-gather/reduce-scatter, one-rank DTensor shards); run with --num-gpus 2 or more")
    if v.final_result != "Pass":
        return out
    trace = _trace_of(record, entry)
    if trace is None:
        return _fail_variant(out, "the wrapper's traced command (set -x) is not in the log: Megatron-FSDP selection "
                                  "unknown")
    if trace.get(FSDP_KEY) != "True":
        return _fail_variant(out, f"the run used {FSDP_KEY}={trace.get(FSDP_KEY, 'unset')}: Megatron DDP, not "
                                  "Megatron-FSDP", "unknown")
    missing = [o for o in presets.GRAD_ACCUM_FUSION_OFF if trace.get(o.split("=", 1)[0].lstrip("+")) != "False"]
    if missing:
        return _fail_variant(out, f"Megatron-FSDP selected but the run lacks {', '.join(missing)}", "unknown")
    out.variant_detail = (f"{FSDP_KEY}=True with gradient_accumulation_fusion=False for actor, ref and critic "
                          f"(traced command): {out.run_detail}")
    return out


# -- level 4: architecture-specific -------------------------------------------------------------------------------



def architecture_specific(record: dict, judged: list[tuple[dict, Verdict]]) -> LevelOutcome:
    from env import presets

    out = single_run(record, judged)
    entry, _ = judged[-1]
    opts = record.get("options") or {}
    feature, script = opts.get("feature"), opts.get("script") or presets.WRAPPER
    overrides = list(opts.get("extra_overrides") or [])
    trace = _trace_of(record, entry)
    out.limitations += feature_limitations(feature, script, trace, overrides)
    shown = " ".join(overrides) if overrides else "none"
    what = f"feature {feature or 'unspecified'} via {script}; extra overrides: {shown}"
    out.variant_detail = f"{what}: {out.variant_detail}"
    out.coverage = f"feature {feature or 'unspecified'}, script {script}"
    out.proves = (f"verl ran {script} end to end with the feature '{feature or 'unspecified'}' model "
                  "(see Limitations for what the run does not cover)")
    out.facts = {"feature": feature, "script": script, "extra_overrides": overrides}
    return out


# -- level 5: learning signal ---------------------------------------------------------------------------------------

FOLLOW_UPS_BY_CHECK = {
    "finite metrics": "non-finite metrics: check the provider's numerics (dtype, loss scaling, init) at the first "
                      "bad step named above; rerun level 0 for a single step",
    "trainable adapter": "no trainable adapter parameters: check the LoRA target module names and that the provider "
                         "uses the non-vanilla Bridge PEFT path",
    "several steps": "too few logged steps for a learning signal: rerun with --steps 20 (or 50-100)",
    "non-zero gradients": "repeated zero grad norm: check that the adapter/provider parameters require grad and are "
                          "in the optimizer",
    "changing log-probs": "constant log-prob metrics: the policy does not change or log-probs are not computed; "
                          "check the adapter wiring",
    "trend": "no learning signal: rerun longer (--steps 50-100) with fixed data/seed, or compare with --baseline "
             "RUN_DIR of a known-good run",
    "baseline": "below the known-good baseline: keep rollout, reward model, data, batch sizes and checkpoint fixed "
                "between both runs, then compare again",
}


def _baseline_metrics(path: str) -> dict[int, dict[str, float]]:
    from sessions.judge import metrics

    base = Path(path)
    if (base / metrics.METRICS_CSV).is_file():
        return metrics.read_csv(base / metrics.METRICS_CSV)
    from sessions.judge.verdict import judge_log

    return judge_log(base / "verl.log").step_metrics


def learning_signal(record: dict, judged: list[tuple[dict, Verdict]]) -> LevelOutcome:
    """Every check of the procedure's level-5 list on the run's step metrics; writes metrics.csv and the plot."""
    from sessions.judge import metrics
    from sessions.run import plots

    out = single_run(record, judged)
    entry, v = judged[-1]
    opts = record.get("options") or {}
    trace = _trace_of(record, entry) or {}
    env = entry.get("wrapper_env") or {}
    lora_rank = trace.get("actor_rollout_ref.model.lora.rank", env.get("LORA_RANK", "0"))
    critic = trace.get("algorithm.adv_estimator", env.get("ADV_ESTIMATOR", "gae")) == "gae"
    threshold = metrics.parse_threshold(opts["threshold"]) if opts.get("threshold") else None
    baseline_dir = opts.get("baseline")
    baseline = _baseline_metrics(baseline_dir) if baseline_dir else None
    rep = metrics.check_learning_signal(v.step_metrics, steps_expected=v.steps_expected, adapters=v.adapters,
                                        lora_enabled=lora_rank not in ("0", ""), critic_expected=critic,
                                        baseline=baseline, threshold=threshold)
    run_dir = record.get("run_dir")
    files: dict[str, str] = {}
    if run_dir:
        files["metrics_csv"] = str(metrics.write_csv(Path(run_dir) / metrics.METRICS_CSV, v.step_metrics))
        try:
            files["plot"] = str(plots.plot_metrics(Path(run_dir) / plots.PLOT_PNG, v.step_metrics, baseline,
                                                   f"level 5 {record.get('model', '')}"))
        except plots.PlotUnavailable as e:
            out.limitations.append(f"no plot: {e}")
    directions = metrics.describe_directions(rep)
    out.facts = {"checks": [{"check": f.check, "ok": f.ok, "detail": f.detail} for f in rep.findings],
                 "directions": directions, "baseline": baseline_dir, "threshold": str(threshold) if threshold else None,
                 "threshold_value": rep.threshold_value, "converged": rep.converged, **files}
    if files:
        out.key_lines.append("per-step metrics: " + ", ".join(files.values()))
    steps = f"{rep.steps} step(s)"
    requested = [f"{v.steps_expected or rep.steps} steps"]
    if baseline_dir:
        requested.append(f"baseline {baseline_dir}")
    if threshold:
        requested.append(f"threshold {threshold}")
    out.limitations.append("learning signal over a short run, not a benchmark convergence claim"
                           + ("" if rep.converged else " (no agreed threshold met)"))

    failed = rep.failed
    if v.final_result == "Blocked":
        out.coverage = f"{', '.join(requested)}: learning signal not judged (run Blocked)"
        return out
    if failed:
        first = failed[0]
        detail = "learning signal not shown: " + "; ".join(f"{f.check}: {f.detail}" for f in failed)
        out.variant_status, out.variant_detail = "Fail", detail
        out.category = out.category if v.final_result != "Pass" else first.category
        out.follow_ups += [FOLLOW_UPS_BY_CHECK[f.check] for f in failed if f.check in FOLLOW_UPS_BY_CHECK]
        if v.final_result != "Pass" and first.check == "finite metrics":
            out.run_detail = f"{out.run_detail} ({first.detail})"
        out.coverage = f"{', '.join(requested)}: learning signal not shown ({', '.join(f.check for f in failed)})"
        return out
    if v.final_result != "Pass":
        out.coverage = f"{', '.join(requested)}: learning signal not judged (run {v.final_result})"
        return out
    trend = "; ".join(str(t) for t in rep.trends if t.expected == "up" and t.metric in
                      metrics.headline_keys(v.step_metrics))
    if rep.converged:
        word = f"converged: threshold {threshold} met ({threshold.metric}={rep.threshold_value:.4g} at step " \
               f"{rep.threshold_step})"
    else:
        word = "learning-signal passed"
        if threshold is not None:
            got = ("never logged" if rep.threshold_value is None
                   else f"{rep.threshold_value:.4g} at step {rep.threshold_step}")
            word += f" (threshold {threshold} not met: {threshold.metric} {got}: not converged)"
            out.follow_ups.append(f"threshold {threshold} not met: not converged; run longer (--steps 50-100) for a "
                                  "convergence claim")
    checks = ", ".join(f.check for f in rep.findings)
    base = ""
    if baseline is not None:
        base = "; vs baseline: " + "; ".join(metrics.vs_baseline(t) for t in rep.baseline_trends)
    out.variant_detail = f"{word} over {steps}: {trend}{base}; checks passed: {checks}"
    out.coverage = f"{', '.join(requested)}: {word}"
    out.proves = f"{word} over {steps} ({trend}) without NaN, zero gradients, frozen adapters or constant log-probs"
    return out


RuleFn = Callable[[dict, list[tuple[dict, Verdict]]], LevelOutcome]
RULES: dict[int, RuleFn] = {
    1: save_resume,
    2: parallel_stress,
    3: megatron_fsdp,
    4: architecture_specific,
    5: learning_signal,
}


def combine(level: int, record: dict, judged: list[tuple[dict, Verdict]]) -> LevelOutcome:
    if not judged:
        return LevelOutcome("Skipped", "verl not started", "Skipped", "verl not started", "unknown")
    return RULES.get(level, single_run)(record, judged)
