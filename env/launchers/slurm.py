"""`invoke slurm`: the same task in Slurm — a pyxis container step by default (SPEC "Remote and Slurm").

The run is composed as data (`SlurmPlan`, base.py's LaunchPlan) so that a dry-run prints it and tests check it
without pyxis:
- `srun` with the allocation flags (`--partition`, `--time`, `--gpus`, `--gpus-per-node`, `--cpus-per-task`), the
  site's own options (`--srun-args`, split with shlex and passed through untouched) and the pyxis flags:
  `--container-image` (the exact tag, or an Enroot/SquashFS file with its source tag, exported so they land in
  run.json/env.json), `--container-mounts` of both checkouts, this project, the data and model roots and the log
  directory — each at its own host path, so every path in settings, logs and reports means the same file inside
  and outside — and `--container-workdir` = this project;
- inside, one `bash -c` script: drop ROCR_VISIBLE_DEVICES when CUDA_VISIBLE_DEVICES is also set (and say so), export
  the resolved settings, then `nox -s verl -- <task> [args]` so setup (modelopt) and the run share one container
  step. `--no-container` runs `<this Python> -m invoke <task> [args]` on the node instead.
- `--detach` writes a batch script holding the same srun step, submits it with `sbatch` and records the job under
  `$LOG_DIR/slurm/` (job.json, the Slurm output log, the step's exit code) for `slurm-status` / `slurm-logs`.
- `--jobid J`: the same step inside an existing allocation (`srun --jobid=J --overlap`), the procedure's answer to a
  stale attach helper; attached, or with `--detach` backgrounded here (the procedure: background the launcher on
  the login node, never the workload in an attached shell) and recorded by step, `J.S`.
- `--nodes N` (N > 1): one Ray cluster across the allocation (slurm_ray.py), the task on the head.
- `--stage`: download-model and prep-data once, in the same container, before the run (offline compute nodes);
  the run then gets HF_HUB_OFFLINE=1 and the staging record (VERL_E2E_STAGING, in env.json).
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from env import presets
from env.launchers.base import Launcher, TaskLine, say
from env.launchers.slurm_run import run_attached, submit
from env.launchers.slurm_step import JOBS_SUBDIR, SlurmPlan, is_image_file, staging_lines
from env.preflight.pythonpath import compose
from env.protocol.flags import path_options
from env.settings import (
    BY_NAME,
    PROJECT_ROOT,
    SETTINGS,
    TOOL_PREFIX,
    Resolved,
    UsageError,
    config_section,
    resolve,
)

PROJECT = PROJECT_ROOT
# Node-local places: a log there can vanish with the allocation (the procedure: use a shared FS or $HOME).
NODE_LOCAL_ROOTS = ("/tmp", "/var/tmp", "/dev/shm", "/run")
# Image paths a mount must not cover (the wrapper prepends the image's own Megatron-LM).
IMAGE_PATHS = ("/workspace/Megatron-LM", "/usr", "/opt", "/etc", "/bin", "/lib")
ENGINE_MARKERS = (("sglang", re.compile(r"sgl")), ("trtllm", re.compile(r"trt-?llm|tensorrt")),
                  ("vllm", re.compile(r"vllm")))
NOT_FORWARDABLE = ("slurm", "slurm-status", "slurm-logs")
# Settings whose value is a path the task reads or writes: they are mounted and exported absolute into the step.
PATH_SETTINGS = tuple(s.name for s in SETTINGS if s.kind == "path" and s.name != "python")
JOB_ID = re.compile(r"\d+(_\d+)?")


@dataclass
class SlurmOptions:
    task_line: list[str]  # the forwarded task and its args (`level0 --model M -- overrides`)
    image: str | None = None
    image_source: str | None = None  # the tag an image *file* was made from (VERL_IMAGE_SOURCE)
    partition: str | None = None
    gpus: int | None = None
    gpus_per_node: int | None = None
    nodes: int | None = None
    cpus: int | None = None
    time: str | None = None
    srun_args: str = ""
    mounts: str = ""
    jobid: str | None = None
    ray_port: int = 6379
    stage: bool = False
    no_container: bool = False
    detach: bool = False
    dry_run: bool = False
    allow_local_logs: bool = False


def image_engine(image: str) -> str | None:
    """The rollout engine an image is built for, read from its tag (None: cannot tell)."""
    low = image.lower()
    for engine, marker in ENGINE_MARKERS:
        if marker.search(low):
            return engine
    return None


def check_image(image: str, engine: str = presets.BASE_ENV["ENGINE"]) -> list[str]:
    """Refuse an image for another rollout engine (UsageError); return warnings for images we cannot classify."""
    found = image_engine(image)
    if found is not None and found != engine:
        raise UsageError(
            f"image {image} is {found}-flavoured but the levels run ENGINE={engine}: a backend-specific image can "
            f"fail before the model is built, a bad signal for a Bridge provider change; use a vLLM-flavoured "
            f"verlai/verl tag (e.g. {BY_NAME['verl_image'].default})")
    warnings = []
    if found is None:
        warnings.append(f"cannot tell the rollout engine of image {image}; the procedure asks for a vLLM-flavoured "
                        f"verlai/verl tag (a converted/mirrored image: keep its source tag in the report)")
    if image.endswith(("latest", ".dev", "dev1", "dev2")) and "@sha256:" not in image:
        warnings.append(f"{image} is a moving tag: pin its digest (verlai/verl@sha256:...) for an exact replay")
    return warnings


def _is_under(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def node_local(path: Path) -> bool:
    roots = [Path(r) for r in NODE_LOCAL_ROOTS]
    tmpdir = os.environ.get("TMPDIR")
    if tmpdir and Path(tmpdir).resolve() != Path("/"):
        roots.append(Path(tmpdir).resolve())
    resolved = path.resolve()
    return any(_is_under(resolved, r) or _is_under(path, r) for r in roots)


def _setting_flag(name: str) -> str:
    return "--model" if name == "model_id" else "--" + name.replace("_", "-")


def task_settings(line: TaskLine, environ: dict[str, str], config: dict[str, Any]) -> Resolved:
    """The settings the forwarded task will see: its own flags > environment > invoke.yaml > default."""
    flags = {}
    for s in SETTINGS:
        values = line.flag_values(_setting_flag(s.name))
        if values:
            flags[s.name] = values[-1]
    return resolve(flags, environ, config)


def _line_path_flags(line: TaskLine) -> tuple[str, ...]:
    """The forwarded task's own path flags that are no setting (`--find-links`, `--dummy-config`, `--log`, ...): from
    its flag table, so a new path flag is mounted without a word here."""
    settings_flags = {_setting_flag(n) for n in PATH_SETTINGS}
    return tuple(o for o in path_options(line.task) if o not in settings_flags)


def _mount_sources(settings: Resolved, line: TaskLine) -> list[tuple[str, Path]]:
    """(why, host path) of everything the task reads or writes; files are mounted by their folder."""
    wanted: list[tuple[str, Path]] = [("this project", PROJECT)]
    for name in PATH_SETTINGS:
        value = settings.values.get(name)
        if value is None:
            continue
        path = Path(value)
        if name in ("train_files", "val_files", "gsm8k_source") or path.suffix in (".parquet", ".json"):
            path = path.parent
        wanted.append((name, path))
    if settings.model_path is None:  # the wrapper's default: $HOME/models/$MODEL_ID
        wanted.append(("model_path", Path.home() / "models" / settings.model_id))
    for flag in _line_path_flags(line):
        for value in line.flag_values(flag):
            path = Path(value).expanduser().absolute()
            wanted.append((flag, path.parent if path.suffix else path))
    return wanted


def parse_extra_mounts(text: str) -> list[tuple[str, str, str]]:
    """`--mounts "SRC[:DST[:FLAGS]],..."` → (src, dst, flags); DST defaults to SRC."""
    out = []
    for entry in (e.strip() for e in (text or "").split(",")):
        if not entry:
            continue
        parts = entry.split(":")
        if len(parts) > 3 or not parts[0]:
            raise UsageError(f"--mounts entry {entry!r} is not SRC[:DST[:FLAGS]]")
        src = str(Path(parts[0]).expanduser().absolute())
        dst = parts[1] if len(parts) > 1 and parts[1] else src
        if not dst.startswith("/"):
            raise UsageError(f"--mounts entry {entry!r}: the container path must be absolute")
        out.append((src, dst, parts[2] if len(parts) > 2 else ""))
    return out


def compose_mounts(wanted: list[tuple[str, Path]], extra: list[tuple[str, str, str]],
                   notes: list[str]) -> list[tuple[str, str]]:
    """Each existing path mounted at itself, nested ones folded into their parent; then the extra mounts."""
    existing = []
    for why, path in wanted:
        path = path.absolute()
        if not path.exists() and why != "log_dir":  # LOG_DIR is created before the step starts
            notes.append(f"not mounted ({why} is absent here): {path}")
            continue
        existing.append(path)
    kept: list[Path] = []
    for path in sorted(set(existing), key=lambda p: (len(p.parts), str(p))):
        if not any(_is_under(path, k) for k in kept):
            kept.append(path)
    mounts = [(str(p), str(p), "") for p in sorted(kept)] + list(extra)
    for src, dst, _ in mounts:
        for text in (src, dst):
            if "," in text or ":" in text:
                raise UsageError(f"cannot mount {text!r}: pyxis --container-mounts cannot express ',' or ':' in a "
                                 f"path; move or symlink it")
        for image_path in IMAGE_PATHS:
            if _is_under(Path(image_path), Path(dst)):
                raise UsageError(f"mount {src} → {dst} would hide the image's {image_path}; use another path")
    return [(src, dst + (f":{flags}" if flags else "")) for src, dst, flags in mounts]


def parse_site_args(text: str) -> list[str]:
    try:
        return shlex.split(text or "")
    except ValueError as e:
        raise UsageError(f"cannot parse --srun-args {text!r}: {e}") from None


def resolve_image(opts: SlurmOptions, settings: Resolved, environ: dict[str, str],
                  warnings: list[str]) -> tuple[str, str | None]:
    """(image, source tag): a registry tag as given, or an image file (must exist) with the tag it was made from."""
    image = opts.image or settings.verl_image
    if not image:
        raise UsageError("no container image: set VERL_IMAGE or --image (a vLLM-flavoured verlai/verl tag)")
    source = opts.image_source or environ.get("VERL_IMAGE_SOURCE") or None
    if not is_image_file(image):
        if source and source != image:
            raise UsageError(f"--image-source {source} names the tag an image *file* was made from; --image {image} "
                             f"is a tag already")
        warnings += check_image(image)
        return image, None
    path = Path(image).expanduser().absolute()
    if not path.is_file():
        raise UsageError(f"image file {path} does not exist here (a converted/mirrored Enroot/SquashFS image must "
                         f"be on a filesystem the nodes share)")
    if source:
        if is_image_file(source):
            raise UsageError(f"--image-source {source} is a file: give the registry tag the image was made from, "
                             f"e.g. {BY_NAME['verl_image'].default}")
        warnings += [w.replace(source, f"{source} (source of {path.name})", 1) for w in check_image(source)]
    else:
        if image_engine(path.name) not in (None, presets.BASE_ENV["ENGINE"]):
            check_image(path.name)  # refuses a file named for another engine, as a tag would be
        warnings.append(f"image file {path} has no source tag: pass --image-source TAG (or VERL_IMAGE_SOURCE) so "
                        f"the report names the verlai/verl tag it was converted or mirrored from")
    return str(path), source


def plan(opts: SlurmOptions, environ: dict[str, str] | None = None, config: Any = None) -> SlurmPlan:
    """Compose the step(s) (and the batch job) from the options; raises UsageError on anything it cannot run."""
    environ = dict(os.environ if environ is None else environ)
    notes: list[str] = []
    warnings: list[str] = []
    line = TaskLine.parse(list(opts.task_line), launcher="slurm", not_forwardable=NOT_FORWARDABLE)
    path_flags = tuple(_setting_flag(n) for n in PATH_SETTINGS) + _line_path_flags(line)
    line = line.absolutized(path_flags, f"the step runs in {PROJECT}", notes)
    cfg = config_section(config)
    settings = task_settings(line, environ, cfg)
    log_dir = Path(settings.log_dir)
    if node_local(log_dir):
        what = (f"LOG_DIR {log_dir} is node-local: logs there can vanish when the allocation ends; put it on a "
                f"shared filesystem or under $HOME (--log-dir or LOG_DIR)")
        if not opts.allow_local_logs:
            raise UsageError(what + " (--allow-local-logs only for a single-node test cluster)")
        warnings.append(what + " — accepted with --allow-local-logs")
    for value, flag in ((opts.gpus, "--gpus"), (opts.cpus, "--cpus"), (opts.nodes, "--nodes"),
                        (opts.gpus_per_node, "--gpus-per-node")):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be >= 1, got {value}")
    if opts.time is not None and not re.fullmatch(r"[\d:-]+|UNLIMITED|INFINITE", opts.time):
        raise UsageError(f"--time {opts.time!r} is not a Slurm time (MIN, HH:MM:SS, D-HH:MM)")
    if opts.jobid is not None:
        if not JOB_ID.fullmatch(opts.jobid):
            raise UsageError(f"--jobid {opts.jobid!r} is not a Slurm job id")
        for value, flag in ((opts.partition, "--partition"), (opts.time, "--time")):
            if value:
                raise UsageError(f"{flag} with --jobid: the existing allocation {opts.jobid} has its own")
    nodes = opts.nodes or 1
    if opts.gpus and opts.gpus_per_node:
        raise UsageError("--gpus and --gpus-per-node: give one (with --nodes, --gpus-per-node)")
    if nodes > 1 and opts.gpus:
        raise UsageError("--gpus with --nodes: give --gpus-per-node G (the run uses N×G GPUs)")
    if not 0 < opts.ray_port < 65536:
        raise UsageError(f"--ray-port {opts.ray_port} is not a port")

    alloc = [f"--jobid={opts.jobid}", "--overlap"] if opts.jobid else []
    alloc += [f"--nodes={nodes}", "--ntasks-per-node=1" if nodes > 1 else "--ntasks=1"]
    if opts.partition:
        alloc.append(f"--partition={opts.partition}")
    if opts.time:
        alloc.append(f"--time={opts.time}")
    if opts.gpus:
        alloc.append(f"--gpus={opts.gpus}")
    if opts.gpus_per_node:
        alloc.append(f"--gpus-per-node={opts.gpus_per_node}")
    if opts.cpus:
        alloc.append(f"--cpus-per-task={opts.cpus}")
    site = parse_site_args(opts.srun_args)

    step_env = {"LOG_DIR": str(log_dir)}
    for name in PATH_SETTINGS:  # absolute values, so the step resolves the same paths whatever its cwd
        setting, value = BY_NAME[name], settings.values.get(name)
        if value is not None and setting.env and settings.source(name) != "flag":
            step_env[setting.env] = str(value)
    step_env["VERL_E2E_SLURM"] = "1"
    if opts.jobid:
        notes.append(f"inside the existing allocation {opts.jobid}: srun --jobid={opts.jobid} --overlap")
    if "ROCR_VISIBLE_DEVICES" in environ and "CUDA_VISIBLE_DEVICES" in environ:
        notes.append("ROCR_VISIBLE_DEVICES is set next to CUDA_VISIBLE_DEVICES: the step unsets it")

    image = image_tag = None
    container_args, mounts, setup = [], [], []
    if opts.no_container:
        python = sys.executable
        runner = [sys.executable, "-m", "invoke"]
        notes.append("no container (--no-container): the task runs on the node with this project's Python "
                     f"({sys.executable})")
    else:
        image, image_tag = resolve_image(opts, settings, environ, warnings)
        mounts = compose_mounts(_mount_sources(settings, line), parse_extra_mounts(opts.mounts), notes)
        plan_image = SlurmPlan.image_record.fget(type("I", (), {"image": image, "image_tag": image_tag})())
        # the exact tag (or file + source tag), into run.json/env.json; the last one tells preflight it runs in it
        step_env.update(VERL_IMAGE=image, VERL_E2E_CONTAINER_IMAGE=plan_image)
        if image_tag:
            step_env["VERL_IMAGE_SOURCE"] = image_tag
        container_args = [f"--container-image={image}",
                          "--container-mounts=" + ",".join(f"{s}:{d}" for s, d in mounts),
                          f"--container-workdir={PROJECT}",
                          "--container-writable"]  # modelopt may be pip-installed in the step
        # nox may be missing from the image: install it into the image's Python, inside this same step
        setup.append("python3 -m nox --version >/dev/null 2>&1 || python3 -m pip install -q nox || "
                     f"{{ echo '{TOOL_PREFIX} cannot install nox in the image (setup, not a verdict)'; exit 3; }}")
        python = "python3"
        runner = ["python3", "-m", "nox", "-s", "verl", "--"]

    worker_pythonpath = ""
    if nodes > 1:
        if settings.bridge_repo is None or settings.verl_repo is None:
            raise UsageError("--nodes: BRIDGE_REPO and VERL_REPO must be set (every node imports that Bridge)")
        if settings.ray_address:
            raise UsageError("--nodes starts its own Ray cluster across the allocation: drop RAY_ADDRESS / "
                             "--ray-address")
        gpn = opts.gpus_per_node
        line = line.with_overrides([f"trainer.nnodes={nodes}"] + ([f"trainer.n_gpus_per_node={gpn}"] if gpn else []))
        if gpn:
            step_env["NUM_GPUS"] = str(nodes * gpn)  # the level's GPU-count check: N×G
        else:
            warnings.append("--nodes without --gpus-per-node: Ray counts each node's GPUs itself and the level's GPU "
                            "check cannot use N×G; pass --gpus-per-node G")
        # what the workers get through runtime_env (the level adds it) and what each node's probe imports with
        worker_pythonpath = compose(Path(settings.bridge_repo), Path(settings.verl_repo), environ.get("PYTHONPATH"))
        notes.append(f"ray cluster across {nodes} nodes: head on the first, the task there with "
                     f"trainer.nnodes={nodes}" + (f" trainer.n_gpus_per_node={gpn} NUM_GPUS={nodes * gpn}" if gpn else ""))
    stage_command = None
    if opts.stage:
        stage_command = list(runner)
        record = log_dir / JOBS_SUBDIR / f"staging-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}.jsonl"
        step_env.update(VERL_E2E_STAGING=str(record), HF_HUB_OFFLINE="1")
        notes.append(f"--stage: download-model and prep-data once before the run (same container), recorded in "
                     f"{record}; the run then has HF_HUB_OFFLINE=1")
        if nodes == 1:
            setup += staging_lines(stage_command, str(record))
    inner = [*runner, *line.tokens]
    if not opts.no_container:
        notes.append(f"container image: {plan_image} (from "
                     f"{'flag' if opts.image else settings.source('verl_image')})")
    return SlurmPlan(task_line=line.tokens, line=line, container=not opts.no_container, image=image,
                     image_source=None if opts.no_container else ("flag" if opts.image else
                                                                 settings.source("verl_image")),
                     image_tag=image_tag, log_dir=log_dir, workdir=PROJECT, alloc_args=alloc, site_args=site,
                     container_args=container_args, mounts=mounts, step_env=step_env, setup=setup,
                     inner_command=inner, jobid=opts.jobid, nodes=nodes, gpus_per_node=opts.gpus_per_node,
                     ray_port=opts.ray_port, python=python, worker_pythonpath=worker_pythonpath,
                     stage_command=stage_command, notes=notes, warnings=warnings)



class SlurmLauncher(Launcher):
    name = "slurm"
    can_detach = True

    def __init__(self, opts: SlurmOptions, config: Any = None, environ: dict[str, str] | None = None):
        self.opts, self.config, self.environ = opts, config, environ

    def plan(self) -> SlurmPlan:
        return plan(self.opts, environ=self.environ, config=self.config)

    def run_attached(self, p: SlurmPlan) -> int:  # type: ignore[override]
        return run_attached(p)

    def submit(self, p: SlurmPlan) -> int:  # type: ignore[override]
        return submit(p)

    def status(self, job: str, log_dir: Path | None = None, as_json: bool = False) -> int:  # type: ignore[override]
        from env.launchers.slurm_status import status_command

        return status_command(job, log_dir or self.plan().log_dir, as_json=as_json)

    def logs(self, job: str, follow: bool = False, log_dir: Path | None = None) -> int:  # type: ignore[override]
        from env.launchers.slurm_status import logs_command

        return logs_command(job, log_dir or self.plan().log_dir, follow=follow)


def slurm_command(opts: SlurmOptions, config: Any = None) -> int:
    launcher = SlurmLauncher(opts, config=config)
    if opts.dry_run and opts.detach:
        p = launcher.plan()
        for w in p.warnings:
            say(f"warning: {w}", err=True)
        for n in p.notes:
            say(n)
        print(p.describe(), end="")
        jobs_dir = p.log_dir / JOBS_SUBDIR
        if p.jobid:
            print(f"# --detach with --jobid: run here in the background (own session), recorded as "
                  f"{p.jobid}.<step> under {jobs_dir}")
        else:
            print(f"# --detach: sbatch {shlex.join(p.sbatch_argv(jobs_dir, jobs_dir / 'batch-<stamp>.sh')[1:])}")
            print("# batch script:")
            print(p.batch_script(jobs_dir), end="")
        return 0
    return launcher.launch(dry_run=opts.dry_run, detach=opts.detach)
