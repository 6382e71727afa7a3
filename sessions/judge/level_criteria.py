"""`invoke judge --level N`: level N's own rule read from one log, as criteria (Pass / Fail / not shown) next to
the generic four. The same rules the level run applies (sessions/run/level_rules.py), with what a single log can
show: Level 1's save and resume lines, Level 2's traced parallel sizes, Level 3's `use_megatron_fsdp=True` with the
fusion overrides, Level 4's feature limits, Level 5's learning signal. A criterion the log cannot show is named."""

from __future__ import annotations

import os
from pathlib import Path

from sessions.judge.record import NOT_SHOWN, Criterion, Verdict

NO_TRACE = "the wrapper's traced command (set -x) is not in the log"


def _trace(log_path: str | None) -> dict[str, str] | None:
    if not log_path:
        return None
    from sessions.judge.trace import traced_overrides

    return traced_overrides(Path(log_path))


def _step_of(path: str | None) -> int | None:
    name = os.path.basename(os.path.normpath(path or ""))
    return int(name[12:]) if name.startswith("global_step_") and name[12:].isdigit() else None


def level1(v: Verdict) -> list[Criterion]:
    saved = sorted(s for s in map(_step_of, v.checkpoints_saved) if s is not None)
    resumed = _step_of(v.resumed_from)
    trained = sorted(s for s in v.step_metrics if s > 0)
    out = []
    if resumed is None:  # run A's log: it saves global_step_1; the resume is run B's (another log)
        out.append(Criterion("checkpoint global_step_1 saved (run A)", "Pass" if 1 in saved else "Fail",
                             f"saved: {', '.join(v.checkpoints_saved) or 'no save line in the log'}"))
        out.append(Criterion("resumed from global_step_1 (run B)", NOT_SHOWN,
                             "this log logs no resume (run A, or a fresh start): run B's log shows it"))
        out.append(Criterion("step 2 trained and global_step_2 saved (run B)", NOT_SHOWN, "run B's log shows it"))
        return out
    out.append(Criterion("checkpoint global_step_1 saved (run A)", "Pass" if resumed == 1 else "Fail",
                         f"run B resumed from {v.resumed_from}"))
    out.append(Criterion("resumed from global_step_1 (run B)", "Pass" if resumed == 1 else "Fail",
                         f"resumed from {v.resumed_from}"))
    ok = bool(trained) and trained[0] == 2 and v.steps_completed >= 2 and 2 in saved
    out.append(Criterion("step 2 trained and global_step_2 saved (run B)", "Pass" if ok else "Fail",
                         f"trained steps {trained or 'none'}; saved {', '.join(v.checkpoints_saved) or 'nothing'}"))
    return out


def level2(trace: dict[str, str] | None) -> list[Criterion]:
    from env import presets
    from sessions.judge.trace import TRACE_KEYS

    name = "variant's parallel sizes in the traced command"
    if trace is None:
        return [Criterion(name, NOT_SHOWN, NO_TRACE)]
    variant = "moe" if trace.get(TRACE_KEYS["COMMON_EP"], "1") not in ("1", "") else "dense"
    want = {k: val for k, val in presets.LEVELS[2].variants[variant].items() if k in TRACE_KEYS}
    wrong = [f"{TRACE_KEYS[k]}={trace.get(TRACE_KEYS[k], 'unset')} (want {val})" for k, val in want.items()
             if trace.get(TRACE_KEYS[k]) != val]
    sizes = " ".join(f"{k.replace('COMMON_', '')}={val}" for k, val in want.items())
    return [Criterion(name, "Fail" if wrong else "Pass", f"{variant}: " + ("; ".join(wrong) if wrong else sizes))]


def level3(trace: dict[str, str] | None) -> list[Criterion]:
    from env import presets
    from sessions.judge.trace import FSDP_KEY

    name = "Megatron-FSDP (use_megatron_fsdp=True, gradient_accumulation_fusion=False) in the traced command"
    if trace is None:
        return [Criterion(name, NOT_SHOWN, NO_TRACE)]
    if trace.get(FSDP_KEY) != "True":
        return [Criterion(name, "Fail", f"{FSDP_KEY}={trace.get(FSDP_KEY, 'unset')}: Megatron DDP, not FSDP")]
    missing = [o for o in presets.GRAD_ACCUM_FUSION_OFF if trace.get(o.split("=", 1)[0].lstrip("+")) != "False"]
    if missing:
        return [Criterion(name, "Fail", f"Megatron-FSDP selected but the run lacks {', '.join(missing)}")]
    return [Criterion(name, "Pass", f"{FSDP_KEY}=True, fusion off for actor, ref and critic")]


def level5(v: Verdict, trace: dict[str, str] | None) -> list[Criterion]:
    from sessions.judge import metrics

    trace = trace or {}
    lora = trace.get("actor_rollout_ref.model.lora.rank", "4" if v.adapters else "0") not in ("0", "")
    critic = trace.get("algorithm.adv_estimator", "gae" if any(
        k.startswith("critic/vf_loss") for m in v.step_metrics.values() for k in m) else "grpo") == "gae"
    rep = metrics.check_learning_signal(v.step_metrics, steps_expected=v.steps_expected, adapters=v.adapters,
                                        lora_enabled=lora, critic_expected=critic)
    failed = rep.failed
    detail = "; ".join(f"{f.check}: {f.detail}" for f in failed) if failed else \
        "; ".join(f.detail for f in rep.findings if f.check == "trend")
    return [Criterion("learning signal", "Fail" if failed else "Pass",
                      ("learning signal not shown: " if failed else "learning-signal passed: ") + detail)]


def level_criteria(level: int | None, v: Verdict, log_path: str | None) -> tuple[list[Criterion], list[str]]:
    """(criteria, limitations) of level N's own rule on this log."""
    if level in (None, 0):
        return [], []
    if level == 1:
        return level1(v), []
    if level == 2:
        return level2(_trace(log_path)), []
    if level == 3:
        return level3(_trace(log_path)), []
    if level == 4:
        from sessions.judge.trace import feature_limitations

        return [], feature_limitations(None, None, _trace(log_path), [])
    if level == 5:
        return level5(v, _trace(log_path)), []
    return [], []
