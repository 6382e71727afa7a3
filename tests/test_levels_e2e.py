"""Levels 1-5 end to end through the real `invoke levelN`, against the fixture verl/Bridge checkouts (CPU)."""

from __future__ import annotations

import csv
import json
import shutil
import struct
from pathlib import Path

import pytest

from sessions.run import level_rules
from sessions.run.level_rules import TRACKER_FILE
from tests.conftest import deliverable, only_run_dir, summary_of

EXP = "qwen2.5-0.5b-megatron-gsm8k-minimal"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def with_skip(args: tuple[str, ...]) -> list[str]:
    """`--skip-bridge-checks` among the task's flags, before any `--` Hydra overrides."""
    cut = args.index("--") if "--" in args else len(args)
    return [*args[:cut], "--skip-bridge-checks", *args[cut:]]


def run(ws, *args, env=None, expect=0):
    proc = ws.invoke(*with_skip(args), env=env)
    assert proc.returncode == expect, proc.stdout[-4000:] + proc.stderr[-3000:]
    run_dir = only_run_dir(ws)
    md, summary = summary_of(run_dir)
    return run_dir, md, summary


def usage_error(ws, *args, env=None) -> str:
    proc = ws.invoke(*with_skip(args), env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert "Traceback" not in proc.stderr
    assert ws.run_dirs() == []  # nothing started, nothing written
    return lines[0]


# -- level 1 ------------------------------------------------------------------------------------------------------

def stale_series(verl: Path) -> Path:
    """A checkpoint directory left in the verl checkout by an unrelated earlier experiment (tracker says 5)."""
    stale = verl / "checkpoints" / "verl-test" / EXP
    (stale / "global_step_5" / "actor").mkdir(parents=True)
    (stale / "global_step_5" / "actor" / "ckpt_contents.json").write_text('["stale"]')
    (stale / TRACKER_FILE).write_text("5")
    return stale


def test_level1_pass_resumes_from_its_own_series_and_ignores_a_stale_checkpoint_dir(workspace):
    stale = stale_series(workspace.verl)
    before = sorted(str(p.relative_to(stale)) for p in stale.rglob("*"))
    run_dir, md, summary = run(workspace, "level1", "--keep-checkpoints")
    series = run_dir / "checkpoints"
    variant = deliverable(summary, "Requested variants")
    assert variant["status"] == "Pass", variant
    assert variant["detail"].startswith("save/resume: run A saved")
    assert f"{series}/global_step_1" in variant["detail"] and f"{series}/global_step_2" in variant["detail"]
    assert md.splitlines()[0].startswith("Result: Pass - Level 1 (save/resume) passed")
    assert summary["coverage"] == "Level 1 (save/resume)"
    # both logs, one report; B's resume line names this series' folder, never the stale one
    log_a, log_b = (run_dir / "verl-A.log").read_text(), (run_dir / "verl-B.log").read_text()
    assert f"Saving checkpoint to {series}/global_step_1" in log_a
    assert f"Resuming from {series}/global_step_1, setting global step to 1" in log_b
    assert str(stale) not in log_a + log_b
    assert f"trainer.default_local_dir={series}" in (run_dir / "command.sh").read_text()
    record = json.loads((run_dir / "run.json").read_text())
    assert record["checkpoint_dir"] == str(series)
    assert [r["checkpoints"]["tracker"] for r in record["runs"]] == ["1", "2"]
    assert record["runs"][1]["checkpoints"]["complete"] == [1, 2]
    # the stale series is untouched, and --keep-checkpoints kept ours
    assert sorted(str(p.relative_to(stale)) for p in stale.rglob("*")) == before
    assert (stale / TRACKER_FILE).read_text() == "5"
    assert (series / TRACKER_FILE).read_text() == "2" and (series / "global_step_2").is_dir()


def test_level1_each_series_gets_a_new_checkpoint_dir_and_removes_it_by_default(workspace):
    run_dir, _, summary = run(workspace, "level1")
    assert summary["result"] == "Pass"
    assert not (run_dir / "checkpoints").exists()  # no --keep-checkpoints
    before = (run_dir / "summary.md").read_text()
    report = workspace.invoke("report", str(run_dir))  # the rule reads what run.json recorded, not the files
    assert report.returncode == 0 and (run_dir / "summary.md").read_text() == before, report.stdout[-2000:]
    # a second series does not resume from the first one's folders (they are gone and were its own)
    proc = workspace.invoke("level1", "--skip-bridge-checks")
    assert proc.returncode == 0, proc.stdout[-3000:]
    second = [d for d in workspace.run_dirs() if d != run_dir][0]
    log_b = (second / "verl-B.log").read_text()
    assert f"Resuming from {second / 'checkpoints'}/global_step_1" in log_b
    assert str(run_dir) not in (second / "verl-A.log").read_text() + log_b


def test_level1_fails_when_b_resumes_from_nothing(workspace):
    run_dir, md, summary = run(workspace, "level1", env={"FIXTURE_FAKE_RESUME": "1"}, expect=1)
    run_d = deliverable(summary, "verl Megatron backend run")  # both runs completed: only the variant fails
    assert run_d["status"] == "Pass"
    assert "run A: run Pass (1/1 step(s) completed, exit 0)" in run_d["detail"]
    assert "run B: run Pass (2/2 step(s) completed, exit 0)" in run_d["detail"]
    variant = deliverable(summary, "Requested variants")
    assert variant["status"] == "Fail"
    assert "no-such-series/global_step_1" in variant["detail"]
    assert "resumed from nothing this series saved" in variant["detail"]
    assert summary["category"] == "checkpoint"
    assert md.startswith("Result: Fail - Level 1 (save/resume) failed — Requested variants: save/resume: run B")


def test_level1_failed_save_points_at_save_freq_minus_one_and_skips_b(workspace):
    run_dir, md, summary = run(workspace, "level1", env={"FIXTURE_FAIL": "checkpoint"}, expect=1)
    assert not (run_dir / "verl-B.log").exists()
    run_d = deliverable(summary, "verl Megatron backend run")
    assert run_d["status"] == "Fail" and "run A (save)" in run_d["detail"] and "run B not started" in run_d["detail"]
    assert "(checkpoint)" in run_d["detail"] and summary["category"] == "checkpoint"
    assert any("SAVE_FREQ=-1" in f for f in summary["follow_ups"])
    assert "SAVE_FREQ=-1" in md.split("Follow-ups:")[1]


def test_level1_refuses_to_be_pointed_at_another_checkpoint_dir(workspace):
    line = usage_error(workspace, "level1", "--", f"trainer.default_local_dir={workspace.verl / 'checkpoints'}")
    assert "owns trainer.default_local_dir" in line


# -- level 2 ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("gpus", ["1", "6"])  # fewer than TP2 x PP2, and not a multiple of it
def test_level2_dense_on_too_few_gpus_is_blocked_before_any_probe_without_starting_verl(workspace, gpus):
    # the default path (Ray worker probe on): a cheap Blocked starts neither the import probe nor Ray
    # (how fast: bench/preflight.py)
    run_dir, md, summary = run(workspace, "level2", "--variant", "dense", env={"NUM_GPUS": gpus,
                                                                              "VERL_E2E_RAY_PROBE": "1"}, expect=3)
    started = json.loads((run_dir / "run.json").read_text())["evidence"]["preflight_timings"]["started"]
    assert not {"imports", "ray"} & set(started), started
    assert not list(run_dir.glob("verl*.log"))
    run_d = deliverable(summary, "verl Megatron backend run")
    assert run_d["status"] == "Blocked" and "TP x PP x CP = 4" in run_d["detail"] and "verl not started" in run_d["detail"]
    assert deliverable(summary, "Requested variants")["status"] == "Skipped"
    assert summary["category"] == "env-no-gpu"
    assert "Not evidence against the Bridge provider" in md


def test_level2_dense_on_four_gpus_passes_with_the_traced_sizes(workspace):
    run_dir, md, summary = run(workspace, "level2", "--variant", "dense", env={"NUM_GPUS": "4"})
    variant = deliverable(summary, "Requested variants")
    assert variant["status"] == "Pass"
    assert variant["detail"].startswith("parallelism stress --variant dense: dense (TP=2 PP=2 CP=1 INFER_TP=2) on 4 GPU(s)")
    assert summary["coverage"] == "Level 2 (parallel stress --variant dense), variant dense"
    assert "tensor_model_parallel_size=2" in (run_dir / "verl.log").read_text()


def test_level2_dense_fails_when_an_override_undoes_the_variant(workspace):
    _, _, summary = run(workspace, "level2", "--variant", "dense", "--",
                        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=1",
                        env={"NUM_GPUS": "4"}, expect=1)
    assert deliverable(summary, "verl Megatron backend run")["status"] == "Pass"
    variant = deliverable(summary, "Requested variants")
    assert variant["status"] == "Fail"
    assert "tensor_model_parallel_size=1 (want 2)" in variant["detail"]


def test_level2_moe_warns_on_a_dense_model_and_says_experts_were_not_exercised(workspace):
    proc = workspace.invoke("level2", "--variant", "moe", "--skip-bridge-checks", env={"NUM_GPUS": "2"})
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "! MoE model" in proc.stdout and "not an MoE model" in proc.stdout
    _, summary = summary_of(only_run_dir(workspace))
    assert any("expert parallelism is not exercised" in x for x in summary["limitations"])
    assert deliverable(summary, "Requested variants")["detail"].startswith(
        "parallelism stress --variant moe: moe (EP=2 ETP=1 ROUTING_REPLAY_MODE=disabled)")


def test_level2_moe_on_a_moe_config_is_ok_and_one_gpu_is_blocked(workspace):
    config = json.loads((workspace.model / "config.json").read_text())
    (workspace.model / "config.json").write_text(json.dumps({**config, "num_experts": 8}))
    proc = workspace.invoke("level2", "--variant", "moe", "--skip-bridge-checks", env={"NUM_GPUS": "1"})
    assert proc.returncode == 3, proc.stdout[-3000:]
    assert "EP x ETP x PP = 2 x 1 x 1 = 2" in proc.stdout
    assert not list(only_run_dir(workspace).glob("verl*.log"))
    dry = workspace.invoke("level2", "--variant", "moe", "--dry-run", env={"NUM_GPUS": "2"})
    assert dry.returncode == 0 and "8 routed experts" in dry.stdout


# -- level 3 ------------------------------------------------------------------------------------------------------

def test_level3_runs_megatron_fsdp_with_the_three_fusion_overrides(workspace):
    run_dir, _, summary = run(workspace, "level3")
    command = (run_dir / "command.sh").read_text()
    argv = json.loads((run_dir / "run.json").read_text())["runs"][0]["argv"]
    for role in ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic"):
        override = f"++{role}.megatron.override_transformer_config.gradient_accumulation_fusion=False"
        assert override in command and argv.count(override) == 1
    assert "USE_MEGATRON_FSDP=True" in command
    variant = deliverable(summary, "Requested variants")
    assert variant["status"] == "Pass" and "use_megatron_fsdp=True" in variant["detail"]
    assert "Megatron-FSDP" in deliverable(summary, "verl Megatron backend run")["detail"]
    # one GPU (the fixture workspace's): the report says what was not exercised; with two GPUs it does not
    assert any("nothing is sharded across ranks" in lim for lim in summary["limitations"]), summary["limitations"]
    shutil.rmtree(run_dir)
    _, _, two = run(workspace, "level3", env={"NUM_GPUS": "2", "FIXTURE_GPUS": "2"})
    assert not any("nothing is sharded across ranks" in lim for lim in two["limitations"]), two["limitations"]


def test_level3_fails_when_the_run_did_not_select_megatron_fsdp(workspace):
    _, _, summary = run(workspace, "level3", "--", "actor_rollout_ref.actor.megatron.use_megatron_fsdp=False",
                        expect=1)
    variant = deliverable(summary, "Requested variants")
    assert variant["status"] == "Fail" and "not Megatron-FSDP" in variant["detail"]


# -- level 4 ------------------------------------------------------------------------------------------------------

def _model_config(workspace, **keys) -> None:
    config = json.loads((workspace.model / "config.json").read_text())
    (workspace.model / "config.json").write_text(json.dumps({**config, **keys}))


def test_level4_vlm_records_feature_overrides_and_text_only_limitation(workspace):
    _model_config(workspace, vision_config={"depth": 1})  # --feature vlm's own preflight: a vision config
    run_dir, md, summary = run(workspace, "level4", "--feature", "vlm", "--",
                               "actor_rollout_ref.model.use_fused_kernels=False", "++data.image_key=images")
    variant = deliverable(summary, "Requested variants")
    assert variant["status"] == "Pass"
    assert ("feature vlm via tests/special_e2e/run_ppo_trainer_megatron.sh; extra overrides: "
            "actor_rollout_ref.model.use_fused_kernels=False ++data.image_key=images") in variant["detail"]
    assert any("text-only GSM8K" in x and "vision encoder" in x for x in summary["limitations"])
    assert summary["coverage"] == "Level 4 (architecture-specific e2e), feature vlm, script " \
                                  "tests/special_e2e/run_ppo_trainer_megatron.sh"
    assert summary["level_facts"]["extra_overrides"] == ["actor_rollout_ref.model.use_fused_kernels=False",
                                                         "++data.image_key=images"]
    assert "++data.image_key=images" in (run_dir / "command.sh").read_text()
    assert "++data.image_key=images" in md  # in the report's command


def test_level4_script_runs_the_example_and_moe_says_ep1_does_not_stress_experts(workspace):
    example = workspace.verl / "examples" / "moe_trainer" / "run_fixture_moe_megatron.sh"
    example.parent.mkdir(parents=True)
    example.write_text("#!/usr/bin/env bash\n# a model-family example: its own settings, then the wrapper\nset -x\n"
                       "echo example-script-ran\n"
                       "exec bash tests/special_e2e/run_ppo_trainer_megatron.sh \"$@\"\n")
    rel = "examples/moe_trainer/run_fixture_moe_megatron.sh"
    _model_config(workspace, num_experts=4)  # --feature moe's own preflight: a model with experts
    run_dir, _, summary = run(workspace, "level4", "--feature", "moe", "--script", rel)
    assert "example-script-ran" in (run_dir / "verl.log").read_text()
    assert json.loads((run_dir / "run.json").read_text())["runs"][0]["argv"][:2] == ["bash", rel]
    assert any("COMMON_EP=1" in x and "level 2 --variant moe" in x for x in summary["limitations"])
    assert f"feature moe via {rel}" in deliverable(summary, "Requested variants")["detail"]


def test_level4_bad_feature_or_missing_script_is_exit_2(workspace):
    assert "--feature must be one of vlm, moe, mtp, qat, quantized, custom-layer" in usage_error(
        workspace, "level4", "--feature", "audio")
    assert "--script examples/nope.sh: no such file under VERL_REPO" in usage_error(
        workspace, "level4", "--feature", "mtp", "--script", "examples/nope.sh")


# -- level 5 ------------------------------------------------------------------------------------------------------

def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width >= 600 and height >= 400 and len(data) > 20_000  # six panels with lines, not an empty canvas
    import matplotlib.image

    pixels = matplotlib.image.imread(path)  # decodes: a real PNG, not only its header
    assert pixels.shape[:2] == (height, width) and pixels[..., :3].std() > 0.05


def test_level5_pass_writes_metrics_csv_and_plot_and_says_learning_signal_not_converged(workspace):
    run_dir, md, summary = run(workspace, "level5")
    rows = list(csv.DictReader(open(run_dir / "metrics.csv")))
    assert [int(r["step"]) for r in rows] == list(range(0, 21))
    assert rows[0]["val-core/openai/gsm8k/acc/mean@1"] == "0.2" and rows[0]["actor/pg_loss"] == ""
    assert {"actor/grad_norm", "critic/vf_loss", "training/rollout_probs_diff_mean"} <= set(rows[1])
    assert_png(run_dir / "metrics.png")
    variant = deliverable(summary, "Requested variants")
    assert variant["status"] == "Pass"
    assert variant["detail"].startswith("learning-signal: learning-signal passed over 20 step(s)")
    assert "critic/score/mean up vs first steps" in variant["detail"]
    assert "val-core/openai/gsm8k/acc/mean@1 up vs step 0 (0.2 -> 0.6" in variant["detail"]
    assert summary["coverage"] == "Level 5 (learning signal), 20 steps: learning-signal passed"
    assert "converged" not in md.lower()
    assert md.splitlines()[0].startswith("Result: Pass - Level 5 (learning signal) passed: learning-signal passed")


def test_level5_nan_at_step_7_of_20_fails_naming_the_step(workspace):
    run_dir, md, summary = run(workspace, "level5", env={"FIXTURE_NAN_STEP": "7"}, expect=1)
    variant = deliverable(summary, "Requested variants")
    assert variant["status"] == "Fail"
    assert "first non-finite value: actor/pg_loss=nan at step 7 of 20" in variant["detail"]
    assert summary["category"] == "nan-metrics"
    assert "step 7" in md.splitlines()[0]
    assert_png(run_dir / "metrics.png")  # evidence is written on failure too
    assert "learning signal not shown" in summary["coverage"]


@pytest.mark.parametrize("env,check,needle", [
    ({"FIXTURE_TREND": "flat"}, "trend", "critic/score/mean flat vs first steps"),
    ({"FIXTURE_FROZEN": "1"}, "trainable adapter", "frozen adapters: Adapter parameters: 0"),
    ({"FIXTURE_ZERO_GRAD": "1"}, "non-zero gradients", "actor/grad_norm=0 at steps 1, 2, 3"),
    ({"FIXTURE_CONST_LOGPROB": "1"}, "changing log-probs", "training/rollout_probs_diff_mean=0.003 at all 20 steps"),
])
def test_level5_flags_flat_trend_frozen_adapters_zero_grads_and_constant_logprobs(workspace, env, check, needle):
    _, md, summary = run(workspace, "level5", env=env, expect=1)
    assert deliverable(summary, "verl Megatron backend run")["status"] == "Pass"  # the run itself completed
    variant = deliverable(summary, "Requested variants")
    assert variant["status"] == "Fail" and f"{check}: " in variant["detail"] and needle in variant["detail"]
    assert "learning-signal passed" not in md and "converged" not in md.lower()
    assert summary["follow_ups"] and summary["follow_ups"] != ["none"]


def test_level5_baseline_states_direction_per_metric_and_is_overlaid(workspace):
    run(workspace, "level5", "--steps", "12", env={"FIXTURE_TREND": "flat"}, expect=1)
    baseline = only_run_dir(workspace)
    proc = workspace.invoke("level5", "--steps", "12", "--baseline", str(baseline), "--skip-bridge-checks")
    assert proc.returncode == 0, proc.stdout[-3000:]
    cand = [d for d in workspace.run_dirs() if d != baseline][0]
    _, summary = summary_of(cand)
    variant = deliverable(summary, "Requested variants")["detail"]
    assert "critic/score/mean higher than baseline" in variant
    assert "val-core/openai/gsm8k/acc/mean@1 higher than baseline" in variant
    directions = summary["level_facts"]["directions"]
    assert any(d.startswith("critic/vf_loss the same as baseline") for d in directions)
    assert any(d.startswith("actor/entropy") and "baseline" in d for d in directions)
    assert summary["coverage"] == f"Level 5 (learning signal), 12 steps, baseline {baseline}: learning-signal passed"
    assert_png(cand / "metrics.png")
    # a worse candidate than the baseline fails, saying so
    proc = workspace.invoke("level5", "--steps", "12", "--baseline", str(cand), "--skip-bridge-checks",
                            env={"FIXTURE_TREND": "down"})
    assert proc.returncode == 1
    worse = [d for d in workspace.run_dirs() if d not in (baseline, cand)][0]
    detail = deliverable(summary_of(worse)[1], "Requested variants")["detail"]
    assert "critic/score/mean lower than baseline" in detail


def test_level5_converged_only_when_the_threshold_is_met(workspace):
    _, md, summary = run(workspace, "level5", "--threshold", "val-core/openai/gsm8k/acc/mean@1>=0.5")
    assert summary["coverage"].endswith("converged: threshold val-core/openai/gsm8k/acc/mean@1>=0.5 met "
                                        "(val-core/openai/gsm8k/acc/mean@1=0.6 at step 20)")
    assert summary["level_facts"]["converged"] is True


def test_level5_threshold_not_met_is_learning_signal_not_converged(workspace):
    _, md, summary = run(workspace, "level5", "--threshold", "critic/score/mean>=0.95")
    assert "learning-signal passed (threshold critic/score/mean>=0.95 not met: critic/score/mean " \
           in summary["coverage"] and summary["coverage"].endswith(": not converged)")
    assert any("not converged" in f for f in summary["follow_ups"])
    assert "converged:" not in md


def test_level5_bad_threshold_steps_or_baseline_is_exit_2(workspace, tmp_path):
    assert "--threshold must look like METRIC>=VALUE" in usage_error(workspace, "level5", "--threshold", "acc>0.5")
    assert "--steps must be between 1 and 100" in usage_error(workspace, "level5", "--steps", "101")
    assert "is not a level run directory" in usage_error(workspace, "level5", "--baseline", str(tmp_path))


def test_level5_report_rerenders_from_the_run_directory(workspace):
    run_dir, md, _ = run(workspace, "level5", "--steps", "8")
    (run_dir / "metrics.csv").unlink()
    (run_dir / "summary.md").unlink()
    proc = workspace.invoke("report", str(run_dir))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (run_dir / "summary.md").read_text() == md and (run_dir / "metrics.csv").is_file()


def test_rules_registered_for_every_level():
    assert sorted(level_rules.RULES) == [1, 2, 3, 4, 5]


def test_dry_runs_show_each_levels_plan_and_run_nothing(workspace):
    one = workspace.invoke("level1", "--dry-run")
    assert one.returncode == 0, one.stdout + one.stderr
    assert "# run A" in one.stdout and "# run B" in one.stdout and "RESUME_MODE=auto" in one.stdout
    # each run's command, then again in the command.sh block (what the run directory's command.sh holds)
    assert one.stdout.count(f"trainer.default_local_dir={workspace.log_dir}/") == 4
    three = workspace.invoke("level3", "--dry-run")
    [command] = [line for line in three.stdout.splitlines() if line.startswith("bash ")]
    assert command.count("gradient_accumulation_fusion=False") == 3 and "USE_MEGATRON_FSDP=True" in three.stdout
    five = workspace.invoke("level5", "--dry-run", "--steps", "50", "--threshold", "critic/score/mean>=0.6")
    assert five.returncode == 0 and "TOTAL_TRAIN_STEPS=50" in five.stdout and "TEST_FREQ=10" in five.stdout
    assert workspace.run_dirs() == []
