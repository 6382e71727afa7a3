"""Command-line plumbing shared by tasks.py: exit codes and one-line errors instead of tracebacks."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from invoke.exceptions import Exit, ParseError

from env.settings import UsageError

EXIT_PASS, EXIT_FAIL, EXIT_BAD_USAGE, EXIT_BLOCKED = 0, 1, 2, 3
EXIT_BY_RESULT = {"Pass": EXIT_PASS, "Fail": EXIT_FAIL, "Blocked": EXIT_BLOCKED}


def install_parse_error_exit_code() -> None:
    """invoke exits 1 on an unknown flag; SPEC says bad invocation is 2. Called while tasks.py loads."""
    from invoke.program import Program

    if getattr(Program.parse_tasks, "_bad_usage_is_2", False):
        return
    original = Program.parse_tasks

    @functools.wraps(original)
    def parse_tasks(self: Program) -> None:
        try:
            original(self)
        except ParseError as e:
            raise Exit(f"error: {e}", code=EXIT_BAD_USAGE) from None

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
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            raise Exit(code=130) from None
        if isinstance(code, int) and code != 0:
            raise Exit(code=code)
        return None

    return wrapper
