"""A node task's `ray start`: Ray's own registration timeout is tried again, any other failure stops the node.

The node script (env/launchers/slurm_ray.node_script) runs in a real bash, as a worker rank, with a `python` that
plays `ray start`: it fails the way Ray 2.x does when the raylet does not register within Ray's fixed 30 s (seen
under two full test suites on two cores), a given number of times, then starts and blocks like `ray start --block`.
The real multi-node runs are in tests/test_slurm_multinode.py; this one provokes the failure those cannot.
"""

from __future__ import annotations

import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from env.launchers.slurm_ray import REGISTRATION_TIMEOUT, START_ATTEMPTS, node_script

# argv: -c CODE ARGS... The import probe writes its output file; `start` fails while the countdown lasts.
FAKE_PYTHON = r"""#!/bin/bash
code=$2; shift 2
case "$code" in
  *ray.scripts*)
    n=$(cat "$COUNT" 2>/dev/null || echo 0); echo $((n + 1)) > "$COUNT"
    if [ "$n" -lt "$FAILURES" ]; then
      echo "Exception: $MESSAGE. This could happen because some of the raylet failed to startup"; exit 1
    fi
    echo "Ray runtime started."; exec sleep 300 ;;
  *) echo '{}' > "$1" ;;
esac
"""


def _run_worker(tmp_path: Path, failures: int, message: str) -> tuple[int, str, Path]:
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    rdv = tmp_path / "rdv"
    rdv.mkdir()
    (rdv / "up-n0").touch()  # the head is up
    env = {**os.environ, "SLURMD_NODENAME": "n1", "SLURM_NODEID": "1", "VERL_E2E_RAY_RDV": str(rdv),
           "VERL_E2E_RAY_NODES": "n0=127.0.0.1 n1=127.0.0.1", "VERL_E2E_RAY_HEAD": "n0=127.0.0.1:6379",
           "COUNT": str(tmp_path / "count"), "FAILURES": str(failures), "MESSAGE": message}
    script = node_script(python=str(python), ray_port=6379, gpus_per_node=None, worker_pythonpath="",
                         setup=[], exports=[], workdir=str(tmp_path), timeout_s=30)
    proc = subprocess.Popen(["bash", "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    deadline = time.monotonic() + 60
    while proc.poll() is None and not (rdv / "up-n1").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    (rdv / "done").touch()  # the run is over: the node stops its Ray
    out, _ = proc.communicate(timeout=60)
    return proc.returncode, out, rdv


@pytest.mark.parametrize("failures", [1, START_ATTEMPTS - 1])
def test_registration_timeout_is_started_again_and_the_node_comes_up(tmp_path, failures):
    rc, out, rdv = _run_worker(tmp_path, failures, REGISTRATION_TIMEOUT)
    assert rc == 0, out
    assert out.count("starting it again") == failures and "ray node up at 127.0.0.1" in out
    assert "ray stopped" in out and (rdv / "stopped-n1").exists() and not (rdv / "failed-n1").exists()
    assert (tmp_path / "count").read_text().strip() == str(failures + 1)
    assert REGISTRATION_TIMEOUT in (rdv / "ray-n1.log.1").read_text()  # the failed try's log is kept


@pytest.mark.parametrize("failures,message,attempts", [
    (START_ATTEMPTS, REGISTRATION_TIMEOUT, START_ATTEMPTS),  # every try times out: the node gives up
    (1, "Failed to connect to GCS at address 127.0.0.1:6379", 1),  # not Ray's wait: no second try
])
def test_other_start_failures_stop_the_node_at_once(tmp_path, failures, message, attempts):
    rc, out, rdv = _run_worker(tmp_path, failures, message)
    assert rc == 3, out
    assert "ray start failed:" in out and message in out and (rdv / "failed-n1").exists()
    assert not (rdv / "up-n1").exists()
    assert (tmp_path / "count").read_text().strip() == str(attempts)
