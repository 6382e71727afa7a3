"""verl's surface of Megatron-Bridge, read from a verl checkout with `ast`: the `megatron.bridge` names verl imports
(where, and whether the import is lazy inside a function) and the attribute names verl's code uses (the methods it
may call on the Bridge objects it builds: `bridge.export_hf_weights(...)`, `provider.finalize()`).

Only what verl's RL job runs counts: not its tests, nor its standalone command-line scripts, nor any module the job
(`python3 -m verl.trainer.main_ppo`) never loads (RL_JOB). Nothing is imported or run.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

BRIDGE_PACKAGE = "megatron.bridge"
# verl's branches for its deprecated legacy mbridge backend (`if self.vanilla_bridge:`, `if provider is None:`):
# the procedure always runs VANILLA_MBRIDGE=False, so what verl calls there never reaches Megatron-Bridge.
VANILLA_WORDS = ("vanilla",)
NO_PROVIDER = "provider"
SKIPPED_DIRS = {"tests", "test", "docs", ".git", "__pycache__", "build", "dist", ".venv", "venv"}
# top-level folders of standalone command-line tools (a checkpoint merger, a converter) that users run by hand:
# verl's RL job (the procedure's run_ppo_trainer_megatron.sh → verl.trainer) never runs them
OFFLINE_TOOLS = {"scripts"}
# The RL job the wrapper starts (`python3 -m verl.trainer.main_ppo`): only the verl modules it can load count — its
# imports followed (lazy ones inside functions too) and the modules named by dotted strings in its code and configs
# (Hydra `_target_`s, worker classes). What it never loads is another program: the model merger, the SFT and eval
# trainers, experimental trainers. A checkout without this module (an old layout): every file counts.
RL_JOB = "verl.trainer.main_ppo"
DOTTED_VERL = re.compile(r"\bverl(?:\.\w+)+")


@dataclass(frozen=True)
class SurfaceName:
    """One `megatron.bridge` name verl imports: `module` (dotted) and `name` (None for `import module`)."""

    module: str
    name: str | None
    file: str  # verl-relative path
    line: int

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def dotted(self) -> str:
        return f"{self.module}.{self.name}" if self.name else self.module


NOT_CONSTANT = object()  # an argument verl computes (its value is not in the code)


@dataclass(frozen=True)
class CallSite:
    """One verl call by name (`bridge.to_megatron_provider(load_weights=False)`): the literal value of each argument,
    NOT_CONSTANT where verl computes it; `spread` when it passes `*args` / `**kwargs` (any parameter may be bound)."""

    where: str
    args: tuple
    kwargs: tuple[tuple[str, object], ...]
    spread: bool


@dataclass
class VerlSurface:
    repo: str
    imports: list[SurfaceName] = field(default_factory=list)
    attributes: dict[str, str] = field(default_factory=dict)  # attribute name → first verl file:line using it
    calls: dict[str, list[CallSite]] = field(default_factory=dict)  # attribute name → every verl call of it
    # attribute names verl also uses as values (`fn = bridge.to_megatron_provider`, a callback): called elsewhere
    # with arguments `calls` does not show
    uncalled: dict[str, str] = field(default_factory=dict)

    def modules(self) -> set[str]:
        return {s.module for s in self.imports}


class SurfaceError(Exception):
    """The verl checkout cannot tell which Bridge names verl uses."""


def _python_files(root: Path):
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(part in SKIPPED_DIRS or part.startswith(".") for part in rel.parts[:-1]):
            continue
        if len(rel.parts) > 1 and rel.parts[0] in OFFLINE_TOOLS:
            continue
        yield path, rel.as_posix()


def _module_of(rel: str) -> str:
    parts = rel[:-3].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _verl_modules_named(nodes: list[ast.AST], module: str, is_package: bool) -> set[str]:
    """The dotted names a verl file imports (absolute or relative, at any depth) or spells in a string."""
    package = module if is_package else module.rpartition(".")[0]
    out: set[str] = set()
    for n in nodes:
        if isinstance(n, ast.Import):
            out.update(a.name for a in n.names)
        elif isinstance(n, ast.ImportFrom):
            if n.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - (n.level - 1)] + ([n.module] if n.module else []))
            else:
                base = n.module or ""
            out.add(base)
            out.update(f"{base}.{a.name}" for a in n.names)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and "verl." in n.value:
            out.update(DOTTED_VERL.findall(n.value))
    return {m for m in out if _in_package(m, "verl")}


def _job_files(root: Path, named: dict[str, set[str]], module_file: dict[str, str]) -> set[str] | None:
    """The verl files the RL job can load (see RL_JOB): None when the checkout has no RL_JOB module."""
    if RL_JOB not in module_file:
        return None

    def runs(name: str) -> list[str]:
        """The checkout's modules that importing `name` runs: a.b.c runs a/__init__, a/b/__init__ and a/b/c (and
        `from a.b import c` may name the module a.b.c)."""
        parts = name.split(".")
        return [m for i in range(1, len(parts) + 1) if (m := ".".join(parts[:i])) in module_file]

    todo = runs(RL_JOB)
    for config in sorted((root / "verl").rglob("*.yaml")):  # Hydra configs: `_target_: verl.workers.config.X`
        try:
            todo += [m for name in DOTTED_VERL.findall(config.read_text(errors="replace")) for m in runs(name)]
        except OSError:
            continue
    loaded: set[str] = set()
    while todo:
        module = todo.pop()
        if module not in loaded:
            loaded.add(module)
            todo += [m for name in named.get(module, ()) for m in runs(name)]
    return {module_file[m] for m in loaded}


def _vanilla_test(test: ast.AST) -> bool | None:
    """True: the test holds only on the legacy mbridge path; False: only on Megatron-Bridge's; None: neither."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _vanilla_test(test.operand)
        return None if inner is None else not inner
    name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else None
    if name and any(w in name.lower() for w in VANILLA_WORDS):
        return True
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.comparators[0], ast.Constant) \
            and test.comparators[0].value is None and isinstance(test.ops[0], (ast.Is, ast.IsNot)):
        left = test.left.id if isinstance(test.left, ast.Name) else test.left.attr \
            if isinstance(test.left, ast.Attribute) else None
        if left == NO_PROVIDER:
            return isinstance(test.ops[0], ast.Is)
    return None


def _foreign_names(nodes: list[ast.AST]) -> set[str]:
    """Names a file binds by importing a module or name of another library (`from megatron.core import mpu`,
    `import torch.distributed as dist`, `from transformers import AutoConfig`): an attribute used on one of them
    (`mpu.initialize_model_parallel(...)`) is that library's, not a method of a Bridge object verl holds."""
    out: set[str] = set()
    own: set[str] = set()  # `import megatron.bridge` binds `megatron` too: `import megatron.core` beside it is no hint
    for n in nodes:
        if isinstance(n, ast.Import):
            for alias in n.names:
                (own if _ours(alias.name) else out).add(alias.asname or alias.name.split(".")[0])
        elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module and not _ours(n.module):
            out.update(alias.asname or alias.name for alias in n.names)
    return out - own


def _in_package(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _ours(module: str) -> bool:
    """Bridge's or verl's own module: what it binds may be (or hand out) a Bridge object."""
    return _in_package(module, BRIDGE_PACKAGE) or _in_package(module, "verl")


def _root_name(n: ast.Attribute) -> str | None:
    while isinstance(n, ast.Attribute):
        n = n.value
    return n.id if isinstance(n, ast.Name) else None


def _vanilla_only(nodes: list[ast.AST]) -> set[int]:
    """Nodes in branches only the legacy mbridge path takes."""
    out: set[int] = set()
    for n in nodes:
        if isinstance(n, ast.If):
            side = _vanilla_test(n.test)
            if side is not None:
                for s in (n.body if side else n.orelse):
                    out.update(id(x) for x in ast.walk(s))
    return out


def read_surface(verl_repo: Path | str) -> VerlSurface:
    """Every `megatron.bridge` import in verl (the package, not its tests or scripts), and the attribute names used by the
    verl files that handle Bridge objects: those importing `megatron.bridge`, and those importing such a file
    (verl re-exports AutoBridge from verl.models.mcore). Other files' attributes (a `.prepare_data` in a data
    utility) say nothing about Bridge."""
    root = Path(verl_repo)
    if not root.is_dir():
        raise SurfaceError(f"verl checkout {root} does not exist")
    surface = VerlSurface(str(root))
    attrs: dict[str, dict[str, str]] = {}  # file → attribute → file:line
    calls: dict[str, dict[str, list[CallSite]]] = {}  # file → attribute → its calls there
    uncalled: dict[str, dict[str, str]] = {}  # file → attribute used as a value → file:line
    imports: dict[str, set[str]] = {}  # file → verl modules it imports
    named: dict[str, set[str]] = {}  # module → the verl modules it imports or names (for _job_files)
    module_file: dict[str, str] = {}
    found: list[SurfaceName] = []
    direct: set[str] = set()
    for path, rel in _python_files(root):
        try:
            tree = ast.parse(path.read_bytes(), filename=rel)
        except (SyntaxError, ValueError, OSError):
            continue  # a file verl itself could not import either
        module = _module_of(rel)
        module_file[module] = rel
        nodes = list(ast.walk(tree))  # walked once, read by each pass below
        named[module] = _verl_modules_named(nodes, module, rel.endswith("__init__.py"))
        mine: dict[str, str] = {}
        used: set[str] = set()
        vanilla = _vanilla_only(nodes)
        foreign = _foreign_names(nodes)
        calls[rel], uncalled[rel] = calls_by_name([n for n in nodes if id(n) not in vanilla], rel,
                                                  counts=lambda n, foreign=foreign: _root_name(n) not in foreign)
        for node in nodes:
            if id(node) in vanilla:
                continue
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if _in_package(node.module, BRIDGE_PACKAGE):
                    direct.add(rel)
                    for alias in node.names:
                        found.append(SurfaceName(node.module, alias.name, rel, node.lineno))
                else:
                    used.add(node.module)
                    used.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if _in_package(alias.name, BRIDGE_PACKAGE):
                        direct.add(rel)
                        found.append(SurfaceName(alias.name, None, rel, node.lineno))
                    else:
                        used.add(alias.name)
            elif isinstance(node, ast.Attribute):
                if _root_name(node) not in foreign:
                    mine.setdefault(node.attr, f"{rel}:{node.lineno}")
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                  and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                  and isinstance(node.args[1].value, str)):
                mine.setdefault(node.args[1].value, f"{rel}:{node.lineno}")
        attrs[rel] = mine
        imports[rel] = used
    job = _job_files(root, named, module_file)
    if job is not None:  # files the RL job never loads are another program's
        direct &= job
        attrs = {rel: a for rel, a in attrs.items() if rel in job}
        imports = {rel: used for rel, used in imports.items() if rel in job}
    surface.imports = [s for s in found if job is None or s.file in job]
    if found and not surface.imports:
        files = sorted({s.file for s in found})
        raise SurfaceError(f"verl checkout {root}: its RL job ({RL_JOB}) loads none of the {len(files)} file(s) that "
                           f"import {BRIDGE_PACKAGE} ({', '.join(files[:3])}{', ...' if len(files) > 3 else ''}): "
                           "it cannot tell what verl reaches")
    if not surface.imports:
        raise SurfaceError(f"verl checkout {root} imports nothing from {BRIDGE_PACKAGE}: it cannot tell what verl "
                           "reaches (is it a verl checkout with the Megatron-Bridge backend?)")
    bridge_modules = {_module_of(rel) for rel in direct}
    grew = True
    while grew:  # packages re-exporting them (`from verl.models.mcore import AutoBridge`)
        grew = False
        for rel, used in imports.items():
            if rel.endswith("__init__.py") and used & bridge_modules and _module_of(rel) not in bridge_modules:
                bridge_modules.add(_module_of(rel))
                grew = True
    aware = direct | {rel for rel, used in imports.items() if used & bridge_modules}
    for rel in sorted(aware):
        for name, where in attrs[rel].items():
            surface.attributes.setdefault(name, where)
        for name, sites in calls[rel].items():
            surface.calls.setdefault(name, []).extend(sites)
        for name, where in uncalled[rel].items():
            surface.uncalled.setdefault(name, where)
    return surface


def _literal(node: ast.AST) -> object:
    return node.value if isinstance(node, ast.Constant) else NOT_CONSTANT


def call_site(node: ast.Call, where: str) -> CallSite:
    spread = any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords)
    return CallSite(where, tuple(_literal(a) for a in node.args),
                    tuple((k.arg, _literal(k.value)) for k in node.keywords if k.arg), spread)


def _name_of(node: ast.AST, bare_names: bool) -> str | None:
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if bare_names and isinstance(node, ast.Name) else None


def calls_by_name(nodes: list[ast.AST], file: str, counts=lambda node: True, bare_names: bool = False
                  ) -> tuple[dict[str, list[CallSite]], dict[str, str]]:
    """Of one scope's nodes (walked): every call by the name it calls (`x.name(...)`; `name(...)` too with
    `bare_names`), and the names used as values instead (`fn = x.name`, a callback: called elsewhere, with
    arguments these calls do not show) -> the first file:line. `counts(node)` says whether a name node counts
    (verl: not an attribute of another library's module)."""
    called = {id(n.func) for n in nodes if isinstance(n, ast.Call)}
    sites: dict[str, list[CallSite]] = {}
    values: dict[str, str] = {}
    for n in nodes:
        if isinstance(n, ast.Call):
            name = _name_of(n.func, bare_names)
            if name and counts(n.func):
                sites.setdefault(name, []).append(call_site(n, f"{file}:{n.lineno}"))
        elif (name := _name_of(n, bare_names)) and id(n) not in called and isinstance(n.ctx, ast.Load) \
                and counts(n):
            values.setdefault(name, f"{file}:{n.lineno}")
    return sites, values
