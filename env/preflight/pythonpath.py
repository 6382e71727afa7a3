"""PYTHONPATH composition and the driver-side import probe (SPEC preflight 2 and 4, Apex in 6).

One probe process, in the Python that will run verl with the run's PYTHONPATH, answers every import question as
one JSON object: where `megatron.bridge`, `megatron.core` and `verl` come from; which packages are present
(`importlib.util.find_spec`: no module code runs); and, in its heavy form, whether the modules verl's model build
and LoRA save import from Bridge really import — with the missing module's name and the files of the failing
import chain, so a dependency of a dependency (modelopt -> pulp) is named as such.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from env.preflight.checks import ImportProbe
from env.repos import MEGATRON_LM

if TYPE_CHECKING:
    from env.preflight.checks import RunContext

# Runs in the target Python; argv[1] is a JSON request; prints one JSON object. Import failures are data.
_PROBE = r"""
import importlib, importlib.util, json, sys, traceback
req = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
heavy = req.get("heavy", True)
out = {"python": sys.executable, "version": sys.version.split()[0], "sys_path": [p for p in sys.path if p]}
def failure(e):
    info = {"error": f"{type(e).__name__}: {e}".splitlines()[0]}
    if isinstance(e, ModuleNotFoundError) and e.name:
        info["missing"] = e.name
    info["via"] = [f.filename for f in traceback.extract_tb(e.__traceback__)][-40:]
    return info
def locate(mod):
    # where it would load from; find_spec runs no module code (only the parent packages of a dotted name)
    try:
        spec = importlib.util.find_spec(mod)
    except BaseException as e:
        return failure(e)
    if spec is None:
        return {"error": f"ModuleNotFoundError: No module named '{mod}'", "missing": mod}
    if spec.origin not in (None, "namespace"):
        return {"file": spec.origin}
    return {"file": list(spec.submodule_search_locations)[0]}
def origin(mod, do_import):
    res = locate(mod)
    if "file" in res and do_import:
        try:
            importlib.import_module(mod)
        except BaseException as e:
            res.update(failure(e))
    return res
for mod in ("megatron.bridge", "megatron.core", "verl"):
    out[mod] = origin(mod, heavy)
out["present"] = {m: locate(m).get("file") for m in req.get("present", [])}
out["imports"] = {m: origin(m, True) for m in req.get("imports", [])}
print(json.dumps(out))
"""

# Packages whose presence preflight asks about (find_spec only).
FLASH_ATTN_MODULES = ("flash_attn", "flash_attn_interface", "flash_attn_3")  # FA2, FA3 (TE uses either)
APEX_FUSED = "fused_weight_gradient_mlp_cuda"
PRESENCE = ("modelopt", "ray", APEX_FUSED, *FLASH_ATTN_MODULES)

# Import name -> the package that provides it, where the two differ (what `pip install` needs).
PACKAGE_OF = {
    "megatron.energon": "megatron-energon",
    "modelopt": "nvidia-modelopt",
    "flash_attn": "flash-attn",
    "transformer_engine": "transformer-engine[pytorch]",
    "pulp": "pulp",
    "yaml": "pyyaml",
    "google.protobuf": "protobuf",
}


def package_of(module: str) -> str:
    """The pip package for an import name: the table's, else the top-level name (`foo.bar` -> `foo`)."""
    for name in (module, module.rsplit(".", 1)[0] if "." in module else module):
        if name in PACKAGE_OF:
            return PACKAGE_OF[name]
    return module.split(".")[0].replace("_", "-")


def compose(bridge_repo: Path, verl_repo: Path, old: str | None = None) -> str:
    """$BRIDGE_REPO/src:$BRIDGE_REPO/3rdparty/Megatron-LM:$VERL_REPO[:old] (the procedure's order)."""
    parts = run_entries(bridge_repo, verl_repo)
    if old:
        parts += [p for p in old.split(os.pathsep) if p and p not in parts]
    return os.pathsep.join(parts)


def megatron_lm_empty(bridge_repo: Path) -> bool:
    """Bridge's 3rdparty/Megatron-LM has no megatron/core: the submodule is not initialised."""
    return not (Path(bridge_repo) / MEGATRON_LM / "megatron" / "core").is_dir()


def submodule_fix(bridge_repo: Path) -> str:
    return (f"git -C {bridge_repo} submodule update --init {MEGATRON_LM} (installing megatron-core instead gives the "
            "site-packages skew the procedure warns about)")


def run_entries(bridge_repo: Path, verl_repo: Path) -> list[str]:
    """The run's own PYTHONPATH entries (what compose() puts first): the checkouts under test."""
    return [str(Path(bridge_repo) / "src"), str(Path(bridge_repo) / MEGATRON_LM), str(verl_repo)]


_IMPORT_RE = r"^\s*(?:from\s+({p}[\w.]*)\s+import|import\s+({p}[\w.]*))"


def imported_modules(files: list[Path], prefix: str) -> list[str]:
    """Modules named `prefix...` that these files import (any depth, also inside functions), sorted."""
    pattern = re.compile(_IMPORT_RE.format(p=re.escape(prefix)), re.MULTILINE)
    found: set[str] = set()
    for path in files:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        if prefix not in text:
            continue
        found.update(a or b for a, b in pattern.findall(text))
    return sorted(found)


def verl_bridge_imports(verl_repo: Path) -> list[str]:
    """The Bridge modules this verl checkout imports (model build, LoRA, checkpoint save/load): read from its
    package source, so the list follows the verl version under test."""
    package = Path(verl_repo) / "verl"
    return imported_modules(sorted(package.rglob("*.py")), "megatron.bridge")


def bridge_modelopt_imports(bridge_repo: Path) -> list[str]:
    """The modelopt modules Bridge's checkpointing imports (verl's LoRA save path imports that file)."""
    path = Path(bridge_repo) / "src" / "megatron" / "bridge" / "training" / "checkpointing.py"
    return imported_modules([path], "modelopt")



class ProbeError(Exception):
    pass


def probe_imports(python: str, pythonpath: str, cwd: Path | None = None, timeout: float = 300,
                  imports: list[str] | tuple[str, ...] = (), heavy: bool = True,
                  environ: dict[str, str] | None = None) -> ImportProbe:
    """One probe process: origins of Bridge/core/verl (heavy: also imported), presence of PRESENCE, and the given
    imports."""
    env = dict(os.environ if environ is None else environ, PYTHONPATH=pythonpath)
    request = json.dumps({"heavy": heavy, "present": list(PRESENCE), "imports": list(imports)})
    try:
        proc = subprocess.run(
            [python, "-c", _PROBE, request], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
        )
    except FileNotFoundError:
        raise ProbeError(f"Python {python!r} not found") from None
    except subprocess.TimeoutExpired:
        raise ProbeError(f"import probe in {python} did not finish in {timeout:.0f}s") from None
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ProbeError(f"import probe in {python} failed: {tail}")
    raw = json.loads(lines[-1])
    # the names older callers read
    raw["modelopt"] = bool(raw["present"].get("modelopt"))
    raw["apex_fused"] = bool(raw["present"].get(APEX_FUSED))
    return ImportProbe(python, raw)


def located(ctx: RunContext) -> ImportProbe:
    """The cheap probe of a run (find_spec only), once per run: where Bridge/core/verl load from, what is present."""
    return ctx.facts.get("locate", lambda: probe_imports(ctx.python, ctx.pythonpath, cwd=Path(ctx.verl.path),
                                                         heavy=False, environ=ctx.environ))


def is_under(path: str | None, root: Path) -> bool:
    if not path:
        return False
    try:
        Path(path).resolve().relative_to(Path(root).resolve())
        return True
    except ValueError:
        return False
