"""What a level computes before verl starts, through the real `invoke`: the dry-run prints exactly the command the
run starts (same preflight, same appended overrides, the real checkpoint path), the overrides compose with Hydra
the way verl composes them, and the import deliverable says what the import check found."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from bench.upstream import COMPOSE
from tests.conftest import deliverable, only_run_dir, summary_of

WRAPPER_LINE = "bash tests/special_e2e/run_ppo_trainer_megatron.sh"


def dry_commands(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith(WRAPPER_LINE)]


def test_dry_run_prints_the_command_the_run_starts(workspace):
    dry = workspace.invoke("level0", "--skip-bridge-checks", "--dry-run", "--enforce-eager")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    [command] = dry_commands(dry.stdout)
    # the fixture Python has no Apex and the PATH no nsys: the dry-run probes that as the run does
    assert "++actor_rollout_ref.actor.megatron.override_transformer_config.gradient_accumulation_fusion=False" in command
    assert " global_profiler.tool=null " in command and command.endswith(" actor_rollout_ref.rollout.enforce_eager=True")
    assert workspace.run_dirs() == []

    ran = workspace.invoke("level0", "--skip-bridge-checks", "--enforce-eager")
    assert ran.returncode == 0, ran.stdout[-3000:]
    record = json.loads((only_run_dir(workspace) / "run.json").read_text())
    assert command == shlex.join(record["runs"][0]["argv"])


def test_dry_run_prints_the_real_checkpoint_directory(workspace):
    dry = workspace.invoke("level1", "--skip-bridge-checks", "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "<run-dir>" not in dry.stdout
    [run_dir] = re.findall(r"^# run directory, named when the run starts: (.+)$", dry.stdout, re.M)
    assert re.fullmatch(re.escape(str(workspace.log_dir)) + r"/\d{8}T\d{6}Z-level1-Qwen2\.5-0\.5B", run_dir)
    commands = dry_commands(dry.stdout)
    assert len(commands) == 2
    assert all(shlex.split(c)[-1] == f"trainer.default_local_dir={run_dir}/checkpoints" for c in commands)
    assert workspace.run_dirs() == [] and not Path(run_dir).exists()


# verl's own shape (verl/trainer/config at v0.9.0 and HEAD): the ref's override_transformer_config is the actor's,
# through oc.select; the actor's has keys of its own.
VERL_CONFIG = {
    "verl/trainer/config/ppo_megatron_trainer.yaml": (
        "defaults:\n  - ref@actor_rollout_ref.ref: megatron_ref\n  - _self_\n"
        "actor_rollout_ref:\n  actor:\n    megatron:\n      override_transformer_config:\n"
        "        recompute_granularity: null\n        recompute_method: null\n"
        "critic:\n  megatron:\n    override_transformer_config:\n      recompute_granularity: null\n"),
    "verl/trainer/config/ref/megatron_ref.yaml": (
        "megatron:\n  override_transformer_config: "
        "${oc.select:actor_rollout_ref.actor.megatron.override_transformer_config,{}}\n"),
}


@pytest.fixture(scope="module")
def hydra_python(tmp_path_factory) -> str:
    venv = tmp_path_factory.mktemp("hydra") / "venv"
    subprocess.run(["uv", "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    subprocess.run(["uv", "pip", "install", "-q", "--python", str(venv / "bin/python"), "hydra-core"], check=True)
    return str(venv / "bin/python")


def test_level3_fusion_overrides_keep_the_refs_inherited_transformer_config(workspace, hydra_python):
    for rel, text in VERL_CONFIG.items():
        (workspace.verl / rel).parent.mkdir(parents=True, exist_ok=True)
        (workspace.verl / rel).write_text(text)
    dry = workspace.invoke("level3", "--skip-bridge-checks", "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    [command] = dry_commands(dry.stdout)
    # the fixture Python also lacks flash-attn: preflight's attention_backend overrides follow the same rule
    ours = [a for a in shlex.split(command) if "override_transformer_config" in a]
    assert sorted(ours) == [
        "++actor_rollout_ref.actor.megatron.override_transformer_config.attention_backend=fused",
        "++actor_rollout_ref.actor.megatron.override_transformer_config.gradient_accumulation_fusion=False",
        "++critic.megatron.override_transformer_config.attention_backend=fused",
        "++critic.megatron.override_transformer_config.gradient_accumulation_fusion=False"]
    composed = subprocess.run([hydra_python, "-c", COMPOSE, str(workspace.verl / "verl/trainer/config"),
                               "ppo_megatron_trainer", json.dumps(ours)], capture_output=True, text=True, check=True)
    result = json.loads(composed.stdout)
    expected = {"recompute_granularity": None, "recompute_method": None, "gradient_accumulation_fusion": False,
                "attention_backend": "fused"}
    assert result["ref"] == expected and result["actor"] == expected
    assert result["critic"] == {"recompute_granularity": None, "gradient_accumulation_fusion": False,
                                "attention_backend": "fused"}


def test_level3_on_a_verl_whose_ref_has_its_own_config_sets_the_ref_too(workspace):
    # no oc.select for the ref (the fixture verl has no config dir at all): the ref needs its own override
    dry = workspace.invoke("level3", "--skip-bridge-checks", "--dry-run")
    [command] = dry_commands(dry.stdout)
    assert ("++actor_rollout_ref.ref.megatron.override_transformer_config.gradient_accumulation_fusion=False"
            in shlex.split(command))


def test_import_deliverable_reports_the_import_check_that_ran(workspace):
    init = workspace.bridge / "src/megatron/bridge/__init__.py"
    init.write_text("import torch_not_in_this_python\n" + init.read_text())
    proc = workspace.invoke("level0", "--skip-bridge-checks")
    assert proc.returncode == 3, proc.stdout[-3000:]
    _, summary = summary_of(only_run_dir(workspace))
    imp = deliverable(summary, "Local Bridge import in verl")
    assert imp["status"] == "Blocked"
    assert imp["detail"].startswith(f"megatron.bridge imports: {init}: ModuleNotFoundError: No module named "
                                    f"'torch_not_in_this_python'")
