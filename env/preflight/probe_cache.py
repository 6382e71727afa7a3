"""A probe's answer, kept for the next run: in $LOG_DIR/.preflight_cache/, keyed by everything the answer depends on.

The key holds the interpreter (resolved path and mtime), the PYTHONPATH, the mtimes of every directory on that
interpreter's sys.path (installing or removing a package changes its site-packages directory), the newest mtime and
file count of the checkouts' package trees (an edit to Bridge, Megatron-LM or verl), the probe's own source and its
request. A user retrying after a fix changes one of these, so the fixed environment is probed again; `--fresh-probe`
ignores the cache. Only complete answers are stored (never a timeout or a cluster that would not start).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from env.preflight.checks import RunContext

CACHE_DIR = ".preflight_cache"


def _mtime(path: str | Path) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def tree_stamp(root: Path) -> list:
    """(newest mtime, file count) of the .py files and directories under root: any edit, add or delete moves it."""
    newest, count = _mtime(root) or 0.0, 0
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in ("__pycache__", ".git")]
        newest = max(newest, _mtime(folder) or 0.0)
        for name in files:
            if name.endswith(".py"):
                count += 1
                newest = max(newest, _mtime(os.path.join(folder, name)) or 0.0)
    return [newest, count]


def key(python: str, pythonpath: str, sys_path: list[str], trees: list[Path], request: Any) -> str:
    resolved = shutil.which(python) or python
    real = os.path.realpath(resolved)
    parts = {
        "python": [real, _mtime(real)],
        "pythonpath": pythonpath,
        "sys_path": [[p, _mtime(p)] for p in sys_path],
        "trees": [[str(t), tree_stamp(t)] for t in trees],
        "request": request,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def load(log_dir: Path, kind: str, digest: str) -> tuple[Any, str] | None:
    """(answer, "cached from <UTC time>") or None."""
    path = Path(log_dir) / CACHE_DIR / f"{kind}-{digest}.json"
    try:
        entry = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(entry.get("created", 0)))
    return entry.get("answer"), f"cached from {when}"


def save(log_dir: Path, kind: str, digest: str, answer: Any) -> None:
    folder = Path(log_dir) / CACHE_DIR
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{kind}-{digest}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps({"created": time.time(), "answer": answer}))
        tmp.replace(folder / f"{kind}-{digest}.json")
    except OSError:
        pass  # a cache that cannot be written costs the next run time, never this run


def trees(ctx: RunContext) -> list[Path]:
    """The checkouts' package trees on the run's PYTHONPATH."""
    from env.repos import MEGATRON_LM  # noqa: PLC0415 - keeps this module free of gitpython for the bench

    bridge = Path(ctx.bridge.path)
    return [bridge / "src" / "megatron", bridge / MEGATRON_LM / "megatron", Path(ctx.verl.path) / "verl"]


def _digest(ctx: RunContext, kind: str, request: Any) -> str | None:
    from env.preflight.pythonpath import ProbeError, located  # noqa: PLC0415 - pythonpath imports nothing from here

    try:
        sys_path = located(ctx).raw.get("sys_path", [])
    except ProbeError:
        return None
    source = Path(__file__).with_name("pythonpath.py" if kind == "imports" else "ray_probe.py")
    return key(ctx.python, ctx.pythonpath, sys_path, trees(ctx), [request, tree_stamp(source.parent)])


def peek(ctx: RunContext, kind: str, request: Any) -> bool:
    """A cached answer would serve this request (and --fresh-probe is off)."""
    if ctx.fresh_probe:
        return False
    digest = _digest(ctx, kind, request)
    return digest is not None and (Path(ctx.settings.log_dir) / CACHE_DIR / f"{kind}-{digest}.json").is_file()


def through(ctx: RunContext, kind: str, request: Any, run: Callable[[], tuple[Any, bool]]) -> Any:
    """`run()` -> (answer, complete), answered from the cache when its key matches (unless --fresh-probe); a
    complete answer is stored. The cache's time lands in ctx.facts.cached_from[kind]."""
    from env.preflight.pythonpath import ProbeError, located  # noqa: PLC0415 - pythonpath imports nothing from here

    try:
        sys_path = located(ctx).raw.get("sys_path", [])
    except ProbeError:
        answer, _ = run()
        return answer
    source = Path(__file__).with_name("pythonpath.py" if kind == "imports" else "ray_probe.py")
    digest = key(ctx.python, ctx.pythonpath, sys_path, trees(ctx), [request, tree_stamp(source.parent)])
    if not ctx.fresh_probe:
        hit = load(ctx.settings.log_dir, kind, digest)
        if hit is not None:
            ctx.facts.cached_from[kind] = hit[1]
            return hit[0]
    answer, complete = run()
    if complete:
        save(ctx.settings.log_dir, kind, digest, answer)
    return answer
