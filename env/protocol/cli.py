"""Command-line plumbing shared by tasks.py: exit codes and one-line errors instead of tracebacks."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any

from invoke.exceptions import Exit, ParseError

from env.settings import UsageError

EXIT_PASS, EXIT_FAIL, EXIT_BAD_USAGE, EXIT_BLOCKED = 0, 1, 2, 3
EXIT_BY_RESULT = {"Pass": EXIT_PASS, "Fail": EXIT_FAIL, "Blocked": EXIT_BLOCKED}


# Tasks that run another task elsewhere (`invoke remote --host H level1 --model M`) or at each commit (`invoke
# bisect --good R level0`): everything from the first positional token after their own flags is the forwarded task
# line, not a second local task.
FORWARDING_TASKS = ("remote", "slurm", "bisect")
_forwarded: dict[str, list[str]] = {}
_parsed_remainder: list[str] = []  # [text] once invoke has parsed the command line (see install_parse_error_exit_code)


def forwarded_args(task_name: str) -> list[str]:
    """The task line given after a forwarding task's own flags (empty when none)."""
    return list(_forwarded.get(task_name, []))


def task_remainder(c: Any) -> str:
    """The text after a standalone `--` (Hydra overrides), space-joined as invoke hands it over.

    `c.remainder` exists only from invoke 3; pip resolves invoke 2.2 (fabric 3.2.3 caps invoke < 3). Both versions
    keep it on the core parse result (`Program.core.remainder`), which our parse hook records.
    """
    if _parsed_remainder:
        return _parsed_remainder[0]
    return getattr(c, "remainder", "") or ""


def split_forwarded(tokens: list[str], value_flags: dict[str, set[str]]) -> tuple[list[str], dict[str, list[str]]]:
    """Cut `tokens` after a forwarding task's own flags. value_flags: task -> its flags that take a value."""
    for i, tok in enumerate(tokens):
        if tok.startswith("-"):
            continue
        if tok not in value_flags:
            return tokens, {}  # the first task named is not a forwarding one
        own_flags, j = value_flags[tok], i + 1
        while j < len(tokens) and tokens[j].startswith("-"):
            flag = tokens[j]
            j += 2 if ("=" not in flag and flag in own_flags) else 1
        return tokens[:j], {tok: tokens[j:]} if j < len(tokens) else {}
    return tokens, {}


def task_help_request(tokens: list[str], task_names: set[str]) -> str | None:
    """The task of `invoke judge --help` (to be shown as `invoke --help judge`): invoke itself would hand `--help`
    to a required positional argument (judge's --log, remote's --host, ...) and run the task with it."""
    task = next((t for t in tokens if not t.startswith("-")), None)
    if task in task_names and "--help" in tokens[tokens.index(task) + 1:]:
        return task
    return None


def install_parse_error_exit_code() -> None:
    """invoke exits 1 on an unknown flag; SPEC says bad invocation is 2. Also cuts forwarded task lines.

    Called while tasks.py loads (invoke loads the collection before it parses task arguments).
    """
    from invoke.program import Program

    if getattr(Program.parse_tasks, "_bad_usage_is_2", False):
        return
    original = Program.parse_tasks

    @functools.wraps(original)
    def parse_tasks(self: Program) -> None:
        value_flags = {}
        for name in FORWARDING_TASKS:
            if name in self.collection.tasks:
                flags = set()
                forwarding_task = self.collection[name]
                help_texts = dict(forwarding_task.help)  # get_arguments() pops them; `--help` needs them later
                for arg in forwarding_task.get_arguments():
                    if arg.takes_value:
                        flags.update(("--" if len(n) > 1 else "-") + n.replace("_", "-") for n in arg.names)
                forwarding_task.help = help_texts
                value_flags[name] = flags
        self.core.unparsed, found = split_forwarded(list(self.core.unparsed), value_flags)
        help_task = task_help_request(self.core.unparsed, set(self.collection.task_names))
        if help_task:
            self.core.unparsed = []
        _forwarded.clear()
        _forwarded.update(found)
        _parsed_remainder[:] = [getattr(self.core, "remainder", "") or ""]
        try:
            original(self)
        except ParseError as e:
            raise Exit(f"error: {e}", code=EXIT_BAD_USAGE) from None
        if help_task:
            self.core[0].args.help.value = help_task  # what `--help TASK` sets; invoke prints it next

    parse_tasks._bad_usage_is_2 = True  # type: ignore[attr-defined]
    Program.parse_tasks = parse_tasks  # type: ignore[method-assign]


def one_line_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a task body: UsageError -> exit 2 with one line; an int return value becomes the exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            code = func(*args, **kwargs)
        except UsageError as e:
            raise Exit(f"error: {e}", code=EXIT_BAD_USAGE) from None
        except BrokenPipeError:  # output piped into `head` and the like: not an error of ours
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keep interpreter shutdown from complaining
            raise Exit(code=EXIT_FAIL) from None
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            raise Exit(code=130) from None
        if isinstance(code, int) and code != 0:
            raise Exit(code=code)
        return None

    return wrapper
