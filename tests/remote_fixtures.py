"""Fixtures for the `invoke remote` tests: the test sshd, and small git repos shaped like the three synced trees.

Imported by tests/test_remote*.py (no conftest): a Bridge-shaped repo with a real `3rdparty/Megatron-LM` submodule,
a verl-shaped repo with a tracked file under an ignored path, and a tool repo whose tasks.py has cheap tasks that
stand in for level tasks (print args, write a run directory, run until interrupted).
"""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import git
import pytest

from env.launchers.remote import remote_task
from tests.sshd import DIRECT_ALIAS, REQUIRE_ENV, Sshd, sshd_available, sshd_required, start_sshd

ACTOR = git.Actor("Test", "test@example.com")
REMOTE_PYTHON = sys.executable  # the "remote" is this machine: its venv has invoke


def need_sshd() -> None:
    """Skip without sshd, ssh and rsync; fail instead where they are required (CI)."""
    if not sshd_available():
        why = "needs sshd, ssh and rsync (.ci/run installs them)"
        if sshd_required():
            pytest.fail(f"{why}; {REQUIRE_ENV}=1")
        pytest.skip(why)


@pytest.fixture(scope="module")
def sshd(tmp_path_factory) -> Sshd:
    need_sshd()
    server = start_sshd(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


def commit_all(repo_dir: Path, message: str = "commit") -> str:
    repo = git.Repo(repo_dir)
    repo.git.add("-A")
    return repo.index.commit(message, author=ACTOR, committer=ACTOR).hexsha


def write(path: Path, text: str, mode: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if mode is not None:
        path.chmod(mode)
    return path


def make_megatron(root: Path) -> Path:
    repo_dir = root / "Megatron-LM-origin"
    git.Repo.init(repo_dir, initial_branch="main")
    write(repo_dir / "megatron/core/__init__.py", "CORE = 1\n")
    write(repo_dir / "megatron/core/parallel_state.py", "TP = 1\n")
    commit_all(repo_dir, "megatron core")
    return repo_dir


def make_bridge(root: Path) -> Path:
    """Megatron-Bridge-shaped: src/megatron/bridge, a real submodule at 3rdparty/Megatron-LM."""
    megatron = make_megatron(root)
    repo_dir = root / "Megatron-Bridge"
    repo = git.Repo.init(repo_dir, initial_branch="main")
    write(repo_dir / "src/megatron/bridge/__init__.py", "__version__ = '0.0.test'\n")
    write(repo_dir / "src/megatron/bridge/models/provider.py", "class Provider:\n    tp = 1\n")
    write(repo_dir / "README.md", "bridge\n")
    write(repo_dir / "scripts/run.sh", "#!/bin/sh\necho run\n", mode=0o755)
    write(repo_dir / ".gitignore", "*.log\n")
    repo.git.execute(["git", "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(megatron),
                      "3rdparty/Megatron-LM"])
    commit_all(repo_dir, "bridge with submodule")
    return repo_dir


def make_verl(root: Path) -> Path:
    """verl-shaped: .gitignore says `dataset/`, yet verl/utils/dataset/rl_dataset.py is tracked."""
    repo_dir = root / "verl"
    repo = git.Repo.init(repo_dir, initial_branch="main")
    write(repo_dir / ".gitignore", "dataset/\n__pycache__/\n")
    write(repo_dir / "verl/__init__.py", "")
    write(repo_dir / "verl/trainer/main_ppo.py", "def main():\n    pass\n")
    write(repo_dir / "verl/utils/dataset/rl_dataset.py", "ROWS = 1\n")
    write(repo_dir / "tests/special_e2e/run_ppo_trainer_megatron.sh", "#!/bin/bash\nset -xeuo pipefail\n",
          mode=0o755)
    repo.git.add("-A")
    repo.git.add("-f", "verl/utils/dataset/rl_dataset.py")
    repo.index.commit("verl", author=ACTOR, committer=ACTOR)
    return repo_dir


TOOL_TASKS = r'''
"""Stand-ins for level tasks, run remotely by the tests."""
import json, os, signal, subprocess, sys, time
from pathlib import Path
from invoke import task


def _run_dir(name):
    d = Path(os.environ["LOG_DIR"]) / name
    d.mkdir(parents=True, exist_ok=True)
    return d


@task
def echo(c, model=None, marker=None):
    """Print the arguments and environment it got, as JSON."""
    # invoke 2.2 has no c.remainder: what followed `--`, space-joined as invoke 3 gives it
    remainder = " ".join(sys.argv[sys.argv.index("--") + 1:]) if "--" in sys.argv else ""
    print(json.dumps({"model": model, "remainder": remainder, "cwd": os.getcwd(),
                      "env": {k: os.environ.get(k) for k in ("BRIDGE_REPO", "VERL_REPO", "LOG_DIR")}}))


@task
def finish(c, code=0, name="run-finish"):
    """Write a run directory, print its marker line, exit with --code."""
    d = _run_dir(name)
    (d / "summary.md").write_text("Result: test\n")
    (d / "run.log").write_text("a log line\n")
    print("some output", flush=True)
    print(f"[verl-e2e] run directory: {d}", flush=True)
    sys.exit(int(code))


@task
def sleepy(c, pids):
    """Run until interrupted; a grandchild that ignores SIGINT must be cleaned up by the remote wrapper."""
    d = _run_dir("run-sleepy")
    log = d / "run.log"
    log.write_text("started\n")
    grandchild = subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(600)"])
    Path(pids).write_text(f"{os.getpid()} {grandchild.pid}\n")
    print("sleeping", flush=True)
    try:
        time.sleep(600)
    except KeyboardInterrupt:
        with log.open("a") as f:
            f.write("interrupted\n")
        print(f"[verl-e2e] run directory: {d}", flush=True)
        sys.exit(130)
'''


def make_tool(root: Path) -> Path:
    repo_dir = root / "tool"
    git.Repo.init(repo_dir, initial_branch="main")
    write(repo_dir / "tasks.py", TOOL_TASKS)
    write(repo_dir / ".gitignore", ".venv/\nverl_e2e_logs/\n__pycache__/\n*.egg-info/\n")
    write(repo_dir / "pyproject.toml",
          '[build-system]\nrequires = ["setuptools>=64"]\nbuild-backend = "setuptools.build_meta"\n'
          '[project]\nname = "tool-under-test"\nversion = "0"\ndependencies = ["invoke>=2"]\n'
          '[tool.setuptools]\npy-modules = ["tasks"]\n')
    commit_all(repo_dir, "tool")
    return repo_dir


class Trees:
    """Local Bridge/verl/tool checkouts plus a remote root, and a `sync`/`run` that call the task body."""

    def __init__(self, root: Path, sshd: Sshd, monkeypatch, remote_root: Path | None = None) -> None:
        self.sshd = sshd
        self.local = root / "local"
        self.bridge = make_bridge(self.local)
        self.verl = make_verl(self.local)
        self.tool = make_tool(self.local)
        self.remote_root = remote_root or (root / "remote")
        self.log_dir = root / "local-logs"
        monkeypatch.setenv("BRIDGE_REPO", str(self.bridge))
        monkeypatch.setenv("VERL_REPO", str(self.verl))
        monkeypatch.setenv("LOG_DIR", str(self.log_dir))
        self.out = ""
        self.err = ""

    @property
    def r_bridge(self) -> Path:
        return self.remote_root / "Megatron-Bridge"

    @property
    def r_verl(self) -> Path:
        return self.remote_root / "verl"

    @property
    def r_tool(self) -> Path:
        return self.remote_root / "verl-bridge-e2e"

    def invoke(self, forwarded: list[str] | None = None, host: str = DIRECT_ALIAS, **flags) -> int:
        out, err = io.BytesIO(), io.BytesIO()
        flags.setdefault("sync_only", not forwarded)
        code = remote_task(host=host, forwarded=forwarded or [], remote_root=str(self.remote_root),
                           ssh_config=str(self.sshd.ssh_config), remote_python=flags.pop("remote_python", REMOTE_PYTHON),
                           tool_repo=self.tool, out=out, err=err, **flags)
        self.out, self.err = out.getvalue().decode(), err.getvalue().decode()
        return code

    def sync(self, **flags) -> int:
        return self.invoke(None, **flags)


def tree_snapshot(root: Path) -> dict[str, bytes]:
    """Every file under root except git's own directories: relative path -> bytes (symlinks: their target)."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if ".git" in rel.parts or path.is_dir() and not path.is_symlink():
            continue
        out[str(rel)] = path.readlink().as_posix().encode() if path.is_symlink() else path.read_bytes()
    return out


def git_out(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout
