"""Invoke tasks: the verl integration test of a Megatron-Bridge model provider, one task per intent.

Settings: flag > environment (BRIDGE_REPO, VERL_REPO, MODEL_ID, ...) > invoke.yaml > default.
Level exit codes: 0 Pass, 1 Fail, 3 Blocked, 2 bad invocation.
"""

from invoke import task

from env.protocol.cli import install_parse_error_exit_code, one_line_errors
from sessions.run.level import make_level_task

install_parse_error_exit_code()

# One task per coverage level; they differ only by their preset row and flags (env/presets.py, sessions/run/level.py).
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
        "timings": "show each check's wall time and each probe's",
        "fresh_probe": "ignore the probe cache in $LOG_DIR (probe the environment again)",
    }
)
@one_line_errors
def doctor(c, bridge_repo=None, verl_repo=None, ray_address=None, num_gpus=None, level=0, json=False, timings=False,
           fresh_probe=False):
    """Run every preflight check as a ✔/✘ table, without starting verl."""
    from sessions.run.level import doctor_command

    return doctor_command(
        c, dict(bridge_repo=bridge_repo, verl_repo=verl_repo, ray_address=ray_address, num_gpus=num_gpus),
        level=int(level), as_json=json, timings=timings, fresh_probe=fresh_probe,
    )


@task(
    help={
        "log": "a verl log file (any, also logs not made by this tool)",
        "level": "also apply this level's criteria (each Pass / Fail / not shown); without it: the run alone",
        "steps": "expected training steps (default: from the log)",
        "exit_code": "the wrapper's exit code, when known",
        "json": "print the verdict as JSON",
        "bridge_repo": "with --level: the Bridge checkout the run should have imported (default BRIDGE_REPO)",
    }
)
@one_line_errors
def judge(c, log, level=None, steps=None, exit_code=None, json=False, bridge_repo=None):
    """Judge a verl log: the run's Pass / Fail / Blocked (category, first error, hint); with --level, the level's."""
    from sessions.judge.verdict import judge_command

    return judge_command(
        log,
        level=None if level is None else int(level),
        steps=None if steps is None else int(steps),
        exit_code=None if exit_code is None else int(exit_code),
        as_json=json,
        bridge_repo=bridge_repo,
    )


@task(help={"run_dir": "a run directory written by a level task"})
@one_line_errors
def report(c, run_dir):
    """Re-render a run's summary (summary.md/json, junit.xml) from what its run directory holds."""
    from sessions.run.level import report_command

    return report_command(run_dir)


@task(
    auto_shortflags=False,
    help={
        "host": "GPU host as ssh takes it: [user@]host[:port] or an ~/.ssh/config alias (ProxyJump honoured)",
        "remote_root": "remote folder holding the three checkouts (default ~/verl-e2e)",
        "bridge_path": "remote Megatron-Bridge checkout (default <remote-root>/Megatron-Bridge)",
        "verl_path": "remote verl checkout (default <remote-root>/verl)",
        "tool_path": "remote copy of this project (default <remote-root>/verl-bridge-e2e)",
        "sync_only": "sync the trees and stop; run nothing",
        "force": "overwrite files edited on the remote since our last sync, keeping them as *.remote-backup-*",
        "checkout": "move a remote checkout that is clean (but for our own synced files) to the local commit",
        "dry_run": "print the sync plan and the remote command; write and run nothing",
        "ssh_config": "ssh config file for Fabric and rsync alike (VERL_E2E_SSH_CONFIG; default: ssh's own)",
        "remote_python": "Python with invoke on the host (VERL_E2E_REMOTE_PYTHON; default: a .venv made there)",
    }
)
@one_line_errors
def remote(c, host, remote_root=None, bridge_path=None, verl_path=None, tool_path=None, sync_only=False,
           force=False, checkout=False, dry_run=False, ssh_config=None, remote_python=None):
    """Sync the exact local changes of Bridge, verl and this project to a GPU host, run the task there.

    Usage: invoke remote --host gpu01 level1 --model ORG/NAME [-- hydra overrides]. Streams the output, exits
    with the task's code (3 when the host cannot be reached), and copies the run directory into the local LOG_DIR.
    """
    from env.launchers.base import TaskLine
    from env.launchers.remote import RemoteLauncher
    from env.protocol.cli import forwarded_args, task_remainder

    forwarded = forwarded_args("remote")
    line = TaskLine.parse(forwarded, task_remainder(c), launcher="remote") if forwarded else None
    return RemoteLauncher(
        host, line, remote_root=remote_root, bridge_path=bridge_path, verl_path=verl_path, tool_path=tool_path,
        sync_only=sync_only, force=force, checkout=checkout, ssh_config=ssh_config, remote_python=remote_python,
    ).launch(dry_run=dry_run)


@task(
    help={
        "image": "container image: a tag (VERL_IMAGE; default a vLLM-flavoured verlai/verl tag) or an Enroot/SquashFS "
                 "file (.sqsh); recorded in the run",
        "image_source": "with an image file: the verlai/verl tag it was converted/mirrored from (VERL_IMAGE_SOURCE); "
                        "shown next to the file in the report",
        "partition": "Slurm partition (default: the site's; SLURM_PARTITION/SBATCH_PARTITION also work)",
        "gpus": "GPUs for the step (srun --gpus)",
        "gpus_per_node": "GPUs per node (--gpus-per-node; with --nodes: trainer.n_gpus_per_node, NUM_GPUS = N×G)",
        "nodes": "nodes: > 1 makes one Ray cluster across the allocation, the task on its head (trainer.nnodes)",
        "cpus": "CPUs for the step (--cpus-per-task; verl's Ray needs ~10 or more)",
        "time": "time limit (MIN, HH:MM:SS or D-HH:MM)",
        "jobid": "run the step inside this existing allocation (srun --jobid=J --overlap); with --detach, "
                 "backgrounded here and recorded as J.<step>",
        "ray_port": "with --nodes: the Ray head's port (default 6379)",
        "stage": "download-model and prep-data once first, in the same container (offline compute nodes); recorded",
        "srun_args": "site options, passed untouched to srun (and to sbatch with --detach), e.g. \"-A acct --qos=q\"",
        "mounts": "extra container mounts SRC[:DST[:FLAGS]],... (checkouts, project, data, models, logs are mounted)",
        "no_container": "run the task on the node with this project's Python instead of a pyxis container",
        "detach": "submit a batch job (sbatch) holding the same step; print job id, log path and how to follow it",
        "dry_run": "print the srun step (and batch script with --detach); submit nothing",
        "allow_local_logs": "accept a node-local LOG_DIR (/tmp ...): only on a single-node test cluster",
    },
    auto_shortflags=False,
)
@one_line_errors
def slurm(c, image=None, image_source=None, partition=None, gpus=None, gpus_per_node=None, nodes=None, cpus=None,
          time=None, jobid=None, ray_port=None, stage=False, srun_args="", mounts="", no_container=False,
          detach=False, dry_run=False, allow_local_logs=False):
    """Run a task (level0 ... level5, plan, prep-data, ...) in Slurm, in the verl container (pyxis).

    Usage: invoke slurm [flags] level0 --model ORG/NAME [-- hydra overrides]. Inside the step the task runs via
    `nox -s verl -- <task>` so setup and run share one container. Attached: exits with the task's code.
    `--jobid J`: a step in an existing allocation. `--nodes N --gpus-per-node G`: one Ray cluster over N nodes.
    """
    from env.launchers.base import TaskLine
    from env.launchers.slurm import NOT_FORWARDABLE, SlurmOptions, slurm_command
    from env.protocol.cli import forwarded_args, task_remainder
    from env.settings import UsageError

    line = TaskLine.parse(forwarded_args("slurm"), task_remainder(c), launcher="slurm",
                          not_forwardable=NOT_FORWARDABLE)
    try:
        numbers = {k: None if v is None else int(v)
                   for k, v in (("gpus", gpus), ("cpus", cpus), ("nodes", nodes), ("gpus_per_node", gpus_per_node))}
        port = 6379 if ray_port is None else int(ray_port)
    except ValueError as e:
        raise UsageError(f"bad value: {e}") from None
    return slurm_command(SlurmOptions(
        task_line=line.tokens, image=image, image_source=image_source, partition=partition, time=time,
        jobid=None if jobid is None else str(jobid), ray_port=port, stage=stage, srun_args=srun_args or "",
        mounts=mounts or "", no_container=no_container, detach=detach, dry_run=dry_run,
        allow_local_logs=allow_local_logs, **numbers), config=c.config)


@task(
    help={
        "job": "Slurm job id printed by `invoke slurm --detach` (J, or J.S for a step in an existing allocation)",
        "log_dir": "LOG_DIR the job was submitted with (default: LOG_DIR / invoke.yaml / ./verl_e2e_logs)",
        "json": "print the state as JSON",
    },
    auto_shortflags=False,
)
@one_line_errors
def slurm_status(c, job, log_dir=None, json=False):
    """State of a detached job: squeue/sacct/scontrol, else the job's own exit file and run directory summary.

    Exit 0 while it runs; once finished, the task's exit code (0 Pass, 1 Fail, 3 Blocked).
    """
    from pathlib import Path

    from env.launchers.slurm_status import status_command
    from env.settings import config_section, resolve

    settings = resolve({"log_dir": log_dir}, None, config_section(c.config))
    return status_command(str(job), Path(settings.log_dir), as_json=json)


@task(
    help={
        "job": "Slurm job id printed by `invoke slurm --detach` (J, or J.S for a step in an existing allocation)",
        "log_dir": "LOG_DIR the job was submitted with (default: LOG_DIR / invoke.yaml / ./verl_e2e_logs)",
        "follow": "keep printing until the job has finished; then exit with the task's code",
    },
    auto_shortflags=False,
)
@one_line_errors
def slurm_logs(c, job, log_dir=None, follow=False):
    """Print a detached job's log (from $LOG_DIR/slurm/), optionally following it to the end."""
    from pathlib import Path

    from env.launchers.slurm_status import logs_command
    from env.settings import config_section, resolve

    settings = resolve({"log_dir": log_dir}, None, config_section(c.config))
    return logs_command(str(job), Path(settings.log_dir), follow=follow)


@task(
    auto_shortflags=False,
    help={
        "base": "compare with this ref (default: upstream/main, else origin/main, else what main tracks, else main)",
        "run": "run the recommended levels in order (Level 0 first) and write one combined report",
        "model": "HF model id ORG/NAME for every level (default: MODEL_ID if set, else each level's proposal)",
        "keep_going": "with --run: go on after a level that is not Pass (default: stop, later levels Skipped)",
        "json": "print the recommendation (or, with --run, the combined summary) as JSON",
        "dry_run": "with --run: show each level's exact environment and command (its own --dry-run); run nothing",
        "bridge_repo": "Megatron-Bridge checkout whose change is planned (BRIDGE_REPO)",
        "verl_repo": "verl checkout: the plan reads the Bridge names verl imports and calls; passed to each level "
                     "(VERL_REPO)",
        "log_dir": "where the plan and level run directories go (LOG_DIR)",
        "num_gpus": "GPUs for the runs, passed to each level (NUM_GPUS)",
        "model_path": "local HF checkpoint, passed to each level (MODEL_PATH)",
        "skip_bridge_checks": "passed to each level: do not require Bridge-side checks",
        "bridge_tests": "passed to each level: extra model-specific Bridge test paths, comma separated",
        "allow_missing": "passed to each level: run the Bridge checks even if a targeted path is missing",
        "no_reward_model": "passed to each level: GSM8K rule reward instead of the reward model (a Limitation)",
        "enforce_eager": "passed to each level: vLLM enforce_eager=True (a Limitation)",
        "dummy_config": "passed to each level: minimal HF config JSON for the dummy-model path",
        "verbose": "passed to each level: stream the whole verl log, not a status line (VERL_E2E_VERBOSE=1)",
    },
)
@one_line_errors
def plan(c, base=None, run=False, model=None, keep_going=False, json=False, dry_run=False, bridge_repo=None,
         verl_repo=None, log_dir=None, num_gpus=None, model_path=None, skip_bridge_checks=False, bridge_tests=None,
         allow_missing=False, no_reward_model=False, enforce_eager=False, dummy_config=None, verbose=False):
    """Recommend the coverage levels the Bridge change justifies (with the rule and files behind each); --run runs them.

    The change: committed since the merge-base with --base, plus uncommitted and untracked files. A level counts
    only for changed Bridge code verl reaches (read from the verl checkout), each with its rule, changed function
    and path from verl. Also names the provider family touched and its smallest public checkpoint (or the
    dummy-model path). Extra Hydra overrides
    after `--` go to every level. With --run, exit 0 Pass, 1 Fail, 3 Blocked (the combined result).
    """
    from sessions.plan.planner import plan_command

    flags = dict(model=model, bridge_repo=bridge_repo, verl_repo=verl_repo, log_dir=log_dir, num_gpus=num_gpus,
                 model_path=model_path, skip_bridge_checks=skip_bridge_checks, bridge_tests=bridge_tests,
                 allow_missing=allow_missing, no_reward_model=no_reward_model, enforce_eager=enforce_eager,
                 dummy_config=dummy_config, verbose=verbose)
    return plan_command(c, flags, base=base, run=run, keep_going=keep_going, as_json=json, dry_run=dry_run)


@task(
    auto_shortflags=False,
    iterable=["on"],
    help={
        "good": "a commit where the level passes (required)",
        "bad": "a commit where it does not (default HEAD)",
        "repo": "the checkout to bisect: bridge (BRIDGE_REPO, default) or verl (VERL_REPO)",
        "max_steps": "at most this many level runs (reused verdicts are free); then report the range that remains",
        "on": "FAIL-CATEGORY=bad|skip, repeatable (default: bad for provider, checkpoint, nan-metrics, bridge-checks;"
              " skip for oom, nccl, timeout, ...)",
        "stash": "stash uncommitted changes first (restored at the end) instead of refusing a dirty checkout",
    },
)
@one_line_errors
def bisect(c, good=None, bad=None, repo="bridge", max_steps=None, on=None, stash=False):
    """Find the first commit that breaks a level: git bisect, judged by the level itself at each commit.

    Usage: invoke bisect --good REF [--bad REF] [--repo bridge|verl] [--max-steps N] [--on CAT=bad|skip] [--stash]
    level<N> [its flags] [-- hydra overrides]. Pass marks good, Blocked skip, Fail bad or skip by category. A level
    judged Pass or Fail at a commit with the same settings is reused from its run directory (delete it to rerun).
    The branch, commit, submodules and stash are restored on success, failure and Ctrl-C. Report in
    $LOG_DIR/<utc>-bisect-level<N>-<model>/. Exit 0 found, 3 ambiguous or stopped (candidates listed), 2 bad usage.
    """
    from env.protocol.cli import forwarded_args, task_remainder
    from sessions.bisect.driver import bisect_command

    return bisect_command(c, good=good, bad=bad, repo=repo, max_steps=max_steps, on=on, stash=stash,
                          task_line=forwarded_args("bisect"), remainder=task_remainder(c))


@task(
    help={
        "local_dataset_path": "local copy of openai/gsm8k (must exist; GSM8K_SOURCE_DIR: used if it exists, else the hub)",
        "out": "output folder for train.parquet / test.parquet (GSM8K_DIR, default ~/data/gsm8k)",
        "verl_repo": "verl checkout whose examples/data_preprocess/gsm8k.py runs (VERL_REPO)",
        "python": "Python that runs verl's script (VERL_PYTHON; default python3)",
        "dry_run": "print the command, run nothing",
    }
)
@one_line_errors
def prep_data(c, local_dataset_path=None, out=None, verl_repo=None, python=None, dry_run=False):
    """GSM8K parquet via verl's own preprocessing script, validated with pyarrow; does nothing when valid files exist."""
    from data.gsm8k import prep_data_command

    return prep_data_command(c, dict(gsm8k_source=local_dataset_path, gsm8k_dir=out, verl_repo=verl_repo,
                                     python=python), dry_run=dry_run)


@task(
    help={
        "model": "HF repo ORG/NAME (default MODEL_ID; with --reward-model the wrapper's reward model)",
        "scratch": "scratch root (SCRATCH_DIR): the model goes to DIR/ORG/NAME, HF_HOME to DIR/.hf_home",
        "revision": "branch, tag or commit (default: main)",
        "local_dir": "exact target folder instead of DIR/ORG/NAME",
        "reward_model": "download the reward model (prints RM_MODEL_PATH=...)",
        "hf_home": "HF_HOME to use (HF_HUB_CACHE = HF_HOME/hub)",
        "dry_run": "print where it would go, download nothing",
    },
    auto_shortflags=False,  # -h would read as --hf-home
)
@one_line_errors
def download_model(c, model=None, scratch=None, revision=None, local_dir=None, reward_model=False, hf_home=None,
                   dry_run=False):
    """Snapshot a Hugging Face model to scratch (idempotent) and print MODEL_PATH=... (exit 2 unknown repo, 1 other)."""
    import os

    from data.models import download_command
    from env.settings import config_section, resolve

    settings = resolve(dict(scratch=scratch, hf_home=hf_home), os.environ, config_section(c.config))
    return download_command(settings, model, reward_model, revision, local_dir, dry_run)


@task(
    help={
        "python": "Python to install into (VERL_PYTHON; default python3: the image's own)",
        "index_url": "extra package index serving nvidia-modelopt (MODELOPT_INDEX_URL, default NVIDIA's)",
        "log_dir": "where the container-setup record goes (LOG_DIR)",
        "dry_run": "print the pip commands, run nothing",
    }
)
@one_line_errors
def install_modelopt(c, python=None, index_url=None, log_dir=None, dry_run=False):
    """`pip show nvidia-modelopt`, else install it from the extra index; recorded as container-setup evidence."""
    import os

    from env.preflight.modelopt import install_command
    from env.settings import config_section, resolve

    settings = resolve(dict(python=python, modelopt_index_url=index_url, log_dir=log_dir), os.environ,
                       config_section(c.config))
    return install_command(settings, dry_run=dry_run)
