"""Level rules 1-5 and the level-5 metric checks on Verdicts built directly (no verl run)."""

from __future__ import annotations

import math
import random

import pytest

from env.settings import UsageError
from sessions.judge import metrics
from sessions.judge.verdict import Verdict, judge_log
from sessions.run import level_rules

SERIES = "/runs/20261129T000000Z-level1-Qwen2.5-0.5B/checkpoints"


def ok(**kw) -> Verdict:
    base = dict(result="Pass", category="success", phase="shutdown", exit_code=0, vanilla_mbridge="False")
    base.update(kw)
    return Verdict(**base)


def ckpt(tracker: str, *steps: int) -> dict:
    return {"dir": SERIES, "tracker": tracker, "global_steps": list(steps), "complete": list(steps)}


def level1(a: Verdict, b: Verdict | None, a_ckpt=None, b_ckpt=None):
    record = {"level": 1, "checkpoint_dir": SERIES, "options": {}}
    judged = [({"name": "A", "log": "verl-A.log", "checkpoints": a_ckpt or ckpt("1", 1)}, a)]
    if b is not None:
        judged.append(({"name": "B", "log": "verl-B.log", "checkpoints": b_ckpt or ckpt("2", 1, 2)}, b))
    return level_rules.combine(1, record, judged)


def good_a() -> Verdict:
    return ok(steps_completed=1, steps_expected=1, checkpoints_saved=[f"{SERIES}/global_step_1"],
              step_metrics={1: {"actor/pg_loss": 0.1}})


def good_b(**kw) -> Verdict:
    base = dict(steps_completed=2, steps_expected=2, checkpoints_saved=[f"{SERIES}/global_step_2"],
                resumed_from=f"{SERIES}/global_step_1", step_metrics={2: {"actor/pg_loss": 0.1}})
    base.update(kw)
    return ok(**base)


def test_level1_passes_only_with_save_resume_step2_and_second_save():
    out = level1(good_a(), good_b())
    assert (out.run_status, out.variant_status) == ("Pass", "Pass"), out.variant_detail
    assert f"{SERIES}/global_step_1" in out.variant_detail and "global_step_2" in out.variant_detail


def test_level1_resume_from_a_stale_directory_of_another_series_fails():
    stale = "/verl/checkpoints/verl-test/qwen2.5-0.5b-megatron-gsm8k-minimal/global_step_1"
    out = level1(good_a(), good_b(resumed_from=stale))
    assert out.variant_status == "Fail" and out.category == "checkpoint" and out.run_status == "Pass"
    assert stale in out.variant_detail and "not from run A's checkpoint" in out.variant_detail


def test_level1_fresh_start_in_b_fails():
    out = level1(good_a(), good_b(resumed_from=None, fresh_start=True))
    assert out.variant_status == "Fail" and "fresh start" in out.variant_detail


def test_level1_b_retraining_step1_fails_even_with_the_right_resume_line():
    out = level1(good_a(), good_b(step_metrics={1: {"a": 1.0}, 2: {"a": 1.0}}))
    assert out.variant_status == "Fail" and "trained step 1 again" in out.variant_detail


def test_level1_tracker_not_updated_by_a_fails_with_the_save_freq_hint():
    out = level1(good_a(), good_b(), a_ckpt={"tracker": None, "global_steps": [1], "complete": []})
    assert out.variant_status == "Fail" and "tracker" in out.variant_detail
    assert any("SAVE_FREQ=-1" in f for f in out.follow_ups)


def test_level1_missing_second_save_fails():
    out = level1(good_a(), good_b(checkpoints_saved=[]), b_ckpt=ckpt("1", 1))
    assert out.variant_status == "Fail" and "did not save" in out.variant_detail


def test_level1_failed_save_in_a_points_at_save_freq_minus_one():
    a = Verdict(result="Fail", category="checkpoint", phase="checkpoint", steps_completed=1, exit_code=1,
                first_error="RuntimeError: Checkpoint save failed")
    out = level1(a, None)
    assert out.run_status == "Fail" and "run B not started" in out.run_detail
    assert any("SAVE_FREQ=-1" in f for f in out.follow_ups)


def test_traced_overrides_take_the_last_value_like_hydra(tmp_path):
    log = tmp_path / "verl.log"
    log.write_text("+ COMMON_TP=2\n+ python3 -m verl.trainer.main_ppo --config-path=config "
                   "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 "
                   "'ray_kwargs.ray_init.runtime_env.py_executable=uv -v run' "
                   "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=1 "
                   "++critic.megatron.override_transformer_config.gradient_accumulation_fusion=False\n")
    trace = level_rules.traced_overrides(log)
    assert trace["actor_rollout_ref.actor.megatron.tensor_model_parallel_size"] == "1"
    assert trace["ray_kwargs.ray_init.runtime_env.py_executable"] == "uv -v run"
    assert trace["critic.megatron.override_transformer_config.gradient_accumulation_fusion"] == "False"
    (tmp_path / "none.log").write_text("no trace here\n")
    assert level_rules.traced_overrides(tmp_path / "none.log") is None


@pytest.mark.parametrize("config,experts", [
    ({"model_type": "qwen2"}, 0),
    ({"num_experts": 64}, 64),
    ({"num_local_experts": 8}, 8),
    ({"text_config": {"n_routed_experts": 16}}, 16),
    ({"num_experts": 1}, 0),
])
def test_expert_count_reads_moe_configs(config, experts):
    assert level_rules.expert_count(config) == experts


def test_feature_limitations_say_what_is_not_covered():
    vlm = level_rules.feature_limitations("vlm", None, None, [])
    assert "text-only GSM8K" in vlm[0] and "vision encoder" in vlm[0]
    moe = level_rules.feature_limitations("moe", None, None, [])
    assert "COMMON_EP=1" in moe[0]
    ep2 = level_rules.feature_limitations(
        "moe", None, {"actor_rollout_ref.actor.megatron.expert_model_parallel_size": "2"}, [])
    assert "COMMON_EP=1" not in ep2[0] and "expert_model_parallel_size=2" in ep2[0]
    for feature in ("mtp", "qat", "quantized"):
        assert "may not enable" in level_rules.feature_limitations(feature, None, None, [])[0]
        assert "examples/x.sh" in level_rules.feature_limitations(feature, "examples/x.sh", None, [])[0]


# -- level 5 metric checks ----------------------------------------------------------------------------------------

def run_metrics(steps=20, trend=0.03, nan_step=None, zero_grad=False, const_logprob=False, val_every=10):
    out = {0: {"val-core/openai/gsm8k/acc/mean@1": 0.2}}
    for s in range(1, steps + 1):
        rnd = random.Random(s)
        score = 0.2 + trend * s + rnd.uniform(-0.01, 0.01)
        row = {"training/global_step": float(s), "actor/pg_loss": -0.01 * rnd.random(),
               "critic/vf_loss": 3.2 - 0.05 * s, "actor/ppo_kl": 1e-4 * s, "actor/entropy": 0.6 - 0.001 * s,
               "actor/grad_norm": 0.0 if zero_grad else 0.5 + rnd.random(), "critic/score/mean": score,
               "critic/rewards/mean": score,
               "training/rollout_probs_diff_mean": 0.003 if const_logprob else 0.002 + 0.002 * rnd.random()}
        if s % val_every == 0:
            row["val-core/openai/gsm8k/acc/mean@1"] = 0.2 + trend * s * 0.7
        if s == nan_step:
            row["actor/pg_loss"] = math.nan
        out[s] = row
    return out


ADAPTER = {"total": 498431872, "adapter": 4399104, "trainable_pct": 0.8826}


def check(step_metrics, **kw):
    args = dict(steps_expected=20, adapters=[ADAPTER], lora_enabled=True, critic_expected=True)
    args.update(kw)
    return metrics.check_learning_signal(step_metrics, **args)


def test_healthy_rising_run_passes_every_check_and_states_directions():
    rep = check(run_metrics())
    assert rep.failed == [], [f.detail for f in rep.failed]
    words = metrics.describe_directions(rep)
    assert any(w.startswith("critic/score/mean up vs first steps") for w in words)
    assert any(w.startswith("val-core/openai/gsm8k/acc/mean@1 up vs step 0") for w in words)
    assert any(w.startswith("critic/vf_loss down") for w in words)
    assert not rep.converged  # no threshold: never "converged"


def test_nan_at_step_7_of_20_names_the_step_and_metric():
    rep = check(run_metrics(nan_step=7))
    bad = [f for f in rep.failed if f.check == "finite metrics"]
    assert bad and bad[0].detail == "first non-finite value: actor/pg_loss=nan at step 7 of 20"
    assert bad[0].category == "nan-metrics"


@pytest.mark.parametrize("trend,word", [(0.0, "flat"), (-0.005, "down")])
def test_flat_or_falling_reward_is_no_learning_signal(trend, word):
    rep = check(run_metrics(trend=trend))
    bad = [f for f in rep.failed if f.check == "trend"]
    assert bad and f"critic/score/mean {word}" in bad[0].detail, rep.findings


def test_frozen_adapter_zero_grad_constant_logprobs_and_missing_peft_block_are_flagged():
    frozen = check(run_metrics(), adapters=[{"total": 5, "adapter": 0}]).failed
    assert [f.check for f in frozen] == ["trainable adapter"]
    assert [f.check for f in check(run_metrics(), adapters=[]).failed] == ["trainable adapter"]
    assert check(run_metrics(), adapters=[], lora_enabled=False).failed == []
    # verl prints one PEFT block per model it builds (critic first, actor last): a frozen actor behind a
    # trainable critic is still frozen
    behind = check(run_metrics(), adapters=[ADAPTER, {"total": 5, "adapter": 0}]).failed
    assert [f.check for f in behind] == ["trainable adapter"] and "PEFT block 2 of 2" in behind[0].detail
    both = check(run_metrics(), adapters=[ADAPTER, {"adapter": 13824}]).findings
    assert "per PEFT block (one per model verl built): 4399104 (0.8826%), 13824" in \
        next(f.detail for f in both if f.check == "trainable adapter")
    zero = check(run_metrics(zero_grad=True)).failed
    assert [f.check for f in zero] == ["non-zero gradients"] and "actor/grad_norm=0 at steps 1, 2" in zero[0].detail
    const = check(run_metrics(const_logprob=True)).failed
    assert [f.check for f in const] == ["changing log-probs"]
    assert "training/rollout_probs_diff_mean=0.003 at all 20 steps" in const[0].detail


def test_real_h200_level5_log_prob_check_reads_log_probs_and_kl_never_the_validity_flag():
    """h200_s2_level5_six_steps.log (issue 16.6): `training/rollout_probs_diff_valid` is 1.0 at every step; the
    real log-prob/KL metrics moved (actor/kl_loss 5.2e-7 -> 1.36e-6), so the log-probs are not constant."""
    from tests.conftest import real_logs

    v = judge_log(real_logs() / "h200_s2_level5_six_steps.log")
    assert v.result == "Pass" and v.steps_completed == 6
    assert {v.step_metrics[s]["training/rollout_probs_diff_valid"] for s in range(1, 7)} == {1.0}
    assert v.step_metrics[1]["actor/kl_loss"] == 5.22647525258435e-07
    rep = check(v.step_metrics, steps_expected=6, adapters=[], lora_enabled=False, critic_expected=False)
    logprob = next(f for f in rep.findings if f.check == "changing log-probs")
    assert logprob.ok and "rollout_probs_diff_valid" not in logprob.detail, logprob.detail
    assert not metrics.log_prob_signal("training/rollout_probs_diff_valid")
    assert not metrics.log_prob_signal("actor/kl_coef") and not metrics.log_prob_signal("timing_s/old_log_prob")
    assert metrics.log_prob_signal("actor/kl_loss") and metrics.log_prob_signal("rollout_corr/log_ppl_diff")


def test_too_few_steps_is_not_a_learning_signal():
    rep = check(run_metrics(steps=2), steps_expected=2)
    assert "several steps" in [f.check for f in rep.failed]


def test_baseline_comparison_states_direction_per_metric():
    baseline = run_metrics(trend=0.0)
    rep = check(run_metrics(trend=0.03), baseline=baseline)
    assert rep.failed == []
    lines = metrics.describe_directions(rep)
    assert any(line.startswith("critic/score/mean higher than baseline") for line in lines)
    assert any(line.startswith("critic/vf_loss the same as baseline") for line in lines)
    worse = check(run_metrics(trend=0.01), baseline=run_metrics(trend=0.03))
    assert [f.check for f in worse.failed] == ["baseline"] and "lower than baseline" in worse.failed[0].detail


@pytest.mark.parametrize("text,expect", [
    ("critic/score/mean>=0.5", ("critic/score/mean", ">=", 0.5)),
    ("val-core/openai/gsm8k/acc/mean@1 >= 1e-1", ("val-core/openai/gsm8k/acc/mean@1", ">=", 0.1)),
    ("critic/vf_loss<=2", ("critic/vf_loss", "<=", 2.0)),
])
def test_threshold_parses(text, expect):
    t = metrics.parse_threshold(text)
    assert (t.metric, t.op, t.value) == expect


@pytest.mark.parametrize("text", ["critic/score/mean>0.5", "critic/score/mean", ">=0.5", "x>=abc", "x>=nan", ""])
def test_bad_threshold_is_a_usage_error(text):
    with pytest.raises(UsageError, match="--threshold"):
        metrics.parse_threshold(text)


def test_threshold_met_is_converged_only_without_failures():
    t = metrics.parse_threshold("critic/score/mean>=0.7")
    assert check(run_metrics(), threshold=t).converged
    assert not check(run_metrics(), threshold=metrics.parse_threshold("critic/score/mean>=0.99")).converged
    assert not check(run_metrics(nan_step=7), threshold=t).converged


def test_csv_round_trip_keeps_nan_and_missing_cells(tmp_path):
    data = run_metrics(nan_step=7)
    path = metrics.write_csv(tmp_path / "metrics.csv", data)
    back = metrics.read_csv(path)
    assert sorted(back) == sorted(data)
    assert math.isnan(back[7]["actor/pg_loss"]) and back[3]["critic/vf_loss"] == data[3]["critic/vf_loss"]
    assert "actor/pg_loss" not in back[0]


def test_plot_overlays_the_baseline(tmp_path):
    from sessions.run import plots

    alone = plots.plot_metrics(tmp_path / "alone.png", run_metrics()).read_bytes()
    overlaid = plots.plot_metrics(tmp_path / "over.png", run_metrics(), baseline=run_metrics(trend=0.0)).read_bytes()
    assert alone[:8] == overlaid[:8] == b"\x89PNG\r\n\x1a\n" and alone != overlaid


def test_a_trend_needs_more_than_one_lucky_step():
    """Windows of at least two points: one reward at the last of six steps is noise, a steady rise is a trend."""
    from sessions.judge.metrics import trend_of

    lucky = trend_of([(i, v) for i, v in enumerate([0, 0, 0, 0, 0, 1 / 64], 1)], "critic/score/mean", "up")
    rising = trend_of([(i, 0.1 * i) for i in range(1, 7)], "critic/score/mean", "up")
    assert (lucky.direction, rising.direction) == ("flat", "up")
