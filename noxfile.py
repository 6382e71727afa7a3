"""Nox sessions: this project's own tests and lint, the Bridge unit-test environment (`bridge_unit`) and the
verl container environment (`verl`). Session bodies live in sessions/; this file only declares them.
"""

import nox

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
