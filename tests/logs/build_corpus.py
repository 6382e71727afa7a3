"""Writes the verdict-engine corpus: realistic verl console logs (formats from verl-interface.md) + expected.json.

Run once (`python tests/logs/build_corpus.py`); the .log files and expected.json are committed, so tests read
files, not this script. Each case states its expected verdict by hand.
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).parent
ESC = "\x1b"
TR, WD, VS = "(TaskRunnerV1 pid=2101)", "(WorkerDict pid=2288)", "(vLLMHttpServer pid=2301)"
WD_IP = "(WorkerDict pid=2288, ip=10.0.0.4)"
BRIDGE = "/work/Megatron-Bridge/src/megatron/bridge"
VERL = "/work/verl/verl"


def header(level=0, steps=1):
    return [f"[verl-e2e] level {level} model=Qwen/Qwen2.5-0.5B VANILLA_MBRIDGE=False TOTAL_TRAIN_STEPS={steps}",
            "[verl-e2e] command: bash tests/special_e2e/run_ppo_trainer_megatron.sh ..."]


def trace(vanilla="False", steps=1, save_freq=-1, resume="disable", extra="", cmdline=True, vars_=True):
    out = []
    if vars_:
        out += ["+ NUM_GPUS=1", "+ ENGINE=vllm", "+ USE_MBRIDGE=True", f"+ VANILLA_MBRIDGE={vanilla}",
                f"+ VALUE_VANILLA_MBRIDGE={vanilla}", "+ LORA_RANK=4", "+ USE_MEGATRON_FSDP=False",
                f"+ TOTAL_TRAIN_STEPS={steps}", f"+ SAVE_FREQ={save_freq}", f"+ RESUME_MODE={resume}",
                "+ export PYTHONPATH=/workspace/Megatron-LM:/work/Megatron-Bridge/src:/work/verl",
                "PYTHONPATH=/workspace/Megatron-LM:/work/Megatron-Bridge/src:/work/verl"]
    if cmdline:
        out.append(
            "+ python3 -m verl.trainer.main_ppo --config-path=config --config-name=ppo_megatron_trainer.yaml "
            "algorithm.adv_estimator=gae data.train_files=/data/gsm8k/train.parquet "
            "data.val_files=/data/gsm8k/test.parquet data.train_batch_size=16 "
            "actor_rollout_ref.model.path=/models/Qwen/Qwen2.5-0.5B actor_rollout_ref.model.lora.rank=4 "
            f"actor_rollout_ref.actor.megatron.use_mbridge=True actor_rollout_ref.actor.megatron.vanilla_mbridge={vanilla} "
            f"actor_rollout_ref.ref.megatron.vanilla_mbridge={vanilla} critic.megatron.vanilla_mbridge={vanilla} "
            "actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.tensor_model_parallel_size=1 "
            f"trainer.total_training_steps={steps} trainer.save_freq={save_freq} trainer.resume_mode={resume} "
            "trainer.n_gpus_per_node=1 trainer.nnodes=1 "
            "++ray_kwargs.ray_init.runtime_env.env_vars.PYTHONPATH=/work/Megatron-Bridge/src:/work/verl" + extra)
    return out


def ray_up(tr=TR, total=1):
    return ["2026-08-14 12:00:03,120\tINFO worker.py:1917 -- Started a local Ray instance. View the dashboard at "
            "127.0.0.1:8265 ",
            f"{tr} TaskRunner hostname: gpu01, PID: 2101",
            f"{tr} {{'actor_rollout_ref': {{'actor': {{'megatron': {{'use_mbridge': True, 'vanilla_mbridge': False}}}}}}}}",
            f"{tr} torchtitan engine is not available: No module named 'torchtitan'",
            f"{tr} Using dataset class: RLHFDataset",
            f"{tr} dataset len: 7473",
            f"{tr} Size of train dataloader: 467, Size of val dataloader: 1",
            f"{tr} Total training steps: {total}"]


def model_build(wd=WD):
    return [f"{wd} Enabling LORA with rank=4, alpha=32, dropout=0.0",
            f"{wd} Enabling LORA with rank=4, alpha=32, dropout=0.0 [repeated 2x across cluster]"]


def model_built(wd=WD):
    return [f"{wd} PEFT Adapter Information:",
            f"{wd}   Total parameters: 494,032,768",
            f"{wd}   Adapter parameters: 1,081,344",
            f"{wd}   Trainable percentage: 0.22%",
            f"{wd}  > number of parameters on (tensor, pipeline) model parallel rank (0, 0): 495114112"]


def rollout_up():
    return [f"{VS} INFO 08-14 12:01:10 [__init__.py:239] Automatically detected platform cuda.",
            f"{VS} (EngineCore pid=2355) INFO 08-14 12:01:15 [core.py:77] Initializing a V1 LLM engine (v0.11.0) "
            "with config: model='/models/Qwen/Qwen2.5-0.5B', dtype=torch.bfloat16, enforce_eager=False",
            f"{VS} (EngineCore pid=2355) Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): "
            "100%|##########| 67/67 [00:05<00:00, 12.3it/s]",
            f"{VS} INFO 08-14 12:01:30 [loggers.py:123] Engine 000: Avg prompt throughput: 812.4 tokens/s, "
            "Avg generation throughput: 1934.2 tokens/s, Running: 12 reqs, Waiting: 0 reqs"]


def step_line(n, fmt="new", pg="np.float64(-0.012345678901)", grad="0.4567", extra=""):
    if fmt == "old":
        metrics = (f"training/global_step:{n} - training/epoch:0 - actor/pg_loss:-0.012 - actor/entropy:1.234 - "
                   f"actor/grad_norm:0.457 - actor/ppo_kl:0.000 - critic/vf_loss:2.101 - critic/score/mean:0.062 - "
                   f"critic/rewards/mean:0.062 - response_length/mean:187.250 - timing_s/step:56.123")
    else:
        metrics = (f"training/global_step:{n} - training/epoch:np.int64(0) - actor/pg_loss:{pg} - "
                   f"actor/pg_clipfrac:np.float64(0.00123) - actor/ppo_kl:np.float64(1.2e-05) - "
                   f"actor/entropy:np.float64(1.2345678) - actor/grad_norm:{grad} - actor/lr:1e-06 - "
                   f"critic/vf_loss:np.float64(2.1012) - critic/score/mean:np.float64(0.0625) - "
                   f"critic/rewards/mean:np.float64(0.0625) - response_length/mean:np.float64(187.25) - "
                   f"val-core/openai/gsm8k/acc/mean@1:0.125 - timing_s/step:56.12345 - perf/throughput:123.4{extra}")
    return f"{TR} step:{n} - {metrics}"


def bar(n, total, pct=None):
    pct = pct if pct is not None else int(100 * n / total)
    return f"{TR} \rTraining Progress: {pct:3d}%|#####     | {n}/{total} [00:56<00:00, 56.1s/it]"


def steps(total, start=1, fmt="new", tqdm=True):
    out = [bar(0, total)] if tqdm else []
    for n in range(start, total + 1):
        out += [f"{WD} update_actor: micro batches 8", step_line(n, fmt)]
        if tqdm:
            out.append(bar(n, total))
    return out


def shutdown_noise():
    return ["/usr/lib/python3.12/multiprocessing/resource_tracker.py:279: UserWarning: resource_tracker: There appear "
            "to be 1 leaked semaphore objects to clean up at shutdown",
            "Exception ignored in atexit callback: <function _exit_function at 0x7f3c2a1b2c20>",
            "Traceback (most recent call last):",
            '  File "/usr/lib/python3.12/multiprocessing/util.py", line 357, in _exit_function',
            "    p.join()",
            "RuntimeError: DataLoader worker (pid 3412) is killed by signal: Killed. "]


def driver_failure(method, exc_type, message, *, inner_frames=None, hydra=True, task="TaskRunner.run"):
    out = []
    if hydra:
        out.append("Error executing job with overrides: ['algorithm.adv_estimator=gae', 'trainer.total_training_steps=1']")
    out += ["Traceback (most recent call last):",
            f'  File "{VERL}/trainer/main_ppo.py", line 42, in main',
            "    run_ppo(config)",
            f'  File "{VERL}/trainer/main_ppo.py", line 96, in run_ppo',
            "    ray.get(runner.run.remote(config))",
            '  File "/usr/local/lib/python3.12/dist-packages/ray/_private/worker.py", line 2882, in get',
            "    values, debugger_breakpoint = worker.get_objects(object_refs, timeout=timeout)",
            "    ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
            f"ray.exceptions.RayTaskError({exc_type}): ray::{task}() (pid=2101, ip=10.0.0.4, "
            "actor_id=6f1c0a7e7d0f8b9a01000000, repr=<main_ppo.TaskRunner object at 0x7f9c1c2d3e40>)",
            f'  File "{VERL}/trainer/main_ppo.py", line 340, in run',
            "    trainer.init_workers()" if "init" in method else "    trainer.fit()"]
    if method:
        out += [f"ray.exceptions.RayTaskError({exc_type}): ray::WorkerDict.{method}() (pid=2288, ip=10.0.0.4, "
                "actor_id=a1b2c3d4e5f6a7b8c9d0e1f2, repr=<verl.single_controller.ray.base.WorkerDict object at 0x7f>)",
                f'  File "{VERL}/single_controller/ray/base.py", line 770, in func',
                "    return getattr(self.worker_dict[key], name)(*args, **kwargs)"]
    out += inner_frames or []
    out += [f"{exc_type}: {message}" if exc_type else message]
    if hydra:
        out += ["", "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace."]
    return out


def frames(*paths):
    out = []
    for path in paths:
        out += [f'  File "{path}", line 123, in fn', "    do_something()"]
    return out


CASES: list[dict] = []


def case(name, lines, expect, **run):
    CASES.append({"name": name, "lines": lines, "expect": expect, "run": run})


def healthy(total=1, fmt="new", tqdm=True, noise=True, **trace_kw):
    lines = header(steps=total) + trace(steps=total, **trace_kw) + ray_up(total=total) + model_build()
    lines += model_built() + rollout_up() + steps(total, fmt=fmt, tqdm=tqdm)
    return lines + (shutdown_noise() if noise else [])


before_model = header() + trace() + ray_up()
during_build = before_model + model_build()
built = during_build + model_built() + rollout_up()
built3 = header(steps=3) + trace(steps=3) + ray_up(total=3) + model_build() + model_built() + rollout_up()

# ---- passes --------------------------------------------------------------------------------------------------
case("pass_1step_tqdm", healthy(), {"result": "Pass", "category": "success", "steps_completed": 1,
     "vanilla_mbridge": "False", "residual_noise": True, "adapter_total": 494032768}, exit_code=0)
case("pass_1step_no_tqdm", healthy(tqdm=False, noise=False), {"result": "Pass", "category": "success",
     "steps_completed": 1, "residual_noise": False}, exit_code=0)
case("pass_5steps_old_format", healthy(total=5, fmt="old"), {"result": "Pass", "category": "success",
     "steps_completed": 5, "steps_expected": 5, "metric": [3, "actor/grad_norm", 0.457]})
case("pass_np_float64_scientific", healthy(total=2), {"result": "Pass", "steps_completed": 2,
     "metric": [2, "actor/pg_loss", -0.012345678901], "metric2": [1, "actor/ppo_kl", 1.2e-05]}, exit_code=0)
ansi = []
for line in healthy(total=2):
    if line.startswith("("):
        prefix, _, rest = line.partition(") ")
        ansi.append(f"{ESC}[36m{prefix}){ESC}[0m {rest}")
    else:
        ansi.append(line)
ansi.insert(-8, f"{ESC}[36m(TaskRunnerV1 pid=2101){ESC}[0m \rTraining Progress:  50%|#####     | 1/2 [00:56<00:56, 56.1s/it]"
            "\rTraining Progress:  50%|#####     | 1/2 [00:57<00:57, 57.0s/it] [repeated 2x across cluster]")
case("pass_ansi_cr_repeated", ansi, {"result": "Pass", "category": "success", "steps_completed": 2}, exit_code=0)
case("pass_residual_noise_atexit", healthy() + [
    "(raylet) [2026-08-14 12:05:01,001 E 1999 2001] (raylet) node_manager.cc:3065: 1 Workers (tasks / actors) "
    "killed due to SIGTERM during shutdown", "*** SIGTERM received at time=1755172800 on cpu 3 ***"],
     {"result": "Pass", "category": "success", "residual_noise": True,
      "limitation": "residual noise"}, exit_code=0)
nonfatal = healthy()
nonfatal[len(header()) + len(trace()) + 3:len(header()) + len(trace()) + 3] = [
    f"{TR} Traceback (most recent call last):",
    f'{TR}   File "{VERL}/workers/engine/__init__.py", line 20, in <module>',
    f"{TR}     from .torchtitan import TorchTitanEngine",
    f"{TR} ModuleNotFoundError: No module named 'torchtitan'",
    f"{VS} (EngineCore pid=2355) WARNING 08-14 12:01:11 [__init__.py:30] ModuleNotFoundError: No module named "
    "'vllm._flashmla_C' (optional kernel)",
    f"{WD} /usr/local/lib/python3.12/dist-packages/transformer_engine/pytorch/attention.py:12: UserWarning: "
    "flash-attn not found, ModuleNotFoundError: No module named 'flash_attn'"]
case("pass_nonfatal_modulenotfound", nonfatal, {"result": "Pass", "category": "success"}, exit_code=0)
wrapped = []
for line in healthy(total=2, noise=False):
    if "step:" in line and "training/global_step" in line:
        wrapped += [line[i:i + 100] for i in range(0, len(line), 100)]
    else:
        wrapped.append(line)
case("pass_wrapped_step_lines", wrapped, {"result": "Pass", "steps_completed": 2,
     "metric": [2, "critic/vf_loss", 2.1012], "metric2": [2, "perf/throughput", 123.4]}, exit_code=0)
stamped = [f"2026-08-14T12:0{i % 10}:{i % 60:02d}.123456Z {line}" for i, line in enumerate(healthy())]
case("pass_external_timestamps", stamped, {"result": "Pass", "category": "success", "vanilla_mbridge": "False"})
labelled = [f"0: {line}" for line in healthy(noise=False)]
case("pass_srun_labels", labelled, {"result": "Pass", "category": "success"}, exit_code=0)
old = [line.replace("(TaskRunnerV1 pid=2101)", "(main_task pid=2101)") for line in healthy(total=2, fmt="old")]
case("pass_old_main_task_prefix", old, {"result": "Pass", "steps_completed": 2}, exit_code=0)
ipv = [line.replace(WD, WD_IP) for line in healthy()]
case("pass_ip_prefix", ipv, {"result": "Pass", "adapter_total": 494032768}, exit_code=0)
late = healthy(total=2, noise=False) + [f"{WD} update_actor: micro batches 8 [repeated 3x across cluster]",
                                        f"{VS} (EngineCore pid=2355) INFO 08-14 12:06:00 Engine 000: idle",
                                        f"{WD_IP} Releasing GPU memory after rollout"] + shutdown_noise()[:1]
case("pass_late_worker_lines", late, {"result": "Pass", "steps_completed": 2}, exit_code=0)
early_bar = healthy(total=1, noise=False)
i = next(k for k, line in enumerate(early_bar) if "step:1 -" in line)
early_bar.insert(i, f"{TR} \rTraining Progress: 100%|##########| 1/1 [00:56<00:00, 56.1s/it]"
                    "\rTraining Progress: 100%|##########| 1/1 [00:56<00:00, 56.1s/it]")
case("pass_bar_before_step_twice", early_bar, {"result": "Pass", "steps_completed": 1}, exit_code=0)
val = header(steps=3) + trace(steps=3) + ray_up(total=3) + model_build() + model_built() + rollout_up()
val += [f"{TR} step:0 - val-core/openai/gsm8k/acc/mean@1:np.float64(0.0625) - val-aux/num_turns/min:np.int32(2)"]
val += steps(3)
case("pass_val_before_train", val, {"result": "Pass", "steps_completed": 3,
     "metric": [0, "val-core/openai/gsm8k/acc/mean@1", 0.0625]}, exit_code=0, level=5)
run_a = header(1) + trace(save_freq=1, resume="auto") + ray_up() + model_build() + model_built() + rollout_up()
run_a += [f"{TR} Checkpoint tracker file does not exist: /work/verl/checkpoints/verl-test/qwen2.5-0.5b-megatron-"
          "gsm8k-minimal/latest_checkpointed_iteration.txt", f"{TR} Training from scratch", bar(0, 1),
          f"{TR} local_global_step_folder: checkpoints/verl-test/qwen2.5-0.5b-megatron-gsm8k-minimal/global_step_1",
          f"{WD} Saving checkpoint to checkpoints/verl-test/qwen2.5-0.5b-megatron-gsm8k-minimal/global_step_1/actor",
          f"{WD} Checkpoint save completed for checkpoints/verl-test/qwen2.5-0.5b-megatron-gsm8k-minimal/"
          "global_step_1/actor", step_line(1), bar(1, 1)]
case("pass_level1_run_a_save", run_a, {"result": "Pass", "fresh_start": True, "checkpoints_saved": 1}, exit_code=0,
     level=1)
ck = "checkpoints/verl-test/qwen2.5-0.5b-megatron-gsm8k-minimal"
run_b = header(1, 2) + trace(steps=2, save_freq=1, resume="auto") + ray_up(total=2) + model_build() + model_built()
run_b += rollout_up() + [
    f"{TR} Found checkpoint: /work/verl/{ck}/global_step_1",
    f"{TR} Resuming from /work/verl/{ck}/global_step_1, setting global step to 1",
    f"{WD} Loaded HF model checkpoint from /work/verl/{ck}/global_step_1/actor/huggingface with bridge",
    f"{WD} Loaded optimizer checkpoint from /work/verl/{ck}/global_step_1/actor/optimizer",
    bar(1, 2), f"{WD} Saving checkpoint to {ck}/global_step_2/actor", step_line(2), bar(2, 2)]
case("pass_level1_run_b_resume", run_b, {"result": "Pass", "steps_completed": 2,
     "resumed_from": "global_step_1", "checkpoints_saved": 1}, exit_code=0, level=1)
run_b_old = [line for line in run_b if "Resuming from" not in line and "Found checkpoint" not in line]
k = run_b_old.index(bar(1, 2))
run_b_old[k:k] = [f"{TR} Load from checkpoint folder: /work/verl/{ck}/global_step_1", f"{TR} Setting global step to 1"]
case("pass_level1_old_resume_format", run_b_old, {"result": "Pass", "resumed_from": "global_step_1"}, exit_code=0,
     level=1)
no_steps = [line for line in healthy() if "TOTAL_TRAIN_STEPS" not in line and "Total training steps" not in line]
no_steps = [line.replace("trainer.total_training_steps=1 ", "") for line in no_steps]
case("pass_steps_unknown", no_steps, {"result": "Pass", "steps_expected": None,
     "limitation": "expected steps unknown"})
case("pass_steps_given_overrides_log", healthy(total=1), {"result": "Fail", "steps_expected": 3,
     "steps_completed": 1}, exit_code=0, steps=3)
eager = healthy(extra=" actor_rollout_ref.rollout.enforce_eager=True reward.reward_model.enable=False")
case("pass_limitations_eager_no_rm", eager, {"result": "Pass", "limitation": "enforce_eager"}, exit_code=0)

# ---- blocked -------------------------------------------------------------------------------------------------
case("blocked_energon", during_build + [
    f"{WD} Traceback (most recent call last):",
    f'{WD}   File "{BRIDGE}/training/config.py", line 30, in <module>',
    f"{WD}     from megatron.energon import WorkerConfig",
    f"{WD} ModuleNotFoundError: No module named 'megatron.energon'"] + driver_failure(
    "actor_rollout_init_model", "ModuleNotFoundError", "No module named 'megatron.energon'",
    inner_frames=frames(f"{BRIDGE}/models/conversion/auto_bridge.py", f"{BRIDGE}/training/config.py")),
    {"result": "Blocked", "category": "env-dependency", "phase": "model-build",
     "first_error": "megatron.energon"}, exit_code=1)
case("blocked_apex_fusion", during_build + driver_failure(
    "actor_rollout_init_model", "RuntimeError", "ColumnParallelLinear was called with gradient_accumulation_fusion "
    "set to True but the custom CUDA extension fused_weight_gradient_mlp_cuda module is not found. To use "
    "gradient_accumulation_fusion you must install APEX with --cpp_ext and --cuda_ext.",
    inner_frames=frames("/work/Megatron-Bridge/3rdparty/Megatron-LM/megatron/core/tensor_parallel/layers.py")),
    {"result": "Blocked", "category": "env-dependency", "first_error": "fused_weight_gradient_mlp_cuda",
     "hint": "gradient_accumulation_fusion=False"}, exit_code=1)
case("blocked_worker_bridge_import", before_model + [
    f"{WD} Megatron-Bridge package not found, falling back",
    "(raylet) [2026-08-14 12:00:40,001 E 1999 2001] worker_pool.cc:581: Some workers of the worker process(2288) "
    "have not registered within the timeout."] + driver_failure(
    "actor_rollout_init_model", "ModuleNotFoundError", "No module named 'megatron.bridge'",
    inner_frames=frames(f"{VERL}/models/mcore/registry.py")),
    {"result": "Blocked", "category": "env-ray-import", "hint": "runtime_env"}, exit_code=1)
case("blocked_rocr_visible_devices", header() + trace() + ray_up()[:3] + [
    f"{WD} Exception raised in creation task: The actor died because of an error raised in its creation task, "
    "ray::WorkerDict.__init__() (pid=2288, ip=10.0.0.4, actor_id=a1b2, repr=<WorkerDict object at 0x7f>)",
    f"{WD} ValueError: Please don't set ROCR_VISIBLE_DEVICES when HIP/CUDA_VISIBLE_DEVICES is set."]
    + driver_failure("__init__", "ValueError", "Please don't set ROCR_VISIBLE_DEVICES when HIP/CUDA_VISIBLE_DEVICES "
                     "is set."), {"result": "Blocked", "category": "env-visible-devices", "phase": "ray-up"},
    exit_code=1)
case("blocked_no_gpus", header() + trace() + ray_up()[:3] + driver_failure(
    "", "ValueError", "Total available GPUs 0 is less than total desired GPUs 1"),
    {"result": "Blocked", "category": "env-no-gpu"}, exit_code=1)
case("blocked_disk_full_download", header() + trace()[:5] + [
    "Downloading model.safetensors:  43%|####3     | 421M/988M [00:12<00:16, 34.5MB/s]",
    "Traceback (most recent call last):",
    '  File "/usr/local/lib/python3.12/dist-packages/huggingface_hub/file_download.py", line 1010, in _download',
    "OSError: [Errno 28] No space left on device"], {"result": "Blocked", "category": "env-disk",
                                                     "hint": "HF_HOME"}, exit_code=1)
case("blocked_data_missing", before_model[:-2] + driver_failure(
    "", "FileNotFoundError", "[Errno 2] No such file or directory: '/data/gsm8k/train.parquet'",
    inner_frames=frames(f"{VERL}/utils/dataset/rl_dataset.py")), {"result": "Blocked", "category": "data"},
    exit_code=1)
case("blocked_reward_model_missing", built[:-2] + driver_failure(
    "rm_init_model", "OSError", "Incorrect path_or_model_id: '/root/models/Skywork/Skywork-Reward-V2-Llama-3.2-1B'. "
    "Please provide either the path to a local folder or the repo_id of a model on the Hub."),
    {"result": "Blocked", "category": "reward-model"}, exit_code=1)
case("blocked_hydra_release_mismatch", header() + trace() + [
    "Could not override 'actor_rollout_ref.actor.megatron.grad_offload'.",
    "To append to your config use +actor_rollout_ref.actor.megatron.grad_offload=False",
    "Key 'grad_offload' is not in struct",
    "    full_key: actor_rollout_ref.actor.megatron.grad_offload",
    "    object_type=dict", "",
    "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace."],
    {"result": "Blocked", "category": "config", "phase": "launch", "hint": "verl.__file__"}, exit_code=1)
case("blocked_modelopt_missing", during_build + driver_failure(
    "actor_rollout_init_model", "ModuleNotFoundError", "No module named 'modelopt'",
    inner_frames=frames(f"{BRIDGE}/models/conversion/auto_bridge.py")),
    {"result": "Blocked", "category": "env-dependency", "hint": "install-modelopt"}, exit_code=1)
case("blocked_flash_attn_missing", during_build + driver_failure(
    "actor_rollout_init_model", "ModuleNotFoundError", "No module named 'flash_attn'"),
    {"result": "Blocked", "category": "env-dependency", "hint": "attention_backend=fused"}, exit_code=1)
site = healthy()
site[site.index(f"{WD} Enabling LORA with rank=4, alpha=32, dropout=0.0")] += (
    "  [/usr/local/lib/python3.12/site-packages/megatron/bridge/peft/lora.py:88]")
case("blocked_wrong_bridge_site_packages", site, {"result": "Pass", "category": "success", "level_result": "Blocked",
     "level_category": "wrong-bridge"}, exit_code=0, level=0)
case("blocked_vanilla_true", healthy(vanilla="True"), {"result": "Pass", "category": "success", "level_result": "Blocked",
     "level_category": "wrong-bridge", "vanilla_mbridge": "True"}, exit_code=0, level=0)
case("fail_vllm_before_actor", before_model + [
    f"{VS} (EngineCore pid=2355) ERROR 08-14 12:01:12 [core.py:700] EngineCore failed to start.",
    f"{VS} (EngineCore pid=2355) ERROR 08-14 12:01:12 [core.py:700] Traceback (most recent call last):",
    f"{VS} (EngineCore pid=2355) ERROR 08-14 12:01:12 [core.py:700] ValueError: The model's max seq len (4096) is "
    "larger than the maximum number of tokens that can be stored in KV cache"] + driver_failure(
    "", "RuntimeError", "Engine core initialization failed. See root cause above. Failed core proc(s): {}",
    task="vLLMHttpServer.launch_server"),
    {"result": "Fail", "category": "rollout"}, exit_code=1)
case("blocked_ray_connect", header() + trace() + [
    "Traceback (most recent call last):",
    '  File "/usr/local/lib/python3.12/dist-packages/ray/_private/worker.py", line 1700, in init',
    "ConnectionError: Could not find any running Ray instance. Please specify the one to connect to by setting "
    "`--address` flag or `RAY_ADDRESS` environment variable."], {"result": "Blocked", "category": "env-ray-import"},
    exit_code=1)
# after a training step the provider was exercised: an interruption then is no Blocked (SPEC; issue 25.3)
case("fail_interrupted_after_step1", built3 + steps(3)[:3], {"result": "Fail", "category": "interrupted"},
     termination="interrupted", steps=3)
case("blocked_keyboard_interrupt_in_log", built + ["^CTraceback (most recent call last):",
                                                   f'  File "{VERL}/trainer/main_ppo.py", line 42, in main',
                                                   "KeyboardInterrupt"],
     {"result": "Blocked", "category": "interrupted"}, exit_code=130)
case("blocked_timeout_before_model", before_model + [
    f"{TR} Transfer queue: starting 7 storage actors and 1 controller",
    "(autoscaler +12s) Warning: The following resource request cannot be scheduled right now: {'CPU': 1.0}."],
     {"result": "Blocked", "category": "env-no-gpu", "phase": "ray-up"}, termination="timeout")

# ---- fail ----------------------------------------------------------------------------------------------------
case("fail_provider_parallel_sizes", during_build + driver_failure(
    "actor_rollout_init_model", "AssertionError", "tensor_model_parallel_size (2) of the provider does not match "
    "the initialised mpu world (1)", inner_frames=frames(f"{BRIDGE}/models/gpt_provider.py")),
    {"result": "Fail", "category": "provider", "phase": "model-build", "hint": "mpu"}, exit_code=1)
case("fail_provider_attribute_error", during_build + driver_failure(
    "actor_rollout_init_model", "AttributeError", "'Qwen3NextModelProvider' object has no attribute "
    "'moe_router_dtype'", inner_frames=frames(f"{BRIDGE}/models/qwen/qwen3_next_provider.py")),
    {"result": "Fail", "category": "provider", "phase": "model-build",
     "first_error": "AttributeError: 'Qwen3NextModelProvider'"}, exit_code=1)
case("fail_lora_target_modules", during_build + driver_failure(
    "actor_rollout_init_model", "ValueError", "Target modules ['linear_qkv', 'linear_fc3'] not found in the base "
    "model", inner_frames=frames(f"{BRIDGE}/peft/lora.py")),
    {"result": "Fail", "category": "provider", "hint": "LoRA target module"}, exit_code=1)
save_fail = header(steps=1) + trace(save_freq=1) + ray_up() + model_build() + model_built() + rollout_up()
save_fail += [bar(0, 1), f"{WD} Saving checkpoint to {ck}/global_step_1/actor"] + driver_failure(
    "actor_rollout_save_checkpoint", "RuntimeError", "Error writing to /work/verl/checkpoints/.../__0_0.distcp: "
    "CheckpointingException: sharded tensor metadata mismatch",
    inner_frames=frames("/work/Megatron-Bridge/3rdparty/Megatron-LM/megatron/core/dist_checkpointing/serialization.py"))
case("fail_checkpoint_save", save_fail, {"result": "Fail", "category": "checkpoint", "phase": "checkpoint",
     "hint": "SAVE_FREQ=-1"}, exit_code=1, level=1)
load_fail = header(1, 2) + trace(steps=2, save_freq=1, resume="auto") + ray_up(total=2) + model_build()
load_fail += model_built() + rollout_up() + [f"{TR} Found checkpoint: /work/verl/{ck}/global_step_1"]
load_fail += driver_failure("actor_rollout_load_checkpoint", "megatron.core.dist_checkpointing.core."
                            "CheckpointingException", "Object shard /work/verl/.../__1_0.distcp not found")
case("fail_checkpoint_load", load_fail, {"result": "Fail", "category": "checkpoint"}, exit_code=1, level=1)
nan = header(steps=2) + trace(steps=2) + ray_up(total=2) + model_build() + model_built() + rollout_up()
nan += [bar(0, 2), step_line(1), step_line(2, pg="np.float64(nan)", grad="inf"), bar(2, 2)]
case("fail_nan_metrics", nan, {"result": "Fail", "category": "nan-metrics", "first_error": "step 2"}, exit_code=0,
     level=5)
case("fail_oom_update_actor", built3 + steps(3)[:4] + [
    f"{WD} Traceback (most recent call last):",
    f"{WD} torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
    "139.80 GiB of which 1.02 GiB is free."] + driver_failure(
    "actor_rollout_update_actor", "torch.OutOfMemoryError", "CUDA out of memory. Tried to allocate 2.00 GiB."),
    {"result": "Fail", "category": "oom", "phase": "training", "steps_completed": 1}, exit_code=1)
case("fail_actor_died_ray_oom", built3 + steps(3)[:4] + [
    "(raylet) [2026-08-14 12:03:00,001 E 1999 2001] (raylet) node_manager.cc:3218: 1 Workers (tasks / actors) killed "
    "due to memory pressure (OOM)",
    f"{WD} ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory."] + [
    "Traceback (most recent call last):", f'  File "{VERL}/trainer/main_ppo.py", line 42, in main',
    "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.",
    "\tclass_name: WorkerDict", "\tactor_id: a1b2c3", "\tpid: 2288", "\tWorker exit type: SYSTEM_ERROR",
    "\tWorker exit detail: Worker unexpectedly exits with a connection error code 2. End of file."],
    {"result": "Fail", "category": "oom", "first_error": "low on memory"}, exit_code=1)
case("fail_nccl_watchdog", built3 + steps(3)[:4] + [
    f"{WD} [rank0]:[E814 12:20:01.123 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=1, Timeout(ms)=600000) ran for 600012 milliseconds "
    "before timing out.",
    f"{WD} terminate called after throwing an instance of 'c10::DistBackendError'",
    "(raylet) A worker died or was killed while executing a task by an unexpected system error."] + [
    "Traceback (most recent call last):", "ray.exceptions.ActorDiedError: The actor died unexpectedly before "
    "finishing this task.", "\tWorker exit type: SYSTEM_ERROR"],
    {"result": "Fail", "category": "hang", "phase": "training"}, exit_code=1)
case("fail_rollout_during_training", built3 + steps(3)[:4] + driver_failure(
    "", "vllm.v1.engine.exceptions.EngineDeadError", "EngineCore encountered an issue. See stack trace (above) "
    "for the root cause.", task="AgentLoopWorkerTQ.generate_sequences"),
    {"result": "Fail", "category": "rollout", "phase": "training"}, exit_code=1)  # after step 1: training
case("fail_unknown_in_training", built3 + steps(3)[:4] + driver_failure(
    "actor_rollout_update_actor", "RuntimeError", "shape '[8, -1, 896]' is invalid for input of size 1234",
    inner_frames=frames(f"{VERL}/workers/actor/megatron_actor.py")),
    {"result": "Fail", "category": "unknown", "phase": "training", "steps_completed": 1,
     "first_error": "RuntimeError: shape"}, exit_code=1, steps=3)
case("fail_segfault_training", built3 + steps(2)[:3] + [
    f"{WD} *** SIGSEGV received at time=1755172900 on cpu 12 ***",
    f"{WD} Fatal Python error: Segmentation fault",
    "(raylet) A worker died or was killed while executing a task by an unexpected system error."],
    {"result": "Fail", "category": "actor-died", "phase": "training"}, exit_code=1)
case("fail_exit_nonzero_after_steps", healthy(noise=False) + driver_failure(
    "", "RuntimeError", "Failed to upload artifacts: connection reset", hydra=True, task="TaskRunner.run"),
    {"result": "Fail", "steps_completed": 1, "phase": "shutdown"}, exit_code=1)
case("fail_exit_nonzero_no_error", healthy(noise=False), {"result": "Fail", "category": "unknown"}, exit_code=137)
no_trace = healthy(cmdline=False, vars_=False)
no_trace = [line for line in no_trace if "vanilla_mbridge" not in line]
case("fail_vanilla_not_seen", no_trace, {"result": "Pass", "category": "success", "vanilla_mbridge": None,
     "level_result": "Fail", "level_category": "unknown",
     "criterion": ["VANILLA_MBRIDGE=False in the wrapper's output", "not shown"]}, exit_code=0, steps=1, level=0)
case("fail_truncated_during_build", during_build, {"result": "Fail", "category": "unknown",
     "phase": "model-build"})
case("fail_exit_zero_incomplete", built3 + steps(2)[:3], {"result": "Fail", "category": "unknown",
     "steps_completed": 1}, exit_code=0, steps=2)
case("fail_timeout_in_training", built3 + steps(3)[:3], {"result": "Fail", "category": "hang",
     "steps_completed": 1}, termination="timeout")
case("fail_nccl_backend_error", during_build + driver_failure(
    "actor_rollout_init_model", "torch.distributed.DistBackendError", "NCCL error in: "
    "../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, unhandled system error (run with NCCL_DEBUG=INFO for details)"),
    {"result": "Fail", "category": "nccl"}, exit_code=1)
case("fail_bridge_submodule_missing", during_build + driver_failure(
    "actor_rollout_init_model", "ModuleNotFoundError", "No module named 'megatron.bridge.models.qwen3_next'"),
    {"result": "Fail", "category": "provider"}, exit_code=1)


# The first error line every non-Pass case must report (issue 20.3): a literal part of the deciding line, or what the
# engine must say when the log shows no error line.
FIRST_ERRORS = {
    "blocked_data_missing": "No such file or directory: '/data/gsm8k/train.parquet'",
    "blocked_disk_full_download": "No space left on device",
    "blocked_flash_attn_missing": "No module named 'flash_attn'",
    "blocked_hydra_release_mismatch": "Could not override 'actor_rollout_ref.actor.megatron.grad_offload'",
    "fail_interrupted_after_step1": "interrupted by the launcher; it ends after step 1 of 3",
    "blocked_keyboard_interrupt_in_log": "KeyboardInterrupt",
    "blocked_modelopt_missing": "No module named 'modelopt'",
    "blocked_no_gpus": "Total available GPUs 0 is less than total desired GPUs 1",
    "blocked_ray_connect": "Could not find any running Ray instance",
    "blocked_reward_model_missing": "Incorrect path_or_model_id: '/root/models/Skywork/Skywork-Reward-V2-Llama-3.2-1B'",
    "blocked_rocr_visible_devices": "Please don't set ROCR_VISIBLE_DEVICES",
    "blocked_timeout_before_model": "The following resource request cannot be scheduled right now",
    "blocked_worker_bridge_import": "Megatron-Bridge package not found",
    "fail_bridge_submodule_missing": "No module named 'megatron.bridge.models.qwen3_next'",
    "fail_checkpoint_load": "CheckpointingException: Object shard",
    "fail_checkpoint_save": "sharded tensor metadata mismatch",
    "fail_exit_nonzero_after_steps": "RuntimeError: Failed to upload artifacts",
    "fail_exit_nonzero_no_error": "the wrapper exited 137 after completing the steps",
    "fail_exit_zero_incomplete": "no exception line in the log; it ends after step 1 of 2",
    "fail_lora_target_modules": "Target modules ['linear_qkv', 'linear_fc3'] not found",
    "fail_nccl_watchdog": "Watchdog caught collective operation timeout",
    "fail_nccl_backend_error": "DistBackendError: NCCL error in",
    "fail_oom_update_actor": "torch.OutOfMemoryError: CUDA out of memory",
    "fail_provider_parallel_sizes": "tensor_model_parallel_size (2) of the provider does not match",
    "fail_rollout_during_training": "EngineDeadError: EngineCore encountered an issue",
    "fail_segfault_training": "SIGSEGV received at time=1755172900",
    "fail_timeout_in_training": "no output before the stall timeout; it ends after step 1 of 3",
    "fail_truncated_during_build": "no exception line in the log; it ends before the first training step",
    "fail_vllm_before_actor": "EngineCore failed to start",
    "pass_steps_given_overrides_log": "no exception line in the log; it ends after step 1 of 3",
}

# The triage hint a case must show when it is the pattern's own, not its category's (issue 20.3: asserted exactly).
HINTS = {
    "blocked_energon": "install megatron-energon",
    "fail_bridge_submodule_missing": "The Bridge checkout lacks a module",
    "fail_exit_nonzero_no_error": "the wrapper failed at the end",
    "fail_exit_zero_incomplete": "The log does not show enough to name a cause",
    "fail_truncated_during_build": "The log does not show enough to name a cause",
    "pass_steps_given_overrides_log": "The log does not show enough to name a cause",
}


def main() -> None:
    expected = {}
    for spec in CASES:
        path = HERE / f"{spec['name']}.log"
        path.write_text("\n".join(spec["lines"]) + "\n", encoding="utf-8")
        expect = dict(spec["expect"])
        if spec["name"] in FIRST_ERRORS:
            expect.setdefault("first_error", FIRST_ERRORS[spec["name"]])
        if spec["name"] in HINTS:
            expect.setdefault("hint", HINTS[spec["name"]])
        expected[path.name] = {"run": spec["run"], "expect": expect}
    (HERE / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"{len(CASES)} logs written to {HERE}")


if __name__ == "__main__":
    main()
