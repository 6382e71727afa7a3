"""The one place this tool reaches into invoke: its `Program.parse_tasks` and `Config.load_project`, a SIGINT
handler for the time before a task body runs, and an excepthook for a closed stdout.

Why each is needed (invoke 2.2 and 3.x behave alike here):
- invoke exits 1 on a parse error and lets a value error (`--level abc` against an int default) escape as a
  traceback; this tool's bad usage is one line and exit 2.
- `invoke remote --host H level1 --model M`: everything from the first positional token after a forwarding task's
  own flags is the forwarded task line, not a second local task. It is checked here against the local collection
  (unknown task, unknown flag, a bad value: exit 2 before anything is synced or submitted).
- `invoke judge --help` / `judge -h`: invoke would hand `--help` (or `-h`) to a required positional argument and run
  the task with it; it becomes `invoke --help judge`.
- invoke hands the Hydra overrides after `--` over space-joined (`c.remainder` from invoke 3 only): the tokens as
  given are kept here, so an override holding a space survives.
- a malformed invoke.yaml: one line naming the file and the YAML error, exit 2.
- Ctrl-C while invoke loads or parses: invoke turns it into a silent exit 1; here it is `interrupted`, exit 130.

State goes into invoke's config (`c.config[STATE_KEY]`), where every task's context finds it; no module globals.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any

from invoke.exceptions import Exit, ParseError

from env.protocol import exits
from env.protocol.errors import closed_stdout_exit, interrupt_as_exit

# Tasks that run another task elsewhere (remote, slurm) or at each commit (bisect).
FORWARDING_TASKS = ("remote", "slurm", "bisect")
STATE_KEY = "verl_e2e_cli"  # in invoke's config: {"forwarded": {task: [tokens]}, "remainder": [tokens]}
_MARK = "_verl_e2e_hooked"


# ---------------------------------------------------------------- what tasks read


def _state(c: Any) -> dict:
    config = getattr(c, "config", None)
    try:
        return dict(config.get(STATE_KEY) or {}) if config is not None else {}
    except (AttributeError, TypeError):
        return {}


def forwarded_args(c: Any, task_name: str) -> list[str]:
    """The task line given after a forwarding task's own flags (empty when none)."""
    return list((_state(c).get("forwarded") or {}).get(task_name) or [])


def remainder_args(c: Any) -> list[str]:
    """The tokens after a standalone `--` (Hydra overrides), exactly as given."""
    state = _state(c)
    if "remainder" in state:
        return list(state["remainder"])
    text = getattr(c, "remainder", "") or ""
    return text.split()


# ---------------------------------------------------------------- pure helpers (tested directly)


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


def task_help_request(tokens: list[str], task_names: set[str], short_flags: dict[str, set[str]] | None = None
                      ) -> str | None:
    """The task of `invoke judge --help` / `invoke judge -h` (shown as `invoke --help judge`)."""
    task = next((t for t in tokens if not t.startswith("-")), None)
    if task not in task_names:
        return None
    after = tokens[tokens.index(task) + 1:]
    if "--help" in after or ("-h" in after and "-h" not in (short_flags or {}).get(task, set())):
        return task
    return None


def after_double_dash(argv: list[str]) -> list[str] | None:
    """The tokens after the first standalone `--` of a command line (as invoke's parser splits it), else None."""
    rest = argv[1:]
    return rest[rest.index("--") + 1:] if "--" in rest else None


def _flag_names(task: Any) -> tuple[set[str], set[str]]:
    """(flags that take a value, short flags) of an invoke task."""
    values, shorts = set(), set()
    help_texts = dict(task.help)  # get_arguments() pops them; `--help` needs them later
    try:
        for arg in task.get_arguments():
            names = {("--" if len(n) > 1 else "-") + n.replace("_", "-") for n in arg.names}
            shorts.update(n for n in names if not n.startswith("--"))
            if arg.takes_value:
                values.update(names)
    finally:
        task.help = help_texts
    return values, shorts


def check_forwarded(collection: Any, owner: str, line: list[str]) -> None:
    """A forwarded task line must name a task here and parse against it (flags and values): else exit 2 now,
    before anything is synced, submitted or checked out."""
    from invoke.parser import Parser, ParserContext

    if not line:
        return
    name = line[0]
    names = set(collection.task_names)
    if name not in names:
        raise Exit(f"error: {owner}: no task {name!r} to run (tasks: {', '.join(sorted(names))})",
                   code=exits.BAD_USAGE)
    if name in FORWARDING_TASKS:  # `slurm bisect --good R level0 ...`: that task cuts and checks its own line
        return
    task = collection[name]
    help_texts = dict(task.help)
    try:
        context = ParserContext(name=name, args=task.get_arguments())
    finally:
        task.help = help_texts
    try:
        parsed = Parser(contexts=[context]).parse_argv(line)
    except (ParseError, ValueError) as e:
        raise Exit(f"error: {owner} {name}: {e}", code=exits.BAD_USAGE) from None
    if len(parsed) != 1:
        raise Exit(f"error: {owner}: one task only, got: {' '.join(c.name for c in parsed)}", code=exits.BAD_USAGE)
    table = getattr(getattr(task, "body", None), "flag_table", None)
    if table is not None:  # the task's own validation of types, ranges and conflicts (no filesystem checks)
        from env.protocol.flags import validate
        from env.settings import UsageError

        try:
            validate(table, parsed[0].as_kwargs)
        except UsageError as e:
            raise Exit(f"error: {owner} {name}: {e}", code=exits.BAD_USAGE) from None


# ---------------------------------------------------------------- the hooks


def _closed_stdout_hook(previous):
    def hook(kind, value, tb):
        if issubclass(kind, BrokenPipeError):  # `invoke judge --help | head -2`: not an error of ours
            closed_stdout_exit()
        previous(kind, value, tb)

    return hook


def _test_pause() -> None:
    """For the test of Ctrl-C while tasks.py loads: say so in a file, then wait (VERL_E2E_TEST_LOAD_*)."""
    marker = os.environ.get("VERL_E2E_TEST_LOAD_MARKER")
    if marker:
        import time

        with open(marker, "w") as f:
            f.write(str(os.getpid()))
        time.sleep(float(os.environ.get("VERL_E2E_TEST_LOAD_PAUSE_S") or 0))


def install() -> None:
    """Called while tasks.py loads (invoke loads the collection before the project config and the task args)."""
    from invoke.config import Config
    from invoke.program import Program

    interrupt_as_exit()
    _test_pause()
    if not getattr(sys.excepthook, _MARK, False):
        sys.excepthook = _closed_stdout_hook(sys.excepthook)
        setattr(sys.excepthook, _MARK, True)
    if getattr(Program.parse_tasks, _MARK, False):
        return

    original_parse = Program.parse_tasks

    @functools.wraps(original_parse)
    def parse_tasks(self: Program) -> None:
        value_flags, short_flags = {}, {}
        for name in self.collection.task_names:
            values, shorts = _flag_names(self.collection[name])
            short_flags[name] = shorts
            if name in FORWARDING_TASKS:
                value_flags[name] = values
        self.core.unparsed, found = split_forwarded(list(self.core.unparsed), value_flags)
        help_task = task_help_request(self.core.unparsed, set(self.collection.task_names), short_flags)
        if help_task:
            self.core.unparsed = []
        else:
            for owner, line in found.items():
                check_forwarded(self.collection, owner, line)
        remainder = after_double_dash(list(getattr(self, "argv", None) or []))
        if remainder is None:
            text = getattr(self.core, "remainder", "") or ""
            remainder = text.split()
        self.config[STATE_KEY] = {"forwarded": found, "remainder": remainder}
        try:
            original_parse(self)
        except ParseError as e:
            raise Exit(f"error: {e}", code=exits.BAD_USAGE) from None
        except ValueError as e:  # invoke casting a value to its default's type: `--level abc`
            raise Exit(f"error: bad value: {e}", code=exits.BAD_USAGE) from None
        if help_task:
            self.core[0].args.help.value = help_task  # what `--help TASK` sets; invoke prints it next

    setattr(parse_tasks, _MARK, True)
    Program.parse_tasks = parse_tasks  # type: ignore[method-assign]

    for name in ("load_project", "load_runtime"):  # invoke.yaml beside tasks.py; `invoke -f FILE`
        setattr(Config, name, _one_line_config_errors(getattr(Config, name), name))


def _one_line_config_errors(original, name: str):
    @functools.wraps(original)
    def load(self: Any, *args: Any, **kwargs: Any) -> None:
        which = "runtime config (-f)" if name == "load_runtime" else "invoke.yaml"
        try:
            original(self, *args, **kwargs)
        except Exit:
            raise
        except Exception as e:  # noqa: BLE001 - yaml.YAMLError, a non-mapping file, ...: one line, exit 2
            text = " ".join(str(e).split())
            raise Exit(f"error: {which}: not a valid config file: {type(e).__name__}: {text[:300]}",
                       code=exits.BAD_USAGE) from None
        # invoke skips a runtime file it cannot find (a debug line): a named `-f FILE` that is not there would run
        # on the defaults while the user reads their settings into the result
        path = getattr(self, "_runtime_path", None) if name == "load_runtime" else None
        if path and not getattr(self, "_runtime_found", None):
            raise Exit(f"error: {which} {path}: no such file", code=exits.BAD_USAGE)

    return load
