"""The types every preflight check speaks: a `Check` result and the `RunContext` a check reads and adjusts.

Kept apart from env/preflight.py (which orders and runs the checks) so that the modules holding checks (modelopt,
Ray probe, model download, level rules) import these types without importing preflight itself.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from env.pythonpath import ImportProbe
    from env.repos import RepoState
    from env.settings import Resolved

OK, WARN, BLOCKED, SKIPPED = "ok", "warn", "blocked", "skipped"


@dataclass
class Check:
    name: str
    status: str  # ok | warn | blocked | skipped
    detail: str
    fix: str | None = None
    category: str | None = None  # verdict category when blocked
    duration_s: float | None = None  # wall time of the check function that yielded it
    cached: str | None = None  # "cached from <UTC time>" when the answer came from the probe cache

    def to_json(self) -> dict:
        return self.__dict__.copy()


@dataclass
class RunContext:
    """What preflight knows and decides about one level run."""

    settings: Resolved
    bridge: RepoState
    verl: RepoState
    pythonpath: str
    wrapper_env: dict[str, str]  # the level preset env (for TP x PP x CP)
    python: str = "python3"
    probe: bool = True  # False: run no probe (imports, Ray)
    dry_run: bool = False  # a level's --dry-run: the same probes, but nothing downloaded or installed
    no_reward_model: bool = False
    image_python: bool = False  # running in the container's own Python (nox -s verl)
    dummy_config: Path | None = None
    download: bool = False
    environ: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    user_overrides: list[str] = field(default_factory=list)  # the user's own, after `--`: they win over ours
    base_overrides: list[str] = field(default_factory=list)  # the level's own (level 3's three fusion overrides)
    fresh_probe: bool = False  # ignore the probe cache
    # decisions
    env: dict[str, str] = field(default_factory=dict)  # set for the run
    drop_env: list[str] = field(default_factory=list)  # removed for the run
    overrides: list[str] = field(default_factory=list)  # Hydra overrides appended by preflight
    limitations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    imports: ImportProbe | None = None
    model_path: Path | None = None
    evidence: dict = field(default_factory=dict)  # facts for the report (bridge file, worker file, ...)


CheckFn = Callable[[RunContext], Iterable[Check]]


def override_key(override: str) -> str:
    """`++a.b=c` / `+a.b=c` / `a.b=c` -> `a.b` (Hydra's key of an override)."""
    return override.lstrip("+~").split("=", 1)[0]
