"""Issue 25.5: `invoke judge --level N` applies level N's own rule from the log, as the level run does, and names
each criterion the log cannot show. The tool's own H200 logs: the passing Level 0 log (DDP, TP=PP=1, no save) is
no Level 1/2/3 pass; the Level 5 log with reward 0 at every step is no Level 5 pass."""

from __future__ import annotations

import json

import pytest

from sessions.judge.verdict import judge_command, judge_log
from tests.test_real_logs import REAL_LOGS, need_real_logs


@pytest.fixture(autouse=True)
def _real():
    need_real_logs()


def _level(path, n):
    return judge_log(path, level=n, bridge_src="/work/Megatron-Bridge/src", level_rule=True)


@pytest.mark.parametrize("n, criterion", [
    (1, "checkpoint global_step_1 saved (run A)"),
    (2, "variant's parallel sizes in the traced command"),
    (3, "Megatron-FSDP (use_megatron_fsdp=True, gradient_accumulation_fusion=False) in the traced command"),
])
def test_a_level0_log_is_no_pass_of_levels_1_2_3(n, criterion):
    v = _level(REAL_LOGS / "h200_s2_level0_pass.log", n)
    assert v.result == "Pass" and v.level_result != "Pass", v.level_summary
    assert {c.name: c.status for c in v.criteria}[criterion] == "Fail"
    assert _level(REAL_LOGS / "h200_s2_level0_pass.log", 0).level_result == "Pass"  # its own level


def test_level5_without_a_learning_signal_fails_and_exits_nonzero(capsys):
    path = REAL_LOGS / "h200_s3_level5_six_steps_reward_zero.log"
    v = _level(path, 5)
    learning = {c.name: c for c in v.criteria}["learning signal"]
    assert learning.status == "Fail" and "learning signal not shown" in learning.detail
    assert v.level_result == "Fail"
    assert judge_command(str(path), level=5, as_json=True, bridge_repo="/work/Megatron-Bridge") == 1
    assert json.loads(capsys.readouterr().out)["level_result"] == "Fail"


def test_level3_log_of_the_weight_sync_failure_and_run_a_of_level1():
    v = _level(REAL_LOGS / "h200_s3_level3_fsdp_lora_weight_sync_dtensor.log", 3)
    assert (v.result, v.category, v.level_result) == ("Fail", "weight-sync", "Fail")
    a = _level(REAL_LOGS / "h200_s2_level1_runA_save_pulp_missing.log", 1)
    assert a.level_result != "Pass"


def test_without_the_level_rule_the_level_run_keeps_its_generic_criteria():
    """The level run judges each log with the generic criteria and applies its rule itself (level_rules.py)."""
    v = judge_log(REAL_LOGS / "h200_s2_level0_pass.log", level=3, bridge_src="/work/Megatron-Bridge/src")
    assert len(v.criteria) == 4
