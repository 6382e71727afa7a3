"""`invoke slurm-status JOB` / `invoke slurm-logs JOB [--follow]`: a detached job's state and output.

Slurm accounting is often off, so the state comes from the first source that knows the job: `squeue -t all` (the
controller, while it still holds the job), `sacct` (when accounting exists), `scontrol show job`; and in any case
from what the job itself left under `$LOG_DIR/slurm/`: `<job>.exit` (the step's exit code) and the level's run
directory (named in the job's log by `[verl-e2e] run directory: ...`, found by base.run_dirs_in), whose
summary.json holds the "result". A step started with `invoke slurm --jobid J --detach` is asked about as `J.S`:
its state from `squeue -s` / `scontrol show step`, its files under the same names.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from env.launchers.base import exit_code_of, run_dirs_in
from env.launchers.slurm_step import JOBS_SUBDIR
from env.protocol.child import pid_alive
from env.settings import TOOL_PREFIX, UsageError

ACTIVE_STATES = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING",
                 "STAGE_OUT", "SIGNALING"}
JOB_OR_STEP = re.compile(r"\d+(_\d+)?(\.\d+)?")


@dataclass
class JobStatus:
    job_id: str
    slurm_state: str | None  # RUNNING, COMPLETED, FAILED, ... (None: no Slurm source knows the job)
    state_source: str | None  # squeue | sacct | scontrol
    slurm_exit: str | None  # "3:0" from sacct/scontrol
    log: str | None
    step_exit_code: int | None  # from <job>.exit, written by the batch script
    run_dir: str | None
    result: str | None  # Pass / Fail / Blocked from the run directory's summary.json
    result_exit_code: int | None
    task_line: list[str] | None

    launcher_pid: int | None = None  # `--jobid J --detach`: the backgrounded launcher of step J.S (this host)

    @property
    def finished(self) -> bool:
        if self.step_exit_code is not None:
            return True
        if "." in self.job_id:  # a step: its exit file says it ended, or its launcher here is gone without one
            return self.slurm_state is None and self.launcher_pid is not None and not pid_alive(self.launcher_pid)
        return self.slurm_state is not None and self.slurm_state not in ACTIVE_STATES

    @property
    def exit_code(self) -> int | None:
        """The task's exit code once known (the level's result first, then the step's)."""
        if self.result_exit_code is not None:
            return self.result_exit_code
        return self.step_exit_code


def _run(argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess | None:
    """The command's result; None when it is not installed or timed out (a client retries a missing config 60 s)."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def step_state(step_id: str) -> tuple[str | None, str | None, str | None]:
    """A step's (state, source, exit) while Slurm holds it: `squeue -s`, then `scontrol show step`; a finished
    step is gone from both (without accounting), and its exit file answers instead."""
    job = step_id.split(".")[0]
    out = _run(["squeue", "-h", "-s", "-j", job, "-o", "%i"])  # squeue lists running steps only
    if out is not None and out.returncode == 0 and step_id in out.stdout.split():
        return "RUNNING", "squeue", None
    out = _run(["sacct", "-n", "-P", "-j", step_id, "-o", "State,ExitCode"])
    if out is not None and out.returncode == 0 and out.stdout.strip():
        state, _, code = out.stdout.strip().splitlines()[0].partition("|")
        return state.split()[0], "sacct", code or None
    out = _run(["scontrol", "show", "step", "-o", step_id])
    if out is not None and out.returncode == 0 and "StepId=" in out.stdout:
        fields = dict(re.findall(r"(\w+)=(\S*)", out.stdout))
        return fields.get("State"), "scontrol", None
    return None, None, None


def slurm_state(job_id: str) -> tuple[str | None, str | None, str | None]:
    """(state, source, exit "N:S") from squeue, then sacct, then scontrol; (None, None, None) if none knows it."""
    if "." in job_id:
        return step_state(job_id)
    queued = None
    out = _run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"])
    controller_down = out is None or "Unable to contact" in out.stderr
    if out is not None and out.returncode == 0 and out.stdout.strip():
        queued = out.stdout.split()[0]
        if queued in ACTIVE_STATES:
            return queued, "squeue", None  # no exit code yet; sacct/scontrol would add nothing
    out = _run(["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "State,ExitCode"])
    if out is not None and out.returncode == 0 and out.stdout.strip():
        state, _, code = out.stdout.strip().splitlines()[0].partition("|")
        return state.split()[0], "sacct", code or None
    if not controller_down:  # scontrol asks the same controller: no second wait on it
        out = _run(["scontrol", "show", "job", "-o", job_id])
        if out is not None and out.returncode == 0 and out.stdout.strip():
            fields = dict(re.findall(r"(\w+)=(\S*)", out.stdout))
            return fields.get("JobState"), "scontrol", fields.get("ExitCode")
    return (queued, "squeue", None) if queued else (None, None, None)


def find_run_dir(log: Path) -> Path | None:
    """The last run directory the job's log names (a level prints it first and last)."""
    found = run_dirs_in(log)
    return Path(found[-1]) if found else None


def job_status(job_id: str, log_dir: Path) -> JobStatus:
    if not JOB_OR_STEP.fullmatch(job_id):
        raise UsageError(f"{job_id!r} is not a Slurm job id (J, or J.S for a step)")
    jobs_dir = log_dir / JOBS_SUBDIR
    record_path = jobs_dir / f"{job_id}.json"
    record = json.loads(record_path.read_text()) if record_path.is_file() else {}
    state, source, slurm_exit = slurm_state(job_id)
    if not record and state is None:
        raise UsageError(f"job {job_id}: unknown to Slurm and no record under {jobs_dir} "
                         f"(submitted with another LOG_DIR? pass --log-dir)")
    log = Path(record.get("log") or jobs_dir / f"slurm-{job_id}.log")
    exit_file = Path(record.get("exit_file") or jobs_dir / f"{job_id}.exit")
    step_exit = None
    if exit_file.is_file() and exit_file.read_text().strip().lstrip("-").isdigit():
        step_exit = int(exit_file.read_text().strip())
    run_dir = find_run_dir(log)
    result = result_code = None
    if run_dir is not None and (run_dir / "summary.json").is_file():
        summary = json.loads((run_dir / "summary.json").read_text())
        result = summary.get("result")
        result_code = summary.get("exit_code", exit_code_of(result) if result else None)
    return JobStatus(job_id=job_id, slurm_state=state, state_source=source, slurm_exit=slurm_exit,
                     log=str(log) if log.exists() else None, step_exit_code=step_exit,
                     run_dir=str(run_dir) if run_dir else None, result=result, result_exit_code=result_code,
                     task_line=record.get("task_line"), launcher_pid=record.get("pid"))


def status_command(job_id: str, log_dir: Path, as_json: bool = False) -> int:
    """Print the job's state; exit 0 while it runs, the task's exit code once finished."""
    st = job_status(job_id, log_dir)
    if as_json:
        print(json.dumps({**asdict(st), "finished": st.finished, "exit_code": st.exit_code}, indent=2))
    else:
        task = " ".join(st.task_line) if st.task_line else "?"
        if st.slurm_state:
            print(f"job {st.job_id} ({task}): {st.slurm_state} (from {st.state_source}"
                  f"{f', exit {st.slurm_exit}' if st.slurm_exit else ''})")
        else:
            done = "finished" if st.finished else "state unknown"
            print(f"job {st.job_id} ({task}): {done} — Slurm no longer knows it (accounting off); "
                  f"from the job's own files")
        print(f"log: {st.log or 'not written yet'}")
        if st.step_exit_code is not None:
            print(f"step exit code: {st.step_exit_code}")
        if st.run_dir:
            print(f"run directory: {st.run_dir}")
        if st.result:
            print(f"result: {st.result} (exit {st.result_exit_code}, from summary.json)")
    if not st.finished:
        return 0
    return st.exit_code if st.exit_code is not None else 1


def logs_command(job_id: str, log_dir: Path, follow: bool = False, poll_s: float = 1.0,
                 timeout_s: float | None = None) -> int:
    """Print the job's log; with follow, keep printing until the job has finished and the log is drained."""
    st = job_status(job_id, log_dir)
    log = Path(st.log) if st.log else log_dir / JOBS_SUBDIR / f"slurm-{job_id}.log"
    offset, deadline = 0, None if timeout_s is None else time.monotonic() + timeout_s
    out = sys.stdout.buffer
    while True:
        if log.is_file():
            with open(log, "rb") as f:
                f.seek(offset)
                chunk = f.read()
            if chunk:
                out.write(chunk)
                out.flush()
                offset += len(chunk)
        if not follow:
            if not log.is_file():
                print(f"{TOOL_PREFIX} job {job_id}: no log yet at {log}", file=sys.stderr)
            return 0
        if st.finished:
            # one last read after the job ended, so nothing written at the very end is lost
            if log.is_file() and log.stat().st_size > offset:
                continue
            code = st.exit_code
            print(f"{TOOL_PREFIX} job {job_id} finished: {st.slurm_state or 'exit file written'}"
                  f"{f', result {st.result}' if st.result else ''}", file=sys.stderr)
            return code if code is not None else 1
        if deadline is not None and time.monotonic() > deadline:
            print(f"{TOOL_PREFIX} job {job_id} still running; stopped following", file=sys.stderr)
            return 0
        time.sleep(poll_s)
        st = job_status(job_id, log_dir)
