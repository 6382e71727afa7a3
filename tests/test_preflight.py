"""Preflight's environment checks against what the real H200 run met (issue 16): flash-attn absent, Bridge's model
build missing megatron.energon, modelopt installed without pulp — each found before verl starts, with the package
named. Checks run in-process on fixture checkouts with the real import probe (a real interpreter, real files)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from env.preflight.checklist import first_blocked, run_checks
from env.preflight.checks import BLOCKED, OK, WARN
from env.settings import resolve
from sessions.run.level import LevelOptions, build_context

ACTOR_FUSED = "++actor_rollout_ref.actor.megatron.override_transformer_config.attention_backend=fused"
REF_FUSED = "++actor_rollout_ref.ref.megatron.override_transformer_config.attention_backend=fused"
CRITIC_FUSED = "++critic.megatron.override_transformer_config.attention_backend=fused"


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _checks(workspace, extra: list[str] | None = None, level: int = 0, doctor: bool = True, **env):
    # pip's own settings of this machine (PIP_FIND_LINKS) would change the install hint
    environ = {k: v for k, v in dict(workspace.env, **env).items() if not k.startswith("PIP_")}
    settings = resolve({"python": sys.executable}, environ)
    opts = LevelOptions(level, extra_overrides=list(extra or []))
    ctx = build_context(opts, settings, probe=True)
    ctx.environ = environ
    return ctx, {c.name: c for c in run_checks(ctx, stop_at_blocked=not doctor)}


def _with_pythonpath(monkeypatch, workspace, *extra: Path) -> None:
    path = ":".join([*(str(p) for p in extra), workspace.env["PYTHONPATH"]])
    workspace.env["PYTHONPATH"] = path
    monkeypatch.setenv("PYTHONPATH", path)  # build_context composes from the process environment


# verl v0.9.0's and HEAD's verl/trainer/config/ref/megatron_ref.yaml line 23
REF_INHERITS = """actor_rollout_ref:
  override_transformer_config: ${oc.select:actor_rollout_ref.actor.megatron.override_transformer_config,{}}
"""


def test_no_flash_attn_appends_fused_attention_for_actor_and_critic_the_ref_inherits(workspace, monkeypatch):
    _with_pythonpath(monkeypatch, workspace)
    _write(workspace.verl, {"verl/trainer/config/ref/megatron_ref.yaml": REF_INHERITS})
    ctx, checks = _checks(workspace)
    assert checks["flash-attn"].status == WARN
    assert [o for o in ctx.overrides if "attention_backend" in o] == [ACTOR_FUSED, CRITIC_FUSED]
    assert any(x.startswith("flash-attn not installed in the run's Python: attention_backend=fused") for x in
               ctx.limitations)


def test_the_ref_gets_its_own_when_it_does_not_inherit_or_a_user_override_replaced_its_config(workspace,
                                                                                               monkeypatch):
    _with_pythonpath(monkeypatch, workspace)
    # the fixture verl has no ref config of that shape: the ref does not inherit
    ctx, _ = _checks(workspace)
    assert [o for o in ctx.overrides if "attention_backend" in o] == [ACTOR_FUSED, REF_FUSED, CRITIC_FUSED]
    _write(workspace.verl, {"verl/trainer/config/ref/megatron_ref.yaml": REF_INHERITS})
    mine = "++actor_rollout_ref.ref.megatron.override_transformer_config.recompute_granularity=full"
    ctx, _ = _checks(workspace, extra=[mine])
    assert [o for o in ctx.overrides if "attention_backend" in o] == [ACTOR_FUSED, REF_FUSED, CRITIC_FUSED]


def test_flash_attn_present_appends_nothing(workspace, monkeypatch, tmp_path):
    site = _write(tmp_path / "site", {"flash_attn/__init__.py": "", "fused_weight_gradient_mlp_cuda.py": ""})
    _with_pythonpath(monkeypatch, workspace, site)
    ctx, checks = _checks(workspace)
    assert checks["flash-attn"].status == OK and checks["Apex fused kernel"].status == OK
    assert not [o for o in ctx.overrides if "override_transformer_config" in o]


def test_the_users_own_attention_override_wins(workspace, monkeypatch):
    _with_pythonpath(monkeypatch, workspace)
    mine = "actor_rollout_ref.actor.megatron.override_transformer_config.attention_backend=flash"
    ctx, _ = _checks(workspace, extra=[mine, "++critic.megatron.override_transformer_config.attention_backend=auto"])
    assert [o for o in ctx.overrides if "attention_backend" in o] == [REF_FUSED]  # fixture verl: ref does not inherit


def test_energon_missing_is_blocked_naming_the_package(workspace, monkeypatch):
    _with_pythonpath(monkeypatch, workspace)
    # what verl v0.9.0's megatron_utils.py imports, and what Bridge r0.6.0's training/config.py pulls in
    _write(workspace.verl, {"verl/utils/megatron_utils.py":
                            "def build():\n    from megatron.bridge.training.config import DistributedDataParallelConfig\n"})
    _write(workspace.bridge / "src/megatron/bridge", {
        "training/__init__.py": "",
        "training/config.py": "from megatron.bridge.data.builders import energon  # noqa\n",
        "data/__init__.py": "", "data/builders/__init__.py": "",
        "data/builders/energon.py": "from megatron.energon import WorkerConfig  # noqa\n"})
    _, checks = _checks(workspace)
    check = checks["Bridge modules verl imports"]
    assert check.status == BLOCKED
    assert "megatron.bridge.training.config" in check.detail and "No module named 'megatron.energon'" in check.detail
    assert "pip install megatron-energon" in check.fix


def test_modelopt_without_pulp_is_blocked_where_the_level_saves_and_a_warning_where_it_does_not(
        workspace, monkeypatch, tmp_path):
    # no fixture stand-in: a modelopt whose opt.plugins imports pulp, as the real one does, and no pulp; the fixture
    # verl imports Bridge's checkpointing only inside MegatronCheckpointManager's save/load methods (as v0.9.0 does)
    site = _write(tmp_path / "site", {"modelopt/__init__.py": "", "modelopt/torch/__init__.py": "",
                                      "modelopt/torch/opt/__init__.py": "",
                                      "modelopt/torch/opt/plugins/__init__.py": "import pulp  # noqa\n"})
    workspace.env["PYTHONPATH"] = str(site)
    monkeypatch.setenv("PYTHONPATH", str(site))
    ctx, checks = _checks(workspace, level=1)
    assert checks["Bridge modules verl imports"].status == OK  # the pulp failure is modelopt's to report, once
    assert checks["modelopt"].status == OK  # installed: the cheap check cannot tell
    check = checks["modelopt (LoRA save path)"]
    assert check.status == BLOCKED and "No module named 'pulp'" in check.detail
    assert "modelopt.torch.opt.plugins" in check.detail and "Level 1 run A saves/loads checkpoints" in check.detail
    assert "install-modelopt" in check.fix and "pulp is missing" in check.fix and "--find-links DIR" in check.fix
    assert first_blocked(list(checks.values())).name == "modelopt (LoRA save path)"
    # Level 0 never saves (SAVE_FREQ=-1): the same gap is a warning in the report, not Blocked
    ctx, checks = _checks(workspace, level=0)
    assert checks["modelopt (LoRA save path)"].status == WARN and first_blocked(list(checks.values())) is None
    assert any("No module named 'pulp'" in x and "Level 0 saves nothing (SAVE_FREQ=-1)" in x
               for x in ctx.limitations), ctx.limitations


def test_no_modelopt_at_all_blocks_only_the_levels_that_save(workspace, monkeypatch):
    workspace.env["PYTHONPATH"] = ""
    monkeypatch.setenv("PYTHONPATH", "")
    for level in (0, 3, 5):
        ctx, checks = _checks(workspace, level=level)
        assert checks["modelopt"].status == WARN, (level, checks["modelopt"])
        assert "needed only on verl's checkpoint/qat path" in checks["modelopt"].detail
        # the import walk: verl's checkpoint manager imports Bridge's checkpointing (modelopt) only inside save/load
        assert checks["Bridge modules verl imports"].status == OK
        assert first_blocked(list(checks.values())) is None, [c for c in checks.values() if c.status == BLOCKED]
        assert any("nvidia-modelopt is not installed" in x for x in ctx.limitations)
    _, checks = _checks(workspace, level=1)
    assert checks["modelopt"].status == BLOCKED and "--find-links DIR" in checks["modelopt"].fix
    # a user override that saves takes the checkpoint path on any level
    _, checks = _checks(workspace, level=0, extra=["trainer.save_freq=1"])
    assert checks["modelopt"].status == BLOCKED and "trainer.save_freq=1" in checks["modelopt"].detail


def test_a_cheap_blocked_starts_no_heavy_probe_in_a_level_but_every_cheap_check_runs(workspace, monkeypatch,
                                                                                     tmp_path):
    _with_pythonpath(monkeypatch, workspace)
    workspace.env.update(VERL_E2E_RAY_PROBE="1", TRAIN_FILES=str(tmp_path / "nope" / "train.parquet"))
    ctx, checks = _checks(workspace, doctor=False)
    assert checks["data TRAIN_FILES"].status == BLOCKED
    assert not ctx.facts.started("imports") and not ctx.facts.started("ray")
    for name in ("megatron.bridge imports", "Ray worker imports the local Bridge", "modelopt (LoRA save path)"):
        assert checks[name].status == "skipped" and "not started: 'data TRAIN_FILES' is Blocked" in checks[name].detail
    # the checks after the Blocked one still ran: their overrides shape the planned command
    for name in ("reward model", "GPUs", "nsys", "Apex fused kernel", "flash-attn"):
        assert name in checks, name
    assert "global_profiler.tool=null" in ctx.overrides
    assert ctx.evidence["preflight_timings"]["started"] == ["data train_files", "data val_files", "gpus", "locate",
                                                            "verl sites"] or "imports" not in \
        ctx.evidence["preflight_timings"]["started"]


def test_doctor_runs_the_heavy_probes_after_a_cheap_blocked(workspace, monkeypatch, tmp_path):
    _with_pythonpath(monkeypatch, workspace)
    workspace.env.update(TRAIN_FILES=str(tmp_path / "nope" / "train.parquet"))
    ctx, checks = _checks(workspace, doctor=True)
    assert checks["data TRAIN_FILES"].status == BLOCKED
    assert checks["megatron.bridge imports"].status == OK and ctx.facts.started("imports")


def test_the_import_probe_is_cached_per_interpreter_pythonpath_and_files(workspace, monkeypatch):
    _with_pythonpath(monkeypatch, workspace)
    first, checks = _checks(workspace)
    assert checks["megatron.bridge imports"].status == OK and checks["megatron.bridge imports"].cached is None
    again, checks = _checks(workspace)
    cached = checks["megatron.bridge imports"].cached
    assert cached and cached.startswith("cached from 20") and cached.endswith(" UTC")
    assert again.evidence["preflight_timings"]["cached"] == {"imports": cached}
    # --fresh-probe ignores it
    environ = dict(workspace.env)
    opts = LevelOptions(0, fresh_probe=True)
    ctx = build_context(opts, resolve({"python": sys.executable}, environ), probe=True)
    ctx.environ = environ
    fresh = {c.name: c for c in run_checks(ctx, stop_at_blocked=False)}
    assert fresh["megatron.bridge imports"].cached is None
    # an edit in the Bridge checkout is a new environment: probed again, and the answer follows the edit
    (workspace.bridge / "src/megatron/bridge/__init__.py").write_text("import transformer_engine_fixture_missing\n")
    _, checks = _checks(workspace)
    assert checks["megatron.bridge imports"].cached is None and checks["megatron.bridge imports"].status == BLOCKED
    assert "transformer_engine_fixture_missing" in checks["megatron.bridge imports"].fix


def test_doctor_timings_shows_each_check_and_probe(workspace):
    proc = workspace.invoke("doctor", "--timings")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    row = next(ln for ln in proc.stdout.splitlines() if "megatron.bridge imports" in ln)
    assert re.match(r"✔ +\d+\.\d\ds megatron\.bridge imports", row), row
    timings = proc.stdout.split("# timings (s): total ", 1)[1]
    assert re.search(r"^ +\d+\.\d\d  imports$", timings, re.M) and re.search(r"^ +\d+\.\d\d  locate$", timings, re.M)


def test_the_image_python_is_the_default_launcher_even_with_uv_and_a_lock(workspace, monkeypatch):
    """verl HEAD's wrapper runs `uv run --frozen` unless VERL_USE_UV=0; the procedure runs the image's Python: the
    run gets VERL_USE_UV=0 and the probes ask that same Python."""
    _with_pythonpath(monkeypatch, workspace)
    (workspace.verl / "uv.lock").write_text("version = 1\n")
    assert shutil.which("uv", path=workspace.env["PATH"])  # uv is there too: still the image's Python
    ctx, checks = _checks(workspace)
    assert checks["launcher"].status == OK and checks["launcher"].detail.startswith("VERL_USE_UV=0 (the image's Python")
    assert ctx.env["VERL_USE_UV"] == "0" and ctx.python == sys.executable


def test_the_uv_launcher_probes_uvs_interpreter_or_is_blocked(workspace, monkeypatch, tmp_path):
    _with_pythonpath(monkeypatch, workspace)
    (workspace.verl / "uv.lock").write_text("version = 1\n")
    workspace.env["VERL_USE_UV"] = "1"
    ctx, checks = _checks(workspace)
    assert checks["launcher"].status == BLOCKED and "uv sync --frozen --all-packages" in checks["launcher"].fix
    assert checks["run's Python"].status == "skipped" and not ctx.facts.started("locate")
    # uv's project environment exists (a venv that sees this machine's stack): every probe runs its python
    venv = workspace.verl / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    stack = next(p for p in sys.path if p.endswith("site-packages"))
    [site] = list(venv.glob("lib/python3*/site-packages"))
    (site / "stack.pth").write_text(stack + "\n")
    ctx, checks = _checks(workspace)
    assert checks["launcher"].status == OK and ctx.python == str(venv / "bin" / "python")
    assert "VERL_USE_UV" not in ctx.env  # the wrapper's own default (uv) stays
    assert ctx.imports.raw["python"] == str(venv / "bin" / "python")
    assert checks["megatron.bridge imports"].status == OK


def test_an_uninitialised_megatron_lm_submodule_names_git_not_pip(workspace, monkeypatch):
    _with_pythonpath(monkeypatch, workspace)
    subprocess.run(["git", "-C", str(workspace.bridge), "submodule", "deinit", "-f", "3rdparty/Megatron-LM"],
                   check=True, capture_output=True)
    ctx, checks = _checks(workspace, doctor=False)
    check = checks["megatron.core origin"]
    assert check.status == BLOCKED and "is empty (the submodule is not initialised)" in check.detail
    assert check.fix.startswith(f"git -C {workspace.bridge} submodule update --init 3rdparty/Megatron-LM")
    assert not ctx.facts.started("imports")  # a cheap Blocked: no heavy probe in a level
    # doctor: the rows after it still show (verl, ray), and the heavy probes run what they can
    ctx, checks = _checks(workspace, doctor=True)
    assert checks["megatron.core origin"].status == BLOCKED
    assert checks["verl is the local checkout"].status == OK and "ray" not in checks  # ray present: no row
    assert checks["megatron.bridge is the local checkout"].status == OK
    assert ctx.facts.started("imports")


# `nvidia-smi -L` on a real two-H200 host (captured 2026-11-30)
NVIDIA_SMI_L = """GPU 0: NVIDIA H200 (UUID: GPU-ae3a9903-20d7-ddb6-121b-7aa0f52856b5)
GPU 1: NVIDIA H200 (UUID: GPU-18241314-304a-7926-0533-46b260e17737)
"""


def test_gpus_are_detected_with_nvidia_smi_when_num_gpus_is_unset(workspace, tmp_path):
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\n[ \"$1\" = -L ] || exit 9\ncat <<'EOF'\n{NVIDIA_SMI_L}EOF\n")
    fake.chmod(0o755)
    del workspace.env["NUM_GPUS"]
    env = {"PATH": f"{fake.parent}:{workspace.env['PATH']}"}
    ok = workspace.invoke("doctor", env=env)
    assert "✔ GPUs" in ok.stdout and "2 GPU(s) from nvidia-smi -L; TP x PP x CP = 1" in ok.stdout, ok.stdout
    dense = workspace.invoke("doctor", "--level", "2", env=env)  # TP 2 x PP 2 needs 4
    assert dense.returncode == 3 and "✘ GPUs" in dense.stdout
    assert "2 GPU(s) from nvidia-smi -L; TP x PP x CP = 4" in dense.stdout
