"""The wrapper of every task body: one-line errors instead of tracebacks, the exit-code table applied, one Ctrl-C
policy (exit 130 with one `interrupted` line naming the run directory when there is one); the SIGINT and closed
stdout handling it shares with the parse hook (invoke_parse_hook.py)."""

from __future__ import annotations

import functools
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from invoke.exceptions import Exit

from env.protocol import exits, lines
from env.settings import UsageError


def _interrupted(_signum: int, _frame: Any) -> None:
    raise Exit(lines.interrupted_line(lines.announced_run_dir()), code=exits.INTERRUPTED)


def interrupt_as_exit() -> None:
    """Until a task body runs, Ctrl-C is `interrupted`, exit 130 (invoke would exit 1 without a word)."""
    try:
        signal.signal(signal.SIGINT, _interrupted)
    except ValueError:  # not the main thread (invoke run inside a test harness): leave signals alone
        pass


def interrupt_as_keyboard_interrupt() -> None:
    """Inside a task body: Ctrl-C is KeyboardInterrupt again (levels, bisect and remote stop what they started)."""
    try:
        if signal.getsignal(signal.SIGINT) is _interrupted:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    except ValueError:
        pass


def closed_stdout_exit() -> None:
    """The reader of stdout went away: stop quietly, exit 141 (no traceback at interpreter shutdown)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    os._exit(exits.CLOSED_STDOUT)


def one_line_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a task body: UsageError -> exit 2 with one line; an int return value becomes the exit code;
    Ctrl-C -> `interrupted` (with the run directory when one was announced), exit 130; closed stdout -> 141."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
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
