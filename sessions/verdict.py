"""The verdict engine: reads a verl log (streamed) and says Pass / Fail / Blocked, with category and evidence.

Contract used by the rest of the tool (level runner, reports, `invoke judge`):

    judge_log(path, *, level=None, steps_expected=None, exit_code=None, termination=None) -> Verdict

`termination` is what the launcher knows and the log cannot: None (the wrapper ended by itself),
"interrupted" (our process got SIGINT/SIGTERM and stopped the wrapper) or "timeout" (stall timeout).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import deque
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from sessions.logstream import LogLine, ScanStats, join_wrapped, normalise, scan_file, step_line_match
from sessions.patterns import (
    CATEGORY_HINTS,
    CORE_METRIC_RE,
    FOLLOW_UPS,
    H_LORA,
    LAST_ONLY_NEEDLE,
    METHOD_PHASES,
    RAY_WRAPPER_RE,
    ROLLOUT_SOURCE_RE,
    SCAN_NEEDLES_EARLY,
    SCAN_NEEDLES_FULL,
    SCAN_NEEDLES_MIDDLE,
    TRACEBACK_NEEDLE,
    Pattern,
    compiled,
)

RESULTS = ("Pass", "Fail", "Blocked")
CATEGORIES = (
    "success", "provider", "checkpoint", "nan-metrics", "oom", "nccl", "rollout", "data", "reward-model",
    "env-ray-import", "env-visible-devices", "env-no-gpu", "env-disk", "env-dependency", "wrong-bridge",
    "timeout", "interrupted", "unknown",
)
PHASES = ("launch", "ray-up", "model-build", "model-built", "rollout-up", "training", "checkpoint", "shutdown")


@dataclass
class Verdict:
    result: str  # one of RESULTS
    category: str  # one of CATEGORIES
    phase: str  # phase in which the first fatal error happened, else the last phase reached
    steps_completed: int = 0  # highest N of a `step:N` metrics line (training steps, step:0 excluded)
    steps_expected: int | None = None
    vanilla_mbridge: str | None = None  # "False"/"True" as the wrapper's own trace printed it; None if unseen
    first_error: str | None = None  # the innermost relevant error line, normalised
    key_lines: list[str] = field(default_factory=list)  # evidence lines for the report
    limitations: list[str] = field(default_factory=list)
    follow_ups: list[str] = field(default_factory=list)
    hint: str | None = None  # triage hint of the category / pattern
    residual_noise: list[str] = field(default_factory=list)  # shutdown noise after the last step (not failing)
    exit_code: int | None = None
    termination: str | None = None
    # facts for level rules (level 1 checkpoints, level 5 metrics)
    step_metrics: dict[int, dict[str, float]] = field(default_factory=dict)  # step -> {key: value}
    checkpoints_saved: list[str] = field(default_factory=list)  # paths of `Saving checkpoint to .../global_step_N`
    resumed_from: str | None = None  # path the run resumed from, if it logged a resume
    fresh_start: bool = False  # logged "Training from scratch" / tracker file missing
    adapter: dict[str, Any] = field(default_factory=dict)  # {"total": int, "adapter": int, "trainable_pct": float}
    bridge_paths: list[str] = field(default_factory=list)  # megatron.bridge file paths printed in the log
    # limitations read from settings in the log (pattern needle -> text), so a caller that applied the setting
    # itself and already said why can leave the log's restatement out
    setting_limitations: dict[str, str] = field(default_factory=dict)
    # added by the verdict engine (issue 7)
    summary: str = ""  # one sentence after "Result: <result> - " in the report
    level: int | None = None
    nan_metrics: list[str] = field(default_factory=list)  # "step N: key=value" for non-finite core metrics

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["step_metrics"] = {str(k): v for k, v in self.step_metrics.items()}
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Verdict:
        data = dict(data)
        data["step_metrics"] = {int(k): v for k, v in (data.get("step_metrics") or {}).items()}
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


# ---------------------------------------------------------------------------------------------------------------
# The engine
# ---------------------------------------------------------------------------------------------------------------

PHASE_INDEX = {name: i for i, name in enumerate(PHASES)}
EXIT_BY_RESULT = {"Pass": 0, "Fail": 1, "Blocked": 3}
EXIT_BAD_USAGE = 2

MAX_EVENTS = 400  # latest error events kept (the decisive ones are the latest: after the last progress)
MAX_NOISE = 20
MAX_BRIDGE_PATHS = 20
METRICS_HEAD_STEPS = 250  # step metrics kept for the first N steps ...
METRICS_TAIL_STEPS = 250  # ... and the last N (memory stays flat on endless logs)
MAX_LINE_SHOWN = 400

STEP_RE = re.compile(r"(?<![\w/])step:(\d+)\s+-\s+(.*)$")
NP_NUMBER_RE = re.compile(r"^np\.\w+\((.*)\)$")
OPTIONAL_MODULE_RE = re.compile(
    r"No module named '(?:torchtitan|mindspeed|torch_npu|liger_kernel|deep_gemm|deep_ep|flashinfer)"
)
ALL_NEEDLES = SCAN_NEEDLES_FULL + SCAN_NEEDLES_EARLY + (LAST_ONLY_NEEDLE,)
FULL_NEEDLES_BYTES = tuple(n.encode() for n in SCAN_NEEDLES_FULL + SCAN_NEEDLES_EARLY)
MIDDLE_NEEDLES_BYTES = tuple(n.encode() for n in SCAN_NEEDLES_MIDDLE)
EARLY_NEEDLES_BYTES = tuple(n.encode() for n in SCAN_NEEDLES_EARLY)
TABLE = compiled()


def parse_metrics(rest: str) -> dict[str, float]:
    """`key:value - key:value ...` -> {key: float}; accepts np.float64(x), nan/inf, scientific; skips text values."""
    metrics: dict[str, float] = {}
    for part in rest.split(" - "):
        key, sep, raw = part.partition(":")
        if not sep:
            continue
        raw = raw.strip()
        if raw.startswith("np."):
            match = NP_NUMBER_RE.match(raw)
            raw = match.group(1) if match else raw
        try:
            metrics[key.strip()] = float(raw)
        except ValueError:
            continue
    return metrics


@dataclass
class _ErrorEvent:
    seq: int
    source: str | None
    inner: str | None
    text: str
    pattern: Pattern | None  # None: a generic exception line
    phase: str
    progress: int  # progress counter when seen: later progress means the run survived it
    noise: bool = False
    wrapper_method: str | None = None  # `RayTaskError(X): ray::Actor.method()` lines

    @property
    def specific(self) -> bool:
        return self.pattern is not None and self.pattern.specific

    def shown(self) -> str:
        prefix = f"({self.source}) " if self.source else ""
        return _shorten(prefix + self.text)


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _shorten(text: str, limit: int = MAX_LINE_SHOWN) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Judge:
    def __init__(self, level, steps_expected, exit_code, termination, bridge_src):
        self.level = level
        self.steps_expected_arg = steps_expected
        self.exit_code = exit_code
        self.termination = termination
        self.bridge_src = os.path.normpath(bridge_src) if bridge_src else None
        self.seq = 0
        self.phase = "launch"  # current activity
        self.reached = 0  # index of the furthest phase reached
        self.progress = 0
        self.max_step = 0
        self.last_step_seq = 0
        self.metrics_head: dict[int, dict[str, float]] = {}
        self.metrics_tail: deque[tuple[int, str]] = deque(maxlen=METRICS_TAIL_STEPS)
        self.metrics_dropped = 0
        self.nan_findings: list[str] = []
        self.expected: dict[str, int] = {}  # source ("printed", "override", "trace") -> steps
        self.vanilla_values: list[str] = []
        self.adapter: dict[str, Any] = {}
        self.adapter_header = False
        self.checkpoints_saved: list[str] = []
        self.resumed_from: str | None = None
        self.resume_step: int | None = None
        self.fresh_start = False
        self.bridge_paths: list[str] = []
        self.limitations: dict[str, None] = {}
        self.setting_limitations: dict[str, str] = {}
        self.key_lines: dict[str, str] = {}
        self.events: deque[_ErrorEvent] = deque(maxlen=MAX_EVENTS)
        self.first_event_since_progress: _ErrorEvent | None = None
        self.driver_failure_seq: int | None = None  # first driver traceback/Hydra error since the last progress
        self.noise_after_last_step: list[str] = []
        self.last_step_line: str | bytes | None = None
        self.sampled_middle = False

    # -- input ---------------------------------------------------------------------------------------------
    def middle_needles(self) -> tuple[bytes, ...]:
        """Needles for the middle of a big log: steps, saves, tracebacks, plus launch/build facts until training."""
        if self.reached >= PHASE_INDEX["training"]:
            return MIDDLE_NEEDLES_BYTES
        return MIDDLE_NEEDLES_BYTES + EARLY_NEEDLES_BYTES

    def feed(self, raw: str) -> None:
        for line in normalise(raw):
            self._line(line)

    def feed_bytes(self, raw: bytes) -> None:
        """Fast path for the many metrics lines of a long run: no decoding or normalising unless needed."""
        if b"step:" in raw and b"\r" not in raw and b"training/global_step" in raw:
            match = step_line_match(raw)
            if match and int(match.group(1)) > 0:
                self.seq += 1
                if self.reached < PHASE_INDEX["ray-up"] and raw.startswith((b"(", b"\x1b")):
                    self._advance("ray-up")
                rest = raw[match.end() :]
                self._step(int(match.group(1)), rest[: rest.find(b"\r")] if b"\r" in rest else rest, raw)
                return
        self.feed(raw.decode("utf-8", "replace"))

    def _line(self, line: LogLine) -> None:
        self.seq += 1
        text = line.text
        if line.source is not None and self.reached < PHASE_INDEX["ray-up"]:
            self._advance("ray-up")
        if "step:" in text:
            match = STEP_RE.search(text)
            if match:
                self._step(int(match.group(1)), match.group(2), text)
                return
        ignored = noise = False
        error_pattern: Pattern | None = None
        generic = False
        for pattern, regex in TABLE:
            if pattern.needle and pattern.needle not in text:
                continue
            match = regex.search(text)
            if not match:
                continue
            kind = pattern.kind
            if kind == "error":
                if error_pattern is None:
                    error_pattern = pattern
            elif kind == "exception":
                generic = True
            elif kind == "fact":
                self._fact(pattern, match, line)
            elif kind == "marker":
                if pattern.phase:
                    self._advance(pattern.phase)
                else:  # Hydra's "Error executing job": the driver is failing
                    self._driver_failure()
            elif kind == "noise":
                noise = True
            elif kind == "ignore":
                ignored = True
            elif kind == "limitation":
                self.limitations.setdefault(pattern.limitation, None)
                self.setting_limitations[pattern.needle] = pattern.limitation
            elif kind == "traceback":
                if line.source is None:
                    self._driver_failure()
        if noise and self.max_step and len(self.noise_after_last_step) < MAX_NOISE:
            self.noise_after_last_step.append(_shorten(text, 200))
        if ignored or ("No module" in text and OPTIONAL_MODULE_RE.search(text)):
            return
        if error_pattern is None and not generic:
            return
        wrapper = RAY_WRAPPER_RE.search(text) if "RayTaskError" in text else None
        if wrapper and error_pattern is not None and error_pattern.name == "module-missing":
            error_pattern = None  # the wrapper names the inner type only; the inner line says which module
        event = _ErrorEvent(
            self.seq, line.source, line.inner, text, error_pattern, self.phase, self.progress, noise,
            wrapper.group(2) if wrapper else None,
        )
        self.events.append(event)
        if self.first_event_since_progress is None:
            self.first_event_since_progress = event

    def _driver_failure(self) -> None:
        if self.driver_failure_seq is None:
            self.driver_failure_seq = self.seq

    def _progressed(self) -> None:
        self.progress += 1
        self.first_event_since_progress = None
        self.driver_failure_seq = None

    def _advance(self, phase: str) -> None:
        index = PHASE_INDEX[phase]
        self.phase = phase
        if index > self.reached:
            self.reached = index
            self._progressed()

    def _step(self, step: int, rest: str | bytes, text: str | bytes) -> None:
        """A `step:N - k:v ...` metrics line. `rest`/`text` are bytes on the fast path (decoded only if kept)."""
        if step == 0:  # validation before training: metrics only
            self.metrics_head.setdefault(0, parse_metrics(_text(rest)))
            self.key_lines.setdefault("validation", _shorten(_text(text), 240))
            return
        if isinstance(rest, str) and "training/global_step" not in rest and rest.count(":") < 3:
            return  # not a metrics line
        self._advance("training")
        if step > self.max_step:
            self.max_step = step
            self._progressed()
        self.phase = "training"
        self.last_step_seq = self.seq
        self.noise_after_last_step = []
        self.last_step_line = text
        metrics = None
        if step in self.metrics_head or len(self.metrics_head) < METRICS_HEAD_STEPS:
            metrics = self.metrics_head[step] = parse_metrics(_text(rest))
        else:
            if len(self.metrics_tail) == self.metrics_tail.maxlen:
                self.metrics_dropped += 1
            self.metrics_tail.append((step, rest))
        if isinstance(rest, bytes):
            suspicious = b"nan" in rest or b"inf" in rest
        else:
            suspicious = "nan" in rest or "inf" in rest
        if suspicious:
            self._check_finite(step, metrics if metrics is not None else parse_metrics(_text(rest)))

    def _check_finite(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            if not math.isfinite(value) and CORE_METRIC_RE.search(key) and len(self.nan_findings) < 20:
                self.nan_findings.append(f"step {step}: {key}={value}")

    def _fact(self, pattern: Pattern, match: re.Match[str], line: LogLine) -> None:
        fact, text = pattern.fact, line.text
        if pattern.phase:
            self._advance(pattern.phase)
        if fact == "vanilla":
            value = match.group(1).strip("'\"").capitalize()
            if value in ("True", "False"):
                self.vanilla_values.append(value)
                self.key_lines.setdefault("vanilla", _shorten(text, 240))
        elif fact in ("total_steps", "override_steps", "trace_steps"):
            source = {"total_steps": "printed", "override_steps": "override", "trace_steps": "trace"}[fact]
            if fact == "override_steps":  # Hydra: the last override on the command line wins
                values = re.findall(r"trainer\.total_training_steps=(\d+)", text)
                self.expected[source] = int(values[-1])
            else:
                self.expected.setdefault(source, int(match.group(1)))
            self.key_lines.setdefault(f"steps_{source}", _shorten(text, 240))
        elif fact == "adapter_header":
            self.adapter_header = True
        elif fact in ("adapter_total", "adapter_count", "adapter_pct") and self.adapter_header:
            key = {"adapter_total": "total", "adapter_count": "adapter", "adapter_pct": "trainable_pct"}[fact]
            raw = match.group(1).replace(",", "")
            if key not in self.adapter:
                try:
                    self.adapter[key] = float(raw) if key == "trainable_pct" else int(raw)
                except ValueError:
                    pass
                self.key_lines[f"adapter_{key}"] = _shorten(text, 200)
        elif fact == "save":
            path = match.group(1).rstrip(".,;:")
            if path not in self.checkpoints_saved:
                self.checkpoints_saved.append(path)
                self._progressed()
            self.key_lines["checkpoint_save"] = _shorten(text, 240)
        elif fact == "save_done":
            self.key_lines["checkpoint_done"] = _shorten(text, 240)
        elif fact == "resume":
            self.resumed_from = match.group(1).rstrip(".,;:")
            step = re.search(r"global step to (\d+)", text)
            if step:
                self.resume_step = int(step.group(1))
            self.key_lines["resume"] = _shorten(text, 240)
        elif fact == "resume_found":
            self.resumed_from = self.resumed_from or match.group(1).rstrip(".,;:")
            self.key_lines.setdefault("resume_found", _shorten(text, 240))
        elif fact == "resume_step":
            self.resume_step = int(match.group(1))
        elif fact == "fresh":
            self.fresh_start = True
            self.key_lines.setdefault("fresh_start", _shorten(text, 240))
        elif fact == "bridge_path":
            path = match.group(1)
            if path not in self.bridge_paths and len(self.bridge_paths) < MAX_BRIDGE_PATHS:
                self.bridge_paths.append(path)
        elif fact == "progress":
            self.key_lines["progress"] = _shorten(text, 200)

    # -- decision ------------------------------------------------------------------------------------------
    def _expected_steps(self) -> tuple[int | None, str]:
        if self.steps_expected_arg is not None:
            return self.steps_expected_arg, "given"
        for source in ("printed", "override", "trace"):
            if source in self.expected:
                return self.expected[source], source
        return None, "none"

    def _wrong_bridge_paths(self) -> list[str]:
        wrong = []
        for path in self.bridge_paths:
            if "site-packages" in path or "dist-packages" in path:
                wrong.append(path)
            elif self.bridge_src and not os.path.normpath(path).startswith(self.bridge_src):
                wrong.append(path)
        return wrong

    def _failure_events(self) -> list[_ErrorEvent]:
        """Error events the run did not survive (no progress after them), traceback headers excluded."""
        return [e for e in self.events if e.progress == self.progress]

    def _decisive(self, events: list[_ErrorEvent]) -> tuple[_ErrorEvent | None, str | None]:
        """(the event naming the cause, the remote method of the innermost RayTaskError) among `events`."""
        if not events:
            return None, None
        wrappers = [e.wrapper_method for e in events if e.wrapper_method]
        method = wrappers[-1] if wrappers else None
        plain = [e for e in events if not e.wrapper_method]
        driver = []
        if self.driver_failure_seq is not None:
            driver = [e for e in plain if e.source is None and e.seq >= self.driver_failure_seq]
        specific_driver = [e for e in driver if e.specific]
        if specific_driver:
            return specific_driver[0], method
        specific_any = [e for e in plain if e.specific]
        if specific_any:
            return specific_any[0], method
        if driver:
            return driver[-1], method  # the innermost exception of the driver's traceback
        generic = [e for e in plain if e.pattern is None] or plain or events
        return generic[0], method

    def _classify(self, event: _ErrorEvent, method: str | None) -> tuple[str, str, str, str | None]:
        """-> (result, category, phase, hint) for the decisive error event."""
        phase = self.first_event_since_progress.phase if self.first_event_since_progress else event.phase
        if method:
            for method_re, method_phase in METHOD_PHASES:
                if method_re.search(method):
                    phase = method_phase
                    break
        pattern = event.pattern
        if pattern is not None and pattern.specific:
            category, rule, hint = pattern.category, pattern.result, pattern.hint
            if category == "provider" and phase == "checkpoint":
                category, hint = "checkpoint", None
        else:
            rule, hint = "by-phase", pattern.hint if pattern else None
            rollout_source = " ".join(filter(None, (event.source, event.inner, method)))
            if ROLLOUT_SOURCE_RE.search(rollout_source) or phase == "rollout-up" and self.reached < PHASE_INDEX[
                "training"
            ]:
                category = "rollout"
            elif phase == "checkpoint":
                category, rule = "checkpoint", "fail"
            elif phase == "model-build":
                category, rule = "provider", "fail"
                if re.search(r"(?i)lora|peft|adapter|target_module", event.text):
                    hint = H_LORA
            else:
                category = "unknown"
        if rule == "blocked":
            result = "Blocked"
        elif rule == "fail":
            result = "Fail"
        else:
            if category == "rollout":  # before the actor is built: the rollout engine, not the provider
                result = "Blocked" if self.reached < PHASE_INDEX["model-built"] else "Fail"
            else:
                result = "Blocked" if PHASE_INDEX.get(phase, 0) < PHASE_INDEX["model-build"] else "Fail"
        return result, category, phase, hint or CATEGORY_HINTS.get(category)

    def finish(self) -> Verdict:
        expected, expected_source = self._expected_steps()
        complete = self.max_step >= expected if expected else self.max_step >= 1
        vanilla = None
        if self.vanilla_values:
            vanilla = "True" if "True" in self.vanilla_values else "False"
        verdict = Verdict(
            result="Fail", category="unknown", phase=PHASES[self.reached], steps_completed=self.max_step,
            steps_expected=expected, vanilla_mbridge=vanilla, exit_code=self.exit_code,
            termination=self.termination, level=self.level, checkpoints_saved=list(self.checkpoints_saved),
            resumed_from=self.resumed_from, fresh_start=self.fresh_start, adapter=dict(self.adapter),
            bridge_paths=list(self.bridge_paths), nan_metrics=list(self.nan_findings),
            setting_limitations=dict(self.setting_limitations),
        )
        verdict.step_metrics = dict(self.metrics_head)
        for step, rest in self.metrics_tail:
            verdict.step_metrics[step] = parse_metrics(_text(rest))
        if self.last_step_line is not None:
            shown = normalise(_text(self.last_step_line))
            self.key_lines["last_step"] = _shorten(shown[-1].text if shown else _text(self.last_step_line), 240)
        limitations = list(self.limitations)
        if self.level == 0 or self.level is None:
            limitations.append("Level 0 smoke: one PPO update proves the loop runs, not convergence")
        if self.metrics_dropped:
            limitations.append(
                f"step metrics kept for the first {METRICS_HEAD_STEPS} and last {METRICS_TAIL_STEPS} steps only"
            )
        if self.sampled_middle:
            limitations.append(
                "large log: its middle was searched for step, checkpoint and traceback lines only (head and tail "
                "in full)"
            )
        if self.exit_code is None and self.termination is None:
            limitations.append("exit code not given: judged from the log alone")
        if expected is None:
            limitations.append("expected steps unknown (not given, not in the log): completion = one step line")
        if self.resume_step is not None and self.resumed_from is None:
            self.resumed_from = f"global_step_{self.resume_step}"
            verdict.resumed_from = self.resumed_from

        failure_events = self._failure_events()
        decisive, method = self._decisive(failure_events)
        wrong_paths = self._wrong_bridge_paths()
        result = category = hint = first_error = None
        phase = verdict.phase

        if self.termination == "interrupted":
            result, category = "Blocked", "interrupted"
            limitations.append("run interrupted before it ended: not evidence for or against the Bridge provider")
        elif wrong_paths or vanilla == "True":
            result, category = "Blocked", "wrong-bridge"
            first_error = (
                f"megatron.bridge imported from {wrong_paths[0]}" if wrong_paths
                else "VANILLA_MBRIDGE=True: verl used the legacy mbridge path, not Megatron-Bridge"
            )
            limitations.append("wrong Bridge path: no result of this run is evidence for the local Bridge change")
        elif self.termination == "timeout":
            category = "timeout"
            result = "Blocked" if self.reached < PHASE_INDEX["model-built"] else "Fail"
            if decisive is not None:
                first_error = decisive.shown()
            limitations.append("stopped by the stall timeout (no new output); the log was kept")
        elif complete:
            phase = "shutdown"
            late = [e for e in self.events if e.seq > self.last_step_seq]
            late_real = [e for e in late if not e.noise]
            late_noise = [e.shown() for e in late if e.noise]
            residual = list(dict.fromkeys(self.noise_after_last_step + late_noise))[:MAX_NOISE]
            late_driver = [e for e in late_real if e.source is None]
            if self.nan_findings:
                result, category, phase = "Fail", "nan-metrics", "training"
                first_error = self.nan_findings[0]
            elif (self.exit_code not in (None, 0)) or (self.exit_code is None and late_driver):
                result = "Fail"
                late_decisive, late_method = self._decisive(late_real)
                if late_decisive is not None:
                    _, category, late_phase, hint = self._classify(late_decisive, late_method)
                    if category == "checkpoint":  # the final save failed: that phase, not shutdown
                        phase = late_phase
                    first_error = late_decisive.shown()
                else:
                    category = "unknown"
                    first_error = f"the wrapper exited {self.exit_code} after completing the steps"
                    hint = "The steps completed but the wrapper failed at the end: check the tail of the log."
            elif vanilla != "False":
                result, category = "Fail", "unknown"
                first_error = "VANILLA_MBRIDGE=False not found in the wrapper's own output"
                hint = (
                    "Pass needs the wrapper's set -x trace (+ VANILLA_MBRIDGE=False) or its traced command line "
                    "(vanilla_mbridge=False) in the log: capture stderr too (2>&1) and run through the wrapper."
                )
            else:
                result, category = "Pass", "success"
                residual.extend(e.shown() for e in late_real if e.shown() not in residual)
                if late_real:
                    limitations.append("error output after the last step, with the run otherwise complete")
            verdict.residual_noise = residual[:MAX_NOISE]
            if verdict.residual_noise:
                limitations.append("shutdown warnings after the last step (residual noise)")
        elif decisive is not None:
            result, category, phase, hint = self._classify(decisive, method)
            first_error = decisive.shown()
        elif self.nan_findings:
            result, category, phase = "Fail", "nan-metrics", "training"
            first_error = self.nan_findings[0]
        else:
            phase = PHASES[self.reached]
            category = "unknown"
            result = "Blocked" if self.reached < PHASE_INDEX["model-build"] else "Fail"
            if self.exit_code == 0:
                result = "Fail"
                first_error = f"exit 0 but only {self.max_step} of {expected or 1} steps logged"
            else:
                first_error = None
            hint = (
                "The log ends without the expected step lines and without an error line: truncated, still running, "
                "or killed from outside (check the exit code and the stall timeout)."
            )

        verdict.result, verdict.category, verdict.phase = result, category, phase
        verdict.first_error = first_error
        verdict.hint = hint if hint is not None else CATEGORY_HINTS.get(category)
        if decisive is not None and result != "Pass" and category not in ("wrong-bridge", "interrupted"):
            verdict.first_error = verdict.first_error or decisive.shown()
        if result == "Blocked":
            limitations.append("Blocked: not evidence against the Bridge provider")
        verdict.limitations = list(dict.fromkeys(limitations))
        verdict.follow_ups = [FOLLOW_UPS[category]] if result != "Pass" else ["none"]
        verdict.key_lines = self._key_lines(verdict)
        verdict.summary = _summary(verdict, expected_source)
        return verdict

    def _key_lines(self, verdict: Verdict) -> list[str]:
        order = (
            "vanilla", "steps_printed", "steps_override", "steps_trace", "adapter_total", "adapter_adapter",
            "adapter_trainable_pct", "fresh_start", "resume_found", "resume", "checkpoint_save", "checkpoint_done",
            "validation", "progress", "last_step",
        )
        lines = [self.key_lines[name] for name in order if name in self.key_lines]
        if verdict.first_error:
            lines.append(verdict.first_error)
        return lines


def _summary(verdict: Verdict, expected_source: str) -> str:
    steps = f"{verdict.steps_completed}/{verdict.steps_expected if verdict.steps_expected else '?'} steps"
    if verdict.result == "Pass":
        return (
            f"verl completed {steps} on the Megatron-Bridge path (VANILLA_MBRIDGE=False) with no fatal error"
        )
    if verdict.category == "interrupted":
        return f"the run was interrupted in phase {verdict.phase} ({steps}); not evidence either way"
    if verdict.result == "Blocked":
        return (
            f"stopped in phase {verdict.phase} by {verdict.category} ({steps}); not evidence against the Bridge "
            "provider"
        )
    return f"{verdict.category} failure in phase {verdict.phase} ({steps})"


def _coerce_int(value: Any, name: str) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"--{name} must be an integer, got {value!r}") from None


def judge_lines(
    lines: Iterable[str],
    *,
    level: int | None = None,
    steps_expected: int | None = None,
    exit_code: int | None = None,
    termination: str | None = None,
    bridge_src: str | None = None,
) -> Verdict:
    """Judge an iterable of text lines (a pipe, a list in tests). Every line is checked with the full needle list."""
    if termination not in (None, "interrupted", "timeout"):
        raise ValueError(f"termination must be None, 'interrupted' or 'timeout', not {termination!r}")
    judge = _Judge(level, steps_expected, exit_code, termination, bridge_src)
    for raw in join_wrapped(lines):
        for needle in ALL_NEEDLES:
            if needle in raw:
                judge.feed(raw)
                break
    return judge.finish()


def judge_log(
    path: str | os.PathLike[str],
    *,
    level: int | None = None,
    steps_expected: int | None = None,
    exit_code: int | None = None,
    termination: str | None = None,
    bridge_src: str | None = None,
) -> Verdict:
    """Judge a log file, streamed in large chunks (constant memory). `bridge_src`: the expected
    `$BRIDGE_REPO/src`; megatron.bridge paths printed outside it make the run Blocked (wrong-bridge)."""
    if termination not in (None, "interrupted", "timeout"):
        raise ValueError(f"termination must be None, 'interrupted' or 'timeout', not {termination!r}")
    judge = _Judge(level, steps_expected, exit_code, termination, bridge_src)
    stats = ScanStats()
    for raw in scan_file(
        path, FULL_NEEDLES_BYTES, judge.middle_needles, traceback_needle=TRACEBACK_NEEDLE.encode(),
        last_only_needle=LAST_ONLY_NEEDLE.encode(), stats=stats,
    ):
        judge.feed_bytes(raw)
    judge.sampled_middle = stats.sparse_bytes > 0
    return judge.finish()


def format_verdict(verdict: Verdict) -> str:
    """Human-readable verdict (the report's Result line first)."""
    out = [f"Result: {verdict.result} - {verdict.summary}"]
    out.append(f"Category: {verdict.category} (phase: {verdict.phase})")
    expected = verdict.steps_expected if verdict.steps_expected is not None else "?"
    out.append(f"Steps completed: {verdict.steps_completed}/{expected}")
    out.append(f"VANILLA_MBRIDGE (wrapper output): {verdict.vanilla_mbridge or 'not seen'}")
    if verdict.first_error:
        out.append(f"First error: {verdict.first_error}")
    if verdict.hint:
        out.append(f"Hint: {verdict.hint}")
    for title, items in (
        ("Key lines", verdict.key_lines),
        ("Residual noise", verdict.residual_noise),
        ("Limitations", verdict.limitations),
        ("Follow-ups", verdict.follow_ups),
    ):
        if items:
            out.append(f"{title}:")
            out.extend(f"- {item}" for item in items)
    return "\n".join(out)


def judge_command(log: Any, level: Any = None, steps: Any = None, exit_code: Any = None, as_json: bool = False) -> int:
    """`invoke judge`: print the verdict of LOG; return 0 Pass, 1 Fail, 3 Blocked, 2 bad invocation/unreadable log."""
    try:
        level_n, steps_n, exit_n = (
            _coerce_int(level, "level"), _coerce_int(steps, "steps"), _coerce_int(exit_code, "exit-code")
        )
        if not log:
            raise ValueError("--log FILE is required")
        if not os.path.isfile(log):
            raise ValueError(f"log file not found: {log}")
        verdict = judge_log(log, level=level_n, steps_expected=steps_n, exit_code=exit_n)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}")
        return EXIT_BAD_USAGE
    if as_json:
        print(json.dumps(verdict.to_json(), indent=2))
    else:
        print(format_verdict(verdict))
    return EXIT_BY_RESULT[verdict.result]
