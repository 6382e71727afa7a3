"""Nox sessions: this project's own tests and lint, the Bridge unit-test environment (`bridge_unit`) and the
verl container environment (`verl`). Session bodies live in sessions/; this file only declares them.
"""

import atexit
import functools
import logging
import os
import re
import sys
from pathlib import Path

import nox

# The session bodies import this project's packages; nox may be installed outside the project's environment.
sys.path.insert(0, str(Path(__file__).resolve().parent))
logging.getLogger("git").setLevel(logging.WARNING)  # nox logs at DEBUG: keep gitpython's commands out

# nox exits 1 for any failed session; this tool's table (env/protocol/exits.py) says 2 bad usage, 3 Blocked, 130
# interrupted. Each session below records its outcome; when every session run recorded one, the process exits with
# the worst of them (interrupted > bad usage > Fail > Blocked > Pass) once nox has finished.
_OUTCOMES: list[int] = []
_RANK = {130: 4, 2: 3, 1: 2, 3: 1, 0: 0}


def _outcome_of(message: str) -> int:
    """The exit code a failed session's message stands for (the session bodies' own wording)."""
    if message.startswith("error: "):
        return 2  # a UsageError: one line, nothing run
    m = re.search(r"exited (\d+)", message)  # nox -s verl: the task's own code
    if m:
        return int(m.group(1))
    if re.match(r"Bridge-side checks Blocked", message):
        return 3
    return 1


def _exit_with_outcome() -> None:
    if not _OUTCOMES or len(_OUTCOMES) < _STARTED[0]:
        return  # a session without an outcome of its own: nox's code stands
    code = max(_OUTCOMES, key=lambda c: _RANK.get(c, 2))
    if code:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


_STARTED = [0]
atexit.register(_exit_with_outcome)


def outcome(func):
    """Record the session's outcome in the tool's exit-code table (see _exit_with_outcome)."""

    @functools.wraps(func)
    def body(session: nox.Session) -> None:
        _STARTED[0] += 1
        try:
            func(session)
        except KeyboardInterrupt:
            _OUTCOMES.append(130)
            raise
        except Exception as e:  # nox's own _SessionQuit (session.error) and CommandFailed among them
            _OUTCOMES.append(_outcome_of(" ".join(str(a) for a in getattr(e, "args", ()))))
            raise
        _OUTCOMES.append(0)

    return body


nox.options.default_venv_backend = "uv|virtualenv"
nox.options.sessions = ["lint", "tests"]


@nox.session
@outcome
def tests(session: nox.Session) -> None:
    """This project's test suite (real git, nox, uv, sshd, Slurm, Ray; fixture verl/Bridge checkouts).

    In parallel: `-n 2 --dist loadgroup` (pytest-xdist; tests sharing Slurm, the test sshd or Ray run in one
    worker), the 25 slowest tests listed. VERL_E2E_TEST_WORKERS=N (or `auto`) sets the workers, 0 runs serially.
    Extra pytest arguments after `--`, e.g. `nox -s tests -- -k level0 -x`.
    """
    import os

    session.install("-e", ".[test]")
    workers = os.environ.get("VERL_E2E_TEST_WORKERS", "2")
    parallel = [] if workers == "0" else ["-n", workers, "--dist", "loadgroup"]
    session.run("python", "-m", "pytest", *parallel, "--durations=25", *session.posargs)


@nox.session
@outcome
def lint(session: nox.Session) -> None:
    """ruff over the project (fixture checkouts excluded)."""
    session.install("ruff")
    session.run("ruff", "check", ".")


@nox.session(venv_backend="none")
@outcome
def bridge_unit(session: nox.Session) -> None:
    """Megatron-Bridge's targeted unit tests in $BRIDGE_REPO, as Bridge's CI runs them, recorded for levels.

    Posargs: extra model-specific test paths, and `--allow-missing` to run the rest when a targeted path does not
    exist at this commit, e.g. `nox -s bridge_unit -- tests/unit_tests/models/qwen/test_qwen3_provider.py`.
    The record (Bridge commit + dirty files, counts, junit, command) goes under $LOG_DIR/bridge_unit/records.
    """
    from sessions.bridge_unit.session import nox_session

    nox_session(session)


@nox.session(venv_backend="none")
@outcome
def verl(session: nox.Session) -> None:
    """The verl container environment: the image's own Python, PYTHONPATH = Bridge src + Megatron-LM + verl.

    Installs nvidia-modelopt only when missing, then runs the invoke task given after `--`,
    e.g. `nox -s verl -- level0 --model Qwen/Qwen2.5-0.5B` (VERL_USE_UV=0: nothing of the image is reinstalled).
    """
    from env.launchers.image import nox_session

    nox_session(session)
