"""PYTHONPATH composition and the driver-side import probe (SPEC preflight 2 and 4, Apex in 6).

The probe runs in the Python that will run verl, with the run's PYTHONPATH, and reports where `megatron.bridge`,
`megatron.core` and `verl` come from, whether modelopt imports and whether Apex's fused kernel is there.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from env.repos import MEGATRON_LM

# Runs in the target Python; prints one JSON object. Import failures are data, not crashes.
_PROBE = r"""
import importlib, importlib.util, json, sys
out = {"python": sys.executable, "version": sys.version.split()[0]}
def origin(mod):
    # where it would load from (find_spec runs no module code), then whether importing it works
    res = {}
    try:
        spec = importlib.util.find_spec(mod)
        if spec is not None:
            res["file"] = spec.origin if spec.origin not in (None, "namespace") else list(spec.submodule_search_locations)[0]
    except BaseException as e:
        res["error"] = f"{type(e).__name__}: {e}".splitlines()[0]
        return res
    if "file" not in res:
        res["error"] = f"ModuleNotFoundError: No module named '{mod}'"
        return res
    try:
        importlib.import_module(mod)
    except BaseException as e:
        res["error"] = f"{type(e).__name__}: {e}".splitlines()[0]
    return res
out["megatron.bridge"] = origin("megatron.bridge")
out["megatron.core"] = origin("megatron.core")
out["verl"] = origin("verl")
out["modelopt"] = importlib.util.find_spec("modelopt") is not None
try:
    out["apex_fused"] = importlib.util.find_spec("fused_weight_gradient_mlp_cuda") is not None
except BaseException:
    out["apex_fused"] = False
print(json.dumps(out))
"""


def compose(bridge_repo: Path, verl_repo: Path, old: str | None = None) -> str:
    """$BRIDGE_REPO/src:$BRIDGE_REPO/3rdparty/Megatron-LM:$VERL_REPO[:old] (the procedure's order)."""
    parts = [str(Path(bridge_repo) / "src"), str(Path(bridge_repo) / MEGATRON_LM), str(verl_repo)]
    if old:
        parts += [p for p in old.split(os.pathsep) if p and p not in parts]
    return os.pathsep.join(parts)


@dataclass
class ImportProbe:
    python: str
    raw: dict

    def file_of(self, module: str) -> str | None:
        return self.raw.get(module, {}).get("file")

    def error_of(self, module: str) -> str | None:
        return self.raw.get(module, {}).get("error")


class ProbeError(Exception):
    pass


def probe_imports(python: str, pythonpath: str, cwd: Path | None = None, timeout: float = 120) -> ImportProbe:
    env = dict(os.environ, PYTHONPATH=pythonpath)
    try:
        proc = subprocess.run(
            [python, "-c", _PROBE], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
        )
    except FileNotFoundError:
        raise ProbeError(f"Python {python!r} not found") from None
    except subprocess.TimeoutExpired:
        raise ProbeError(f"import probe in {python} did not finish in {timeout:.0f}s") from None
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ProbeError(f"import probe in {python} failed: {tail}")
    return ImportProbe(python, json.loads(lines[-1]))


def is_under(path: str | None, root: Path) -> bool:
    if not path:
        return False
    try:
        Path(path).resolve().relative_to(Path(root).resolve())
        return True
    except ValueError:
        return False
