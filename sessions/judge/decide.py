"""The decision: `decide(evidence) -> Verdict`, a pure function of what the log showed (evidence.py).

Categories come from where the failure happened first (structure.py: the Ray method that raised, the packages of
the frames nearest the exception), then from the exception's type and message (the pattern table); `unknown` only
when none of the three says anything, and `Verdict.category_evidence` says which were looked at and which decided.
Blocked needs environment evidence before the provider was exercised: after training steps an environment fault
is Fail with its category and the environment hint.
"""

from __future__ import annotations

import os
import re
from typing import Any

from sessions.judge.evidence import (
    ANY_SOURCE,
    BLOCKED_EVIDENCE,
    MAX_EVENTS,
    MAX_NOISE,
    METRICS_HEAD_STEPS,
    METRICS_TAIL_STEPS,
    Evidence,
    _ErrorEvent,
    _shorten,
    _text,
    head_metrics,
    parse_metrics,
)
from sessions.judge.frames import frame_category
from sessions.judge.logstream import normalise
from sessions.judge.patterns import (
    CATEGORY_HINTS,
    FOLLOW_UPS,
    H_DEVICE_INIT,
    H_DISK,
    H_LORA,
    ROLLOUT_SOURCE_RE,
    WRAPPED_CATEGORIES,
)
from sessions.judge.record import NOT_SHOWN, PHASE_INDEX, PHASES, Criterion, Verdict
from sessions.judge.structure import (
    AREA_PHASES,
    category_from_structure,
    communication_fault,
    exception_type,
    failure_signature,
    method_area,
)

# named causes that are what happens after another failure (a rank dies, its peers time out in the collective, the
# engine reports the root cause "above"): an exception line before them is the cause
CONSEQUENCES = ("actor-died", "hang-watchdog", "nccl-timeout", "vllm-engine", "ray-get-timeout")
RAY_DAEMONS = ("raylet", "autoscaler", "gcs_server", "dashboard", "monitor")  # their tracebacks are Ray's own
CREATION_RE = re.compile(r"error raised in its creation task|Exception raised in creation task")
LOGGED_FILE_RE = re.compile(r"[\[(\s\"](/[^\s\]\")]+\.py)\b")
LORA_RE = re.compile(r"(?i)lora|peft|adapter|target_module")
# the key Hydra / omegaconf rejected: `Could not override 'a.b.c'.` (full key), `Key 'c' is not in struct` (leaf)
REJECTED_KEY_RE = re.compile(r"Could not override '([^']+)'|Key '([^']+)' is not in struct")
HYDRA_REJECTIONS = ("hydra-override", "hydra-struct")
# environment categories: Blocked before the provider ran, Fail (with the same hint) after training steps
ENV_CATEGORIES = ("env-ray-import", "env-visible-devices", "env-no-gpu", "env-disk", "env-dependency", "data",
                  "reward-model", "config", "wrong-bridge")
# a missing package or extension: the code that imports it never ran, whatever trained before (a save path's
# modelopt dependency after step 1): what preflight calls Blocked for the same fault (SPEC), not a provider fault
BLOCKED_AT_ANY_STEP = ("env-dependency",)
CAUSE_CATEGORIES = ("oom", "nccl", "hang", "nan-metrics", "actor-died", "interrupted", *ENV_CATEGORIES)


def _wrong_bridge_paths(ev) -> list[str]:
    wrong = []
    for path in ev.bridge_paths:
        if "site-packages" in path or "dist-packages" in path:
            wrong.append(path)
        elif ev.bridge_src and not os.path.normpath(path).startswith(ev.bridge_src):
            wrong.append(path)
    return wrong



def _decisive(ev, events: list[_ErrorEvent]) -> _ErrorEvent | None:
    """The event naming the cause among `events` (errors the run did not survive)."""
    real = [e for e in events if not e.noise]
    # the first named cause; a wrapper (`RayTaskError(X)`) only when its inner line names none, an interrupt
    # only when nothing else is named
    specific = sorted((e for e in real if e.specific),
                      key=lambda e: (e.pattern.category == "interrupted", e.wrapper_method is not None, e.seq))
    plain = [e for e in real if e.pattern is None and not e.log_error and not e.wrapper_method and not e.cut
             and not CREATION_RE.search(e.text)]
    if specific:
        first = specific[0]
        if first.pattern.name in CONSEQUENCES:  # a death or timeout after an exception: that exception is the cause
            earlier = [e for e in plain if e.seq < first.seq and e.source not in RAY_DAEMONS]
            if earlier:
                return earlier[0]
        return first
    driver = ev.driver_failure_seq
    chain = [e for e in plain if driver is not None and e.source is None and e.seq >= driver]
    if chain:  # the driver failed: its chain names the failure (a worker's earlier traceback may be a thread's)
        return chain[0]
    if plain:  # the first plain exception line: in a Ray chain, the innermost remote exception
        return plain[0]
    wrappers = [e for e in real if e.wrapper_method and not e.log_error]
    if wrappers:  # the innermost `RayTaskError(X): ray::...` line (its X: line may be cut off)
        return wrappers[-1]
    cut = [e for e in real if e.cut]
    if cut:
        return cut[0]
    other = [e for e in real if e.pattern is not None] or [e for e in real if e.log_error]
    return other[0] if other else None



def _script_passed_rejected_key(ev: Evidence, event: _ErrorEvent) -> bool:
    """Whether the key Hydra rejected is one the traced script command passed (`+ python3 -m verl... key=v`): the
    script was written for another verl release than the one installed (SPEC: wrapper and verl from different
    releases) - a dependency mismatch, not a key the user mistyped (no trace: `config`)."""
    found = REJECTED_KEY_RE.search(event.text)
    if not found or not ev.traced_command:
        return False
    key = found.group(1) or found.group(2)
    if found.group(1):  # the full key, maybe with Hydra's +/++ in the command
        return re.search(r"(?:^|[\s'\"])\+{0,2}" + re.escape(key) + "=", ev.traced_command) is not None
    return re.search(r"[\s'\".+]" + re.escape(key) + "=", ev.traced_command) is not None


def _logged_only(event: _ErrorEvent) -> bool:
    """A logger's ERROR line that names no cause (not Hydra's "Error executing job": the driver failing)."""
    return event.log_error and event.pattern is None and not event.text.startswith("Error executing job")


def _missing_extension(ev: Evidence, events: list[_ErrorEvent]) -> _ErrorEvent | None:
    """An error naming a compiled extension the engine reported missing earlier (`No module named
    'vllm._moe_C_stable_libtorch'`, then `'_moe_C' object has no attribute 'topk_softmax'`): that missing module is
    the first relevant error (Blocked env-dependency), not the engine's later echoes."""
    if not ev.missing_ext:
        return None
    for event in events:
        if event.noise:
            continue
        for name, shown in ev.missing_ext.items():
            stem = name.split("_C")[0] + "_C" if "_C" in name else name
            if f"'{stem}'" in event.text or f".{stem}." in event.text:
                return _ErrorEvent(event.seq, None, None, shown, None, event.phase, event.step,
                                   extension=name)
    return None


def _classify(ev: Evidence, event: _ErrorEvent, events: list[_ErrorEvent],
              found: dict[str, Any]) -> tuple[str, str, str, str | None]:
    """-> (result, category, phase, hint) for the decisive error event; `found` gets what was looked at."""
    # the innermost Ray method of the decisive event's chain: the last one up to it (a later `Unhandled error` of
    # another task is not its chain), else any
    methods = [e.wrapper_method for e in events if e.wrapper_method and e.seq <= event.seq] or \
        [e.wrapper_method for e in events if e.wrapper_method]
    method = methods[-1] if methods else None
    area = method_area(method)
    # a nested method of a worker names the place better than TaskRunner.run() around it
    if area == "setup" and len(methods) > 1:
        area = next((a for a in map(method_area, reversed(methods)) if a and a != "setup"), area)
    if area == "setup" and ev.fit_seen:
        area = "training"  # TaskRunner.run() -> trainer.fit(): raised in the training loop
    if area == "setup" and (event.step > 0 or ev.reached >= PHASE_INDEX["training"]):
        area = None  # TaskRunner.run() holds the whole loop: "setup" only before any worker trained
    # the innermost verl frame's function is finer than the Ray method around it (`_build_rollout` in init_model,
    # `_load_checkpoint` in TaskRunner.run(), `update_params` of the sharding manager in generate_sequences)
    where = event.where or next((e.where for e in reversed(events) if e.where), None)
    by_method = area
    if not (area == "reward" and where in ("model-build", "training")):  # the role `rm` stays the reward model
        area = where or area
    phase = AREA_PHASES.get(where or area, event.phase) if where or area else event.phase
    building = area in ("model-build", "worker-creation") if area else ev.reached < PHASE_INDEX["model-built"]
    frames = event.area if event.area and not event.wrapper_method else None
    frames = frames or event.nearest or next((e.area for e in reversed(events) if e.area), None)
    if frames is None and ".py" in event.text:  # a logger's `ERROR [/path/file.py]`: the file that logged it
        logged = LOGGED_FILE_RE.search(event.text)
        frames = frame_category(logged.group(1)) if logged else None
    exc = event.wrapped or exception_type(event.text) or next((e.wrapped for e in reversed(events) if e.wrapped),
                                                               None)
    pattern = event.pattern
    found.update(looked_at=["method", "function", "frames", "message"], method=method, method_area=by_method,
                 function_area=where, area=area, frames=frames, exception=exc,
                 message=pattern.name if pattern else None)
    if event.extension:
        found.update(message="missing compiled extension", decided_by="message")
        return _result(ev, event, "Blocked", "env-dependency", phase,
                       f"the engine's compiled extension '{event.extension}' is missing in the run's Python "
                       "(the engine's later errors come from it): install the engine build that has it; an "
                       "environment fault, not a Bridge provider problem.")
    named = pattern is not None and pattern.specific
    if named and (pattern.category in CAUSE_CATEGORIES or pattern.result == BLOCKED_EVIDENCE):
        found["decided_by"] = "message"  # a named cause (OOM, NCCL, missing package...) wherever it happened
        result = "Blocked" if pattern.result == BLOCKED_EVIDENCE else "Fail"
        if pattern.category == "data" and area == "reward":  # the model files missing are the reward model's
            found["decided_by"] = "message and method"
            return _result(ev, event, result, "reward-model", phase, None)
        if pattern.name in HYDRA_REJECTIONS and _script_passed_rejected_key(ev, event):
            found["decided_by"] = "message and traced command"
            return _result(ev, event, result, "env-dependency", phase, pattern.hint)
        return _result(ev, event, result, pattern.category, phase, pattern.hint)
    created = any(CREATION_RE.search(e.text) for e in events)  # an actor's __init__ raised: no death
    wrapped = [WRAPPED_CATEGORIES[e.wrapped] for e in events if e.wrapped in WRAPPED_CATEGORIES
               and not (created and e.wrapped == "ActorDiedError")]
    if wrapped and wrapped[-1] != "env-ray-import":
        found["decided_by"] = "exception type"
        return _result(ev, event, "Fail", wrapped[-1], phase, None)
    structural = category_from_structure(area, frames, exc, building, communication_fault(exc, event.text))
    if named and not structural:  # (c) the message names what the structure cannot tell
        found["decided_by"] = "message"
        category, hint = pattern.category, pattern.hint
        if category == "provider" and phase == "checkpoint":
            category, hint = "checkpoint", None
        return _result(ev, event, "Fail", category, phase, hint)
    if structural:
        found["decided_by"] = ("frames" if not area or structural == frames else
                               "function" if area == where and area != by_method else "method")
        hint = pattern.hint if named and pattern.category == structural else None
        if structural == "provider" and LORA_RE.search(event.text):
            hint = H_LORA
        if structural == "data" and exc in ("FileNotFoundError", "IsADirectoryError") and \
                area in ("setup", "data", "model-build"):  # data or model files not there
            return _result(ev, event, "Blocked", "data", phase, None)
        if structural == "reward-model" and exc in ("FileNotFoundError", "IsADirectoryError") and \
                area in ("setup", "reward"):  # the reward function's or model's file is not there
            return _result(ev, event, "Blocked", "reward-model", phase, None)
        if structural == "env-no-gpu":  # verl's resource check refused the cluster, or a device would not init
            return _result(ev, event, "Blocked", structural, phase, H_DEVICE_INIT if frames == structural else None)
        return _result(ev, event, "Fail", structural, phase, hint)
    if wrapped:  # RayTaskError(ModuleNotFoundError) in a worker: its PYTHONPATH
        found["decided_by"] = "exception type"
        return _result(ev, event, "Blocked", wrapped[-1], phase, None)
    if pattern is not None:
        found["decided_by"] = "message"
        category, hint = pattern.category, pattern.hint
        if category == "provider" and phase == "checkpoint":
            category, hint = "checkpoint", None
        return _result(ev, event, "Fail", category, phase, hint)
    if ROLLOUT_SOURCE_RE.search(" ".join(filter(None, (event.source, event.inner, method)))):
        found["decided_by"] = "source"
        return _result(ev, event, "Fail", "rollout", phase, None)
    if phase == "checkpoint":
        found["decided_by"] = "phase"
        return _result(ev, event, "Fail", "checkpoint", phase, None)
    if phase == "model-build" and LORA_RE.search(event.text):
        found["decided_by"] = "message"
        return _result(ev, event, "Fail", "provider", phase, H_LORA)
    found["decided_by"] = "none"
    return _result(ev, event, "Fail", "unknown", phase, None)


def _result(ev: Evidence, event: _ErrorEvent, result: str, category: str, phase: str,
            hint: str | None) -> tuple[str, str, str, str | None]:
    """Blocked only before the provider was exercised: after training steps, or raised inside the trainer's fit()
    (its workers built, the loop running: a validation reward reading a column the data lacks), an environment
    fault (or an interruption) fails the run; its category and the environment hint stay."""
    if result == "Blocked" and category not in BLOCKED_AT_ANY_STEP and (
            event.step > 0 or ev.max_step > 0 or ev.saved_step > 0 or ev.fit_seen):
        result = "Fail"
        if category == "env-disk":
            hint = hint or H_DISK
    if phase == "launch" and ev.reached > PHASE_INDEX["launch"] and event.phase != "launch":
        phase = event.phase
    if event.step > 0 and PHASE_INDEX[phase] < PHASE_INDEX["training"]:
        phase = "training"  # after a training step the loop is training: a step's rollout or build does not go back
    return result, category, phase, hint


def _fatal_after_completion(ev, events: list[_ErrorEvent], shown_only: bool) -> list[_ErrorEvent]:
    """Errors after the run completed that still fail it: the driver failing, a dead actor, a named cause.
    `shown_only`: "complete" means only "it shows steps" (no planned total, no end marker): then any exception
    after the last step ends it (an excerpt that ends in a traceback did not finish), not a logger's ERROR line."""
    driver = ev.driver_failure_seq
    return [
        e for e in events if not e.noise and (
            (driver is not None and e.source is None and e.seq >= driver) or e.specific
            or (e.wrapper_method and e.source is None) or (shown_only and not e.log_error)
            or _trainer_raised(e)
        )
    ]


TRAINER_SOURCE_RE = re.compile(r"\w*TaskRunner\w*$|main_task$")


def _trainer_raised(event: _ErrorEvent) -> bool:
    """An exception line the trainer's own process printed (TaskRunner, old main_task): the loop raised."""
    return (event.source is not None and TRAINER_SOURCE_RE.match(event.source) is not None
            and event.pattern is None and not event.log_error and not event.wrapper_method and not event.cut)

def _criteria(ev, verdict: Verdict, vanilla: str | None, wrong_paths: list[str]) -> list[Criterion]:
    """The level's pass list, each Pass / Fail / not shown (SPEC "The verdict", 2)."""
    out = []
    if vanilla == "False":
        out.append(Criterion("VANILLA_MBRIDGE=False in the wrapper's output", "Pass", ev.key_lines["vanilla"]))
    elif vanilla == "True":
        out.append(Criterion("VANILLA_MBRIDGE=False in the wrapper's output", "Fail",
                             f"the wrapper ran with VANILLA_MBRIDGE=True: {ev.key_lines['vanilla']}"))
    else:
        out.append(Criterion("VANILLA_MBRIDGE=False in the wrapper's output", NOT_SHOWN,
                             "neither the wrapper's set -x trace nor its traced command line is in the log"))
    if wrong_paths:
        out.append(Criterion("local Bridge imported", "Fail", f"megatron.bridge imported from {wrong_paths[0]}"))
    elif ev.bridge_src:
        seen = f" ({len(ev.bridge_paths)} Bridge path(s) in the log, all under it)" if ev.bridge_paths else ""
        out.append(Criterion("local Bridge imported", "Pass",
                             f"no megatron.bridge file outside {ev.bridge_src} in the log{seen}"))
    elif ev.bridge_paths:
        out.append(Criterion("local Bridge imported", "Pass",
                             f"megatron.bridge from {ev.bridge_paths[0]} (not site-packages)"))
    else:
        out.append(Criterion("local Bridge imported", NOT_SHOWN, "the log names no megatron.bridge file"))
    expected = verdict.steps_expected
    if expected is None:
        out.append(Criterion("expected steps completed", NOT_SHOWN,
                             f"{verdict.steps_completed} step(s) logged; the expected count is not known"))
    else:
        done = max(verdict.steps_completed, ev.wandb_step or 0, expected if ev.bar_complete else 0)
        out.append(Criterion("expected steps completed", "Pass" if done >= expected else "Fail",
                             f"{done}/{expected} steps"))
    if ev.exit_code is None:
        out.append(Criterion("exit code 0", NOT_SHOWN, "exit code not given"))
    else:
        out.append(Criterion("exit code 0", "Pass" if ev.exit_code == 0 else "Fail", f"exit {ev.exit_code}"))
    return out

def _level_answer(ev, verdict: Verdict) -> None:
    criteria = verdict.criteria
    failed = [c for c in criteria if c.status == "Fail"]
    unseen = [c for c in criteria if c.status == NOT_SHOWN]
    level = f"Level {ev.level}"
    if verdict.result != "Pass":
        verdict.level_result, verdict.level_category = verdict.result, verdict.category
        verdict.level_summary = f"{level}: the run did not pass ({verdict.result}, {verdict.category})"
    elif failed:
        wrong = [c for c in failed if c.name in ("local Bridge imported", "VANILLA_MBRIDGE=False in the "
                                                                          "wrapper's output")]
        verdict.level_result = "Blocked" if wrong else "Fail"
        verdict.level_category = "wrong-bridge" if wrong else "unknown"
        verdict.level_summary = f"{level}: criterion failed: " + "; ".join(f"{c.name} ({c.detail})" for c in failed)
        verdict.follow_ups = [FOLLOW_UPS[verdict.level_category]]
    elif unseen:
        verdict.level_result, verdict.level_category = "Fail", "unknown"
        verdict.level_summary = f"{level}: the run passed but the log does not show: " + "; ".join(
            f"{c.name} ({c.detail})" for c in unseen)
        # no error to read (Level 1's run A log holds no resume): the log that shows each criterion
        verdict.follow_ups = [f"{c.name}: not shown by this log ({c.detail}); judge a log that shows it"
                              for c in unseen]
    else:
        verdict.level_result, verdict.level_category = "Pass", "success"
        verdict.level_summary = f"{level}: the run passed and every criterion passed"


def decide(ev: Evidence, *, level_rule: bool = False, log_path: str | None = None) -> Verdict:
    """The verdict from the evidence alone (a pure function: it reads `ev`, changes nothing). `level_rule`: also
    apply level N's own rule from the log (`judge --level N`); `log_path`: where the wrapper's trace is read."""
    expected, expected_source = ev._expected_steps()
    done = max(ev.max_step, ev.wandb_step or 0)
    if expected:  # a complete bar counts when it covers the expected count
        # an epochs-derived total: releases that count global steps from 0 log total - 1 as their last step
        complete = done >= expected - (expected_source == "epochs") or (
            ev.bar_complete and ev.bar is not None and ev.bar[1] >= expected)
    else:
        complete = done >= 1 or ev.bar_complete or ev.final_validation
    vanilla = None
    if ev.vanilla_values:
        vanilla = "True" if "True" in ev.vanilla_values else "False"
    verdict = Verdict(
        result="Fail", category="unknown", phase=PHASES[ev.reached], steps_completed=ev.max_step,
        steps_expected=expected, vanilla_mbridge=vanilla, exit_code=ev.exit_code,
        termination=ev.termination, level=ev.level, checkpoints_saved=list(ev.checkpoints_saved),
        resumed_from=ev.resumed_from, fresh_start=ev.fresh_start, adapters=[dict(b) for b in ev.adapters],
        bridge_paths=list(ev.bridge_paths), nan_metrics=list(ev.nan_findings),
        setting_limitations=dict(ev.setting_limitations),
    )
    key_lines = dict(ev.key_lines)
    verdict.step_metrics = {step: head_metrics(kept) for step, kept in ev.metrics_head.items()}
    for step, rest in ev.metrics_tail:
        verdict.step_metrics[step] = parse_metrics(_text(rest))
    if ev.last_step_line is not None:
        shown = normalise(_text(ev.last_step_line))
        key_lines["last_step"] = _shorten(shown[-1].text if shown else _text(ev.last_step_line), 240)
    limitations = list(ev.limitations)
    if ev.level == 0:
        limitations.append("Level 0 smoke: one PPO update proves the loop runs, not convergence")
    if ev.metrics_dropped:
        limitations.append(
            f"step metrics kept for the first {METRICS_HEAD_STEPS} and last {METRICS_TAIL_STEPS} steps only"
        )
    if ev.exit_code is None and ev.termination is None:
        limitations.append("exit code not given: judged from the log alone")
    if expected is None:
        limitations.append("expected steps unknown (not given, not in the log): completion = the steps it shows")
    if ev.resume_step is not None and ev.resumed_from is None:
        verdict.resumed_from = f"global_step_{ev.resume_step}"

    events = ev.events
    if ev.open_traceback is not None and len(events) < MAX_EVENTS:  # a traceback cut before its exception
        line = ev.open_traceback
        events = events + [_ErrorEvent(
            ev.seq + 1, line.source, line.inner, "a traceback without its exception line (the log is cut): "
            + line.text.strip(), None, ev.phase, ev.max_step,
            area=ev.areas.get(line.source) or ev.areas.get(ANY_SOURCE), cut=True,
            where=ev.cut_calls.get(line.source) or ev.wheres.get(line.source) or ev.wheres.get(ANY_SOURCE),
        )]
    decisive = _decisive(ev, events)
    extension = _missing_extension(ev, events)
    if extension is not None:  # the engine's compiled extension was missing: the first error, not its echoes
        decisive = extension
    where = f"step {ev.max_step} of {expected}" if expected else f"step {ev.max_step}"
    ends = (f"it ends after {where}" if ev.max_step else
            f"it ends before the first training step (last phase reached: {PHASES[ev.reached]})")
    result = category = hint = first_error = None
    found: dict[str, Any] = {}
    phase = verdict.phase

    if ev.termination == "interrupted":
        # SPEC's Blocked is "stopped before the provider was exercised": after a training step it is a Fail
        result, category = "Fail" if ev.max_step > 0 else "Blocked", "interrupted"
        first_error = f"interrupted by the launcher; {ends}"
        limitations.append("run interrupted before it ended: not evidence for or against the Bridge provider")
    elif complete:
        phase = "shutdown"
        fatal = _fatal_after_completion(ev, events, not expected and not ev.bar_complete and not ev.final_validation)
        late_noise = [e.shown() for e in events if e.noise or e not in fatal]
        residual = list(dict.fromkeys(ev.noise_after_last_step + late_noise))[:MAX_NOISE]
        if ev.nan_findings:
            result, category, phase = "Fail", "nan-metrics", "training"
            first_error = ev.nan_findings[0]
        elif fatal:
            late = _decisive(ev, fatal)
            result, category, late_phase, hint = _classify(ev, late, events, found)
            result = "Fail" if category not in ("interrupted",) else result
            if category == "checkpoint":  # the final save failed: that phase, not shutdown
                phase = late_phase
            first_error = late.shown()
        elif ev.exit_code not in (None, 0):
            result, category = "Fail", "unknown"
            first_error = f"the wrapper exited {ev.exit_code} after completing the steps"
            hint = "The steps completed but the wrapper failed at the end: check the tail of the log."
        else:
            result, category = "Pass", "success"
            if late_noise:
                limitations.append("error output after the last step, with the run otherwise complete")
        verdict.residual_noise = residual[:MAX_NOISE]
        if verdict.residual_noise and result == "Pass":
            limitations.append("shutdown warnings after the last step (residual noise)")
    elif decisive is not None and ev.termination != "timeout" and not _logged_only(decisive):
        result, category, phase, hint = _classify(ev, decisive, events, found)
        first_error = decisive.shown()
    elif ev.termination == "timeout":
        if decisive is not None and decisive.blocked:
            result, category, phase, hint = _classify(ev, decisive, events, found)
        else:
            result, category = "Fail", "hang"
        first_error = decisive.shown() if decisive is not None else f"no output before the stall timeout; {ends}"
        limitations.append("stopped by the stall timeout (no new output); the log was kept")
    elif ev.nan_findings:
        result, category, phase = "Fail", "nan-metrics", "training"
        first_error = ev.nan_findings[0]
    else:
        result, category, phase = "Fail", "unknown", PHASES[ev.reached]
        if ev.exit_code == 0:
            first_error = f"exit 0 but no exception line in the log; {ends}"
        else:
            first_error = f"no exception line in the log; {ends}"
        if decisive is not None:  # only a logger's ERROR line: it reports, it does not say why the run stopped
            first_error += f"; last logged error: {decisive.shown()}"
            found = {"looked_at": ["message"], "decided_by": "a logger's ERROR line only (no exception)"}
        hint = (
            "The log does not show enough to name a cause: it ends without the expected steps and without an "
            "error line (truncated, still running, or killed from outside: check the exit code, dmesg and the "
            "stall timeout)."
        )
        if ev.input_note:
            first_error = f"the file is not a text log ({ev.input_note}): {first_error}"
            hint = ("The file given is not a verl log (empty, or binary such as an executable or random bytes): "
                    "pass the log file the run wrote.")

    if category == "actor-died" and ev.death_causes:
        hint = f"the raylet's cause: {', '.join(ev.death_causes)}. " + (hint or CATEGORY_HINTS["actor-died"])
    verdict.result, verdict.category, verdict.phase = result, category, phase
    verdict.category_evidence = found or {"looked_at": [], "decided_by": "no error line" if result != "Pass"
                                          else "success"}
    verdict.first_error = first_error
    verdict.hint = hint if hint is not None else CATEGORY_HINTS.get(category)
    if ev.events_dropped:
        limitations.append(f"further error lines after the first {MAX_EVENTS} not kept (an error storm)")
    if result == "Blocked":
        limitations.append("Blocked: not evidence against the Bridge provider")
    elif category in ENV_CATEGORIES and ev.saved_step > ev.max_step:  # why an environment fault is no Blocked
        limitations.append(f"steps: no metrics line shows step {ev.saved_step}; its checkpoint save "
                           f"(global_step_{ev.saved_step}) shows it trained: after the provider ran, an environment "
                           "fault is a Fail")
    if ev.input_note and "not a text log" not in (first_error or ""):  # said once: here, or in the first error
        limitations.append(f"the input is not a text log ({ev.input_note} file): no verl output to judge")
    verdict.limitations = list(dict.fromkeys(limitations))
    verdict.follow_ups = [FOLLOW_UPS[category]] if result != "Pass" else ["none"]
    verdict.key_lines = _key_lines(key_lines, verdict)
    verdict.signature = failure_signature(verdict.category, verdict.first_error) if result != "Pass" else ""
    verdict.summary = _summary(verdict, expected_source)
    if ev.level is not None:
        verdict.criteria = _criteria(ev, verdict, vanilla, _wrong_bridge_paths(ev))
        if level_rule:
            from sessions.judge.level_criteria import level_criteria

            more, notes = level_criteria(ev.level, verdict, log_path)
            verdict.criteria += more
            verdict.limitations += [n for n in notes if n not in verdict.limitations]
        _level_answer(ev, verdict)
    return verdict



def _key_lines(key_lines: dict[str, str], verdict: Verdict) -> list[str]:
    order = (
        "vanilla", "steps_printed", "steps_override", "steps_trace", "adapters", "fresh_start", "resume_found",
        "resume", "checkpoint_save", "checkpoint_done", "validation", "progress", "last_step", "final_validation",
        "wandb_step",
    )
    adapters = [line for name, line in key_lines.items() if name.startswith("adapter_")]  # every block, in order
    lines = [line for name in order for line in (adapters if name == "adapters" else [key_lines.get(name)]) if line]
    if verdict.first_error:
        lines.append(verdict.first_error)
    return lines


def _summary(verdict: Verdict, expected_source: str) -> str:
    steps = f"{verdict.steps_completed}/{verdict.steps_expected if verdict.steps_expected else '?'} steps"
    if verdict.result == "Pass":
        return f"verl completed {steps} with no fatal error"
    if verdict.category == "interrupted":
        return f"the run was interrupted in phase {verdict.phase} ({steps}); not evidence either way"
    if verdict.result == "Blocked":
        return f"the environment stopped the run in phase {verdict.phase}: {verdict.category} ({steps})"
    return f"{verdict.category} failure in phase {verdict.phase} ({steps})"
