"""Issue 24 on fixtures shaped like the real thing: a Bridge whose checkpointing imports modelopt at module level and
a verl (v0.9.0's shape) that imports it only inside its checkpoint manager's save/load methods; a verl wrapper at an
old release; a Level 4 --script that ignores the level's settings; command.sh = the dry-run's; reports that claim only
what ran."""

from __future__ import annotations

import json
import re

from tests.conftest import deliverable, only_run_dir, summary_of

# v0.4.1's wrapper reads none of these (v0.5.0: all but USE_MBRIDGE) — facts read from the tags
OLD_RELEASE_DROPS = ("USE_MBRIDGE", "VANILLA_MBRIDGE", "VALUE_VANILLA_MBRIDGE", "LORA_RANK", "CRITIC_LORA_RANK",
                     "LORA_ALPHA")


def _offline(workspace) -> dict[str, str]:
    """No package index reachable and none of this machine's pip settings."""
    for k in [k for k in workspace.env if k.startswith("PIP_")]:
        del workspace.env[k]
    return {"MODELOPT_INDEX_URL": "http://127.0.0.1:9/simple/"}


def _dry_command_sh(stdout: str) -> str:
    head = "# command.sh (the run directory's replayable command: what the run starts)\n"
    body = stdout.split(head, 1)[1]
    return re.split(r"^# (?:preflight \(|Level 4: )", body, maxsplit=1, flags=re.M)[0]


def test_without_modelopt_level0_runs_with_a_warning_and_level1_is_blocked_naming_the_offline_install(workspace):
    env = dict(_offline(workspace), PYTHONPATH="")  # the image without modelopt
    proc = workspace.invoke("level0", "--skip-bridge-checks", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    md, summary = summary_of(only_run_dir(workspace))
    lim = next(x for x in summary["limitations"] if "nvidia-modelopt is not installed" in x)
    assert "checkpoint" in lim and "Level 0 saves nothing (SAVE_FREQ=-1)" in lim
    assert "invoke install-modelopt --find-links DIR" in lim
    run = json.loads((only_run_dir(workspace) / "run.json").read_text())
    assert next(c for c in run["preflight"] if c["name"] == "modelopt")["status"] == "warn"

    for d in workspace.run_dirs():
        import shutil
        shutil.rmtree(d)
    proc = workspace.invoke("level1", "--skip-bridge-checks", env=env)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    md, summary = summary_of(only_run_dir(workspace))
    assert summary["category"] == "env-dependency"
    assert "no package index reachable" in md and "invoke install-modelopt --find-links DIR" in md
    assert not (only_run_dir(workspace) / "verl-A.log").exists()


def test_a_wrapper_at_an_old_release_is_blocked_naming_what_it_ignores(workspace):
    wrapper = workspace.verl / "tests/special_e2e/run_ppo_trainer_megatron.sh"
    lines = [ln for ln in wrapper.read_text().splitlines()
             if not any(re.search(rf"(^{v}=|\${{{v}\b|\${v}\b)", ln.strip()) for v in OLD_RELEASE_DROPS)]
    wrapper.write_text("\n".join(lines) + "\n")
    proc = workspace.invoke("level0", "--skip-bridge-checks")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    md, summary = summary_of(only_run_dir(workspace))
    assert re.search(r"verl at [0-9a-f]{7}: its wrapper ignores USE_MBRIDGE, VANILLA_MBRIDGE, "
                     r"VALUE_VANILLA_MBRIDGE, LORA_RANK", md), md
    assert "use a verl that has it" in md and summary["category"] == "config"


def test_a_level4_script_that_ignores_the_settings_is_named_with_what_it_does_instead(workspace):
    script = workspace.verl / "examples/fixed_recipe.sh"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text("#!/usr/bin/env bash\n# a recipe with its own settings\nset -xeuo pipefail\n"
                      "exec bash tests/special_e2e/run_ppo_trainer_megatron.sh \"$@\" trainer.total_epochs=15 \\\n"
                      "    trainer.n_gpus_per_node=1\n")
    proc = workspace.invoke("level4", "--skip-bridge-checks", "--feature", "custom-layer", "--script",
                            "examples/fixed_recipe.sh")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = only_run_dir(workspace)
    assert "-level4-custom-layer-" in run_dir.name
    md, summary = summary_of(run_dir)
    lim = next(x for x in summary["limitations"] if x.startswith("--script examples/fixed_recipe.sh ignores"))
    assert "LORA_RANK" in lim and "trainer.total_epochs=15" in lim and "trainer.n_gpus_per_node=1" in lim
    assert "feature custom-layer" in summary["coverage"]


def test_feature_vlm_needs_a_vision_config_and_shows_in_the_dry_run_and_the_run_directory(workspace, tmp_path):
    dry = workspace.invoke("level4", "--dry-run", "--feature", "vlm")
    assert dry.returncode == 0, dry.stderr
    assert "-level4-vlm-" in dry.stdout.splitlines()[0]
    assert "# Level 4: feature vlm via tests/special_e2e/run_ppo_trainer_megatron.sh" in dry.stdout
    assert "limitation: VLM with text-only GSM8K" in dry.stdout
    assert re.search(r"✘ --feature vlm .*has no vision config", dry.stdout), dry.stdout
    cfg = tmp_path / "vlm.json"
    cfg.write_text(json.dumps({"vision_config": {"depth": 1}}))
    ok = workspace.invoke("level4", "--dry-run", "--feature", "vlm", "--dummy-config", str(cfg))
    assert re.search(r"✔ --feature vlm +vision config present", ok.stdout), ok.stdout
    moe = workspace.invoke("level4", "--dry-run", "--feature", "moe")
    assert re.search(r"✘ --feature moe .*not a MoE model", moe.stdout), moe.stdout


def test_an_invalid_dummy_config_is_blocked(workspace, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{num_hidden_layers: 1")
    proc = workspace.invoke("level0", "--dry-run", "--dummy-config", str(bad))
    assert re.search(r"✘ dummy model config +.*is not valid JSON", proc.stdout), proc.stdout


def test_a_blocked_runs_command_sh_is_the_dry_runs_and_the_import_is_not_shown(workspace, tmp_path):
    env = {"TRAIN_FILES": str(tmp_path / "nope" / "train.parquet")}  # a cheap Blocked, early in the table
    dry = workspace.invoke("level0", "--dry-run", "--no-reward-model", env=env)
    assert dry.returncode == 0, dry.stderr
    assert "nox -f " in dry.stdout and " -s bridge_unit" in dry.stdout and "uv sync --locked" in dry.stdout
    proc = workspace.invoke("level0", "--no-reward-model", env=env)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    run_dir = only_run_dir(workspace)
    command = (run_dir / "command.sh").read_text()
    assert command == _dry_command_sh(dry.stdout)
    for override in ("reward.reward_model.enable=False", "global_profiler.tool=null",
                     "gradient_accumulation_fusion=False", "attention_backend=fused"):
        assert override in command, override
    _, summary = summary_of(run_dir)
    imp = deliverable(summary, "Local Bridge import in verl")
    assert imp["status"] == "Not shown", imp
    assert f"note: find_spec locates megatron.bridge at {workspace.bridge}/src/megatron/bridge" in imp["detail"]
    assert "<skipped" in (run_dir / "junit.xml").read_text()


def test_a_moe_model_needs_vllms_moe_kernels_found_without_importing_vllm(workspace, tmp_path):
    """The 2026-12-01 host: a vLLM without `_moe_C_stable_libtorch` only warns on import and a MoE model's engine
    dies later; preflight lists the package's extension files (no vLLM code runs: its __init__ here would raise)."""
    site = tmp_path / "stack"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm/__init__.py").write_text("raise RuntimeError('preflight must not import vllm')\n")
    (site / "vllm/_C_stable_libtorch.abi3.so").write_bytes(b"")
    config = json.loads((workspace.model / "config.json").read_text())
    (workspace.model / "config.json").write_text(json.dumps({**config, "num_experts": 4}))
    env = {"PYTHONPATH": f"{site}:{workspace.env['PYTHONPATH']}"}
    dry = workspace.invoke("level4", "--dry-run", "--feature", "moe", env=env)
    assert re.search(r"✘ vLLM MoE kernels +vllm\._moe_C_stable_libtorch not found .*4 experts", dry.stdout), dry.stdout
    assert "✔ --feature moe" in dry.stdout
    (site / "vllm/_moe_C_stable_libtorch.abi3.so").write_bytes(b"")
    ok = workspace.invoke("level4", "--dry-run", "--feature", "moe", env=env)
    assert "✔ vLLM MoE kernels" in ok.stdout and "✘" not in ok.stdout, ok.stdout
