"""The verdict's data: results, categories, phases, and the Verdict record both answers are reported in."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

RESULTS = ("Pass", "Fail", "Blocked")
CATEGORIES = (
    "success", "provider", "weight-sync", "checkpoint", "nan-metrics", "oom", "nccl", "actor-died", "hang", "rollout", "data",
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
    # one per `PEFT Adapter Information` block, in log order: {"total": int, "adapter": int, "trainable_pct": float}
    adapters: list[dict[str, Any]] = field(default_factory=list)
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
    # -- how the category was found (issue 25): which of method / frames / message were looked at, what they said
    category_evidence: dict[str, Any] = field(default_factory=dict)
    signature: str = ""  # category | exception type | masked first error (bisect compares commits by it)

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
