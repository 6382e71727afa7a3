"""Unit tests of the verdict engine's pieces: normaliser, metrics parser, pattern table, streaming scanner."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from sessions.judge import patterns
from sessions.judge.logstream import join_wrapped, normalise, scan_file
from sessions.judge.verdict import ALL_NEEDLES, judge_command, judge_lines, judge_log, parse_metrics


def test_normalise_strips_ansi_nested_prefixes_repeated_and_timestamps():
    raw = ("2026-08-14T12:00:01.5Z \x1b[36m(vLLMHttpServer pid=2301, ip=10.0.0.4)\x1b[0m (EngineCore pid=7) "
           "ERROR boom [repeated 3x across cluster]")
    (line,) = normalise(raw)
    assert (line.source, line.inner, line.text) == ("vLLMHttpServer", "EngineCore", "ERROR boom")


def test_normalise_splits_carriage_return_redraws_and_drops_own_header():
    lines = normalise("(TaskRunnerV1 pid=1) \rTraining Progress:  0%| 0/2\rTraining Progress: 50%| 1/2")
    assert [line.text for line in lines] == ["Training Progress:  0%| 0/2", "Training Progress: 50%| 1/2"]
    assert normalise("[verl-e2e] VANILLA_MBRIDGE=False") == []


def test_parse_metrics_handles_numpy_nan_inf_and_scientific():
    metrics = parse_metrics("a/x:np.float64(0.5) - b:np.int64(3) - c:nan - d:-inf - e:1.5e-05 - f:text")
    assert metrics["a/x"] == 0.5 and metrics["b"] == 3 and math.isnan(metrics["c"])
    assert metrics["d"] == -math.inf and metrics["e"] == 1.5e-05 and "f" not in metrics


def test_every_pattern_is_reachable_through_the_prefilter():
    scan = patterns.SCAN_NEEDLES + (patterns.LAST_ONLY_NEEDLE,)
    for pattern in patterns.PATTERNS:
        if pattern.kind in ("ignore", "noise", "exception") or not pattern.needle:
            continue
        anchor = pattern.covered_by or pattern.needle
        assert any(needle in anchor for needle in scan), pattern.name
        if pattern.covered_by:
            assert pattern.covered_by in scan, pattern.name


def test_categories_have_hints_and_follow_ups():
    from sessions.judge.verdict import CATEGORIES

    assert set(patterns.FOLLOW_UPS) == set(CATEGORIES)
    assert all(patterns.CATEGORY_HINTS[c] for c in CATEGORIES if c != "success")


def test_join_wrapped_rejoins_a_metrics_line_cut_mid_number():
    lines = ["(TaskRunnerV1 pid=1) step:1 - training/global_step:1 - actor/pg_loss:0.0", "123 - actor/x:1",
             "(TaskRunnerV1 pid=1) next"]
    assert list(join_wrapped(lines))[0].endswith("actor/pg_loss:0.0123 - actor/x:1")


def _healthy(steps, filler_lines=0):
    out = ["+ VANILLA_MBRIDGE=False", f"+ TOTAL_TRAIN_STEPS={steps}", "(WorkerDict pid=2) Enabling LORA with rank=4"]
    for n in range(1, steps + 1):
        out += [f"(vLLMHttpServer pid=3) INFO throughput {i} tokens/s" for i in range(filler_lines)]
        out.append(f"(TaskRunnerV1 pid=1) step:{n} - training/global_step:{n} - actor/pg_loss:np.float64(0.{n})")
    return out


def test_every_line_of_a_big_log_is_read_an_error_in_the_middle_is_found(tmp_path):
    lines = _healthy(300, filler_lines=40)
    middle = len(lines) // 2
    survived = lines[:middle] + ["Traceback (most recent call last):", "RuntimeError: boom in the middle"]
    path = tmp_path / "big.log"
    path.write_text("\n".join(survived + lines[middle:]) + "\n")
    found = list(scan_file(path, [n.encode() for n in ALL_NEEDLES], chunk_size=1 << 16))
    assert b"RuntimeError: boom in the middle" in found
    assert sum(1 for line in found if b"training/global_step:" in line) == 300
    verdict = judge_log(path, exit_code=0)
    assert verdict.result == "Pass" and verdict.steps_completed == 300  # later steps: the error was survived
    # the run dies in the middle: an OOM line without its traceback header, then only noise until the end
    died = lines[:middle] + ["(WorkerDict pid=2) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB"]
    died += [f"(vLLMHttpServer pid=3) INFO throughput {i} tokens/s" for i in range(20000)]
    died += ["(TaskRunnerV1 pid=1) Training Progress:  50%|#####     | 150/300 [10:00<10:00, 4.00s/it]"]
    path.write_text("\n".join(died) + "\n")
    verdict = judge_log(path)
    assert (verdict.result, verdict.category) == ("Fail", "oom")
    assert "CUDA out of memory. Tried to allocate 2 GiB" in verdict.first_error


def test_chunk_boundaries_do_not_lose_or_split_lines(tmp_path):
    lines = _healthy(50, filler_lines=3)
    path = tmp_path / "small.log"
    path.write_text("\n".join(lines))  # no final newline
    for chunk in (64, 100, 1000, 1 << 20):
        found = list(scan_file(path, [b"step"], chunk_size=chunk))
        assert [line for line in found if b"global_step" in line] == [line.encode() for line in lines if "step:" in line]


def test_nan_in_core_metric_fails_even_when_steps_complete():
    lines = _healthy(1)[:-1] + ["(TaskRunnerV1 pid=1) step:1 - training/global_step:1 - actor/grad_norm:nan"]
    verdict = judge_lines(lines, exit_code=0)
    assert (verdict.result, verdict.category) == ("Fail", "nan-metrics")


@pytest.mark.parametrize("warm_up", [
    "(vLLMHttpServer pid=7) (Worker pid=9) Capturing CUDA graphs (decode, FULL):   0%|          | 0/70 [00:00<?, ?it/s]",
    "(SGLangHttpServer pid=7) [2026-03-04 16:46:41 TP0] Capture cuda graph begin. This can take up to several minutes.",
])
def test_a_rollout_engines_cuda_graph_capture_puts_the_run_at_rollout_up(warm_up):
    built = ["+ TOTAL_TRAIN_STEPS=2", "(WorkerDict pid=3)   Adapter parameters:   26,624"]
    assert judge_lines(built).phase != "rollout-up"
    assert judge_lines(built + [warm_up]).phase == "rollout-up"
    assert judge_lines(_healthy(2) + [warm_up]).result == "Pass"  # a later engine start moves no finished run back


def test_exit_code_nonzero_denies_pass():
    assert judge_lines(_healthy(1), exit_code=0).result == "Pass"
    assert judge_lines(_healthy(1), exit_code=1).result == "Fail"


def test_judge_command_exit_codes_and_unreadable_log(tmp_path, capsys):
    path = tmp_path / "ok.log"
    path.write_text("\n".join(_healthy(1)) + "\n")
    assert judge_command(str(path), exit_code=0) == 0
    assert judge_command(str(path), exit_code=0, as_json=True) == 0
    assert '"result": "Pass"' in capsys.readouterr().out
    assert judge_command(str(tmp_path / "missing.log")) == 2
    assert capsys.readouterr().out.startswith("error: ")
    assert judge_command(str(path), steps="x") == 2


def test_both_prefilters_find_the_same_lines_on_every_real_and_corpus_log():
    """Hyperscan (when installed) and the bytes.find fallback hand the judge the same lines: same verdicts."""
    from sessions.judge.logstream import NeedleMatcher
    from sessions.judge.verdict import SCAN_NEEDLES_BYTES, scan_matcher
    from tests.conftest import real_logs

    plain = NeedleMatcher(SCAN_NEEDLES_BYTES, use_hyperscan=False)
    logs = sorted(real_logs().glob("*.log")) + sorted((Path(__file__).parent / "logs").glob("*.log"))
    assert len(logs) > 100
    for path in logs:
        assert list(scan_file(path, plain)) == list(scan_file(path, scan_matcher())), path.name
        same = json.dumps(judge_log(path, matcher=plain).to_json()) == json.dumps(judge_log(path).to_json())
        assert same, path.name  # (json: nan compares equal to nan)


def test_a_giant_line_without_newline_is_read_in_pieces(tmp_path):
    from sessions.judge import logstream

    path = tmp_path / "giant.log"
    path.write_bytes(b"x" * (3 << 20) + b" RuntimeError: deep inside " + b"y" * (3 << 20) + b"\n")
    old = logstream.MAX_LINE_BYTES
    logstream.MAX_LINE_BYTES = 1 << 20
    try:
        found = list(scan_file(path, [b"rror"], chunk_size=1 << 18))
    finally:
        logstream.MAX_LINE_BYTES = old
    assert any(b"RuntimeError: deep inside" in piece for piece in found)
    assert max(len(piece) for piece in found) <= 2 << 20


@pytest.mark.parametrize("line, expected", [
    ("RuntimeError: CUDA error: no kernel image is available for execution on the device", ("Blocked", "env-dependency")),
    ("OSError: Can't load tokenizer for '/models/Qwen2.5-0.5B'.", ("Blocked", "data")),
    ("ray.exceptions.RayActorError: The actor died unexpectedly before finishing this task.", ("Fail", "actor-died")),
    ("AssertionError: real_train_batch_size (32) must be divisible by minimal possible batch size (64)",
     ("Fail", "config")),
    ("NotImplementedError: Reward function is not implemented for data_source='my/gsm8k'", ("Fail", "reward-model")),
    ("RuntimeError: Error(s) in loading state_dict for GPTModel:", ("Fail", "provider")),
    ("torch.distributed.DistNetworkError: Connection reset by peer", ("Fail", "nccl")),
    ("Out of memory: Killed process 4242 (python3) total-vm:99GB", ("Fail", "oom")),
    ("[rank3]:[E419 10:42:28.8 ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective operation timeout: "
     "WorkNCCL(SeqNum=1, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600001 milliseconds before timing out.",
     ("Fail", "hang")),
    ("ModuleNotFoundError: No module named 'flash_attn'", ("Blocked", "env-dependency")),
    ("Could not override 'trainer.foo'.", ("Blocked", "config")),
])
def test_a_named_cause_in_an_excerpt_gives_its_result_and_category(line, expected):
    verdict = judge_lines(["(TaskRunner pid=1) Training Progress:   0%|          | 0/5 [00:00<?, ?it/s]", line,
                           "(TaskRunner pid=1) Training Progress:   0%|          | 0/5 [00:09<?, ?it/s]"])
    assert (verdict.result, verdict.category) == expected, verdict.first_error
    assert line.split(": ", 1)[-1][:30] in verdict.first_error


# A level's log as this tool writes it (lines as in the real H200 Level 0 run of 2026-11-30): our header, the
# wrapper's trace, one step, and our exit-code footer. `invoke judge --level` on it must not need the level run.
TOOL_LOG = [
    "[verl-e2e] level 0 run main: cd /v && env VANILLA_MBRIDGE=False bash tests/special_e2e/run_ppo_trainer_megatron.sh",
    "[verl-e2e] ray stop --force: exit 0",
    "+ VANILLA_MBRIDGE=False",
    "+ TOTAL_TRAIN_STEPS=1",
    "(TaskRunnerV1 pid=9) step:1 - actor/entropy:6.17 - actor/pg_loss:0.01 - training/global_step:1",
    "(TaskRunnerV1 pid=9) Training Progress: 100%|##########| 1/1 [01:02<00:00, 62.51s/it]",
]


def test_judge_reads_the_exit_code_from_this_tools_footer_for_the_level_criteria():
    verdict = judge_lines([*TOOL_LOG, "[verl-e2e] wrapper exit code 0 after 370.9s"], level=0,
                          bridge_src="/b/src")
    assert verdict.exit_code == 0
    assert (verdict.level_result, verdict.level_category) == ("Pass", "success")
    without = judge_lines(TOOL_LOG, level=0, bridge_src="/b/src")
    assert without.level_result == "Fail"
    assert "exit code 0 (exit code not given)" in without.level_summary


def test_footer_of_an_interrupted_run_is_interrupted_and_a_given_exit_code_wins():
    footer = "[verl-e2e] wrapper exit code -15, interrupted after 197.4s"
    verdict = judge_lines([*TOOL_LOG[:4], footer], level=2, bridge_src="/b/src")
    assert (verdict.result, verdict.category, verdict.exit_code) == ("Blocked", "interrupted", -15)
    given = judge_lines([*TOOL_LOG, "[verl-e2e] wrapper exit code 0 after 1.0s"], level=0, exit_code=1,
                        bridge_src="/b/src")
    assert given.exit_code == 1
    assert given.level_result == "Fail"


def test_judge_command_takes_the_bridge_checkout_from_the_environment(tmp_path, monkeypatch, capsys):
    log = tmp_path / "verl.log"
    log.write_text("\n".join([*TOOL_LOG, "[verl-e2e] wrapper exit code 0 after 370.9s"]) + "\n")
    monkeypatch.delenv("BRIDGE_REPO", raising=False)
    assert judge_command(str(log), level=0, as_json=True) == 1  # the Bridge criterion is not shown
    assert json.loads(capsys.readouterr().out)["level_result"] == "Fail"
    monkeypatch.setenv("BRIDGE_REPO", str(tmp_path / "Megatron-Bridge"))
    assert judge_command(str(log), level=0, as_json=True) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["level_result"] == "Pass"
    assert f"outside {tmp_path / 'Megatron-Bridge' / 'src'}" in json.dumps(out["criteria"])
