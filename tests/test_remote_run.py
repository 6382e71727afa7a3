"""`invoke remote` running the task: exit codes, the run directory coming back, quoting, Ctrl-C with no orphans."""

from __future__ import annotations

import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from env.launchers.remote_host import parse_host
from env.settings import UsageError
from tests import local_index
from tests.remote_fixtures import REMOTE_PYTHON, Trees, need_sshd, sshd  # noqa: F401
from tests.sshd import DIRECT_ALIAS, start_sshd

pytestmark = pytest.mark.ssh
PROJECT_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def trees(tmp_path, sshd, monkeypatch):  # noqa: F811
    return Trees(tmp_path, sshd, monkeypatch)


@pytest.mark.parametrize("code", [0, 1, 3])
def test_exit_code_is_propagated_and_the_run_directory_comes_back(trees, code):
    name = f"20260101T000000Z-level0-test-{code}"
    assert trees.invoke(["finish", "--code", str(code), "--name", name]) == code, trees.err
    local_run = trees.log_dir / name
    assert (local_run / "summary.md").read_text() == "Result: test\n"
    assert (local_run / "run.log").read_text() == "a log line\n"
    assert "some output" in trees.out  # streamed
    assert f"[verl-e2e] run directory: {local_run}" in trees.out


def test_task_line_quoting_and_remote_environment(trees, tmp_path):
    model = "org/name with spaces 'quoted' \"double\" $(touch injected) ; touch injected2"
    assert trees.invoke(["echo", "--model", model], remainder="++a=1 ++b=$(touch injected3)") == 0, trees.err
    seen = json.loads(next(line for line in trees.out.splitlines() if line.startswith("{")))
    assert seen["model"] == model
    assert seen["remainder"] == "++a=1 ++b=$(touch injected3)"
    assert seen["env"] == {"BRIDGE_REPO": str(trees.r_bridge), "VERL_REPO": str(trees.r_verl),
                           "LOG_DIR": f"{trees.r_tool}/verl_e2e_logs"}
    assert seen["cwd"] == str(trees.r_tool)
    assert not [p for p in (Path.home(), tmp_path, trees.r_tool) for p in p.glob("injected*")]


def test_local_repo_flags_are_used_here_and_not_forwarded(trees, monkeypatch):
    monkeypatch.delenv("BRIDGE_REPO")
    assert trees.invoke(["echo", "--bridge-repo", str(trees.bridge), "--model", "m"]) == 0, trees.err
    seen = json.loads(next(line for line in trees.out.splitlines() if line.startswith("{")))
    assert seen["env"]["BRIDGE_REPO"] == str(trees.r_bridge) and seen["model"] == "m"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")  # a zombie has stopped running (no init reaps it in a container)


def _start_sleepy(trees: Trees, tmp_path: Path, reaper=None) -> tuple[subprocess.Popen, list[int]]:
    """The remote `invoke sleepy` (its pids in a file: the event waited on); with `reaper`, its whole local tree
    and the remote pids (127.0.0.1) are killed when the test ends, also when it failed."""
    pids_file = tmp_path / "remote-pids"
    driver = (
        # Ctrl-C as at a terminal: a suite started from a background job (`cmd &`, nohup) inherits SIGINT
        # ignored, and Python then installs no KeyboardInterrupt (two loaded .ci/run in a `&` loop hung here)
        "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "import sys; from pathlib import Path; from env.launchers.remote import remote_task\n"
        f"sys.exit(remote_task(host={DIRECT_ALIAS!r}, forwarded=['sleepy', '--pids', {str(pids_file)!r}],"
        f" remote_root={str(trees.remote_root)!r}, ssh_config={str(trees.sshd.ssh_config)!r},"
        f" remote_python={REMOTE_PYTHON!r}, tool_repo=Path({str(trees.tool)!r}), grace_s=3))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", driver], cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    if reaper is not None:
        reaper(proc)
    deadline = time.monotonic() + 180  # generous: the event is the pid file, not the time
    while not (pids_file.exists() and pids_file.read_text().endswith("\n")):
        assert proc.poll() is None, proc.stdout.read().decode()
        assert time.monotonic() < deadline, "the remote task did not start"
        time.sleep(0.1)
    time.sleep(0.3)
    pids = [int(p) for p in pids_file.read_text().split()]
    if reaper is not None:
        for pid in pids:
            reaper(pid)
    assert all(_alive(p) for p in pids)
    return proc, pids


def _wait_dead(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


@pytest.mark.timeout(600)
def test_ctrl_c_stops_the_remote_task_and_its_children_and_still_copies_the_log(trees, tmp_path, reaper):
    proc, pids = _start_sleepy(trees, tmp_path, reaper)
    proc.send_signal(signal.SIGINT)
    try:
        output, _ = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:  # say where it stood (one loaded CI run hung here, its output lost)
        proc.kill()
        output, _ = proc.communicate()
        raise AssertionError("no exit within 300 s of Ctrl-C; output so far:\n" + output.decode()) from None
    output = output.decode()
    assert proc.returncode == 130, output
    assert _wait_dead(pids, 60) == [], "orphans left on the remote"  # the grandchild ignored SIGINT
    assert "stopping the remote task" in output
    assert (trees.log_dir / "run-sleepy/run.log").read_text() == "started\ninterrupted\n"
    assert "Traceback" not in output


@pytest.mark.timeout(600)
def test_a_failed_ctrl_c_test_leaves_nothing_running(trees, tmp_path):
    """What the reaper does when a Ctrl-C test fails midway (here: before its Ctrl-C): the local driver, its ssh,
    the remote `invoke sleepy` and its sleep child are all gone afterwards."""
    from tests.conftest import kill_tree

    registered: list = []
    proc, pids = _start_sleepy(trees, tmp_path, registered.append)
    for item in registered:  # the reaper's finaliser, run here so the test can look afterwards
        kill_tree(getattr(item, "pid", item))
    proc.wait(timeout=30)
    assert _wait_dead(pids, 60) == [], "left running after the test's finaliser"


@pytest.mark.timeout(600)
def test_a_dropped_connection_stops_the_remote_task(trees, tmp_path, reaper):
    proc, pids = _start_sleepy(trees, tmp_path, reaper)
    proc.kill()  # no chance to clean up here: the remote watcher sees the channel close
    proc.wait()
    assert _wait_dead(pids, 20) == [], "orphans left on the remote after the connection dropped"


def test_unreachable_host_is_blocked_in_one_line(trees, sshd):  # noqa: F811
    trees.sshd = sshd
    code = trees.invoke(["echo"], host="127.0.0.1:1")
    assert code == 3
    assert trees.err.startswith("error: cannot connect to 127.0.0.1:1") and trees.err.count("\n") == 1


def test_no_task_and_no_sync_only_is_bad_usage(trees):
    with pytest.raises(UsageError):
        trees.invoke([], sync_only=False)


@pytest.mark.parametrize("text, expected", [
    ("gpu01", ("gpu01", None, None)),
    ("alice@gpu01:2222", ("gpu01", "alice", 2222)),
    ("ssh://alice@10.0.0.5:22", ("10.0.0.5", "alice", 22)),
    ("bob@[fe80::1]:2200", ("fe80::1", "bob", 2200)),
])
def test_host_strings_as_ssh_takes_them(text, expected):
    spec = parse_host(text)
    assert (spec.host, spec.user, spec.port) == expected


@pytest.mark.parametrize("text", ["", "a b", "-oProxyCommand=x", "host:99999", "u@h:p"])
def test_bad_host_strings_are_refused(text):
    with pytest.raises(UsageError):
        parse_host(text)


def test_first_use_sets_up_a_venv_on_the_host(tmp_path, monkeypatch):
    """No --remote-python: the remote tool tree gets .venv with the project installed, reused afterwards.

    Offline: the host's pip sees only a local index (no config files), serving invoke and setuptools rebuilt from
    this machine's own copies.
    """
    need_sshd()
    wheels = {name: local_index.wheel_of_installed(name, tmp_path / "wheels") for name in ("invoke", "setuptools")}
    with local_index.package_index(tmp_path / "index", wheels) as url:
        pip_env = {"PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": f"{url}/simple/", "PIP_NO_CACHE_DIR": "1",
                   "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        server = start_sshd(tmp_path / "sshd", session_env=pip_env)
        try:
            trees = Trees(tmp_path / "trees", server, monkeypatch)
            assert trees.invoke(["finish", "--code", "0"], remote_python=None) == 0, trees.err
            assert (trees.r_tool / ".venv/bin/python").exists()
            assert "setting up .venv" in trees.err
            assert trees.invoke(["finish", "--code", "1"], remote_python=None) == 1, trees.err
            assert "setting up .venv" not in trees.err  # reused
        finally:
            server.stop()
    venv_invoke = subprocess.run([str(trees.r_tool / ".venv/bin/python"), "-m", "invoke", "--version"],
                                 capture_output=True, text=True)
    assert venv_invoke.stdout.split() == ["Invoke", importlib.metadata.version("invoke")]  # the one we served


def test_invoke_cli_end_to_end_runs_a_real_task_of_this_project(tmp_path, sshd):  # noqa: F811
    """`invoke remote ... judge --log FILE` through tasks.py: this project synced, the same verdict exit code."""
    log = tmp_path / "verl.log"
    log.write_text("+ VANILLA_MBRIDGE=False\nTraceback (most recent call last):\nRuntimeError: boom\n")
    env = {k: v for k, v in os.environ.items() if k not in ("BRIDGE_REPO", "VERL_REPO")}
    env["LOG_DIR"] = str(tmp_path / "logs")
    invoke = [sys.executable, "-m", "invoke"]
    local = subprocess.run([*invoke, "judge", "--log", str(log)], cwd=PROJECT_ROOT, env=env, capture_output=True)
    assert local.returncode == 1, local.stdout.decode()[-2000:]  # Fail: an error, no environment evidence
    remote_root = tmp_path / "remote root"
    remote = subprocess.run(
        [*invoke, "remote", "--host", DIRECT_ALIAS, "--ssh-config", str(sshd.ssh_config), "--remote-root",
         str(remote_root), "--remote-python", REMOTE_PYTHON, "judge", "--log", str(log)],
        cwd=PROJECT_ROOT, env=env, capture_output=True, timeout=240)
    assert remote.returncode == local.returncode, remote.stderr.decode()[-2000:]
    assert (remote_root / "verl-bridge-e2e/env/launchers/remote.py").exists()
    assert local.stdout.decode().strip().splitlines()[-1] in remote.stdout.decode()


def test_a_changed_host_key_is_refused(trees, tmp_path):
    """Known hosts from the ssh config are loaded: a host presenting another key is not connected to."""
    other_key = tmp_path / "other_host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other_key)], check=True)
    kind, key = Path(f"{other_key}.pub").read_text().split()[:2]
    known_hosts = tmp_path / "known_hosts_wrong"
    known_hosts.write_text(f"[127.0.0.1]:{trees.sshd.port} {kind} {key}\n")
    config = tmp_path / "ssh_config_wrong"
    config.write_text(trees.sshd.ssh_config.read_text().replace(
        f"UserKnownHostsFile {trees.sshd.ssh_config.parent / 'known_hosts'}", f"UserKnownHostsFile {known_hosts}"))
    trees.sshd = type(trees.sshd)(trees.sshd.port, config, trees.sshd.process, trees.sshd.log)
    assert trees.sync() == 3
    assert "BadHostKeyException" in trees.err and not trees.remote_root.exists()
