"""`invoke install-modelopt`: nvidia-modelopt in the Python that runs verl (verl's checkpoint paths need it).

`pip show nvidia-modelopt` first; when absent, `pip install nvidia-modelopt --extra-index-url <index>` (NVIDIA's
index by default, MODELOPT_INDEX_URL to change it), with its dependencies. When present but installed without them
(the real H200 image: `No module named 'pulp'` at the first LoRA save), only the missing ones are installed: those
`pip check` names as not installed, then any module the LoRA save path's modelopt import still misses — never a
reinstall that could move torch. What happened is written as a container-setup record under
$LOG_DIR/container_setup/ — evidence about the environment, never a change to either checkout — and a level's
preflight quotes the newest record for its Python (`check_container_setup`).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from env.preflight.checks import OK, Check
from env.preflight.pythonpath import bridge_modelopt_imports, package_of
from env.settings import Resolved

if TYPE_CHECKING:
    from env.preflight.checks import RunContext

PACKAGE = "nvidia-modelopt"
SAVE_PATH_DEFAULT = ["modelopt.torch.opt.plugins"]  # what Bridge's training/checkpointing.py imports (r0.6, main)
# the image's stack (and modelopt itself): missing from the save path's chain, they are not ours to install
NEVER_INSTALLED = {"modelopt", "torch", "triton", "transformer_engine", "megatron", "vllm", "flash_attn", "apex",
                   "tensorrt", "tensorrt_llm", "transformers"}
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


def install_argv(python: str, index_url: str, packages: list[str] | None = None) -> list[str]:
    return [python, "-m", "pip", "install", "--extra-index-url", index_url, *(packages or [PACKAGE])]


def undeclared_missing(python: str) -> list[str]:
    """Dependencies nvidia-modelopt declares that are not installed (`pip check`: "... requires X, which is not
    installed.")."""
    proc = subprocess.run([python, "-m", "pip", "check"], capture_output=True, text=True, timeout=300)
    found = re.findall(rf"^{re.escape(PACKAGE)} \S+ requires (\S+), which is not installed", proc.stdout,
                       re.MULTILINE | re.IGNORECASE)
    return sorted(set(found))


def save_path_missing(python: str, modules: list[str], pythonpath: str | None = None) -> str | None:
    """The module an import of `modules` misses (ModuleNotFoundError.name), None when they import."""
    code = ("import importlib, sys\nfor m in sys.argv[1:]:\n    try:\n        importlib.import_module(m)\n"
            "    except ModuleNotFoundError as e:\n        print(e.name); break\n    except BaseException:\n"
            "        pass\n")
    env = dict(os.environ) if pythonpath is None else dict(os.environ, PYTHONPATH=pythonpath)
    proc = subprocess.run([python, "-c", code, *modules], capture_output=True, text=True, timeout=600, env=env)
    name = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    return name or None


def _pip_install(argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True)
    sys.stderr.write(proc.stdout[-4000:])
    if proc.returncode != 0:
        lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
        err = next((ln for ln in reversed(lines) if ln.startswith("ERROR")), lines[-1] if lines else "no output")
        raise RuntimeError(f"{shlex.join(argv[3:])} failed (exit {proc.returncode}): {err}")


def write_setup_record(log_dir: Path, record: dict) -> Path:
    folder = setup_dir(log_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-modelopt-{time.time_ns() % 10**6}.json"
    path.write_text(json.dumps(record, indent=2))
    return path


def ensure_modelopt(python: str, index_url: str, log_dir: Path, echo=print,
                    save_path: list[str] | None = None, pythonpath: str | None = None) -> tuple[dict, Path]:
    """Show, install or repair; returns (record, record path). Raises RuntimeError with pip's last error line.

    save_path: the modelopt modules the LoRA save path imports (Bridge's checkpointing), checked after pip."""
    started = time.time()
    version = pip_show(python)
    fresh = version is None
    record = {"package": PACKAGE, "python": python, "index_url": index_url, "started": started}
    commands: list[str] = []
    if version is None:
        argv = install_argv(python, index_url)
        echo(f"{PACKAGE} missing in {python}: {shlex.join(argv)}")
        _pip_install(argv)
        commands.append(shlex.join(argv))
        version = pip_show(python)
        if version is None:
            raise RuntimeError(f"pip reported success but `pip show {PACKAGE}` still finds nothing in {python}")
        echo(f"installed {PACKAGE} {version} into {python}")
    installed: list[str] = []
    missing = undeclared_missing(python)
    for _ in range(8):  # each install may uncover the next module the import chain needs
        if not missing:
            module = save_path_missing(python, save_path or SAVE_PATH_DEFAULT, pythonpath)
            if module is None or module.split(".")[0] in NEVER_INSTALLED:
                break  # imports, or the stack itself / modelopt is incomplete: not a dependency to add here
            missing = [package_of(module)]
        if set(missing) <= set(installed):
            raise RuntimeError(f"{', '.join(missing)} still missing after installing it into {python}")
        argv = install_argv(python, index_url, missing)
        echo(f"{PACKAGE} {version} is installed without its dependencies {', '.join(missing)}: {shlex.join(argv)}")
        _pip_install(argv)
        commands.append(shlex.join(argv))
        installed += missing
        missing = undeclared_missing(python)
    if not commands:
        record.update(action="present", version=version, command=shlex.join([python, "-m", "pip", "show", PACKAGE]))
        echo(f"{PACKAGE} {version} already installed in {python} with its dependencies: nothing to do")
    else:
        record.update(action="installed" if fresh else "repaired", version=version, command=" && ".join(commands),
                      dependencies_installed=installed)
        if installed:
            echo(f"installed {', '.join(installed)} into {python}: {PACKAGE} {version} is complete")
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
        save_path = bridge_modelopt_imports(Path(settings.bridge_repo)) if settings.bridge_repo else None
        _, path = ensure_modelopt(python, index_url, Path(settings.log_dir), say, save_path=save_path or None)
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
    record = latest_setup(Path(ctx.settings.log_dir), ctx.python)
    if record is None:
        return
    ctx.evidence["container_setup"] = [record]
    what = "installed" if record.get("action") == "installed" else "found"
    ctx.notes.append(f"container setup: {PACKAGE} {record.get('version')} {what} in {record['python']} "
                     f"(index {record.get('index_url')}; record {record['path']}) — environment, not a repo change")
    yield Check("container setup", OK, f"{PACKAGE} {record.get('version')} {what} by install-modelopt "
                f"({record['path']})")
