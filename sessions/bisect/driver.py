"""`invoke bisect`: the first commit of a checkout that breaks a level, found by running the level itself.

Real `git bisect` drives the checkout (sessions/bisect/checkout.py); at each commit the level runs exactly as `invoke levelN`
does (a subprocess of this project's invoke, so flags, preflight, Bridge checks, verdict and run directory are the
level's own). Its verdict marks the commit: Pass → good, Blocked → skip (an environment problem is no evidence
about the commit), Fail → bad or skip by category (RULES, overridable with --on). One report per bisection in
`$LOG_DIR/<utc>-bisect-level<N>-<model>/`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from env import presets
from env.protocol import child as child_protocol
from env.protocol import exits, lines
from env.protocol.child import invoke_argv
from env.protocol.relay import Relay
from env.repos import RepoError, bridge_state, verl_state
from env.settings import PROJECT_ROOT, TOOL_PREFIX, Resolved, UsageError, config_section, resolve
from sessions.bisect.checkout import BisectCheckout, BisectState, CommitInfo, GitStepError, StartState
from sessions.bisect.report import report
from sessions.judge.structure import failure_signature
from sessions.judge.verdict import CATEGORIES
from sessions.run.level import LevelOptions, make_level_task, parse_options
from sessions.run.record import RUN_FILE
from sessions.run.rundir import new_run_dir

PROJECT = PROJECT_ROOT
EXIT_FOUND, EXIT_BAD_USAGE, EXIT_AMBIGUOUS, EXIT_INTERRUPTED = exits.FOUND, exits.BAD_USAGE, exits.BLOCKED, exits.INTERRUPTED
# A Fail of these categories is about the code under test; any other Fail (oom, nccl, hang, ...) says little
# about the commit and is skipped unless --on says otherwise. "bridge-checks": the Bridge's own unit tests failed.
DEFAULT_BAD = ("provider", "checkpoint", "nan-metrics", "bridge-checks")
STEP_CATEGORIES = (*CATEGORIES, "bridge-checks")
FAIL_CATEGORIES = tuple(c for c in STEP_CATEGORIES if c not in ("success", "interrupted"))
# a level stopped by Ctrl-C still stops verl (GRACE_S, then KILL) and writes its summary; below the 60 s that
# `invoke remote` grants this whole task before its own SIGTERM
STOP_GRACE_S = child_protocol.STOP_GRACE_S
REUSED_RESULTS = ("Pass", "Fail")  # verdicts about the commit; Blocked and interrupted runs say nothing lasting


def _say(msg: str) -> None:
    print(f"{TOOL_PREFIX} bisect: {msg}", flush=True)


# ---------------------------------------------------------------- the command line


@dataclass
class LevelLine:
    """The level task given after bisect's own flags, parsed by invoke's own parser for that level."""
    number: int
    args: list[str]  # as given (task name excluded)
    remainder: str  # Hydra overrides after `--`
    opts: LevelOptions
    settings: Resolved

    @property
    def label(self) -> str:
        return f"level{self.number}" + (f"-{self.opts.variant}" if self.opts.variant else "")

    def argv(self) -> list[str]:
        extra = shlex.split(self.remainder) if self.remainder.strip() else []
        return invoke_argv([f"level{self.number}", *self.args, *(["--", *extra] if extra else [])])

    def display(self) -> str:
        return shlex.join(["invoke", f"level{self.number}", *self.args]) + (f" -- {self.remainder}" if
                                                                            self.remainder.strip() else "")


def parse_level_line(task_line: list[str], remainder: str, config: Any = None) -> LevelLine:
    """`level<N> [its flags]` → options and settings as the level itself resolves them (UsageError → exit 2)."""
    from invoke.exceptions import ParseError
    from invoke.parser import Parser, ParserContext

    if not task_line:
        raise UsageError("name the level to bisect after bisect's flags, e.g. `invoke bisect --good v0.6.0 level0 "
                         "--model Qwen/Qwen2.5-0.5B`")
    name = task_line[0]
    m = re.fullmatch(r"level(\d)", name)
    if not m or int(m.group(1)) not in presets.LEVELS:
        raise UsageError(f"{name!r} is not a level task: bisect runs one of "
                         f"{', '.join(f'level{n}' for n in sorted(presets.LEVELS))}")
    number = int(m.group(1))
    context = ParserContext(name=name, args=make_level_task(number).get_arguments())
    try:
        parsed = Parser(contexts=[context]).parse_argv([name, *task_line[1:]])
    except ParseError as e:
        raise UsageError(f"{name}: {e}") from None
    if len(parsed) != 1:
        raise UsageError(f"one level task only, got: {' '.join(c.name for c in parsed)}")
    flags = parsed[0].as_kwargs
    if flags.get("dry_run"):
        raise UsageError("bisect runs the level at each commit: drop --dry-run (run the level alone to see its plan)")
    opts, setting_flags = parse_options(number, flags, remainder)
    settings = resolve(setting_flags, os.environ, config_section(config))
    return LevelLine(number, list(task_line[1:]), remainder or "", opts, settings)


def parse_rules(on: list[str] | None) -> dict[str, str]:
    """--on CATEGORY=bad|skip (repeatable) over the defaults; every Fail category gets a mark."""
    rules = {cat: ("bad" if cat in DEFAULT_BAD else "skip") for cat in FAIL_CATEGORIES}
    for item in on or []:
        cat, eq, mark = item.partition("=")
        cat, mark = cat.strip(), mark.strip()
        if not eq or mark not in ("bad", "skip"):
            raise UsageError(f"--on {item!r}: want FAIL-CATEGORY=bad or FAIL-CATEGORY=skip")
        if cat not in FAIL_CATEGORIES:
            raise UsageError(f"--on {item!r}: unknown Fail category {cat!r} (one of {', '.join(FAIL_CATEGORIES)})")
        rules[cat] = mark
    return rules


# ---------------------------------------------------------------- one step


@dataclass
class Step:
    n: int
    commit: str
    subject: str
    result: str  # Pass | Fail | Blocked | interrupted | none
    category: str
    mark: str | None  # good | bad | skip (None: not marked, e.g. interrupted or a confirmation run)
    rule: str
    run_dir: str | None = None
    reused: bool = False
    duration_s: float = 0.0
    exit_code: int | None = None
    first_error: str = ""
    sentence: str = ""
    submodules: list[str] = field(default_factory=list)
    purpose: str = "bisect"  # bisect | confirm (first bad commit or its parent) | endpoint (the --bad commit)
    signature: str = ""  # a Fail's signature (category | exception type | masked first error)
    notes: list[str] = field(default_factory=list)


def _first_error(summary: dict) -> str:
    for verdict in (summary.get("verdicts") or {}).values():
        if verdict.get("first_error"):
            return verdict["first_error"]
    bad = [d for d in summary.get("deliverables", []) if d["status"] in ("Fail", "Blocked")]
    return f"{bad[0]['name']}: {bad[0]['detail']}" if bad else ""


def step_category(summary: dict) -> str:
    """The level's category; a level that stopped before verl because the Bridge unit tests failed: bridge-checks."""
    checks = next((d for d in summary.get("deliverables", []) if d["name"] == "Bridge-side checks"), None)
    ran_verl = bool(summary.get("verdicts"))
    if summary["result"] == "Fail" and checks and checks["status"] == "Fail" and not ran_verl:
        return "bridge-checks"
    return summary.get("category") or "unknown"


def step_signature(summary: dict) -> str:
    """The failure's signature (category | exception type | first error line with numbers, paths, pids and
    addresses masked): what says that two commits fail the same way."""
    return failure_signature(step_category(summary), _first_error(summary))


def decide(result: str, category: str, rules: dict[str, str], on_given: set[str], *, signature: str | None = None,
           bad_signature: str | None = None) -> tuple[str | None, str]:
    """(mark, the rule that chose it) for a level verdict. With the --bad endpoint's signature: a Fail with the same
    signature is bad, a different failure is skipped and named (--on CATEGORY=... still overrides)."""
    if result == "Pass":
        return "good", "Pass → good"
    if result == "Blocked":
        return "skip", "Blocked → skip (an environment problem is no evidence about the commit)"
    if result == "Fail" and bad_signature is not None and signature is not None and category not in on_given:
        if signature == bad_signature:
            return "bad", f"Fail/{category} → bad (the same failure as --bad: {signature})"
        return "skip", f"Fail/{category} → skip (a different failure than --bad's {bad_signature}: {signature})"
    if result == "Fail":
        mark = rules.get(category, "skip")
        why = f"--on {category}={mark}" if category in on_given else (
            "default: about the code under test" if mark == "bad" else "default: not about the code under test")
        return mark, f"Fail/{category} → {mark} ({why})"
    return "skip", f"{result} → skip (no verdict)"


def level_run_record(run_dir: Path) -> tuple[dict, dict] | None:
    try:
        return (json.loads((run_dir / RUN_FILE).read_text()), json.loads((run_dir / "summary.json").read_text()))
    except (OSError, ValueError):
        return None


class LevelRunner:
    """Runs the level at the checked-out commit (or takes its verdict from an earlier run of the same state)."""

    def __init__(self, line: LevelLine, echo: Callable[[str], None] = print):
        self.line = line
        self.echo = echo
        self.log_dir = Path(line.settings.log_dir)
        # what a run directory must hold to stand for this run: the same level, options and settings
        self.options = json.loads(json.dumps(asdict(line.opts), default=str))
        self.settings = {k: (None if v is None else str(v)) for k, v in line.settings.values.items()}

    def states(self) -> tuple[str | None, str | None]:
        """Fingerprints (commit + uncommitted content + submodules) of both checkouts as they are now."""
        out = []
        for fn, path in ((bridge_state, self.line.settings.bridge_repo), (verl_state, self.line.settings.verl_repo)):
            try:
                out.append(fn(path).fingerprint)
            except RepoError:
                out.append(None)
        return out[0], out[1]

    def find_judged(self) -> tuple[Path, dict] | None:
        """The newest finished run directory of this level with the same settings and checkout states, judged Pass
        or Fail (a Blocked one is run again: the environment that blocked it may have been fixed since)."""
        bridge_fp, verl_fp = self.states()
        if bridge_fp is None or verl_fp is None:
            return None
        for run_json in sorted(self.log_dir.glob(f"*-level{self.line.number}*/{RUN_FILE}"), reverse=True):
            loaded = level_run_record(run_json.parent)
            if loaded is None:
                continue
            record, summary = loaded
            if (record.get("level") == self.line.number and record.get("finished")
                    and record.get("options") == self.options and record.get("settings") == self.settings
                    and record.get("bridge", {}).get("fingerprint") == bridge_fp
                    and record.get("verl", {}).get("fingerprint") == verl_fp
                    and summary.get("result") in REUSED_RESULTS):
                return run_json.parent, summary
        return None

    def run(self) -> tuple[int | None, Path | None, list[str], bool]:
        """(exit code, run directory, last output lines, interrupted) of `invoke levelN ...` here and now
        (env/protocol/child.py: on Ctrl-C the level stops verl and writes its summary before we go on)."""
        from env.protocol.child import run_task

        child = run_task(self.line.argv()[len(invoke_argv([])):], self.echo, grace_s=STOP_GRACE_S)
        return child.code, child.run_dir, child.tail, child.interrupted


# ---------------------------------------------------------------- the bisection


@dataclass
class Options:
    good: str
    bad: str | None
    repo: str  # bridge | verl
    max_steps: int | None
    rules: dict[str, str]
    on_given: set[str]
    stash: bool


class Bisection:
    def __init__(self, opts: Options, line: LevelLine, runner: LevelRunner | None = None):
        self.opts = opts
        self.line = line
        self.runner = runner or LevelRunner(line, echo=Relay().line)  # status: one line on a terminal
        path = line.settings.bridge_repo if opts.repo == "bridge" else line.settings.verl_repo
        if path is None:
            env = "BRIDGE_REPO" if opts.repo == "bridge" else "VERL_REPO"
            raise UsageError(f"{env} is not set (--{opts.repo}-repo in the level's flags, or {env})")
        if line.settings.bridge_repo is None or line.settings.verl_repo is None:
            raise UsageError("the level needs both BRIDGE_REPO and VERL_REPO")
        what = "BRIDGE_REPO" if opts.repo == "bridge" else "VERL_REPO"
        try:
            self.checkout = BisectCheckout(path, what)
            self.good = self.checkout.resolve(opts.good)
            self.bad = self.checkout.resolve(opts.bad or "HEAD")
        except RepoError as e:
            raise UsageError(str(e)) from None
        if self.good == self.bad:
            raise UsageError(f"--good {opts.good} and --bad {opts.bad or 'HEAD'} are the same commit {self.good[:12]}")
        if not self.checkout.is_ancestor(self.good, self.bad):
            raise UsageError(f"--good {opts.good} ({self.good[:12]}) is not an ancestor of --bad {opts.bad or 'HEAD'} "
                             f"({self.bad[:12]}) in {path}")
        if self.checkout.in_progress():
            raise UsageError(f"a git bisect is already in progress in {path}: finish it or `git bisect reset` first")
        self.dirty = self.checkout.dirty_files()
        if self.dirty and not opts.stash:
            raise UsageError(f"{path} has uncommitted changes: {', '.join(self.dirty)} — commit them, or pass --stash "
                             f"(stashed now, restored at the end)")
        self.steps: list[Step] = []
        self.state: BisectState | None = None
        self.start: StartState | None = None
        self.outcome = "running"  # found | ambiguous | stopped | failed | interrupted
        self.error: str | None = None
        self.restore_problems: list[str] = []
        self.runs = 0
        self.judged: dict[str, Step] = {}  # commit -> the step that judged it
        self.replay = ""  # `git bisect log`, taken before the reset
        self.remaining: list[str] = []
        self.bad_signature: str | None = None  # the --bad endpoint's failure, once judged
        self.endpoint_judged = False

    # -- one commit --------------------------------------------------------------------------------------------
    def judge_head(self, commit: str, purpose: str = "bisect") -> Step | None:
        """The verdict at the checked-out commit; None when --max-steps forbids another run and none is reusable."""
        info = self.checkout.info(commit)
        started = time.monotonic()
        moves: list[str] = []
        try:
            moves = self.checkout.sync_submodules()
        except GitStepError as e:
            return self._record(Step(len(self.steps) + 1, commit, info.subject, "none", "checkout", "skip",
                                     f"submodule not updated → skip: {e}", purpose=purpose))
        # files an earlier step left behind (not ignored by the checkout) change what this step judges
        leftover = self.checkout.dirty_files()
        judged = self.runner.find_judged()
        if judged is not None:
            run_dir, summary = judged
            _say(f"{commit[:12]} already judged in {run_dir}: {summary['result']} (reused)")
            step = self._from_summary(commit, info, summary, run_dir, purpose, reused=True)
        elif self.opts.max_steps is not None and self.runs >= self.opts.max_steps:
            return None
        else:
            self.runs += 1
            _say(f"run {self.runs}: level {self.line.number} at {commit[:12]} {info.subject!r}"
                 + (f" ({'; '.join(moves)})" if moves else ""))
            code, run_dir, tail, interrupted = self.runner.run()
            loaded = level_run_record(run_dir) if run_dir else None
            if interrupted:
                step = Step(len(self.steps) + 1, commit, info.subject, "interrupted", "interrupted", None,
                            "interrupted (Ctrl-C): not marked", str(run_dir) if run_dir else None, exit_code=code,
                            purpose=purpose)
            elif loaded is not None:
                step = self._from_summary(commit, info, loaded[1], run_dir, purpose, exit_code=code)
            else:
                last = next((t for t in reversed(tail) if t.strip()), "no output")
                step = Step(len(self.steps) + 1, commit, info.subject, "none", "no-run-directory", "skip",
                            f"the level wrote no verdict at this commit (exit {code}) → skip", exit_code=code,
                            first_error=last, purpose=purpose)
        step.duration_s = time.monotonic() - started
        step.submodules = moves
        if leftover:
            step.notes.append(f"the checkout was not clean at this commit: {', '.join(leftover)} (left by an "
                              f"earlier step? add them to .gitignore or remove them)")
        return self._record(step)

    def _from_summary(self, commit: str, info: CommitInfo, summary: dict, run_dir: Path, purpose: str,
                      reused: bool = False, exit_code: int | None = None) -> Step:
        category = step_category(summary)
        signature = step_signature(summary) if summary["result"] == "Fail" else None
        mark, rule = decide(summary["result"], category, self.opts.rules, self.opts.on_given, signature=signature,
                            bad_signature=self.bad_signature)
        return Step(len(self.steps) + 1, commit, info.subject, summary["result"], category, mark, rule, str(run_dir),
                    reused, exit_code=summary.get("exit_code", exit_code), first_error=_first_error(summary),
                    sentence=summary.get("sentence", ""), purpose=purpose, signature=signature or "")

    def judge_endpoint(self, back_to: str) -> None:
        """The --bad endpoint's own verdict (once): its failure's signature decides which Fails are the same break.
        Judged when a Fail would otherwise be skipped by category (an `unknown` provider break fails every commit
        after it the same way); HEAD goes back to the commit under test afterwards."""
        if self.endpoint_judged or back_to == self.bad:
            return
        self.endpoint_judged = True
        self.checkout.checkout(self.bad)
        try:
            step = self.judge_head(self.bad, purpose="endpoint")
        finally:
            self.checkout.checkout(back_to)
        if step is not None and step.result == "Fail" and step.signature:
            self.bad_signature = step.signature
            _say(f"--bad {self.bad[:12]} fails with {step.signature}: commits failing the same way are bad")

    def _record(self, step: Step) -> Step:
        self.steps.append(step)
        if step.result != "interrupted":
            self.judged.setdefault(step.commit, step)
        return step

    # -- the loop ----------------------------------------------------------------------------------------------
    def run(self) -> None:
        self.start = self.checkout.capture()
        if self.dirty:
            self.checkout.stash(self.start, f"invoke bisect {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}")
            _say(f"stashed: {', '.join(self.dirty)}")
        self.state = self.checkout.start(self.bad, self.good)
        while self.state.next_commit is not None:
            commit = self.state.next_commit
            step = self.judge_head(commit)
            if step is None:
                self.outcome = "stopped"
                return
            if step.result == "interrupted":
                raise KeyboardInterrupt
            if step.result == "Fail" and step.mark == "skip" and step.category not in self.opts.on_given \
                    and not self.endpoint_judged:
                self.judge_endpoint(commit)
                if self.bad_signature is not None:
                    same = step.signature == self.bad_signature
                    step.mark = "bad" if same else "skip"
                    step.rule = (f"Fail/{step.category} → bad (the same failure as --bad: {step.signature})" if same
                                 else f"Fail/{step.category} → skip (a different failure than --bad's "
                                      f"{self.bad_signature}: {step.signature})")
            self.state = self.checkout.mark(step.mark or "skip", commit)
        if self.state.first_bad:
            self.outcome = "found"
            self.confirm()
        else:
            self.outcome = "ambiguous"

    def confirm(self) -> None:
        """The verdict at the first bad commit and at its parent: run them when the bisection took them on trust."""
        assert self.state and self.state.first_bad
        info = self.checkout.info(self.state.first_bad)
        for commit in filter(None, (info.sha, info.parent)):
            if commit in self.judged:
                continue
            self.checkout.checkout(commit)
            step = self.judge_head(commit, purpose="confirm")  # None: --max-steps; the report says "not run"
            if step is not None and step.result == "interrupted":
                raise KeyboardInterrupt

    def finish(self) -> None:
        """Replay log first (it dies with `git bisect reset`), then the user's state back; Ctrl-C ignored meanwhile."""
        handlers = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self.replay = self.checkout.log() if self.checkout.in_progress() else ""
            self.remaining = self.checkout.remaining() if self.checkout.in_progress() else []
            if self.start is not None:
                self.restore_problems = self.checkout.restore(self.start)
        finally:
            for s, h in handlers.items():
                signal.signal(s, h)

    # -- the verdict of the bisection -------------------------------------------------------------------------
    def exit_code(self) -> int:
        if self.outcome == "interrupted":
            return EXIT_INTERRUPTED
        if self.outcome == "found" and self._contradiction() is None:
            return EXIT_FOUND
        return EXIT_AMBIGUOUS

    def _contradiction(self) -> str | None:
        """A confirmation run that disagrees with what the bisection assumed about the endpoints."""
        if not (self.state and self.state.first_bad):
            return None
        first = self.judged.get(self.state.first_bad)
        if first is not None and first.mark == "good":
            return (f"the first bad commit {first.commit[:12]} passes: --bad {self.opts.bad or 'HEAD'} is not bad for "
                    f"this level")
        parent = self.checkout.info(self.state.first_bad).parent
        judged_parent = self.judged.get(parent) if parent else None
        if judged_parent is not None and judged_parent.mark == "bad":
            return f"its parent {parent[:12]} fails too: --good {self.opts.good} is not good for this level"
        return None


# ---------------------------------------------------------------- the task body


def bisect_command(c: Any, *, good: str | None, bad: str | None, repo: str, max_steps: Any, on: list[str] | None,
                   stash: bool, task_line: list[str], remainder: str) -> int:
    if not good:
        raise UsageError("--good REF is required (a commit where the level passes)")
    if repo not in ("bridge", "verl"):
        raise UsageError(f"--repo must be bridge or verl, got {repo!r}")
    steps = None
    if max_steps is not None:
        try:
            steps = int(max_steps)
        except ValueError:
            raise UsageError(f"--max-steps must be an integer, got {max_steps!r}") from None
        if steps < 1:
            raise UsageError(f"--max-steps must be >= 1, got {steps}")
    rules = parse_rules(on)
    on_given = {item.partition("=")[0].strip() for item in on or []}
    line = parse_level_line(task_line, remainder, getattr(c, "config", None))
    b = Bisection(Options(good, bad, repo, steps, rules, on_given, stash), line)
    report_dir = new_run_dir(Path(line.settings.log_dir), f"bisect-{line.label}", line.settings.model_id)
    _say(f"{b.checkout.path}: {b.good[:12]} (good) .. {b.bad[:12]} (bad); level: {line.display()}")
    lines.say_run_dir(report_dir)
    started = time.time()
    display = shlex.join(["invoke", "bisect", "--good", good, *(["--bad", bad] if bad else []), "--repo", repo,
                          *(["--max-steps", str(steps)] if steps else []),
                          *[a for item in on or [] for a in ("--on", item)], *(["--stash"] if stash else []),
                          *task_line]) + (f" -- {remainder}" if remainder.strip() else "")
    old_term = signal.signal(signal.SIGTERM, _interrupt)  # a remote stop or scancel: restore like Ctrl-C
    try:
        b.run()
    except KeyboardInterrupt:
        b.outcome = "interrupted"
    except GitStepError as e:
        b.outcome, b.error = "failed", str(e)
    except Exception as e:  # noqa: BLE001 - whatever broke, the checkout goes back and the report says why
        b.outcome, b.error = "failed", f"{type(e).__name__}: {e}"
    finally:
        signal.signal(signal.SIGTERM, old_term)
        b.finish()
    summary = report(b, report_dir, started, display)
    print((report_dir / "summary.md").read_text(), flush=True)
    for p in b.restore_problems:
        print(f"{TOOL_PREFIX} bisect: PROBLEM restoring {b.checkout.path}: {p}", file=sys.stderr, flush=True)
    lines.say_run_dir(report_dir)
    return summary["exit_code"]


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt
