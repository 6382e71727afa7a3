"""Every task's flags, declared once: a table of `Flag`s (type, range, choices, path, forwarded by `plan`) and the
rules between them (conflicts, requirements). The invoke task is generated from the table (signature, help) and
its values are validated from it before the body runs: every refusal is one line, exit 2, nothing changed.

The same validation runs on a forwarded task line (`invoke remote --host H level0 --steps abc`) before anything is
synced or submitted (env/protocol/invoke_parse_hook.py). Checks that need the filesystem (does --baseline exist?)
stay in the task bodies: a forwarded line's paths are the remote host's.
"""

from __future__ import annotations

import inspect
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from env.settings import UsageError

KINDS = ("str", "int", "float", "bool", "path", "choice", "list", "model")
MODEL_RE = re.compile(r"[\w.\-]+/[\w.\-]+")


@dataclass(frozen=True)
class Flag:
    name: str
    default: Any
    help: str
    levels: tuple[int, ...] | None = None  # level tasks: None = every level
    setting: bool = False  # a settings-table entry (env/settings.py)
    kind: str = "str"  # one of KINDS; bool when the default is a bool
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] | None = None
    path: bool = False  # a local path: Slurm mounts it, remote rewrites it
    forward: bool = False  # `plan` passes it to every level it runs
    required: bool = False
    nonempty: bool = False  # a given value must not be empty

    def __post_init__(self) -> None:
        assert self.kind in KINDS, self.kind
        if isinstance(self.default, bool):
            object.__setattr__(self, "kind", "bool")
        if self.kind == "path":
            object.__setattr__(self, "path", True)

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def takes_value(self) -> bool:
        return self.kind != "bool"

    def signature_default(self) -> Any:
        """What invoke sees: None for typed flags (the table converts, so `--level abc` is ours to refuse)."""
        if self.kind == "bool":
            return bool(self.default)
        if self.kind == "list":
            return None
        return None if self.kind in ("int", "float") else self.default


@dataclass(frozen=True)
class FlagTable:
    flags: tuple[Flag, ...]
    conflicts: tuple[tuple[str, str], ...] = ()  # (a, b): not both
    requires: tuple[tuple[str, str], ...] = ()  # (a, b): a only with b
    why: Mapping[tuple[str, str], str] = field(default_factory=dict)  # a rule's reason, said in its error

    def __post_init__(self) -> None:
        names = [f.name for f in self.flags]
        assert len(names) == len(set(names)), names
        for a, b in (*self.conflicts, *self.requires):
            assert a in names and b in names, (a, b)

    def __iter__(self):
        return iter(self.flags)

    def by_name(self) -> dict[str, Flag]:
        return {f.name: f for f in self.flags}

    def names(self) -> list[str]:
        return [f.name for f in self.flags]


def given(flag: Flag, value: Any) -> bool:
    """Did the user give this flag (a value other than 'not given')?"""
    if flag.kind == "bool":
        return bool(value) and not flag.default
    return value is not None and value != [] and value != ()


def _n(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _range(flag: Flag, value: float, raw: Any) -> None:
    lo, hi = flag.minimum, flag.maximum
    if lo is not None and hi is not None and not lo <= value <= hi:
        raise UsageError(f"{flag.option} must be between {_n(lo)} and {_n(hi)}, got {raw}")
    if lo is not None and not value >= lo:
        raise UsageError(f"{flag.option} must be >= {_n(lo)}, got {raw}")
    if hi is not None and not value <= hi:
        raise UsageError(f"{flag.option} must be <= {_n(hi)}, got {raw}")


def convert(flag: Flag, raw: Any) -> Any:
    """One flag's value as the body gets it (None = not given); UsageError with one line otherwise."""
    if flag.kind == "bool":
        return bool(raw)
    if raw is None:
        return flag.default if flag.kind != "list" else []
    if flag.kind == "list":
        items = list(raw) if isinstance(raw, (list, tuple)) else [raw]
        return [str(x) for x in items]
    text = str(raw)
    if flag.nonempty and not text.strip():
        raise UsageError(f"{flag.option} needs a value, got an empty one")
    if flag.kind == "int":
        try:
            value = int(text.strip())
        except ValueError:
            raise UsageError(f"{flag.option} must be an integer, got {text!r}") from None
        _range(flag, value, text)
        return value
    if flag.kind == "float":
        try:
            number = float(text.strip())
        except ValueError:
            raise UsageError(f"{flag.option} must be a number, got {text!r}") from None
        if math.isnan(number) or math.isinf(number):
            raise UsageError(f"{flag.option} must be a finite number, got {text!r}")
        _range(flag, number, text)
        return number
    if flag.kind == "choice":
        assert flag.choices
        if text not in flag.choices:
            raise UsageError(f"{flag.option} must be one of {', '.join(flag.choices)}, got {text!r}")
        return text
    if flag.kind == "model":
        if not MODEL_RE.fullmatch(text):
            raise UsageError(f"{flag.option} must look like ORG/NAME, got {text!r}")
        return text
    if flag.kind == "path" and not text.strip():
        raise UsageError(f"{flag.option} needs a path, got an empty one")
    return text


def validate(table: FlagTable | Iterable[Flag], values: Mapping[str, Any]) -> dict[str, Any]:
    """Convert and check every flag of a task; unknown names, bad types/ranges/choices and conflicts: UsageError."""
    if not isinstance(table, FlagTable):
        table = FlagTable(tuple(table))
    flags = table.by_name()
    unknown = set(values) - set(flags)
    if unknown:
        raise UsageError(f"unknown flag(s): {', '.join('--' + n.replace('_', '-') for n in sorted(unknown))}")
    out: dict[str, Any] = {}
    for flag in table.flags:
        raw = values.get(flag.name)
        if flag.required and (raw is None or (isinstance(raw, str) and not raw.strip())):
            raise UsageError(f"{flag.option} is required")
        if flag.required and isinstance(raw, str) and raw.startswith("-") and not os.path.exists(raw):
            # invoke hands an unknown flag to a required positional argument (`judge --bogus`)
            raise UsageError(f"No idea what {raw!r} is! ({flag.option} not given)")
        out[flag.name] = convert(flag, raw)
    shown = {f.name for f in table.flags if given(f, values.get(f.name))}
    for a, b in table.conflicts:
        if a in shown and b in shown:
            why = table.why.get((a, b))
            raise UsageError(f"{flags[a].option} and {flags[b].option} contradict each other"
                             + (f": {why}" if why else ""))
    for a, b in table.requires:
        if a in shown and b not in shown:
            why = table.why.get((a, b))
            raise UsageError(f"{flags[a].option} needs {flags[b].option}" + (f": {why}" if why else ""))
    return out


# task name -> its flag table, as the tasks are declared (tasks.py): what launchers read a forwarded line's paths from
DECLARED: dict[str, FlagTable] = {}


def path_options(task: str) -> tuple[str, ...]:
    """The `--options` of `task` that take a local path (Slurm mounts them, a remote line makes them absolute)."""
    name = task.replace("_", "-")
    if name not in DECLARED:  # outside invoke (a test, a bench), where only some tasks were made: tasks.py declares all
        import importlib  # noqa: PLC0415

        importlib.import_module("tasks")
    table = DECLARED.get(name)
    return tuple(f.option for f in table.flags if f.path) if table else ()


def task_from_table(table: FlagTable, body: Callable[..., Any], *, name: str, doc: str,
                    auto_shortflags: bool = False, validated: bool = True) -> Any:
    """An invoke task named `name` whose flags, help and signature are the table's; its body gets the validated
    values as keyword arguments (`validated=False`: as invoke parsed them, for a body that validates itself)."""
    from invoke import task

    from env.protocol.errors import one_line_errors

    def wrapper(c, **kwargs):
        values = validate(table, kwargs) if validated else kwargs
        return body(c, **values)

    params = [inspect.Parameter("c", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    # a required flag has no default: invoke also takes it as a positional argument (`invoke report RUN_DIR`)
    params += [inspect.Parameter(f.name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                 default=inspect.Parameter.empty if f.required else f.signature_default())
               for f in table.flags]
    params.sort(key=lambda p: p.default is not inspect.Parameter.empty)  # Python: no default before a default
    wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    wrapper.__name__ = wrapper.__qualname__ = name
    wrapper.__doc__ = doc
    wrapper.__module__ = getattr(body, "__module__", __name__)
    wrapped = one_line_errors(wrapper)
    wrapped.__signature__ = wrapper.__signature__  # type: ignore[attr-defined]
    wrapped.flag_table = table  # type: ignore[attr-defined]
    DECLARED[name.replace("_", "-")] = table
    iterable = [f.name for f in table.flags if f.kind == "list"]
    return task(help={f.name: f.help for f in table.flags}, auto_shortflags=auto_shortflags,
                iterable=iterable)(wrapped)


def declare(table: FlagTable, *, auto_shortflags: bool = False, name: str | None = None):
    """Decorator form for tasks.py: `@declare(TABLE) def judge(c, **flags): ...` (the docstring is the task's)."""

    def deco(body: Callable[..., Any]) -> Any:
        return task_from_table(table, body, name=name or body.__name__, doc=inspect.getdoc(body) or "",
                               auto_shortflags=auto_shortflags)

    return deco
