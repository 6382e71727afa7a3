"""Nox sessions: this project's own tests and lint, the Bridge unit-test environment (`bridge_unit`) and the
verl container environment (`verl`). Session bodies live in sessions/; this file only declares them.
"""

import logging
import sys
from pathlib import Path

import nox

# The session bodies import this project's packages; nox may be installed outside the project's environment.
sys.path.insert(0, str(Path(__file__).resolve().parent))
logging.getLogger("git").setLevel(logging.WARNING)  # nox logs at DEBUG: keep gitpython's commands out

nox.options.default_venv_backend = "uv|virtualenv"
nox.options.sessions = ["lint", "tests"]


@nox.session
def tests(session: nox.Session) -> None:
    """This project's test suite (real git, nox, uv, sshd, Slurm, Ray; fixture verl/Bridge checkouts).

    Extra pytest arguments after `--`, e.g. `nox -s tests -- -k level0 -x`.
    """
    session.install("-e", ".[test]")
    session.run("python", "-m", "pytest", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the project (fixture checkouts excluded)."""
    session.install("ruff")
    session.run("ruff", "check", ".")


@nox.session(venv_backend="none")
def bridge_unit(session: nox.Session) -> None:
    """Megatron-Bridge's targeted unit tests in $BRIDGE_REPO, as Bridge's CI runs them, recorded for levels.

    Posargs: extra model-specific test paths, and `--allow-missing` to run the rest when a targeted path does not
    exist at this commit, e.g. `nox -s bridge_unit -- tests/unit_tests/models/qwen/test_qwen3_provider.py`.
    The record (Bridge commit + dirty files, counts, junit, command) goes under $LOG_DIR/bridge_unit/records.
    """
    from sessions.bridge_unit.session import nox_session

    nox_session(session)


@nox.session(venv_backend="none")
def verl(session: nox.Session) -> None:
    """The verl container environment: the image's own Python, PYTHONPATH = Bridge src + Megatron-LM + verl.

    Installs nvidia-modelopt only when missing, then runs the invoke task given after `--`,
    e.g. `nox -s verl -- level0 --model Qwen/Qwen2.5-0.5B` (VERL_USE_UV=0: nothing of the image is reinstalled).
    """
    from env.launchers.image import nox_session

    nox_session(session)
