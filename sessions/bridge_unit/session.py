"""Body of `nox -s bridge_unit`: the procedure's targeted Megatron-Bridge unit tests, run the way the Bridge's own CI
runs its unit tests, recorded so that level reports find the outcome of the same Bridge state
(sessions/bridge_unit/records.py).

Order: every path is checked first (a renamed test file must not become "pytest exit 4, nothing ran"; a missing one
is traced in git history to the tests that carry it on), then `uv sync --locked --group <the group holding pytest>`
(Bridge's CI image syncs its groups the same way; at Bridge HEAD pytest lives in the `test` group, which a plain
`uv sync` leaves out), then `uv run --no-sync python -m pytest -q -m "not pleasefixme" --junitxml=...` offline, as
its CI does (UV_NO_SYNC=1, HF_HUB_OFFLINE=1). Counts come from the junit file. Results: Pass (pytest exit 0), Fail
(tests failed, or did not collect for a reason in the Bridge's own code), Blocked (missing targeted path without
--allow-missing; the environment: uv missing, `uv sync` failing, pytest or a test dependency not installed; nothing
collected: no evidence either way).

Environment: the Bridge's own `.venv`, or the one UV_PROJECT_ENVIRONMENT names when it is the Bridge's own (its CI
container's /opt/venv, whose system site-packages hold torch: megatron.bridge resolves there to this checkout's
src); never another one the caller happens to run in (nox's, CI's), which a `uv sync` would strip.

`ensure_for_level` is what a level does when it has no matching record: run `nox -s bridge_unit` itself.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from env.preflight.pythonpath import megatron_lm_empty, submodule_fix
from env.repos import MEGATRON_LM, RepoError, RepoState, bridge_state
from env.settings import PROJECT_ROOT, UsageError, resolve
from sessions.bridge_unit.history import Successor, successor
from sessions.bridge_unit.records import (
    TARGETED_TESTS,
    BridgeChecks,
    find_record,
    from_record,
    not_requested,
    records_dir,
    write_record,
)

ALLOW_MISSING = "--allow-missing"
NOXFILE = PROJECT_ROOT / "noxfile.py"
RECORD_LINE = "bridge_unit record: "
# Bridge CI's unit-test job: deselects tests marked broken, runs offline (Launch_Unit_Tests_Core.sh, cicd-main.yml)
PYTEST_ARGS = ("-q", "-m", "not pleasefixme")
CI_TEST_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
BRIDGE_PACKAGE = "megatron.bridge"  # a missing module under it is the Bridge's own code, never the environment
MISSING_MODULE = re.compile(r"(?:ModuleNotFoundError|ImportError): No module named '([\w.]+)'")
# the probe prints where megatron.bridge resolves without importing it (its __init__ needs torch)
FIND_BRIDGE = "import importlib.util as u; s = u.find_spec('megatron.bridge'); print(s.origin if s else '')"

Echo = Callable[[str], None]


def _say(msg: str) -> None:
    print(f"[bridge_unit] {msg}", flush=True)


@dataclass
class MissingPath:
    path: str
    successor: Successor

    def describe(self) -> str:
        return self.successor.describe()


def parse_posargs(posargs: Sequence[str]) -> tuple[list[str], bool]:
    """`nox -s bridge_unit -- [paths...] [--allow-missing]` → (extra paths, allow_missing)."""
    paths, allow = [], False
    for arg in posargs:
        if arg == ALLOW_MISSING:
            allow = True
        elif arg.startswith("-"):
            raise UsageError(f"unknown option {arg!r} (only test paths and {ALLOW_MISSING})")
        else:
            paths.append(arg)
    return paths, allow


def requested_paths(extra: Sequence[str]) -> list[str]:
    """The procedure's targeted tests plus model-specific extras, each once, in order."""
    return list(dict.fromkeys([*TARGETED_TESTS, *extra]))


def check_paths(repo: Path, paths: Sequence[str]) -> tuple[list[str], list[MissingPath]]:
    """(present, missing with where git history says they went). A `file::test` node id counts as present when its
    file exists."""
    present, missing = [], []
    for p in paths:
        if (repo / p.split("::")[0]).exists():
            present.append(p)
        else:
            missing.append(MissingPath(p, successor(repo, p)))
    return present, missing


def successor_offer(present: Sequence[str], missing: Sequence[MissingPath]) -> str:
    """The command that runs the rest plus the tests that carry the missing paths on (nox, and a level's flags)."""
    extra = [t for m in missing for t in m.successor.tests if t not in present]
    extra = list(dict.fromkeys(extra))
    if not extra:
        return ""
    return (f"to run the tests that carry them on: nox -s bridge_unit -- {ALLOW_MISSING} {shlex.join(extra)} "
            f"(a level: {ALLOW_MISSING} --bridge-tests {','.join(extra)})")


def junit_counts(junit: Path) -> dict[str, int]:
    """passed / failed / errors / skipped from pytest's junit XML (one <testsuite> or a <testsuites> of them)."""
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    root = ET.parse(junit).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    for suite in suites:
        for key in totals:
            totals[key] += int(suite.get(key, 0) or 0)
    passed = totals["tests"] - totals["failures"] - totals["errors"] - totals["skipped"]
    return {"passed": passed, "failed": totals["failures"], "errors": totals["errors"], "skipped": totals["skipped"]}


def uv_error(stderr: str, limit: int = 400) -> str:
    """uv's message from its first `error:` line on (the cause chain), as one line."""
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    start = next((i for i, ln in enumerate(lines) if ln.startswith("error:")), max(len(lines) - 3, 0))
    text = " | ".join(lines[start:]) or "no output"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _last_lines(text: str, n: int = 3) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[-n:]) if lines else "no output"


def pytest_groups(bridge_repo: Path) -> list[str]:
    """The dependency groups of the Bridge's pyproject.toml that list pytest (Bridge HEAD: `test`; older: `dev`)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: nox and pytest bring tomli
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        data = tomllib.loads((bridge_repo / "pyproject.toml").read_text())
    except (OSError, ValueError):
        return []  # uv sync names the problem
    groups = data.get("dependency-groups") or {}
    return [name for name, reqs in groups.items()
            if any(isinstance(r, str) and re.match(r"pytest\b(?![-_])", r.strip()) for r in reqs)]


@dataclass
class BridgeEnvironment:
    """Where the Bridge's tests run and how `uv` is called there."""

    uv_env: dict[str, str]  # the environment uv runs with
    path: Path  # the Python environment the tests run in
    own_container: bool  # UV_PROJECT_ENVIRONMENT is the Bridge's own (kept, synced without removing anything)
    note: str  # one line: which environment, and why


def bridge_environment(bridge_repo: Path, environ: dict[str, str]) -> BridgeEnvironment:
    """The container's environment when it is the Bridge's own, else the Bridge's `.venv`.

    The Bridge's own: UV_PROJECT_ENVIRONMENT names a Python environment in which megatron.bridge resolves to this
    checkout's src (Bridge's CI image: /opt/venv, an editable install of /opt/Megatron-Bridge, torch from its system
    site-packages). Any other (nox's, this project's CI venv) is dropped: `uv sync` would strip it to the Bridge's
    dependencies.
    """
    dropped = {k: v for k, v in environ.items() if k not in ("UV_PROJECT_ENVIRONMENT", "VIRTUAL_ENV")}
    own = Path(bridge_repo) / ".venv"
    named = environ.get("UV_PROJECT_ENVIRONMENT")
    if not named:
        return BridgeEnvironment(dropped, own, False, f"the Bridge's own {own}")
    env_path = Path(named).expanduser()
    if not env_path.is_absolute():
        env_path = Path(bridge_repo) / env_path  # uv resolves it against the project
    python = env_path / "bin" / "python"
    origin = ""
    if python.exists():
        probe = subprocess.run([str(python), "-c", FIND_BRIDGE], capture_output=True, text=True, timeout=120,
                               env={k: v for k, v in environ.items() if k != "PYTHONPATH"})
        origin = probe.stdout.strip() if probe.returncode == 0 else ""
    src = (Path(bridge_repo) / "src").resolve()
    if origin and Path(origin).resolve().is_relative_to(src):
        return BridgeEnvironment(dict(environ), env_path, True,
                                 f"UV_PROJECT_ENVIRONMENT={named}: the Bridge's own environment (megatron.bridge "
                                 f"there is this checkout's {origin}); synced without removing anything")
    where = f"megatron.bridge there: {origin}" if origin else (
        "no megatron.bridge there" if python.exists() else "no Python there")
    return BridgeEnvironment(dropped, own, False,
                             f"the Bridge's own {own}; UV_PROJECT_ENVIRONMENT={named} left alone: not this "
                             f"Bridge's environment ({where})")


def sync_argv(uv: str, bridge_repo: Path, env: BridgeEnvironment) -> list[str]:
    """What Bridge's CI image runs (`uv sync --locked ...`), limited to the groups that carry its test tools."""
    argv = [uv, "sync"]
    if (bridge_repo / "uv.lock").is_file():
        argv.append("--locked")  # CI's flag; never rewrites the checkout's lock
    if env.own_container:
        argv.append("--inexact")  # the image holds every extra and group: keep them
    for group in pytest_groups(bridge_repo):
        argv += ["--group", group]
    return argv


def missing_modules(text: str) -> list[str]:
    """Modules named in `No module named 'x'` lines, each once, in order."""
    return list(dict.fromkeys(MISSING_MODULE.findall(text)))


def _junit_errors(junit: Path) -> tuple[int, str]:
    """(collection errors, their text) from pytest's junit file."""
    try:
        root = ET.parse(junit).getroot()
    except (OSError, ET.ParseError):
        return 0, ""
    errors = [e for e in root.iter("error") if (e.get("message") or "").startswith("collection failure")]
    return len(errors), "\n".join((e.get("message") or "") + "\n" + (e.text or "") for e in errors)


def environment_gap(exit_code: int, counts: dict[str, int], junit: Path, output: str) -> list[str]:
    """Test dependencies the Bridge's environment lacks, when they alone kept the tests from running.

    Collection (or conftest) failed on `No module named 'x'` for modules outside megatron.bridge, and no test failed:
    the environment, not the Bridge. A missing megatron.bridge module is the Bridge's own code: a real failure.
    """
    if exit_code not in (1, 2, 3, 4) or counts.get("failed"):
        return []
    n_errors, text = _junit_errors(junit)
    if n_errors == 0:
        if counts.get("errors") or counts.get("passed"):
            return []  # fixture/setup errors of tests that ran: the tests' own failures
        text = output  # conftest import errors leave no junit entry: read pytest's own output
    missing = missing_modules(text)
    if not missing or any(m == BRIDGE_PACKAGE or m.startswith(BRIDGE_PACKAGE + ".") for m in missing):
        return []
    if n_errors and len(MISSING_MODULE.findall(text)) < n_errors:
        return []  # another collection error besides the missing modules
    return missing


def _run_streamed(argv: list[str], cwd: Path, env: dict[str, str], keep: int = 400) -> tuple[int, str]:
    """Run, echoing output as it comes (a level watches it for stalls); returns (exit code, last `keep` lines)."""
    tail: deque[str] = deque(maxlen=keep)
    with subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace") as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            tail.append(line)
    return proc.returncode, "".join(tail)


def run_bridge_unit(bridge_repo: Path, log_dir: Path, extra: Sequence[str] = (), allow_missing: bool = False,
                    echo: Echo = _say, environ: dict[str, str] | None = None) -> tuple[dict[str, Any], Path]:
    """Run the checks in `bridge_repo`, write the record under `log_dir`; returns (record, record path)."""
    bridge_repo = Path(bridge_repo)
    environ = dict(os.environ if environ is None else environ)
    started = time.monotonic()
    state = bridge_state(bridge_repo)
    paths = requested_paths(extra)
    pytest_argv = ["uv", "run", "--no-sync", "python", "-m", "pytest", *PYTEST_ARGS]
    record: dict[str, Any] = {
        "result": "Blocked", "detail": "", "counts": {}, "paths": paths, "missing_paths": [],
        "allow_missing": allow_missing, "command": "nox -s bridge_unit", "junit": None, "duration_s": 0.0,
        "pytest_exit": None, "blocked_by": None, "successors": {}, "environment": None, "sync": None,
    }

    def finish(result: str, detail: str, st: RepoState, blocked_by: str | None = None) -> tuple[dict[str, Any], Path]:
        record.update(result=result, detail=detail, duration_s=round(time.monotonic() - started, 2),
                      blocked_by=blocked_by if result == "Blocked" else None)
        path = write_record(log_dir, st, record)
        echo(f"{result}: {detail}")
        print(f"{RECORD_LINE}{path}", flush=True)
        return record, path

    present, missing = check_paths(bridge_repo, paths)
    record["missing_paths"] = [m.path for m in missing]
    record["successors"] = {m.path: m.successor.tests for m in missing}
    for m in missing:
        echo(f"missing at {state.head}: {m.describe()}")
    offer = successor_offer(present, missing)
    if offer:
        echo(offer)
    if missing and not allow_missing:
        return finish("Blocked", f"{len(missing)} targeted path(s) missing at Bridge {state.head}: "
                      + "; ".join(m.describe() for m in missing)
                      + (f" — {offer}" if offer else f" — update the path(s), or {ALLOW_MISSING} to run the rest"),
                      state, "missing-path")
    if not present:
        return finish("Blocked", "no requested test path exists at this commit: nothing to run", state, "missing-path")

    uv = shutil.which("uv", path=environ.get("PATH"))
    if uv is None:
        return finish("Blocked", "uv not found on PATH: install uv (pip install uv, or "
                      "https://docs.astral.sh/uv/) — the Bridge's tests run with `uv run`", state, "environment")
    env = bridge_environment(bridge_repo, environ)
    record["environment"] = str(env.path)
    echo(f"environment: {env.note}")
    sync = sync_argv(uv, bridge_repo, env)
    record["sync"] = shlex.join(["uv", *sync[1:]])
    echo(f"{record['sync']} in {bridge_repo}")
    proc = subprocess.run(sync, cwd=bridge_repo, capture_output=True, text=True, env=env.uv_env)
    sys.stdout.write(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        # an empty Megatron-LM submodule: uv says "does not appear to be a Python project"; the fix is git's
        empty = f"; {MEGATRON_LM} is empty: {submodule_fix(bridge_repo)}" if megatron_lm_empty(bridge_repo) else ""
        return finish("Blocked", f"`{record['sync']}` failed (exit {proc.returncode}): {uv_error(proc.stderr)}{empty}",
                      state, "environment")
    state = bridge_state(bridge_repo)  # record the state the tests actually ran on

    run_env = dict(env.uv_env, **CI_TEST_ENV)
    has_pytest = subprocess.run([uv, "run", "--no-sync", "python", "-c", "import pytest"], cwd=bridge_repo,
                                capture_output=True, text=True, env=run_env)
    if has_pytest.returncode != 0:
        groups = pytest_groups(bridge_repo)
        why = (f"the synced group(s) {', '.join(groups)} did not install it" if groups
               else "no dependency group of the Bridge's pyproject.toml lists pytest")
        return finish("Blocked", f"pytest is not installed in the Bridge's environment {env.path} ({why}: "
                      f"{_last_lines(has_pytest.stderr, 1)}) — the environment, not the tests; fix: install the "
                      f"Bridge's test group (uv sync --group test)", state, "environment")

    run_folder = log_dir / "bridge_unit" / "runs" / f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{state.head}"
    n = 1
    while run_folder.exists():
        run_folder, n = run_folder.with_name(f"{run_folder.name.split('~')[0]}~{n}"), n + 1
    run_folder.mkdir(parents=True)
    junit = run_folder / "junit.xml"
    argv = [*pytest_argv, f"--junitxml={junit}", *present]
    ci_env = " ".join(f"{k}={v}" for k, v in CI_TEST_ENV.items())
    record.update(command=f"cd {shlex.quote(str(bridge_repo))} && {ci_env} {shlex.join(argv)}", junit=str(junit))
    echo(f"running: {record['command']}")
    exit_code, output = _run_streamed([uv, *argv[1:]], bridge_repo, run_env)
    record["pytest_exit"] = exit_code
    if junit.is_file():
        try:
            record["counts"] = junit_counts(junit)
        except (ET.ParseError, ValueError) as e:
            echo(f"cannot read {junit}: {e}")
    counts = record["counts"]
    count_text = ", ".join(f"{v} {k}" for k, v in counts.items() if v) or "no test ran"
    skipped_note = f"; missing: {', '.join(record['missing_paths'])}" if missing else ""
    if exit_code == 0:
        return finish("Pass", f"{count_text}{skipped_note}", state)
    gap = environment_gap(exit_code, counts, junit, output)
    if gap:
        return finish("Blocked", f"test dependency missing in the Bridge's environment {env.path}: "
                      f"No module named {', '.join(repr(m) for m in gap)} (pytest exit {exit_code}, {count_text}) — "
                      f"the environment, not the tests; fix: install it there (the Bridge's CI image has it)"
                      f"{skipped_note}", state, "environment")
    if exit_code == 5:
        return finish("Blocked", f"pytest collected no test (exit 5){skipped_note}", state, "nothing-collected")
    if exit_code in (1, 2):
        what = "tests failed" if exit_code == 1 else "collection errors or interrupted"
        return finish("Fail", f"{what} (pytest exit {exit_code}): {count_text}{skipped_note}", state)
    return finish("Blocked", f"pytest could not run (exit {exit_code}): {_last_lines(output, 2)}{skipped_note}",
                  state, "environment")


def nox_session(session: Any) -> None:
    """`nox -s bridge_unit [-- paths...] [--allow-missing]`: settings from BRIDGE_REPO / LOG_DIR."""
    try:
        extra, allow = parse_posargs(session.posargs)
        settings = resolve({}, os.environ)
        if settings.bridge_repo is None:
            raise UsageError("BRIDGE_REPO is not set (the Megatron-Bridge checkout to test)")
        record, _ = run_bridge_unit(Path(settings.bridge_repo), Path(settings.log_dir), extra, allow)
    except (UsageError, RepoError) as e:
        session.error(f"error: {e}")
        return
    if record["result"] != "Pass":
        session.error(f"Bridge-side checks {record['result']}: {record['detail']}")


def checks_from_record(record: dict) -> BridgeChecks:
    """The deliverable from a record; a non-Pass one leads with the record's own reason (uv's message, ...)."""
    checks = from_record(record)
    if record.get("result") != "Pass" and record.get("detail"):
        checks.detail = f"{record['detail']} — {checks.detail}"
    return checks


def _covers(record: dict, paths: list[str], allow_missing: bool) -> bool:
    """A record answers this level's request if it ran (at least) these paths with the same missing-path stance.

    A Blocked record is reused only when a targeted path was missing and nothing ran (without --allow-missing): the
    commit decides that. Any other Blocked one (no uv, `uv sync` failed, pytest or a test dependency missing,
    nothing collected) is the environment of its time: the fix may be in place, so the checks run again.
    """
    if record.get("result") == "Blocked":
        # records written before `blocked_by`: only a missing path without --allow-missing stopped before uv
        old = "missing-path" if record.get("missing_paths") and not record.get("allow_missing") else None
        if record.get("blocked_by", old) != "missing-path":
            return False
    if not set(paths) <= set(record.get("paths") or TARGETED_TESTS):
        return False
    if record.get("missing_paths") and bool(record.get("allow_missing")) != allow_missing:
        return False  # Blocked without --allow-missing, or ran the rest with it: the level asks the other thing
    return True


def ensure_for_level(log_dir: Path, state: RepoState, skip: bool, extra: Sequence[str], allow_missing: bool,
                     run_dir: Path, environ: dict[str, str], stall_timeout_s: float | None = None) -> BridgeChecks:
    """The level's Bridge-side checks: the matching record, else `nox -s bridge_unit` run now (log in run_dir)."""
    if skip:
        return not_requested()
    paths = requested_paths(extra)
    record = find_record(log_dir, state)
    if record is not None and _covers(record, paths, allow_missing):
        return checks_from_record(record)

    from env.settings import TOOL_PREFIX
    from sessions.run.launch import run_logged, secret_values

    log_path = run_dir / "bridge_unit.log"
    argv = [sys.executable, "-m", "nox", "-f", str(NOXFILE), "-s", "bridge_unit", "--", *extra]
    if allow_missing:
        argv.append(ALLOW_MISSING)
    env = dict(environ, BRIDGE_REPO=state.path, LOG_DIR=str(log_dir))
    print(f"{TOOL_PREFIX} Bridge-side checks: no record for Bridge {state.head} in this state; running "
          f"nox -s bridge_unit (log: {log_path})", flush=True)
    started = time.time()
    with open(log_path, "ab") as log:
        result = run_logged(argv, cwd=NOXFILE.parent, env=env, log=log, log_path=log_path,
                            stall_timeout=stall_timeout_s, secrets=secret_values(environ))
    if result.termination == "interrupted":
        raise KeyboardInterrupt  # the user stopped the level, not just its unit tests (log kept above)
    written = None
    for line in log_path.read_text(errors="replace").splitlines():
        if line.startswith(RECORD_LINE):
            written = Path(line[len(RECORD_LINE):].strip())
    record = None
    if written is not None and written.is_file():
        record = dict(json.loads(written.read_text()), path=str(written))
    if record is None or record.get("finished", 0) < started:
        if result.termination:
            return BridgeChecks("Blocked", f"nox -s bridge_unit stopped ({result.termination}) before writing a "
                                           f"record; log: {log_path}")
        tail = _last_lines(log_path.read_text(errors="replace"), 2)
        return BridgeChecks("Blocked", f"nox -s bridge_unit wrote no record (exit {result.exit_code}): {tail}; "
                                       f"log: {log_path}")
    checks = checks_from_record(record)
    checks.detail += f"; log: {log_path}"
    if record.get("fingerprint") != state.fingerprint:
        checks.detail += (f"; the Bridge state changed while they ran (e.g. uv.lock written): record "
                          f"{record.get('fingerprint')}, level started at {state.fingerprint}")
    return checks


__all__ = ["run_bridge_unit", "nox_session", "ensure_for_level", "records_dir", "junit_counts", "check_paths"]
