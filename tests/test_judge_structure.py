"""Categories from the structure of a failure (issue #25 items 1-3): the Ray method that raised, the function of the
innermost verl frame, the packages of the frames nearest the exception, then the message.

The fixture logs in tests/logs/structure/ are shaped like real verl output (driver tracebacks with nested
`RayTaskError(X): ray::...` chains, frames relayed through `(TaskRunner pid=N)`, vLLM's logger-prefixed tracebacks,
the old `main_task` driver, Ascend NPU, install prefixes under conda envs); none of them is in the development set.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sessions.judge.frames import called_area, frame_area, frame_category, module_path
from sessions.judge.logstream import NeedleMatcher
from sessions.judge.patterns import H_DISK
from sessions.judge.structure import method_area
from sessions.judge.verdict import SCAN_NEEDLES_BYTES, judge_lines, judge_log

LOGS = Path(__file__).parent / "logs" / "structure"

# fixture -> (result, category, what decided it); `None`: not checked
CASES = {
    # (a) the Ray method, and the function of the innermost verl frame inside it
    "init_model_build_rollout_vllm_kv_cache": ("Fail", "rollout", None),  # init_model -> _build_rollout -> vllm
    "init_model_mbridge_keyerror": ("Fail", "provider", "frames"),
    "init_model_worker_frames_cut": ("Fail", "unknown", "none"),  # model build, but of what: not shown
    "rm_compute_rm_score_runtimeerror": ("Fail", "reward-model", None),
    # the role `rm_`, not `_build_model`: the model whose files are missing is the reward model
    "rm_init_model_weights_missing": ("Blocked", "reward-model", "message and method"),
    "driver_load_checkpoint_assertion": ("Fail", "checkpoint", "function"),  # no worker method at all
    "generate_sequences_sharding_manager_keyerror": ("Fail", "weight-sync", "function"),
    "update_weights_bridge_export": ("Fail", "weight-sync", "method"),
    "unhandled_save_checkpoint_relayed": ("Fail", "checkpoint", None),
    "taskrunner_create_rl_dataset_missing_parquet": ("Blocked", "data", None),
    "taskrunner_config_post_init": ("Fail", "config", None),
    "taskrunner_resource_pool_check": ("Blocked", "env-no-gpu", "function"),
    # a traceback cut right after a verl frame: the function its statement calls is the next frame (data); where
    # a frame below the call is shown (copy.deepcopy evaluating an argument), the call says nothing: not shown
    "taskrunner_cut_at_create_rl_dataset_call": ("Fail", "data", "function"),
    "taskrunner_cut_in_an_argument_of_the_call": ("Fail", "unknown", "none"),
    "main_task_compute_log_prob_oom": ("Fail", "oom", "message"),  # a named cause wins wherever it is
    # (b) the packages of the frames
    "conda_env_named_vllm_actor_build": ("Fail", "unknown", None),  # `envs/vllm/` is no vLLM frame
    "mcore_frames_in_training": ("Fail", "unknown", None),  # megatron.core outside model build: not the provider
    "mcore_frames_while_building": ("Fail", "provider", None),
    "npu_hccl_init_frames": ("Fail", "nccl", "message"),  # HCCL's own error line names it (its frames agree)
    "validate_reward_score_crash": ("Fail", "reward-model", "frames"),
    "dataloader_worker_keyerror": ("Fail", "data", "frames"),
    "model_merger_safetensors": ("Fail", "checkpoint", "frames"),
    "vllm_logger_traceback_launch_server": ("Fail", "rollout", None),
    # torch.distributed's frames under the rollout engine: a communication fault is nccl, the engine misusing a
    # collective (a CPU tensor on an NCCL-only group) is the engine's
    "rollout_build_collective_misuse": ("Fail", "rollout", None),
    "rollout_build_collective_nccl_error": ("Fail", "nccl", None),
    # the innermost frame's raise formats a value of the run's config (verl's code): config; a Bridge provider
    # raising with its own TransformerConfig's value stays the provider
    "sft_build_optimizer_rejects_config_value": ("Fail", "config", "frames"),
    "provider_raise_reads_its_config": ("Fail", "provider", "frames"),
    "thread_traceback_before_driver_chain": ("Fail", "data", "frames"),  # the driver's chain, not a thread's
    # an exception raised in CUDA's lazy init: the process has no usable accelerator (environment) — in a worker's
    # creation; under the rollout engine it stays the engine's (vLLM's fork), and CUDA failing later is no such case
    "worker_init_cuda_lazy_init_fails": ("Blocked", "env-no-gpu", "frames"),
    "vllm_worker_cuda_lazy_init_fails": ("Fail", "rollout", None),
    "cuda_error_at_synchronize_in_training": ("Fail", "unknown", None),
    # (c) the message, where structure says nothing
    "hydra_override_parse_exception": ("Fail", "config", "message"),
    "ray_resource_request_warning_only": ("Blocked", "env-no-gpu", "message"),
    # completion: a planned total not reached, an exception after the last step of a run without one
    "unhandled_generate_after_steps_no_total": ("Fail", "rollout", None),
    "cut_traceback_after_steps_no_total": ("Fail", "unknown", None),
    "complete_then_thread_traceback": ("Pass", "success", None),
    "tqdm_total_not_reached": ("Fail", "unknown", None),
    "config_dump_total_not_reached": ("Fail", "unknown", None),
    "wrapper_trace_total_not_reached": ("Fail", "unknown", None),
    # environment faults: Blocked before training, Fail (same category, the environment hint) after steps ran
    "disk_full_downloading_before_training": ("Blocked", "env-disk", None),
    "disk_full_saving_at_step_400": ("Fail", "env-disk", None),
}


def test_every_fixture_has_a_case():
    assert {p.stem for p in LOGS.glob("*.log")} == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_structural_category(name):
    result, category, decided_by = CASES[name]
    verdict = judge_log(LOGS / f"{name}.log")
    assert (verdict.result, verdict.category) == (result, category), (verdict.first_error,
                                                                      verdict.category_evidence)
    if decided_by:
        assert verdict.category_evidence["decided_by"] == decided_by, verdict.category_evidence
    if verdict.category_evidence["decided_by"] not in ("success", "no error line"):  # the JSON says what was read
        assert verdict.category_evidence["looked_at"] == ["method", "function", "frames", "message"]
    with open(LOGS / f"{name}.log", encoding="utf-8") as handle:  # the line reader agrees
        lines = judge_lines(handle)
    assert (lines.result, lines.category) == (result, category)
    plain = judge_log(LOGS / f"{name}.log", matcher=NeedleMatcher(SCAN_NEEDLES_BYTES, use_hyperscan=False))
    assert (plain.result, plain.category) == (result, category)


def test_planned_totals_name_the_step_reached():
    for name, total in (("tqdm_total_not_reached", 20), ("config_dump_total_not_reached", 50),
                        ("wrapper_trace_total_not_reached", 4)):
        verdict = judge_log(LOGS / f"{name}.log")
        assert verdict.steps_expected == total
        assert f"of {total}" in verdict.first_error and "no exception line" in verdict.first_error


def test_an_environment_fault_after_training_steps_fails_with_its_hint():
    verdict = judge_log(LOGS / "disk_full_saving_at_step_400.log")
    assert verdict.steps_completed == 400 and verdict.hint == H_DISK
    assert "No space left on device" in verdict.first_error


def test_the_method_alone_names_model_build_but_not_the_provider():
    evidence = judge_log(LOGS / "init_model_worker_frames_cut.log").category_evidence
    assert evidence["method"] == "WorkerDict.actor_rollout_init_model"
    assert evidence["method_area"] == "model-build" and evidence["frames"] is None


@pytest.mark.parametrize("content, note", [(b"", "empty"), (b"\n  \n", "empty"), (os.urandom(4096), "binary"),
                                           (b"\x7fELF\x02\x01\x01" + bytes(200) + b"RuntimeError: x", "binary")])
def test_not_a_text_log(tmp_path, content, note):
    path = tmp_path / "input.log"
    path.write_bytes(content)
    verdict = judge_log(path)
    assert verdict.result == "Fail" and f"not a text log ({note})" in verdict.first_error
    assert "not a verl log" in verdict.hint


@pytest.mark.parametrize("path, module", [
    ("/opt/conda/envs/vllm/lib/python3.10/site-packages/torch/distributed/distributed_c10d.py",
     "torch/distributed/distributed_c10d.py"),
    ("/root/verl/verl/workers/fsdp_workers.py", "verl/workers/fsdp_workers.py"),
    ("/_work/verl/verl/verl/workers/engine/megatron/transformer_impl.py",
     "verl/workers/engine/megatron/transformer_impl.py"),
    ("/root/miniforge3/envs/megatron/lib/python3.12/site-packages/mbridge/core/bridge.py", "mbridge/core/bridge.py"),
    ("/usr/local/lib/python3.10/dist-packages/megatron_core-0.11.0-py3.10.egg/megatron/core/x.py", "megatron/core/x.py"),
    ("/workspace/Megatron-Bridge/3rdparty/Megatron-LM/megatron/core/utils.py", "megatron/core/utils.py"),
    ("<stack>/ray/_private/worker.py", "ray/_private/worker.py"),
    ("/data/datasets/my_project/reward.py", None),
    ("/usr/lib/python3.12/asyncio/runners.py", None),
])
def test_module_path_ignores_the_install_prefix(path, module):
    assert module_path(path) == module


def test_frame_tables():
    assert frame_category("/x/site-packages/vllm/v1/engine/core.py") == "rollout"
    assert frame_category("/x/verl/verl/workers/reward_model/sglang_reward.py") == "reward-model"
    assert frame_category("/x/site-packages/torch/distributed/fsdp/_flat_param.py") is None  # FSDP, no collective
    assert frame_category("/x/verl/verl/checkpoint_engine/nccl_checkpoint_engine.py") == "weight-sync"
    assert frame_category("/x/verl/verl/models/registry.py") == "provider"  # verl's Megatron model registry
    # verl's data code, as a package (today) or one module (older verl and its forks)
    assert frame_category("/x/verl/verl/utils/dataset/rl_dataset.py") == "data"
    assert frame_category("/x/Monet/RL/verl/utils/dataset.py") == "data"
    assert frame_category("/x/verl/verl/utils/dataset_utils.py") is None
    # SGLang receiving the trainer's weights is the weight push; its generation and its own loading are rollout
    model_runner = "/x/site-packages/sglang/srt/model_executor/model_runner.py"
    assert frame_area(model_runner, "update_weights_from_tensor") == "weight-sync"
    assert frame_category(model_runner, "update_weights_from_tensor") == "rollout"  # the package stays SGLang's
    assert frame_area(model_runner, "load_model") is None and frame_area(model_runner, "update_weights") is None
    assert frame_category("/x/verl/verl/models/mcore/loader.py") == "provider"
    schedules = "/opt/Megatron-LM/megatron/core/pipeline_parallel/schedules.py"
    assert frame_category(schedules, "forward_step") is None  # Megatron core running the model
    assert frame_category("/opt/Megatron-LM/megatron/core/transformer/transformer_block.py", "__init__") == \
        "megatron-core"
    assert frame_category("/x/verl/verl/models/mcore/model_forward.py") is None  # verl's forward glue, in training
    assert frame_area("/x/verl/verl/workers/fsdp_workers.py", "_build_rollout") == "rollout"
    assert frame_area("/x/site-packages/vllm/worker/worker.py", "update_weights") is None  # vLLM's, not verl's
    assert method_area("WorkerDict.rm_compute_rm_score") == "reward"
    # a sharding manager pushes the weights on __enter__; on __exit__ the engine sleeps and frees its cache
    manager = "/x/verl/verl/workers/sharding_manager/fsdp_vllm.py"
    assert frame_category(manager, "__enter__") == frame_category(manager) == "weight-sync"
    assert frame_category(manager, "__exit__") == "rollout"
    # the trainer's reward managers, called in fit() and _validate()
    assert frame_area("/x/verl/verl/trainer/ppo/ray_trainer.py", "reward_fn") == "reward"
    assert called_area("/x/verl/verl/trainer/ppo/ray_trainer.py", "reward_tensor = self.reward_fn(batch)") == "reward"
    assert method_area("WorkerDict.actor_rollout_update_actor") == "training"
    assert method_area("CheckpointEngineWorker.send_weights") == "weight-sync"
    assert method_area("DAPOTaskRunner.run") == "setup"


@pytest.mark.parametrize("line, expected", [
    ("slurmstepd: error: *** STEP 4242.0 ON gpu01 CANCELLED AT 2025-09-01T10:00:00 DUE TO TIME LIMIT ***",
     ("Blocked", "interrupted")),
    ("slurmstepd: error: Detected 1 oom_kill event in StepId=4242.0. Some of the step tasks have been OOM Killed.",
     ("Fail", "oom")),
    ("AssertionError: Torch not compiled with CUDA enabled", ("Blocked", "env-dependency")),
    ("RuntimeError: NCCL Error 2: unhandled system error (run with NCCL_DEBUG=INFO for details)", ("Fail", "nccl")),
    ("ray.exceptions.OutOfDiskError: Local disk is full", ("Blocked", "env-disk")),
    ("ray.exceptions.RuntimeEnvSetupError: Failed to set up runtime environment.", ("Blocked", "env-ray-import")),
    ("RuntimeError: Failed to infer device type", ("Blocked", "env-no-gpu")),
    ("huggingface_hub.errors.GatedRepoError: 401 Client Error.", ("Blocked", "data")),
    ("FileNotFoundError: [Errno 2] No such file or directory: '/models/Qwen2.5-7B/config.json'", ("Blocked", "data")),
    ("FileNotFoundError: [Errno 2] No such file or directory: '/ckpt/global_step_40/actor/huggingface/config.json'",
     ("Fail", "checkpoint")),
    ("omegaconf.errors.ConfigAttributeError: Key 'foo' is not in struct", ("Blocked", "config")),
    ("ConfigAttributeError: Missing key rollout_n", ("Fail", "config")),
    ("torch.distributed.checkpoint.api.CheckpointException: CheckpointException ranks:dict_keys([0, 1])",
     ("Fail", "checkpoint")),
    ("AssertionError: data.train_batch_size (4) must be >= world_size (8)", ("Fail", "config")),
    ("AssertionError: rollout world_size: 2 is not divisible by infer_tp: 4", ("Fail", "config")),
    ("ImportError: /lib/x86_64-linux-gnu/libc.so.6: version `GLIBC_2.32' not found (required by "
     "/opt/conda/lib/python3.13/site-packages/flash_attn_2_cuda.cpython-313-x86_64-linux-gnu.so)",
     ("Blocked", "env-dependency")),
    ("ray.exceptions.RaySystemError: System error: No module named 'verl'", ("Blocked", "env-ray-import")),
    ("/usr/bin/python3: Error while finding module specification for 'verl.trainer.main_ppo' "
     "(ModuleNotFoundError: No module named 'verl')", ("Blocked", "env-dependency")),
    ("ValueError: The checkpoint you are trying to load has model type `qwen3` but Transformers does not recognize "
     "this architecture.", ("Blocked", "env-dependency")),
    ("OSError: You are trying to access a gated repo.", ("Blocked", "data")),
])
def test_a_message_names_what_the_structure_cannot(line, expected):
    verdict = judge_lines(["(TaskRunner pid=1) Training Progress:   0%|          | 0/5 [00:00<?, ?it/s]", line])
    assert (verdict.result, verdict.category) == expected, verdict.first_error


def test_an_info_line_is_no_error_evidence():
    info = "(vLLMHttpServer pid=3) INFO 09-01 10:00:00 [gpu_worker.py:100] lower gpu_memory_utilization if you see out of memory errors"
    done = ["(TaskRunner pid=1) Total training steps: 1",
            "(TaskRunner pid=1) step:1 - training/global_step:1 - actor/pg_loss:0.1", info]
    assert judge_lines(done).result == "Pass"
    failing = ["(TaskRunner pid=1) Total training steps: 2",
               "(TaskRunner pid=1) step:1 - training/global_step:1 - actor/pg_loss:0.1", info,
               "ray.exceptions.RayTaskError(RuntimeError): ray::WorkerDict.actor_rollout_generate_sequences() (pid=2)",
               "RuntimeError: CUDA error: an illegal memory access was encountered"]
    verdict = judge_lines(failing)
    assert (verdict.result, verdict.category) == ("Fail", "rollout"), verdict.first_error


def test_a_logged_error_line_alone_names_no_cause():
    logged = "(AgentLoopWorker pid=7) ERROR [/root/verl/verl/experimental/agent_loop/tool_parser.py] Failed to decode"
    verdict = judge_lines(["(TaskRunner pid=1) Total training steps: 9",
                           "(TaskRunner pid=1) step:1 - training/global_step:1 - actor/pg_loss:0.1", logged])
    assert (verdict.result, verdict.category) == ("Fail", "unknown")
    assert verdict.first_error.startswith("no exception line in the log; it ends after step 1 of 9")
    assert "Failed to decode" in verdict.first_error
    # vLLM's logger-prefixed traceback cut before its exception line is still a traceback in vLLM's frames
    cut = ["(vLLMHttpServer pid=5) (EngineCore_DP0 pid=6) ERROR 06-16 03:57:27 [core.py:68] Traceback (most recent "
           "call last):",
           '(vLLMHttpServer pid=5) (EngineCore_DP0 pid=6) ERROR 06-16 03:57:27 [core.py:68]   File '
           '"/vllm/vllm/v1/engine/core.py", line 109, in __init__',
           "(vLLMHttpServer pid=5) (EngineCore_DP0 pid=6) ERROR 06-16 03:57:27 [core.py:68]     num_gpu_blocks = "
           "self._initialize_kv_caches("]
    assert (judge_lines(cut).result, judge_lines(cut).category) == ("Fail", "rollout")


def test_the_ray_method_is_the_decisive_chains():
    chain = ["Traceback (most recent call last):",
             "ray.exceptions.RayTaskError(ValueError): ray::WorkerDict.actor_rollout_generate_sequences() (pid=2)",
             "ValueError: prompt too long for the engine",
             "(TaskRunner pid=1) Unhandled error (suppress with 'RAY_IGNORE_UNHANDLED_ERRORS=1'): "
             "ray::WorkerDict.actor_rollout_save_checkpoint() (pid=3)"]
    verdict = judge_lines(chain)
    assert verdict.category_evidence["method"] == "WorkerDict.actor_rollout_generate_sequences"
    assert verdict.category == "rollout"


def test_a_death_or_timeout_after_an_exception_is_its_consequence():
    root = ["(WorkerDict pid=2) Traceback (most recent call last):",
            '(WorkerDict pid=2)   File "/usr/local/lib/python3.10/dist-packages/mbridge/core/bridge.py", line 160, '
            'in load_weights',
            "(WorkerDict pid=2) KeyError: 'decoder.layers.0.mlp.router.expert_bias'"]
    peers = ["(WorkerDict pid=3) [rank1]:[E901 10:10:00.000 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught "
             "collective operation timeout: WorkNCCL(SeqNum=5, OpType=BROADCAST, Timeout(ms)=600000) ran for 600010 "
             "milliseconds before timing out.",
             "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task."]
    verdict = judge_lines(root + peers)
    assert (verdict.result, verdict.category) == ("Fail", "provider"), verdict.first_error
    assert "KeyError" in verdict.first_error
    # a thread's uncaught exception is no such cause: the process went on (vLLM's usage-stats thread, offline)
    thread = ["(TaskRunner pid=1) Total training steps: 100",
              "(TaskRunner pid=1) step:30 - training/global_step:30 - actor/pg_loss:0.1",
              "(WorkerDict pid=2) Exception in thread Thread-3 (_report_usage_worker):",
              "(WorkerDict pid=2) Traceback (most recent call last):",
              '(WorkerDict pid=2)   File "/usr/lib/python3/dist-packages/vllm/usage/usage_lib.py", line 150, in run',
              "(WorkerDict pid=2) requests.exceptions.ConnectionError: HTTPSConnectionPool(host='stats.vllm.ai')",
              "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task."]
    verdict = judge_lines(thread)
    assert (verdict.result, verdict.category) == ("Fail", "actor-died"), verdict.first_error


def test_the_trainer_raising_after_its_last_step_fails_the_run():
    lines = ["(TaskRunner pid=1) Total training steps: 2",
             "(TaskRunner pid=1) step:2 - training/global_step:2 - actor/pg_loss:0.1",
             "(TaskRunner pid=1) Traceback (most recent call last):",
             '(TaskRunner pid=1)   File "/root/verl/verl/trainer/ppo/ray_trainer.py", line 900, in _save_checkpoint',
             "(TaskRunner pid=1) PermissionError: [Errno 13] Permission denied: '/ckpt/latest_checkpointed_iteration.txt'"]
    verdict = judge_lines(lines)
    assert (verdict.result, verdict.category) == ("Fail", "checkpoint"), verdict.first_error


def test_init_model_without_frames_is_decided_by_the_exception():
    lines = ["ray.exceptions.RayTaskError(FileNotFoundError): ray::WorkerDict.actor_rollout_init_model() (pid=2)",
             '  File "/root/verl/verl/workers/fsdp_workers.py", line 260, in _build_model_optimizer',
             '  File "/root/verl/verl/utils/fs.py", line 80, in copy_to_local',
             "FileNotFoundError: /models/Qwen2.5-0.5B does not exist"]
    verdict = judge_lines(lines)
    assert (verdict.result, verdict.category) == ("Blocked", "data")  # the model path, before anything ran
    other = judge_lines(lines[:-1] + ["ValueError: bad rope scaling"])
    assert (other.result, other.category) == ("Fail", "unknown")  # not "provider": no provider frame is shown


# verl's checkpoint directory is `<default_local_dir>/global_step_N/actor|critic`: ray_trainer._save_checkpoint prints
# `local_global_step_folder: ...`, then local_mkdir_safe warns when it cannot lock a directory it is making
LOCK_WARNING = ("\x1b[36m(WorkerDict pid=42225, ip=10.0.0.9)\x1b[0m Warning: Failed to acquire lock for "
                "/scratch/ckpt/global_step_1/actor: [Errno 30] Read-only file system: '/scratch'")
HYDRA = "Error executing job with overrides: ['trainer.save_freq=1', 'trainer.total_training_steps=3']"


@pytest.mark.parametrize("first", [LOCK_WARNING, "(TaskRunner pid=7) local_global_step_folder: /scratch/ckpt/global_step_1"])
def test_a_failure_at_verls_checkpoint_directory_is_in_the_checkpoint_phase(first):
    # the exception itself is not shown (an excerpt): where the run was, at a checkpoint directory, names the cause
    verdict = judge_lines([first, HYDRA])
    assert (verdict.result, verdict.category, verdict.phase) == ("Fail", "checkpoint", "checkpoint")
    # without that line the same failure says nothing about where it was
    assert judge_lines([HYDRA]).category == "unknown"


def test_a_save_the_run_trains_past_leaves_the_checkpoint_phase():
    step = ("(TaskRunner pid=7) step:{n} - training/global_step:{n} - actor/pg_loss:0.1 - critic/score/mean:0.5")
    lines = ["(TaskRunner pid=7) Total training steps: 3", step.format(n=1),
             "(TaskRunner pid=7) local_global_step_folder: /scratch/ckpt/global_step_1",
             "(WorkerDict pid=9) [rank-0]: Saving model to /scratch/ckpt/global_step_1/actor/model_world_size_1_rank_0.pt",
             step.format(n=2), step.format(n=3)]
    verdict = judge_lines(lines)
    assert verdict.result == "Pass" and verdict.steps_completed == 3
    # and a resume's directory before the first step is a read: the run got no further than its models
    resumed = judge_lines(["(WorkerDict pid=9) loading /scratch/ckpt/global_step_5/actor/model_world_size_1_rank_0.pt",
                           HYDRA])
    assert resumed.phase == "checkpoint" and resumed.category == "checkpoint"
