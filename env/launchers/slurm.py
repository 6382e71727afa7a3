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

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from env import presets
from env.launchers import slurm_ray
from env.launchers.base import Launcher, LaunchPlan, TaskLine, blocked, say
from env.preflight.pythonpath import compose
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
JOBS_SUBDIR = "slurm"  # under LOG_DIR: <job>.json, slurm-<job>.log, <job>.exit, batch scripts
# Node-local places: a log there can vanish with the allocation (the procedure: use a shared FS or $HOME).
NODE_LOCAL_ROOTS = ("/tmp", "/var/tmp", "/dev/shm", "/run")
# Image paths a mount must not cover (the wrapper prepends the image's own Megatron-LM).
IMAGE_PATHS = ("/workspace/Megatron-LM", "/usr", "/opt", "/etc", "/bin", "/lib")
ENGINE_MARKERS = (("sglang", re.compile(r"sgl")), ("trtllm", re.compile(r"trt-?llm|tensorrt")),
                  ("vllm", re.compile(r"vllm")))
IMAGE_FILE_SUFFIXES = (".sqsh", ".squashfs", ".sif")
NOT_FORWARDABLE = ("slurm", "slurm-status", "slurm-logs")
# Settings whose value is a path the task reads or writes: they are mounted and exported absolute into the step.
PATH_SETTINGS = tuple(s.name for s in SETTINGS if s.kind == "path" and s.name != "python")
# Forwarded-line flags that are no settings but name a path the task needs inside the step.
EXTRA_PATH_FLAGS = ("--dummy-config", "--baseline", "--local-dataset-path", "--out", "--scratch")
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


@dataclass
class SlurmPlan(LaunchPlan):
    task_line: list[str]  # line.tokens, with paths made absolute (and, multi-node, the trainer overrides)
    container: bool
    image: str | None
    image_source: str | None  # where the image came from: flag | env | invoke.yaml | default
    log_dir: Path
    workdir: Path
    alloc_args: list[str]  # allocation flags shared by sbatch and the srun step
    site_args: list[str]  # --srun-args, untouched
    container_args: list[str]  # pyxis flags
    mounts: list[tuple[str, str]]
    step_env: dict[str, str]  # exported inside the step
    setup: list[str]  # shell lines run in the step before the task (same container: their effect stays)
    inner_command: list[str]  # what runs inside the step
    line: TaskLine = None  # type: ignore[assignment]
    image_tag: str | None = None  # with an image file: the verlai/verl tag it was made from (None: not given)
    jobid: str | None = None  # an existing allocation (--jobid)
    nodes: int = 1
    gpus_per_node: int | None = None
    ray_port: int = 6379
    python: str = "python3"  # the run's Python inside the step
    worker_pythonpath: str = ""  # multi-node: what the Ray workers get (runtime_env) and each node's probe uses
    stage_command: list[str] | None = None  # --stage: staging, in the same container
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def multinode(self) -> bool:
        return self.nodes > 1

    def _first_line(self) -> str:
        return f'echo "{TOOL_PREFIX} slurm step: job ${{SLURM_JOB_ID:-?}} step ${{SLURM_STEP_ID:-?}} on $(hostname)"'

    def _env_lines(self) -> list[str]:
        lines = [
            'if [ -n "${ROCR_VISIBLE_DEVICES+x}" ] && [ -n "${CUDA_VISIBLE_DEVICES+x}" ]; then',
            f'  echo "{TOOL_PREFIX} ROCR_VISIBLE_DEVICES=$ROCR_VISIBLE_DEVICES was set next to '
            f'CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES: unset inside this step"',
            "  unset ROCR_VISIBLE_DEVICES",
            "fi",
        ]
        lines += [f"export {k}={shlex.quote(v)}" for k, v in self.step_env.items()]
        if self.container:
            lines.append(f"echo {shlex.quote(f'{TOOL_PREFIX} container image: {self.image_record}')}")
        return lines

    @property
    def image_record(self) -> str | None:
        """The image as the run records it: the tag, or the file with its source tag (or a warning without)."""
        if self.image is None or not is_image_file(self.image):
            return self.image
        if self.image_tag:
            return f"{self.image} (source tag {self.image_tag})"
        return (f"{self.image} (no source tag — warning: pass --image-source TAG or VERL_IMAGE_SOURCE so the report "
                f"names the verlai/verl tag this file was made from)")

    def step_script(self, jobs_dir: Path | None = None, started_key: str = "$SLURM_JOB_ID") -> str:
        """The bash script the step runs (`bash -c <this>`); in a batch job it first marks that it started.
        Multi-node: the head step (cluster checks, then the task with RAY_ADDRESS)."""
        lines = [self._first_line()]
        if jobs_dir is not None:
            lines.append(f'touch {shlex.quote(str(jobs_dir))}/"{started_key}".started')
        lines += self._env_lines()
        lines.append(f"cd {shlex.quote(str(self.workdir))}")
        if self.multinode:
            lines += slurm_ray.head_checks(python=self.python, nodes=self.nodes, gpus_per_node=self.gpus_per_node,
                                           bridge_src=self.worker_pythonpath.split(os.pathsep)[0])
        lines += self.setup
        lines.append("exec " + shlex.join(self.inner_command))
        return "\n".join(lines) + "\n"

    def node_script(self) -> str:
        """Multi-node: what every node's task runs (its Ray node; slurm_ray.node_script)."""
        exports = [x for x in self._env_lines() if not x.startswith("echo")]
        setup = [line for line in self.setup if "nox" in line]  # the image needs nox (and modelopt) on every node
        if self.container:
            setup.append(f"{shlex.quote(self.python)} -m nox -s verl -- install-modelopt >/dev/null || "
                         f"{{ echo '{TOOL_PREFIX} node '$(hostname)': container setup failed (not a verdict)'; "
                         "exit 3; }")
        return slurm_ray.node_script(python=self.python, ray_port=self.ray_port, gpus_per_node=self.gpus_per_node,
                                     worker_pythonpath=self.worker_pythonpath, setup=setup, exports=exports,
                                     workdir=str(self.workdir))

    def _srun_prefix(self) -> list[str]:
        return ["srun", *self.alloc_args, *self.site_args, *self.container_args]

    def srun_argv(self, jobs_dir: Path | None = None, started_key: str = "$SLURM_JOB_ID") -> list[str]:
        """Single node: the one step. (Multi-node runs several steps: driver_script.)"""
        return [*self._srun_prefix(), "bash", "-c", self.step_script(jobs_dir, started_key)]

    def driver_script(self, jobs_dir: Path, exit_file: str | None = None, header: list[str] | None = None) -> str:
        """Multi-node: the script inside the allocation (sbatch body, salloc's command, or here with --jobid)."""
        steps = ["srun", *(["--jobid=${job}"] if self.jobid else []), "--overlap", *self.site_args,
                 *self.container_args]
        node_gpus = [f"--gpus-per-node={self.gpus_per_node}"] if self.gpus_per_node else []
        stage = ["bash", "-c", self._stage_script()] if self.stage_command is not None else None
        return slurm_ray.driver_script(
            srun=steps, nodes=self.nodes, node_argv=[*node_gpus, "bash", "-c", self.node_script()],
            head_argv=["bash", "-c", self.step_script(jobs_dir)], stage_argv=stage,
            jobs_dir=str(jobs_dir), ray_port=self.ray_port, exit_file=exit_file, header=header or [])

    def _stage_script(self) -> str:
        lines = [self._first_line(), *[x for x in self._env_lines() if not x.startswith("echo")],
                 f"cd {shlex.quote(str(self.workdir))}", *[x for x in self.setup if "nox" in x]]
        lines += staging_lines(self.stage_command or [], self.step_env.get("VERL_E2E_STAGING", ""))
        return "\n".join(lines) + "\n"

    def batch_script(self, jobs_dir: Path) -> str:
        """The sbatch script: the same srun step (multi-node: the driver), then the exit code into `<job>.exit`.

        srun failing before the step started (image pull, mounts, allocation) is cluster setup, not the task's
        verdict: exit 3 (Blocked), said in the log.
        """
        jobs = shlex.quote(str(jobs_dir))
        header = [f"# written by `invoke slurm --detach` for: {shlex.join(self.task_line)}",
                  f"# image: {self.image_record if self.container else 'none (--no-container)'}"]
        if self.multinode:
            return self.driver_script(jobs_dir, exit_file=f'{jobs}/"$SLURM_JOB_ID".exit', header=header)
        return "\n".join([
            "#!/bin/bash",
            *header,
            shlex.join(self.srun_argv(jobs_dir)),
            "rc=$?",
            f'if [ "$rc" -ne 0 ] && [ ! -e {jobs}/"$SLURM_JOB_ID".started ]; then',
            f'  echo "{TOOL_PREFIX} srun exited $rc before the step started: cluster setup, not a verdict (exit 3)"',
            "  rc=3",
            "fi",
            f'echo "$rc" > {jobs}/"$SLURM_JOB_ID".exit',
            f'echo "{TOOL_PREFIX} slurm step exit code $rc"',
            'exit "$rc"',
            "",
        ])

    def background_script(self, jobs_dir: Path, key_file: Path) -> str:
        """--jobid --detach: the step (or driver) run here in the background; the exit code into `<key>.exit`,
        where <key> is `J.S` (the step, read from the log) once known, until then a local name."""
        jobs = shlex.quote(str(jobs_dir))
        key = f'"$(cat {shlex.quote(str(key_file))} 2>/dev/null || echo {shlex.quote(key_file.stem)})"'
        if self.multinode:
            return self.driver_script(jobs_dir, exit_file=f"{jobs}/{key}.exit",
                                      header=[f"# `invoke slurm --jobid {self.jobid} --detach`: "
                                              f"{shlex.join(self.task_line)}", f"export VERL_E2E_JOB={self.jobid}"])
        started = f'"$(cat {shlex.quote(str(key_file))} 2>/dev/null)"'
        return "\n".join([
            "#!/bin/bash",
            f"# `invoke slurm --jobid {self.jobid} --detach`: {shlex.join(self.task_line)}",
            shlex.join(self.srun_argv()),
            "rc=$?",
            f'if [ "$rc" -ne 0 ] && [ -z {started} ]; then',
            f'  echo "{TOOL_PREFIX} srun exited $rc before the step started: cluster setup, not a verdict (exit 3)"',
            "  rc=3",
            "fi",
            f'echo "$rc" > {jobs}/{key}.exit',
            f'echo "{TOOL_PREFIX} slurm step exit code $rc"',
            'exit "$rc"',
            "",
        ])

    def sbatch_argv(self, jobs_dir: Path, script: Path) -> list[str]:
        name = "verl-e2e-" + re.sub(r"[^\w.-]+", "_", self.task_line[0])
        return ["sbatch", "--parsable", f"--job-name={name}", f"--output={jobs_dir / 'slurm-%j.log'}",
                f"--chdir={self.workdir}", *self.alloc_args, *self.site_args, str(script)]

    def salloc_argv(self, script: Path) -> list[str]:
        """Multi-node, attached, no --jobid: an allocation holding the driver (salloc runs it here)."""
        name = "verl-e2e-" + re.sub(r"[^\w.-]+", "_", self.task_line[0])
        return ["salloc", f"--job-name={name}", *self.alloc_args, *self.site_args, "bash", str(script)]

    def describe(self) -> str:
        """What --dry-run prints: the step(s), and with --detach the sbatch line and batch script."""
        jobs_dir = self.log_dir / JOBS_SUBDIR
        out = []
        if self.multinode:
            where = (f"# inside allocation {self.jobid} (run here):" if self.jobid else
                     f"# the allocation: {shlex.join(self.salloc_argv(jobs_dir / 'driver-<stamp>.sh'))}")
            out += [where, f"# ray cluster: {self.nodes} nodes × {self.gpus_per_node or '?'} GPUs, head on the first "
                    f"node (port {self.ray_port}); the task on the head: {shlex.join(self.task_line)}",
                    "# driver script:", self.driver_script(jobs_dir).rstrip("\n")]
        else:
            argv = self.srun_argv()
            out.append("# the step (srun):")
            out.append(" \\\n  ".join(shlex.quote(a) for a in argv[:-1]) + " \\\n  " + shlex.quote(argv[-1]))
        return "\n".join(out) + "\n"


def staging_lines(command: list[str], record: str) -> list[str]:
    """--stage: download-model and prep-data once (same container), each outcome appended to the record."""
    q = shlex.quote
    rec = q(record)
    lines = [f": > {rec}"]
    for task in (["download-model"], ["prep-data"]):
        argv = ["env", "-u", "HF_HUB_OFFLINE", *command, *task]  # the run is offline; its staging is not
        lines += [
            f'echo "{TOOL_PREFIX} staging: {shlex.join(task)}"',
            f"{shlex.join(argv)}; rc=$?",
            f'printf \'{{"task": "%s", "command": %s, "exit_code": %d, "host": "%s", "at": "%s"}}\\n\' '
            f'{q(task[0])} {q(json.dumps(shlex.join(argv)))} "$rc" "$(hostname)" "$(date -u +%FT%TZ)" >> {rec}',
            f'[ "$rc" -eq 0 ] || {{ echo "{TOOL_PREFIX} staging {task[0]} failed (exit $rc): Blocked (setup)"; '
            "exit 3; }",
        ]
    return lines


def is_image_file(image: str) -> bool:
    """An Enroot/SquashFS (or other) image *file* rather than a registry tag."""
    return image.startswith(("/", "./", "../", "~")) or image.endswith(IMAGE_FILE_SUFFIXES)


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
    for flag in EXTRA_PATH_FLAGS:
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
    path_flags = tuple(_setting_flag(n) for n in PATH_SETTINGS) + EXTRA_PATH_FLAGS
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


def require_binaries(*names: str) -> None:
    missing = [n for n in names if shutil.which(n) is None]
    if missing:
        raise UsageError(f"{', '.join(missing)} not found on PATH: run this on a Slurm login node")


STEP_STARTED = f"{TOOL_PREFIX} slurm step: job".encode()
STEP_LINE = re.compile(rb"\[verl-e2e\] slurm step: job (\d+) step (\d+)")


def pyxis_missing() -> str | None:
    """Why a container step cannot run here (srun without pyxis' --container-image), or None."""
    try:
        out = subprocess.run(["srun", "--help"], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return "srun --help did not answer within 60 s"
    if "--container-image" not in out.stdout + out.stderr:
        return ("srun here has no --container-image (the pyxis plugin is not installed): run on a pyxis cluster, "
                "or pass --no-container to run the task in the node's own environment")
    return None


def _allocation_missing(jobid: str) -> str | None:
    """Why `--jobid J` cannot take a step (unknown or no longer running), or None."""
    out = subprocess.run(["squeue", "-h", "-j", jobid, "-o", "%T"], capture_output=True, text=True, timeout=60)
    state = out.stdout.strip()
    if out.returncode != 0 or not state:
        return f"allocation {jobid} is unknown to Slurm (finished, or another cluster: check SLURM_CONF)"
    if state != "RUNNING":
        return f"allocation {jobid} is {state}, not RUNNING: a step can start only in a running allocation"
    return None


def _script_file(jobs_dir: Path, kind: str, text: str) -> Path:
    jobs_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    script = jobs_dir / f"{kind}-{stamp}-{os.getpid()}.sh"
    script.write_text(text)
    script.chmod(0o755)
    return script


def _stream(argv: list[str], cwd: Path, env: dict[str, str] | None = None,
            on_interrupt: Any = None) -> tuple[int, bool]:
    """Run argv in the foreground, its output relayed here; (exit code, whether a step said it started).

    on_interrupt(proc): the child runs in its own session and a Ctrl-C here is handed to it by this callback
    (the multi-node driver tears down in order: the task, then every node's Ray); without one, the child is in
    our process group and gets the terminal's Ctrl-C itself (srun cancels its step)."""
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, env=env, start_new_session=bool(on_interrupt))
    from sessions.run.progress import Relay

    started, tail, out = False, b"", Relay()  # status lines: one line redrawn in place on a terminal
    try:
        while chunk := os.read(proc.stdout.fileno(), 65536):
            out.write(chunk)
            out.flush()
            if not started:
                tail = (tail + chunk)[-4096:]
                started = STEP_STARTED in tail
        code = proc.wait()
    except KeyboardInterrupt:  # srun got the Ctrl-C too (or the driver is told) and stops the step(s)
        if on_interrupt is not None:
            on_interrupt(proc)
            try:  # the driver's teardown prints what it stopped: keep relaying it
                while chunk := os.read(proc.stdout.fileno(), 65536):
                    out.write(chunk)
                    out.flush()
            except KeyboardInterrupt:
                os.killpg(proc.pid, signal.SIGKILL)
        try:
            proc.wait(timeout=120)
        finally:
            raise
    finally:
        out.close()
    return code, started


def _preflight(p: SlurmPlan) -> str | None:
    """Why the cluster cannot take this run (exit 3), or None."""
    require_binaries("srun")
    if p.container and (why := pyxis_missing()):
        return why
    if p.jobid and (why := _allocation_missing(p.jobid)):
        return why
    return None


def run_attached(p: SlurmPlan) -> int:
    """In the foreground; output streams here; the task's exit code is ours.

    srun's own failures (allocation refused, unknown option) also exit non-zero; they are told apart from the
    task's exit code by the line the step prints first, and exit 3 (Blocked: cluster setup) instead.
    Multi-node: the driver (slurm_ray.py) runs here against --jobid, else as salloc's command.
    """
    if why := _preflight(p):
        return blocked(why)
    p.log_dir.mkdir(parents=True, exist_ok=True)
    if p.multinode:
        jobs_dir = p.log_dir / JOBS_SUBDIR
        script = _script_file(jobs_dir, "driver", "")
        pid_file = script.with_suffix(".pid")
        script.write_text(p.driver_script(jobs_dir, header=[f"echo $$ > {shlex.quote(str(pid_file))}"]))
        if p.jobid:
            argv, env = ["bash", str(script)], {**os.environ, "VERL_E2E_JOB": p.jobid}
        else:
            require_binaries("salloc")
            argv, env = p.salloc_argv(script), None

        def interrupt(proc: subprocess.Popen) -> None:
            """Ctrl-C: TERM to the driver alone; its EXIT trap stops the task step, then every node's Ray."""
            try:
                os.kill(int(pid_file.read_text()), signal.SIGTERM)
            except (OSError, ValueError):  # no driver yet (salloc still waiting): end the whole session
                os.killpg(proc.pid, signal.SIGTERM)

        say(f"multi-node run: {shlex.join(argv)}")
        code, started = _stream(argv, p.workdir, env, on_interrupt=interrupt)
    else:
        argv = p.srun_argv()
        say(f"srun step: {shlex.join(argv[:-1])} <step script>")
        code, started = _stream(argv, p.workdir)
    if not started and code != 0:
        return blocked(f"srun exited {code} before the step started (see srun's message above): cluster setup, "
                       f"not a verdict")
    if not p.multinode:
        say(f"slurm step exit code {code}")
    return code


def _record(p: SlurmPlan, jobs_dir: Path, key: str, log: Path, script: Path, argv: list[str], **extra: Any) -> None:
    record = {"job_id": key, "task_line": p.task_line, "container": p.container, "image": p.image,
              "image_source_tag": p.image_tag, "image_record": p.image_record,
              "image_source": p.image_source, "log": str(log), "exit_file": str(jobs_dir / f"{key}.exit"),
              "batch_script": str(script), "sbatch": argv, "submitted": time.time(),
              "slurm_conf": os.environ.get("SLURM_CONF"), "mounts": p.mounts, "notes": p.notes,
              "warnings": p.warnings, "jobid": p.jobid, "nodes": p.nodes, "gpus_per_node": p.gpus_per_node,
              "staging_record": p.step_env.get("VERL_E2E_STAGING"), **extra}
    (jobs_dir / f"{key}.json").write_text(json.dumps(record, indent=2))


def _follow_hint(key: str, log: Path) -> None:
    print(f"log: {log}")
    print(f"follow: invoke slurm-logs {key} --follow   (or: tail -f {shlex.quote(str(log))})")
    print(f"state: invoke slurm-status {key}")


def submit(p: SlurmPlan) -> int:
    """sbatch a script holding the same step(s); record the job under $LOG_DIR/slurm/ and say how to follow it.
    With --jobid: the step runs from here in the background (no new job), recorded by step `J.S`."""
    if p.jobid:
        return submit_in_allocation(p)
    require_binaries("sbatch")
    if p.container and (why := pyxis_missing()):
        return blocked(why)
    jobs_dir = p.log_dir / JOBS_SUBDIR
    script = _script_file(jobs_dir, "batch", p.batch_script(jobs_dir))
    argv = p.sbatch_argv(jobs_dir, script)
    proc = subprocess.run(argv, cwd=p.workdir, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        script.unlink()
        return blocked(f"sbatch refused the job (exit {proc.returncode}): "
                       f"{(proc.stderr.strip().splitlines() or ['no message'])[-1]}")
    job_id = proc.stdout.strip().split(";")[0]
    log = jobs_dir / f"slurm-{job_id}.log"
    _record(p, jobs_dir, job_id, log, script, argv)
    print(f"submitted batch job {job_id}")
    _follow_hint(job_id, log)
    return 0


def submit_in_allocation(p: SlurmPlan, timeout_s: float = 300) -> int:
    """--jobid J --detach: run the step (multi-node: the driver) here in the background, in its own session
    (the procedure: background the launcher on the login node, not the workload inside an attached shell); wait
    for the step's first line to learn its id S, then record `J.S` and return."""
    if why := _preflight(p):
        return blocked(why)
    jobs_dir = p.log_dir / JOBS_SUBDIR
    jobs_dir.mkdir(parents=True, exist_ok=True)
    local = f"{p.jobid}.local-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}"
    key_file = jobs_dir / f"{local}.key"
    script = _script_file(jobs_dir, "step", p.background_script(jobs_dir, key_file))
    log = jobs_dir / f"slurm-{local}.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen(["bash", str(script)], cwd=p.workdir, stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                env={**os.environ, "VERL_E2E_JOB": p.jobid})
    deadline = time.monotonic() + timeout_s
    step = None
    while step is None and proc.poll() is None and time.monotonic() < deadline:
        m = STEP_LINE.search(log.read_bytes())
        if m:
            step = m.group(2).decode()
            break
        time.sleep(0.2)
    if step is None:
        m = STEP_LINE.search(log.read_bytes())
        step = m.group(2).decode() if m else None
    if step is None:
        if proc.poll() is None:
            os.killpg(proc.pid, 15)
        proc.wait()
        sys.stderr.write(log.read_text(errors="replace")[-2000:])
        return blocked(f"no step started in allocation {p.jobid} (exit {proc.returncode}): cluster setup, not a "
                       f"verdict")
    key = f"{p.jobid}.{step}"
    key_file.write_text(key)  # the script writes <key>.exit under this name
    final_log = jobs_dir / f"slurm-{key}.log"
    os.link(log, final_log)  # the same file, under the step's name; the writer keeps writing to it
    log.unlink()
    _record(p, jobs_dir, key, final_log, script, ["bash", str(script)], pid=proc.pid)
    print(f"started step {key} in allocation {p.jobid}")
    _follow_hint(key, final_log)
    return 0


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
