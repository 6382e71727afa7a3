"""The types every preflight check speaks: a `Check` result and the `RunContext` a check reads and adjusts.

Kept apart from env/preflight/checklist.py (which orders and runs the checks) so that the modules holding checks (modelopt,
Ray probe, model download, level rules) import these types without importing preflight itself.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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


class Facts:
    """What the checks need that takes time (probe processes, parquet reads, nvidia-smi, tree walks), computed once
    per run in worker threads: preflight starts the ones it will need up front so they overlap, and a check that
    asks for a fact nobody started computes it there. Records each fact's wall time and where it was cached."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._futures: dict[str, Future] = {}
        self.seconds: dict[str, float] = {}
        self.cached_from: dict[str, str] = {}  # fact -> UTC time of the cached answer it reused

    def start(self, name: str, fn: Callable[[], Any]) -> None:
        if name in self._futures:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="preflight")

        def timed() -> Any:
            began = time.monotonic()
            try:
                return fn()
            finally:
                self.seconds[name] = round(time.monotonic() - began, 3)

        self._futures[name] = self._pool.submit(timed)

    def get(self, name: str, fn: Callable[[], Any]) -> Any:
        self.start(name, fn)
        return self._futures[name].result()

    def started(self, name: str) -> bool:
        return name in self._futures

    def done(self, names: Iterable[str]) -> bool:
        """Every one of these facts that was started has its answer."""
        return all(self._futures[n].done() for n in names if n in self._futures)

    def names(self) -> list[str]:
        return sorted(self._futures)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


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
    level: int = 0
    feature: str | None = None  # Level 4 --feature
    script: str | None = None  # Level 4 --script (relative to VERL_REPO or absolute)
    run_envs: list[dict[str, str]] = field(default_factory=list)  # every run's preset env (level 1: A and B)
    taken: dict[str, str] = field(default_factory=dict)  # run path beyond the model build -> why this level takes it
    # decisions
    env: dict[str, str] = field(default_factory=dict)  # set for the run
    drop_env: list[str] = field(default_factory=list)  # removed for the run
    overrides: list[str] = field(default_factory=list)  # Hydra overrides appended by preflight
    limitations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    imports: ImportProbe | None = None
    model_path: Path | None = None
    evidence: dict = field(default_factory=dict)  # facts for the report (bridge file, worker file, ...)
    facts: Facts = field(default_factory=Facts, repr=False)


CheckFn = Callable[[RunContext], Iterable[Check]]


@dataclass
class ImportProbe:
    python: str
    raw: dict

    def file_of(self, module: str) -> str | None:
        return self.raw.get(module, {}).get("file")

    def error_of(self, module: str) -> str | None:
        return self.raw.get(module, {}).get("error")

    def present(self, module: str) -> bool:
        return bool(self.raw.get("present", {}).get(module))

    def import_result(self, module: str) -> dict:
        return self.raw.get("imports", {}).get(module, {})
