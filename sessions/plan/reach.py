"""What verl reaches of a Megatron-Bridge checkout (sessions/plan/index.py indexes it), read with `ast`.

Reachability from verl's surface (sessions/plan/verl_surface.py) is a fixpoint:
- importing a module runs its top-level code and every class statement in it (registrations, decorators), and the
  packages above it; module code naming a class or function without calling it (or handing it to a call) builds and
  runs nothing, until reached code reads the table that names it (`spec = ModuleSpec(module=FalconH1Layer)`);
- a reached unit reaches what it references; a class it references becomes *live*;
- a method of a live class is reached when its name is used as an attribute by reached code or by verl (or it is
  called implicitly: dunders, `forward`); a subclass, in an imported module, of a live class is live too (registries
  and overrides dispatch to it).
Every reached unit keeps the step that reached it, so a path back to verl's import can be shown.

Per-entry reachability (`calls_from`) follows only calls and references from one of verl's entry points (no import
side effects): it says which of verl's uses (weight export, HF import, PEFT, checkpointing...) run a changed unit.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from sessions.plan.evidence import EXPERT_WORDS, Evidence, code_lines, evidence, words_hit, words_of  # noqa: F401 (re-exported)
from sessions.plan.index import BridgeIndex, Unit, _is_implicit, module_name  # noqa: F401 (re-exported)

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
                    elif u.hf_registered:
                        make_live(k, Step(key, "registered with transformers' AutoConfig on import: HF builds it "
                                               "when a checkpoint of its model type loads"))
                    live_base = next((b for b in u.bases if b in r.live), None)
                    if live_base:
                        make_live(k, Step(live_base, f"subclass of {index.units[live_base].name}"))
        # A class statement runs on import, but its body's values (dataclass defaults, factories) matter only
        # once the class is used: until then only its decorators count.
        dormant = unit.kind == "class" and key not in r.live
        for name in () if dormant else unit.attrs:
            use_attr(name, unit.key)
        # a module-level table the unit reads (`falconh1_stack_spec`): what it names is built from it
        for var in () if dormant or unit.kind == "module" else sorted(unit.var_refs):
            mod, _, name = var.rpartition(".")
            info = index.modules.get(mod)
            for ref in sorted(info.table_refs.get(name, ())) if info else ():
                target = index.unit(ref)
                if target is not None:
                    if target.kind == "class":
                        make_live(ref, Step(key, f"named by the table {name} it reads"))
                    visit(ref, Step(key, f"named by the table {name} it reads"))
        for ref in sorted(unit.deco_refs if dormant else unit.refs):
            target = index.unit(ref)
            if target is None:
                continue
            step = Step(key, "imports" if target.kind == "module" else "references")
            # module code naming a class without calling it (a table of builders) makes no instance, and naming a
            # function without calling it or handing it to a call (a table of adapters) runs nothing
            if target.kind == "class" and (unit.kind != "module" or ref in unit.called):
                make_live(ref, step)
            if target.kind == "function" and unit.kind == "module" and ref not in unit.called | unit.passed:
                continue
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
