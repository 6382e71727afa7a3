"""Causes the verdict names from where the error came from (session 4): a Hydra key the traced script passed and
the installed verl rejects is the wrapper and verl from different releases (env-dependency); the same rejection
with no traced command is a key the user gave (config)."""

from __future__ import annotations

import pytest

from sessions.judge.verdict import judge_lines, judge_log
from tests.conftest import real_logs

HYDRA = [
    "Could not override 'actor_rollout_ref.actor.megatron.grad_offload'.",
    "To append to your config use +actor_rollout_ref.actor.megatron.grad_offload=False",
    "Key 'grad_offload' is not in struct",
    "    full_key: actor_rollout_ref.actor.megatron.grad_offload",
    "    object_type=dict",
    "",
    "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.",
]
TRACED = ("+ python3 -m verl.trainer.main_ppo --config-path=config trainer.total_training_steps=2 "
          "actor_rollout_ref.actor.megatron.grad_offload=False trainer.n_gpus_per_node=1")


def test_a_rejected_key_the_traced_script_passed_is_a_release_mismatch():
    verdict = judge_lines(["+ TOTAL_TRAIN_STEPS=2", TRACED, *HYDRA])
    assert (verdict.result, verdict.category) == ("Blocked", "env-dependency"), verdict.first_error
    assert "different releases" in verdict.hint
    assert verdict.category_evidence["decided_by"] == "message and traced command"


@pytest.mark.parametrize("before", [
    [],  # a bare Hydra block (a user's command, not shown)
    ["+ python3 -m verl.trainer.main_ppo trainer.total_training_steps=2 trainer.n_gpus_per_node=1"],  # key not passed
    ["python3 -m verl.trainer.main_ppo actor_rollout_ref.actor.megatron.grad_offload=False"],  # not a set -x trace
])
def test_a_rejected_key_without_a_traced_script_passing_it_is_config(before):
    verdict = judge_lines([*before, *HYDRA])
    assert (verdict.result, verdict.category) == ("Blocked", "config"), verdict.first_error


def test_the_leaf_key_of_not_in_struct_is_looked_up_in_the_traced_command():
    lines = ["+ python3 -m verl.trainer.main_ppo +actor_rollout_ref.model.lora_rank=8", "Traceback (most recent call "
             "last):", "omegaconf.errors.ConfigAttributeError: Key 'lora_rank' is not in struct"]
    verdict = judge_lines(lines)
    assert verdict.category == "env-dependency", verdict.category_evidence


def test_real_wrapper_run_against_another_verl_release_is_env_dependency():
    verdict = judge_log(real_logs() / "h200_cpu_rehearsal_wrapper_v090_with_verl091.log")
    assert (verdict.result, verdict.category) == ("Blocked", "env-dependency"), verdict.first_error


def test_a_worker_s_missing_bridge_relayed_by_the_taskrunner_is_env_ray_import_once_its_line_is_there():
    """88's excerpt ends inside the relayed frames: no exception line, no evidence (Fail, SPEC). The same frames
    with the worker's `No module named 'megatron.bridge'` are Blocked env-ray-import (runtime_env PYTHONPATH)."""
    lines = (real_logs() / "88_blocked_env_npu_megatron_bridge_missing_worker_frames_only.log").read_text().splitlines()
    cut = judge_lines(lines)
    assert cut.result == "Fail" and "without its exception line" in cut.first_error
    whole = judge_lines(lines[:-1] + [
        '(TaskRunner pid=18998)   File "/verl/verl/workers/megatron_workers.py", line 12, in init_model',
        "(TaskRunner pid=18998) ModuleNotFoundError: No module named 'megatron.bridge'"])
    assert (whole.result, whole.category) == ("Blocked", "env-ray-import"), whole.first_error


def test_vllm_failing_to_inspect_the_architecture_in_init_model_is_the_rollout():
    """64's excerpt is cut before vLLM's message (it is only in the issue title): with it, the rollout."""
    lines = (real_logs() / "64_fail_rollout_vllm_arch_inspect_valueerror_init_model_nested.log").read_text().splitlines()
    assert judge_lines(lines).category == "unknown"  # method init_model, ValueError, no frame says which model
    whole = judge_lines(lines + ["ValueError: Model architectures ['Qwen2ForCausalLM'] failed to be inspected. "
                                 "Please check the logs for more details."])
    assert (whole.result, whole.category) == ("Fail", "rollout"), whole.category_evidence
