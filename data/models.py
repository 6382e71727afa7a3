"""`invoke download-model`: a Hugging Face snapshot to a scratch path (HF_HOME / HF_HUB_CACHE there too), so that a
small $HOME never fills up; prints the MODEL_PATH (or RM_MODEL_PATH) to export. Also what `--download` on a level
does when the model is absent (`check_download_model`, a preflight check right after `check_model`).

Idempotent: a dry-run listing first says what is missing; nothing missing → nothing downloaded. Errors are one line:
unknown repo or revision (exit 2), no space for what is missing, hub unreachable with nothing downloaded yet (exit 1).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from env.preflight.checks import BLOCKED, OK, SKIPPED, Check
from env.settings import Resolved

if TYPE_CHECKING:
    from env.preflight.checks import RunContext

REWARD_MODEL_ID = "Skywork/Skywork-Reward-V2-Llama-3.2-1B"  # the wrapper's default reward model
MARKER = ".verl_e2e_download.json"  # written after a complete snapshot
SPACE_MARGIN_BYTES = 512 * 2**20  # leave room for logs and temporary files


class DownloadError(Exception):
    """One-line, user-facing; `code` 2 = bad input (unknown repo/revision), 1 = environment."""

    def __init__(self, message: str, code: int = 1, category: str = "data"):
        super().__init__(message)
        self.code = code
        self.category = category


@dataclass
class DownloadPlan:
    repo_id: str
    revision: str | None
    local_dir: Path
    hf_home: Path
    hub_cache: Path


WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
WEIGHT_GLOBS = ("*.safetensors", "pytorch_model*.bin")


def checkpoint_problem(path: Path) -> str | None:
    """Why `path` is not a downloaded HF checkpoint (config.json and every weight file), None when it is.

    The one answer for `download-model`, the level preflight and `--download`: a folder with config.json but no
    weights (or with shards missing from its index) is an interrupted or partial download, not a model.
    """
    path = Path(path)
    if not (path / "config.json").is_file():
        return "no config.json"
    for index in WEIGHT_INDEXES:
        try:
            shards = sorted(set(json.loads((path / index).read_text())["weight_map"].values()))
        except FileNotFoundError:
            continue
        except (OSError, ValueError, KeyError, AttributeError, TypeError):
            return f"unreadable {index}: not downloaded completely"
        missing = [f for f in shards if not (path / f).is_file()]
        if missing:
            return f"{len(missing)} of {len(shards)} weight files named in {index} missing (e.g. {missing[0]})"
        return None
    if any(next(path.glob(pattern), None) for pattern in WEIGHT_GLOBS):
        return None
    return "config.json but no weights (*.safetensors, pytorch_model*.bin): not downloaded yet"


def scratch_root(settings: Resolved) -> Path:
    """--scratch / SCRATCH_DIR, else next to HF_HOME, else ~/models (the wrapper's default MODEL_PATH root)."""
    if settings.scratch:
        return Path(settings.scratch)
    if settings.hf_home:
        return Path(settings.hf_home).parent
    return Path.home() / "models"


def plan(repo_id: str, settings: Resolved, revision: str | None = None, local_dir: Path | None = None) -> DownloadPlan:
    scratch = scratch_root(settings)
    hf_home = Path(settings.hf_home) if settings.hf_home else scratch / ".hf_home"
    return DownloadPlan(repo_id, revision, Path(local_dir) if local_dir else scratch / repo_id, hf_home,
                        hf_home / "hub")


def _fmt(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def _existing_parent(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _read_marker(local_dir: Path) -> dict | None:
    try:
        return json.loads((local_dir / MARKER).read_text())
    except (OSError, ValueError):
        return None


def _carry_token() -> None:
    """A token saved by `hf auth login` lives under the old HF_HOME: keep using it after HF_HOME moves to scratch."""
    if os.environ.get("HF_TOKEN"):
        return
    home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    token_file = Path(os.environ.get("HF_TOKEN_PATH") or home / "token")
    try:
        token = token_file.read_text().strip()
    except OSError:
        return
    if token:
        os.environ["HF_TOKEN"] = token


def _translate(e: BaseException, p: DownloadPlan, endpoint: str) -> DownloadError:
    """huggingface_hub / network / disk errors → one line the user can act on."""
    from huggingface_hub.errors import (
        DryRunError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(e, (DryRunError, LocalEntryNotFoundError)) and e.__cause__ is not None:
        return _translate(e.__cause__, p, endpoint)  # the dry run wraps the real reason (404, no network, ...)
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if isinstance(e, GatedRepoError):
        return DownloadError(f"{p.repo_id} is gated on {endpoint}: accept its licence and set HF_TOKEN", 2)
    if isinstance(e, RepositoryNotFoundError):
        return DownloadError(f"unknown model repo {p.repo_id} on {endpoint} (or private: set HF_TOKEN)", 2)
    if isinstance(e, RevisionNotFoundError):
        return DownloadError(f"unknown revision {p.revision!r} of {p.repo_id} on {endpoint}", 2)
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
        return DownloadError(f"no space left under {p.local_dir} / {p.hub_cache} while downloading {p.repo_id}: "
                             f"use a larger scratch (--scratch DIR, or move HF_HOME / HF_HUB_CACHE / MODEL_PATH)",
                             1, "env-disk")
    offline = (OfflineModeIsEnabled, LocalEntryNotFoundError, DryRunError, ConnectionError, TimeoutError)
    if isinstance(e, offline) or type(e).__name__ in ("ConnectError", "ConnectTimeout", "ReadTimeout"):
        return DownloadError(f"cannot reach {endpoint} (offline? HF_HUB_OFFLINE / HF_ENDPOINT / proxy) and "
                             f"{p.repo_id} is not downloaded to {p.local_dir} yet: {first}")
    if isinstance(e, HfHubHTTPError):
        return DownloadError(f"{endpoint} refused {p.repo_id}: {first}")
    return DownloadError(f"download of {p.repo_id} failed: {type(e).__name__}: {first}")


def download(p: DownloadPlan, echo=print) -> Path:
    """Snapshot `p.repo_id` into `p.local_dir`; returns it. Downloads only what is missing or changed."""
    _carry_token()
    os.environ["HF_HOME"] = str(p.hf_home)  # xet/other caches follow it (when huggingface_hub is not loaded yet)
    os.environ["HF_HUB_CACHE"] = str(p.hub_cache)
    from huggingface_hub import constants, snapshot_download

    endpoint = constants.ENDPOINT
    kwargs = dict(repo_id=p.repo_id, revision=p.revision, local_dir=str(p.local_dir), cache_dir=str(p.hub_cache))
    try:
        infos = snapshot_download(**kwargs, dry_run=True)
    except TypeError:  # huggingface_hub without dry_run: no pre-check, the download itself decides
        infos = None
    except BaseException as e:
        marker = _read_marker(p.local_dir)
        err = _translate(e, p, endpoint)
        if err.code == 1 and marker and marker.get("repo_id") == p.repo_id and checkpoint_problem(p.local_dir) is None:
            echo(f"{endpoint} unreachable; keeping the complete earlier download of {p.repo_id} "
                 f"(commit {marker.get('commit')}) in {p.local_dir}")
            return p.local_dir
        raise err from None
    if infos is not None:
        missing = [i for i in infos if i.will_download]
        need = sum(i.file_size or 0 for i in missing)
        commit = infos[0].commit_hash if infos else None
        if not missing and (p.local_dir / MARKER).is_file():
            echo(f"{p.repo_id} already complete in {p.local_dir} (commit {commit}): nothing to download")
            return p.local_dir
        free = shutil.disk_usage(_existing_parent(p.local_dir)).free
        if need + SPACE_MARGIN_BYTES > free:
            raise DownloadError(f"no space for {p.repo_id}: {_fmt(need)} to download, {_fmt(free)} free under "
                                f"{_existing_parent(p.local_dir)}; use a larger scratch (--scratch DIR, or move "
                                f"HF_HOME / HF_HUB_CACHE / MODEL_PATH)", 1, "env-disk")
        echo(f"downloading {len(missing)} of {len(infos)} file(s) of {p.repo_id} ({_fmt(need)}) to {p.local_dir}")
    p.local_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    try:
        snapshot_download(**kwargs)
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt):
            raise
        raise _translate(e, p, endpoint) from None
    commit = infos[0].commit_hash if infos else None
    (p.local_dir / MARKER).write_text(json.dumps({
        "repo_id": p.repo_id, "revision": p.revision, "commit": commit, "endpoint": endpoint,
        "hf_home": str(p.hf_home), "finished": time.time(), "duration_s": round(time.monotonic() - started, 2)}))
    echo(f"downloaded {p.repo_id} to {p.local_dir} in {time.monotonic() - started:.1f}s")
    return p.local_dir


def download_command(settings: Resolved, model: str | None, reward_model: bool, revision: str | None,
                     local_dir: str | None, dry_run: bool) -> int:
    """Body of `invoke download-model`; the last stdout line is `MODEL_PATH=...` (or `RM_MODEL_PATH=...`)."""
    import re
    import sys

    from env.settings import UsageError

    repo_id = model or (REWARD_MODEL_ID if reward_model else settings.model_id)
    if not re.fullmatch(r"[\w.\-]+/[\w.\-]+", repo_id or ""):
        raise UsageError(f"--model must look like ORG/NAME, got {repo_id!r}")
    p = plan(repo_id, settings, revision, Path(local_dir).expanduser().absolute() if local_dir else None)
    var = "RM_MODEL_PATH" if reward_model else "MODEL_PATH"

    def say(msg: str) -> None:
        print(f"[download-model] {msg}", file=sys.stderr, flush=True)

    say(f"HF_HOME={p.hf_home} HF_HUB_CACHE={p.hub_cache}")
    if dry_run:
        say(f"dry-run: would snapshot {repo_id}{f'@{revision}' if revision else ''} into {p.local_dir}")
        print(f"{var}={p.local_dir}")
        return 0
    try:
        path = download(p, say)
    except DownloadError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.code
    print(f"{var}={path}")
    return 0


def check_download_model(ctx: RunContext) -> Iterable[Check]:
    """`--download` on a level: fetch the model into MODEL_PATH when it is absent (after `check_model`)."""
    path = ctx.model_path
    if not ctx.download or path is None or checkpoint_problem(path) is None:
        return
    if not ctx.probe or ctx.dry_run:
        yield Check("model download", SKIPPED, f"dry-run: would download {ctx.settings.model_id} to {path}")
        return
    p = plan(ctx.settings.model_id, ctx.settings, None, path)
    try:
        download(p, echo=lambda msg: print(f"[download-model] {msg}", flush=True))
    except DownloadError as e:
        yield Check("model download", BLOCKED, str(e), f"invoke download-model --model {ctx.settings.model_id} "
                    "--scratch DIR, then set MODEL_PATH", e.category)
        return
    ctx.notes.append(f"model {ctx.settings.model_id} downloaded to {path} (--download)")
    yield Check("model download", OK, f"{ctx.settings.model_id} → {path}")
