"""Body of `nox -s bridge_unit`: the procedure's targeted Megatron-Bridge unit tests, run with the Bridge's own uv
environment, recorded so that level reports find the outcome of the same Bridge state (sessions/bridge_checks.py).

Order: every path is checked first (a renamed test file must not become "pytest exit 4, nothing ran"), then
`uv sync`, then `uv run python -m pytest -q --junitxml=...`. Counts come from the junit file. Results:
Pass (pytest exit 0), Fail (tests failed or did not collect), Blocked (missing targeted path without
--allow-missing, uv missing or `uv sync` failing, nothing collected: no evidence either way).

`ensure_for_level` is what a level does when it has no matching record: run `nox -s bridge_unit` itself.
"""

from __future__ import annotations

import difflib
import os
import shlex
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from env.repos import RepoError, RepoState, bridge_state
from env.settings import UsageError, resolve
from sessions.bridge_checks import (
    TARGETED_TESTS,
    BridgeChecks,
    find_record,
    from_record,
    not_requested,
    records_dir,
    write_record,
)

ALLOW_MISSING = "--allow-missing"
NOXFILE = Path(__file__).resolve().parent.parent / "noxfile.py"
RECORD_LINE = "bridge_unit record: "
SKIP_DIRS = {".venv", ".git", "node_modules", "__pycache__", ".pytest_cache", "3rdparty"}

Echo = Callable[[str], None]


def _say(msg: str) -> None:
    print(f"[bridge_unit] {msg}", flush=True)


@dataclass
class MissingPath:
    path: str
    hints: list[str]

    def describe(self) -> str:
        hint = f" (closest existing: {', '.join(self.hints)})" if self.hints else " (no similar test file found)"
        return f"{self.path}{hint}"


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


def _test_files(repo: Path) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(repo):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
        for name in filenames:
            if name.startswith("test_") and name.endswith(".py"):
                out.append(str((Path(dirpath) / name).relative_to(repo)))
    return sorted(out)


def closest_tests(missing: str, candidates: list[str], n: int = 3) -> list[str]:
    """Same file name elsewhere first (a moved file), then the most similar paths (a renamed one)."""
    base = Path(missing.split("::")[0]).name
    moved = [c for c in candidates if Path(c).name == base]
    similar = difflib.get_close_matches(missing, candidates, n=n, cutoff=0.5)
    by_name = difflib.get_close_matches(base, [Path(c).name for c in candidates], n=n, cutoff=0.6)
    similar += [c for c in candidates if Path(c).name in by_name]
    return list(dict.fromkeys(moved + similar))[:n]


def check_paths(repo: Path, paths: Sequence[str]) -> tuple[list[str], list[MissingPath]]:
    """(present, missing with hints). A `file::test` node id counts as present when its file exists."""
    present, missing = [], []
    candidates: list[str] | None = None
    for p in paths:
        if (repo / p.split("::")[0]).exists():
            present.append(p)
            continue
        if candidates is None:
            candidates = _test_files(repo)
        missing.append(MissingPath(p, closest_tests(p, candidates)))
    return present, missing


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


def run_bridge_unit(bridge_repo: Path, log_dir: Path, extra: Sequence[str] = (), allow_missing: bool = False,
                    echo: Echo = _say) -> tuple[dict[str, Any], Path]:
    """Run the checks in `bridge_repo`, write the record under `log_dir`; returns (record, record path)."""
    bridge_repo = Path(bridge_repo)
    started = time.monotonic()
    state = bridge_state(bridge_repo)
    paths = requested_paths(extra)
    pytest_argv = ["uv", "run", "python", "-m", "pytest", "-q"]
    record: dict[str, Any] = {
        "result": "Blocked", "detail": "", "counts": {}, "paths": paths, "missing_paths": [],
        "allow_missing": allow_missing, "command": "nox -s bridge_unit", "junit": None, "duration_s": 0.0,
        "pytest_exit": None,
    }

    def finish(result: str, detail: str, st: RepoState) -> tuple[dict[str, Any], Path]:
        record.update(result=result, detail=detail, duration_s=round(time.monotonic() - started, 2))
        path = write_record(log_dir, st, record)
        echo(f"{result}: {detail}")
        print(f"{RECORD_LINE}{path}", flush=True)
        return record, path

    present, missing = check_paths(bridge_repo, paths)
    record["missing_paths"] = [m.path for m in missing]
    for m in missing:
        echo(f"missing at {state.head}: {m.describe()}")
    if missing and not allow_missing:
        return finish("Blocked", f"{len(missing)} targeted path(s) missing at Bridge {state.head}: "
                      + "; ".join(m.describe() for m in missing)
                      + f" — update the path(s), or {ALLOW_MISSING} to run the rest", state)
    if not present:
        return finish("Blocked", "no requested test path exists at this commit: nothing to run", state)

    uv = shutil.which("uv")
    if uv is None:
        return finish("Blocked", "uv not found on PATH: install uv (pip install uv, or "
                      "https://docs.astral.sh/uv/) — the Bridge's tests run with `uv run`", state)
    # The Bridge's own environment (its .venv), never one this process happens to run in: nox's uv backend
    # exports UV_PROJECT_ENVIRONMENT, and `uv sync` would then strip that environment down to the Bridge's deps.
    uv_env = {k: v for k, v in os.environ.items() if k not in ("UV_PROJECT_ENVIRONMENT", "VIRTUAL_ENV")}
    echo(f"uv sync in {bridge_repo}")
    sync = subprocess.run([uv, "sync"], cwd=bridge_repo, capture_output=True, text=True, env=uv_env)
    sys.stdout.write(sync.stdout + sync.stderr)
    if sync.returncode != 0:
        return finish("Blocked", f"`uv sync` failed (exit {sync.returncode}): {uv_error(sync.stderr)}", state)
    # uv sync may write uv.lock: record the state the tests actually ran on
    state = bridge_state(bridge_repo)

    run_folder = log_dir / "bridge_unit" / "runs" / f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{state.head}"
    n = 1
    while run_folder.exists():
        run_folder, n = run_folder.with_name(f"{run_folder.name.split('~')[0]}~{n}"), n + 1
    run_folder.mkdir(parents=True)
    junit = run_folder / "junit.xml"
    argv = [*pytest_argv, f"--junitxml={junit}", *present]
    record.update(command=f"cd {shlex.quote(str(bridge_repo))} && {shlex.join(argv)}", junit=str(junit))
    echo(f"running: {record['command']}")
    proc = subprocess.run([uv, *argv[1:]], cwd=bridge_repo, env=uv_env)
    record["pytest_exit"] = proc.returncode
    if junit.is_file():
        try:
            record["counts"] = junit_counts(junit)
        except (ET.ParseError, ValueError) as e:
            echo(f"cannot read {junit}: {e}")
    counts = record["counts"]
    count_text = ", ".join(f"{v} {k}" for k, v in counts.items() if v) or "no test ran"
    skipped_note = f"; missing: {', '.join(record['missing_paths'])}" if missing else ""
    if proc.returncode == 0:
        return finish("Pass", f"{count_text}{skipped_note}", state)
    if proc.returncode == 5:
        return finish("Blocked", f"pytest collected no test (exit 5){skipped_note}", state)
    if proc.returncode in (1, 2):
        what = "tests failed" if proc.returncode == 1 else "collection errors or interrupted"
        return finish("Fail", f"{what} (pytest exit {proc.returncode}): {count_text}{skipped_note}", state)
    return finish("Blocked", f"pytest could not run (exit {proc.returncode}){skipped_note}", state)


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

    Blocked records of an environment problem (no uv, `uv sync` failed) are not reused: the fix may be in place.
    """
    if record.get("result") == "Blocked" and not record.get("missing_paths"):
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

    from sessions.launch import TOOL_PREFIX, run_logged, secret_values

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
        import json

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
