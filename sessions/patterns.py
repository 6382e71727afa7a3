"""The one table of log patterns the verdict engine knows: regex -> kind, phase, category, result rule, hint.

Each pattern names a literal `needle` that every line it can match contains; the streaming reader only hands
the judge lines that contain one of the SCAN_NEEDLES_*, and tests check that every needle here contains one.
Regexes are searched in the normalised text (no ANSI, no Ray prefix, one `\\r` segment).

Kinds:
  ignore     - line is not evidence and not an error (optional-module warnings, Python warnings)
  noise      - shutdown chatter; after the last completed step it is residual noise, never failing
  marker     - the run reached `phase`
  fact       - a fact handler in verdict.py (`fact` names it)
  limitation - the run used a setting the report must list as a limitation
  error      - a specific error cause: `category`, and `result` = "blocked" | "fail" | "by-phase"
  exception  - a generic exception line (category from its phase)
  traceback  - the start of a Python traceback
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Phases in the order a healthy run passes them (sessions.verdict.PHASES holds the same names).
PHASE_ORDER = ("launch", "ray-up", "model-build", "model-built", "rollout-up", "training", "checkpoint", "shutdown")

# The streaming reader's prefilter. FULL: searched in the head and tail of a big log (all of a small one) and in a
# window after each traceback. MIDDLE: the middle of a big log, where a healthy run only adds step lines and
# checkpoint saves (long needles: bytes.find skips faster). EARLY: also in the middle until training starts.
# "Training Progress" bars are frequent: only the last one of each chunk is read (LAST_ONLY_NEEDLE).
SCAN_NEEDLES_MIDDLE = ("training/global_step:", "Traceback (most recent call last)", "Saving checkpoint")
TRACEBACK_NEEDLE = "Traceback (most recent call last)"
LAST_ONLY_NEEDLE = "Training Progress"
SCAN_NEEDLES_FULL = (
    "step", "Traceback", "rror", "xception", "ERROR", "illed", "heckpoint", "Segmentation", "core dumped",
    "Watchdog", "resource_tracker", "VISIBLE_DEVICES", "available GPUs", "Could not override", "Arrow",
    "No space", "KeyboardInterrupt", "out of memory", "megatron/bridge", "NaN", "NCCL", "low on memory",
    "cannot be scheduled", "not in struct",
)
SCAN_NEEDLES_EARLY = (
    "MBRIDGE", "mbridge", "TRAIN_STEPS", "LORA", "PEFT", "parameters", "percentage", "from scratch", "Bridge",
    "LLM engine", "DUMMY",
)

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
H_DISK = (
    "No space left: move HF_HOME, HF_HUB_CACHE and MODEL_PATH to a larger scratch path and rerun with an "
    "explicit local MODEL_PATH."
)

# Triage hint per category (SPEC "The verdict", procedure "Triage de failure").
CATEGORY_HINTS = {
    "success": None,
    "provider": H_PARALLEL + " If LoRA fails: " + H_LORA[0].lower() + H_LORA[1:],
    "checkpoint": H_CHECKPOINT,
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
    "timeout": (
        "No new output before the stall timeout. A Ray cluster with fewer than ~10 CPUs never schedules "
        "verl's workers (its transfer queue takes 8); also check for a hung collective."
    ),
    "interrupted": "The run was interrupted (SIGINT/SIGTERM) before it ended: not evidence either way; rerun it.",
    "unknown": "Read the first error line and the log around it.",
}

FOLLOW_UPS = {
    "success": "none",
    "provider": "fix the provider, then rerun this level",
    "checkpoint": "rerun with SAVE_FREQ=-1 to separate model build from checkpoint behaviour",
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
    "timeout": "rerun with more Ray CPUs / a longer stall timeout; look at the last lines before the stall",
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


def _p(*args, **kwargs) -> Pattern:
    return Pattern(*args, **kwargs)


# Order matters inside a kind: the first error pattern that matches a line names its cause.
PATTERNS: tuple[Pattern, ...] = (
    # -- lines that look like errors but are not (healthy runs print them) --------------------------------------
    _p("optional-engine", "not available", r"engine is not available|is not available, (?:skip|fall)", "ignore"),
    _p("py-warning", "Warning:", r"^(?:\S+:\d+: )?\w*Warning: (?!resource_tracker)", "ignore"),
    _p("log-warning", "WARN", r"^(?:\[?W\d{4} |WARNING[ :\]]|\[WARNING\]|\S+ WARNING |\(\w+\) WARNING )", "ignore"),
    # -- shutdown chatter: residual noise after the last step -----------------------------------------------
    _p("resource-tracker", "resource_tracker", r"resource_tracker", "noise"),
    _p("atexit", "Exception ignored", r"Exception ignored in", "noise"),
    _p("dataloader-killed", "DataLoader worker", r"DataLoader worker \(pid[ s]", "noise"),
    _p("ray-shutdown", "hutdown", r"[Ss]hutdown|shutting down|Shutting down", "noise"),
    _p("sigterm", "SIGTERM", r"SIGTERM", "noise"),
    # -- facts -----------------------------------------------------------------------------------------------
    _p("vanilla-trace", "VANILLA_MBRIDGE=", r"^\++\s+(?:export\s+)?(?:VALUE_)?VANILLA_MBRIDGE=(\S+)", "fact",
       fact="vanilla"),
    _p("vanilla-override", "vanilla_mbridge", r"vanilla_mbridge['\"]?\s*[=:]\s*['\"]?(\w+)", "fact", fact="vanilla"),
    _p("steps-printed", "Total training steps", r"Total training steps:?\s*(\d+)", "fact", fact="total_steps"),
    _p("steps-override", "total_training_steps", r"trainer\.total_training_steps=(\d+)", "fact",
       fact="override_steps"),
    _p("steps-trace", "TOTAL_TRAIN_STEPS=", r"^\++\s+(?:export\s+)?TOTAL_TRAIN_STEPS=(\d+)", "fact",
       fact="trace_steps"),
    _p("adapter-header", "PEFT Adapter Information", r"PEFT Adapter Information", "fact", fact="adapter_header",
       phase="model-built"),
    _p("adapter-total", "Total parameters", r"Total parameters:\s*([\d,]+)", "fact", fact="adapter_total"),
    _p("adapter-count", "Adapter parameters", r"Adapter parameters:\s*([\d,]+)", "fact", fact="adapter_count"),
    _p("adapter-pct", "Trainable percentage", r"Trainable percentage:\s*([\d.eE+-]+)\s*%", "fact",
       fact="adapter_pct"),
    _p("ckpt-save", "heckpoint", r"[Ss]aving checkpoint to:?\s*(\S+)", "fact", fact="save", phase="checkpoint"),
    _p("ckpt-saved", "heckpoint", r"Checkpoint save completed", "fact", fact="save_done", phase="checkpoint"),
    _p("resume", "Resuming from", r"Resuming from:?\s*(\S*global_step_\d+)", "fact", fact="resume",
       phase="checkpoint", covered_by="step"),
    _p("resume-old", "Load from checkpoint folder", r"Load from checkpoint folder:?\s*(\S+)", "fact",
       fact="resume", phase="checkpoint"),
    _p("resume-found", "Found checkpoint", r"Found checkpoint:?.*?(\S*global_step_\d+)", "fact",
       fact="resume_found", phase="checkpoint"),
    _p("resume-step", "etting global step to", r"[Ss]etting global step to (\d+)", "fact", fact="resume_step"),
    _p("fresh", "from scratch", r"Training from scratch", "fact", fact="fresh"),
    _p("fresh-tracker", "heckpoint tracker file does not exist",
       r"[Cc]heckpoint tracker file does not exist", "fact", fact="fresh"),
    _p("bridge-path", "megatron/bridge", r"(/[^\s'\"():,]*?/megatron/bridge)\b", "fact", fact="bridge_path"),
    _p("progress-bar", "Training Progress", r"^Training Progress:\s*(\d+)%", "fact", fact="progress",
       phase="training"),
    # -- settings the report lists as limitations (seen in the traced command line) ---------------------------
    _p("lim-no-rm", "reward_model.enable=False", r"reward_model\.enable=False", "limitation",
       limitation="reward model disabled (rule reward): reward-model serving not tested",
       covered_by="mbridge"),
    _p("lim-eager", "enforce_eager=True", r"enforce_eager=True", "limitation",
       limitation="actor_rollout_ref.rollout.enforce_eager=True: vLLM CUDA-graph capture not exercised",
       covered_by="mbridge"),
    _p("lim-profiler", "global_profiler.tool=null", r"global_profiler\.tool=null", "limitation",
       limitation="global_profiler.tool=null (no nsys)",
       covered_by="mbridge"),
    _p("lim-fusion", "gradient_accumulation_fusion=False", r"gradient_accumulation_fusion=False", "limitation",
       limitation="gradient_accumulation_fusion=False overrides (Apex fused kernel not used)",
       covered_by="mbridge"),
    _p("lim-dummy", "USE_DUMMY_MODEL=", r"^\++\s+(?:export\s+)?USE_DUMMY_MODEL=True", "limitation",
       limitation="dummy model: validates construction and mechanics, not pretrained-weight compatibility"),
    # -- phase markers ---------------------------------------------------------------------------------------
    _p("hydra-job", "Error executing job", r"Error executing job with overrides", "marker", phase=None),
    _p("enable-lora", "Enabling LORA", r"Enabling LORA with rank", "marker", phase="model-build"),
    _p("autobridge", "Bridge", r"AutoBridge|Megatron-Bridge provider|from_hf_pretrained", "marker",
       phase="model-build"),
    _p("hf-loaded", "Loaded HF model checkpoint", r"Loaded HF model checkpoint from .* with bridge", "marker",
       phase="model-built"),
    _p("megatron-params", "number of parameters on", r"number of parameters on \(tensor, pipeline\)", "marker",
       phase="model-built"),
    _p("vllm-engine-up", "LLM engine", r"Initializing an? (?:V1 )?LLM engine", "marker", phase="rollout-up"),
    # -- specific error causes (first match names the cause) ---------------------------------------------------
    _p("worker-no-bridge", "No module named", r"No module named 'megatron\.bridge'", "error",
       category="env-ray-import", result="blocked", covered_by="rror"),
    _p("bridge-not-found", "Megatron-Bridge package not found", r"Megatron-Bridge package not found", "error",
       category="env-ray-import", result="blocked"),
    _p("bridge-submodule", "No module named", r"No module named 'megatron\.bridge\.[\w.]+'", "error",
       category="provider", result="fail",
       hint="The Bridge checkout lacks a module that verl or the provider imports: check the provider's module "
            "path and registration at this Bridge commit.", covered_by="rror"),
    _p("energon", "No module named", r"No module named 'megatron\.energon", "error", category="env-dependency",
       result="blocked",
       hint="megatron.energon is missing (Bridge imports it on verl's model-build path): install megatron-energon "
            "in the run's Python. The model was not built yet: a dependency, not a provider bug.", covered_by="rror"),
    _p("megatron-core", "No module named", r"No module named 'megatron\.core", "error", category="env-dependency",
       result="blocked",
       hint="megatron.core is not importable: PYTHONPATH must hold $BRIDGE_REPO/3rdparty/Megatron-LM.", covered_by="rror"),
    _p("modelopt", "No module named", r"No module named 'modelopt", "error", category="env-dependency",
       result="blocked", hint="nvidia-modelopt is missing: run `invoke install-modelopt` (container setup).", covered_by="rror"),
    _p("flash-attn", "No module named", r"No module named 'flash_attn", "error", category="env-dependency",
       result="blocked",
       hint="flash-attn is missing: add ...megatron.override_transformer_config.attention_backend=fused (cuDNN).", covered_by="rror"),
    _p("apex-fusion", "fused_weight_gradient_mlp_cuda", r"fused_weight_gradient_mlp_cuda", "error",
       category="env-dependency", result="blocked", hint=H_APEX, covered_by="rror"),
    _p("module-missing", "No module named", r"No module named '?([\w.]+)", "error", category="env-dependency",
       result="blocked", covered_by="rror"),
    _p("shared-object", "cannot open shared object file", r"cannot open shared object file", "error",
       category="env-dependency", result="blocked", covered_by="rror"),
    _p("bridge-import-name", "cannot import name", r"cannot import name '\w+' from 'megatron\.bridge", "error",
       category="provider", result="fail",
       hint="verl imports a name this Bridge checkout does not have (API drift between verl and Bridge).", covered_by="rror"),
    _p("import-name", "cannot import name", r"cannot import name '\w+' from", "error", category="env-dependency",
       result="blocked", covered_by="rror"),
    _p("hydra-override", "Could not override", r"Could not override '([^']+)'", "error", category="env-dependency",
       result="blocked", hint=H_RELEASE),
    _p("hydra-struct", "is not in struct", r"Key '[^']+' is not in struct", "error", category="env-dependency",
       result="blocked", hint=H_RELEASE),
    _p("rocr", "ROCR_VISIBLE_DEVICES", r"ROCR_VISIBLE_DEVICES", "error", category="env-visible-devices",
       result="blocked"),
    _p("visible-devices", "VISIBLE_DEVICES",
       r"(?:HIP|CUDA)_VISIBLE_DEVICES.*(?:same|mismatch|must|inconsistent|consistent)", "error",
       category="env-visible-devices", result="blocked"),
    _p("no-gpus", "available GPUs", r"Total available GPUs \d+ is less than total desired", "error",
       category="env-no-gpu", result="blocked"),
    _p("no-cuda-gpus", "CUDA", r"No CUDA GPUs are available|no CUDA-capable device|CUDA driver version is "
       r"insufficient|Found no NVIDIA driver", "error", category="env-no-gpu", result="blocked", covered_by="rror"),
    _p("ray-unschedulable", "cannot be scheduled", r"resource request cannot be scheduled", "error",
       category="env-no-gpu", result="blocked", specific=False),
    _p("disk-full", "No space", r"No space left on device", "error", category="env-disk", result="blocked"),
    _p("disk-quota", "quota exceeded", r"[Dd]isk quota exceeded", "error", category="env-disk", result="blocked", covered_by="rror"),
    _p("data-parquet", "parquet", r"(?:FileNotFoundError|No such file or directory|does not exist).*\.parquet",
       "error", category="data", result="blocked", covered_by="rror"),
    _p("data-arrow", "Arrow", r"(?:pyarrow\.lib\.)?Arrow(?:Invalid|IOError|TypeError)", "error", category="data",
       result="blocked"),
    _p("data-column", "KeyError", r"KeyError: '(?:prompt|reward_model|data_source|ground_truth|extra_info)'",
       "error", category="data", result="blocked"),
    _p("rm-missing", "eward", r"(?i)^(?=.*(?:reward|rm_model))(?=.*(?:does not appear to have|No such file|"
       r"not a local folder|Incorrect path_or_model_id|Can't load|not found))", "error", category="reward-model",
       result="blocked", covered_by="rror"),
    _p("cuda-oom", "out of memory", r"out of memory", "error", category="oom", result="by-phase"),
    _p("oom-error", "OutOfMemoryError", r"OutOfMemoryError", "error", category="oom", result="by-phase"),
    _p("ray-oom", "low on memory", r"running low on memory", "error", category="oom", result="by-phase"),
    _p("nccl-watchdog", "Watchdog", r"Watchdog caught collective operation timeout", "error", category="nccl",
       result="by-phase"),
    _p("nccl-error", "rror", r"NCCL error|nccl\w*Error|DistBackendError", "error", category="nccl",
       result="by-phase"),
    _p("nccl-timeout", "ProcessGroupNCCL", r"ProcessGroupNCCL.*(?:[Tt]imeout|abort)", "error", category="nccl",
       result="by-phase"),
    _p("grad-nan", "NaN", r"found NaN in local grad norm|NaN or Inf found|[Ll]oss is NaN", "error",
       category="nan-metrics", result="fail"),
    _p("unexpected-nan", "Unexpected result", r"Unexpected result (?:nan|inf)", "error", category="nan-metrics",
       result="fail", covered_by="rror"),
    _p("vllm-engine", "Engine", r"EngineCore failed to start|Engine core initialization failed|"
       r"(?:AsyncEngineDead|EngineDead|EngineGenerate)Error", "error", category="rollout", result="by-phase", covered_by="rror"),
    _p("dist-ckpt", "heckpoint", r"CheckpointingException|checkpoint.*(?:[Ee]rror|failed|mismatch|corrupt)", "error",
       category="checkpoint", result="fail"),
    _p("state-dict", "state_dict", r"(?:Missing|Unexpected) key\(s\) in state_dict|size mismatch for", "error",
       category="provider", result="fail", hint="Weights and model do not match: check the provider's param "
       "mapping (HF import) or, on resume, the checkpoint (rerun with SAVE_FREQ=-1).", covered_by="rror"),
    _p("parallel-sizes", "parallel",
       r"(?:tensor|pipeline|context|expert|data)_model_parallel_size.*(?:mismatch|must|divisible|not equal|!=|"
       r"does not match)|model parallel group is not initialized|parallel state.*not initialized", "error",
       category="provider", result="fail", hint=H_PARALLEL, covered_by="rror"),
    _p("lora-target", "arget", r"(?i)target[_ ]modules?.*(?:not found|no match|did not match|not present|"
       r"not supported)", "error", category="provider", result="fail", hint=H_LORA, covered_by="rror"),
    _p("ray-init", "Ray", r"Failed to connect to GCS|Could not find any running Ray instance|"
       r"Failed to start the GCS|Ray has not been started|ray\.init\(\) failed", "error", category="unknown",
       result="blocked", hint="Ray could not start or connect: fix the Ray cluster setup (not a provider failure).", covered_by="rror"),
    _p("worker-died", "illed", r"A worker died or was killed|(?<!\w)Killed(?!\w)|killed by signal", "error",
       category="unknown", result="by-phase", specific=False),
    _p("actor-died", "ActorDiedError", r"ActorDiedError", "error", category="unknown", result="by-phase",
       specific=False),
    _p("segfault", "Segmentation", r"Segmentation fault", "error", category="unknown", result="by-phase",
       specific=False),
    _p("core-dumped", "core dumped", r"core dumped", "error", category="unknown", result="by-phase",
       specific=False),
    _p("hydra-full-error", "HYDRA_FULL_ERROR", r"HYDRA_FULL_ERROR", "ignore"),
    _p("keyboard-interrupt", "KeyboardInterrupt", r"^KeyboardInterrupt", "error", category="interrupted",
       result="blocked"),
    # -- generic shapes ----------------------------------------------------------------------------------------
    _p("traceback", "Traceback", r"^Traceback \(most recent call last\)", "traceback"),
    _p("exception-line", "", r"^(?:[\w.]+\.)?(?P<exc>\w*(?:Error|Exception|Exit|Interrupt|Invalid))"
       r"(?:\((?P<inner>\w+)\))?(?::\s(?P<msg>.*)|\s*$)", "exception"),
)

# `ray::WorkerDict.actor_rollout_init_model()` etc.: the remote method tells the phase a nested error came from.
RAY_WRAPPER_RE = re.compile(r"RayTaskError(?:\(([\w.]+)\))?: ray::([\w.]+)\(\)")
METHOD_PHASES = (
    (re.compile(r"__init__"), "ray-up"),
    (re.compile(r"init_model|build_model|_build_"), "model-build"),
    (re.compile(r"generate_sequences|vLLM|AgentLoop|launch_server|sglang"), "rollout-up"),
    (re.compile(r"save_checkpoint|load_checkpoint|checkpoint", re.I), "checkpoint"),
    (re.compile(r"update_actor|update_critic|compute_|train"), "training"),
)
# A nested failure in a rollout server (vLLM) names the rollout category when the innermost line is generic.
ROLLOUT_SOURCE_RE = re.compile(r"vLLM|EngineCore|AgentLoop|sglang|generate_sequences|launch_server")

# Step metric keys whose non-finite values fail a run (SPEC level 5; any level for nan-metrics).
CORE_METRIC_RE = re.compile(
    r"(?:^|/)(?:pg_loss|vf_loss|kl_loss|ppo_kl|kl|entropy|grad_norm|score/mean|rewards/mean|"
    r"log_prob\w*|old_log_prob\w*|ref_log_prob\w*)"
)


def compiled() -> tuple[tuple[Pattern, re.Pattern[str]], ...]:
    """The table with compiled regexes, in table order."""
    return tuple((p, re.compile(p.regex)) for p in PATTERNS)
