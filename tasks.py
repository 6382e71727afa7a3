"""Invoke tasks: the verl integration test of a Megatron-Bridge model provider, one task per intent.

Settings: flag > environment (BRIDGE_REPO, VERL_REPO, MODEL_ID, ...) > invoke.yaml > default.
Level exit codes: 0 Pass, 1 Fail, 3 Blocked, 2 bad invocation.
"""

from invoke import task

from env.cli import install_parse_error_exit_code, one_line_errors
from sessions.level import make_level_task

install_parse_error_exit_code()

# One task per coverage level; they differ only by their preset row and flags (env/presets.py, sessions/level.py).
level0 = make_level_task(0)
level1 = make_level_task(1)
level2 = make_level_task(2)
level3 = make_level_task(3)
level4 = make_level_task(4)
level5 = make_level_task(5)


@task(
    help={
        "bridge_repo": "Megatron-Bridge checkout (BRIDGE_REPO)",
        "verl_repo": "verl checkout (VERL_REPO)",
        "ray_address": "also probe this Ray cluster's workers (RAY_ADDRESS)",
        "num_gpus": "GPUs to plan for (NUM_GPUS; default: detected)",
        "level": "check against this level's preset (default 0)",
        "json": "print the checks as JSON",
    }
)
@one_line_errors
def doctor(c, bridge_repo=None, verl_repo=None, ray_address=None, num_gpus=None, level=0, json=False):
    """Run every preflight check as a ✔/✘ table, without starting verl."""
    from sessions.level import doctor_command

    return doctor_command(
        c, dict(bridge_repo=bridge_repo, verl_repo=verl_repo, ray_address=ray_address, num_gpus=num_gpus),
        level=int(level), as_json=json,
    )


@task(
    help={
        "log": "a verl log file (any, also logs not made by this tool)",
        "level": "judge against this level's rule (default 0)",
        "steps": "expected training steps (default: from the log)",
        "exit_code": "the wrapper's exit code, when known",
        "json": "print the verdict as JSON",
    }
)
@one_line_errors
def judge(c, log, level=None, steps=None, exit_code=None, json=False):
    """Judge a verl log: Pass / Fail / Blocked with category, first error and triage hint."""
    from sessions.verdict import judge_command

    return judge_command(
        log,
        level=None if level is None else int(level),
        steps=None if steps is None else int(steps),
        exit_code=None if exit_code is None else int(exit_code),
        as_json=json,
    )


@task(help={"run_dir": "a run directory written by a level task"})
@one_line_errors
def report(c, run_dir):
    """Re-render a run's summary (summary.md/json, junit.xml) from what its run directory holds."""
    from sessions.report import report_command

    return report_command(run_dir)
