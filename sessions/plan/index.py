"""The index of one Megatron-Bridge checkout, read with `ast`: every module under `src/megatron/bridge`, cut into
units (the module's top-level code, each class statement with its body, each function or method; a function nested
in a function belongs to it). Each unit's references: names it loads, resolved through the module's imports
(re-exports followed), its local imports, and the attribute names it uses; the module-level variables it reads
(tables, specs, constants) and, per module, what each such table names. Annotations are not references (they run
nothing). Modules are parsed on first use.
"""

from __future__ import annotations

import ast
import re
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
    bridge_call: bool = False  # module code registers it as a bridge: `X = Bridge.register_bridge(...)(X)`
    deco_refs: set[str] = field(default_factory=set)  # what a class statement's decorators reference
    hf_registered: bool = False  # module code registers it as an HF config class: `AutoConfig.register("x", C)`
    called: set[str] = field(default_factory=set)  # what it calls (a class called is instantiated)
    var_refs: set[str] = field(default_factory=set)  # module-level variables it reads ("pkg.mod.NAME")
    passed: set[str] = field(default_factory=set)  # module code: what it hands to a call (`register("x", f)`)

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
    assigned: set[str] = field(default_factory=set)  # names its top-level assignments bind (tables, specs, constants)
    table_refs: dict[str, set[str]] = field(default_factory=dict)  # such a name → the units its value names


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
        elif top and table is info.table and isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            for t in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]):
                info.assigned.update(x.id for x in ast.walk(t) if isinstance(x, ast.Name))
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
        for n in nodes:
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
                var = self._variable(info, local, n.id)
            elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name):
                b = local.get(n.value.id) or info.table.get(n.value.id)
                t = self._follow(b) if b else None
                var = self._module_variable(t[1], n.attr) if t and t[0] == "module" else None
            else:
                continue
            if var:
                unit.var_refs.add(var)
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
        if unit.kind == "method" and unit.cls and _builds_cls(unit.node):
            unit.refs.add(unit.cls)  # a classmethod factory (`return cls(...)`) makes instances of its class
            unit.called.add(unit.cls)
        if unit.kind == "class":
            for b in unit.node.bases:  # type: ignore[union-attr]
                # a generic base (`ModelProviderMixin[MCoreGPTModel]`) is its class: the subscript is typing only
                t = self._target(b.value if isinstance(b, ast.Subscript) else b, info, local)
                if t and t[0] == "unit" and self.units.get(t[1]) and self.units[t[1]].kind == "class":
                    unit.bases.append(t[1])
            # naming a base class in a class statement uses nothing of it (its methods run through the subclass)
            unit.refs.difference_update(unit.bases)
            for d in unit.node.decorator_list:  # type: ignore[union-attr]
                t = self._target(d.func if isinstance(d, ast.Call) else d, info, local)
                if t and t[0] == "unit":
                    unit.registered = True  # a Bridge decorator keeps the class: a registry hands it out
                    unit.deco_refs.add(t[1])
        if unit.kind == "module":
            for n in nodes:
                # a decorator applied by a call in module code (`X = Bridge.register_bridge(...)(X)`, under an
                # `if` that checks the HF class exists): the class is registered as if decorated
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Call) and len(n.args) == 1 \
                        and isinstance(n.args[0], ast.Name):
                    deco = self._target(n.func.func, info, local)
                    cls = self.units.get(f"{info.name}:{n.args[0].id}")
                    if deco and deco[0] == "unit" and cls is not None and cls.kind == "class":
                        cls.registered = True
                        cls.deco_refs.add(deco[1])
                        func = n.func.func
                        cls.bridge_call = cls.bridge_call or (
                            isinstance(func, (ast.Attribute, ast.Name))
                            and (func.attr if isinstance(func, ast.Attribute) else func.id) == "register_bridge")
                if isinstance(n, ast.Call):
                    for arg in [*n.args, *[k.value for k in n.keywords]]:
                        unit.passed.update(t[1] for x in ast.walk(arg) if (t := self._target(x, info, local))
                                           and t[0] == "unit")
                    if self._hf_auto_register(n.func, info, local):
                        for arg in n.args:
                            t = self._target(arg, info, local)
                            cls = self.units.get(t[1]) if t and t[0] == "unit" else None
                            if cls is not None and cls.kind == "class":
                                cls.hf_registered = True
        if unit.kind == "module":  # what each module-level table names (`spec = ModuleSpec(module=FalconH1Layer)`)
            for stmt in _top_statements(unit.node):
                if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
                    named = {t[1] for x in ast.walk(stmt.value) if (t := self._target(x, info, local))
                             and t[0] == "unit"}
                    for tgt in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]):
                        for x in ast.walk(tgt):
                            if isinstance(x, ast.Name):
                                info.table_refs.setdefault(x.id, set()).update(named)
        unit.refs.discard(unit.key)

    @staticmethod
    def _hf_auto_register(func: ast.AST, info: ModuleInfo, local: dict) -> bool:
        """`AutoConfig.register`: transformers' config registry. HF builds the registered config class whenever a
        checkpoint of that model type is loaded (verl: AutoBridge.from_hf_pretrained reads the config). Not
        `AutoModel*.register`: the HF model class is built only when the HF model itself is instantiated, which
        verl's Megatron path does not do (it streams the checkpoint's tensors through the bridge)."""
        if not (isinstance(func, ast.Attribute) and func.attr == "register" and isinstance(func.value, ast.Name)):
            return False
        b = local.get(func.value.id) or info.table.get(func.value.id)
        return bool(b) and b[0] == "from" and b[1].split(".")[0] == "transformers" and b[2] == "AutoConfig"

    def _variable(self, info: ModuleInfo, local: dict, name: str) -> str | None:
        """The module-level variable a name reads ("pkg.mod.NAME"), through imports and re-exports."""
        b = local.get(name) or info.table.get(name)
        if b is None:
            return f"{info.name}.{name}" if name in info.assigned else None
        return self._module_variable(b[1], b[2]) if b[0] == "from" else None

    def _module_variable(self, module: str, name: str, depth: int = 0) -> str | None:
        info = self.modules.get(module)
        if info is None or depth > 10:
            return None
        if name in info.assigned:
            return f"{module}.{name}"
        b = info.table.get(name)
        return self._module_variable(b[1], b[2], depth + 1) if b and b[0] == "from" else None

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


def _top_statements(tree: ast.AST):
    """A module's top-level statements, those inside top-level if/try/with blocks too."""
    stack = list(getattr(tree, "body", []))
    while stack:
        s = stack.pop(0)
        yield s
        if isinstance(s, (ast.If, ast.Try, ast.With)):
            stack += [*s.body, *getattr(s, "orelse", []), *getattr(s, "finalbody", []),
                      *[x for h in getattr(s, "handlers", []) for x in h.body]]


def _builds_cls(node: ast.AST | None) -> bool:
    """A classmethod that calls its own first argument (`cls(...)`): it builds an instance of its class."""
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not node.args.args or not any(
            isinstance(d, ast.Name) and d.id == "classmethod" for d in node.decorator_list):
        return False
    first = node.args.args[0].arg
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == first
               for n in ast.walk(node))


def _first(node: ast.AST) -> int:
    decos = getattr(node, "decorator_list", [])
    return min([node.lineno] + [d.lineno for d in decos])


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
