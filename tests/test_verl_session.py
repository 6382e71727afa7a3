"""`nox -s verl -- <task>` through the real nox: the image's own Python (here: a venv standing in for it),
PYTHONPATH per SPEC, modelopt installed only when missing, VERL_USE_UV=0 said in the report; refusal when that
Python cannot import verl."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests import local_index
from tests.conftest import PROJECT


def nox_verl(workspace, *task: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nox", "-f", str(PROJECT / "noxfile.py"), "-s", "verl", "--", *task],
                          cwd=PROJECT, env={**workspace.env, **(env or {})}, capture_output=True, text=True,
                          timeout=300)


def test_runs_the_task_in_the_image_python(workspace):
    proc = nox_verl(workspace, "level0", "--skip-bridge-checks")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    pythonpath = f"{workspace.bridge}/src:{workspace.bridge}/3rdparty/Megatron-LM:{workspace.verl}"
    assert f"PYTHONPATH={pythonpath}" in out
    assert "modelopt importable: nothing installed" in out  # the fixture site provides it
    [run_dir] = workspace.run_dirs()
    record = json.loads((run_dir / "run.json").read_text())
    assert record["pythonpath"].startswith(pythonpath)
    launcher = next(c for c in record["preflight"] if c["name"] == "launcher")
    assert launcher["detail"] == "VERL_USE_UV=0 (running in the image's own Python (nox -s verl))"
    env = json.loads((run_dir / "env.json").read_text())
    assert env["VERL_USE_UV"] == "0" and env["VERL_E2E_IMAGE_PYTHON"] == "1"
    assert (run_dir / "verl.log").read_text().count("+ VANILLA_MBRIDGE=False") >= 1


def test_installs_modelopt_only_when_missing(workspace, tmp_path):
    python = local_index.fresh_venv(tmp_path / "image-python")
    # an image's Python has the stack (ray: preflight blocks without it); here: this machine's, through a .pth
    stack = next(p for p in sys.path if p.endswith("site-packages"))
    [site] = list((tmp_path / "image-python").glob("lib/python3*/site-packages"))
    (site / "stack.pth").write_text(stack + "\n")
    for k in [k for k in workspace.env if k.startswith("PIP_")]:
        del workspace.env[k]
    with local_index.package_index(tmp_path / "index") as url:
        # no fixture modelopt on the path: the image lacks it
        env = {"VERL_PYTHON": python, "PYTHONPATH": "", "MODELOPT_INDEX_URL": f"{url}/simple/",
               "PIP_INDEX_URL": f"{url}/empty/", "PIP_NO_CACHE_DIR": "1"}
        first = nox_verl(workspace, "level0", "--skip-bridge-checks", env=env)
        second = nox_verl(workspace, "level0", "--skip-bridge-checks", env=env)
    assert first.returncode == 0, (first.stdout + first.stderr)[-4000:]
    assert f"installed nvidia-modelopt {local_index.VERSION} into {python}" in first.stdout
    assert second.returncode == 0 and "modelopt importable: nothing installed" in second.stdout
    first_run = workspace.run_dirs()[0]
    record = json.loads((first_run / "run.json").read_text())
    checks = {c["name"]: c for c in record["preflight"]}
    assert checks["modelopt"]["status"] == "ok"
    [setup] = record["evidence"]["container_setup"]
    assert setup["action"] == "installed" and setup["python"] == python
    summary = json.loads((first_run / "summary.json").read_text())
    assert any("container setup: nvidia-modelopt 0.0.1 installed" in n for n in summary["notes"])


@pytest.mark.parametrize("case", ["verl_not_importable", "no_task"])
def test_refuses_clearly(workspace, case):
    if case == "verl_not_importable":
        init = workspace.verl / "verl" / "__init__.py"
        init.write_text("import vllm_only_in_the_image  # noqa\n" + init.read_text())
        proc = nox_verl(workspace, "level0", "--skip-bridge-checks")
        expect = "cannot import verl with PYTHONPATH="
    else:
        proc = nox_verl(workspace)
        expect = "usage: nox -s verl -- <invoke task> [args]"
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and expect in out, out[-3000:]
    if case == "verl_not_importable":
        assert "No module named 'vllm_only_in_the_image'" in out
    assert "Traceback" not in out
    assert workspace.run_dirs() == []
