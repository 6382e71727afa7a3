"""Body of `nox -s verl -- <invoke task> [args]`: the verl container environment.

The session has no venv of its own (`venv_backend="none"`): verl runs in the image's own Python (VERL_PYTHON, else
`python3` on PATH), whose torch / vLLM / Transformer-Engine stack is never reinstalled. PYTHONPATH is the
procedure's (Bridge src, Bridge 3rdparty/Megatron-LM, verl). nvidia-modelopt is installed only when that Python
does not have it (one installed without its dependencies is the level preflight's to find). The task then runs with
VERL_E2E_IMAGE_PYTHON=1, which preflight reads as "use the installed Python" (VERL_USE_UV=0, said in the report).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from env.preflight.modelopt import ensure_modelopt
from env.preflight.pythonpath import ProbeError, bridge_modelopt_imports, compose, probe_imports
from env.settings import PROJECT_ROOT, UsageError, resolve

PROJECT = PROJECT_ROOT
USAGE = "usage: nox -s verl -- <invoke task> [args], e.g. nox -s verl -- level0 --model Qwen/Qwen2.5-0.5B"
RESULT_NAMES = {0: "Pass", 1: "Fail", 2: "bad invocation", 3: "Blocked"}


def _say(msg: str) -> None:
    print(f"[nox verl] {msg}", flush=True)


def image_python(settings: Any) -> str:
    """VERL_PYTHON, else the image's python3 on PATH, else the interpreter running nox."""
    if settings.python:
        return str(settings.python)
    return shutil.which("python3") or sys.executable


def run_in_image(task_args: list[str], environ: dict[str, str], echo=_say) -> int:
    """Prepare the image's Python and run `invoke <task_args>` in it; returns the task's exit code.

    Raises UsageError for what the user must fix first (no task given, repos unset, verl not importable).
    """
    if not task_args or task_args[0].startswith("-"):
        raise UsageError(USAGE)
    settings = resolve({}, environ)
    if settings.bridge_repo is None or settings.verl_repo is None:
        raise UsageError("BRIDGE_REPO and VERL_REPO must be set: they make the PYTHONPATH of the verl environment")
    python = image_python(settings)
    pythonpath = compose(Path(settings.bridge_repo), Path(settings.verl_repo), environ.get("PYTHONPATH"))
    try:  # verl alone is imported here; the level's preflight imports the rest (Bridge, what the build needs)
        probe = probe_imports(python, pythonpath, cwd=Path(settings.verl_repo), heavy=False, imports=["verl"])
    except ProbeError as e:
        raise UsageError(f"{e} (run `nox -s verl` inside the verl image, or set VERL_PYTHON)") from None
    verl_error = probe.error_of("verl") or probe.import_result("verl").get("error")
    if verl_error:
        raise UsageError(f"{python} cannot import verl with PYTHONPATH={pythonpath}: {verl_error} — run `nox -s "
                         f"verl` inside the verl image (or set VERL_PYTHON to the image's Python)")
    echo(f"Python {python} ({probe.raw.get('version')}); verl from {probe.file_of('verl')}")
    echo(f"PYTHONPATH={pythonpath}")

    if probe.present("modelopt"):  # installed without its dependencies: preflight says so (install-modelopt fixes)
        echo("modelopt importable: nothing installed")
    else:
        try:
            _, record = ensure_modelopt(python, settings.modelopt_index_url, Path(settings.log_dir), echo,
                                        save_path=bridge_modelopt_imports(Path(settings.bridge_repo)) or None,
                                        pythonpath=pythonpath)
        except RuntimeError as e:
            raise UsageError(f"nvidia-modelopt is missing or incomplete and could not be installed: {e}") from None
        echo(f"container-setup record: {record}")

    env = dict(environ, PYTHONPATH=pythonpath, VERL_PYTHON=python, VERL_E2E_IMAGE_PYTHON="1")
    argv = [sys.executable, "-m", "invoke", *task_args]
    echo(f"running: invoke {shlex.join(task_args)}")
    return subprocess.run(argv, cwd=PROJECT, env=env).returncode


def nox_session(session: Any) -> None:
    try:
        code = run_in_image(list(session.posargs), dict(os.environ))
    except UsageError as e:
        session.error(f"error: {e}")
        return
    if code != 0:
        session.error(f"invoke {session.posargs[0]} exited {code} ({RESULT_NAMES.get(code, 'error')})")
