"""Run directories: `$LOG_DIR/<utc-time>-<label>-<model>/`, never reused (a suffix when the second collides)."""

from __future__ import annotations

import re
import time
from pathlib import Path

from env.settings import UsageError


def next_run_dir(log_dir: Path, label: str, model_id: str) -> Path:
    """The directory a run started now would get (a dry-run prints it; nothing is created)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    model = re.sub(r"[^\w.\-]+", "_", model_id.split("/")[-1])
    base = Path(log_dir) / f"{stamp}-{label}-{model}"
    path, i = base, 1
    while path.exists():
        path, i = Path(f"{base}-{i}"), i + 1
    return path


def new_run_dir(log_dir: Path, label: str, model_id: str) -> Path:
    path = next_run_dir(log_dir, label, model_id)
    try:
        path.mkdir(parents=True)
    except OSError as e:  # LOG_DIR unusable in a way its pre-check could not see (see writable_dir_problem)
        raise UsageError(f"cannot create a run directory under {log_dir} (--log-dir / LOG_DIR): "
                         f"{e.strerror or e}") from None
    return path
