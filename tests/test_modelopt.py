"""`invoke install-modelopt` with real pip, into a fresh venv, from a local PEP 503 index (`python -m http.server`)
holding a small `nvidia-modelopt` wheel built here."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from env.preflight.modelopt import check_container_setup
from env.settings import resolve
from sessions.run.level import LevelOptions, build_context
from tests import local_index
from tests.local_index import VERSION


@pytest.fixture
def package_index(tmp_path):
    with local_index.package_index(tmp_path / "index") as url:
        yield url


@pytest.fixture
def fresh_python(tmp_path) -> str:
    return local_index.fresh_venv(tmp_path / "image-python")


def test_install_once_then_nothing_to_do(workspace, package_index, fresh_python):
    # only our index: no PyPI, no find-links, no cache from earlier runs
    pip_env = {"PIP_INDEX_URL": f"{package_index}/empty/", "PIP_NO_CACHE_DIR": "1",
               "VERL_PYTHON": fresh_python, "PYTHONPATH": ""}
    for k in [k for k in workspace.env if k.startswith("PIP_")]:
        del workspace.env[k]

    def modelopt_version():
        proc = subprocess.run([fresh_python, "-c", "import modelopt; print(modelopt.__version__)"],
                              capture_output=True, text=True, env={"PATH": os.environ["PATH"]})
        return proc.stdout.strip() if proc.returncode == 0 else None

    dry = workspace.invoke("install-modelopt", "--dry-run", env=dict(pip_env, MODELOPT_INDEX_URL="https://x.test/"))
    assert dry.returncode == 0 and "--extra-index-url https://x.test/ nvidia-modelopt" in dry.stdout
    assert modelopt_version() is None

    # the index does not have it: one line, pip's reason, exit 1, and the failure recorded
    missing = workspace.invoke("install-modelopt", env=dict(pip_env, MODELOPT_INDEX_URL=f"{package_index}/empty/"))
    errors = [ln for ln in missing.stderr.splitlines() if ln.startswith("error: ")]
    assert missing.returncode == 1 and len(errors) == 1, missing.stderr
    assert "No matching distribution found for nvidia-modelopt" in errors[0]
    [failed] = list((workspace.log_dir / "container_setup").glob("*.json"))
    assert json.loads(failed.read_text())["action"] == "failed"
    failed.unlink()

    env = dict(pip_env, MODELOPT_INDEX_URL=f"{package_index}/simple/")
    first = workspace.invoke("install-modelopt", env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert f"installed nvidia-modelopt {VERSION} into {fresh_python}" in first.stdout
    assert modelopt_version() == VERSION

    second = workspace.invoke("install-modelopt", env=env)
    assert second.returncode == 0 and "already installed" in second.stdout and "nothing to do" in second.stdout

    records = sorted((workspace.log_dir / "container_setup").glob("*.json"))
    actions = [json.loads(p.read_text()) for p in records]
    assert sorted(a["action"] for a in actions) == ["installed", "present"]
    assert all(a["python"] == fresh_python and a["index_url"] == f"{package_index}/simple/" for a in actions)
    installed = next(a for a in actions if a["action"] == "installed")
    assert installed["source"] == f"nvidia-modelopt {VERSION} from index {package_index}"

    # a level in that Python quotes the newest record as container-setup evidence
    settings = resolve({"python": fresh_python}, workspace.env)
    ctx = build_context(LevelOptions(0), settings, probe=False)
    [check] = list(check_container_setup(ctx))
    assert check.status == "ok" and VERSION in check.detail
    assert ctx.evidence["container_setup"][0]["action"] == "present"
    assert any("not a repo change" in n for n in ctx.notes)


def test_python_without_pip_is_one_line(workspace, tmp_path):
    python = local_index.fresh_venv(tmp_path / "nopip", with_pip=False)
    proc = workspace.invoke("install-modelopt", env={"VERL_PYTHON": python,
                                                     "PYTHONPATH": os.devnull})
    assert proc.returncode == 1 and proc.stderr.strip().startswith("error: ") and "has no pip" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_modelopt_without_its_dependency_is_repaired_not_already_installed(workspace, tmp_path):
    """The real H200 image: nvidia-modelopt installed without pulp. install-modelopt installs the missing dependency
    (only it), instead of saying "already installed"; the preflight then finds the LoRA save path's import working."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    plugins = "modelopt/torch/opt/plugins/__init__.py"
    modelopt = local_index.build_wheel(wheels, files={
        "modelopt/__init__.py": f'__version__ = "{VERSION}"\n', "modelopt/torch/__init__.py": "",
        "modelopt/torch/opt/__init__.py": "", plugins: "import pulp  # noqa\n"}, requires=("pulp",))
    pulp = local_index.build_wheel(wheels, name="pulp", version="2.9.0", files={"pulp/__init__.py": ""})
    python = local_index.fresh_venv(tmp_path / "image-python")
    for k in [k for k in workspace.env if k.startswith("PIP_")]:
        del workspace.env[k]
    # as on the host: the wheel went in with --no-deps
    subprocess.run([python, "-m", "pip", "install", "--no-deps", "--no-index", str(modelopt)], check=True,
                   capture_output=True)
    broken = subprocess.run([python, "-c", "import modelopt.torch.opt.plugins"], capture_output=True, text=True,
                            env={"PATH": os.environ["PATH"]})
    assert "No module named 'pulp'" in broken.stderr
    with local_index.package_index(tmp_path / "index", {"nvidia-modelopt": modelopt, "pulp": pulp}) as url:
        env = {"PIP_INDEX_URL": f"{url}/empty/", "PIP_NO_CACHE_DIR": "1", "VERL_PYTHON": python, "PYTHONPATH": "",
               "MODELOPT_INDEX_URL": f"{url}/simple/"}
        repair = workspace.invoke("install-modelopt", env=env)
        again = workspace.invoke("install-modelopt", env=env)
    assert repair.returncode == 0, repair.stdout + repair.stderr
    assert "already installed" not in repair.stdout
    assert "is installed without its dependencies pulp" in repair.stdout
    assert f"installed pulp into {python}: nvidia-modelopt {VERSION} is complete" in repair.stdout
    fixed = subprocess.run([python, "-c", "import modelopt.torch.opt.plugins"], capture_output=True, text=True,
                           env={"PATH": os.environ["PATH"]})
    assert fixed.returncode == 0, fixed.stderr
    assert again.returncode == 0 and "already installed" in again.stdout and "nothing to do" in again.stdout
    records = [json.loads(p.read_text()) for p in sorted((workspace.log_dir / "container_setup").glob("*.json"))]
    repaired = next(r for r in records if r["action"] == "repaired")
    assert repaired["dependencies_installed"] == ["pulp"] and repaired["version"] == VERSION


def _offline_wheels(tmp_path):
    """The GPU kit's wheel folder, shaped like the real one: nvidia-modelopt whose opt.plugins imports pulp and (as
    the real modelopt's plugins do) vLLM, whose import prints a `WARNING <date> [cuda ...` line on stdout."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    plugins = "modelopt/torch/opt/plugins/__init__.py"
    local_index.build_wheel(wheels, files={
        "modelopt/__init__.py": f'__version__ = "{VERSION}"\n', "modelopt/torch/__init__.py": "",
        "modelopt/torch/opt/__init__.py": "", plugins: "import vllm_fixture  # noqa\nimport pulp  # noqa\n"},
        requires=("pulp",))
    local_index.build_wheel(wheels, name="pulp", version="3.3.2", files={"pulp/__init__.py": ""})
    # in the image (not in the folder): a vLLM-like package that talks on stdout when imported
    stack = tmp_path / "stack"
    stack.mkdir()
    (stack / "vllm_fixture.py").write_text(
        "print('WARNING 12-01 08:29:17 [cuda.py:123] vLLM-like warning printed on import')\n")
    return wheels, stack


def test_install_modelopt_offline_from_a_wheel_folder_records_where_it_came_from(workspace, tmp_path):
    """Issue 24: `--find-links DIR` with no index; the dependency probe is not fooled by a stdout WARNING line; the
    record says the packages came from the folder (pip's own --report), not from an index."""
    wheels, stack = _offline_wheels(tmp_path)
    python = local_index.fresh_venv(tmp_path / "image-python")
    for k in [k for k in workspace.env if k.startswith("PIP_")]:
        del workspace.env[k]
    env = {"PIP_NO_CACHE_DIR": "1", "VERL_PYTHON": python, "PYTHONPATH": str(stack),
           "MODELOPT_INDEX_URL": "http://127.0.0.1:9/unreachable/"}
    dry = workspace.invoke("install-modelopt", "--dry-run", "--find-links", str(wheels), env=env)
    assert dry.returncode == 0 and f"--no-index --find-links {wheels} nvidia-modelopt" in dry.stdout, dry.stdout
    proc = workspace.invoke("install-modelopt", "--find-links", str(wheels), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "WARNING 12-01" not in proc.stdout  # never taken for a module name
    ok = subprocess.run([python, "-c", "import modelopt.torch.opt.plugins"], capture_output=True, text=True,
                        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(stack)})
    assert ok.returncode == 0, ok.stderr
    [record] = [json.loads(p.read_text()) for p in (workspace.log_dir / "container_setup").glob("*.json")]
    assert record["action"] == "installed" and record["find_links"] == str(wheels) and record["index_url"] is None
    names = {i["name"]: i for i in record["installed"]}
    assert set(names) == {"nvidia-modelopt", "pulp"}, names
    assert all(i["source"] == f"local wheel folder {wheels}" for i in names.values())
    assert record["source"] == f"nvidia-modelopt {VERSION}, pulp 3.3.2 from local wheel folder {wheels}"
    assert f"from local wheel folder {wheels}" in proc.stdout
    # a level in that Python quotes it: from the folder, never "the NVIDIA index"
    settings = resolve({"python": python}, workspace.env)
    ctx = build_context(LevelOptions(0), settings, probe=False)
    [check] = list(check_container_setup(ctx))
    assert f"local wheel folder {wheels}" in check.detail and "pypi.nvidia.com" not in " ".join(ctx.notes)


def test_pips_own_offline_settings_and_a_stdout_warning_repair_the_right_package(workspace, tmp_path):
    """The 2026-12-01 host: PIP_NO_INDEX/PIP_FIND_LINKS, modelopt already in without pulp, vLLM printing WARNING on
    import: only pulp is installed (never `pip install 'WARNING ...'`), from the folder, and recorded."""
    wheels, stack = _offline_wheels(tmp_path)
    python = local_index.fresh_venv(tmp_path / "image-python")
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--find-links", str(wheels),
                    "nvidia-modelopt"], check=True, capture_output=True)
    for k in [k for k in workspace.env if k.startswith("PIP_")]:
        del workspace.env[k]
    env = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels), "PIP_NO_CACHE_DIR": "1", "VERL_PYTHON": python,
           "PYTHONPATH": str(stack)}
    proc = workspace.invoke("install-modelopt", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "'WARNING" not in proc.stdout + proc.stderr
    [record] = [json.loads(p.read_text()) for p in (workspace.log_dir / "container_setup").glob("*.json")]
    assert record["action"] == "repaired" and record["dependencies_installed"] == ["pulp"]
    assert record["pip_config"]["PIP_NO_INDEX"] == "1"
    assert record["source"] == f"pulp 3.3.2 from local wheel folder {wheels}"


def test_a_failed_install_writes_its_record_too(workspace, tmp_path):
    empty = tmp_path / "empty-wheels"
    empty.mkdir()
    python = local_index.fresh_venv(tmp_path / "image-python")
    for k in [k for k in workspace.env if k.startswith("PIP_")]:
        del workspace.env[k]
    proc = workspace.invoke("install-modelopt", "--find-links", str(empty),
                            env={"VERL_PYTHON": python, "PYTHONPATH": "", "PIP_NO_CACHE_DIR": "1"})
    assert proc.returncode == 1 and "No matching distribution found for nvidia-modelopt" in proc.stderr
    [record] = [json.loads(p.read_text()) for p in (workspace.log_dir / "container_setup").glob("*.json")]
    assert record["action"] == "failed" and "No matching distribution" in record["error"]
    assert record["source"] == "nothing installed"
