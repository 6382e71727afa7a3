"""`nox -s bridge_unit` syncs the Bridge's own environment: its `.venv`, or the container environment
UV_PROJECT_ENVIRONMENT names when that one is the Bridge's own (Bridge's CI image: /opt/venv, an editable install of
the checkout, torch from the image) — never one the caller merely runs in (nox's, this project's CI venv)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.test_bridge_unit import MIXIN, nox_bridge_unit, record_for


def make_venv(path: Path, *packages: str) -> Path:
    subprocess.run(["uv", "venv", "-q", "--python", sys.executable, str(path)], check=True)
    if packages:
        subprocess.run(["uv", "pip", "install", "-q", "--python", str(path / "bin/python"), *packages], check=True)
    return path


def site_packages(venv: Path) -> Path:
    out = subprocess.run([str(venv / "bin/python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def test_bridge_unit_leaves_an_exported_project_environment_alone(workspace, tmp_path):
    # nox's uv backend exports UV_PROJECT_ENVIRONMENT / VIRTUAL_ENV; a `uv sync` that honoured them would strip
    # the caller's environment down to the Bridge's test deps.
    outer = make_venv(tmp_path / "outer-venv", "six")
    proc = nox_bridge_unit(workspace, env={"UV_PROJECT_ENVIRONMENT": str(outer), "VIRTUAL_ENV": str(outer)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    still = subprocess.run([str(outer / "bin/python"), "-c", "import six"], capture_output=True)
    assert still.returncode == 0, "bridge_unit's uv sync uninstalled the caller's packages"
    assert (workspace.bridge / ".venv").is_dir()
    assert (f"environment: the Bridge's own {workspace.bridge / '.venv'}; UV_PROJECT_ENVIRONMENT={outer} left alone: "
            f"not this Bridge's environment (no megatron.bridge there)") in proc.stdout


def test_bridge_unit_uses_the_bridge_containers_own_environment(workspace, tmp_path):
    # Bridge's CI image: UV_PROJECT_ENVIRONMENT=/opt/venv holds what the tests import (torch there; `six` here) and
    # megatron.bridge as an editable install of the checkout. A fresh .venv would lack them.
    container = make_venv(tmp_path / "opt-venv", "six")
    (site_packages(container) / "__editable__.megatron_bridge.pth").write_text(f"{workspace.bridge / 'src'}\n")
    (workspace.bridge / MIXIN).write_text("import six\n\n\ndef test_mixin_uses_the_image():\n    assert six.PY3\n")
    proc = nox_bridge_unit(workspace, env={"UV_PROJECT_ENVIRONMENT": str(container), "VIRTUAL_ENV": str(container)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = record_for(workspace)
    assert record["result"] == "Pass" and record["counts"]["passed"] == 3
    assert record["environment"] == str(container) and record["sync"] == "uv sync --locked --inexact --group test"
    assert not (workspace.bridge / ".venv").exists()
    kept = subprocess.run([str(container / "bin/python"), "-c", "import six, pytest"], capture_output=True)
    assert kept.returncode == 0, "the image's packages must stay; the test group is added"
    assert (f"environment: UV_PROJECT_ENVIRONMENT={container}: the Bridge's own environment (megatron.bridge there "
            f"is this checkout's {workspace.bridge / 'src/megatron/bridge/__init__.py'})") in proc.stdout
