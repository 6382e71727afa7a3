"""`nox -s bridge_unit` must sync the Bridge's own environment, never the one the caller runs in."""

from __future__ import annotations

import subprocess
import sys

from tests.test_bridge_unit import nox_bridge_unit


def test_bridge_unit_leaves_an_exported_project_environment_alone(workspace, tmp_path):
    # nox's uv backend exports UV_PROJECT_ENVIRONMENT / VIRTUAL_ENV; a `uv sync` that honoured them would strip
    # the caller's environment down to the Bridge's test deps.
    outer = tmp_path / "outer-venv"
    subprocess.run(["uv", "venv", "-q", "--python", sys.executable, str(outer)], check=True)
    subprocess.run(["uv", "pip", "install", "-q", "--python", str(outer / "bin/python"), "six"], check=True)
    proc = nox_bridge_unit(workspace, env={"UV_PROJECT_ENVIRONMENT": str(outer), "VIRTUAL_ENV": str(outer)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    still = subprocess.run([str(outer / "bin/python"), "-c", "import six"], capture_output=True)
    assert still.returncode == 0, "bridge_unit's uv sync uninstalled the caller's packages"
    assert (workspace.bridge / ".venv").is_dir()
