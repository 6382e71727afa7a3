"""`invoke slurm`'s step as data: SlurmPlan builds the srun step, the batch script, the multi-node driver and
what --dry-run prints; slurm.py composes it from the options, slurm_run.py runs or submits it.

JOBS_SUBDIR is where a job's records live under LOG_DIR (slurm_status.py reads them back).
"""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from env.launchers import slurm_ray
from env.launchers.base import LaunchPlan, TaskLine
from env.settings import TOOL_PREFIX

JOBS_SUBDIR = "slurm"  # under LOG_DIR: <job>.json, slurm-<job>.log, <job>.exit, batch scripts
IMAGE_FILE_SUFFIXES = (".sqsh", ".squashfs", ".sif")


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
