"""The level tasks' flags, declared once, and the invoke task built from them (`level0` … `level5`).

Kept apart from sessions/run/level.py (the run itself) so that declaring the tasks imports no preflight, judge or
launcher code: every `invoke` call (`invoke judge`, `invoke --list`) loads tasks.py, and the level machinery costs
~0.11 s to import; it loads when a level runs. The table's type, range, choices and path facts are
env/protocol/flags.py's.
"""

from __future__ import annotations

from env import presets
from env.protocol.flags import Flag, FlagTable, task_from_table

# Flags of the level tasks, declared once (env/protocol/flags.py: type, range, choices, path, forwarded by `plan`);
# `levels` limits a flag to the levels that use it. The task, its help, its validation and `plan`'s pass-through
# all come from this table.
LEVEL_FLAGS: tuple[Flag, ...] = (
    Flag("model", None, "HF model id ORG/NAME (MODEL_ID)", kind="model"),
    Flag("model_path", None, "local HF checkpoint (MODEL_PATH)", setting=True, kind="path", forward=True),
    Flag("bridge_repo", None, "Megatron-Bridge checkout (BRIDGE_REPO)", setting=True, kind="path", forward=True),
    Flag("verl_repo", None, "verl checkout (VERL_REPO)", setting=True, kind="path", forward=True),
    Flag("train_files", None, "GSM8K train parquet (TRAIN_FILES)", setting=True, kind="path"),
    Flag("val_files", None, "GSM8K validation parquet (VAL_FILES)", setting=True, kind="path"),
    Flag("rm_model_path", None, "reward model checkpoint (RM_MODEL_PATH)", setting=True, kind="path"),
    Flag("log_dir", None, "where the run directory goes (LOG_DIR)", setting=True, kind="path", forward=True),
    Flag("num_gpus", None, "GPUs for the run (NUM_GPUS; default: detected)", setting=True, kind="int", minimum=0,
         forward=True),
    Flag("ray_address", None, "attach to this Ray cluster (no `ray stop`)", setting=True, nonempty=True),
    Flag("python", None, "Python that runs verl (VERL_PYTHON; default python3)", setting=True, nonempty=True),
    Flag("stall_timeout", None, "minutes without output before the run is stopped as hung (STALL_TIMEOUT_MIN)",
         setting=True, kind="float", minimum=0),
    Flag("dry_run", False, "print the exact environment and command, run nothing"),
    Flag("verbose", False, "stream the whole verl log here, not a status line (VERL_E2E_VERBOSE=1)", forward=True),
    Flag("enforce_eager", False, "actor_rollout_ref.rollout.enforce_eager=True (a Limitation: no CUDA graphs)",
         forward=True),
    Flag("no_reward_model", False, "disable the reward model (GSM8K rule reward; a Limitation)", forward=True),
    Flag("dummy_config", None, "minimal HF config JSON: dummy model, construction and mechanics only", kind="path",
         forward=True),
    Flag("download", False, "download the model to scratch first when it is absent"),
    Flag("fresh_probe", False, "ignore the preflight probe cache in $LOG_DIR (probe the environment again)"),
    Flag("probe_first", False, "start verl only after the heavy preflight probes answered (default: they run "
         "alongside verl's start, which is stopped if one is Blocked)"),
    Flag("skip_bridge_checks", False, "do not require Bridge-side checks (reported as Not requested)", forward=True),
    Flag("bridge_tests", None, "extra model-specific Bridge test paths, comma separated", nonempty=True, forward=True),
    Flag("allow_missing", False, "run the Bridge checks even if a targeted path is missing (named in the report)",
         forward=True),
    Flag("keep_going", False, "start verl even when the Bridge checks failed"),
    Flag("keep_checkpoints", False, "keep the series' checkpoint directory afterwards", levels=(1,)),
    Flag("variant", None, "dense | moe", levels=(2,), kind="choice", choices=("dense", "moe")),
    Flag("script", None, "verl example script to run instead of the wrapper", levels=(4,), nonempty=True),
    Flag("feature", None, "vlm | moe | mtp | qat | quantized | custom-layer", levels=(4,), kind="choice",
         choices=presets.FEATURES),
    Flag("steps", None, "training steps (default 20, at most 100)", levels=(5,), kind="int", minimum=1, maximum=100),
    Flag("baseline", None, "run directory of a known-good run to compare against", levels=(5,), kind="path"),
    Flag("threshold", None, "METRIC>=VALUE that makes the run count as converged", levels=(5,), nonempty=True),
)
_NO_BRIDGE_CHECKS = "--skip-bridge-checks runs no Bridge checks"
LEVEL_CONFLICTS = (("skip_bridge_checks", "bridge_tests"), ("skip_bridge_checks", "allow_missing"),
                   ("skip_bridge_checks", "keep_going"))
def flags_for(number: int) -> list[Flag]:
    return [f for f in LEVEL_FLAGS if f.levels is None or number in f.levels]


def level_table(number: int) -> FlagTable:
    flags = tuple(flags_for(number))
    names = {f.name for f in flags}
    return FlagTable(flags, conflicts=tuple(c for c in LEVEL_CONFLICTS if set(c) <= names),
                     why={c: _NO_BRIDGE_CHECKS for c in LEVEL_CONFLICTS})


def make_level_task(number: int):
    """An invoke task `level<N>` whose flags are LEVEL_FLAGS for that level; its body is `run_level`."""
    level = presets.LEVELS[number]

    def body(c, **kwargs):
        from sessions.run.level import run_level  # noqa: PLC0415 - the level machinery loads when a level runs

        return run_level(c, number, kwargs)

    doc = (f"Level {number}: {level.title}; exit 0 Pass, 1 Fail, 3 Blocked.\n\n"
           f"A Pass shows that {level.proves}. Extra Hydra overrides after `--`. "
           f"Exit 0 Pass, 1 Fail, 3 Blocked, 2 bad invocation, 130 interrupted.")
    # run_level validates (parse_options): the same code path as `invoke bisect ... levelN`
    return task_from_table(level_table(number), body, name=f"level{number}", doc=doc, validated=False)
