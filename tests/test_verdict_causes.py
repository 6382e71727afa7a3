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


RAY_NAME_TAKEN = [  # verl 0.2/0.3's worker-group register center (verl/single_controller/base/register_center/ray.py)
    "Traceback (most recent call last):",
    '  File "/workspace/verl/verl/trainer/main_ppo.py", line 188, in main_task',
    "    trainer.init_workers()",
    '  File "/workspace/verl/verl/trainer/ppo/ray_trainer.py", line 613, in init_workers',
    "    wg_dict = self.ray_worker_group_cls(resource_pool=resource_pool, ray_cls_with_init=worker_dict_cls)",
    '  File "/workspace/verl/verl/single_controller/ray/base.py", line 203, in __init__',
    "    self._init_with_resource_pool(resource_pool=resource_pool, ray_cls_with_init=ray_cls_with_init, bin_pack=bin_pack, detached=detached)",
    '  File "/workspace/verl/verl/single_controller/ray/base.py", line 264, in _init_with_resource_pool',
    "    register_center_actor = create_worker_group_register_center(name=self._name_prefix + \"_register_center\",",
    '  File "/workspace/verl/verl/single_controller/base/register_center/ray.py", line 28, in '
    "create_worker_group_register_center",
    "    return WorkerGroupRegisterCenter.options(name=name).remote(info)",
    '  File "/opt/conda/lib/python3.10/site-packages/ray/actor.py", line 1064, in _remote',
    "    raise ValueError(",
    "ValueError: The name a1b2C3_register_center (namespace=None) is already taken. Please use a different name or "
    "get the existing actor using ray.get_actor('a1b2C3_register_center', namespace='None')",
]


def test_a_named_actor_another_run_holds_is_ray_not_the_run():
    verdict = judge_lines(RAY_NAME_TAKEN)
    assert (verdict.result, verdict.category) == ("Blocked", "env-ray-import"), verdict.first_error
    assert "is already taken" in verdict.first_error and "ray stop" in verdict.hint
    after_steps = judge_lines(["(TaskRunner pid=7) step:3 - training/global_step:3 - actor/pg_loss:0.1",
                               *RAY_NAME_TAKEN])
    assert (after_steps.result, after_steps.category) == ("Fail", "env-ray-import")


# Hydra's own message when the config name the command passes is in none of its search paths (written as Hydra
# prints it, with the search path it lists)
HYDRA_MISSING_CONFIG = [
    "Cannot find primary config 'grpo_trainer_custom'. Check that it's in your config search path.",
    "",
    "Config search path:",
    "\tprovider=hydra, path=pkg://hydra.conf",
    "\tprovider=main, path=file:///opt/verl/verl/trainer/config",
    "\tprovider=schema, path=structured://",
    "",
    "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.",
]


def test_a_config_name_hydra_cannot_find_is_the_command_s_config():
    verdict = judge_lines(HYDRA_MISSING_CONFIG)
    assert (verdict.result, verdict.category) == ("Fail", "config"), verdict.first_error
    assert verdict.first_error.startswith("Cannot find primary config 'grpo_trainer_custom'")
    assert "--config-path" in verdict.hint
    without = judge_lines(HYDRA_MISSING_CONFIG[1:])  # the search path alone names no cause
    assert without.category == "unknown"


def test_ascend_s_collective_library_failing_is_nccl_and_a_pydantic_error_is_where_it_was_raised():
    hccl = judge_lines(["(TaskRunner pid=30188) RuntimeError: create_config:build/CMakeFiles/torch_npu.dir/"
                        "compiler_depend.ts:102 HCCL function error: hcclCommInitRootInfoConfig(numRanks, &rootInfo, "
                        "rank, config, &(comm->hcclComm_)), error code is 4"])
    assert (hccl.result, hccl.category) == ("Fail", "nccl"), hccl.first_error
    # a pydantic model the rollout builds per request rejecting its fields: the rollout's, not the run's config
    rollout = judge_lines([
        "(AsyncSglangServer pid=41) Traceback (most recent call last):",
        '(AsyncSglangServer pid=41)   File "/w/verl/verl/workers/rollout/sglang_rollout/sglang_rollout.py", line 1083, '
        "in chat_completion",
        "(AsyncSglangServer pid=41)     req = AsyncRolloutRequest(",
        '(AsyncSglangServer pid=41)   File "/env/site-packages/pydantic/main.py", line 253, in __init__',
        "(AsyncSglangServer pid=41) pydantic_core._pydantic_core.ValidationError: 1 validation error for "
        "AsyncRolloutRequest",
    ])
    assert (rollout.result, rollout.category) == ("Fail", "rollout"), rollout.first_error


def test_taskrunner_run_names_setup_and_only_the_exception_type_says_which_part():
    def driver(exc: str) -> list[str]:
        return ["Traceback (most recent call last):",
                '  File "/w/verl/verl/trainer/main_ppo.py", line 85, in run_ppo',
                "    ray.get(runner.run.remote(config))",
                f"ray.exceptions.RayTaskError({exc}): ray::TaskRunner.run() (pid=8, ip=10.0.0.5, actor_id=f5a0, "
                "repr=<main_ppo.TaskRunner object at 0x7f>)"]
    # TaskRunner.run() also runs fit(): a RuntimeError raised there, its message and frames cut off, names nothing
    assert judge_lines(driver("RuntimeError")).category == "unknown"
    assert judge_lines(driver("FileNotFoundError")).category == "data"
    assert judge_lines(driver("ValidationError")).category == "config"


def test_a_frame_line_a_paste_cut_before_its_file_marker_is_still_a_frame():
    # an excerpt that starts mid-line: the first frame lost its `  File "/home/u/` (the data code raised)
    cut = ['Monet/RL/verl/utils/dataset/rl_dataset.py", line 227, in _build_messages',
           "    prompt_str: str = example[self.prompt_key]",
           "KeyError: 'problem'"]
    assert judge_lines(cut).category == "data"
    assert judge_lines(cut[1:]).category == "unknown"  # without it nothing says where


# A checkpoint save that fails on a full disk: the save line is the only step evidence of this excerpt (verl saves
# global_step_N after step N's update, before step N's metrics line)
DISK_FULL = [
    "(WorkerDict pid=20172) Saving actor checkpoint to checkpoints/demo/actor/global_step_{step}",
    "ray.exceptions.RayTaskError(SafetensorError): ray::WorkerDict.actor_rollout_save_checkpoint() (pid=20172)",
    "safetensors_rust.SafetensorError: Error while serializing: IoError(Os { code: 28, kind: StorageFull, "
    'message: "No space left on device" })',
]


def test_an_environment_fault_after_the_steps_a_save_path_names_is_fail_with_the_hint():
    verdict = judge_lines([line.replace("{step}", "400") for line in DISK_FULL])
    assert (verdict.result, verdict.category) == ("Fail", "env-disk")
    assert verdict.steps_completed == 0  # no metrics line shows one: the save is named as the reason
    assert any("global_step_400" in note and "Fail" in note for note in verdict.limitations), verdict.limitations
    assert "HF_HOME" in verdict.hint
    assert "checkpoints/demo/actor/global_step_400" in verdict.checkpoints_saved


def test_a_disk_full_before_any_step_stays_blocked():
    verdict = judge_lines(DISK_FULL[1:])
    assert (verdict.result, verdict.category) == ("Blocked", "env-disk")


def test_a_missing_package_after_a_step_stays_blocked():
    """The save path imports a dependency the environment lacks: that code never ran, as preflight would say."""
    lines = ["Total training steps: 3", "step:1 - actor/pg_loss:0.1 - critic/score/mean:0.2",
             "Saving checkpoint to /c/global_step_1",
             "Traceback (most recent call last):", "ModuleNotFoundError: No module named 'pulp'"]
    verdict = judge_lines(lines)
    assert (verdict.result, verdict.category) == ("Blocked", "env-dependency"), verdict.first_error


def test_a_data_column_missing_inside_fit_is_fail_not_blocked():
    """The trainer's fit() ran (workers built, validation rollout done) before the reward read a column the data
    lacks: the provider was exercised, so it is no Blocked; the same KeyError before fit stays Blocked."""
    frames = ['  File "/w/verl/verl/trainer/main_ppo.py", line 217, in run',
              '  File "/w/verl/verl/trainer/ppo/ray_trainer.py", line 910, in fit',
              '  File "/w/verl/verl/trainer/ppo/ray_trainer.py", line 627, in _validate']
    head = ["ray.exceptions.RayTaskError(KeyError): ray::TaskRunner.run() (pid=221840)",
            "Traceback (most recent call last):"]
    inside = judge_lines([*head, *frames, "KeyError: 'reward_model'"])
    assert (inside.result, inside.category) == ("Fail", "data"), inside.category_evidence
    before = judge_lines([*head, frames[0], "KeyError: 'reward_model'"])
    assert (before.result, before.category) == ("Blocked", "data"), before.category_evidence


@pytest.mark.parametrize("line, category", [
    # the callee a signature error names is where it was raised: saving HF weights with a checkpoint
    ("TypeError: Bridge.save_weights() got an unexpected keyword argument 'distributed_filesystem'", "checkpoint"),
    ("TypeError: RayPPOTrainer._save_checkpoint() missing 1 required positional argument: 'step'", "checkpoint"),
    ("TypeError: ActorRolloutRefWorker.generate_sequences() takes 2 positional arguments but 3 were given",
     "rollout"),
    # a function of no area of verl's loop: the message alone says nothing more
    ("TypeError: Widget.render() got an unexpected keyword argument 'x'", "unknown"),
])
def test_a_quoted_signature_error_is_read_and_its_callee_says_where(line, category):
    # a paste quoted in an issue comment (`> `), the versions after it: the line is the error, quoted or not
    for quoted in (line, f"> {line}", f"> > {line}"):
        verdict = judge_lines([quoted, "verl 0.7.0.dev0", "mbridge 0.15.1"])
        assert (verdict.result, verdict.category) == ("Fail", category), (quoted, verdict.first_error)
        assert verdict.first_error == line
