"""Evidence of a verl log, collected while it streams (every prefiltered line once, constant memory).

`Evidence` holds what the log showed: steps and their metrics, planned totals, facts (vanilla, adapter, saves,
resume, Bridge paths), phase markers, and the error events after the last progress, each with the Ray method and the
traceback frames around it. It decides nothing: `sessions.judge.decide.decide(evidence)` does, as a pure function.

Per line, the patterns that can match are found in one pass: the line's literal needles (one Hyperscan scan, or the
`in` fallback) select the few patterns whose regex runs; no loop over the whole table.
"""

from __future__ import annotations

import math
import os
import re
from collections import deque
from dataclasses import dataclass
from typing import Any

from sessions.judge.frames import called_area, callee_area, classify_frame, raises_a_config_value
from sessions.judge.logstream import LogLine, normalise, step_line_match
from sessions.judge.needles import DISPATCH, MAX_MEMO, LongText, search_other, search_pattern
from sessions.judge.patterns import (
    ACTOR_DEATH_CAUSES,
    CORE_METRIC_RE,
    CUT_FRAME_RE,
    FRAME_RE,
    RAY_WRAPPER_RE,
    Pattern,
    compiled,
)
from sessions.judge.record import PHASE_INDEX

MAX_EVENTS = 400  # error events kept after the last progress (a long error storm keeps its first ones)
MAX_NOISE = 20
MAX_BRIDGE_PATHS = 20
MAX_ADAPTER_BLOCKS = 64  # PEFT blocks kept (one per model built; a log of many restarts stays bounded)
ADAPTER_KEY_LINES = 4  # blocks whose lines are quoted among the key lines
MAX_FRAMES = 64  # traceback frames remembered per source
METRICS_HEAD_STEPS = 250  # step metrics kept for the first N steps ...
METRICS_TAIL_STEPS = 250  # ... and the last N (memory stays flat on endless logs)
MAX_LINE_SHOWN = 400
MAX_RAW_METRICS = 64 << 10  # a step's metrics text kept unparsed up to this length (metrics_head)
MAX_EVENT_TEXT = 4000  # an error line kept for the decision (memory stays flat on giant lines)
MAX_TRACED_COMMAND = 1 << 16  # the wrapper's traced verl command kept (its overrides: which keys a script passed)

STEP_RE = re.compile(r"(?<![\w/])step:(\d+)\s+-\s+(.*)$")
GLOBAL_STEP_RE = re.compile(r"global_step_(\d+)")
BARE_STEP_RE = re.compile(r"^(?:epoch \d+, )?step:(\d+)\s*$")  # metrics one per line follow (multi-node paste)
# vLLM logs a failing engine's traceback through its logger, one `ERROR MM-DD hh:mm:ss [file.py:N] ` per line: the
# frames and the exception line behind it are read as a traceback's
VLLM_ERROR_RE = re.compile(r"ERROR \d\d-\d\d [\d:.]+ \[[\w.\-]+:\d+\] (?=\s|Traceback|\w+(?:\.\w+)*: )")
LOG_ERROR_RE = re.compile(r"^(?:ERROR[ :]|\[?E\d{4} |\[ERROR\]|\S+ ERROR |\w+ \d+ [\d:]+ ERROR )")
VAL_METRIC_RE = re.compile(r"^\s*val[\w-]*/[\w/@.\-]+:\s*[-+\d.(np]")  # `val/test_score/x:0.5`
VAL_ONLY_RE = re.compile(r"^\s*(?:val[\w-]*/[^:\s]+:[^ ]+(?: - |\s*$))+$")
NP_NUMBER_RE = re.compile(r"^np\.\w+\((.*)\)$")
OPTIONAL_MODULE_RE = re.compile(
    r"No module named '(?:torchtitan|mindspeed|torch_npu|liger_kernel|deep_gemm|deep_ep|flashinfer|veomni|"
    r"nemo_automodel|vllm\._\w+)"
)
TABLE = compiled()
TRAINING = PHASE_INDEX["training"]
MODEL_BUILT = PHASE_INDEX["model-built"]
ROLLOUT_UP = PHASE_INDEX["rollout-up"]
# a resume's checkpoint load, or a line naming a checkpoint directory (save or load): before the first step its phase
# is the current activity, not progress past training
CHECKPOINT_LOADS = frozenset(("resume", "resume-old", "resume-found", "resume-load", "ckpt-dir"))
LATE_KINDS = ("fact", "limitation", "marker")  # what still counts once MAX_EVENTS error events are kept
LATE_KINDS_SET = frozenset(LATE_KINDS)
THREAD_HEADER = "Exception in thread"  # a thread's uncaught exception follows (not the process's)
PROGRESS_FACTS = ("progress", "final_validation", "wandb_step")  # facts whose handler may call _progressed
FULL_LINE_KINDS = ("fact", "limitation")  # searched in the whole line; causes in its first ERROR_SCAN_CHARS
ERROR_SCAN_CHARS = 4096  # an exception's message starts the line; a 1 MB config-dump line is not an error
# `No module named 'vllm._moe_C_stable_libtorch'`: an engine's compiled extension (a `_`-named submodule)
EXTENSION_MODULE_RE = re.compile(r"No module named '(?:\w+\.)+(_\w+)'")
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
    nearest: str | None = None  # category of the latest classified frame of any source before this line
    where: str | None = None  # area of the innermost verl frame with a known function (frames.FUNCTION_AREAS)
    extension: str | None = None  # stands for a compiled extension the engine reported missing

    @property
    def specific(self) -> bool:
        return self.pattern is not None and self.pattern.specific

    @property
    def blocked(self) -> bool:
        return self.pattern is not None and self.pattern.result == BLOCKED_EVIDENCE

    def shown(self) -> str:
        prefix = f"({self.source}) " if self.source else ""
        return _shorten(prefix + self.text)


_KINDS: dict[tuple[int, ...], frozenset[str]] = {}  # storm_sensitive: the kinds of a line's candidates


class _MayProgress:
    """`candidates in _MAY_PROGRESS`: whether a progress fact is among them (remembered per tuple)."""

    def __init__(self):
        self.known: dict[tuple[int, ...], bool] = {}

    def __contains__(self, candidates: tuple[int, ...]) -> bool:
        found = self.known.get(candidates)
        if found is None:
            found = any(TABLE[i][0].fact in PROGRESS_FACTS for i in candidates)
            if len(self.known) < MAX_MEMO:
                self.known[candidates] = found
        return found


_MAY_PROGRESS = _MayProgress()


def lasting(pattern: Pattern) -> bool:
    """Whether a match of the pattern changes more than what the next progress clears (error events, traceback
    areas, the driver's failure): facts, limitations, residual noise, phase markers."""
    return pattern.kind in ("fact", "limitation", "noise") or (pattern.kind == "marker" and pattern.phase is not None)


_NO_MATCH_YET = object()


def metrics_match(raw: bytes, step: re.Match[bytes] | None | object = _NO_MATCH_YET) -> re.Match[bytes] | None:
    """The `step:N - ` of a plain metrics line (N > 0, no tqdm redraw): feed_bytes's fast path takes it. `step`:
    step_line_match(raw) when the caller has it."""
    if b"step:" in raw and b"\r" not in raw:
        match = step_line_match(raw) if step is _NO_MATCH_YET else step
        if match and int(match.group(1)) > 0 and plain_metrics(raw, 0, match.end(), len(raw)):
            return match
    return None


def plain_metrics(buf: bytes | bytearray, start: int, metrics: int, end: int) -> bool:
    """Whether the step line buf[start:end], its metrics from `metrics` on, is one _step would read as a training
    metrics line and normalise would not change: verl's newer layout names its global step; an older one (no
    `training/global_step`) holds two `key:value` or more, starts with no validation key (the old format's
    validation-only last line) and holds no ANSI code or `[repeated Nx across cluster]` after the step."""
    if buf.find(b"training/global_step", start, end) != -1:
        return True
    return (buf.count(b":", metrics, end) >= 2 and buf.find(b"\x1b", metrics, end) == -1
            and not buf.startswith(b"val", metrics) and not buf.endswith(b"]", metrics, end))


def _kept_metrics(rest: str | bytes) -> str | bytes | dict[str, float]:
    """What metrics_head keeps of a step's metrics: the text, parsed only when decided (`head_metrics`), or parsed
    now when long (memory stays flat: no 250 raw giant lines)."""
    return rest if len(rest) <= MAX_RAW_METRICS else parse_metrics(_text(rest))


def head_metrics(value: str | bytes | dict[str, float]) -> dict[str, float]:
    """A metrics_head value as metrics."""
    return value if isinstance(value, dict) else parse_metrics(_text(value))


def _head(text: str) -> str:
    return text if len(text) <= ERROR_SCAN_CHARS else text[:ERROR_SCAN_CHARS]


def _copied(value: Any) -> Any:
    kind = type(value)
    if kind is deque:
        return deque(value, value.maxlen)
    return value.copy() if kind in (list, dict, set) else value


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _shorten(text: str, limit: int = MAX_LINE_SHOWN) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Evidence:
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
        # step -> its metrics: the text after `step:N - `, parsed when decided (a step logged again replaces it)
        self.metrics_head: dict[int, str | bytes | dict[str, float]] = {}
        self.metrics_tail: deque[tuple[int, str | bytes]] = deque(maxlen=METRICS_TAIL_STEPS)
        self.metrics_dropped = 0
        self.nan_findings: list[str] = []
        self.expected: dict[str, int] = {}  # source ("printed", "override", "trace", "bar") -> steps
        self.epoch_plan: dict[str, int] = {}  # train dataloader "size", total_epochs by "override" / "config"
        self.bar: tuple[int, int] | None = None  # last Training Progress bar (n, total)
        self.bar_complete = False  # a bar at n == total
        self.final_validation = False
        self.wandb_step: int | None = None
        self.vanilla_values: list[str] = []
        # one dict per `PEFT Adapter Information` block, in log order: verl prints one per model it builds with
        # PEFT (critic, then actor), so a frozen actor is not hidden behind a trainable critic
        self.adapters: list[dict[str, Any]] = []
        self.checkpoints_saved: list[str] = []
        self.saved_step = 0  # the highest global_step_N a save line names: verl saves after step N's update
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
        self.wheres: dict[str | None, str] = {}  # source -> loop area of its latest verl frame with a known function
        self.frame_paths: dict[str | None, str] = {}  # source -> file of its latest traceback frame (its raise line)
        self.frame_seqs: dict[str | None, int] = {}  # source -> seq of its latest traceback frame line
        # source -> area of the verl function its latest frame's statement calls, while no frame or exception line
        # follows it: where a traceback is cut there, the next frame's area (frames.called_area)
        self.cut_calls: dict[str | None, str] = {}
        self.thread_sources: set[str | None] = set()  # sources printing an "Exception in thread" traceback
        self.driver_failure_seq: int | None = None  # first driver traceback/Hydra error since the last progress
        self.death_causes: list[str] = []
        self.open_traceback: LogLine | None = None  # first frame of a traceback whose exception line is not seen yet
        self.noise_after_last_step: list[str] = []
        self.last_step_line: str | bytes | None = None
        # issue 25: planned totals from any line (tqdm N/M, config dump), the steps of a validation-only step line,
        # compiled extensions an engine reported missing (a later error naming them is that missing extension),
        # and whether the input looked like a text log at all
        self.bar_total: int | None = None  # the largest planned total a Training Progress bar showed
        self.val_only_steps: set[int] = set()  # step:M lines with only val/ metrics (old format's final line)
        self.missing_ext: dict[str, str] = {}  # extension module name -> its "No module named" line
        self.input_note: str | None = None  # "empty" / "binary": the input is no text log (judge_log sniffs it)
        self.frames_seen = 0  # traceback frame lines
        self.fit_seen = False  # a frame in the trainer's fit() since the last progress (TaskRunner.run() trains)
        self.progress_count = 0  # times training went on (_progressed): a reader that skips lines watches it
        self.traced_command: str | None = None  # a script's `set -x` line starting verl (`+ python3 -m verl.x ...`)

    # -- state copies (skim.py skips lines speculatively and goes back when it must) -------------------------
    def snapshot(self) -> dict[str, Any]:
        """The whole state; containers copied one level (their items are never changed in place)."""
        return {k: _copied(v) for k, v in self.__dict__.items()}

    def restore(self, snapshot: dict[str, Any]) -> None:
        self.__dict__.update(snapshot)

    @property
    def skimmable(self) -> bool:
        """Whether every effect of a line no lasting pattern matches is cleared by the next progress. Not while a
        thread's traceback is open: its source's next exception line is marked noise, for good."""
        return not self.thread_sources

    def storm_sensitive(self, raw: bytes, candidates: tuple[int, ...]) -> bool:
        """Whether this line's lasting effect could depend on the error-storm cap (MAX_EVENTS events kept: then
        feed_bytes drops the line's non-fact candidates, or the whole line): a residual-noise line, a missing
        extension not noted yet from a line without facts, a line that goes on training and holds error
        candidates (its events outlive that progress). Other lines differ only in what the next progress clears."""
        kinds = _KINDS.get(candidates)
        if kinds is None:
            kinds = frozenset(TABLE[i][0].kind for i in candidates)
            if len(_KINDS) < MAX_MEMO:
                _KINDS[candidates] = kinds
        if "noise" in kinds and self.max_step and len(self.noise_after_last_step) < MAX_NOISE:
            return True
        if b"No module" not in raw and b"step:" not in raw and candidates not in _MAY_PROGRESS:
            return False  # what follows needs a missing module, a progress fact or a step line
        lines = None
        if kinds.isdisjoint(LATE_KINDS) and b"No module" in raw and b"(raylet)" not in raw and b"step:" not in raw:
            if len(self.missing_ext) >= 20:
                return False
            lines = normalise(raw.decode("utf-8", "replace"))
            for line in lines:
                ext = EXTENSION_MODULE_RE.search(line.text) if "No module" in line.text else None
                if ext and ext.group(1) not in self.missing_ext:
                    return True
        dropped = [i for i in candidates if TABLE[i][0].kind not in LATE_KINDS_SET]
        if not dropped:
            return False
        progress = any(TABLE[i][0].fact in PROGRESS_FACTS for i in candidates)
        if not progress and b"step:" not in raw:
            return False
        lines = normalise(raw.decode("utf-8", "replace")) if lines is None else lines
        if not any(search_pattern(i, TABLE[i][1], _head(line.text), {} if LongText.usable(line.text) else None)
                   for line in lines for i in dropped):
            return False  # the cap would drop candidates that do not match anyway
        if progress:
            return True
        for line in lines:
            step = STEP_RE.search(line.text) or BARE_STEP_RE.match(line.text) if "step:" in line.text else None
            if step and int(step.group(1)) > self.max_step:
                return True
        return False

    # -- input ---------------------------------------------------------------------------------------------
    def feed(self, raw: str) -> None:
        self.feed_bytes(raw.encode("utf-8", "surrogateescape") if "\x00" not in raw else raw.encode("utf-8", "replace"))

    def feed_bytes(self, raw: bytes, candidates: tuple[int, ...] | None = None) -> None:
        """Fast path for the many metrics lines of a long run: no decoding or normalising unless needed.
        `candidates`: DISPATCH.candidates(raw) when the caller has them already."""
        match = metrics_match(raw)
        if match is not None:
            self.feed_metrics(raw, match)
            return
        if candidates is None:
            candidates = DISPATCH.candidates(raw)
        if len(self.events) >= MAX_EVENTS:  # an error storm past the kept events: only facts can still matter
            kept = tuple(i for i in candidates if TABLE[i][0].kind in LATE_KINDS)
            if len(kept) < len(candidates):
                self.events_dropped += 1
            candidates = kept
            if not kept and b"(raylet)" not in raw and b"step:" not in raw:
                return
        for line in normalise(raw.decode("utf-8", "replace")):
            self._line(line, candidates)

    def feed_metrics(self, raw: bytes, match: re.Match[bytes], finite: bool = False) -> None:
        """feed_bytes of a line metrics_match took (`match`: its result). `finite`: the caller knows its metrics
        hold no `nan` or `inf` (a bulk search of the chunk)."""
        self.seq += 1
        self._metrics_line(int(match.group(1)), raw[match.end() :], raw, finite)

    def feed_metrics_run(self, run) -> None:
        """feed_metrics of each line of a run of plain metrics lines whose steps each pass the highest so far (the
        caller checked it), at once: nothing happens between them, so _metrics_line's effects are those of the
        last line, the head metrics of the first ones, the tail of the last ones. `run`: .steps, .raw(i),
        .rest(i) (the metrics after `step:N - `), .nonfinite (the lines whose metrics hold `nan` or `inf`)."""
        steps = run.steps
        count = len(steps)
        self.seq += count
        self._progressed()
        self.progress_count += count - 1
        self.max_step = steps[-1]
        self.reached = max(self.reached, TRAINING)
        self.phase = "training"
        if self.noise_after_last_step:
            self.noise_after_last_step = []
        self.last_step_line = run.raw(count - 1)
        head, tail = self.metrics_head, self.metrics_tail
        taken = min(count, max(0, METRICS_HEAD_STEPS - len(head)))
        for i in range(taken):
            head[steps[i]] = _kept_metrics(run.rest(i))
        if count > taken:
            self.metrics_dropped += max(0, len(tail) + count - taken - METRICS_TAIL_STEPS)
            tail.extend((steps[i], run.rest(i)) for i in range(max(taken, count - METRICS_TAIL_STEPS), count))
        for i in run.nonfinite:
            self._check_finite(steps[i], parse_metrics(run.rest(i).decode("utf-8", "replace")))

    def _line(self, line: LogLine, candidates: tuple[int, ...]) -> None:
        self.seq += 1
        text = line.text
        if text.startswith("ERROR ") and (logged := VLLM_ERROR_RE.match(text)):
            line = LogLine(line.source, text[logged.end():], line.inner)
            text = line.text
        if line.source is not None and self.reached < PHASE_INDEX["ray-up"]:
            self._advance("ray-up")
        if "step:" in text:
            match = STEP_RE.search(text) or BARE_STEP_RE.match(text)
            if match:
                self._step(int(match.group(1)), match.group(2) if match.re is STEP_RE else "", text)
                return
        stripped = text.lstrip()
        frame = FRAME_RE.match(stripped) if stripped.startswith("File \"") else (
            CUT_FRAME_RE.match(stripped) if "\", line " in stripped else None)
        if frame:
            self.frames_seen += 1
            if stripped.endswith((" in fit", " in _fit")):
                self.fit_seen = True
            area, where = classify_frame(frame.group(1), frame.group(2))
            self.frame_paths[line.source] = frame.group(1)
            self.frame_seqs[line.source] = self.seq
            self.cut_calls.pop(line.source, None)  # the statement before it was a call to this frame
            if area:
                self.areas[line.source] = self.areas[ANY_SOURCE] = area
            if where:
                self.wheres[line.source] = self.wheres[ANY_SOURCE] = where
            if self.open_traceback is None:
                self.open_traceback = line
            if "megatron/bridge" not in text:
                return
        elif self.frame_seqs.get(line.source) == self.seq - 1:
            # the statement of the frame just before (an exception line here pops what it sets): the function it
            # calls is the next frame, if one is shown
            where = called_area(self.frame_paths.get(line.source), stripped)
            if where:
                self.cut_calls[line.source] = where
        if stripped.startswith("raise ") and raises_a_config_value(stripped, self.frame_paths.get(line.source)):
            # verl's own code refusing a value it read from the run's config: the frame says "config"
            self.areas[line.source] = self.areas[ANY_SOURCE] = "config"
            return
        if stripped.startswith(THREAD_HEADER):
            self.thread_sources.add(line.source)
            return
        ignored = noise = hydra = False
        error_pattern: Pattern | None = None
        generic = False
        head = text if len(text) <= ERROR_SCAN_CHARS else text[:ERROR_SCAN_CHARS]
        encoded = {} if LongText.usable(text) else None  # a long line: Hyperscan answers (LongText)
        for index in candidates:
            pattern, regex = TABLE[index]
            match = search_pattern(index, regex, text if pattern.kind in FULL_LINE_KINDS else head, encoded)
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
                    self._advance(pattern.phase, pattern.name in CHECKPOINT_LOADS)
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
                for frames_of in (self.areas, self.wheres, self.frame_paths):  # a new traceback: not its frames
                    frames_of.pop(line.source, None)
                    frames_of.pop(ANY_SOURCE, None)
        if line.source == "raylet" or "Worker exit type" in text or "memory" in text or "SIG" in text:
            for cause_re, cause in ACTOR_DEATH_CAUSES:
                if cause not in self.death_causes and (cause_re.search(text) if encoded is None
                                                       else search_other(cause_re, text, encoded)):
                    self.death_causes.append(cause)
        if noise and self.max_step and len(self.noise_after_last_step) < MAX_NOISE:
            self.noise_after_last_step.append(_shorten(text, 200))
        if "No module" in text:
            ext = EXTENSION_MODULE_RE.search(text)
            if ext and len(self.missing_ext) < 20:  # a compiled extension an engine could not load
                self.missing_ext.setdefault(ext.group(1), _shorten(f"({line.source}) {text}" if line.source
                                                                   else text))
            if ignored or OPTIONAL_MODULE_RE.search(text):
                return
        if ignored:
            return
        wrapper = RAY_WRAPPER_RE.search(text) if "ray::" in text else None
        generic = generic or wrapper is not None
        log_error = not generic and error_pattern is None and (hydra or LOG_ERROR_RE.match(text) is not None)
        if error_pattern is None and not generic and not log_error:
            return
        self.open_traceback = None  # its exception line is here
        self.cut_calls.pop(line.source, None)
        if generic and wrapper is None and error_pattern is None and line.source in self.thread_sources:
            self.thread_sources.discard(line.source)
            noise = True  # the thread ended, the process went on: no cause by itself
        if wrapper and line.source is None:
            self._driver_failure()
        event = _ErrorEvent(
            self.seq, line.source, line.inner, _shorten(text, MAX_EVENT_TEXT), error_pattern, self.phase,
            self.max_step, noise, wrapper.group("method") if wrapper else None,
            wrapper.group("inner") if wrapper else None, self.areas.get(line.source), log_error,
            nearest=self.areas.get(ANY_SOURCE),
            where=self.wheres.get(line.source) or self.wheres.get(ANY_SOURCE) or callee_area(text),
        )
        if len(self.events) < MAX_EVENTS:
            self.events.append(event)
        else:
            self.events_dropped += 1

    def _driver_failure(self) -> None:
        if self.driver_failure_seq is None:
            self.driver_failure_seq = self.seq

    def _progressed(self) -> None:
        """Training went on: every error seen so far was survived (nothing to clear on most step lines)."""
        self.progress_seq = self.seq
        self.progress_count += 1
        if self.events or self.events_dropped:
            self.events = []
            self.events_dropped = 0
        if self.areas or self.wheres or self.frame_paths:
            self.areas, self.wheres, self.frame_paths = {}, {}, {}
        if self.cut_calls:
            self.cut_calls = {}
        if self.death_causes:
            self.death_causes = []
        self.driver_failure_seq = None
        self.open_traceback = None
        self.fit_seen = False

    def _metrics_line(self, step: int, rest: bytes, raw: bytes, finite: bool = False) -> None:
        """`_step` of a bytes `step:N - ` line with N > 0 (the fast path of a long run's metrics lines), inlined;
        its Ray prefix needs no ray-up: training is further."""
        if self.reached < TRAINING:
            self.reached = TRAINING
        if step > self.max_step:
            self.max_step = step
            self._progressed()
        self.phase = "training"
        if self.noise_after_last_step:
            self.noise_after_last_step = []
        self.last_step_line = raw
        head = self.metrics_head
        if step in head or len(head) < METRICS_HEAD_STEPS:
            head[step] = _kept_metrics(rest)
        else:
            tail = self.metrics_tail
            if len(tail) == METRICS_TAIL_STEPS:
                self.metrics_dropped += 1
            tail.append((step, rest))
        if not finite and (b"nan" in rest or b"inf" in rest):
            self._check_finite(step, parse_metrics(rest.decode("utf-8", "replace")))

    def _advance(self, phase: str, load: bool = False) -> None:
        """The run is in `phase` now. `load`: a checkpoint load (resume), which before the first step proves the
        models built, not a phase past training (an interrupted resume reads no later phase than its 0/N shows)."""
        index = PHASE_INDEX[phase]
        self.phase = phase
        if load and self.max_step == 0 and index > MODEL_BUILT:
            index = max(MODEL_BUILT, min(self.reached, index))
        if index > self.reached:
            self.reached = index

    def _step(self, step: int, rest: str | bytes, text: str | bytes) -> None:
        """A `step:N - k:v ...` metrics line. `rest`/`text` are bytes on the fast path (decoded only if kept)."""
        if step == 0:  # validation before training: metrics only
            if self.max_step == 0 and self.reached < ROLLOUT_UP:
                self._advance("rollout-up")  # it generated with the rollout: the models were built, the rollout up
            self.metrics_head.setdefault(0, _kept_metrics(rest))
            self.key_lines.setdefault("validation", _shorten(_text(text), 240))
            return
        if isinstance(rest, str) and rest and "training/global_step" not in rest and rest.count(":") < 2 \
                and not VAL_METRIC_RE.match(rest):
            return  # not a metrics line
        if isinstance(rest, str) and VAL_ONLY_RE.match(rest):
            self.val_only_steps.add(step)  # the old format's last line: step:M with only validation metrics
        self._advance("training")
        if step > self.max_step:
            self.max_step = step
            self._progressed()
        self.phase = "training"
        self.noise_after_last_step = []
        self.last_step_line = text
        if step in self.metrics_head or len(self.metrics_head) < METRICS_HEAD_STEPS:
            self.metrics_head[step] = _kept_metrics(rest)
        else:
            if len(self.metrics_tail) == self.metrics_tail.maxlen:
                self.metrics_dropped += 1
            self.metrics_tail.append((step, rest))
        if isinstance(rest, bytes):
            suspicious = b"nan" in rest or b"inf" in rest
        else:
            suspicious = "nan" in rest or "inf" in rest
        if suspicious:
            self._check_finite(step, parse_metrics(_text(rest)))

    def _check_finite(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            if not math.isfinite(value) and CORE_METRIC_RE.search(key) and len(self.nan_findings) < 20:
                self.nan_findings.append(f"step {step}: {key}={value}")
    def _fact(self, pattern: Pattern, match: re.Match[str], line: LogLine) -> None:
        fact, text = pattern.fact, line.text
        if pattern.phase:
            self._advance(pattern.phase, pattern.name in CHECKPOINT_LOADS)
        if fact == "vanilla":
            value = match.group(1).strip("'\"").capitalize()
            if value in ("True", "False"):
                if value not in self.vanilla_values:  # decide asks which were shown: memory stays flat
                    self.vanilla_values.append(value)
                self.key_lines.setdefault("vanilla", _shorten(text, 240))
        elif fact in ("total_steps", "override_steps", "trace_steps", "config_steps"):
            source = {"total_steps": "printed", "override_steps": "override", "trace_steps": "trace",
                      "config_steps": "config"}[fact]
            if fact == "override_steps":  # Hydra: the last override on the command line wins
                values = re.findall(r"trainer\.total_training_steps=(\d+)", text)
                self.expected[source] = int(values[-1])
            else:
                self.expected.setdefault(source, int(match.group(1)))
            self.key_lines.setdefault(f"steps_{source}", _shorten(text, 240))
        elif fact == "dataloader_size":
            self.epoch_plan.setdefault("size", int(match.group(1)))
        elif fact == "epochs_override":  # Hydra: the last override on the command line wins
            self.epoch_plan["override"] = int(re.findall(r"trainer\.total_epochs=(\d+)", text)[-1])
        elif fact == "epochs_config":
            self.epoch_plan.setdefault("config", int(match.group(1)))
        elif fact == "epoch_bar":  # the latest bar's epochs x its steps per epoch: the run the log ends in
            self.epoch_plan["bar"] = int(match.group(2)) * int(match.group(3))
        elif fact == "adapter_header":
            if len(self.adapters) < MAX_ADAPTER_BLOCKS:
                self.adapters.append({})
        elif fact in ("adapter_total", "adapter_count", "adapter_pct") and self.adapters:
            key = {"adapter_total": "total", "adapter_count": "adapter", "adapter_pct": "trainable_pct"}[fact]
            raw = match.group(1).replace(",", "")
            block = self.adapters[-1]
            if key not in block:
                try:
                    block[key] = float(raw) if key == "trainable_pct" else int(raw)
                except ValueError:
                    pass
                if len(self.adapters) <= ADAPTER_KEY_LINES:
                    n = len(self.adapters)
                    self.key_lines[f"adapter_{key}" + (f"_{n}" if n > 1 else "")] = _shorten(text, 200)
        elif fact == "save":
            path = match.group(1).rstrip(".,;:")
            if path not in self.checkpoints_saved:
                self.checkpoints_saved.append(path)
            named = GLOBAL_STEP_RE.search(path)
            if named:
                self.saved_step = max(self.saved_step, int(named.group(1)))
            self.key_lines["checkpoint_save"] = _shorten(text, 240)
        elif fact == "tool_exit":
            if not self.exit_code_given:  # the caller's values (a level run) win over the footer
                self.exit_code = int(match.group(1))
                self.termination = self.termination or match.group(2)
                self.key_lines["tool_exit"] = _shorten(text, 200)
        elif fact == "traced_command":  # a script's set -x of the verl command it runs: the overrides it passed
            self.traced_command = text[:MAX_TRACED_COMMAND]
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
            if total > 0 and (self.bar_total is None or total > self.bar_total):
                self.bar_total = total
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

    # -- read-only views (decide and the live status line use them) ------------------------------------------
    def _expected_steps(self) -> tuple[int | None, str]:
        """The planned total: `--steps`, else the largest total any line shows (printed `Total training steps`,
        Hydra override, config dump, the wrapper's TOTAL_TRAIN_STEPS, a tqdm bar's N/M; with none of the explicit
        ones, verl's own formula: train dataloader size x total_epochs, or the SFT bar's steps per epoch x its
        epochs). A run that ends below a planned total it printed did not finish (issue 25.2)."""
        if self.steps_expected_arg is not None:
            return self.steps_expected_arg, "given"
        shown = [(self.expected[s], s) for s in ("printed", "override", "trace", "config") if s in self.expected]
        epochs = self.epoch_plan.get("override", self.epoch_plan.get("config"))
        if not shown and epochs and self.epoch_plan.get("size"):  # verl's total when total_training_steps is unset
            shown.append((self.epoch_plan["size"] * epochs, "epochs"))
        if not shown and self.epoch_plan.get("bar"):  # the SFT bar's epochs x its steps per epoch
            shown.append((self.epoch_plan["bar"], "epoch-bar"))
        if self.bar_total is not None:
            shown.append((self.bar_total, "bar"))
        if not shown:
            return None, "none"
        top = max(value for value, _ in shown)
        return top, next(source for value, source in shown if value == top)

