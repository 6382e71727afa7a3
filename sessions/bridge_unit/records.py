"""Bridge-side checks (the procedure's targeted unit tests) as a level sees them: a record of a `bridge_unit` run
for the exact Bridge state (commit + dirty files + their content), looked up under $LOG_DIR/bridge_unit/records.

`nox -s bridge_unit` writes records (`write_record`); a level reads the newest one whose fingerprint matches the
Bridge checkout it is about to run (`find_record`). A record of another commit or other edits is ignored.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from env.repos import RepoState

TARGETED_TESTS = (
    "tests/unit_tests/models/test_model_provider_mixin.py",
    "tests/unit_tests/models/test_param_mapping.py",
    "tests/unit_tests/training/test_integration.py",
)
NOT_REQUESTED = "Not requested"


@dataclass
class BridgeChecks:
    """The 'Bridge-side checks' deliverable of one level run."""

    status: str  # Pass | Fail | Blocked | Skipped | Not requested
    detail: str
    record: dict | None = None
    limitations: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"status": self.status, "detail": self.detail, "record": self.record, "limitations": self.limitations}


def records_dir(log_dir: Path) -> Path:
    return Path(log_dir) / "bridge_unit" / "records"


def write_record(log_dir: Path, state: RepoState, record: dict) -> Path:
    """Store a bridge_unit outcome; `record` holds result, counts, missing_paths, command, junit, duration_s."""
    out = records_dir(log_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = dict(record, fingerprint=state.fingerprint, bridge=state.to_json(), finished=time.time())
    path = out / f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{state.head}-{state.fingerprint}.json"
    path.write_text(json.dumps(data, indent=2))
    return path


def find_record(log_dir: Path, state: RepoState) -> dict | None:
    """Newest record of exactly this Bridge state, or None."""
    best = None
    folder = records_dir(log_dir)
    if not folder.is_dir():
        return None
    for path in folder.glob("*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if data.get("fingerprint") == state.fingerprint and (best is None or data["finished"] > best["finished"]):
            best = dict(data, path=str(path))
    return best


def from_record(record: dict) -> BridgeChecks:
    counts = record.get("counts") or {}
    count_text = ", ".join(f"{v} {k}" for k, v in counts.items() if v) or "no tests counted"
    detail = f"{record.get('command', 'nox -s bridge_unit')} ({count_text}; record {record.get('path', '?')})"
    limitations = []
    if record.get("missing_paths"):
        detail += f"; missing at this commit: {', '.join(record['missing_paths'])}"
        ran_the_rest = ""
        if record.get("allow_missing"):
            ran_the_rest = " (--allow-missing: the rest ran)" if record.get("pytest_exit") is not None else \
                " (--allow-missing)"
        carried = [t for ts in (record.get("successors") or {}).values() for t in ts
                   if t not in (record.get("paths") or [])]
        limitations.append(f"targeted Bridge test path(s) missing at this commit{ran_the_rest}: "
                           f"{', '.join(record['missing_paths'])}"
                           + (f"; not run: the tests that carry them on, {', '.join(dict.fromkeys(carried))}"
                              if carried else ""))
    return BridgeChecks(record.get("result", "Fail"), detail, record, limitations)


def not_requested() -> BridgeChecks:
    return BridgeChecks(NOT_REQUESTED, "--skip-bridge-checks",
                        limitations=["Bridge-side checks not requested (--skip-bridge-checks): the result speaks "
                                     "for the verl level alone"])
