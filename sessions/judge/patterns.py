"""The one table of log patterns the verdict engine knows: regex -> kind, category, result, hint.

Each pattern names a literal `needle` that every line it can match contains; the streaming reader hands the judge
only the lines that contain one of SCAN_NEEDLES (every line of the file is searched for them), and a test checks
that every pattern is reachable through them. Regexes are searched in the normalised text (no ANSI, no Ray
prefix, one `\\r` segment).

Kinds:
  ignore     - not evidence and not an error (optional-module warnings, Python warnings)
  noise      - shutdown chatter; after the run completed it is residual noise, never failing
  marker     - the run reached `phase`
  fact       - a fact handler in verdict.py (`fact` names it)
  limitation - the run used a setting the report must list as a limitation
  error      - a named cause: `category`; `result` "blocked" only for positive environment evidence (SPEC), else
               "fail"
  exception  - a generic exception line (its category comes from the traceback's frames, the Ray method, the phase)
  traceback  - the start of a Python traceback
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sessions.judge.frames import CALL_NEEDLES

# Phases in the order a healthy run passes them (sessions.verdict.PHASES holds the same names).
PHASE_ORDER = ("launch", "ray-up", "model-build", "model-built", "rollout-up", "training", "checkpoint", "shutdown")

# The streaming reader's prefilter: every line of the file holding one of these is parsed, no other line is.
# Short, broad needles ("rror", "xception") keep the list small: its length is what the scan costs.
SCAN_NEEDLES = (
    "step", "rror", "ERROR", "xception", "Traceback", "illed", "File \"", "heckpoint", "emory", "imeout", "imed out",
    "Watchdog", "Segmentation", "core dumped", "SIGABRT", "SIGSEGV", "Cannot load symbol", "ANILLA_MBRIDGE",
    "anilla_mbridge", "TRAIN_STEPS", "training steps", "arameters", "percentage", "from scratch", "megatron/bridge",
    "mbridge", "Bridge", "Final validation", "Could not override", "not in struct", "No module named",
    "VISIBLE_DEVICES", "available GPUs", "No space", "KeyboardInterrupt", "NaN", "LORA", "LLM engine",
    "cannot be scheduled", "USE_DUMMY_MODEL", "enforce_eager", "reward_model.enable", "global_profiler",
    "gradient_accumulation_fusion", "wandb:", "dot product attention", "GCS", "Ray instance", "Ray has not",
    "PEFT", "ProcessGroupNCCL", "wrapper exit code", "state_dict", "attention_backend", "-m verl.", "total_epochs",
    "train dataloader", "primary config", "Epoch ", "\", line ", "Capturing CUDA graph", "Capture cuda graph",
) + CALL_NEEDLES  # a frame's statement calling a function of an area of verl's loop (frames.py)

# tqdm bars are frequent: of each scanned chunk only the last one is read; a bar at 100% is read wherever it is.
LAST_ONLY_NEEDLE = "Training Progress"
COMPLETE_BAR_NEEDLE = "Progress: 100%"

H_RAY_IMPORT = (
    "Ray workers do not inherit the shell PYTHONPATH: pass "
    "++ray_kwargs.ray_init.runtime_env.env_vars.PYTHONPATH=$PYTHONPATH to the wrapper (and check a worker import)."
)
H_RELEASE = (
    "The wrapper script and the verl Python package come from different releases (Hydra rejects a key): "
    "put $VERL_REPO on PYTHONPATH and check that verl.__file__ is under it."
)
H_APEX = (
    "Apex's fused_weight_gradient_mlp_cuda is missing: add the three "
    "++{actor_rollout_ref.actor,actor_rollout_ref.ref,critic}.megatron.override_transformer_config."
    "gradient_accumulation_fusion=False overrides (a Limitation)."
)
H_PARALLEL = (
    "Check that the Bridge provider is finalized with the same parallel sizes (TP/PP/CP/EP) that verl "
    "initialised through Megatron mpu."
)
H_LORA = (
    "Check the LoRA target module names and that the provider path uses the non-vanilla Bridge PEFT "
    "helpers verl expects."
)
H_CHECKPOINT = "Rerun without save/resume (SAVE_FREQ=-1) to separate model construction from checkpoint behaviour."
H_ATTENTION = (
    "No attention backend for Transformer Engine (flash-attn is not installed and verl asks for "
    "attention_backend=flash): add ++actor_rollout_ref.actor.megatron.override_transformer_config."
    "attention_backend=fused (and the same for ref and critic), a Limitation, or install flash-attn."
)
H_DISK = (
    "No space left: move HF_HOME, HF_HUB_CACHE and MODEL_PATH to a larger scratch path and rerun with an "
    "explicit local MODEL_PATH."
)
H_DEVICE_INIT = (
    "The process could not initialise its accelerator (an exception in torch's CUDA/NPU lazy init): no driver, no "
    "device visible to it (CUDA_VISIBLE_DEVICES, the container's device plugin), or a torch build without CUDA. "
    "An environment fault, not a Bridge provider problem."
)

H_WEIGHT_SYNC = (
    "The actor->rollout weight sync failed after both sides were built: the Bridge's weight/adapter export under "
    "this level's wrapping (e.g. DTensors from Megatron-FSDP) reached verl's transfer to the rollout engine in a form "
    "it cannot send. Compare with Level 0 on the same model (plain DDP): if that syncs, the export under this "
    "wrapping is the boundary to report."
)

# Triage hint per category (SPEC "The verdict", procedure "Triage de failure").
CATEGORY_HINTS = {
    "success": None,
    "provider": H_PARALLEL + " If LoRA fails: " + H_LORA[0].lower() + H_LORA[1:],
    "checkpoint": H_CHECKPOINT,
    "weight-sync": H_WEIGHT_SYNC,
    "nan-metrics": (
        "Non-finite loss/reward/KL/entropy/grad-norm/log-prob metrics: check the provider's dtype and "
        "initialisation, the LoRA wiring, and the learning rate; compare against a known-good baseline."
    ),
    "oom": (
        "Out of memory: use a smaller model or micro batch, lower the rollout gpu_memory_utilization, or "
        "enable offload; with a reward model on the same GPUs, try reward.reward_model.enable=False."
    ),
    "nccl": "NCCL/collective failure: check the GPU interconnect, NCCL env vars and parallel sizes vs GPU count.",
    "rollout": (
        "The rollout engine (vLLM) failed; before the actor is built this is a verl rollout-engine problem "
        "rather than a Bridge provider problem: report the boundary clearly."
    ),
    "data": "The GSM8K parquet files are missing or invalid: run `invoke prep-data` and set TRAIN_FILES/VAL_FILES.",
    "reward-model": (
        "The reward model is missing: set RM_MODEL_PATH to a local reward model, or disable it with "
        "reward.reward_model.enable=False (a Limitation)."
    ),
    "env-ray-import": H_RAY_IMPORT,
    "env-visible-devices": (
        "ROCR_VISIBLE_DEVICES is set next to CUDA_VISIBLE_DEVICES: unset it in the launcher/container "
        "(not a Bridge provider failure)."
    ),
    "env-no-gpu": "verl sees fewer GPUs than it needs: set NUM_GPUS to what is there and TP*PP*CP to divide it.",
    "env-disk": H_DISK,
    "env-dependency": (
        "A package or compiled extension is missing in the run's Python: install it (e.g. `invoke "
        "install-modelopt`) or use the documented override, then rerun."
    ),
    "wrong-bridge": (
        "The log shows another Bridge than the local checkout (or VANILLA_MBRIDGE=True): stop; no later "
        "failure or pass is evidence for the local Bridge change. Fix PYTHONPATH and rerun."
    ),
    "actor-died": (
        "A Ray actor (worker process) died: read the raylet's cause (memory / OOM killer / node lost) and the "
        "worker's last lines; host memory limits (K8s pod, cgroup) are the usual cause."
    ),
    "hang": (
        "A collective or rendezvous timed out (NCCL watchdog, TCPStore) or the run stalled: check that every rank "
        "reached the same collective, the interconnect, and parallel sizes vs GPU count. A Ray cluster with fewer "
        "than ~10 CPUs never schedules verl's workers (its transfer queue takes 8)."
    ),
    "config": (
        "The configuration was rejected: Hydra/omegaconf names the key. A key unknown to Hydra usually means the "
        "wrapper script and the verl package come from different releases: put $VERL_REPO on PYTHONPATH and check "
        "that verl.__file__ is under it."
    ),
    "interrupted": "The run was interrupted (SIGINT/SIGTERM) before it ended: not evidence either way; rerun it.",
    "unknown": "Read the first error line and the log around it.",
}

FOLLOW_UPS = {
    "success": "none",
    "provider": "fix the provider, then rerun this level",
    "checkpoint": "rerun with SAVE_FREQ=-1 to separate model build from checkpoint behaviour",
    "weight-sync": "rerun Level 0 on the same model; report the Bridge export / verl weight-transfer boundary",
    "nan-metrics": "inspect the per-step metrics; rerun level 5 against a known-good baseline",
    "oom": "rerun with a smaller model/micro batch or more GPU memory",
    "nccl": "check the node's NCCL setup and rerun",
    "rollout": "rerun with a known-good rollout engine image; report the rollout boundary",
    "data": "run `invoke prep-data` and rerun",
    "reward-model": "download the reward model (`invoke download-model`) or rerun with --no-reward-model",
    "env-ray-import": "pass the runtime_env PYTHONPATH override and rerun",
    "env-visible-devices": "unset ROCR_VISIBLE_DEVICES for the run and rerun",
    "env-no-gpu": "rerun on a host with enough GPUs or with NUM_GPUS matching the parallel sizes",
    "env-disk": "move HF_HOME/HF_HUB_CACHE/MODEL_PATH to a larger disk and rerun",
    "env-dependency": "install the missing package in the run's Python (environment fix) and rerun",
    "wrong-bridge": "fix PYTHONPATH so verl imports $BRIDGE_REPO/src, then rerun",
    "actor-died": "fix the worker's cause (memory limits, node) and rerun",
    "hang": "rerun with NCCL_DEBUG=INFO (and more Ray CPUs if it stalled before training); look at the last lines",
    "config": "fix the rejected key (same release for wrapper and verl) and rerun",
    "interrupted": "rerun the level to completion",
    "unknown": "read the log around the first error and rerun",
}


@dataclass(frozen=True)
class Pattern:
    name: str
    needle: str  # literal every matching line contains (cheap `in` test before the regex)
    regex: str
    kind: str  # see module docstring
    category: str | None = None
    result: str | None = None  # errors: "blocked" | "fail" | "by-phase"
    phase: str | None = None  # markers: phase reached; errors: phase the error implies (None = from the log)
    hint: str | None = None  # overrides the category hint
    fact: str | None = None  # fact handler name
    limitation: str | None = None
    specific: bool = True  # errors: a named cause (beats a generic exception line when choosing the cause)
    covered_by: str | None = None  # scan needle every matching line holds when `needle` holds none (see tests)
    any_of: tuple[str, ...] = ()  # literals one of which every match holds, when no single `needle` does
    # literals one of which every match also holds (its slow tail: `.*(?:failed|mismatch)`): checked with `in`
    # before the regex runs (in the casefolded text for a `(?i)` regex); a line holding none cannot match
    also: tuple[str, ...] = ()


def _p(*args, **kwargs) -> Pattern:
    return Pattern(*args, **kwargs)


# Order matters inside a kind: the first error pattern that matches a line names its cause.
PATTERNS: tuple[Pattern, ...] = (
    # -- lines that look like errors but are not (healthy runs print them) --------------------------------------
    _p("optional-engine", "not available", r"engine is not available|is not available, (?:skip|fall)", "ignore"),
    # Ray's "Warning: The following resource request cannot be scheduled" is evidence (ray-unschedulable)
    _p("py-warning", "arn", r"^(?:\S+:\d+: )?\w*Warning: (?!resource_tracker|The following resource request)|"
       r"warnings\.warn\(", "ignore"),
    _p("log-warning", "W", r"^(?:\[?W\d{4} |WARNING[ :\]]|\[WARNING\]|\S+ WARNING |\(\w+\) WARNING |"
       r"\[[\d\- :,]+\] WARNING)", "ignore"),
    # an INFO-level logger line (Python logging, vLLM, glog `I0901 ...`) reports, it does not fail: no error evidence
    _p("log-info", "INFO", r"^(?:INFO[ :]|\[I\d{4} |\[INFO\]|\S+ INFO |\(\w+\) INFO |\[[\d\- :,]+\] INFO|"
       r"\d{4}-\d\d-\d\d[ T][\d:,.]+ INFO )", "ignore", any_of=("INFO", "[I")),
    _p("failed-import-warning", "Failed to import", r"Failed to import from", "ignore"),
    # -- shutdown chatter: residual noise after the run completed -----------------------------------------------
    _p("resource-tracker", "resource_tracker", r"resource_tracker", "noise"),
    _p("atexit", "Exception ignored", r"Exception ignored in", "noise"),
    _p("dataloader-killed", "DataLoader worker", r"DataLoader worker \(pid[ s]", "noise"),
    _p("ray-shutdown", "hutdown", r"[Ss]hutdown|shutting down|Shutting down", "noise"),
    _p("sigterm", "SIGTERM", r"SIGTERM", "noise"),
    # -- facts -----------------------------------------------------------------------------------------------
    # this tool's own footer in a level's log: the wrapper's exit code, when `judge` is not told it
    _p("tool-exit", "wrapper exit code", r"^\[verl-e2e\] wrapper exit code (-?\d+)(?:, (interrupted|timeout))?", "fact", fact="tool_exit"),
    _p("vanilla-trace", "VANILLA_MBRIDGE=", r"^\++\s+(?:export\s+)?(?:VALUE_)?VANILLA_MBRIDGE=(\S+)", "fact",
       fact="vanilla", covered_by="ANILLA_MBRIDGE"),
    _p("vanilla-override", "vanilla_mbridge", r"vanilla_mbridge['\"]?\s*[=:]\s*['\"]?(\w+)", "fact", fact="vanilla"),
    # a script's `set -x` trace of the verl command it runs (`+ python3 -m verl.trainer.main_ppo k=v ...`): the keys
    # it passed (a key Hydra rejects that the script passed: the script and verl are from different releases)
    _p("traced-command", "-m verl.", r"^\++ .*?-m verl\.", "fact", fact="traced_command"),
    _p("steps-printed", "Total training steps", r"Total training steps:?\s*(\d+)", "fact", fact="total_steps",
       covered_by="training steps"),
    _p("steps-override", "total_training_steps", r"trainer\.total_training_steps=(\d+)", "fact",
       fact="override_steps", covered_by="step"),
    # `total_training_steps` not after [\w.], as a lookbehind after the literal: the regex engine's literal-prefix
    # scan finds the candidates (a config dump line is long)
    _p("steps-config", "total_training_steps",
       r"total_training_steps(?<![\w.]total_training_steps)['\"]?\s*[:=]\s*(\d+)", "fact",
       fact="config_steps", covered_by="step"),
    # verl's own planned total when trainer.total_training_steps is unset: len(train_dataloader) * total_epochs
    # (RayPPOTrainer._create_dataloader prints the size; the epochs come from an override or the config dump)
    _p("dataloader-size", "Size of train dataloader", r"Size of train dataloader:\s*(\d+)", "fact",
       fact="dataloader_size"),
    _p("epochs-override", "total_epochs", r"trainer\.total_epochs=(\d+)", "fact", fact="epochs_override"),
    _p("epochs-config", "total_epochs", r"total_epochs(?<![\w.]total_epochs)['\"]?\s*[:=]\s*(\d+)", "fact",
       fact="epochs_config"),
    # verl's SFT trainers' bar: `Epoch E/N: P%|...| n/M` with M the steps of one epoch (tqdm total=steps_per_epoch,
    # desc f"Epoch {epoch + 1}/{total_epochs}"): M x N is the run's total when no explicit one is shown
    _p("epoch-bar", "Epoch ", r"Epoch (\d+)/(\d+):\s*\d+%\|[^|]*\|\s*\d+/(\d+)", "fact", fact="epoch_bar"),
    _p("steps-trace", "TOTAL_TRAIN_STEPS=", r"^\++\s+(?:export\s+)?TOTAL_TRAIN_STEPS=(\d+)", "fact",
       fact="trace_steps", covered_by="TRAIN_STEPS"),
    _p("adapter-header", "PEFT Adapter Information", r"PEFT Adapter Information", "fact", fact="adapter_header",
       phase="model-built"),
    _p("adapter-total", "Total parameters", r"Total parameters:\s*([\d,]+)", "fact", fact="adapter_total",
       covered_by="arameters"),
    _p("adapter-count", "Adapter parameters", r"Adapter parameters:\s*([\d,]+)", "fact", fact="adapter_count",
       covered_by="arameters"),
    _p("adapter-pct", "Trainable percentage", r"Trainable percentage:\s*([\d.eE+-]+)\s*%", "fact",
       fact="adapter_pct", covered_by="percentage"),
    # verl's trainer (`Saving checkpoint to`), its checkpoint managers (`Saving HF model checkpoint to`) and older
    # workers (`Saving actor checkpoint to`): the path names the step it saves (global_step_N: N steps trained)
    _p("ckpt-save", "heckpoint", r"[Ss]aving (?:[\w-]+ ){0,2}?checkpoint to:?\s*(\S+)", "fact", fact="save",
       phase="checkpoint", also=("checkpoint to",)),
    _p("ckpt-saved", "heckpoint", r"Checkpoint save completed", "fact", fact="save_done", phase="checkpoint"),
    _p("resume", "Resuming from", r"Resuming from:?\s*(\S*global_step_\d+)", "fact", fact="resume",
       phase="checkpoint", covered_by="step"),
    _p("resume-old", "Load from checkpoint folder", r"Load from checkpoint folder:?\s*(\S+)", "fact",
       fact="resume", phase="checkpoint", covered_by="heckpoint"),
    _p("resume-found", "Found checkpoint", r"Found checkpoint:?.*?(\S*global_step_\d+)", "fact",
       fact="resume_found", phase="checkpoint", covered_by="heckpoint"),
    _p("resume-step", "etting global step to", r"[Ss]etting global step to (\d+)", "fact", fact="resume_step",
       covered_by="step"),
    _p("fresh", "from scratch", r"Training from scratch", "fact", fact="fresh"),
    _p("fresh-tracker", "heckpoint tracker file does not exist",
       r"[Cc]heckpoint tracker file does not exist", "fact", fact="fresh", covered_by="heckpoint"),
    _p("bridge-path", "megatron/bridge", r"(/[^\s'\"():,]*?/megatron/bridge)\b", "fact", fact="bridge_path"),
    _p("progress-bar", "Training Progress", r"^Training Progress:\s*(\d+)%[^|]*\|[^|]*\|\s*(\d+)/(\d+)", "fact",
       fact="progress"),
    _p("final-validation", "Final validation", r"Final validation metrics", "fact", fact="final_validation"),
    _p("wandb-global-step", "wandb:", r"^wandb:\s+training/global_step\s+(\d+)\s*$", "fact", fact="wandb_step",
       covered_by="step"),
    # -- settings the report lists as limitations (seen in the traced command line) ---------------------------
    _p("lim-no-rm", "reward_model.enable=False", r"reward_model\.enable=False", "limitation",
       limitation="reward model disabled (rule reward): reward-model serving not tested",
       covered_by="reward_model.enable"),
    _p("lim-eager", "enforce_eager=True", r"enforce_eager=True", "limitation",
       limitation="actor_rollout_ref.rollout.enforce_eager=True: vLLM CUDA-graph capture not exercised",
       covered_by="enforce_eager"),
    _p("lim-profiler", "global_profiler.tool=null", r"global_profiler\.tool=null", "limitation",
       limitation="global_profiler.tool=null (no nsys)", covered_by="global_profiler"),
    _p("lim-fusion", "gradient_accumulation_fusion=False", r"gradient_accumulation_fusion=False", "limitation",
       limitation="gradient_accumulation_fusion=False overrides (Apex fused kernel not used)",
       covered_by="gradient_accumulation_fusion"),
    _p("lim-fused-attention", "attention_backend=fused", r"attention_backend=fused", "limitation",
       limitation="attention_backend=fused override (Transformer Engine fused attention): flash-attn path not "
                  "exercised",
       covered_by="attention_backend"),
    _p("lim-dummy", "USE_DUMMY_MODEL=", r"^\++\s+(?:export\s+)?USE_DUMMY_MODEL=True", "limitation",
       limitation="dummy model: validates construction and mechanics, not pretrained-weight compatibility",
       covered_by="USE_DUMMY_MODEL"),
    # -- phase markers ---------------------------------------------------------------------------------------
    _p("hydra-job", "Error executing job", r"Error executing job with overrides", "marker", phase=None,
       covered_by="rror"),
    _p("enable-lora", "Enabling LORA", r"Enabling LORA with rank", "marker", phase="model-build", covered_by="LORA"),
    _p("autobridge", "Bridge", r"AutoBridge|Megatron-Bridge provider|from_hf_pretrained", "marker",
       phase="model-build"),
    _p("hf-loaded", "Loaded HF model checkpoint", r"Loaded HF model checkpoint from .* with bridge", "marker",
       phase="model-built", covered_by="heckpoint"),
    _p("resume-load", "heckpoint", r"Loaded (?:HF model|optimizer) checkpoint from", "marker", phase="checkpoint"),
    # verl's checkpoint directory, `<default_local_dir>/global_step_N/actor|critic` (ray_trainer._save_checkpoint, which
    # first prints `local_global_step_folder: ...`; its resume reads the same): a line naming one (that print,
    # local_mkdir_safe's `Warning: Failed to acquire lock for .../global_step_1/actor: [Errno 30] ...`, a worker's
    # `Saving model to .../actor/...`) puts the run at a checkpoint
    _p("ckpt-dir", "global_step_", r"global_step_\d+/(?:actor|critic)\b|local_global_step_folder: ", "marker",
       phase="checkpoint", covered_by="step"),
    _p("megatron-params", "number of parameters on", r"number of parameters on \(tensor, pipeline\)", "marker",
       phase="model-built"),
    _p("vllm-engine-up", "LLM engine", r"Initializing an? (?:V1 )?LLM engine", "marker", phase="rollout-up"),
    # the rollout engine's start-up warm-up, printed once per engine before it serves: vLLM's CUDA-graph capture
    # bar (vLLM 0.24 under verl 0.9's HTTP server prints no 'Initializing ... LLM engine' line: seen on the H200)
    # and SGLang's 'Capture cuda graph begin.'
    _p("vllm-cuda-graphs", "Capturing CUDA graph", r"Capturing CUDA graphs? \(", "marker", phase="rollout-up"),
    _p("sglang-cuda-graph", "Capture cuda graph", r"Capture cuda graph begin", "marker", phase="rollout-up"),
    # -- named causes: positive environment evidence (Blocked) ---------------------------------------------------
    _p("worker-no-bridge", "No module named", r"No module named 'megatron\.bridge'", "error",
       category="env-ray-import", result="blocked"),
    # the driver runs verl: a Ray task that cannot import it is a worker without the driver's PYTHONPATH
    _p("worker-no-verl", "No module named", r"(?:RaySystemError|RayTaskError|RayActorError|ActorDiedError)\b.*"
       r"No module named 'verl[.']", "error", category="env-ray-import", result="blocked",
       any_of=("RaySystemError", "RayTaskError", "RayActorError", "ActorDiedError")),
    _p("bridge-not-found", "Megatron-Bridge package not found", r"Megatron-Bridge package not found", "error",
       category="env-ray-import", result="blocked", covered_by="Bridge"),
    _p("bridge-submodule", "No module named", r"No module named 'megatron\.bridge\.[\w.]+'", "error",
       category="provider", result="fail",
       hint="The Bridge checkout lacks a module that verl or the provider imports: check the provider's module "
            "path and registration at this Bridge commit."),
    _p("energon", "No module named", r"No module named 'megatron\.energon", "error", category="env-dependency",
       result="blocked",
       hint="megatron.energon is missing (Bridge imports it on verl's model-build path): install megatron-energon "
            "in the run's Python. The model was not built yet: a dependency, not a provider bug."),
    _p("megatron-core", "No module named", r"No module named 'megatron\.core", "error", category="env-dependency",
       result="blocked",
       hint="megatron.core is not importable: PYTHONPATH must hold $BRIDGE_REPO/3rdparty/Megatron-LM."),
    _p("modelopt", "No module named", r"No module named 'modelopt", "error", category="env-dependency",
       result="blocked", hint="nvidia-modelopt is missing: run `invoke install-modelopt` (container setup)."),
    _p("pulp", "No module named", r"No module named 'pulp'", "error", category="env-dependency", result="blocked",
       hint="modelopt's dependency pulp is missing (checkpoint save imports modelopt): install nvidia-modelopt "
            "with its dependencies (`pip install nvidia-modelopt` without --no-deps) in the run's Python."),
    _p("flash-attn", "No module named", r"No module named 'flash_attn", "error", category="env-dependency",
       result="blocked", hint=H_ATTENTION),
    _p("te-attention", "dot product attention", r"No dot product attention backend is available", "error",
       category="env-dependency", result="blocked", hint=H_ATTENTION),
    _p("apex-fusion", "fused_weight_gradient_mlp_cuda", r"fused_weight_gradient_mlp_cuda", "error",
       category="env-dependency", result="blocked", hint=H_APEX, covered_by="rror"),
    _p("module-missing", "No module named",
       r"(?:^|Error(?:\(\w+\))?: .*)No module named '?([\w.]+)", "error", category="env-dependency",
       result="blocked"),
    _p("worker-module-missing", "RayTaskError(ModuleNotFoundError)", r"RayTaskError\(ModuleNotFoundError\)", "error",
       category="env-ray-import", result="blocked", covered_by="rror"),
    _p("shared-object", "shared object", r"cannot open shared object file", "error",
       category="env-dependency", result="blocked", covered_by="rror"),
    # the dynamic loader's other refusal: a compiled extension built against a newer glibc/libstdc++/CUDA library
    _p("library-version", "not found (required by", r"version [`'][^`']+' not found \(required by \S+\.so", "error",
       category="env-dependency", result="blocked", covered_by="rror",
       hint="A compiled extension needs a newer system library than this image has (the loader's `version ... not "
            "found`): install a build of it for this image, or use an image with that library."),
    _p("undefined-symbol", "", r"\.so[\w.]*: undefined symbol: \w+|no kernel image is available for execution",
       "error",
       category="env-dependency", result="blocked", covered_by="rror",
       hint="A compiled extension does not match the installed torch/CUDA (undefined symbol): reinstall it for "
            "this environment.",
       any_of=(".so", "no kernel image")),
    _p("cuda-symbol", "Cannot load symbol", r"Cannot load symbol \w+", "error", category="env-dependency",
       result="blocked", hint="A CUDA library does not match the installed driver/toolkit (a symbol cannot be "
       "loaded): fix the image's CUDA libraries."),
    _p("bridge-import-name", "cannot import name", r"cannot import name '\w+' from 'megatron\.bridge", "error",
       category="provider", result="fail",
       hint="verl imports a name this Bridge checkout does not have (API drift between verl and Bridge).",
       covered_by="rror"),
    # a model type newer than the installed transformers (Qwen3, Gemma3 on an old image): a dependency version
    _p("transformers-arch", "does not recognize this architecture",
       r"Transformers does not recognize this architecture", "error", category="env-dependency", result="blocked",
       covered_by="rror",
       hint="The installed transformers is older than this model type: upgrade transformers in the run's Python."),
    _p("import-name", "cannot import name", r"cannot import name '\w+' from", "error", category="env-dependency",
       result="blocked", covered_by="rror"),
    _p("hydra-override", "Could not override", r"Could not override '([^']+)'", "error", category="config",
       result="blocked", hint=H_RELEASE),
    # the --config-name (or the script's default) names no config in Hydra's search path: the command is wrong
    _p("hydra-missing-config", "Cannot find primary config", r"Cannot find primary config '[^']*'", "error",
       category="config", covered_by="primary config",
       hint="The config name the command passes (--config-name, or the script's default) is not in Hydra's config "
            "search path printed below it: pass a config that exists, or the folder that holds it with --config-path."),
    _p("hydra-struct", "is not in struct", r"Key '[^']+' is not in struct", "error", category="config",
       result="blocked", hint=H_RELEASE, covered_by="not in struct"),
    _p("rocr", "ROCR_VISIBLE_DEVICES", r"ROCR_VISIBLE_DEVICES", "error", category="env-visible-devices",
       result="blocked", covered_by="VISIBLE_DEVICES"),
    _p("visible-devices", "VISIBLE_DEVICES",
       r"(?:HIP|CUDA)_VISIBLE_DEVICES.*(?:same|mismatch|must|inconsist[ae]n|consistent)", "error",
       category="env-visible-devices", result="blocked"),
    _p("no-gpus", "available GPUs", r"Total available GPUs \d+ is less than total desired", "error",
       category="env-no-gpu", result="blocked"),
    _p("no-cuda-gpus", "CUDA", r"No CUDA GPUs are available|no CUDA-capable device|CUDA driver version is "
       r"insufficient|Found no NVIDIA driver", "error", category="env-no-gpu", result="blocked", covered_by="rror"),
    _p("ray-unschedulable", "cannot be scheduled", r"resource request cannot be scheduled", "error",
       category="env-no-gpu", result="blocked"),
    _p("disk-full", "No space", r"No space left on device", "error", category="env-disk", result="blocked"),
    _p("disk-quota", "quota exceeded", r"[Dd]isk quota exceeded", "error", category="env-disk", result="blocked",
       covered_by="rror"),
    _p("ray-disk", "OutOfDiskError", r"OutOfDiskError", "error", category="env-disk", result="blocked",
       covered_by="rror"),
    _p("ray-runtime-env", "RuntimeEnvSetupError", r"RuntimeEnvSetupError", "error", category="env-ray-import",
       result="blocked", covered_by="rror",
       hint="Ray could not set up the workers' runtime_env (pip/conda/working_dir): read the runtime_env log and "
            "the ray_kwargs.ray_init.runtime_env overrides."),
    _p("no-device", "infer device type", r"Failed to infer device type", "error", category="env-no-gpu",
       result="blocked", covered_by="rror"),
    _p("data-parquet", "parquet", r"(?:FileNotFoundError|No such file or directory|does not exist|Unable to find)"
       r".*\.parquet",
       "error", category="data", result="blocked", covered_by="rror"),
    _p("data-arrow", "Arrow", r"(?:pyarrow\.lib\.)?Arrow(?:Invalid|IOError|TypeError)", "error", category="data",
       result="blocked", covered_by="rror"),
    _p("data-column", "KeyError", r"KeyError: '(?:prompt|reward_model|data_source|ground_truth|extra_info)'",
       "error", category="data", result="blocked", covered_by="rror"),
    _p("rm-missing", "eward", r"(?i)^(?=.*(?:reward|rm_model))(?=.*(?:does not appear to have|No such file|"
       r"not a local folder|Incorrect path_or_model_id|Can't load|not found))", "error", category="reward-model",
       result="blocked", covered_by="rror",
       also=("does not appear to have", "no such file", "not a local folder", "incorrect path_or_model_id",
             "can't load", "not found")),
    _p("model-missing", "", r"Unrecognized model in \S+|does not appear to have a file named config\.json|"
       r"Error no file named \S+.* found in directory|"
       r"is not a local folder and is not a valid model identifier|Incorrect path_or_model_id|"
       r"Can't load (?:tokenizer|the configuration|config) for|LocalEntryNotFoundError|"
       r"couldn't connect to 'https://huggingface\.co'|GatedRepoError|RepositoryNotFoundError|gated repo|"
       r"(?:MaxRetryError|ConnectTimeoutError|NameResolutionError|ConnectionError)\b.*huggingface\.co|"
       # a model file, not a checkpoint's (those are checkpoint failures)
       r"No such file or directory: '(?![^']*global_step)[^']*(?:/config\.json|/tokenizer(?:_config)?\.json|"
       r"\.safetensors|/pytorch_model[\w.-]*\.bin)'", "error",
       category="data", result="blocked",
       hint="The model path does not hold a Hugging Face model (config.json): check MODEL_PATH "
            "(`invoke download-model`).",
       any_of=("Unrecognized model", "config.json", "not a local folder", "Incorrect path_or_model_id", "Can't load",
               "LocalEntryNotFoundError", "couldn't connect", "GatedRepoError", "RepositoryNotFoundError",
               "huggingface.co", "No such file or directory", "gated repo", "no file named")),
    _p("ray-init", "", r"Failed to connect to GCS|Failed to get cluster ID from GCS|Could not find any running "
       r"Ray instance|Failed to start the GCS|Ray has not been started|ray\.init\(\) failed", "error",
       category="env-ray-import", result="blocked",
       any_of=("GCS", "Ray instance", "Ray has not", "ray.init")),
    # Ray refuses a named actor (verl's worker-group register center, a detached worker) whose name a live actor
    # holds: an earlier run or a second job on the same Ray cluster, not this run's code
    _p("ray-name-taken", "already taken", r"The name \S+ \(namespace=\S*\) is already taken", "error",
       category="env-ray-import", result="blocked", covered_by="rror",
       hint="A live Ray actor holds this name (an earlier run or a second job on the same Ray cluster): stop it "
            "(`ray stop` on a cluster of your own, or ray.kill the actor) or start a fresh Ray, and rerun."),
    # both numbers are settings (the trainer's GPUs per node x nodes, the rollout's TP): the configuration does not
    # fit itself. Too few GPUs on the machine is env-no-gpu (too-few-gpus, the resource checks), not this.
    _p("world-size-divisible", "divisible", r"world_size:? \d+ is not divisible by \w*(?:infer|tp|tensor)\w*",
       "error", category="config", result="fail", covered_by="rror",
       hint="The rollout world size (the configured GPUs) is not a multiple of the inference TP: set NUM_GPUS and "
            "INFER_TP so that INFER_TP divides the GPU count."),
    _p("too-few-gpus", "", r"(?i)(?:not enough|insufficient) (?:gpus|devices)|available gpus?:? \d+ is less than|"
       r"requires? \d+ gpus?.*(?:only|but) \d+", "error", category="env-no-gpu", result="blocked",
       covered_by="rror", any_of=("GPU", "gpu", "devices", "DEVICES"),
       also=("not enough", "insufficient", "is less than", "require")),
    # Slurm stopped the step (time limit, scancel, preemption): the launcher, not the run (`slurmstepd: error: ***`)
    _p("slurm-cancelled", "CANCELLED AT", r"\*\*\* (?:JOB|STEP) [\d._]+ ON \S+ CANCELLED AT", "error",
       category="interrupted", result="blocked", covered_by="rror"),
    _p("torch-no-cuda", "not compiled with CUDA", r"Torch not compiled with CUDA enabled", "error",
       category="env-dependency", result="blocked", covered_by="rror",
       hint="The run's torch has no CUDA (a CPU, ROCm or NPU build): install the CUDA build of torch the image expects."),
    _p("keyboard-interrupt", "KeyboardInterrupt", r"^KeyboardInterrupt", "error", category="interrupted",
       result="blocked"),
    # -- named causes that fail the run ------------------------------------------------------------------------
    _p("cuda-oom", "ut of memory", r"[Oo]ut of memory", "error", category="oom", result="fail", covered_by="emory"),
    _p("cgroup-oom", "oom_kill", r"Detected \d+ oom[_-]kill events?", "error", category="oom", result="fail",
       covered_by="rror", any_of=("oom_kill", "oom-kill")),
    _p("oom-error", "OutOfMemoryError", r"OutOfMemoryError", "error", category="oom", result="fail",
       covered_by="rror"),
    _p("ray-oom", "low on memory", r"running low on memory", "error", category="oom", result="fail",
       covered_by="emory"),
    _p("ray-get-timeout", "GetTimeoutError", r"GetTimeoutError", "error", category="hang", result="fail",
       covered_by="rror"),
    _p("hang-watchdog", "Watchdog", r"Watchdog caught collective operation timeout", "error", category="hang",
       result="fail"),
    _p("hang-store", "", r"TCPStore.*(?:timeout|[Tt]imed out)|DistStoreError|throwTimeoutError|"
       r"Timed out (?:after|waiting) .*(?:rendezvous|store|init_process_group)", "error", category="hang",
       result="fail",
       any_of=("TCPStore", "DistStoreError", "throwTimeoutError", "Timed out")),
    _p("nccl-unavailable", "", r"Distributed package doesn't have NCCL|NCCL is not available|"
       r"ProcessGroupNCCL is only supported with GPUs|nccl\w* (?:is )?not (?:available|supported|found)", "error",
       category="nccl", result="fail", any_of=("NCCL", "nccl"),
       hint="NCCL is not available on this device/build (torch without NCCL, no GPU visible to the process): fix "
            "the image or the device visibility; not a Bridge provider failure."),
    _p("gloo-timeout", "imed out", r"Timed out waiting \d+ ?ms for (?:recv|send)|gloo.*[Tt]imed out", "error",
       category="hang", result="fail"),
    # (HCCL is Ascend's collective library: torch_npu reports its failures as `HCCL function error: hccl...`)
    _p("nccl-error", "", r"NCCL [Ee]rror|nccl\w*Error|DistBackendError|DistNetworkError|NCCL communicator was "
       r"aborted|retrieving ncclUniqueId|HCCL function error|call hccl api failed",
       "error", category="nccl", result="fail",
       any_of=("NCCL", "nccl", "DistBackendError", "DistNetworkError", "HCCL", "hccl api")),
    _p("nccl-timeout", "ProcessGroupNCCL", r"ProcessGroupNCCL.*(?:[Tt]imeout|abort)", "error", category="hang",
       result="fail"),
    _p("grad-nan", "NaN", r"found NaN in local grad norm|NaN or Inf found|[Ll]oss is NaN", "error",
       category="nan-metrics", result="fail"),
    _p("unexpected-nan", "Unexpected result", r"Unexpected result (?:nan|inf)", "error", category="nan-metrics",
       result="fail", covered_by="rror"),
    # vLLM's model registry cannot load the architecture for the rollout (its own message, whatever the model)
    _p("vllm-architecture", "Model architectures", r"Model architectures \[[^\]]*\] (?:failed to be inspected|are "
       r"not supported)", "error", category="rollout", result="fail", covered_by="rror",
       hint="vLLM could not inspect or does not support the model's architecture while building the rollout: check "
            "the vLLM version against the model type (and vLLM's own log above for an import error in its "
            "inspection subprocess); a rollout-engine problem, not the Bridge provider."),
    _p("vllm-engine", "Engine", r"EngineCore failed to start|Engine core initialization failed|"
       r"(?:AsyncEngineDead|EngineDead|EngineGenerate)Error", "error", category="rollout", result="fail",
       covered_by="rror"),
    _p("rollout-loop", "rror", r"(?:vLLM|SGLang|sglang)\w* \w+ error|vLLMAsyncRollout.*error", "error",
       category="rollout", result="fail", also=("vLLM", "SGLang", "sglang")),
    _p("dist-ckpt", "heckpoint", r"Checkpoint(?:ing)?Exception|checkpoint.*(?:[Ee]rror|failed|mismatch|corrupt)",
       "error", category="checkpoint", result="fail",
       also=("CheckpointingException", "CheckpointException", "rror", "failed", "mismatch", "corrupt")),
    _p("ckpt-file-missing", "global_step_", r"No such file or directory: '[^']*global_step_\d+", "error",
       category="checkpoint", result="fail", covered_by="rror"),
    _p("state-dict", "", r"(?:Missing|Unexpected) key\(s\) in state_dict|size mismatch for|"
       r"Error\(s\) in loading state_dict", "error",
       category="provider", result="fail", hint="Weights and model do not match: check the provider's param "
       "mapping (HF import) or, on resume, the checkpoint (rerun with SAVE_FREQ=-1).", covered_by="rror",
       any_of=("in state_dict", "size mismatch for", "in loading state_dict")),
    _p("parallel-sizes", "parallel",
       r"(?:tensor|pipeline|context|expert|data)_model_parallel_size.*(?:mismatch|must|divisible|not equal|!=|"
       r"does not match|but .*(?:initiali[sz]ed|mpu))|model parallel group is not initialized|parallel state.*not initialized", "error",
       category="provider", result="fail", hint=H_PARALLEL, covered_by="rror",
       also=("mismatch", "must", "divisible", "not equal", "!=", "does not match", "initialized", "initialised", "mpu")),
    _p("provider-object", "object has no attribute",
       r"'\w*(?:ModelProvider|Provider|Bridge)' object has no attribute", "error", category="provider",
       result="fail", covered_by="rror"),
    _p("mbridge-unregistered", "", r"(?i)unregistered model type|model type:? \S+ (?:is )?not (?:registered|"
       r"supported)|not registered in mbridge", "error", category="provider", result="fail", covered_by="rror",
       any_of=("nregistered", "not registered", "not supported"),
       hint="mbridge/Bridge has no bridge registered for this model type: check the model's architecture and the "
            "bridge registration at this commit (a provider gap, not an environment problem)."),
    _p("event-loop", "loop", r"event loop (?:is (?:already running|closed)|in thread)|no (?:current|running) event "
       r"loop|attached to a different loop|Cannot run the event loop", "error", category="rollout", result="fail",
       covered_by="rror", specific=False),
    _p("lora-target", "arget", r"(?i)target[_ ]modules?.*(?:not found|no match|did not match|not present|"
       r"not supported)", "error", category="provider", result="fail", hint=H_LORA, covered_by="rror",
       also=("not found", "no match", "did not match", "not present", "not supported")),
    _p("config-check", "", r"(?:batch_size|micro_batch|mini_batch|n_gpus|world_size|nnodes|num_gpus)\w*.*"
       r"(?:(?:must|should) be (?:divisible|larger|greater|less|smaller|a multiple|at least|>=|<=|>|<)|"
       r"is not divisible by)", "error",
       category="config", result="fail", covered_by="rror",
       any_of=("must be", "should be", "is not divisible by")),
    _p("reward-fn", "eward", r"Reward function is not implemented|reward function .*not (?:implemented|found)",
       "error", category="reward-model", result="fail", covered_by="rror", also=("not implemented", "not found")),
    _p("omegaconf", "omegaconf", r"omegaconf\.errors\.\w+|hydra\.errors\.\w+|ConfigCompositionException|"
       r"ConfigKeyError|ConfigAttributeError", "error", category="config", result="fail", covered_by="rror",
       any_of=("omegaconf", "hydra.errors", "ConfigCompositionException", "ConfigKeyError", "ConfigAttributeError")),
    # a death, not an actor whose __init__ raised (that exception is the cause), nor the bare type a RayTaskError
    # wrapper names (the ActorDiedError line after it says which)
    _p("actor-died", "", r"(?<!\()ActorDiedError(?!: The actor died because of an error raised in its "
       r"creation task)|The actor died unexpectedly|NodeDiedError|RayActorError|WorkerCrashedError|OwnerDiedError",
       "error",
       category="actor-died", result="fail", covered_by="rror",
       any_of=("ActorDiedError", "actor died", "NodeDiedError", "RayActorError", "WorkerCrashedError", "OwnerDiedError")),
    _p("worker-died", "illed", r"A worker died or was killed|(?<!\w)Killed(?!\w)|killed by signal", "error",
       category="actor-died", result="fail", specific=False),
    _p("segfault", "", r"Segmentation fault|SIGSEGV|SIGABRT", "error", category="actor-died",
       result="fail", specific=False,
       any_of=("Segmentation fault", "SIGSEGV", "SIGABRT")),
    _p("core-dumped", "core dumped", r"core dumped", "error", category="actor-died", result="fail", specific=False),
    _p("hydra-full-error", "HYDRA_FULL_ERROR", r"HYDRA_FULL_ERROR", "ignore", covered_by="rror"),
    # -- generic shapes ----------------------------------------------------------------------------------------
    _p("traceback", "Traceback", r"^(?:Original )?Traceback \(most recent call last\)", "traceback"),
    _p("exception-line", "", r"^(?:[\w.]+\.)?(?P<exc>\w*(?:Error|Exception|Exit|Interrupt|Invalid))"
       r"(?:\((?P<inner>\w+)\))?(?::\s(?P<msg>.*)|\s*$)", "exception",
       any_of=("Error", "Exception", "Exit", "Interrupt", "Invalid")),
)

class Gated:
    """A regex that runs only where one of its pattern's `also` literals is in the text (same answers, less work)."""

    def __init__(self, regex: re.Pattern[str], also: tuple[str, ...]):
        self.regex = regex
        self.folded = bool(regex.flags & re.IGNORECASE)
        self.also = tuple(lit.casefold() for lit in also) if self.folded else also

    def search(self, text: str) -> re.Match[str] | None:
        if not self.folded:
            seen = text
        elif text.isascii():  # ASCII: casefold is lower and (?i) matches no other letters
            seen = text.lower()
        else:
            return self.regex.search(text)
        for literal in self.also:
            if literal in seen:
                return self.regex.search(text)
        return None


# The raylet's explanation of a dead worker: the cause `actor-died` names.
ACTOR_DEATH_CAUSES = (
    (Gated(re.compile(r"OOM killer|oom-kill|out of memory|low on memory|memory limit|exceeded .*memory", re.I),
           ("oom killer", "oom-kill", "out of memory", "low on memory", "memory limit", "exceeded")), "memory"),
    (Gated(re.compile(r"node .*(?:dead|lost|died|removed)|NodeDiedError|node failure", re.I), ("node",)),
     "node lost"),
    (Gated(re.compile(r"SIGKILL|killed by signal 9|^Killed$"), ("SIGKILL", "killed by signal 9", "Killed")),
     "killed (SIGKILL)"),
    (Gated(re.compile(r"SIGSEGV|Segmentation fault|SIGABRT|core dumped", re.I),
           ("sigsegv", "segmentation fault", "sigabrt", "core dumped")), "native crash"),
)

# `ray::WorkerDict.actor_rollout_init_model()` etc. in RayTaskError, "Unhandled error" and creation-task lines: the
# remote method tells the phase a nested error came from.
RAY_WRAPPER_RE = re.compile(
    r"(?:RayTaskError(?:\((?P<inner>[\w.]+)\))?|Unhandled error \([^)]*\)|Exception raised in creation task|"
    r"error raised in its creation task)"
    r".*?ray::(?:\w*?:\d+:)?(?P<method>[\w.]+)\(\)"
)
# Wrapped exception types that name a category by themselves.
WRAPPED_CATEGORIES = {
    "ActorDiedError": "actor-died", "OutOfMemoryError": "oom", "DistBackendError": "nccl",
    "DistStoreError": "hang", "ModuleNotFoundError": "env-ray-import",
}
# A traceback frame line: its file (the package, frames.py) and its function (verl's loop area, frames.py).
FRAME_RE = re.compile(r"""^File "([^"]+)", line \d+(?:, in (\S+))?""")
# a frame line a paste cut before its `File "` (an excerpt that starts mid-line): the rest of its path, the line
CUT_FRAME_RE = re.compile(r"""^([^\s"]+\.py)", line \d+(?:, in (\S+))?""")
# A nested failure in a rollout server (vLLM) names the rollout category when the innermost line is generic.
ROLLOUT_SOURCE_RE = re.compile(r"vLLM|EngineCore|AgentLoop|sglang|generate_sequences|launch_server")

# Step metric keys whose non-finite values fail a run (SPEC level 5; any level for nan-metrics).
CORE_METRIC_RE = re.compile(
    r"(?:^|/)(?:pg_loss|vf_loss|kl_loss|ppo_kl|kl|entropy|entropy_loss|grad_norm|score/mean|rewards/mean|"
    r"log_prob\w*|old_log_prob\w*|ref_log_prob\w*|vpred_mean)"
)


def compiled() -> tuple[tuple[Pattern, re.Pattern[str] | Gated], ...]:
    """The table with compiled regexes, in table order (gated by `also` where a pattern has it)."""
    return tuple((p, Gated(re.compile(p.regex), p.also) if p.also else re.compile(p.regex)) for p in PATTERNS)
