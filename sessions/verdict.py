"""The verdict engine: reads a verl log (streamed) and says Pass / Fail / Blocked, with category and evidence.

Contract used by the rest of the tool (level runner, reports, `invoke judge`):

    judge_log(path, *, level=None, steps_expected=None, exit_code=None, termination=None) -> Verdict

`termination` is what the launcher knows and the log cannot: None (the wrapper ended by itself),
"interrupted" (our process got SIGINT/SIGTERM and stopped the wrapper) or "timeout" (stall timeout).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

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
