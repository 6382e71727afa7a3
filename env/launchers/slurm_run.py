"""`invoke slurm`'s running: a SlurmPlan (slurm_step.py) attached in the foreground, submitted with sbatch
(--detach), or backgrounded here inside an existing allocation (--jobid --detach); the records under
`$LOG_DIR/slurm/` that slurm_status.py reads.
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
from pathlib import Path
from typing import Any

from env.launchers.base import blocked, say
from env.launchers.slurm_step import JOBS_SUBDIR, SlurmPlan
from env.settings import TOOL_PREFIX, UsageError


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
    from env.protocol.relay import Relay

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
