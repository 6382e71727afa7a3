"""The launcher interface: one way to run a task elsewhere, implemented by local.py, remote.py and slurm.py.

Modelled on NeMo-Run's executors: one small interface, one file per backend. A launcher is built from a parsed
`TaskLine` (the forwarded `<task> [args] [-- overrides]`, parsed once, here) and its own options, and offers:
- `plan()`: everything it will do, as data (`LaunchPlan.describe()` is what `--dry-run` prints; tests check it);
- `run_attached(plan)`: run in the foreground, stream the output, return the task's exit code;
- `submit(plan)` / `status(job)` / `logs(job, follow)`: where the backend can run detached (Slurm), else refused.

What every backend shares lives here too: run-directory discovery in a child's output (ONE function,
`run_dirs_in`, to be pointed at env/protocol once the protocol lines are consolidated there), the exit-code mapping
(env/protocol/cli.py's EXIT_BY_RESULT) and "blocked by the place we run in, not a verdict" (exit 3).
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from env.protocol import exits, lines
from env.settings import TOOL_PREFIX, UsageError

EXIT_PASS, EXIT_FAIL, EXIT_BAD_USAGE, EXIT_BLOCKED = exits.PASS, exits.FAIL, exits.BAD_USAGE, exits.BLOCKED
EXIT_INTERRUPTED, EXIT_BY_RESULT = exits.INTERRUPTED, exits.BY_RESULT

__all__ = ["EXIT_BAD_USAGE", "EXIT_BLOCKED", "EXIT_BY_RESULT", "EXIT_FAIL", "EXIT_PASS", "LaunchPlan", "Launcher",
           "TaskLine", "blocked", "exit_code_of", "run_dirs_in", "say"]

# `[verl-e2e] run directory: <path>`: what a level prints first and last (sessions/run). The one place that reads it.


def run_dirs_in(output: bytes | str | Path | Iterable[bytes]) -> list[str]:
    """Every run directory a child's output names, in order (a level names its own first and last; callers take
    the last, or all of them for a plan that runs several levels). Accepts the output, a log file, or lines."""
    if isinstance(output, Path):
        if not output.is_file():
            return []
        with open(output, "rb") as f:
            return run_dirs_in(iter(f))
    if isinstance(output, str):
        output = output.encode()
    chunks = [output] if isinstance(output, bytes) else output
    found: list[str] = []
    for chunk in chunks:  # the one parser of the protocol's `run directory:` line (env/protocol/lines.py)
        for line in chunk.replace(b"\r", b"\n").split(b"\n"):
            if (path := lines.find_run_dir_bytes(line)) is not None:
                found.append(path)
    return found


def exit_code_of(result: str | None, fallback: int = EXIT_FAIL) -> int:
    """The exit code of a result name (Pass / Fail / Blocked), as every level and launcher uses it."""
    return EXIT_BY_RESULT.get(result or "", fallback)


def say(msg: str, err: bool = False) -> None:
    print(f"{TOOL_PREFIX} {msg}", file=sys.stderr if err else sys.stdout, flush=True)


def blocked(msg: str) -> int:
    """The place we run in stopped the task (cluster, host, allocation): one error line, exit 3, no verdict."""
    print(f"error: {msg}", file=sys.stderr, flush=True)
    return EXIT_BLOCKED


@dataclass
class TaskLine:
    """The forwarded task line, parsed once: `<task> [args]` plus Hydra overrides after `--`."""

    task: str
    args: list[str] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)

    @classmethod
    def parse(cls, tokens: list[str], remainder: str = "", *, launcher: str,
              not_forwardable: tuple[str, ...] = ()) -> TaskLine:
        """From invoke's forwarded tokens and its `--` remainder (space-joined; split as a shell would)."""
        tokens = list(tokens)
        overrides: list[str] = []
        if "--" in tokens:
            i = tokens.index("--")
            tokens, overrides = tokens[:i], tokens[i + 1:]
        try:
            overrides += shlex.split(remainder or "")
        except ValueError as e:
            raise UsageError(f"cannot parse the overrides after --: {e}") from None
        if not tokens:
            raise UsageError(f"name the task to run: invoke {launcher} [flags] <task> [args], e.g. "
                             f"invoke {launcher} level0")
        task = tokens[0]
        if task.startswith("-") or not re.fullmatch(r"[\w.-]+", task):
            raise UsageError(f"{task!r} is not a task name (invoke {launcher} [flags] <task> [args])")
        if task in not_forwardable:
            raise UsageError(f"`invoke {launcher} {task}` makes no sense: run `invoke {task}` where you are")
        return cls(task=task, args=tokens[1:], overrides=overrides)

    @property
    def tokens(self) -> list[str]:
        """`[task, *args]`, then `--` and the overrides when there are any: what the child invoke gets."""
        return [self.task, *self.args, *(["--", *self.overrides] if self.overrides else [])]

    def __str__(self) -> str:
        return shlex.join(self.tokens)

    def flag_values(self, flag: str) -> list[str]:
        """Values of `flag` among the args (`--flag V` or `--flag=V`)."""
        out = []
        for i, tok in enumerate(self.args):
            if tok == flag and i + 1 < len(self.args):
                out.append(self.args[i + 1])
            elif tok.startswith(flag + "="):
                out.append(tok.split("=", 1)[1])
        return out

    def with_overrides(self, extra: list[str]) -> TaskLine:
        """The same line with `extra` overrides appended last (later wins in Hydra)."""
        return TaskLine(self.task, list(self.args), [*self.overrides, *extra])

    def without_flags(self, flags: tuple[str, ...]) -> tuple[TaskLine, dict[str, str]]:
        """The line without `flags` (and their values), and those values: flags that name local things."""
        kept, taken, i = [], {}, 0
        while i < len(self.args):
            token = self.args[i]
            name, eq, value = token.partition("=")
            if name in flags:
                if not eq:
                    if i + 1 >= len(self.args):
                        raise UsageError(f"{name} needs a value")
                    value, i = self.args[i + 1], i + 1
                taken[name] = value
            else:
                kept.append(token)
            i += 1
        return TaskLine(self.task, kept, list(self.overrides)), taken

    def absolutized(self, flags: tuple[str, ...], cwd_note: str, notes: list[str]) -> TaskLine:
        """Relative path values of `flags` made absolute here (the task runs elsewhere, in another folder)."""
        out = list(self.args)
        for i, tok in enumerate(out):
            for flag in flags:
                if tok == flag and i + 1 < len(out) and not os.path.isabs(os.path.expanduser(out[i + 1])):
                    new = str(Path(out[i + 1]).absolute())
                    notes.append(f"{flag} {out[i + 1]} → {new} ({cwd_note})")
                    out[i + 1] = new
                elif tok.startswith(flag + "=") and not os.path.isabs(os.path.expanduser(tok.split("=", 1)[1])):
                    new = str(Path(tok.split("=", 1)[1]).absolute())
                    notes.append(f"{flag} {tok.split('=', 1)[1]} → {new} ({cwd_note})")
                    out[i] = f"{flag}={new}"
        return TaskLine(self.task, out, list(self.overrides))


class LaunchPlan(ABC):
    """What a launcher will do, as data. `describe()` is the dry-run's text."""

    line: TaskLine
    notes: list[str]
    warnings: list[str]

    @abstractmethod
    def describe(self) -> str: ...


class Launcher(ABC):
    """One place to run a task. Subclasses: LocalLauncher, RemoteLauncher, SlurmLauncher."""

    name: str = "?"
    can_detach: bool = False

    @abstractmethod
    def plan(self) -> LaunchPlan: ...

    @abstractmethod
    def run_attached(self, plan: LaunchPlan) -> int: ...

    def submit(self, plan: LaunchPlan) -> int:
        raise UsageError(f"`invoke {self.name}` cannot run detached")

    def status(self, job: str) -> int:
        raise UsageError(f"`invoke {self.name}` has no detached jobs to ask about")

    def logs(self, job: str, follow: bool = False) -> int:
        raise UsageError(f"`invoke {self.name}` has no detached jobs to ask about")

    def launch(self, *, dry_run: bool = False, detach: bool = False) -> int:
        """The flow every backend shares: plan, say what it noticed, then print it, submit it or run it."""
        if detach and not self.can_detach:
            raise UsageError(f"`invoke {self.name}` cannot run detached (--detach)")
        p = self.plan()
        for w in p.warnings:
            say(f"warning: {w}", err=True)
        for n in p.notes:
            say(n)
        if dry_run:
            print(p.describe(), end="" if p.describe().endswith("\n") else "\n")
            return EXIT_PASS
        return self.submit(p) if detach else self.run_attached(p)
