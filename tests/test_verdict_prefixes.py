"""Ray's line prefixes (ray/_private/worker.py print_worker_logs: `({actor or task name} pid={pid}[, ip={ip}])`, Ray's
daemons `(raylet)` / `(autoscaler +TIME)`), as FORMATS.md lists them and as newer verl's named colocated workers
print them (`(wiQkzJWorkerDict_0:0 WorkerDict pid=N)`): every form is stripped and names its source."""

from __future__ import annotations

import re

import pytest

from sessions.judge.logstream import LOG_LINE_START_RE, RAY_PREFIX_BYTES_RE, normalise
from sessions.judge.verdict import judge_lines
from tests.conftest import real_logs


@pytest.mark.parametrize("line, source, inner", [
    ("(TaskRunner pid=811) step:1 - a:1", "TaskRunner", None),
    ("(TaskRunnerV1 pid=811) x", "TaskRunnerV1", None),
    ("(main_task pid=926049) x", "main_task", None),
    ("(WorkerDict pid=1234, ip=10.0.0.4) x", "WorkerDict", None),
    ("(WorkerDict pid=1234, ip=fe80::1:2) x", "WorkerDict", None),
    ("(pid=1234) x", "pid", None),
    ("(pid=1234, ip=10.0.0.4) x", "pid", None),
    ("(raylet) A worker died or was killed", "raylet", None),
    ("(raylet, ip=10.0.0.4) x", "raylet", None),
    ("(autoscaler +1m30s) Resized to 8 CPUs", "autoscaler", None),
    ("(wiQkzJWorkerDict_0:0 WorkerDict pid=1234) x", "WorkerDict", None),
    ("(wiQkzJWorkerDict_0:1 WorkerDict pid=1234, ip=10.0.0.4) x", "WorkerDict", None),
    ("(vLLMHttpServer pid=5957) (EngineCore_DP0 pid=6364) ERROR x", "vLLMHttpServer", "EngineCore_DP0"),
    ("(vLLMHttpServer pid=5957, ip=10.0.0.4) (Worker pid=6364) x", "vLLMHttpServer", "Worker"),
    ("\x1b[36m(AgentLoopWorker pid=33)\x1b[0m x", "AgentLoopWorker", None),
    ("[36m(FullyAsyncTrainer pid=33)[0m x", "FullyAsyncTrainer", None),
    ("(FullyAsyncTaskRunner) x", "FullyAsyncTaskRunner", None),  # shortened by a log's author
    ("(my_remote_fn pid=77) x", "my_remote_fn", None),  # a task: its function name
    ("(ServeReplica:app:Model pid=5) x", "ServeReplica:app:Model", None),
    # vLLM's own multiprocess prefix, relayed by a Ray actor, bold-coloured (its residue after a paste)
    ("(VllmWorker rank=0 pid=8493) INFO x", "VllmWorker", None),
    ("(vLLMHttpServer pid=5) (VllmWorker rank=1 pid=219) INFO x", "vLLMHttpServer", "VllmWorker"),
    ("[1;36m(VllmWorker rank=1 pid=219)[0;0m INFO x", "VllmWorker", None),
    ("\x1b[1;36m(VllmWorker rank=1 pid=219)\x1b[0;0m INFO x", "VllmWorker", None),
])
def test_every_ray_prefix_form_is_stripped_and_names_its_source(line, source, inner):
    (got,) = normalise(line)
    assert (got.source, got.inner, got.text) == (source, inner, "ERROR x" if "ERROR" in line else got.text)
    assert not got.text.startswith("("), got.text
    raw = line.encode()
    if not raw.startswith((b"\x1b", b"[")):  # the byte readers see a prefix where normalise does
        assert RAY_PREFIX_BYTES_RE.match(raw)
        # and a hard-wrap join stops before it (a bare `(Name)` could be a wrapped piece's text)
        assert LOG_LINE_START_RE.match(raw) or source == "FullyAsyncTaskRunner"


@pytest.mark.parametrize("line", [
    "(pid=178790, ip=10.244.234.171, actor_id=ddfa, repr=<verl.WorkerDict object at 0x7f>) x",  # a traceback's
    "(most recent call last): x",
    "(1) a list item",
])
def test_what_is_no_ray_prefix_is_left_alone(line):
    (got,) = normalise(line)
    assert (got.source, got.text) == (None, line)


def test_an_exception_under_a_named_colocated_worker_prefix_is_that_worker_s():
    prefix = "(wiQkzJWorkerDict_0:0 WorkerDict pid=4242)"
    verdict = judge_lines([
        "(TaskRunner pid=1) Training Progress:   0%|          | 0/5 [00:00<?, ?it/s]",
        f"{prefix} Traceback (most recent call last):",
        f'{prefix}   File "/verl/verl/workers/megatron_workers.py", line 9, in update_actor',
        f"{prefix} ValueError: boom in the worker",
    ])
    assert verdict.first_error == "(WorkerDict) ValueError: boom in the worker", verdict.first_error


def test_every_prefix_in_the_real_logs_is_recognised():
    ansi = re.compile(r"\x1b\[[0-9;]*m")
    shape = re.compile(r"^\((?:[^()]*? )?pid=\d+(?:, ip=[\d.]+)?\)")
    seen = set()
    for path in sorted(real_logs().glob("*.log")):
        for raw in path.read_text(encoding="utf-8", errors="replace").splitlines():
            line = ansi.sub("", raw)
            found = shape.match(line)
            if not found:
                continue
            form = re.sub(r"\d+", "N", found.group(0))
            if form in seen:
                continue
            seen.add(form)
            got = normalise(line)
            assert got and got[0].source is not None and not got[0].text.startswith(found.group(0)), line
    assert "(wiQkzJWorkerDict_N:N WorkerDict pid=N)" in seen and "(WorkerDict pid=N, ip=N.N.N.N)" in seen
