"""The wrapper of every task body: one-line errors instead of tracebacks, the exit-code table applied, one Ctrl-C
policy (exit 130 with one `interrupted` line naming the run directory when there is one)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from invoke.exceptions import Exit

from env.protocol import exits, lines
from env.protocol.invoke_parse_hook import (  # noqa: F401 - the names tasks and tests use
    forwarded_args,
    remainder_args,
    split_forwarded,
    task_help_request,
)
from env.settings import UsageError

# Kept for callers that still import them from here; the table is env/protocol/exits.py.
EXIT_PASS, EXIT_FAIL, EXIT_BAD_USAGE, EXIT_BLOCKED = exits.PASS, exits.FAIL, exits.BAD_USAGE, exits.BLOCKED
EXIT_BY_RESULT = exits.BY_RESULT


def task_remainder(c: Any) -> str:
    """The Hydra overrides after `--` as one shell-quoted string: `shlex.split` gives back the tokens as given
    (an override holding a space stays one token)."""
    import shlex

    return shlex.join(remainder_args(c))


def one_line_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a task body: UsageError -> exit 2 with one line; an int return value becomes the exit code;
    Ctrl-C -> `interrupted` (with the run directory when one was announced), exit 130; closed stdout -> 141."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from env.protocol.invoke_parse_hook import closed_stdout_exit, interrupt_as_keyboard_interrupt

        interrupt_as_keyboard_interrupt()
        try:
            code = func(*args, **kwargs)
        except UsageError as e:
            raise Exit(f"error: {e}", code=exits.BAD_USAGE) from None
        except BrokenPipeError:  # output piped into `head` and the like: not an error of ours
            closed_stdout_exit()
        except KeyboardInterrupt:
            raise Exit(lines.interrupted_line(lines.announced_run_dir()), code=exits.INTERRUPTED) from None
        if isinstance(code, int) and code != 0:
            if code == exits.INTERRUPTED:
                raise Exit(lines.interrupted_line(lines.announced_run_dir()), code=code)
            raise Exit(code=code)
        return None

    return wrapper


def print_error(message: str) -> None:
    print(f"error: {message}", file=sys.stderr, flush=True)
