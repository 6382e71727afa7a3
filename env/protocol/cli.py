"""What task bodies use from the protocol: the forwarded and remainder arguments (invoke_parse_hook.py), the
exit-code names, one-line error printing. The wrapper of every task body (one_line_errors) is errors.py."""

from __future__ import annotations

import sys
from typing import Any

from env.protocol import exits
from env.protocol.invoke_parse_hook import (  # noqa: F401 - the names tasks and tests use
    forwarded_args,
    remainder_args,
    split_forwarded,
    task_help_request,
)

# Kept for callers that still import them from here; the table is env/protocol/exits.py.
EXIT_PASS, EXIT_FAIL, EXIT_BAD_USAGE, EXIT_BLOCKED = exits.PASS, exits.FAIL, exits.BAD_USAGE, exits.BLOCKED
EXIT_BY_RESULT = exits.BY_RESULT


def task_remainder(c: Any) -> str:
    """The Hydra overrides after `--` as one shell-quoted string: `shlex.split` gives back the tokens as given
    (an override holding a space stays one token)."""
    import shlex

    return shlex.join(remainder_args(c))


def print_error(message: str) -> None:
    print(f"error: {message}", file=sys.stderr, flush=True)
