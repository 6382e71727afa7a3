"""Unit tests of the plumbing: settings precedence, secret redaction, the tee launcher, forwarded task lines."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import pytest

from env.protocol.cli import split_forwarded
from env.settings import UsageError, resolve
from sessions.run.launch import Redactor, run_logged


def test_settings_precedence_flag_env_config_default(tmp_path):
    env = {"MODEL_ID": "Env/Model", "LOG_DIR": str(tmp_path / "env-logs")}
    config = {"model_id": "Yaml/Model", "log_dir": str(tmp_path / "yaml-logs"), "verl_image": "verlai/verl:yaml"}
    r = resolve({"model_id": "Flag/Model"}, env, config)
    assert (r.model_id, r.source("model_id")) == ("Flag/Model", "flag")
    assert (r.log_dir, r.source("log_dir")) == (tmp_path / "env-logs", "env")
    assert (r.verl_image, r.source("verl_image")) == ("verlai/verl:yaml", "invoke.yaml")
    assert r.source("stall_timeout") == "default" and r.stall_timeout == 30.0
    assert r.source("bridge_repo") == "unset" and r.bridge_repo is None


def test_settings_reject_bad_values():
    with pytest.raises(UsageError, match="NUM_GPUS='x' is not a valid int"):
        resolve({}, {"NUM_GPUS": "x"}, {})
    with pytest.raises(UsageError, match="unknown setting"):
        resolve({"nope": 1}, {}, {})


@pytest.mark.parametrize("cut", range(1, 30))
def test_redactor_masks_a_secret_split_across_chunks(cut):
    secret = b"hf_SECRETVALUE123"
    stream = b"before " + secret + b" after " + secret[:5] + b" end"
    r = Redactor([secret])
    out = r.feed(stream[:cut]) + r.feed(stream[cut:]) + r.flush()
    assert out == b"before *** after hf_SE end"


def test_redactor_holds_back_only_a_possible_secret_prefix():
    r = Redactor([b"hf_SECRET"])
    assert r.feed(b"line one\n") == b"line one\n"
    assert r.feed(b"token hf_SE") == b"token "
    assert r.feed(b"X") == b"hf_SEX"


def test_run_logged_tees_everything_and_reports_the_exit_code(tmp_path):
    script = tmp_path / "w.sh"
    script.write_text("echo out; echo err >&2; printf 'a\\rb\\n'; exit 7\n")
    log_path = tmp_path / "log"
    echo = io.BytesIO()
    with open(log_path, "wb") as log:
        res = run_logged(["bash", str(script)], cwd=tmp_path, env={"PATH": "/usr/bin:/bin"}, log=log,
                         log_path=log_path, echo=echo)
    assert res.exit_code == 7 and res.termination is None
    data = log_path.read_bytes()
    assert b"out\n" in data and b"err\n" in data and b"a\rb\n" in data
    assert echo.getvalue() == data


def test_run_logged_stall_timeout_stops_the_group(tmp_path):
    log_path = tmp_path / "log"
    with open(log_path, "wb") as log:
        res = run_logged([sys.executable, "-c", "import time; print('started', flush=True); time.sleep(600)"],
                         cwd=tmp_path, env={}, log=log, log_path=log_path, echo=io.BytesIO(), stall_timeout=1.5)
    assert res.termination == "timeout" and res.duration_s < 30
    assert b"started" in Path(log_path).read_bytes()


def test_run_logged_stops_the_group_when_the_tool_itself_fails(tmp_path):
    """A watch that raises (a bug in the tool) must not leave the trainer running: the group is killed, the
    error propagates, the log keeps what came."""
    log_path, pid_file = tmp_path / "log", tmp_path / "pid"

    def broken_watch() -> str | None:
        if pid_file.exists() and b"started" in log_path.read_bytes():
            raise RuntimeError("the tool's own bug")
        return None

    code = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); print('started', flush=True); " \
           "time.sleep(600)"
    with open(log_path, "wb") as log, pytest.raises(RuntimeError, match="the tool's own bug"):
        run_logged([sys.executable, "-c", code], cwd=tmp_path, env={}, log=log, log_path=log_path,
                   echo=io.BytesIO(), watch=broken_watch)
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert b"started" in log_path.read_bytes()


def test_split_forwarded_cuts_after_the_forwarding_tasks_own_flags():
    flags = {"remote": {"--host", "--remote-root"}, "slurm": {"--image"}}
    toks = ["remote", "--host", "level1", "--force", "level1", "--model", "A/B"]
    assert split_forwarded(toks, flags) == (["remote", "--host", "level1", "--force"],
                                           {"remote": ["level1", "--model", "A/B"]})
    assert split_forwarded(["level0", "--dry-run"], flags) == (["level0", "--dry-run"], {})
    assert split_forwarded(["slurm", "--image=x", "level0"], flags) == (["slurm", "--image=x"], {"slurm": ["level0"]})
