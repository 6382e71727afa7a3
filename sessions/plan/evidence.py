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
    strings: list[str] = field(default_factory=list)  # name-like strings of the changed code (parameter names of a
    # mapping table, HF config keys): what the code converts, never prose (no spaces) nor a docstring
    conditions: list[str] = field(default_factory=list)  # source of the conditions the changed lines run under
    targets: list[str] = field(default_factory=list)  # what the edited statements set (assignment targets)


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
        if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and id(n) not in skip and any(
                n.lineno <= ln <= (n.end_lineno or n.lineno) for ln in lines):
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                ev.targets += [x.id if isinstance(x, ast.Name) else x.attr for x in ast.walk(t)
                               if isinstance(x, (ast.Name, ast.Attribute))][-1:]
    docs = {id(b.body[0].value) for b in ast.walk(node) if isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef,
            ast.ClassDef, ast.Module)) and b.body and isinstance(b.body[0], ast.Expr)
            and isinstance(b.body[0].value, ast.Constant)}
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
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs \
                and NAME_LIKE.fullmatch(n.value):
            ev.strings.append(n.value)
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
                if any(b.lineno <= ln <= (b.end_lineno or b.lineno) for b in n.body for ln in lines):
                    ev.conditions.append(ast.unparse(n.test)[:200])
                if test_lines & lines:
                    ev.guards += names  # an edited condition: compared with the old one by the caller
                elif any(b.lineno <= ln <= (b.end_lineno or b.lineno) for b in [*n.body, *n.orelse] for ln in lines):
                    ev.subject += names
    return ev


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
