"""What changed code does: the identifiers of its changed code lines (never comments, strings or imports), what the
changed unit is about (its subject: name, class, the conditions its changed lines run under), read with `ast`.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass, field

from sessions.plan.index import Unit, _unit_nodes

NAME_LIKE = re.compile(r"(?=[^ ]*[A-Za-z])[\w.*\-]{2,120}")
WORD_SPLIT = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")


def words_of(identifier: str) -> list[str]:
    """`MTP_CONFIG_FIELDS` → mtp config fields; `gatherFromEPRanks` → gather from ep ranks (lower case)."""
    return [w.lower() for w in WORD_SPLIT.findall(identifier)]


def topic_in(topic: str, words) -> bool:
    """Are a topic's words all words of an identifier? A topic that names a direction (`megatron to hf`) must read in
    that order: `hf_to_megatron` is the other way."""
    t = topic.split()
    ws = list(words)
    if not set(t) <= set(ws):
        return False
    if "to" not in t:
        return True
    return any(ws[i:i + len(t)] == t for i in range(len(ws) - len(t) + 1))


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


# Parallel settings: switched off they still change what runs under TP/PP/CP/EP > 1 (`sequence_parallel = False`
# in a vision encoder), unlike a feature switched off (`mtp_num_layers = None`: no MTP).
PARALLEL_SETTINGS = ("sequence parallel", "tensor parallel", "pipeline parallel", "context parallel",
                     "expert parallel", "tp", "pp", "cp", "ep", "etp", "vpp")


# ... and so does a parameter's trainability switched off (`p.requires_grad = False` freezes it).
OFF_STILL_COUNTS = ("requires grad",)


def _parallel_setting(n: ast.AST) -> bool:
    if isinstance(n, ast.keyword):
        names = [n.arg or ""]
    else:
        targets = n.targets if isinstance(n, ast.Assign) else [n.target]
        names = [x.attr if isinstance(x, ast.Attribute) else x.id for t in targets for x in ast.walk(t)
                 if isinstance(x, (ast.Attribute, ast.Name))][:1]
    return words_hit(names, PARALLEL_SETTINGS + OFF_STILL_COUNTS)


def _silenced(tree: ast.AST) -> set[int]:
    """Nodes whose names never count: pass-through keywords, features switched off, import statements."""
    skip: set[int] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.keyword) and (_pass_through(n) or (_switched_off(n.value) and not _parallel_setting(n))):
            skip.update(id(x) for x in ast.walk(n))
        elif isinstance(n, (ast.Assign, ast.AnnAssign)) and _switched_off(n.value) and not _parallel_setting(n):
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
    strings: list[str] = field(default_factory=list)  # name-like strings of the changed code (parameter names of a
    # mapping table, HF config keys): what the code converts, never prose (no spaces) nor a docstring
    conditions: list[str] = field(default_factory=list)  # source of the conditions the changed lines run under
    targets: list[str] = field(default_factory=list)  # what the edited statements set (assignment targets and
    # keyword arguments of changed lines)
    name: list[str] = field(default_factory=list)  # the unit's own names (class and method apart)
    exits: list[str] = field(default_factory=list)  # names of early exits before the changed lines: what they rule
    # out is no subject, but a size they compare (`if self.ep_size == 1: return`) is one the lines after need
    expert_code: list[str] = field(default_factory=list)  # names of changed lines that run only for experts
    namespaced: list[str] = field(default_factory=list)  # imported modules used as namespaces (`tensor_parallel.X`)
    requires: list[str] = field(default_factory=list)  # names of a negated early exit before the changed lines
    uses: list[tuple[str, str | None]] = field(default_factory=list)  # each name of `code` with the expression that
    # uses it (`get_cp_world_size() == 1`; None: a statement or a call's own name uses it directly)
    statements: int = 0  # changed simple statements (imports, assignments, calls...)
    bound_reads: list[str] = field(default_factory=list)  # the settings later code reads from a variable a changed
    # line binds (`hf_config = self.hf_config`, then `getattr(hf_config, "num_nextn_predict_layers")`)
    bound_into: list[str] = field(default_factory=list)  # the calls that then take such a variable as an argument:
    # where the changed value goes (`config = remove_non_pickleables(config)`, then `broadcast_obj_from_pp_rank(config)`)
    only_imports: bool = False  # every changed code line is an import statement
    only_logging: bool = False  # every changed statement is a logging / metrics call (or inside one)
    switches: list[tuple[str, bool]] = field(default_factory=list)  # `self.X` tests that decide whether changed
    # lines run, with the value they need (`if not self.normalize_moe_lora: return` before them: X=True)
    param_gates: dict[str, bool] = field(default_factory=dict)  # the function's parameters every changed line needs
    # a truth value of (`if load_weights:` around them all: load_weights=True); empty: none decides them all


# A condition about experts (`if self.is_expert:`, `if moe_layer:`): the lines under it serve the MoE path.
EXPERT_WORDS = ("expert", "experts", "moe")
# Calls that only report (logging, metrics, profiling ranges): what they print changes nothing a level checks.
REPORTING_WORDS = ("log", "logger", "logging", "print", "warn", "warning", "wandb", "mlflow", "comet",
                   "tensorboard", "nvtx", "timer", "timers", "on save checkpoint success")


def words_hit(names: list[str], table: tuple[str, ...]) -> bool:
    for n in names:
        ws = set(words_of(n))
        if any(set(t.split()) <= ws for t in table):
            return True
    return False


def _exits(body: list[ast.stmt]) -> bool:
    return bool(body) and isinstance(body[-1], (ast.Return, ast.Raise, ast.Continue, ast.Break))


def _blocks(n: ast.AST):
    """A node's own statement lists (a function's body, an if's branches, a loop's body...)."""
    for name in ("body", "orelse", "finalbody"):
        block = getattr(n, name, None)
        if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
            yield block
    for h in getattr(n, "handlers", []) or []:
        yield h.body


def _span(n: ast.AST) -> range:
    return range(n.lineno, (getattr(n, "end_lineno", None) or n.lineno) + 1)


def _is_reporting(stmt: ast.stmt) -> bool:
    """`logger.info(...)`, `wandb_utils.on_save_checkpoint_success(...)`, `print_rank_0(...)`: a call statement
    whose callee only reports."""
    if not isinstance(stmt, ast.Expr) or not isinstance(stmt.value, ast.Call):
        return False
    f = stmt.value.func
    names = [f.id] if isinstance(f, ast.Name) else [f.attr] + [x.id for x in ast.walk(f) if isinstance(x, ast.Name)] \
        if isinstance(f, ast.Attribute) else []
    return words_hit(names, REPORTING_WORDS)


def evidence(unit: Unit, lines: set[int], code: set[int], moved: set[int] = frozenset(),
             namespaces: set[str] = frozenset()) -> Evidence:
    """Identifiers of a unit's changed code lines (`lines`; `code` = the file's lines that hold code) — never
    comments or strings (docstrings included), never a keyword passed through under its own name, never a feature
    set to None/False, never an import, never a line moved unchanged (`moved`: its text is on both sides of the
    diff). Imported modules used as namespaces (`namespaces`: `tensor_parallel.ColumnParallelLinear` builds a
    layer, it reads no parallel size) are noted apart. A changed line inside a longer statement (an entry of a dict literal)
    also counts the names on that statement's first line (what the dict is assigned to).

    The subject: the unit's name (and its class), the conditions of the `if`/`elif`/`while` blocks a changed line
    sits in or changes (`elif ckpt_format == "fsdp_dtensor":` makes a change FSDP-only; the strings such a
    condition compares with count), and for a new function its signature. The early exits before a changed line
    are noted apart (`exits`, with the others in `conditions`): `if self.ep_size == 1: return` makes the lines
    after it run only with EP > 1."""
    ev = Evidence()
    node = unit.node
    ev.name = unit.name.split(".") if unit.kind != "module" else [unit.module.rsplit(".", 1)[-1]]
    ev.subject += ev.name
    if node is None:
        return ev
    skip = _silenced(node)
    own = _unit_nodes(unit)
    span = set(range(unit.start, unit.end + 1)) & code if unit.kind != "module" else set()
    ev.new = bool(span) and span <= lines
    lines = lines - set(moved)
    if ev.new and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
            if a.annotation is not None:  # what it takes and gives (parameter names are only names)
                ev.subject += _names_in(a.annotation, skip)
        if node.returns is not None:
            ev.subject += _names_in(node.returns, skip)
    heads: set[int] = set()
    stmts = [n for n in own if isinstance(n, ast.stmt)]
    for n in stmts:
        if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.If, ast.For, ast.While,
                              ast.With, ast.Try)):
            end = n.end_lineno or n.lineno
            if any(n.lineno < ln <= end for ln in lines):
                heads.add(n.lineno)
    changed = [n for n in stmts if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.If,
                                                      ast.For, ast.While, ast.With, ast.Try))
               and set(_span(n)) & lines]
    ev.statements = len(changed)
    ev.only_imports = bool(changed) and all(isinstance(n, (ast.Import, ast.ImportFrom)) for n in changed)
    reporting = [n for n in changed if _is_reporting(n)]
    ev.only_logging = bool(changed) and all(
        any(set(_span(n)) <= set(_span(r)) for r in reporting) for n in changed)
    counted = lines | heads
    for n in own:
        if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and id(n) not in skip and any(
                n.lineno <= ln <= (n.end_lineno or n.lineno) for ln in lines):
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                ev.targets += _set_names(t)
    docs = {id(b.body[0].value) for b in ast.walk(node) if isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef,
            ast.ClassDef, ast.Module)) and b.body and isinstance(b.body[0], ast.Expr)
            and isinstance(b.body[0].value, ast.Constant)}
    spaces = {id(n.value) for n in own if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
              and n.value.id in namespaces}
    expert_lines = _expert_lines(own, lines, skip)
    parents = {id(c): p for p in own for c in ast.iter_child_nodes(p)}
    for n in own:
        line = getattr(n, "lineno", None)
        if line is None or id(n) in skip or line not in counted:
            continue
        name = None
        if isinstance(n, ast.Name):
            name = n.id
        elif isinstance(n, ast.Attribute):
            name = n.attr
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and line in lines:
            name = n.name
        elif isinstance(n, ast.arg):
            name = n.arg
        elif isinstance(n, ast.keyword) and n.arg:
            name = n.arg
            if line in lines:
                ev.targets.append(n.arg)  # a keyword on a changed line sets that field (`Provider(window_size=...)`)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs \
                and NAME_LIKE.fullmatch(n.value):
            ev.strings.append(n.value)
        if name:
            ev.code.append(name)
            ev.uses.append((name, _use_of(n, parents) if isinstance(n, (ast.Name, ast.Attribute)) else None))
            if line in expert_lines:
                ev.expert_code.append(name)
            if id(n) in spaces:
                ev.namespaced.append(name)
    if not ev.new:
        _conditions(ev, own, lines, skip)
        bound = _changed_bindings(own, lines, skip)
        ev.bound_reads = _bound_reads(own, bound)
        ev.bound_into = _bound_into(own, bound, skip)
    ev.switches = _switches(own, lines)
    if unit.kind in ("function", "method"):
        ev.param_gates = _param_gates(node, own, lines)
    return ev


def _tested(test: ast.AST, truth: bool, leaf) -> list[tuple[str, bool]]:
    """The values of the names `leaf` reads off a test's operands (`self.a`, a parameter `x`) that make `test` come
    out `truth`, where the test alone decides them (`not self.a or x` false needs a=True; `self.a and x` true needs
    a=True; `self.a or x` true needs nothing certain)."""
    name = leaf(test)
    if name is not None:
        return [(name, truth)]
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _tested(test.operand, not truth, leaf)
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) == truth:  # every operand has that value
        return [v for operand in test.values for v in _tested(operand, truth, leaf)]
    return []


def _self_attr(n: ast.AST) -> str | None:
    return n.attr if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self" else None


def _tests_deciding(own: list[ast.AST], lines: set[int]):
    """(test, the value it needs) for each test that decides whether a changed line runs: the `if`s around it
    (body: true, else: false) and the early exits before it (false)."""
    for n in own:
        if isinstance(n, ast.If):
            if any(set(_span(b)) & lines for b in n.body):
                yield n.test, True
            if any(set(_span(b)) & lines for b in n.orelse):
                yield n.test, False
    for s in _exits_before(own, lines):
        yield s.test, False


def _param_gates(node: ast.AST, own: list[ast.AST], lines: set[int]) -> dict[str, bool]:
    """The parameters of the function `node` that every changed line needs one truth value of (`_tests_deciding`),
    on a parameter the body never rebinds."""
    a = node.args
    params = {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}
    bound = [t for n in own if isinstance(n, ast.Assign) for t in n.targets] + [
        n.target for n in own if isinstance(n, (ast.AugAssign, ast.AnnAssign, ast.For, ast.NamedExpr))]
    params -= {x.id for t in bound for x in ast.walk(t) if isinstance(x, ast.Name)}

    def param(n: ast.AST) -> str | None:
        return n.id if isinstance(n, ast.Name) and n.id in params else None

    gates: dict[str, bool] | None = None
    for line in sorted(lines):
        need = dict(v for test, truth in _tests_deciding(own, {line}) for v in _tested(test, truth, param))
        gates = need if gates is None else {k: v for k, v in gates.items() if need.get(k) == v}
        if not gates:
            return {}
    return gates or {}


def _switches(own: list[ast.AST], lines: set[int]) -> list[tuple[str, bool]]:
    """The object's own settings a changed line needs to run: the `self.X` tests that decide it (`_tests_deciding`:
    `if not self.normalize_moe_lora or not is_expert: return self.dim` before it)."""
    return list(dict.fromkeys(v for test, truth in _tests_deciding(own, lines)
                              for v in _tested(test, truth, _self_attr)))


def _changed_bindings(own: list[ast.AST], lines: set[int], skip: set[int]) -> dict[str, int]:
    """variable -> the last line of its first changed binding (`x = ...` on a changed line)."""
    bound: dict[str, int] = {}
    for n in own:
        if isinstance(n, (ast.Assign, ast.AnnAssign)) and id(n) not in skip and set(_span(n)) & lines:
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                if isinstance(t, ast.Name):
                    bound[t.id] = min(bound.get(t.id, 1 << 30), n.end_lineno or n.lineno)
    return bound


def _bound_into(own: list[ast.AST], bound: dict[str, int], skip: set[int]) -> list[str]:
    """The functions called, after it, with a variable a changed line binds (`bound`) as an argument: the changed
    value goes there (`config = remove_non_pickleables(config)`, then `self.broadcast_obj_from_pp_rank(config)`:
    what the PP broadcast sends changed), changed or not."""
    out: list[str] = []
    for n in own:
        if isinstance(n, ast.Call) and id(n) not in skip and any(
                isinstance(a, ast.Name) and a.id in bound and n.lineno > bound[a.id]
                for a in [*n.args, *(k.value for k in n.keywords)]):
            f = n.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            if name:
                out.append(name)
    return list(dict.fromkeys(out))


def _bound_reads(own: list[ast.AST], bound: dict[str, int]) -> list[str]:
    """The settings read, after it, from a variable a changed line binds (`bound`): `hf_config = self.hf_config`
    changes what `getattr(hf_config, "num_nextn_predict_layers", 0)`, `hf_config.num_hidden_layers`, `cfg.get("x")`
    and `cfg["x"]` read on the lines after it, changed or not — the value they are read from is the changed line's."""
    if not bound:
        return []

    def read_from(v: ast.AST, at: int) -> bool:
        return isinstance(v, ast.Name) and v.id in bound and at > bound[v.id]

    out: list[str] = []
    for n in own:
        at = getattr(n, "lineno", 0)
        if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load) and read_from(n.value, at):
            out.append(n.attr)
        elif isinstance(n, ast.Call) and n.args:
            f = n.func
            key = n.args[1] if isinstance(f, ast.Name) and f.id in ("getattr", "hasattr") and len(n.args) > 1 \
                and read_from(n.args[0], at) else \
                n.args[0] if isinstance(f, ast.Attribute) and f.attr == "get" and read_from(f.value, at) else None
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                out.append(key.value)
        elif isinstance(n, ast.Subscript) and read_from(n.value, at) and isinstance(n.slice, ast.Constant) \
                and isinstance(n.slice.value, str):
            out.append(n.slice.value)
    return [name for name in dict.fromkeys(out) if NAME_LIKE.fullmatch(name)]


def _use_of(n: ast.AST, parents: dict[int, ast.AST]) -> str | None:
    """The expression a name is used in: past the attribute chain and the call it names (`parallel_state.
    get_context_parallel_world_size()`), the comparison, operation or call that takes it (`... == 1`). None when a
    statement uses it directly (`x = tp_size`): any edit of that statement is an edit of its use."""
    cur = n
    while (p := parents.get(id(cur))) is not None and not isinstance(p, ast.stmt):
        if isinstance(p, (ast.Attribute, ast.keyword)) or (isinstance(p, ast.Call) and p.func is cur):
            cur = p
            continue
        return ast.unparse(p)
    return None


def _expert_lines(own: list[ast.AST], lines: set[int], skip: set[int]) -> set[int]:
    """Changed lines that run only under a condition about experts (the body of `if self.is_expert:`)."""
    out: set[int] = set()
    for n in own:
        if isinstance(n, ast.If) and words_hit(_names_in(n.test, skip, strings=True), EXPERT_WORDS) and not any(
                isinstance(u, ast.UnaryOp) and isinstance(u.op, ast.Not) for u in ast.walk(n.test)):
            for b in n.body:
                out.update(set(_span(b)) & lines)
    return out


def _exits_when_trivial(test: ast.AST) -> bool:
    """`size == 1` / `size <= 1` / `size < 2`: the code after the exit runs only with a size above one. (An exit on
    `size != 1` / `size > 1` leaves the code after it to size one: the default settings reach it.)"""
    for c in ast.walk(test):
        if isinstance(c, ast.Compare) and len(c.ops) == 1 and isinstance(c.comparators[0], ast.Constant) \
                and type(c.comparators[0].value) is int:
            op, k = c.ops[0], c.comparators[0].value
            if (isinstance(op, ast.Eq) and k == 1) or (isinstance(op, ast.LtE) and k == 1) or (
                    isinstance(op, ast.Lt) and k == 2):
                return True
    return False


def _conditions(ev: Evidence, own: list[ast.AST], lines: set[int], skip: set[int]) -> None:
    """The conditions the changed lines run under: enclosing `if`/`while` tests and earlier early exits."""
    for n in own:
        if isinstance(n, (ast.If, ast.While)):
            test_lines = set(range(n.test.lineno, (n.test.end_lineno or n.test.lineno) + 1))
            # `not is_modelopt_linear(m)`: what the change is not about
            negated = {id(x) for u in ast.walk(n.test) if isinstance(u, ast.UnaryOp) and isinstance(u.op, ast.Not)
                       for x in ast.walk(u.operand)}
            negated |= {id(x) for u in ast.walk(n.test) if isinstance(u, ast.Compare) and len(u.ops) == 1
                        and isinstance(u.ops[0], ast.NotIn) for x in ast.walk(u.left)}  # `".adapter." not in p`
            names = _names_in(n.test, skip | negated, strings=True)
            in_body = any(b.lineno <= ln <= (b.end_lineno or b.lineno) for b in n.body for ln in lines)
            in_else = any(b.lineno <= ln <= (b.end_lineno or b.lineno) for b in n.orelse for ln in lines)
            trivial = _exits_when_trivial(n.test)  # `if self.tp_size == 1:` holds at the default settings
            if in_body and not trivial:
                ev.conditions.append(ast.unparse(n.test)[:200])
            if in_else and trivial:
                ev.conditions.append(f"not ({ast.unparse(n.test)[:190]})")
            if test_lines & lines:
                ev.guards += names  # an edited condition: compared with the old one by the caller
            elif in_else:  # the else of `if not isinstance(p, DTensor):` runs for DTensors: the negated names count
                ev.subject += _names_in(n.test, skip, strings=True)
            elif in_body and not trivial:
                ev.subject += names
    for s in _exits_before(own, lines):
        # `if self.ep_size == 1: return ...` before a changed line: that line runs only when the test is false
        if set(_span(s)) & lines:
            continue
        # (only an exit on a trivial size says what reaching the line takes; other exits check inputs)
        if _exits_when_trivial(s.test):
            ev.conditions.append(f"not ({ast.unparse(s.test)[:190]})")
            ev.exits += _names_in(s.test, skip)
        elif isinstance(s.test, ast.UnaryOp) and isinstance(s.test.op, ast.Not):
            # `if not isinstance(p, DTensor): return` before a changed line: the line runs only for DTensors
            # (what it requires is what it is about; no parallel size: Level 2 reads only sizes' exits)
            ev.requires += _names_in(s.test.operand, skip, strings=True)


def _exits_before(own: list[ast.AST], lines: set[int]):
    """The early exits (`if ...: return|raise|continue|break`, no else) with a changed line after them in their
    block: that line runs only when the exit's test is false."""
    for block in {id(b): b for n in own for b in _blocks(n)}.values():
        for i, s in enumerate(block):
            if isinstance(s, ast.If) and not s.orelse and _exits(s.body) and \
                    any(set(_span(later)) & lines for later in block[i + 1:]):
                yield s


def _set_names(t: ast.AST) -> list[str]:
    """What an assignment target sets: the field (`provider.window_size = ...` sets window_size), the variable."""
    if isinstance(t, (ast.Tuple, ast.List)):
        return [x for e in t.elts for x in _set_names(e)]
    if isinstance(t, ast.Attribute):
        return [t.attr]
    if isinstance(t, ast.Name):
        return [t.id]
    if isinstance(t, (ast.Subscript, ast.Starred)):
        return _set_names(t.value)
    return []


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
