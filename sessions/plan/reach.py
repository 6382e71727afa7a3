"""What verl reaches of a Megatron-Bridge checkout, and what a change to it does — both read with `ast`.

The index: every module under `src/megatron/bridge`, cut into units (the module's top-level code, each class
statement with its body, each function or method; a function nested in a function belongs to it). Each unit's
references: names it loads, resolved through the module's imports (re-exports followed), its local imports, and
the attribute names it uses. Annotations are not references (they run nothing).

Reachability from verl's surface (sessions/plan/verl_surface.py) is a fixpoint:
- importing a module runs its top-level code and every class statement in it (registrations, decorators), and the
  packages above it;
- a reached unit reaches what it references; a class it references becomes *live*;
- a method of a live class is reached when its name is used as an attribute by reached code or by verl (or it is
  called implicitly: dunders, `forward`); a subclass, in an imported module, of a live class is live too (registries
  and overrides dispatch to it).
Every reached unit keeps the step that reached it, so a path back to verl's import can be shown.

Per-entry reachability (`calls_from`) follows only calls and references from one of verl's entry points (no import
side effects): it says which of verl's uses (weight export, HF import, PEFT, checkpointing...) run a changed unit.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

SRC_ROOT = "src"
PACKAGE_DIR = "src/megatron/bridge"
MODULE = "<module>"


@dataclass
class Unit:
    key: str  # "pkg.mod" for module code, "pkg.mod:Class", "pkg.mod:func", "pkg.mod:Class.method"
    kind: str  # module | class | function | method
    module: str
    file: str
    start: int
    end: int
    node: ast.AST | None
    cls: str | None = None  # a method's class key
    refs: set[str] = field(default_factory=set)  # unit keys and module keys it references
    attrs: set[str] = field(default_factory=set)  # attribute names it uses
    bases: list[str] = field(default_factory=list)  # a class's Bridge base classes (keys)
    methods: dict[str, str] = field(default_factory=dict)  # a class's method name → unit key
    registered: bool = False  # a class a Bridge decorator registers (bridges, mappings)
    deco_refs: set[str] = field(default_factory=set)  # what a class statement's decorators reference
    called: set[str] = field(default_factory=set)  # what it calls (a class called is instantiated)

    @property
    def name(self) -> str:
        return self.key.split(":", 1)[1] if ":" in self.key else self.key


@dataclass
class ModuleInfo:
    name: str
    file: str
    package: bool
    table: dict[str, tuple] = field(default_factory=dict)  # name → ("unit", key) | ("module", m) | ("from", m, n)
    units: list[str] = field(default_factory=list)


def module_name(rel: str) -> str | None:
    """`src/megatron/bridge/a/b.py` → `megatron.bridge.a.b`; `__init__.py` → its package."""
    if not rel.startswith(SRC_ROOT + "/") or not rel.endswith(".py"):
        return None
    parts = rel[len(SRC_ROOT) + 1:-3].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _absolute(module: str, package: bool, level: int, target: str | None) -> str:
    if level == 0:
        return target or ""
    base = module.split(".") if package else module.split(".")[:-1]
    if level > 1:
        base = base[:len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


IMPLICIT = re.compile(r"__\w+__|forward")


def _is_implicit(name: str) -> bool:
    return bool(IMPLICIT.fullmatch(name))


class _Modules:
    """Bridge modules by dotted name, parsed on first use: only what verl's imports pull in is ever parsed."""

    def __init__(self, index: BridgeIndex, files: dict[str, str]):
        self._index = index
        self.files = files  # module name → repo-relative path
        self._loaded: dict[str, ModuleInfo | None] = {}

    def __contains__(self, name: object) -> bool:
        return name in self.files

    def __iter__(self):
        return iter(self.files)

    def __len__(self) -> int:
        return len(self.files)

    def get(self, name: str, default=None) -> ModuleInfo | None:
        if name not in self.files:
            return default
        if name not in self._loaded:
            self._loaded[name] = None  # a cycle sees a module being loaded as not there yet
            self._loaded[name] = self._index._load(name, self.files[name])
        return self._loaded[name] or default

    def __getitem__(self, name: str) -> ModuleInfo:
        info = self.get(name)
        if info is None:
            raise KeyError(name)
        return info

    def loaded(self) -> list[str]:
        return [m for m, info in self._loaded.items() if info is not None]


class BridgeIndex:
    """Modules and units of one Bridge checkout's `src/megatron/bridge`, with resolved references."""

    def __init__(self, root: Path | str, sources: dict[str, str] | None = None):
        self.root = Path(root)
        self.sources = sources  # repo-relative path → text (tests, or a commit read from git); else the disk
        self.units: dict[str, Unit] = {}
        self.methods_by_name: dict[str, list[str]] = {}
        self.subclasses: dict[str, list[str]] = {}
        files: dict[str, str] = {}
        if sources is not None:
            rels = list(sources)
        else:
            base = self.root / PACKAGE_DIR
            rels = [p.relative_to(self.root).as_posix() for p in base.rglob("*.py")] if base.is_dir() else []
        for rel in sorted(rels):
            name = module_name(rel)
            if name is not None and rel.startswith(PACKAGE_DIR + "/"):
                files[name] = rel
        self.modules = _Modules(self, files)

    def _text(self, rel: str) -> str | None:
        if self.sources is not None:
            return self.sources.get(rel)
        try:
            return (self.root / rel).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None

    def _load(self, name: str, rel: str) -> ModuleInfo | None:
        text = self._text(rel)
        try:
            tree = ast.parse(text or "", filename=rel)
        except (SyntaxError, ValueError):
            return None  # Python could not import it either
        info = ModuleInfo(name, rel, rel.endswith("__init__.py"))
        self.modules._loaded[name] = info  # visible to name resolution while its units are collected
        self._cut(info, tree)
        for key in info.units:
            self._collect(self.units[key])
        for key in info.units:
            unit = self.units[key]
            if unit.kind == "class":
                for base in unit.bases:
                    self.subclasses.setdefault(base, []).append(unit.key)
                for m, mkey in unit.methods.items():
                    self.methods_by_name.setdefault(m, []).append(mkey)
        return info

    def unit(self, key: str) -> Unit | None:
        """A unit by key, parsing its module first when needed."""
        if key not in self.units:
            self.modules.get(key.split(":", 1)[0])
        return self.units.get(key)

    # ---- cutting modules into units
    def _add(self, unit: Unit, info: ModuleInfo) -> Unit:
        self.units[unit.key] = unit
        info.units.append(unit.key)
        return unit

    def _cut(self, info: ModuleInfo, tree: ast.Module) -> None:
        self._add(Unit(info.name, "module", info.name, info.file, 1, 10 ** 9, tree), info)
        for stmt in tree.body:
            self._bind(info, info.table, stmt, top=True)
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self._add(Unit(f"{info.name}:{stmt.name}", "function", info.name, info.file, _first(stmt),
                               stmt.end_lineno or stmt.lineno, stmt), info)
            elif isinstance(stmt, ast.ClassDef):
                self._cut_class(info, stmt, stmt.name)

    def _cut_class(self, info: ModuleInfo, node: ast.ClassDef, qual: str) -> None:
        cls = self._add(Unit(f"{info.name}:{qual}", "class", info.name, info.file, _first(node),
                             node.end_lineno or node.lineno, node), info)
        for stmt in node.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                key = f"{info.name}:{qual}.{stmt.name}"
                self._add(Unit(key, "method", info.name, info.file, _first(stmt), stmt.end_lineno or stmt.lineno,
                               stmt, cls=cls.key), info)
                cls.methods.setdefault(stmt.name, key)
            elif isinstance(stmt, ast.ClassDef):
                self._cut_class(info, stmt, f"{qual}.{stmt.name}")

    def _bind(self, info: ModuleInfo, table: dict, stmt: ast.AST, top: bool = False) -> None:
        """Names a statement binds at module level (imports inside try/if blocks too)."""
        if isinstance(stmt, ast.Import):
            for a in stmt.names:
                if a.asname:
                    table[a.asname] = ("module", a.name)
                else:
                    table.setdefault(a.name.split(".")[0], ("module", a.name.split(".")[0]))
        elif isinstance(stmt, ast.ImportFrom):
            mod = _absolute(info.name, info.package, stmt.level, stmt.module)
            for a in stmt.names:
                if a.name != "*":
                    table[a.asname or a.name] = ("from", mod, a.name)
                else:
                    table["*"] = table.get("*", ()) + (mod,)
        elif top and isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            table[stmt.name] = ("unit", f"{info.name}:{stmt.name}")
        elif top and isinstance(stmt, (ast.Try, ast.If, ast.With)):
            for block in (getattr(stmt, "body", []), getattr(stmt, "orelse", []), getattr(stmt, "finalbody", []),
                          *[h.body for h in getattr(stmt, "handlers", [])]):
                for s in block:
                    self._bind(info, table, s, top=True)

    # ---- resolving names
    def resolve(self, module: str, name: str, seen: frozenset = frozenset()) -> tuple | None:
        """What `name` in `module` is: ("unit", key) | ("module", name) | None (outside Bridge)."""
        if (module, name) in seen or len(seen) > 30:
            return None
        seen = seen | {(module, name)}
        info = self.modules.get(module)
        if info is None:
            return None
        b = info.table.get(name)
        if b is None:
            sub = f"{module}.{name}"
            if sub in self.modules:
                return ("module", sub)
            for star in info.table.get("*", ()):
                r = self.resolve(star, name, seen)
                if r:
                    return r
            return None
        return self._follow(b, seen)

    def _follow(self, b: tuple, seen: frozenset = frozenset()) -> tuple | None:
        if b[0] == "unit":
            return b
        if b[0] == "module":
            return ("module", b[1]) if b[1] in self.modules else None
        _, mod, name = b
        if mod in self.modules:
            r = self.resolve(mod, name, seen)
            if r:
                return r
        sub = f"{mod}.{name}"
        return ("module", sub) if sub in self.modules else None

    def _member(self, target: tuple, attr: str) -> tuple | None:
        if target[0] == "module":
            return self.resolve(target[1], attr)
        unit = self.units.get(target[1])
        if unit is not None and unit.kind == "class" and attr in unit.methods:
            return ("unit", unit.methods[attr])
        return None

    # ---- references of a unit
    def _collect(self, unit: Unit) -> None:
        info = self.modules[unit.module]
        local: dict[str, tuple] = {}
        nodes = self._own_nodes(unit)
        for n in nodes:
            if isinstance(n, (ast.Import, ast.ImportFrom)) and unit.kind != "module":
                self._bind(info, local, n)
                if isinstance(n, ast.Import):
                    for a in n.names:
                        if a.name in self.modules:
                            unit.refs.add(a.name)
                else:
                    mod = _absolute(info.name, info.package, n.level, n.module)
                    if mod in self.modules:
                        unit.refs.add(mod)
        for n in nodes:
            if isinstance(n, ast.ImportFrom):  # runs the module (and a submodule named); binds, calls nothing
                mod = _absolute(info.name, info.package, n.level, n.module)
                if mod in self.modules:
                    unit.refs.add(mod)
                for a in n.names:
                    if f"{mod}.{a.name}" in self.modules:
                        unit.refs.add(f"{mod}.{a.name}")
            elif isinstance(n, ast.Import):
                for a in n.names:
                    if a.name in self.modules:
                        unit.refs.add(a.name)
            elif isinstance(n, ast.Attribute):
                unit.attrs.add(n.attr)
            elif isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in self.modules:
                unit.refs.add(n.value)  # a module named for import_module()
            elif isinstance(n, ast.Tuple) and len(n.elts) == 2 and all(
                    isinstance(e, ast.Constant) and isinstance(e.value, str) for e in n.elts) \
                    and n.elts[0].value in self.modules:
                t = self.resolve(n.elts[0].value, n.elts[1].value)  # ("pkg.module", "Name"): a lazy-import table
                if t:
                    unit.refs.add(t[1])
                    unit.called.add(t[1])  # what such a table names gets imported and built
            elif isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("getattr", "hasattr") \
                    and len(n.args) >= 2 and isinstance(n.args[1], ast.Constant) and isinstance(n.args[1].value, str):
                unit.attrs.add(n.args[1].value)
        # `C.method(...)` reaches the method, `isinstance(x, C)` nothing: neither makes instances of C exist.
        quiet: set[int] = set()
        for n in nodes:
            if isinstance(n, ast.Attribute):
                quiet.add(id(n.value))
            elif isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("isinstance",
                                                                                             "issubclass"):
                for sub in ast.walk(n.args[1]) if len(n.args) > 1 else ():
                    quiet.add(id(sub))
        for n in nodes:
            if id(n) in quiet:
                continue
            target = self._target(n, info, local)
            if target:
                unit.refs.add(target[1])
            if isinstance(n, ast.Call):
                t = self._target(n.func, info, local)
                if t:
                    unit.called.add(t[1])
        if unit.kind == "class":
            for b in unit.node.bases:  # type: ignore[union-attr]
                t = self._target(b, info, local)
                if t and t[0] == "unit" and self.units.get(t[1]) and self.units[t[1]].kind == "class":
                    unit.bases.append(t[1])
            # naming a base class in a class statement uses nothing of it (its methods run through the subclass)
            unit.refs.difference_update(unit.bases)
            for d in unit.node.decorator_list:  # type: ignore[union-attr]
                t = self._target(d.func if isinstance(d, ast.Call) else d, info, local)
                if t and t[0] == "unit":
                    unit.registered = True  # a Bridge decorator keeps the class: a registry hands it out
                    unit.deco_refs.add(t[1])
        unit.refs.discard(unit.key)

    def _target(self, n: ast.AST, info: ModuleInfo, local: dict) -> tuple | None:
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            b = local.get(n.id) or info.table.get(n.id)
            return self._follow(b) if b else None
        if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load):
            chain = []
            cur: ast.AST = n
            while isinstance(cur, ast.Attribute):
                chain.append(cur.attr)
                cur = cur.value
            if not isinstance(cur, ast.Name):
                return None
            b = local.get(cur.id) or info.table.get(cur.id)
            t = self._follow(b) if b else None
            for attr in reversed(chain):
                if t is None:
                    return None
                t = self._member(t, attr)
            return t
        return None

    def _own_nodes(self, unit: Unit) -> list[ast.AST]:
        """The AST nodes that belong to this unit (not to its own methods/classes/functions), minus annotations."""
        out: list[ast.AST] = []
        node = unit.node
        if unit.kind in ("module", "class"):
            roots = _own_roots(unit)
        else:
            roots = [*node.decorator_list, *node.args.defaults, *[d for d in node.args.kw_defaults if d], *node.body]
        stack = list(roots)
        while stack:
            n = stack.pop()
            out.append(n)
            for child in ast.iter_child_nodes(n):
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and child in (n.returns,):
                    continue
                if isinstance(child, ast.arg):
                    continue  # parameters and their annotations
                if isinstance(n, ast.AnnAssign) and child is n.annotation:
                    continue
                stack.append(child)
        return out

    # ---- mapping lines to units
    def unit_at(self, file: str, line: int) -> Unit | None:
        name = module_name(file)
        info = self.modules.get(name or "")
        if info is None:
            return None
        best = self.units[info.name]
        for key in info.units:
            u = self.units[key]
            if u.kind != "module" and u.start <= line <= u.end and (u.end - u.start) <= (best.end - best.start):
                best = u
        return best


def _first(node: ast.AST) -> int:
    decos = getattr(node, "decorator_list", [])
    return min([node.lineno] + [d.lineno for d in decos])


# ---------------------------------------------------------------- reachability


@dataclass
class Step:
    parent: str | None  # the unit key / module that reached it; None = verl
    via: str  # how: "imports", "calls", ".name", "subclass of X", "verl: file:line ..."


@dataclass
class Reach:
    steps: dict[str, Step] = field(default_factory=dict)
    live: dict[str, Step] = field(default_factory=dict)  # classes code uses (their subclasses may stand in)
    dispatch: dict[str, Step] = field(default_factory=dict)  # live classes and their bases: methods callable
    attrs: dict[str, str] = field(default_factory=dict)  # attribute name → who uses it

    def __contains__(self, key: str) -> bool:
        return key in self.steps

    def path(self, key: str, limit: int = 12) -> list[tuple[str, str]]:
        """(unit, how it was reached) from verl's surface down to key."""
        out = []
        seen = set()
        while key is not None and key in self.steps and key not in seen and len(out) < limit:
            seen.add(key)
            step = self.dispatch.get(key) or self.steps[key]  # a class: what made its methods callable
            out.append((key, step.via))
            key = step.parent
        return list(reversed(out))


def reach(index: BridgeIndex, seeds: list[tuple[str, Step]], attrs: dict[str, str], imports: bool = True,
          modules_gate: set[str] | None = None, live: tuple[str, ...] = ()) -> Reach:
    """Fixpoint from the seeds. `imports`: reaching a module runs its code (import side effects)."""
    r = Reach()
    queue: deque[str] = deque()

    def visit(key: str, step: Step) -> None:
        if key in r.steps:
            return
        unit = index.unit(key)
        if unit is None:
            return
        if unit.kind == "module" and not imports:
            return
        r.steps[key] = step
        queue.append(key)

    def dispatch_to(cls: str, step: Step) -> None:
        """Methods of cls (live, or a base of a live class) run when their name is used."""
        if cls in r.dispatch:
            return
        r.dispatch[cls] = step
        cname = index.units[cls].name
        for name, m in index.units[cls].methods.items():
            if _is_implicit(name):
                visit(m, Step(cls, f"{name} (implicit)"))
            elif name in r.attrs:  # the path goes through the code that calls it, not through the class
                who = r.attrs[name]
                visit(m, Step(who if who in r.steps else cls, f".{name} ({cname} {'via ' + who if who not in r.steps else ''})".rstrip()))

    def make_live(cls: str, step: Step) -> None:
        if cls in r.live:
            return
        r.live[cls] = step
        if cls in r.steps:
            queue.append(cls)  # its body's references count now that the class is used
        elif imports:
            visit(cls, step)
        dispatch_to(cls, step)
        for base in _ancestors(index, cls):
            dispatch_to(base, Step(cls, f"inherited by {index.units[cls].name}"))
        gate = modules_gate if modules_gate is not None else r.steps
        for sub in index.subclasses.get(cls, []):
            if index.units[sub].module in gate:
                make_live(sub, Step(cls, f"subclass of {index.units[cls].name}"))

    def use_attr(name: str, who: str) -> None:
        if name in r.attrs:
            return
        r.attrs[name] = who
        for m in index.methods_by_name.get(name, []):
            cls = index.units[m].cls
            if cls in r.dispatch:
                visit(m, Step(who if who in r.steps else cls, f".{name} ({index.units[cls].name})"
                              + ("" if who in r.steps else f" used by {who}")))

    for name, who in attrs.items():
        use_attr(name, who)
    for cls in live:  # an entry method's `self`, classes registries hand out
        make_live(cls, Step(None, "self" if cls == live[0] else "registered"))
    for key, step in seeds:
        unit = index.unit(key)
        if unit is None:
            continue
        if unit.kind == "class":
            make_live(key, step)
        visit(key, step)
    while queue:
        key = queue.popleft()
        unit = index.units[key]
        if unit.kind == "module":
            parts = unit.module.split(".")
            for i in range(1, len(parts)):
                pkg = ".".join(parts[:i])
                if pkg in index.modules:
                    visit(pkg, Step(key, "package of"))
            for k in index.modules[unit.module].units:
                u = index.units[k]
                if u.kind == "class":
                    visit(k, Step(key, "class statement runs on import"))
                    if u.registered:
                        make_live(k, Step(key, "registered by its decorator on import"))
                    live_base = next((b for b in u.bases if b in r.live), None)
                    if live_base:
                        make_live(k, Step(live_base, f"subclass of {index.units[live_base].name}"))
        # A class statement runs on import, but its body's values (dataclass defaults, factories) matter only
        # once the class is used: until then only its decorators count.
        dormant = unit.kind == "class" and key not in r.live
        for name in () if dormant else unit.attrs:
            use_attr(name, unit.key)
        for ref in sorted(unit.deco_refs if dormant else unit.refs):
            target = index.unit(ref)
            if target is None:
                continue
            step = Step(key, "imports" if target.kind == "module" else "references")
            # module code naming a class without calling it (a table of builders) makes no instance
            if target.kind == "class" and (unit.kind != "module" or ref in unit.called):
                make_live(ref, step)
            visit(ref, step)
    return r


def verl_seeds(index: BridgeIndex, surface) -> list[tuple[str, Step]]:
    """Units verl's imports start from: the imported modules (their code runs) and the imported names."""
    seeds = []
    for s in surface.imports:
        via = f"verl {s.where}: " + (f"from {s.module} import {s.name}" if s.name else f"import {s.module}")
        if s.module in index.modules:
            seeds.append((s.module, Step(None, via)))
        if s.name:
            t = index.resolve(s.module, s.name)
            if t:
                seeds.append((t[1], Step(None, via)))
    return seeds


@dataclass(frozen=True)
class Entry:
    """One way verl calls into Bridge: an imported function/class, or a method of an imported class verl calls."""

    key: str
    label: str  # e.g. "AutoBridge.export_hf_weights"
    where: str  # verl file:line


def verl_entries(index: BridgeIndex, surface, global_reach: Reach) -> list[Entry]:
    """verl's entry points: imported functions and classes, and the methods verl names of imported classes."""
    out: dict[str, Entry] = {}
    for s in surface.imports:
        if not s.name:
            continue
        t = index.resolve(s.module, s.name)
        if not t or t[0] != "unit":
            continue
        unit = index.units[t[1]]
        if unit.kind == "class":
            for cls in [unit.key] + _ancestors(index, unit.key):
                for name, m in index.units[cls].methods.items():
                    if name in surface.attributes and not _is_implicit(name) and m not in out:
                        out[m] = Entry(m, f"{unit.name}.{name}", surface.attributes[name])
            out.setdefault(unit.key, Entry(unit.key, unit.name, s.where))
        else:
            out.setdefault(unit.key, Entry(unit.key, unit.name, s.where))
    return list(out.values())


def _ancestors(index: BridgeIndex, cls: str) -> list[str]:
    out, stack = [], list(index.units[cls].bases)
    while stack:
        b = stack.pop()
        if b not in out:
            out.append(b)
            stack += index.units[b].bases
    return out


def calls_from(index: BridgeIndex, entry: Entry, modules_gate: set[str]) -> Reach:
    """What one verl entry point runs: calls and references only, no import side effects."""
    unit = index.units[entry.key]
    registered = tuple(k for m in modules_gate if (info := index.modules.get(m)) for k in info.units
                       if index.units[k].registered)
    return reach(index, [(entry.key, Step(None, f"verl calls {entry.label} ({entry.where})"))], {},
                 imports=False, modules_gate=modules_gate, live=((unit.cls,) if unit.cls else ()) + registered)


# ---------------------------------------------------------------- what changed code does

WORD_SPLIT = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")


def words_of(identifier: str) -> list[str]:
    """`MTP_CONFIG_FIELDS` → mtp config fields; `gatherFromEPRanks` → gather from ep ranks (lower case)."""
    return [w.lower() for w in WORD_SPLIT.findall(identifier)]


def _pass_through(node: ast.keyword) -> bool:
    """`name=name` / `name=x.name`: a value handed on under its own name says nothing about the change."""
    v = node.value
    last = v.id if isinstance(v, ast.Name) else v.attr if isinstance(v, ast.Attribute) else None
    return node.arg is not None and last == node.arg


def _switched_off(value: ast.AST | None) -> bool:
    """`x.mtp_num_layers = None` / `use_fsdp=False`: setting a feature to nothing says it is absent."""
    return isinstance(value, ast.Constant) and value.value in (None, False, 0)


def _names_in(node: ast.AST, skip: set[int], strings: bool = False) -> list[str]:
    out = []
    for n in ast.walk(node):
        if id(n) in skip:
            continue
        if isinstance(n, ast.Name):
            out.append(n.id)
        elif isinstance(n, ast.Attribute):
            out.append(n.attr)
        elif strings and isinstance(n, ast.Constant) and isinstance(n.value, str) and len(n.value) <= 40:
            out.append(n.value)
    return out


def _silenced(tree: ast.AST) -> set[int]:
    """Nodes whose names never count: pass-through keywords, features switched off, import statements."""
    skip: set[int] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.keyword) and (_pass_through(n) or _switched_off(n.value)):
            skip.update(id(x) for x in ast.walk(n))
        elif isinstance(n, (ast.Assign, ast.AnnAssign)) and _switched_off(n.value):
            skip.update(id(x) for x in ast.walk(n))
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            skip.update(id(x) for x in ast.walk(n))
    return skip


@dataclass
class Evidence:
    """What a changed unit is about (`subject`) and every name its changed code uses (`code`)."""

    subject: list[str] = field(default_factory=list)
    code: list[str] = field(default_factory=list)
    guards: list[str] = field(default_factory=list)  # names of conditions the change edits
    new: bool = False  # the whole unit is new


def evidence(unit: Unit, lines: set[int], code: set[int]) -> Evidence:
    """Identifiers of a unit's changed code lines (`lines`; `code` = the file's lines that hold code) — never
    comments or strings (docstrings included), never a keyword passed through under its own name, never a feature
    set to None/False, never an import. A changed line inside a longer statement (an entry of a dict literal)
    also counts the names on that statement's first line (what the dict is assigned to).

    The subject: the unit's name (and its class), the conditions of the `if`/`elif`/`while` blocks a changed line
    sits in or changes (`elif ckpt_format == "fsdp_dtensor":` makes a change FSDP-only; the strings such a
    condition compares with count), and for a new function its signature."""
    ev = Evidence()
    node = unit.node
    ev.subject.append(unit.name.replace(".", "_") if unit.kind != "module" else unit.module.rsplit(".", 1)[-1])
    if node is None:
        return ev
    skip = _silenced(node)
    own = _unit_nodes(unit)
    span = set(range(unit.start, unit.end + 1)) & code if unit.kind != "module" else set()
    ev.new = bool(span) and span <= lines
    if ev.new and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
            if a.annotation is not None:  # what it takes and gives (parameter names are only names)
                ev.subject += _names_in(a.annotation, skip)
        if node.returns is not None:
            ev.subject += _names_in(node.returns, skip)
    heads: set[int] = set()
    for n in own:
        if isinstance(n, ast.stmt) and not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                                                          ast.If, ast.For, ast.While, ast.With, ast.Try)):
            end = n.end_lineno or n.lineno
            if any(n.lineno < ln <= end for ln in lines):
                heads.add(n.lineno)
    counted = lines | heads
    for n in own:
        line = getattr(n, "lineno", None)
        if line is None or id(n) in skip or line not in counted:
            continue
        if isinstance(n, ast.Name):
            ev.code.append(n.id)
        elif isinstance(n, ast.Attribute):
            ev.code.append(n.attr)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and line in lines:
            ev.code.append(n.name)
        elif isinstance(n, ast.arg):
            ev.code.append(n.arg)
        elif isinstance(n, ast.keyword) and n.arg:
            ev.code.append(n.arg)
    if not ev.new:
        for n in own:
            if isinstance(n, (ast.If, ast.While)):
                test_lines = set(range(n.test.lineno, (n.test.end_lineno or n.test.lineno) + 1))
                # `not is_modelopt_linear(m)`: what the change is not about
                negated = {id(x) for u in ast.walk(n.test) if isinstance(u, ast.UnaryOp) and isinstance(u.op, ast.Not)
                           for x in ast.walk(u.operand)}
                negated |= {id(x) for u in ast.walk(n.test) if isinstance(u, ast.Compare) and len(u.ops) == 1
                            and isinstance(u.ops[0], ast.NotIn) for x in ast.walk(u.left)}  # `".adapter." not in p`
                names = _names_in(n.test, skip | negated, strings=True)
                if test_lines & lines:
                    ev.guards += names  # an edited condition: compared with the old one by the caller
                elif any(b.lineno <= ln <= (b.end_lineno or b.lineno) for b in [*n.body, *n.orelse] for ln in lines):
                    ev.subject += names
    return ev


_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _own_roots(unit: Unit) -> list[ast.AST]:
    """A module's or class's own code: its statements that are not defs (a class: also bases, keywords, decorators)."""
    node = unit.node
    body = [s for s in node.body if not isinstance(s, _DEFS)]
    return body if unit.kind == "module" else [*node.bases, *node.keywords, *node.decorator_list, *body]


def _unit_nodes(unit: Unit) -> list[ast.AST]:
    """The nodes of a unit's own code (a method's code is not its class's, a function's not its module's)."""
    roots = _own_roots(unit) if unit.kind in ("module", "class") else [unit.node]
    out = []
    for r in roots:
        out.extend(ast.walk(r))
    return out


def code_lines(text: str) -> set[int]:
    """Lines that hold code (a name, operator or number), not only a comment, a string or nothing."""
    out: set[int] = set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type in (tokenize.NAME, tokenize.OP, tokenize.NUMBER):
                out.update(range(tok.start[0], tok.end[0] + 1))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return out
