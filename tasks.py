"""Invoke tasks: the verl integration test of a Megatron-Bridge model provider, one task per intent.

Settings: flag > environment (BRIDGE_REPO, VERL_REPO, MODEL_ID, ...) > invoke.yaml > default.
Each task's flags are one table (env/protocol/flags.py: type, range, choices, conflicts), validated before the body
runs. Exit codes (env/protocol/exits.py): 0 Pass/found, 1 Fail, 2 bad usage, 3 Blocked, 130 interrupted.
"""

from env.protocol.invoke_parse_hook import install as _install_invoke_hooks

_install_invoke_hooks()  # first: Ctrl-C while the rest loads is `interrupted`, exit 130

from env.protocol.flags import Flag, FlagTable, declare  # noqa: E402
from sessions.run.level_task import make_level_task  # noqa: E402

# One task per coverage level; they differ only by their preset row and flags (env/presets.py, sessions/run/level.py).
level0 = make_level_task(0)
level1 = make_level_task(1)
level2 = make_level_task(2)
level3 = make_level_task(3)
level4 = make_level_task(4)
level5 = make_level_task(5)

LEVEL_NUMBERS = tuple(str(n) for n in range(6))
JSON = Flag("json", False, "print it as JSON")


DOCTOR = FlagTable((
    Flag("bridge_repo", None, "Megatron-Bridge checkout (BRIDGE_REPO)", kind="path"),
    Flag("verl_repo", None, "verl checkout (VERL_REPO)", kind="path"),
    Flag("ray_address", None, "also probe this Ray cluster's workers (RAY_ADDRESS)", nonempty=True),
    Flag("num_gpus", None, "GPUs to plan for (NUM_GPUS; default: detected)", kind="int", minimum=0),
    Flag("level", 0, "check against this level's preset (default 0)", kind="int", minimum=0, maximum=5),
    Flag("json", False, "print the checks as JSON"),
    Flag("timings", False, "show each check's wall time and each probe's"),
    Flag("fresh_probe", False, "ignore the probe cache in $LOG_DIR (probe the environment again)"),
), conflicts=(("json", "timings"),), why={("json", "timings"): "the JSON holds each check's duration_s"})


@declare(DOCTOR, auto_shortflags=True)
def doctor(c, bridge_repo, verl_repo, ray_address, num_gpus, level, json, timings, fresh_probe):
    """Run every preflight check as a ✔/✘ table, without starting verl."""
    from sessions.run.level import doctor_command

    return doctor_command(
        c, dict(bridge_repo=bridge_repo, verl_repo=verl_repo, ray_address=ray_address, num_gpus=num_gpus),
        level=level, as_json=json, timings=timings, fresh_probe=fresh_probe,
    )


JUDGE = FlagTable((
    Flag("log", None, "a verl log file (any, also logs not made by this tool)", kind="path", required=True),
    Flag("level", None, "also apply this level's criteria (each Pass / Fail / not shown); without it: the run alone",
         kind="int", minimum=0, maximum=5),
    Flag("steps", None, "expected training steps (default: from the log)", kind="int", minimum=1, maximum=1_000_000),
    Flag("exit_code", None, "the wrapper's exit code, when known", kind="int", minimum=-128, maximum=255),
    Flag("json", False, "print the verdict as JSON"),
    Flag("bridge_repo", None, "with --level: the Bridge checkout the run should have imported (default BRIDGE_REPO)",
         kind="path"),
), requires=(("bridge_repo", "level"),), why={("bridge_repo", "level"): "only a level's criteria use the checkout"})


@declare(JUDGE, auto_shortflags=True)
def judge(c, log, level, steps, exit_code, json, bridge_repo):
    """Judge a verl log: the run's Pass / Fail / Blocked (category, first error, hint); with --level, the level's."""
    from sessions.judge.verdict import judge_command

    return judge_command(log, level=level, steps=steps, exit_code=exit_code, as_json=json, bridge_repo=bridge_repo)


REPORT = FlagTable((Flag("run_dir", None, "a run directory written by a level task", kind="path", required=True),))


@declare(REPORT, auto_shortflags=True)
def report(c, run_dir):
    """Re-render a run's summary (summary.md/json, junit.xml) from what its run directory holds."""
    from sessions.run.record import report_command

    return report_command(run_dir)


REMOTE = FlagTable((
    Flag("host", None, "GPU host as ssh takes it: [user@]host[:port] or an ~/.ssh/config alias (ProxyJump honoured)",
         required=True),
    Flag("remote_root", None, "remote folder holding the three checkouts (default ~/verl-e2e)", nonempty=True),
    Flag("bridge_path", None, "remote Megatron-Bridge checkout (default <remote-root>/Megatron-Bridge)", nonempty=True),
    Flag("verl_path", None, "remote verl checkout (default <remote-root>/verl)", nonempty=True),
    Flag("tool_path", None, "remote copy of this project (default <remote-root>/verl-bridge-e2e)", nonempty=True),
    Flag("sync_only", False, "sync the trees and stop; run nothing"),
    Flag("force", False, "overwrite files edited on the remote since our last sync, keeping them as *.remote-backup-*"),
    Flag("checkout", False, "move a remote checkout that is clean (but for our own synced files) to the local commit"),
    Flag("dry_run", False, "print the sync plan and the remote command; write and run nothing"),
    Flag("ssh_config", None, "ssh config file for Fabric and rsync alike (VERL_E2E_SSH_CONFIG; default: ssh's own)",
         kind="path"),
    Flag("remote_python", None, "Python with invoke on the host (VERL_E2E_REMOTE_PYTHON; default: a .venv made there)",
         nonempty=True),
), conflicts=(("sync_only", "dry_run"),), why={("sync_only", "dry_run"): "--dry-run already syncs nothing"})


@declare(REMOTE)
def remote(c, host, remote_root, bridge_path, verl_path, tool_path, sync_only, force, checkout, dry_run, ssh_config,
           remote_python):
    """Sync the exact local changes of Bridge, verl and this project to a GPU host, run the task there.

    Usage: invoke remote --host gpu01 level1 --model ORG/NAME [-- hydra overrides]. Streams the output, exits
    with the task's code (3 when the host cannot be reached), and copies the run directory into the local LOG_DIR.
    """
    from env.launchers.base import TaskLine
    from env.launchers.remote import RemoteLauncher
    from env.protocol.cli import forwarded_args, task_remainder
    from env.settings import UsageError

    forwarded = forwarded_args(c, "remote")
    if sync_only and forwarded:
        raise UsageError(f"--sync-only runs nothing: drop the task line ({' '.join(forwarded)}) or --sync-only")
    line = TaskLine.parse(forwarded, task_remainder(c), launcher="remote") if forwarded else None
    return RemoteLauncher(
        host, line, remote_root=remote_root, bridge_path=bridge_path, verl_path=verl_path, tool_path=tool_path,
        sync_only=sync_only, force=force, checkout=checkout, ssh_config=ssh_config, remote_python=remote_python,
    ).launch(dry_run=dry_run)


SLURM = FlagTable((
    Flag("image", None, "container image: a tag (VERL_IMAGE; default a vLLM-flavoured verlai/verl tag) or an "
         "Enroot/SquashFS file (.sqsh); recorded in the run", nonempty=True),
    Flag("image_source", None, "with an image file: the verlai/verl tag it was converted/mirrored from "
         "(VERL_IMAGE_SOURCE); shown next to the file in the report", nonempty=True),
    Flag("partition", None, "Slurm partition (default: the site's; SLURM_PARTITION/SBATCH_PARTITION also work)",
         nonempty=True),
    Flag("gpus", None, "GPUs for the step (srun --gpus)", kind="int", minimum=0),
    Flag("gpus_per_node", None, "GPUs per node (--gpus-per-node; with --nodes: trainer.n_gpus_per_node, "
         "NUM_GPUS = N×G)", kind="int", minimum=1),
    Flag("nodes", None, "nodes: > 1 makes one Ray cluster across the allocation, the task on its head "
         "(trainer.nnodes)", kind="int", minimum=1),
    Flag("cpus", None, "CPUs for the step (--cpus-per-task; verl's Ray needs ~10 or more)", kind="int", minimum=1),
    Flag("time", None, "time limit (MIN, HH:MM:SS or D-HH:MM)", nonempty=True),
    Flag("jobid", None, "run the step inside this existing allocation (srun --jobid=J --overlap); with --detach, "
         "backgrounded here and recorded as J.<step>", nonempty=True),
    Flag("ray_port", None, "with --nodes: the Ray head's port (default 6379)", kind="int", minimum=1, maximum=65535),
    Flag("stage", False, "download-model and prep-data once first, in the same container (offline compute nodes); "
         "recorded"),
    Flag("srun_args", "", "site options, passed untouched to srun (and to sbatch with --detach), e.g. \"-A acct --qos=q\""),
    Flag("mounts", "", "extra container mounts SRC[:DST[:FLAGS]],... (checkouts, project, data, models, logs are mounted)"),
    Flag("no_container", False, "run the task on the node with this project's Python instead of a pyxis container"),
    Flag("detach", False, "submit a batch job (sbatch) holding the same step; print job id, log path and how to follow it"),
    Flag("dry_run", False, "print the srun step (and batch script with --detach); submit nothing"),
    Flag("allow_local_logs", False, "accept a node-local LOG_DIR (/tmp ...): only on a single-node test cluster"),
), conflicts=(("no_container", "image"), ("no_container", "image_source")),
   why={("no_container", "image"): "--no-container uses no image", ("no_container", "image_source"): "--no-container uses no image"})


@declare(SLURM)
def slurm(c, image, image_source, partition, gpus, gpus_per_node, nodes, cpus, time, jobid, ray_port, stage, srun_args,
          mounts, no_container, detach, dry_run, allow_local_logs):
    """Run a task (level0 ... level5, plan, prep-data, ...) in Slurm, in the verl container (pyxis).

    Usage: invoke slurm [flags] level0 --model ORG/NAME [-- hydra overrides]. Inside the step the task runs via
    `nox -s verl -- <task>` so setup and run share one container. Attached: exits with the task's code.
    `--jobid J`: a step in an existing allocation. `--nodes N --gpus-per-node G`: one Ray cluster over N nodes.
    """
    from env.launchers.base import TaskLine
    from env.launchers.slurm import NOT_FORWARDABLE, SlurmOptions, slurm_command
    from env.protocol.cli import forwarded_args, task_remainder

    line = TaskLine.parse(forwarded_args(c, "slurm"), task_remainder(c), launcher="slurm",
                          not_forwardable=NOT_FORWARDABLE)
    numbers = {"nodes": nodes, "gpus_per_node": gpus_per_node}
    port = 6379 if ray_port is None else ray_port
    return slurm_command(SlurmOptions(
        task_line=line.tokens, image=image, image_source=image_source, partition=partition, time=time,
        jobid=None if jobid is None else str(jobid), ray_port=port, stage=stage, srun_args=srun_args or "",
        mounts=mounts or "", no_container=no_container, detach=detach, dry_run=dry_run,
        allow_local_logs=allow_local_logs, gpus=gpus, cpus=cpus, **numbers), config=c.config)


# A detached job's two flags, shared by slurm-status and slurm-logs.
SLURM_JOB = (
    Flag("job", None, "Slurm job id printed by `invoke slurm --detach` (J, or J.S for a step in an existing allocation)", required=True),
    Flag("log_dir", None, "LOG_DIR the job was submitted with (default: LOG_DIR / invoke.yaml / ./verl_e2e_logs)",
         kind="path"),
)
SLURM_STATUS = FlagTable((
    *SLURM_JOB,
    Flag("json", False, "print the state as JSON"),
))


@declare(SLURM_STATUS)
def slurm_status(c, job, log_dir, json):
    """State of a detached job: squeue/sacct/scontrol, else the job's own exit file and run directory summary.

    Exit 0 while it runs; once finished, the task's exit code (0 Pass, 1 Fail, 3 Blocked).
    """
    from pathlib import Path

    from env.launchers.slurm_status import status_command
    from env.settings import config_section, resolve

    settings = resolve({"log_dir": log_dir}, None, config_section(c.config))
    return status_command(str(job), Path(settings.log_dir), as_json=json)


SLURM_LOGS = FlagTable((
    *SLURM_JOB,
    Flag("follow", False, "keep printing until the job has finished; then exit with the task's code"),
))


@declare(SLURM_LOGS)
def slurm_logs(c, job, log_dir, follow):
    """Print a detached job's log (from $LOG_DIR/slurm/), optionally following it to the end."""
    from pathlib import Path

    from env.launchers.slurm_status import logs_command
    from env.settings import config_section, resolve

    settings = resolve({"log_dir": log_dir}, None, config_section(c.config))
    return logs_command(str(job), Path(settings.log_dir), follow=follow)


def _plan_table() -> FlagTable:
    from sessions.run.level_task import LEVEL_FLAGS

    forwarded = tuple(Flag(f.name, f.default, f"passed to each level: {f.help}", kind=f.kind, minimum=f.minimum,
                           maximum=f.maximum, choices=f.choices, nonempty=f.nonempty, forward=True)
                      for f in LEVEL_FLAGS if f.forward)
    return FlagTable((
        Flag("base", None, "compare with this ref (default: upstream/main, else origin/main, else what main tracks, "
                           "else main)", nonempty=True),
        Flag("run", False, "run the recommended levels in order (Level 0 first) and write one combined report"),
        Flag("model", None, "HF model id ORG/NAME for every level (default: MODEL_ID if set, else each level's "
                            "proposal)", kind="model"),
        Flag("keep_going", False, "with --run: go on after a level that is not Pass (default: stop, later levels "
                                  "Skipped)"),
        Flag("json", False, "print the recommendation (or, with --run, the combined summary) as JSON"),
        Flag("dry_run", False, "with --run: show each level's exact environment and command (its own --dry-run); "
                               "run nothing"),
        *forwarded,
    ), requires=(("dry_run", "run"), ("keep_going", "run")),
        conflicts=(("dry_run", "keep_going"), ("skip_bridge_checks", "bridge_tests"),
                   ("skip_bridge_checks", "allow_missing")),
        why={("dry_run", "run"): "without --run nothing runs anyway (add --run to see each level's command)",
             ("keep_going", "run"): "it says what --run does after a level that is not Pass",
             ("dry_run", "keep_going"): "a dry run stops at nothing",
             ("skip_bridge_checks", "bridge_tests"): "the Bridge checks would not run",
             ("skip_bridge_checks", "allow_missing"): "the Bridge checks would not run"})


PLAN = _plan_table()


@declare(PLAN)
def plan(c, **flags):
    """Recommend the coverage levels the Bridge change justifies (with the rule and files behind each); --run runs them.

    The change: committed since the merge-base with --base, plus uncommitted and untracked files. A level counts
    only for changed Bridge code verl reaches (read from the verl checkout), each with its rule, changed function
    and path from verl. Also names the provider family touched and its smallest public checkpoint (or the
    dummy-model path). Extra Hydra overrides
    after `--` go to every level. With --run, exit 0 Pass, 1 Fail, 3 Blocked (the combined result).
    """
    from sessions.plan.planner import plan_command

    own = {k: flags.pop(k) for k in ("base", "run", "keep_going", "json", "dry_run")}
    return plan_command(c, flags, base=own["base"], run=own["run"], keep_going=own["keep_going"], as_json=own["json"],
                        dry_run=own["dry_run"])


BISECT = FlagTable((
    Flag("good", None, "a commit where the level passes (required)", nonempty=True),
    Flag("bad", None, "a commit where it does not (default HEAD)", nonempty=True),
    Flag("repo", "bridge", "the checkout to bisect: bridge (BRIDGE_REPO, default) or verl (VERL_REPO)", kind="choice",
         choices=("bridge", "verl")),
    Flag("max_steps", None, "at most this many level runs (reused verdicts are free); then report the range that remains",
         kind="int", minimum=1),
    Flag("on", None, "FAIL-CATEGORY=bad|skip, repeatable (default: bad for provider, checkpoint, nan-metrics, "
                     "bridge-checks; skip for oom, nccl, timeout, ...)", kind="list"),
    Flag("stash", False, "stash uncommitted changes first (restored at the end) instead of refusing a dirty checkout"),
))


@declare(BISECT)
def bisect(c, good, bad, repo, max_steps, on, stash):
    """Find the first commit that breaks a level: git bisect, judged by the level itself at each commit.

    Usage: invoke bisect --good REF [--bad REF] [--repo bridge|verl] [--max-steps N] [--on CAT=bad|skip] [--stash]
    level<N> [its flags] [-- hydra overrides]. Pass marks good, Blocked skip, Fail bad or skip by category. A level
    judged Pass or Fail at a commit with the same settings is reused from its run directory (delete it to rerun).
    The branch, commit, submodules and stash are restored on success, failure and Ctrl-C. Report in
    $LOG_DIR/<utc>-bisect-level<N>-<model>/. Exit 0 found, 3 ambiguous or stopped (candidates listed), 2 bad usage.
    """
    from env.protocol.cli import forwarded_args, task_remainder
    from sessions.bisect.driver import bisect_command

    return bisect_command(c, good=good, bad=bad, repo=repo, max_steps=max_steps, on=on or None, stash=stash,
                          task_line=forwarded_args(c, "bisect"), remainder=task_remainder(c))


PREP_DATA = FlagTable((
    Flag("local_dataset_path", None, "local copy of openai/gsm8k (must exist; GSM8K_SOURCE_DIR: used if it exists, "
                                     "else the hub)", kind="path"),
    Flag("out", None, "output folder for train.parquet / test.parquet (GSM8K_DIR, default ~/data/gsm8k)", kind="path"),
    Flag("verl_repo", None, "verl checkout whose examples/data_preprocess/gsm8k.py runs (VERL_REPO)", kind="path"),
    Flag("python", None, "Python that runs verl's script (VERL_PYTHON; default python3)", nonempty=True),
    Flag("dry_run", False, "print the command, run nothing"),
))


@declare(PREP_DATA, auto_shortflags=True)
def prep_data(c, local_dataset_path, out, verl_repo, python, dry_run):
    """GSM8K parquet via verl's own preprocessing script, validated with pyarrow; does nothing when valid files exist."""
    from data.gsm8k import prep_data_command

    return prep_data_command(c, dict(gsm8k_source=local_dataset_path, gsm8k_dir=out, verl_repo=verl_repo,
                                     python=python), dry_run=dry_run)


DOWNLOAD_MODEL = FlagTable((
    Flag("model", None, "HF repo ORG/NAME (default MODEL_ID; with --reward-model the wrapper's reward model)",
         kind="model"),
    Flag("scratch", None, "scratch root (SCRATCH_DIR): the model goes to DIR/ORG/NAME, HF_HOME to DIR/.hf_home",
         kind="path"),
    Flag("revision", None, "branch, tag or commit (default: main)", nonempty=True),
    Flag("local_dir", None, "exact target folder instead of DIR/ORG/NAME", kind="path"),
    Flag("reward_model", False, "download the reward model (prints RM_MODEL_PATH=...)"),
    Flag("hf_home", None, "HF_HOME to use (HF_HUB_CACHE = HF_HOME/hub)", kind="path"),
    Flag("dry_run", False, "print where it would go, download nothing"),
))


@declare(DOWNLOAD_MODEL)  # no short flags: -h would read as --hf-home
def download_model(c, model, scratch, revision, local_dir, reward_model, hf_home, dry_run):
    """Snapshot a Hugging Face model to scratch (idempotent) and print MODEL_PATH=... (exit 2 unknown repo, 1 other)."""
    import os

    from data.models import download_command
    from env.settings import config_section, resolve

    settings = resolve(dict(scratch=scratch, hf_home=hf_home), os.environ, config_section(c.config))
    return download_command(settings, model, reward_model, revision, local_dir, dry_run)


INSTALL_MODELOPT = FlagTable((
    Flag("python", None, "Python to install into (VERL_PYTHON; default python3: the image's own)", nonempty=True),
    Flag("index_url", None, "extra package index serving nvidia-modelopt (MODELOPT_INDEX_URL, default NVIDIA's)",
         nonempty=True),
    Flag("find_links", None, "offline: a folder of wheels (nvidia-modelopt, pulp); pip runs with --no-index "
         "--find-links DIR", kind="path"),
    Flag("log_dir", None, "where the container-setup record goes (LOG_DIR)", kind="path"),
    Flag("dry_run", False, "print the pip commands, run nothing"),
))


@declare(INSTALL_MODELOPT, auto_shortflags=True)
def install_modelopt(c, python, index_url, find_links, log_dir, dry_run):
    """`pip show nvidia-modelopt`, else install it from the extra index or, offline, a wheel folder (--find-links);
    recorded as container-setup evidence naming where each package came from."""
    import os

    from env.preflight.modelopt import install_command
    from env.settings import config_section, resolve

    settings = resolve(dict(python=python, modelopt_index_url=index_url, log_dir=log_dir), os.environ,
                       config_section(c.config))
    return install_command(settings, dry_run=dry_run, find_links=find_links)
