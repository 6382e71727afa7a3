"""`invoke remote`: sync the exact local changes to a GPU host, run the same task there, bring its run directory back.

The connection is Fabric's (host strings as ssh takes them: `user@host:port` or an alias of the ssh config, with
ProxyJump); rsync goes through `ssh` with the same config file. Every remote command is one `bash -lc <quoted>`
line (the login shell gives the host's own PATH, modules and HF_HOME), built from shlex-quoted parts only.

The task runs under a small remote wrapper: the task gets its own session (setsid) so the whole process group can
be stopped, and a watcher reads the SSH channel's stdin: when it closes (our Ctrl-C sends EOF, or the connection
drops) the task is interrupted, then terminated, then killed — nothing keeps running on the GPU host.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from env.launchers.base import (
    EXIT_BAD_USAGE,
    EXIT_BLOCKED,
    EXIT_INTERRUPTED,
    Launcher,
    LaunchPlan,
    TaskLine,
    run_dirs_in,
)
from env.launchers.remote_host import RemoteHost, RemoteUnavailable, parse_host
from env.launchers.sync import SyncPlan, TransferFailed, apply_plan, local_trees, make_plan
from env.protocol import lines
from env.settings import PROJECT_ROOT, UsageError, resolve

DEFAULT_REMOTE_ROOT = "verl-e2e"  # under the remote home
REMOTE_DIR_NAMES = {"bridge": "Megatron-Bridge", "verl": "verl", "tool": "verl-bridge-e2e"}
RESET_SIGINT_AND_EXEC = "import os,signal,sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])"


# ---------------------------------------------------------------------------------------------------------------
# The task


@dataclass
class RemoteLayout:
    tool: str
    bridge: str | None
    verl: str | None


AFTER_CTRL_C_S = 120.0  # the most each step after an interrupted remote task (listing, copy back) may take


def _remote_path(path: str) -> str:
    """`~/x` means x under the remote home (a quoted path is not tilde-expanded); relative paths are home-based."""
    if path in ("~", "~/"):
        return "."
    return path[2:] if path.startswith("~/") else path


def layout(remote_root: str | None, bridge_path: str | None, verl_path: str | None, tool_path: str | None,
           sync_bridge: bool, sync_verl: bool) -> RemoteLayout:
    root = _remote_path(remote_root or DEFAULT_REMOTE_ROOT).rstrip("/") or "/"

    def under(name: str) -> str:
        return f"{root}/{REMOTE_DIR_NAMES[name]}" if root != "/" else f"/{REMOTE_DIR_NAMES[name]}"

    return RemoteLayout(
        tool=_remote_path(tool_path) if tool_path else under("tool"),
        bridge=(_remote_path(bridge_path) if bridge_path else under("bridge")) if sync_bridge else None,
        verl=(_remote_path(verl_path) if verl_path else under("verl")) if sync_verl else None,
    )


REPO_FLAGS = ("--bridge-repo", "--verl-repo")


def take_repo_flags(forwarded: list[str]) -> tuple[list[str], dict[str, str]]:
    """--bridge-repo/--verl-repo in the forwarded task line name local checkouts: use them, do not forward them."""
    if not forwarded:
        return [], {}
    line, taken = TaskLine(forwarded[0], forwarded[1:]).without_flags(REPO_FLAGS)
    return line.tokens, {k[2:].replace("-", "_"): v for k, v in taken.items()}


def task_wrapper_script(*, tool: str, python: str | None, env: dict[str, str], task_line: list[str],
                        grace_s: int) -> str:
    """The bash program the login shell runs on the host: venv on first use, the task in its own session, watcher."""
    q = shlex.quote
    if python:
        setup = f"py={q(python)}"
    else:
        setup = (
            "if [ ! -x .venv/bin/python ] || ! cmp -s pyproject.toml .venv/verl-e2e-pyproject.toml; then "
            "echo '[verl-e2e] remote: setting up .venv (first use or pyproject.toml changed)' >&2; "
            "python3 -m venv .venv && .venv/bin/python -m pip install -q -e . "
            "&& cp pyproject.toml .venv/verl-e2e-pyproject.toml || exit 3; fi; py=.venv/bin/python")
    exports = " ".join(f"{k}={q(v)}" for k, v in env.items())
    command = " ".join(q(a) for a in task_line)
    return "\n".join([
        f"cd {q(tool)} || exit 3",
        setup,
        f"export {exports}" if exports else ":",
        'exec 3<&0',  # the watcher's copy of the channel's stdin (a background job would get /dev/null)
        # bash starts background jobs with SIGINT ignored (no job control); give the task the default back
        f'setsid "$py" -c {q(RESET_SIGINT_AND_EXEC)} "$py" -m invoke {command} </dev/null &',
        "task=$!",
        'alive() { kill -0 -- -"$task" 2>/dev/null; }',
        "stop_task() {",
        '  alive || return 0; kill -INT -- -"$task" 2>/dev/null',
        f'  n=0; while alive && [ "$n" -lt {int(grace_s) * 5} ]; do sleep 0.2; n=$((n+1)); done',
        '  alive && kill -TERM -- -"$task" 2>/dev/null',
        '  n=0; while alive && [ "$n" -lt 25 ]; do sleep 0.2; n=$((n+1)); done',
        '  alive && kill -KILL -- -"$task" 2>/dev/null; return 0',
        "}",
        "( trap '' PIPE  # after a dropped connection, writing our note must not kill the watcher",
        "  while IFS= read -r _ <&3; do :; done",
        "  echo '[verl-e2e] remote: stop requested, interrupting the task' >&2; stop_task ) &",
        "watcher=$!",
        'wait "$task"; rc=$?',
        "# what the task left running in its session is stopped too (no orphans on the GPU host)",
        'if alive; then kill -TERM -- -"$task" 2>/dev/null; sleep 1; kill -KILL -- -"$task" 2>/dev/null; fi',
        'kill "$watcher" 2>/dev/null',
        'exit "$rc"',
    ])


def remote_task(
    *,
    host: str,
    forwarded: list[str],
    remainder: str = "",
    remote_root: str | None = None,
    bridge_path: str | None = None,
    verl_path: str | None = None,
    tool_path: str | None = None,
    sync_only: bool = False,
    force: bool = False,
    checkout: bool = False,
    dry_run: bool = False,
    ssh_config: str | None = None,
    remote_python: str | None = None,
    tool_repo: Path = PROJECT_ROOT,
    grace_s: int = 60,
    out: BinaryIO | None = None,
    err: BinaryIO | None = None,
) -> int:
    """The body of `invoke remote`; returns the exit code (the remote task's, or 2/3 for our own failures)."""
    from env.protocol.relay import Relay

    out = out or Relay()  # the task's status lines: one line redrawn in place on a terminal
    err = err or sys.stderr.buffer

    def say(text: str) -> None:
        out.write((text + "\n").encode())
        out.flush()

    if not forwarded and not sync_only:
        raise UsageError("name the task to run on the host (e.g. `invoke remote --host gpu01 level0 ...`) "
                         "or pass --sync-only")
    # bad usage (the host, the task line) is refused before the environment is looked at: exit 2, not 3
    parse_host(host)
    line, repo_flags = None, {}
    if forwarded:
        line, taken = TaskLine.parse(forwarded, remainder, launcher="remote").without_flags(REPO_FLAGS)
        repo_flags = {k[2:].replace("-", "_"): v for k, v in taken.items()}
    missing = [tool for tool in ("ssh", "rsync") if shutil.which(tool) is None]
    if missing and not dry_run:  # a missing dependency, as everywhere else: Blocked, one line, nothing touched
        err.write(f"error: {' and '.join(missing)} not found on PATH: install {' '.join(missing)} "
                  f"(e.g. apt-get install openssh-client rsync)\n".encode())
        err.flush()
        return EXIT_BLOCKED
    task_line = [line.task, *line.args] if line else []
    settings = resolve(repo_flags)
    ssh_config = ssh_config or os.environ.get("VERL_E2E_SSH_CONFIG") or None
    ssh_config_path = Path(os.path.expanduser(ssh_config)).absolute() if ssh_config else None
    remote_python = remote_python or os.environ.get("VERL_E2E_REMOTE_PYTHON") or None
    where = layout(remote_root, bridge_path, verl_path, tool_path,
                   sync_bridge=settings.bridge_repo is not None, sync_verl=settings.verl_repo is not None)
    trees = local_trees("tool", Path(tool_repo), where.tool)
    if settings.bridge_repo is not None:
        trees += local_trees("bridge", settings.bridge_repo, where.bridge)
    if settings.verl_repo is not None:
        trees += local_trees("verl", settings.verl_repo, where.verl)

    remote = RemoteHost(host, ssh_config_path, remote_python)
    try:
        remote.open()
        plan = make_plan(remote, trees, force=force, checkout=checkout)
        say(f"[verl-e2e] sync plan for {remote.display}:\n{plan.describe()}")
        for name in ("bridge", "verl"):
            if getattr(settings, f"{name}_repo") is None:
                say(f"  {name}: not synced ({name.upper()}_REPO is not set here)")
        refusals = plan.refusals(force)
        if refusals:
            for line in refusals:
                err.write(f"error: {line}\n".encode())
            err.flush()
            return EXIT_BAD_USAGE
        roots = {p.tree.name: p.remote_root for p in plan.trees}
        command = None
        if task_line:
            command = _task_command(roots, settings_paths=where, line=line, python=remote_python,
                                    grace_s=grace_s)
        if dry_run:
            say("[verl-e2e] dry run: nothing written, nothing run")
            if command:
                say(f"[verl-e2e] remote command on {remote.display}:\n{command}")
            return 0
        result = apply_plan(remote, plan, force=force)
        say(f"[verl-e2e] synced: {_counts(plan)}; {result.bytes_sent} bytes sent")
        if command is None:
            return 0
        remote_log_dir = f"{roots['tool']}/verl_e2e_logs"
        before = set(remote.helper("probe", {"trees": [], "list_dirs": [remote_log_dir]})["listings"][0]["entries"])
        say(f"[verl-e2e] running on {remote.display}: {' '.join(shlex.quote(a) for a in task_line)}")
        run_dirs: list[str] = []

        def watch(output_line: bytes) -> None:
            run_dirs.extend(run_dirs_in(output_line))

        status, interrupted = remote.stream(command, out, err, on_line=watch, stop_wait_s=grace_s + 60)
        # after Ctrl-C every remaining step is bounded: the user asked to get out, with the log if it comes
        bound = AFTER_CTRL_C_S if interrupted else None
        if not run_dirs:  # the task died before printing it: take what appeared in the remote LOG_DIR
            after = remote.helper("probe", {"trees": [], "list_dirs": [remote_log_dir]},
                                  timeout_s=bound)["listings"][0]["entries"]
            run_dirs = [f"{remote_log_dir}/{name}" for name in sorted(set(after) - before)]
        _copy_back(remote, run_dirs, roots["tool"], Path(settings.log_dir), say, timeout_s=bound)
        if status is None:
            err.write(f"error: lost the connection to {remote.display} before the task finished\n".encode())
            return EXIT_INTERRUPTED if interrupted else EXIT_BLOCKED
        return status
    except (RemoteUnavailable, TransferFailed) as e:
        err.write(f"error: {e}\n".encode())
        err.flush()
        return EXIT_BLOCKED
    finally:
        remote.close()
        if isinstance(out, Relay):
            out.close()


def _counts(plan: SyncPlan) -> str:
    return ", ".join(f"{p.tree.name} {len(p.writes)} written/{len(p.deletes)} deleted ({p.action})"
                     for p in plan.trees)


def _task_command(roots: dict[str, str], *, settings_paths: RemoteLayout, line: TaskLine, python: str | None,
                  grace_s: int) -> str:
    env = {"LOG_DIR": f"{roots['tool']}/verl_e2e_logs"}
    if settings_paths.bridge is not None:
        env["BRIDGE_REPO"] = roots["bridge"]
    if settings_paths.verl is not None:
        env["VERL_REPO"] = roots["verl"]
    script = task_wrapper_script(tool=roots["tool"], python=python, env=env, task_line=line.tokens, grace_s=grace_s)
    return f"bash -lc {shlex.quote(script)}"


def _copy_back(remote: RemoteHost, run_dirs: list[str], remote_tool: str, local_log_dir: Path, say,
               timeout_s: float | None = None) -> None:
    import subprocess

    for run_dir in dict.fromkeys(run_dirs):
        source = run_dir if run_dir.startswith("/") else f"{remote_tool}/{run_dir}"
        target = local_log_dir / Path(source.rstrip("/")).name
        target.mkdir(parents=True, exist_ok=True)
        try:
            proc = subprocess.run(["rsync", "-a", "-s", "-e", remote.rsync_ssh_command(),
                                   remote.rsync_target(source.rstrip("/") + "/"), f"{target}/"],
                                  capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            say(f"[verl-e2e] could not copy {remote.display}:{source} back within {timeout_s:.0f}s of Ctrl-C: "
                f"it stays there (rsync it yourself)")
            continue
        if proc.returncode != 0:
            say(f"[verl-e2e] could not copy {remote.display}:{source} back: {proc.stderr.strip()[-300:]}")
            continue
        say(f"[verl-e2e] copied {remote.display}:{source} back")
        say(lines.run_dir_line(target))
        lines.note_run_dir(target)


@dataclass
class RemotePlan(LaunchPlan):
    """What `invoke remote` will do before it connects: the host, the task line, the remote layout."""

    host: str
    line: TaskLine | None
    layout: RemoteLayout
    options: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def describe(self) -> str:
        return (f"# on {self.host}: sync Bridge, verl and this project into {self.layout}, then run: "
                f"{self.line or '(nothing: --sync-only)'}\n")


class RemoteLauncher(Launcher):
    """base.py's interface over `remote_task`: the sync plan needs the host, so the dry-run is remote_task's own
    (it connects, plans the sync, writes and runs nothing); attached only, no detached jobs."""

    name = "remote"

    def __init__(self, host: str, line: TaskLine | None, **options):
        self.host, self.line, self.options = host, line, options

    def plan(self) -> RemotePlan:
        o = self.options
        where = layout(o.get("remote_root"), o.get("bridge_path"), o.get("verl_path"), o.get("tool_path"), True, True)
        return RemotePlan(host=self.host, line=self.line, layout=where, options=dict(o))

    def _run(self, dry_run: bool) -> int:
        forwarded = [self.line.task, *self.line.args] if self.line else []
        remainder = shlex.join(self.line.overrides) if self.line else ""
        return remote_task(host=self.host, forwarded=forwarded, remainder=remainder, dry_run=dry_run,
                           **self.options)

    def run_attached(self, plan: RemotePlan) -> int:  # type: ignore[override]
        return self._run(dry_run=False)

    def launch(self, *, dry_run: bool = False, detach: bool = False) -> int:
        if detach:
            return super().launch(detach=True)  # refused: no detached remote runs
        return self._run(dry_run=dry_run)
