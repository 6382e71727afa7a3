"""`invoke install-modelopt`: nvidia-modelopt in the Python that runs verl (verl's checkpoint paths need it).

`pip show nvidia-modelopt` first; only when absent, `pip install nvidia-modelopt --extra-index-url <index>` (NVIDIA's
index by default, MODELOPT_INDEX_URL to change it). What happened is written as a container-setup record under
$LOG_DIR/container_setup/ — evidence about the environment, never a change to either checkout — and a level's
preflight quotes the newest record for its Python (`check_container_setup`).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from env.settings import Resolved

if TYPE_CHECKING:
    from env.preflight import Check, RunContext

PACKAGE = "nvidia-modelopt"
SETUP_DIR = "container_setup"


def setup_dir(log_dir: Path) -> Path:
    return Path(log_dir) / SETUP_DIR


def pip_show(python: str) -> str | None:
    """The installed version, or None when pip does not know the package."""
    try:
        proc = subprocess.run([python, "-m", "pip", "show", PACKAGE], capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        raise RuntimeError(f"Python {python!r} not found (set VERL_PYTHON / --python)") from None
    if proc.returncode != 0:
        if "No module named pip" in proc.stderr:
            raise RuntimeError(f"{python} has no pip: install nvidia-modelopt with the image's own tooling")
        return None
    for line in proc.stdout.splitlines():
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def install_argv(python: str, index_url: str) -> list[str]:
    return [python, "-m", "pip", "install", "--extra-index-url", index_url, PACKAGE]


def write_setup_record(log_dir: Path, record: dict) -> Path:
    folder = setup_dir(log_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-modelopt-{time.time_ns() % 10**6}.json"
    path.write_text(json.dumps(record, indent=2))
    return path


def ensure_modelopt(python: str, index_url: str, log_dir: Path, echo=print) -> tuple[dict, Path]:
    """Show or install; returns (record, record path). Raises RuntimeError with pip's last error line on failure."""
    started = time.time()
    version = pip_show(python)
    record = {"package": PACKAGE, "python": python, "index_url": index_url, "started": started}
    if version is not None:
        record.update(action="present", version=version, command=shlex.join([python, "-m", "pip", "show", PACKAGE]))
        echo(f"{PACKAGE} {version} already installed in {python}: nothing to do")
    else:
        argv = install_argv(python, index_url)
        echo(f"{PACKAGE} missing in {python}: {shlex.join(argv)}")
        proc = subprocess.run(argv, capture_output=True, text=True)
        sys.stderr.write(proc.stdout[-4000:])
        if proc.returncode != 0:
            lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
            err = next((ln for ln in reversed(lines) if ln.startswith("ERROR")), lines[-1] if lines else "no output")
            raise RuntimeError(f"pip install {PACKAGE} from {index_url} failed (exit {proc.returncode}): {err}")
        version = pip_show(python)
        if version is None:
            raise RuntimeError(f"pip reported success but `pip show {PACKAGE}` still finds nothing in {python}")
        record.update(action="installed", version=version, command=shlex.join(argv))
        echo(f"installed {PACKAGE} {version} into {python}")
    record["finished"] = time.time()
    return record, write_setup_record(log_dir, record)


def install_command(settings: Resolved, dry_run: bool = False) -> int:
    """Body of `invoke install-modelopt`."""
    python = str(settings.python or "python3")
    index_url = settings.modelopt_index_url

    def say(msg: str) -> None:
        print(f"[install-modelopt] {msg}", flush=True)

    if dry_run:
        say(f"dry-run: {python} -m pip show {PACKAGE}; if absent: {shlex.join(install_argv(python, index_url))}")
        return 0
    try:
        _, path = ensure_modelopt(python, index_url, Path(settings.log_dir), say)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    say(f"container-setup record: {path}")
    return 0


def latest_setup(log_dir: Path, python: str) -> dict | None:
    """Newest modelopt setup record made for this Python."""
    best = None
    for path in setup_dir(log_dir).glob("*-modelopt-*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if data.get("python") == python and (best is None or data.get("finished", 0) > best.get("finished", 0)):
            best = dict(data, path=str(path))
    return best


def check_container_setup(ctx: RunContext) -> Iterable[Check]:
    """Quote the container-setup record (install-modelopt) of the run's Python in the run's evidence."""
    from env.preflight import OK, Check

    record = latest_setup(Path(ctx.settings.log_dir), ctx.python)
    if record is None:
        return
    ctx.evidence["container_setup"] = [record]
    what = "installed" if record.get("action") == "installed" else "found"
    ctx.notes.append(f"container setup: {PACKAGE} {record.get('version')} {what} in {record['python']} "
                     f"(index {record.get('index_url')}; record {record['path']}) — environment, not a repo change")
    yield Check("container setup", OK, f"{PACKAGE} {record.get('version')} {what} by install-modelopt "
                f"({record['path']})")
