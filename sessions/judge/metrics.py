"""Level 5 evidence from per-step metrics (Verdict.step_metrics): metrics.csv and the learning-signal checks.

The procedure's list (SPEC "Levels", level 5): no NaN/inf in loss, reward, KL, entropy, grad norm or log-prob
metrics; non-zero trainable adapter parameters when PEFT is on; actor/critic losses and rewards logged for several
steps; validation score or reward trend vs step 0 (or a known-good baseline run); no repeated zero grad norms,
frozen adapters or constant log-probs. "converged" only when a pre-agreed `--threshold METRIC>=VALUE` is met.
"""

from __future__ import annotations

import csv
import math
import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from env.settings import UsageError

METRICS_CSV = "metrics.csv"
MIN_SIGNAL_STEPS = 3  # "several steps" of losses and rewards
REL_TOL = 0.05  # a move smaller than 5% of the value ...
NOISE_K = 2.0  # ... or than twice the windows' standard error is "flat"

StepMetrics = dict[int, dict[str, float]]

# Metric families by key (verl's slash paths). Non-finite values are checked on every family below.
LOSS_RE = re.compile(r"^(actor|critic)/\w*loss$")
REWARD_KEYS = ("critic/score/mean", "critic/rewards/mean")
VALIDATION_RE = re.compile(r"^(val-core/|val/test_score/)")
KL_RE = re.compile(r"(^|/|_)kl($|/|_)")
ENTROPY_RE = re.compile(r"entropy")
GRAD_NORM_RE = re.compile(r"grad_norm")
LOGPROB_RE = re.compile(r"log_?probs?|probs_diff|probs_pearson|(^|_|/)log_ppl|_ppl$")
# Keys in those families that are no signal: validity flags (`training/rollout_probs_diff_valid` is 1.0 at every
# step), coefficients, learning rates, and timings of the log-prob passes.
NOT_A_SIGNAL_RE = re.compile(r"(_valid|/valid|_coef|_coeff|/lr)$|^(timing_s|timing_per_token_ms|perf)/")
WATCHED = (LOSS_RE, KL_RE, ENTROPY_RE, GRAD_NORM_RE, LOGPROB_RE, VALIDATION_RE,
           re.compile(r"reward|score"))
ACTOR_LOSS_KEYS = ("actor/pg_loss", "actor/policy_loss", "actor/loss")
CRITIC_LOSS_KEYS = ("critic/vf_loss", "critic/loss")


def log_prob_signal(key: str) -> bool:
    """A log-prob, KL or entropy metric whose value must move between steps (never a flag or a timing)."""
    return bool((LOGPROB_RE.search(key) or KL_RE.search(key) or ENTROPY_RE.search(key))
                and not NOT_A_SIGNAL_RE.search(key))


def watched(key: str) -> bool:
    return any(r.search(key) for r in WATCHED)


# -- CSV -----------------------------------------------------------------------------------------------------------

def write_csv(path: Path, step_metrics: StepMetrics) -> Path:
    """One row per logged step (step 0 = validation before training), one column per metric key."""
    keys = sorted({k for m in step_metrics.values() for k in m})
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["step", *keys])
        for step in sorted(step_metrics):
            row = step_metrics[step]
            writer.writerow([step, *(repr(row[k]) if k in row else "" for k in keys)])
    return path


def read_csv(path: Path) -> StepMetrics:
    out: StepMetrics = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            step = int(row.pop("step"))
            out[step] = {k: float(v) for k, v in row.items() if v not in ("", None)}
    return out


def series(step_metrics: StepMetrics, key: str, training_only: bool = False) -> list[tuple[int, float]]:
    return [(s, step_metrics[s][key]) for s in sorted(step_metrics)
            if key in step_metrics[s] and not (training_only and s == 0)]


def first_key(step_metrics: StepMetrics, candidates: Iterable[str]) -> str | None:
    present = {k for m in step_metrics.values() for k in m}
    return next((k for k in candidates if k in present), None)


def validation_key(step_metrics: StepMetrics) -> str | None:
    keys = sorted({k for m in step_metrics.values() for k in m if VALIDATION_RE.search(k)})
    # GSM8K's rule reward logs acc/mean@1; an RM run logs reward/mean@1: prefer the accuracy
    return next((k for k in keys if "/acc/" in k), None) or next((k for k in keys if k.endswith("mean@1")), None) \
        or (keys[0] if keys else None)


# -- threshold -----------------------------------------------------------------------------------------------------

THRESHOLD_RE = re.compile(r"^\s*([A-Za-z][\w/@.\-]*)\s*(>=|<=)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$")


@dataclass(frozen=True)
class Threshold:
    metric: str
    op: str  # ">=" | "<="
    value: float

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.value:g}"

    def met_by(self, x: float) -> bool:
        return math.isfinite(x) and (x >= self.value if self.op == ">=" else x <= self.value)


def parse_threshold(text: str) -> Threshold:
    """`METRIC>=VALUE` (or `<=` for a loss); bad syntax is a usage error (exit 2)."""
    match = THRESHOLD_RE.match(text or "")
    if not match:
        raise UsageError(f"--threshold must look like METRIC>=VALUE (e.g. val-core/openai/gsm8k/acc/mean@1>=0.5), "
                         f"got {text!r}")
    value = float(match.group(3))
    if not math.isfinite(value):
        raise UsageError(f"--threshold value must be a finite number, got {match.group(3)!r}")
    return Threshold(match.group(1), match.group(2), value)


# -- checks --------------------------------------------------------------------------------------------------------

@dataclass
class Finding:
    check: str  # short name of the procedure's check
    ok: bool
    detail: str
    category: str = "unknown"  # verdict category when it fails


@dataclass
class Trend:
    metric: str
    first: float
    last: float
    direction: str  # up | down | flat
    against: str  # "step 0", "first steps", "baseline"
    expected: str | None = None  # up | down | None (informative only)

    def __str__(self) -> str:
        want = f", expected {self.expected}" if self.expected else ""
        return f"{self.metric} {self.direction} vs {self.against} ({self.first:.4g} -> {self.last:.4g}{want})"


@dataclass
class SignalReport:
    findings: list[Finding] = field(default_factory=list)
    trends: list[Trend] = field(default_factory=list)  # vs step 0 / first steps
    baseline_trends: list[Trend] = field(default_factory=list)  # candidate vs baseline
    threshold: Threshold | None = None
    threshold_value: float | None = None  # the metric's last logged value
    threshold_step: int | None = None
    steps: int = 0

    @property
    def failed(self) -> list[Finding]:
        return [f for f in self.findings if not f.ok]

    @property
    def converged(self) -> bool:
        return (self.threshold is not None and self.threshold_value is not None
                and self.threshold.met_by(self.threshold_value) and not self.failed)


def first_non_finite(step_metrics: StepMetrics) -> tuple[int, str, float] | None:
    """The first step with a non-finite watched metric, and the first such metric in the log line's order."""
    for step in sorted(step_metrics):
        for key in step_metrics[step]:
            value = step_metrics[step][key]
            if not math.isfinite(value) and watched(key):
                return step, key, value
    return None


def _window_mean(values: list[float], first: bool) -> tuple[float, float]:
    """Mean and standard error of the first (or last) quarter of the values, at least two of them: a one-point
    window has no error estimate, so one lucky step (a random model's single reward at the last of six steps, seen
    on the H200) would read as a trend."""
    k = max(2, len(values) // 4)
    window = values[:k] if first else values[-k:]
    mean = statistics.fmean(window)
    se = statistics.stdev(window) / math.sqrt(k) if k > 1 else 0.0
    return mean, se


def direction(first: float, last: float, noise: float = 0.0) -> str:
    tol = max(REL_TOL * max(abs(first), abs(last)), NOISE_K * noise, 1e-12)
    if last - first > tol:
        return "up"
    if first - last > tol:
        return "down"
    return "flat"


def trend_of(points: list[tuple[int, float]], metric: str, expected: str | None) -> Trend | None:
    values = [v for _, v in points if math.isfinite(v)]
    if len(values) < 2:
        return None
    if len(values) < 4:  # few points (validation at 0, 10, 20): compare the ends
        first, last, noise = values[0], values[-1], 0.0
    else:
        (first, se1), (last, se2) = _window_mean(values, True), _window_mean(values, False)
        noise = math.hypot(se1, se2)
    against = "step 0" if points[0][0] == 0 else "first steps"
    return Trend(metric, first, last, direction(first, last, noise), against, expected)


def _tail_mean(points: list[tuple[int, float]]) -> tuple[float, float] | None:
    values = [v for _, v in points if math.isfinite(v)]
    if not values:
        return None
    return _window_mean(values, False)


# what each plotted/compared metric family should do in a healthy short run (stated, only reward/validation decide)
EXPECTED_DIRECTION = {"reward": "up", "validation": "up", "critic/vf_loss": "down"}


def headline_keys(step_metrics: StepMetrics) -> list[str]:
    """The metrics whose trend decides the learning signal: validation score and reward."""
    return [k for k in (validation_key(step_metrics), first_key(step_metrics, REWARD_KEYS)) if k]


def informative_keys(step_metrics: StepMetrics) -> list[str]:
    present = sorted({k for m in step_metrics.values() for k in m})
    picked = [k for k in present if LOSS_RE.search(k) or KL_RE.search(k) or ENTROPY_RE.search(k)
              or GRAD_NORM_RE.search(k)]
    return picked


def _expected(key: str) -> str | None:
    if VALIDATION_RE.search(key):
        return "up"
    if key in REWARD_KEYS:
        return "up"
    return EXPECTED_DIRECTION.get(key)


def check_learning_signal(step_metrics: StepMetrics, *, steps_expected: int | None, adapters: list[dict],
                          lora_enabled: bool, critic_expected: bool, baseline: StepMetrics | None = None,
                          threshold: Threshold | None = None) -> SignalReport:
    """Every level-5 check over the metrics of one run; `report.failed` lists what breaks the learning signal."""
    rep = SignalReport(threshold=threshold)
    training = {s: m for s, m in step_metrics.items() if s > 0}
    rep.steps = max(training, default=0)
    total = f" of {steps_expected}" if steps_expected else ""

    bad = first_non_finite(step_metrics)
    if bad:
        step, key, value = bad
        rep.findings.append(Finding("finite metrics", False, f"first non-finite value: {key}={value} at step "
                                    f"{step}{total}", "nan-metrics"))
    else:
        rep.findings.append(Finding("finite metrics", True, "no NaN/inf in loss, reward, KL, entropy, grad norm or "
                                    "log-prob metrics"))

    if not lora_enabled:
        rep.findings.append(Finding("trainable adapter", True, "PEFT off (LORA_RANK=0): adapter check not applicable"))
    else:
        counted = [b for b in adapters if "adapter" in b]
        frozen = [(i, b) for i, b in enumerate(counted, 1) if int(b["adapter"]) <= 0]
        several = len(counted) > 1
        if not counted:
            rep.findings.append(Finding("trainable adapter", False, "no `PEFT Adapter Information` block with "
                                        "`Adapter parameters: N` in the log: trainable adapter parameters not shown",
                                        "provider"))
        elif frozen:
            i, b = frozen[0]
            where = f" in PEFT block {i} of {len(counted)}" if several else ""
            rep.findings.append(Finding("trainable adapter", False, f"frozen adapters: Adapter parameters: "
                                        f"{b['adapter']} (of {b.get('total', '?')}){where}", "provider"))
        else:
            counts = ", ".join(f"{b['adapter']}" + (f" ({b['trainable_pct']}%)" if "trainable_pct" in b else "")
                               for b in counted)
            detail = (f"adapter parameters per PEFT block (one per model verl built): {counts}" if several
                      else f"{counts} adapter parameters")
            rep.findings.append(Finding("trainable adapter", True, detail))

    needed = [("actor loss", ACTOR_LOSS_KEYS), ("reward", REWARD_KEYS)]
    if critic_expected:
        needed.insert(1, ("critic loss", CRITIC_LOSS_KEYS))
    counts, short = [], []
    for what, keys in needed:
        key = first_key(training, keys)
        n = len(series(training, key)) if key else 0
        counts.append((what, key, n))
        if n < MIN_SIGNAL_STEPS:
            short.append(f"{what} ({key or ' / '.join(keys)}): {n} step(s)")
    if short:
        rep.findings.append(Finding("several steps", False, f"fewer than {MIN_SIGNAL_STEPS} steps logged for "
                                    + "; ".join(short)))
    else:
        rep.findings.append(Finding("several steps", True, ", ".join(f"{key} at {n} steps" for _, key, n in counts)))

    zero = []
    for key in sorted({k for m in training.values() for k in m if GRAD_NORM_RE.search(k)}):
        steps = [s for s, v in series(training, key) if v == 0.0]
        if len(steps) >= 2:
            zero.append(f"{key}=0 at steps {', '.join(map(str, steps[:10]))}")
    rep.findings.append(Finding("non-zero gradients", not zero, "; ".join(zero) if zero else
                                "grad norm not repeatedly zero", "provider"))

    constant = []
    for key in sorted({k for m in training.values() for k in m if log_prob_signal(k)}):
        values = [v for _, v in series(training, key) if math.isfinite(v)]
        if len(values) >= MIN_SIGNAL_STEPS and max(values) - min(values) <= 1e-12 * max(1.0, abs(values[0])):
            constant.append(f"{key}={values[0]!r} at all {len(values)} steps")
    rep.findings.append(Finding("changing log-probs", not constant, "constant: " + "; ".join(constant) if constant
                                else "log-prob, KL and entropy metrics change between steps", "provider"))

    for key in headline_keys(step_metrics):
        t = trend_of(series(step_metrics, key, training_only=not VALIDATION_RE.search(key)), key, "up")
        if t:
            rep.trends.append(t)
    for key in informative_keys(training):
        t = trend_of(series(training, key), key, _expected(key))
        if t:
            rep.trends.append(t)
    decisive = [t for t in rep.trends if t.metric in headline_keys(step_metrics)]
    if not decisive:
        rep.findings.append(Finding("trend", False, "no validation score or reward logged at two or more steps: "
                                    "no trend to judge"))
    elif any(t.direction == "down" for t in decisive) or not any(t.direction == "up" for t in decisive):
        rep.findings.append(Finding("trend", False, "no learning signal: " + "; ".join(map(str, decisive))))
    else:
        rep.findings.append(Finding("trend", True, "; ".join(map(str, decisive))))

    if baseline is not None:
        _compare_baseline(rep, training, step_metrics, baseline)

    if threshold is not None:
        points = [(s, v) for s, v in series(step_metrics, threshold.metric) if math.isfinite(v)]
        if points:
            rep.threshold_step, rep.threshold_value = points[-1]
    return rep


def _compare_baseline(rep: SignalReport, training: StepMetrics, step_metrics: StepMetrics,
                      baseline: StepMetrics) -> None:
    keys = headline_keys(step_metrics) + informative_keys(training)
    for key in keys:
        cand = _tail_mean(series(step_metrics, key))
        base = _tail_mean(series(baseline, key))
        if cand is None or base is None:
            continue
        (b, bse), (c, cse) = base, cand
        d = direction(b, c, math.hypot(bse, cse))
        word = {"up": "higher", "down": "lower", "flat": "same"}[d]
        rep.baseline_trends.append(Trend(key, b, c, word, "baseline", _expected(key)))
    decisive = [t for t in rep.baseline_trends if t.metric in headline_keys(step_metrics)]
    if not decisive:
        rep.findings.append(Finding("baseline", False, "the baseline run logs none of this run's validation/reward "
                                    "metrics: no comparison"))
    elif any(t.direction == "lower" for t in decisive):
        rep.findings.append(Finding("baseline", False, "below the known-good baseline: "
                                    + "; ".join(vs_baseline(t) for t in decisive)))
    else:
        rep.findings.append(Finding("baseline", True, "; ".join(vs_baseline(t) for t in decisive)))


def vs_baseline(t: Trend) -> str:
    how = "the same as" if t.direction == "same" else f"{t.direction} than"
    return f"{t.metric} {how} baseline ({t.last:.4g} vs {t.first:.4g})"


def describe_directions(rep: SignalReport) -> list[str]:
    """One line per metric: its direction vs step 0 / first steps, and vs the baseline when given."""
    lines = [str(t) for t in rep.trends]
    lines += [vs_baseline(t) for t in rep.baseline_trends]
    return lines
