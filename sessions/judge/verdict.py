"""The verdict engine: reads a verl log (streamed, every line) and gives two answers, both in the JSON and the report.

1. The run, from the log alone: did verl's training finish its steps without a fatal error? Pass / Fail / Blocked
   with a category, the first error line and a triage hint. Blocked only on positive evidence that the environment
   stopped the run (patterns with result "blocked"); any other error is Fail with its category.
2. The level's criteria (when a level is given): the wrapper's own `VANILLA_MBRIDGE=False`, no Bridge file outside
   the local checkout, the expected steps, exit 0 - each Pass / Fail / not shown. The level's result is Pass only
   when the run and every criterion passed.

Contract used by the rest of the tool (level runner, reports, `invoke judge`):

    judge_log(path, *, level=None, steps_expected=None, exit_code=None, termination=None, bridge_src=None) -> Verdict

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
from pathlib import Path
from typing import Any

from sessions.judge.logstream import (
    LogLine,
    NeedleMatcher,
    ScanStats,
    join_wrapped,
    normalise,
    scan_file,
    step_line_match,
)
from sessions.judge.patterns import (
    ACTOR_DEATH_CAUSES,
    CATEGORY_HINTS,
    COMPLETE_BAR_NEEDLE,
    CORE_METRIC_RE,
    FOLLOW_UPS,
    FRAME_AREAS,
    FRAME_RE,
    H_LORA,
    LAST_ONLY_NEEDLE,
    METHOD_PHASES,
    RAY_WRAPPER_RE,
    ROLLOUT_SOURCE_RE,
    SCAN_NEEDLES,
    WRAPPED_CATEGORIES,
    Pattern,
    compiled,
)

RESULTS = ("Pass", "Fail", "Blocked")
CATEGORIES = (
    "success", "provider", "checkpoint", "nan-metrics", "oom", "nccl", "actor-died", "hang", "rollout", "data",
    "reward-model", "config", "env-ray-import", "env-visible-devices", "env-no-gpu", "env-disk", "env-dependency",
    "wrong-bridge", "interrupted", "unknown",
)
PHASES = ("launch", "ray-up", "model-build", "model-built", "rollout-up", "training", "checkpoint", "shutdown")
CRITERION_STATUSES = ("Pass", "Fail", "not shown")
NOT_SHOWN = "not shown"


@dataclass
class Criterion:
    name: str
    status: str  # one of CRITERION_STATUSES
    detail: str


@dataclass
class Verdict:
    # -- answer 1: the run, from the log alone --------------------------------------------------------------------
    result: str  # one of RESULTS
    category: str  # one of CATEGORIES
    phase: str  # phase in which the first fatal error happened, else the last phase reached
    steps_completed: int = 0  # highest N of a `step:N` metrics line (training steps, step:0 excluded)
    steps_expected: int | None = None
    vanilla_mbridge: str | None = None  # "False"/"True" as the wrapper's own trace printed it; None if unseen
    first_error: str | None = None  # the relevant error line, normalised (or what the log lacks)
    key_lines: list[str] = field(default_factory=list)  # evidence lines for the report
    limitations: list[str] = field(default_factory=list)
    follow_ups: list[str] = field(default_factory=list)
    hint: str | None = None  # triage hint of the category / pattern
    residual_noise: list[str] = field(default_factory=list)  # shutdown noise after the run completed (not failing)
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
    summary: str = ""  # one sentence after "Result: <result> - " in the report
    level: int | None = None
    nan_metrics: list[str] = field(default_factory=list)  # "step N: key=value" for non-finite core metrics
    # -- answer 2: the level's criteria (only when a level was given) -----------------------------------------
    criteria: list[Criterion] = field(default_factory=list)
    level_result: str | None = None  # Pass only when the run and every criterion passed
    level_category: str | None = None
    level_summary: str = ""

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["step_metrics"] = {str(k): v for k, v in self.step_metrics.items()}
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Verdict:
        data = dict(data)
        data["step_metrics"] = {int(k): v for k, v in (data.get("step_metrics") or {}).items()}
        data["criteria"] = [Criterion(**c) for c in data.get("criteria") or []]
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})

    @property
    def final_result(self) -> str:
        """The level's result when a level was judged, else the run's."""
        return self.level_result or self.result

    @property
    def final_category(self) -> str:
        return self.level_category or self.category


# ---------------------------------------------------------------------------------------------------------------
# The engine
# ---------------------------------------------------------------------------------------------------------------

PHASE_INDEX = {name: i for i, name in enumerate(PHASES)}
EXIT_BY_RESULT = {"Pass": 0, "Fail": 1, "Blocked": 3}
EXIT_BAD_USAGE = 2

MAX_EVENTS = 400  # error events kept after the last progress (a long error storm keeps its first ones)
MAX_NOISE = 20
MAX_BRIDGE_PATHS = 20
MAX_FRAMES = 64  # traceback frames remembered per source
METRICS_HEAD_STEPS = 250  # step metrics kept for the first N steps ...
METRICS_TAIL_STEPS = 250  # ... and the last N (memory stays flat on endless logs)
MAX_LINE_SHOWN = 400
MAX_EVENT_TEXT = 4000  # an error line kept for the decision (memory stays flat on giant lines)

STEP_RE = re.compile(r"(?<![\w/])step:(\d+)\s+-\s+(.*)$")
BARE_STEP_RE = re.compile(r"^(?:epoch \d+, )?step:(\d+)\s*$")  # metrics one per line follow (multi-node paste)
LOG_ERROR_RE = re.compile(r"^(?:ERROR[ :]|\[?E\d{4} |\[ERROR\]|\S+ ERROR |\w+ \d+ [\d:]+ ERROR )")
NP_NUMBER_RE = re.compile(r"^np\.\w+\((.*)\)$")
OPTIONAL_MODULE_RE = re.compile(
    r"No module named '(?:torchtitan|mindspeed|torch_npu|liger_kernel|deep_gemm|deep_ep|flashinfer|veomni|"
    r"nemo_automodel|vllm\._\w+)"
)
ALL_NEEDLES = SCAN_NEEDLES + (LAST_ONLY_NEEDLE, COMPLETE_BAR_NEEDLE)
SCAN_NEEDLES_BYTES = tuple(n.encode() for n in SCAN_NEEDLES + (COMPLETE_BAR_NEEDLE,))
_MATCHER: NeedleMatcher | None = None


def scan_matcher() -> NeedleMatcher:
    """The judge's needle matcher (built once per process)."""
    global _MATCHER
    if _MATCHER is None:
        _MATCHER = NeedleMatcher(SCAN_NEEDLES_BYTES)
    return _MATCHER
TABLE = compiled()
BLOCKED_EVIDENCE = "blocked"
ANY_SOURCE = "*"  # key of the latest frame area of any source (pasted excerpts lose prefixes)


def parse_metrics(rest: str) -> dict[str, float]:
    """`key:value - key:value ...` -> {key: float}; accepts np.float64(x), nan/inf, scientific; skips text values."""
    metrics: dict[str, float] = {}
    for part in rest.split(" - "):
        key, sep, raw = part.partition(":")
        if not sep:
            continue
        if raw.startswith("np.") and raw.endswith(")"):  # np.float64(0.5): no regex, this runs per metric
            raw = raw[raw.find("(") + 1 : -1]
        try:
            metrics[key.strip()] = float(raw)
        except ValueError:
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
    step: int  # highest step when seen: a later, higher step line means the run survived it
    noise: bool = False
    wrapper_method: str | None = None  # `RayTaskError(X): ray::Actor.method()` and similar lines
    wrapped: str | None = None  # the X of RayTaskError(X)
    area: str | None = None  # code area of the innermost classified traceback frame before this line
    log_error: bool = False  # a logger's ERROR line (not an exception): a cause only when nothing better exists
    cut: bool = False  # stands for a traceback the log ends in, before its exception line

    @property
    def specific(self) -> bool:
        return self.pattern is not None and self.pattern.specific

    @property
    def blocked(self) -> bool:
        return self.pattern is not None and self.pattern.result == BLOCKED_EVIDENCE

    def shown(self) -> str:
        prefix = f"({self.source}) " if self.source else ""
        return _shorten(prefix + self.text)


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _shorten(text: str, limit: int = MAX_LINE_SHOWN) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _frame_area(path: str) -> str | None:
    for area_re, area in FRAME_AREAS:
        if area_re.search(path):
            return area
    return None
class _Judge:
    def __init__(self, level, steps_expected, exit_code, termination, bridge_src):
        self.level = level
        self.steps_expected_arg = steps_expected
        self.exit_code = exit_code
        self.exit_code_given = exit_code is not None
        self.termination = termination
        self.bridge_src = os.path.normpath(bridge_src) if bridge_src else None
        self.seq = 0
        self.phase = "launch"  # current activity
        self.reached = 0  # index of the furthest phase reached
        self.max_step = 0
        self.progress_seq = 0  # seq of the last evidence that training went on (a new step, completion markers)
        self.metrics_head: dict[int, dict[str, float]] = {}
        self.metrics_tail: deque[tuple[int, str | bytes]] = deque(maxlen=METRICS_TAIL_STEPS)
        self.metrics_dropped = 0
        self.nan_findings: list[str] = []
        self.expected: dict[str, int] = {}  # source ("printed", "override", "trace", "bar") -> steps
        self.bar: tuple[int, int] | None = None  # last Training Progress bar (n, total)
        self.bar_complete = False  # a bar at n == total
        self.final_validation = False
        self.wandb_step: int | None = None
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
        self.events: list[_ErrorEvent] = []  # error events since the last progress (the first MAX_EVENTS)
        self.events_dropped = 0
        self.areas: dict[str | None, str] = {}  # source -> code area of its latest classified traceback frame
        self.driver_failure_seq: int | None = None  # first driver traceback/Hydra error since the last progress
        self.death_causes: list[str] = []
        self.open_traceback: LogLine | None = None  # first frame of a traceback whose exception line is not seen yet
        self.noise_after_last_step: list[str] = []
        self.last_step_line: str | bytes | None = None

    # -- input ---------------------------------------------------------------------------------------------
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
                self._step(int(match.group(1)), rest, raw)
                return
        self.feed(raw.decode("utf-8", "replace"))

    def _line(self, line: LogLine) -> None:
        self.seq += 1
        text = line.text
        if line.source is not None and self.reached < PHASE_INDEX["ray-up"]:
            self._advance("ray-up")
        if "step:" in text:
            match = STEP_RE.search(text) or BARE_STEP_RE.match(text)
            if match:
                self._step(int(match.group(1)), match.group(2) if match.re is STEP_RE else "", text)
                return
        stripped = text.lstrip()
        if stripped.startswith("File \""):
            frame = FRAME_RE.match(stripped)
            if frame:
                area = _frame_area(frame.group(1))
                if area:
                    self.areas[line.source] = self.areas[ANY_SOURCE] = area
                if self.open_traceback is None:
                    self.open_traceback = line
                if "megatron/bridge" not in text:
                    return
        ignored = noise = hydra = False
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
                else:  # Hydra's "Error executing job": the driver is failing (a cause when nothing else is shown)
                    self._driver_failure()
                    hydra = True
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
        if line.source == "raylet" or "Worker exit type" in text or "memory" in text or "SIG" in text:
            for cause_re, cause in ACTOR_DEATH_CAUSES:
                if cause_re.search(text) and cause not in self.death_causes:
                    self.death_causes.append(cause)
        if noise and self.max_step and len(self.noise_after_last_step) < MAX_NOISE:
            self.noise_after_last_step.append(_shorten(text, 200))
        if ignored or ("No module" in text and OPTIONAL_MODULE_RE.search(text)):
            return
        wrapper = RAY_WRAPPER_RE.search(text) if "ray::" in text else None
        generic = generic or wrapper is not None
        log_error = not generic and error_pattern is None and (hydra or LOG_ERROR_RE.match(text) is not None)
        if error_pattern is None and not generic and not log_error:
            return
        self.open_traceback = None  # its exception line is here
        if wrapper and line.source is None:
            self._driver_failure()
        event = _ErrorEvent(
            self.seq, line.source, line.inner, _shorten(text, MAX_EVENT_TEXT), error_pattern, self.phase, self.max_step, noise,
            wrapper.group("method") if wrapper else None, wrapper.group("inner") if wrapper else None,
            self.areas.get(line.source), log_error,
        )
        if len(self.events) < MAX_EVENTS:
            self.events.append(event)
        else:
            self.events_dropped += 1

    def _driver_failure(self) -> None:
        if self.driver_failure_seq is None:
            self.driver_failure_seq = self.seq

    def _progressed(self) -> None:
        """Training went on: every error seen so far was survived."""
        self.progress_seq = self.seq
        self.events = []
        self.events_dropped = 0
        self.areas = {}
        self.driver_failure_seq = None
        self.death_causes = []
        self.open_traceback = None

    def _advance(self, phase: str) -> None:
        index = PHASE_INDEX[phase]
        self.phase = phase
        if index > self.reached:
            self.reached = index

    def _step(self, step: int, rest: str | bytes, text: str | bytes) -> None:
        """A `step:N - k:v ...` metrics line. `rest`/`text` are bytes on the fast path (decoded only if kept)."""
        if step == 0:  # validation before training: metrics only
            self.metrics_head.setdefault(0, parse_metrics(_text(rest)))
            self.key_lines.setdefault("validation", _shorten(_text(text), 240))
            return
        if isinstance(rest, str) and rest and "training/global_step" not in rest and rest.count(":") < 2:
            return  # not a metrics line
        self._advance("training")
        if step > self.max_step:
            self.max_step = step
            self._progressed()
        self.phase = "training"
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
            self.key_lines["checkpoint_save"] = _shorten(text, 240)
        elif fact == "tool_exit":
            if not self.exit_code_given:  # the caller's values (a level run) win over the footer
                self.exit_code = int(match.group(1))
                self.termination = self.termination or match.group(2)
                self.key_lines["tool_exit"] = _shorten(text, 200)
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
            n, total = int(match.group(2)), int(match.group(3))
            self.bar = (n, total)
            self.key_lines["progress"] = _shorten(text, 200)
            if total > 0:
                if n >= total and not self.bar_complete:
                    self.bar_complete = True
                    self._progressed()
        elif fact == "final_validation":
            self.final_validation = True
            self.key_lines["final_validation"] = _shorten(text, 200)
            self._progressed()
        elif fact == "wandb_step":
            step = int(match.group(1))
            if self.wandb_step is None or step > self.wandb_step:
                self.wandb_step = step
                self.key_lines["wandb_step"] = _shorten(text, 200)
                self._progressed()

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

    def _decisive(self, events: list[_ErrorEvent]) -> _ErrorEvent | None:
        """The event naming the cause among `events` (errors the run did not survive)."""
        real = [e for e in events if not e.noise]
        # the first named cause; a wrapper (`RayTaskError(X)`) only when its inner line names none, an interrupt
        # only when nothing else is named
        specific = sorted((e for e in real if e.specific),
                          key=lambda e: (e.pattern.category == "interrupted", e.wrapper_method is not None, e.seq))
        if specific:
            return specific[0]
        plain = [e for e in real if e.pattern is None and not e.log_error and not e.wrapper_method and not e.cut]
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

    def _classify(self, event: _ErrorEvent, events: list[_ErrorEvent]) -> tuple[str, str, str, str | None]:
        """-> (result, category, phase, hint) for the decisive error event."""
        methods = [e.wrapper_method for e in events if e.wrapper_method]
        method = methods[-1] if methods else None
        phase = event.phase
        method_phase = None
        if method:
            for method_re, candidate in METHOD_PHASES:
                if method_re.search(method):
                    phase = method_phase = candidate
                    break
        if method_phase is not None:
            building = method_phase in ("ray-up", "model-build")
        else:
            building = self.reached < PHASE_INDEX["model-built"]
        pattern = event.pattern
        if pattern is not None and pattern.specific:
            category, hint = pattern.category, pattern.hint
            if category == "provider" and phase == "checkpoint":
                category, hint = "checkpoint", None
            result = "Blocked" if pattern.result == BLOCKED_EVIDENCE else "Fail"
            return result, category, phase, hint
        wrapped = [WRAPPED_CATEGORIES[e.wrapped] for e in events if e.wrapped in WRAPPED_CATEGORIES]
        # the innermost classified frame: a wrapper's remote frames come after its line
        area = event.area if event.area and not event.wrapper_method else None
        area = area or next((e.area for e in reversed(events) if e.area), None)
        hint = pattern.hint if pattern else None
        if wrapped:
            category = wrapped[-1]
        elif area == "megatron-core":
            category = "provider" if building else "unknown"
        elif area:
            category = area
        elif pattern is not None:  # worker died, native crash: no named cause
            category = pattern.category
        elif ROLLOUT_SOURCE_RE.search(" ".join(filter(None, (event.source, event.inner, method)))):
            category = "rollout"
        elif phase == "checkpoint":
            category = "checkpoint"
        elif phase == "model-build" and re.search(r"(?i)lora|peft|adapter|target_module", event.text):
            category, hint = "provider", H_LORA
        else:
            category = "unknown"
        if category == "provider" and re.search(r"(?i)lora|peft|adapter|target_module", event.text):
            hint = H_LORA
        result = "Blocked" if category == "env-ray-import" else "Fail"
        return result, category, phase, hint

    def _fatal_after_completion(self, events: list[_ErrorEvent]) -> list[_ErrorEvent]:
        """Errors after the run completed that still fail it: the driver failing, a dead actor, a named cause."""
        driver = self.driver_failure_seq
        return [
            e for e in events if not e.noise and (
                (driver is not None and e.source is None and e.seq >= driver) or e.specific
                or (e.wrapper_method and e.source is None)
            )
        ]

    def _criteria(self, verdict: Verdict, vanilla: str | None, wrong_paths: list[str]) -> list[Criterion]:
        """The level's pass list, each Pass / Fail / not shown (SPEC "The verdict", 2)."""
        out = []
        if vanilla == "False":
            out.append(Criterion("VANILLA_MBRIDGE=False in the wrapper's output", "Pass", self.key_lines["vanilla"]))
        elif vanilla == "True":
            out.append(Criterion("VANILLA_MBRIDGE=False in the wrapper's output", "Fail",
                                 f"the wrapper ran with VANILLA_MBRIDGE=True: {self.key_lines['vanilla']}"))
        else:
            out.append(Criterion("VANILLA_MBRIDGE=False in the wrapper's output", NOT_SHOWN,
                                 "neither the wrapper's set -x trace nor its traced command line is in the log"))
        if wrong_paths:
            out.append(Criterion("local Bridge imported", "Fail", f"megatron.bridge imported from {wrong_paths[0]}"))
        elif self.bridge_src:
            seen = f" ({len(self.bridge_paths)} Bridge path(s) in the log, all under it)" if self.bridge_paths else ""
            out.append(Criterion("local Bridge imported", "Pass",
                                 f"no megatron.bridge file outside {self.bridge_src} in the log{seen}"))
        elif self.bridge_paths:
            out.append(Criterion("local Bridge imported", "Pass",
                                 f"megatron.bridge from {self.bridge_paths[0]} (not site-packages)"))
        else:
            out.append(Criterion("local Bridge imported", NOT_SHOWN, "the log names no megatron.bridge file"))
        expected = verdict.steps_expected
        if expected is None:
            out.append(Criterion("expected steps completed", NOT_SHOWN,
                                 f"{verdict.steps_completed} step(s) logged; the expected count is not known"))
        else:
            done = max(verdict.steps_completed, self.wandb_step or 0, expected if self.bar_complete else 0)
            out.append(Criterion("expected steps completed", "Pass" if done >= expected else "Fail",
                                 f"{done}/{expected} steps"))
        if self.exit_code is None:
            out.append(Criterion("exit code 0", NOT_SHOWN, "exit code not given"))
        else:
            out.append(Criterion("exit code 0", "Pass" if self.exit_code == 0 else "Fail", f"exit {self.exit_code}"))
        return out

    def _level_answer(self, verdict: Verdict) -> None:
        criteria = verdict.criteria
        failed = [c for c in criteria if c.status == "Fail"]
        unseen = [c for c in criteria if c.status == NOT_SHOWN]
        level = f"Level {self.level}"
        if verdict.result != "Pass":
            verdict.level_result, verdict.level_category = verdict.result, verdict.category
            verdict.level_summary = f"{level}: the run did not pass ({verdict.result}, {verdict.category})"
        elif failed:
            wrong = [c for c in failed if c.name in ("local Bridge imported", "VANILLA_MBRIDGE=False in the "
                                                                              "wrapper's output")]
            verdict.level_result = "Blocked" if wrong else "Fail"
            verdict.level_category = "wrong-bridge" if wrong else "unknown"
            verdict.level_summary = f"{level}: criterion failed: " + "; ".join(f"{c.name} ({c.detail})" for c in failed)
        elif unseen:
            verdict.level_result, verdict.level_category = "Fail", "unknown"
            verdict.level_summary = f"{level}: the run passed but the log does not show: " + "; ".join(
                f"{c.name} ({c.detail})" for c in unseen)
        else:
            verdict.level_result, verdict.level_category = "Pass", "success"
            verdict.level_summary = f"{level}: the run passed and every criterion passed"

    def finish(self) -> Verdict:
        expected, expected_source = self._expected_steps()
        done = max(self.max_step, self.wandb_step or 0)
        if expected:  # a complete bar counts when it covers the expected count
            complete = done >= expected or (self.bar_complete and self.bar is not None and self.bar[1] >= expected)
        else:
            complete = done >= 1 or self.bar_complete or self.final_validation
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
        if self.exit_code is None and self.termination is None:
            limitations.append("exit code not given: judged from the log alone")
        if expected is None:
            limitations.append("expected steps unknown (not given, not in the log): completion = the steps it shows")
        if self.resume_step is not None and self.resumed_from is None:
            self.resumed_from = f"global_step_{self.resume_step}"
            verdict.resumed_from = self.resumed_from

        events = self.events
        if self.open_traceback is not None and len(events) < MAX_EVENTS:  # a traceback cut before its exception
            line = self.open_traceback
            events = events + [_ErrorEvent(
                self.seq + 1, line.source, line.inner, "a traceback without its exception line (the log is cut): "
                + line.text.strip(), None, self.phase, self.max_step,
                area=self.areas.get(line.source) or self.areas.get(ANY_SOURCE), cut=True,
            )]
        decisive = self._decisive(events)
        where = f"step {self.max_step} of {expected}" if expected else f"step {self.max_step}"
        ends = (f"it ends after {where}" if self.max_step else
                f"it ends before the first training step (last phase reached: {PHASES[self.reached]})")
        result = category = hint = first_error = None
        phase = verdict.phase

        if self.termination == "interrupted":
            result, category = "Blocked", "interrupted"
            first_error = f"interrupted by the launcher; {ends}"
            limitations.append("run interrupted before it ended: not evidence for or against the Bridge provider")
        elif complete:
            phase = "shutdown"
            fatal = self._fatal_after_completion(events)
            late_noise = [e.shown() for e in events if e.noise or e not in fatal]
            residual = list(dict.fromkeys(self.noise_after_last_step + late_noise))[:MAX_NOISE]
            if self.nan_findings:
                result, category, phase = "Fail", "nan-metrics", "training"
                first_error = self.nan_findings[0]
            elif fatal:
                late = self._decisive(fatal)
                result, category, late_phase, hint = self._classify(late, events)
                result = "Fail" if category not in ("interrupted",) else result
                if category == "checkpoint":  # the final save failed: that phase, not shutdown
                    phase = late_phase
                first_error = late.shown()
            elif self.exit_code not in (None, 0):
                result, category = "Fail", "unknown"
                first_error = f"the wrapper exited {self.exit_code} after completing the steps"
                hint = "The steps completed but the wrapper failed at the end: check the tail of the log."
            else:
                result, category = "Pass", "success"
                if late_noise:
                    limitations.append("error output after the last step, with the run otherwise complete")
            verdict.residual_noise = residual[:MAX_NOISE]
            if verdict.residual_noise and result == "Pass":
                limitations.append("shutdown warnings after the last step (residual noise)")
        elif decisive is not None and self.termination != "timeout":
            result, category, phase, hint = self._classify(decisive, events)
            first_error = decisive.shown()
        elif self.termination == "timeout":
            if decisive is not None and decisive.blocked:
                result, category, phase, hint = self._classify(decisive, events)
            else:
                result, category = "Fail", "hang"
            first_error = decisive.shown() if decisive is not None else f"no output before the stall timeout; {ends}"
            limitations.append("stopped by the stall timeout (no new output); the log was kept")
        elif self.nan_findings:
            result, category, phase = "Fail", "nan-metrics", "training"
            first_error = self.nan_findings[0]
        else:
            result, category, phase = "Fail", "unknown", PHASES[self.reached]
            if self.exit_code == 0:
                first_error = f"exit 0 but no exception line in the log; {ends}"
            else:
                first_error = f"no exception line in the log; {ends}"
            hint = (
                "The log does not show enough to name a cause: it ends without the expected steps and without an "
                "error line (truncated, still running, or killed from outside: check the exit code, dmesg and the "
                "stall timeout)."
            )

        if category == "actor-died" and self.death_causes:
            hint = f"the raylet's cause: {', '.join(self.death_causes)}. " + (hint or CATEGORY_HINTS["actor-died"])
        verdict.result, verdict.category, verdict.phase = result, category, phase
        verdict.first_error = first_error
        verdict.hint = hint if hint is not None else CATEGORY_HINTS.get(category)
        if self.events_dropped:
            limitations.append(f"{self.events_dropped} further error lines after the first {MAX_EVENTS} not kept")
        if result == "Blocked":
            limitations.append("Blocked: not evidence against the Bridge provider")
        verdict.limitations = list(dict.fromkeys(limitations))
        verdict.follow_ups = [FOLLOW_UPS[category]] if result != "Pass" else ["none"]
        verdict.key_lines = self._key_lines(verdict)
        verdict.summary = _summary(verdict, expected_source)
        if self.level is not None:
            verdict.criteria = self._criteria(verdict, vanilla, self._wrong_bridge_paths())
            self._level_answer(verdict)
            if verdict.level_result != "Pass" and verdict.result == "Pass":
                verdict.follow_ups = [FOLLOW_UPS[verdict.level_category]]
        return verdict

    def _key_lines(self, verdict: Verdict) -> list[str]:
        order = (
            "vanilla", "steps_printed", "steps_override", "steps_trace", "adapter_total", "adapter_adapter",
            "adapter_trainable_pct", "fresh_start", "resume_found", "resume", "checkpoint_save", "checkpoint_done",
            "validation", "progress", "last_step", "final_validation", "wandb_step",
        )
        lines = [self.key_lines[name] for name in order if name in self.key_lines]
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


def _coerce_int(value: Any, name: str) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"--{name} must be an integer, got {value!r}") from None


def _check_termination(termination: str | None) -> None:
    if termination not in (None, "interrupted", "timeout"):
        raise ValueError(f"termination must be None, 'interrupted' or 'timeout', not {termination!r}")


def judge_lines(
    lines: Iterable[str],
    *,
    level: int | None = None,
    steps_expected: int | None = None,
    exit_code: int | None = None,
    termination: str | None = None,
    bridge_src: str | None = None,
) -> Verdict:
    """Judge an iterable of text lines (a pipe, a list in tests) with the same needle list as `judge_log`."""
    _check_termination(termination)
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
    matcher: NeedleMatcher | None = None,
) -> Verdict:
    """Judge a log file, streamed in large chunks (constant memory, every line searched). `bridge_src`: the
    expected `$BRIDGE_REPO/src`; a megatron.bridge path printed outside it fails the level's Bridge criterion.
    `matcher`: the line prefilter (tests pass one without Hyperscan to check both find the same lines)."""
    _check_termination(termination)
    judge = _Judge(level, steps_expected, exit_code, termination, bridge_src)
    matcher = scan_matcher() if matcher is None else matcher
    for raw in scan_file(path, matcher, last_only_needle=LAST_ONLY_NEEDLE.encode(), stats=ScanStats()):
        judge.feed_bytes(raw)
    return judge.finish()


def format_verdict(verdict: Verdict) -> str:
    """Human-readable verdict: the run's answer, then the level's criteria when a level was judged."""
    out = [f"Run: {verdict.result} - {verdict.summary}"]
    out.append(f"Category: {verdict.category} (phase: {verdict.phase})")
    expected = verdict.steps_expected if verdict.steps_expected is not None else "?"
    out.append(f"Steps completed: {verdict.steps_completed}/{expected}")
    if verdict.first_error:
        out.append(f"First error: {verdict.first_error}")
    if verdict.hint:
        out.append(f"Hint: {verdict.hint}")
    if verdict.level_result is not None:
        out.append(f"Level {verdict.level}: {verdict.level_result} ({verdict.level_category}) - {verdict.level_summary}")
        out.append("Criteria:")
        out.extend(f"- {c.name}: {c.status} - {c.detail}" for c in verdict.criteria)
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


def judge_command(log: Any, level: Any = None, steps: Any = None, exit_code: Any = None, as_json: bool = False,
                  bridge_repo: Any = None) -> int:
    """`invoke judge`: print the verdict of LOG; exit 0 Pass, 1 Fail, 3 Blocked (the run's answer, or the level's with
    --level), 2 bad invocation/unreadable log."""
    try:
        level_n, steps_n, exit_n = (
            _coerce_int(level, "level"), _coerce_int(steps, "steps"), _coerce_int(exit_code, "exit-code")
        )
        if level_n is not None and not 0 <= level_n <= 5:
            raise ValueError(f"--level must be 0..5, got {level_n}")
        if not log:
            raise ValueError("--log FILE is required")
        if not os.path.exists(log):
            raise ValueError(f"log file not found: {log}")
        if not os.path.isfile(log):  # /dev/null, a folder, a fifo: nothing a run wrote
            raise ValueError(f"--log {log} is not a regular file")
        # the level's Bridge criterion needs the checkout the run was meant to import (--bridge-repo, BRIDGE_REPO)
        bridge = bridge_repo or os.environ.get("BRIDGE_REPO")
        bridge_src = str(Path(bridge).expanduser().absolute() / "src") if bridge and level_n is not None else None
        verdict = judge_log(log, level=level_n, steps_expected=steps_n, exit_code=exit_n, bridge_src=bridge_src)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}")
        return EXIT_BAD_USAGE
    if as_json:
        print(json.dumps(verdict.to_json(), indent=2))
    else:
        print(format_verdict(verdict))
    return EXIT_BY_RESULT[verdict.final_result]


class LiveJudge:
    """The engine fed one physical line at a time while the log is being written (the launcher's tee), for the
    live status line (sessions/run/progress.py): the same needles and classification as `judge_log`, no second parser.
    """

    NEEDLES = tuple(n.encode() for n in ALL_NEEDLES)

    def __init__(self, *, level: int | None = None):
        self._judge = _Judge(level, None, None, None, None)

    def feed(self, line: bytes) -> None:
        for needle in self.NEEDLES:
            if needle in line:
                self._judge.feed_bytes(line)
                return

    @property
    def phase(self) -> str:
        """The current activity by the engine's phase markers (one of PHASES)."""
        return self._judge.phase

    @property
    def step(self) -> int:
        """Highest training step logged so far."""
        return self._judge.max_step

    @property
    def steps_expected(self) -> int | None:
        """Steps the log says the run will train (printed total, Hydra override, traced command), if it said."""
        return self._judge._expected_steps()[0]
