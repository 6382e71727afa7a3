"""`invoke slurm`: the same task in one Slurm step — a pyxis container step by default (SPEC "Remote and Slurm").

The step is composed as data (`SlurmPlan`) so that a dry-run prints it and tests check it without pyxis:
- `srun` with the allocation flags (`--partition`, `--time`, `--gpus`, `--cpus-per-task`), the site's own options
  (`--srun-args`, split with shlex and passed through untouched) and the pyxis flags: `--container-image` (the exact
  tag, exported as VERL_IMAGE inside so it lands in run.json/env.json), `--container-mounts` of both checkouts, this
  project, the data and model roots and the log directory — each at its own host path, so every path in settings,
  logs and reports means the same file inside and outside — and `--container-workdir` = this project;
- inside, one `bash -c` script: drop ROCR_VISIBLE_DEVICES when CUDA_VISIBLE_DEVICES is also set (and say so), export
  the resolved settings, then `nox -s verl -- <task> [args]` so setup (modelopt) and the run share one container
  step. `--no-container` runs `<this Python> -m invoke <task> [args]` on the node instead.
- `--detach` writes a batch script holding the same srun step, submits it with `sbatch` and records the job under
  `$LOG_DIR/slurm/` (job.json, the Slurm output log, the step's exit code) for `slurm-status` / `slurm-logs`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from env import presets
from env.protocol import exits, lines
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
NOT_FORWARDABLE = ("slurm", "slurm-status", "slurm-logs")
# Settings whose value is a path the task reads or writes: they are mounted and exported absolute into the step.
PATH_SETTINGS = tuple(s.name for s in SETTINGS if s.kind == "path" and s.name != "python")
# Forwarded-line flags that are no settings but name a path the task needs inside the step.
EXTRA_PATH_FLAGS = ("--dummy-config", "--baseline", "--local-dataset-path", "--out", "--scratch")


@dataclass
class SlurmOptions:
    task_line: list[str]  # the forwarded task and its args (`level0 --model M -- overrides`)
    image: str | None = None
    partition: str | None = None
    gpus: int | None = None
    cpus: int | None = None
    time: str | None = None
    srun_args: str = ""
    mounts: str = ""
    no_container: bool = False
    detach: bool = False
    dry_run: bool = False
    allow_local_logs: bool = False


@dataclass
class SlurmPlan:
    task_line: list[str]
    container: bool
    image: str | None
    image_source: str | None  # flag | env | invoke.yaml | default
    log_dir: Path
    workdir: Path
    alloc_args: list[str]  # allocation flags shared by sbatch and the srun step
    site_args: list[str]  # --srun-args, untouched
    container_args: list[str]  # pyxis flags
    mounts: list[tuple[str, str]]
    step_env: dict[str, str]  # exported inside the step
    setup: list[str]  # shell lines run in the step before the task (same container: their effect stays)
    inner_command: list[str]  # what runs inside the step
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def step_script(self, jobs_dir: Path | None = None) -> str:
        """The bash script the step runs (`bash -c <this>`); in a batch job it first marks that it started."""
        lines = [
            f'echo "{TOOL_PREFIX} slurm step: job ${{SLURM_JOB_ID:-?}} step ${{SLURM_STEP_ID:-?}} on $(hostname)"',
        ]
        if jobs_dir is not None:
            lines.append(f'touch {shlex.quote(str(jobs_dir))}/"$SLURM_JOB_ID".started')
        lines += [
            'if [ -n "${ROCR_VISIBLE_DEVICES+x}" ] && [ -n "${CUDA_VISIBLE_DEVICES+x}" ]; then',
            f'  echo "{TOOL_PREFIX} ROCR_VISIBLE_DEVICES=$ROCR_VISIBLE_DEVICES was set next to '
            f'CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES: unset inside this step"',
            "  unset ROCR_VISIBLE_DEVICES",
            "fi",
        ]
        lines += [f"export {k}={shlex.quote(v)}" for k, v in self.step_env.items()]
        if self.container:
            lines.append(f"echo {shlex.quote(f'{TOOL_PREFIX} container image: {self.image}')}")
        lines.append(f"cd {shlex.quote(str(self.workdir))}")
        lines += self.setup
        lines.append("exec " + shlex.join(self.inner_command))
        return "\n".join(lines) + "\n"

    def srun_argv(self, jobs_dir: Path | None = None) -> list[str]:
        return ["srun", *self.alloc_args, *self.site_args, *self.container_args, "bash", "-c",
                self.step_script(jobs_dir)]

    def batch_script(self, jobs_dir: Path) -> str:
        """The sbatch script: the same srun step, then the step's exit code into `<job>.exit`.

        srun failing before the step started (image pull, mounts, allocation) is cluster setup, not the task's
        verdict: exit 3 (Blocked), said in the log.
        """
        jobs = shlex.quote(str(jobs_dir))
        return "\n".join([
            "#!/bin/bash",
            f"# written by `invoke slurm --detach` for: {shlex.join(self.task_line)}",
            f"# image: {self.image if self.container else 'none (--no-container)'}",
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

    def sbatch_argv(self, jobs_dir: Path, script: Path) -> list[str]:
        name = "verl-e2e-" + re.sub(r"[^\w.-]+", "_", self.task_line[0])
        return ["sbatch", "--parsable", f"--job-name={name}", f"--output={jobs_dir / 'slurm-%j.log'}",
                f"--chdir={self.workdir}", *self.alloc_args, *self.site_args, str(script)]


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


def _flag_values(task_line: list[str], flag: str) -> list[str]:
    """Values of `flag` in the forwarded line (`--flag V` or `--flag=V`), before any `--`."""
    out = []
    for i, tok in enumerate(task_line):
        if tok == "--":
            break
        if tok == flag and i + 1 < len(task_line):
            out.append(task_line[i + 1])
        elif tok.startswith(flag + "="):
            out.append(tok.split("=", 1)[1])
    return out


def _absolutize(task_line: list[str], flags: tuple[str, ...], notes: list[str]) -> list[str]:
    """Relative path values of `flags` made absolute here: the step runs in the project directory."""
    out = list(task_line)
    for i, tok in enumerate(out):
        if tok == "--":
            break
        for flag in flags:
            if tok == flag and i + 1 < len(out) and not os.path.isabs(os.path.expanduser(out[i + 1])):
                new = str(Path(out[i + 1]).absolute())
                notes.append(f"{flag} {out[i + 1]} → {new} (the step runs in {PROJECT})")
                out[i + 1] = new
            elif tok.startswith(flag + "=") and not os.path.isabs(os.path.expanduser(tok.split("=", 1)[1])):
                new = str(Path(tok.split("=", 1)[1]).absolute())
                notes.append(f"{flag} {tok.split('=', 1)[1]} → {new} (the step runs in {PROJECT})")
                out[i] = f"{flag}={new}"
    return out


def _setting_flag(name: str) -> str:
    return "--model" if name == "model_id" else "--" + name.replace("_", "-")


def task_settings(task_line: list[str], environ: dict[str, str], config: dict[str, Any]) -> Resolved:
    """The settings the forwarded task will see: its own flags > environment > invoke.yaml > default."""
    flags = {}
    for s in SETTINGS:
        values = _flag_values(task_line, _setting_flag(s.name))
        if values:
            flags[s.name] = values[-1]
    return resolve(flags, environ, config)


def _mount_sources(settings: Resolved, task_line: list[str]) -> list[tuple[str, Path]]:
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
        for value in _flag_values(task_line, flag):
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


def plan(opts: SlurmOptions, environ: dict[str, str] | None = None, config: Any = None) -> SlurmPlan:
    """Compose the step (and the batch job) from the options; raises UsageError on anything it cannot run."""
    environ = dict(os.environ if environ is None else environ)
    if not opts.task_line:
        raise UsageError("name the task to run: invoke slurm [flags] <task> [args], e.g. invoke slurm level0")
    task = opts.task_line[0]
    if task.startswith("-") or not re.fullmatch(r"[\w.-]+", task):
        raise UsageError(f"{task!r} is not a task name (invoke slurm [flags] <task> [args])")
    if task in NOT_FORWARDABLE:
        raise UsageError(f"`invoke slurm {task}` makes no sense: run `invoke {task}` where you are")
    notes: list[str] = []
    warnings: list[str] = []
    path_flags = tuple(_setting_flag(n) for n in PATH_SETTINGS) + EXTRA_PATH_FLAGS
    task_line = _absolutize(opts.task_line, path_flags, notes)
    cfg = config_section(config)
    settings = task_settings(task_line, environ, cfg)
    log_dir = Path(settings.log_dir)
    if node_local(log_dir):
        what = (f"LOG_DIR {log_dir} is node-local: logs there can vanish when the allocation ends; put it on a "
                f"shared filesystem or under $HOME (--log-dir or LOG_DIR)")
        if not opts.allow_local_logs:
            raise UsageError(what + " (--allow-local-logs only for a single-node test cluster)")
        warnings.append(what + " — accepted with --allow-local-logs")
    for value, flag in ((opts.gpus, "--gpus"), (opts.cpus, "--cpus")):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be >= 1, got {value}")
    if opts.time is not None and not re.fullmatch(r"[\d:-]+|UNLIMITED|INFINITE", opts.time):
        raise UsageError(f"--time {opts.time!r} is not a Slurm time (MIN, HH:MM:SS, D-HH:MM)")

    alloc = ["--nodes=1", "--ntasks=1"]
    if opts.partition:
        alloc.append(f"--partition={opts.partition}")
    if opts.time:
        alloc.append(f"--time={opts.time}")
    if opts.gpus:
        alloc.append(f"--gpus={opts.gpus}")
    if opts.cpus:
        alloc.append(f"--cpus-per-task={opts.cpus}")
    site = parse_site_args(opts.srun_args)

    step_env = {"LOG_DIR": str(log_dir)}
    for name in PATH_SETTINGS:  # absolute values, so the step resolves the same paths whatever its cwd
        setting, value = BY_NAME[name], settings.values.get(name)
        if value is not None and setting.env and settings.source(name) != "flag":
            step_env[setting.env] = str(value)
    step_env["VERL_E2E_SLURM"] = "1"
    if "ROCR_VISIBLE_DEVICES" in environ and "CUDA_VISIBLE_DEVICES" in environ:
        notes.append("ROCR_VISIBLE_DEVICES is set next to CUDA_VISIBLE_DEVICES: the step unsets it")

    image, container_args, mounts, setup = None, [], [], []
    if opts.no_container:
        inner = [sys.executable, "-m", "invoke", *task_line]
        notes.append("no container (--no-container): the task runs on the node with this project's Python "
                     f"({sys.executable})")
    else:
        image = opts.image or settings.verl_image
        if not image:
            raise UsageError("no container image: set VERL_IMAGE or --image (a vLLM-flavoured verlai/verl tag)")
        warnings += check_image(image)
        mounts = compose_mounts(_mount_sources(settings, task_line), parse_extra_mounts(opts.mounts), notes)
        # the exact tag, into run.json/env.json; the second one tells preflight it runs in that container
        step_env.update(VERL_IMAGE=image, VERL_E2E_CONTAINER_IMAGE=image)
        container_args = [f"--container-image={image}",
                          "--container-mounts=" + ",".join(f"{s}:{d}" for s, d in mounts),
                          f"--container-workdir={PROJECT}",
                          "--container-writable"]  # modelopt may be pip-installed in the step
        # nox may be missing from the image: install it into the image's Python, inside this same step
        setup.append("python3 -m nox --version >/dev/null 2>&1 || python3 -m pip install -q nox || "
                     f"{{ echo '{TOOL_PREFIX} cannot install nox in the image (setup, not a verdict)'; exit 3; }}")
        inner = ["python3", "-m", "nox", "-s", "verl", "--", *task_line]
    return SlurmPlan(task_line=task_line, container=not opts.no_container, image=image,
                     image_source=None if opts.no_container else ("flag" if opts.image else
                                                                 settings.source("verl_image")),
                     log_dir=log_dir, workdir=PROJECT, alloc_args=alloc, site_args=site,
                     container_args=container_args, mounts=mounts, step_env=step_env, setup=setup,
                     inner_command=inner,
                     notes=notes, warnings=warnings)


def _say(msg: str, err: bool = False) -> None:
    print(f"{TOOL_PREFIX} {msg}", file=sys.stderr if err else sys.stdout, flush=True)


def print_plan(p: SlurmPlan) -> None:
    for w in p.warnings:
        _say(f"warning: {w}", err=True)
    for n in p.notes:
        _say(n)
    if p.container:
        _say(f"container image: {p.image} (from {p.image_source})")


def require_binaries(*names: str) -> None:
    missing = [n for n in names if shutil.which(n) is None]
    if missing:
        raise UsageError(f"{', '.join(missing)} not found on PATH: run this on a Slurm login node")


STEP_STARTED = f"{TOOL_PREFIX} slurm step: job".encode()
EXIT_BLOCKED = exits.BLOCKED  # as a level's Blocked: the cluster, not the Bridge, stopped it


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


def _blocked(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr, flush=True)
    return EXIT_BLOCKED


def run_attached(p: SlurmPlan) -> int:
    """One srun step in the foreground; its output streams here; its exit code is the task's.

    srun's own failures (allocation refused, unknown option) also exit non-zero; they are told apart from the
    task's exit code by the line the step prints first, and exit 3 (Blocked: cluster setup) instead.
    """
    require_binaries("srun")
    if p.container and (why := pyxis_missing()):
        return _blocked(why)
    p.log_dir.mkdir(parents=True, exist_ok=True)
    argv = p.srun_argv()
    _say(f"srun step: {shlex.join(argv[:-1])} <step script>")
    proc = subprocess.Popen(argv, cwd=p.workdir, stdout=subprocess.PIPE)
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
    except KeyboardInterrupt:  # srun got the Ctrl-C too and cancels the step; let it finish that
        try:
            proc.wait(timeout=30)
        finally:
            raise
    finally:
        out.close()
    if not started and code != 0:
        return _blocked(f"srun exited {code} before the step started (see srun's message above): cluster setup, "
                        f"not a verdict")
    print(lines.slurm_step_footer(code), flush=True)
    return code


def submit(p: SlurmPlan) -> int:
    """sbatch a script holding the same srun step; record the job under $LOG_DIR/slurm/ and say how to follow it."""
    require_binaries("sbatch")
    if p.container and (why := pyxis_missing()):
        return _blocked(why)
    jobs_dir = p.log_dir / JOBS_SUBDIR
    jobs_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    script = jobs_dir / f"batch-{stamp}-{os.getpid()}.sh"
    script.write_text(p.batch_script(jobs_dir))
    script.chmod(0o755)
    argv = p.sbatch_argv(jobs_dir, script)
    proc = subprocess.run(argv, cwd=p.workdir, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        script.unlink()
        return _blocked(f"sbatch refused the job (exit {proc.returncode}): "
                        f"{(proc.stderr.strip().splitlines() or ['no message'])[-1]}")
    job_id = proc.stdout.strip().split(";")[0]
    log = jobs_dir / f"slurm-{job_id}.log"
    record = {"job_id": job_id, "task_line": p.task_line, "container": p.container, "image": p.image,
              "image_source": p.image_source, "log": str(log), "exit_file": str(jobs_dir / f"{job_id}.exit"),
              "batch_script": str(script), "sbatch": argv, "submitted": time.time(),
              "slurm_conf": os.environ.get("SLURM_CONF"), "mounts": p.mounts, "notes": p.notes,
              "warnings": p.warnings}
    (jobs_dir / f"{job_id}.json").write_text(json.dumps(record, indent=2))
    print(f"submitted batch job {job_id}")
    print(f"log: {log}")
    print(f"follow: invoke slurm-logs {job_id} --follow   (or: tail -f {shlex.quote(str(log))})")
    print(f"state: invoke slurm-status {job_id}")
    return 0


def slurm_command(opts: SlurmOptions, config: Any = None) -> int:
    p = plan(opts, config=config)
    print_plan(p)
    if opts.dry_run:
        print("# the step (srun):")
        print(" \\\n  ".join(shlex.quote(a) for a in p.srun_argv()[:-1]) + " \\\n  " + shlex.quote(p.step_script()))
        if opts.detach:
            jobs_dir = p.log_dir / JOBS_SUBDIR
            print(f"# --detach: sbatch {shlex.join(p.sbatch_argv(jobs_dir, jobs_dir / 'batch-<stamp>.sh')[1:])}")
            print("# batch script:")
            print(p.batch_script(jobs_dir), end="")
        return 0
    return submit(p) if opts.detach else run_attached(p)

