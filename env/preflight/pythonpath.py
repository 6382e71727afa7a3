"""PYTHONPATH composition and the driver-side import probe (SPEC preflight 2 and 4, Apex in 6).

One probe process, in the Python that will run verl with the run's PYTHONPATH, answers every import question as
one JSON object: where `megatron.bridge`, `megatron.core` and `verl` come from; which packages are present
(`importlib.util.find_spec`: no module code runs); and, in its heavy form, whether the modules verl's model build
and LoRA save import from Bridge really import — with the missing module's name and the files of the failing
import chain, so a dependency of a dependency (modelopt -> pulp) is named as such.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from env.preflight.checks import ImportProbe
from env.preflight.ray_function import RAY_FUNCTION
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
def quiet(mod):
    # find_spec without importing parent packages (vllm's __init__ is heavy and prints): walk the search path
    import importlib.machinery
    parts = mod.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])
        for i in range(1, len(parts)):
            if spec is None or not spec.submodule_search_locations:
                return None
            spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: i + 1]),
                                                            list(spec.submodule_search_locations))
    except BaseException:
        return None
    if spec is None:
        return None
    return spec.origin if spec.origin not in (None, "namespace") else list(spec.submodule_search_locations)[0]
def extensions(pkg):
    # the compiled extension modules at the top of a package (names only; nothing imported)
    import importlib.machinery, os
    try:
        spec = importlib.util.find_spec(pkg)
    except BaseException:
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    found = set()
    for folder in spec.submodule_search_locations:
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            for suffix in importlib.machinery.EXTENSION_SUFFIXES:
                if name.endswith(suffix):
                    found.add(name[: -len(suffix)])
    return sorted(found)
def run_imports():
    for mod in ("megatron.bridge", "megatron.core", "verl"):
        out[mod] = origin(mod, heavy)
    out["present"] = {m: quiet(m) for m in req.get("present", [])}
    out["extensions"] = {p: extensions(p) for p in req.get("extensions", [])}
    out["imports"] = {m: origin(m, True) for m in req.get("imports", [])}
ray_req = req.get("ray")
if ray_req is None:
    run_imports()
else:
    # one process for the heavy phase: the imports run in a thread while this thread starts Ray and asks a worker;
    # the cluster's daemons inherit the driver PYTHONPATH without the checkouts (the workers get them from
    # runtime_env alone, as in the real run), while this process's own sys.path keeps them for the imports
    import os, threading, time
    os.environ["PYTHONPATH"] = ray_req["driver_pythonpath"]
    began = time.monotonic()
    thread = threading.Thread(target=run_imports, daemon=True)
    thread.start()
    namespace = {}
    exec(ray_req["function"], namespace)
    out["ray"] = namespace["ray_answer"](ray_req["address"], ray_req["pythonpath"])
    out["ray_s"] = round(time.monotonic() - began, 3)
    thread.join()
    out["imports_s"] = round(time.monotonic() - began, 3)
print(json.dumps(out))
"""

# Packages whose presence preflight asks about (find_spec only).
FLASH_ATTN_MODULES = ("flash_attn", "flash_attn_interface", "flash_attn_3")  # FA2, FA3 (TE uses either)
APEX_FUSED = "fused_weight_gradient_mlp_cuda"
PRESENCE = ("modelopt", "ray", "pulp", "megatron.energon", "vllm", APEX_FUSED, *FLASH_ATTN_MODULES)
EXTENSIONS = ("vllm",)  # packages whose compiled extensions preflight lists (vLLM's MoE kernels)

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
    return sorted({site.module for site in import_sites(files, prefix)})


# -- where an import happens: module level, or inside which function (and under which `if`) ----------------------

# The paths a run may or may not take. "model" is every run's (model build, LoRA, rollout, weight sync); the others
# only runs that ask for them: "checkpoint" (save/load: SAVE_FREQ != -1, RESUME_MODE != disable) and "qat"
# (ModelOpt quantization-aware training / quantized export: Level 4 --feature qat|quantized).
MODEL_PATH, CHECKPOINT_PATH, QAT_PATH = "model", "checkpoint", "qat"
_CHECKPOINT_WORDS = re.compile(r"(^|_)(save|load|checkpoint|ckpt|resume|restore)", re.I)
_QAT_WORDS = re.compile(r"qat|modelopt|quantiz", re.I)


@dataclass(frozen=True)
class ImportSite:
    """One `import`/`from ... import` of a module, as written in a file."""

    module: str
    file: str  # path relative to the scanned root when known
    line: int
    scope: str  # "module" or the enclosing Class.function
    guard: str = ""  # the source of the enclosing `if` tests, innermost last ("" when none)

    @property
    def path(self) -> str:
        """Which run path executes this import (see MODEL_PATH ...). Module level is every run's."""
        if self.scope == "module":
            return QAT_PATH if _QAT_WORDS.search(Path(self.file).name) else MODEL_PATH
        if _QAT_WORDS.search(self.guard) or _QAT_WORDS.search(self.scope) or "/modelopt/" in f"/{self.file}":
            return QAT_PATH
        if "/checkpoint/" in f"/{self.file}" or any(_CHECKPOINT_WORDS.search(part)
                                                   for part in self.scope.split(".")):
            return CHECKPOINT_PATH
        return MODEL_PATH

    def where(self) -> str:
        at = "at module level" if self.scope == "module" else f"in {self.scope}()"
        return f"{self.file}:{self.line} {at}" + (f" under `if {self.guard}`" if self.guard else "")

    def to_json(self) -> dict:
        return {"module": self.module, "file": self.file, "line": self.line, "scope": self.scope,
                "guard": self.guard, "path": self.path}


class _SiteVisitor(ast.NodeVisitor):
    def __init__(self, prefix: str, rel: str):
        self.prefix, self.rel = prefix, rel
        self.stack: list[tuple[str, str]] = []  # (class|def, name)
        self.guards: list[str] = []
        self.sites: list[ImportSite] = []

    def _wanted(self, name: str | None) -> bool:
        return bool(name) and (name == self.prefix or name.startswith(self.prefix + "."))  # type: ignore[union-attr]

    def _add(self, module: str, node: ast.AST) -> None:
        if any("TYPE_CHECKING" in g and not g.startswith("not (") for g in self.guards):
            return  # never runs
        in_function = any(kind == "def" for kind, _ in self.stack)
        scope = ".".join(name for _, name in self.stack) if in_function else "module"
        self.sites.append(ImportSite(module, self.rel, getattr(node, "lineno", 0), scope, " and ".join(self.guards)))

    def _scoped(self, kind: str, node: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.stack.append((kind, node.name))
        self.generic_visit(node)
        self.stack.pop()

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._scoped("class", node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._scoped("def", node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._scoped("def", node)

    def visit_If(self, node: ast.If) -> None:
        try:
            test = ast.unparse(node.test)
        except Exception:  # noqa: BLE001 - a guard we cannot print is no guard
            test = ""
        self.visit(node.test)
        for branch, guard in ((node.body, test), (node.orelse, f"not ({test})")):
            self.guards.append(guard)
            for child in branch:
                self.visit(child)
            self.guards.pop()

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if self._wanted(alias.name):
                self._add(alias.name, node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level == 0 and self._wanted(node.module):
            self._add(node.module, node)  # type: ignore[arg-type]


def import_sites(files: list[Path], prefix: str, root: Path | None = None) -> list[ImportSite]:
    """Every import of a `prefix...` module in these files, with where it happens (module level or inside which
    function, under which `if`). A file that does not parse falls back to the line pattern (scope unknown: treated
    as module level, the path every run takes)."""
    pattern = re.compile(_IMPORT_RE.format(p=re.escape(prefix)), re.MULTILINE)
    sites: list[ImportSite] = []
    for path in files:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        if prefix not in text:
            continue
        try:
            rel = str(path.relative_to(root)) if root else str(path)
        except ValueError:
            rel = str(path)
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            for m in pattern.finditer(text):
                sites.append(ImportSite(m.group(1) or m.group(2), rel, text.count("\n", 0, m.start()) + 1, "module"))
            continue
        visitor = _SiteVisitor(prefix, rel)
        visitor.visit(tree)
        sites += visitor.sites
    return sites


def verl_bridge_sites(verl_repo: Path) -> list[ImportSite]:
    """Where this verl checkout imports Bridge modules (read from its package source, so the list follows the verl
    version under test)."""
    root = Path(verl_repo)
    return import_sites(sorted((root / "verl").rglob("*.py")), "megatron.bridge", root)


def module_paths(sites: list[ImportSite]) -> dict[str, set[str]]:
    """module -> the run paths that import it (one import on the model path puts it on every run's path)."""
    out: dict[str, set[str]] = {}
    for site in sites:
        out.setdefault(site.module, set()).add(site.path)
    return out


def verl_bridge_imports(verl_repo: Path) -> list[str]:
    """The Bridge modules this verl checkout imports (model build, LoRA, checkpoint save/load), sorted."""
    return sorted({s.module for s in verl_bridge_sites(verl_repo)})


def bridge_modelopt_imports(bridge_repo: Path) -> list[str]:
    """The modelopt modules Bridge's checkpointing imports (verl's LoRA save path imports that file)."""
    path = Path(bridge_repo) / "src" / "megatron" / "bridge" / "training" / "checkpointing.py"
    return imported_modules([path], "modelopt")


class ProbeError(Exception):
    pass


# Probe processes in flight: a level that starts verl alongside them stops them when it is interrupted (else the
# tool's exit would wait for a 30-40 s import, and SIGKILL would leave the Ray probe's cluster behind).
RUNNING: set[subprocess.Popen] = set()


def run_probe(argv: list[str], env: dict[str, str], cwd: Path | None, timeout: float) -> subprocess.CompletedProcess:
    """subprocess.run(capture_output=True, text=True) for a probe, registered in RUNNING while it runs."""
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    RUNNING.add(proc)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        proc.kill()
        proc.communicate()
        raise
    finally:
        RUNNING.discard(proc)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def stop_running_probes(grace_s: float = 10.0) -> None:
    """SIGTERM every probe in flight (Ray's driver shuts its local cluster down on SIGTERM), SIGKILL after grace."""
    procs = list(RUNNING)
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()


def probe_imports(python: str, pythonpath: str, cwd: Path | None = None, timeout: float = 300,
                  imports: list[str] | tuple[str, ...] = (), heavy: bool = True,
                  environ: dict[str, str] | None = None, ray: dict | None = None) -> ImportProbe:
    """One probe process: origins of Bridge/core/verl (heavy: also imported), presence of PRESENCE, and the given
    imports. ray={"address", "pythonpath", "driver_pythonpath"}: the Ray worker probe runs in the same process, at
    the same time (raw["ray"] holds its answer)."""
    env = dict(os.environ if environ is None else environ, PYTHONPATH=pythonpath)
    request_data: dict = {"heavy": heavy, "present": list(PRESENCE), "imports": list(imports),
                          "extensions": list(EXTENSIONS)}
    if ray is not None:
        request_data["ray"] = {**ray, "function": RAY_FUNCTION}
        env.pop("RAY_ADDRESS", None)
        env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    request = json.dumps(request_data)
    try:
        proc = run_probe([python, "-c", _PROBE, request], env=env, cwd=cwd, timeout=timeout)
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
    return ctx.facts.get("locate", lambda: _locate(ctx))


def start_locating(ctx: RunContext) -> None:
    """Start the cheap probe in the background. The fact runs the probe itself: a fact that called located()
    would wait on its own future (seen as a pytest process that never exited)."""
    ctx.facts.start("locate", lambda: _locate(ctx))


def _locate(ctx: RunContext) -> ImportProbe:
    return probe_imports(ctx.python, ctx.pythonpath, cwd=Path(ctx.verl.path), heavy=False, environ=ctx.environ)


def is_under(path: str | None, root: Path) -> bool:
    if not path:
        return False
    try:
        Path(path).resolve().relative_to(Path(root).resolve())
        return True
    except ValueError:
        return False
