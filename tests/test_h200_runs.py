"""The tool's own runs on one real H200 (2026-12-01; verl v0.9.0, Bridge r0.6.0, vLLM 0.24, the image without
modelopt, flash-attn, Apex or nsys; Levels 0 and 5 in a second session the same day) and on one H100 (2026-12-07,
same stack; the `h100_` folders), sanitized by ../shared/gpu-kit/sanitize.py: each log is judged by the engine
alone as the level run judged it, and `judge --level N` agrees with the level run's own Result.

Level 1's run directory holds two logs; its level rule (save at 1, resume, train and save step 2) is shown by run
B's log, which is the one `judge --level 1` can answer for alone. Run A alone cannot show the resume: not Pass.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sessions.judge.verdict import judge_log

RUNS = Path(__file__).parent / "logs" / "h200_runs"
BRIDGE_SRC = "<bridge>/src"  # the sanitizer's placeholder for the Bridge checkout on the host

# run folder, log, level, the run's answer (result, category), judge --level's result
CASES = [
    ("level3_fsdp_weight_sync", "verl.log", 3, ("Fail", "weight-sync"), "Fail"),
    ("level1_save_resume_pass", "verl-B.log", 1, ("Pass", "success"), "Pass"),
    ("level4_moe_pass", "verl.log", 4, ("Pass", "success"), "Pass"),
    ("level0_sigterm_interrupted", "verl.log", 0, ("Blocked", "interrupted"), "Blocked"),
    ("level0_pass", "verl.log", 0, ("Pass", "success"), "Pass"),
    ("level0_alongside", "verl.log", 0, ("Pass", "success"), "Pass"),
    ("level0_probe_first", "verl.log", 0, ("Pass", "success"), "Pass"),
    # 2026-12-07, the tool at bea4a6f on one H100 80GB (same stack): runs-2026-12-07-h100.tsv, h100_level0_pass/README.md
    ("h100_level0_pass", "verl.log", 0, ("Pass", "success"), "Pass"),
    ("h100_level1_save_resume_pass", "verl-B.log", 1, ("Pass", "success"), "Pass"),
    ("h100_level3_fsdp_weight_sync", "verl.log", 3, ("Fail", "weight-sync"), "Fail"),
    # the tool at a6dfc19, Level 4 MoE with the plan's PEFT switch (h100_level4_moe_peft_switch/README.md)
    ("h100_level4_moe_peft_switch", "verl.log", 4, ("Pass", "success"), "Pass"),
]


@pytest.mark.parametrize(("run", "log", "level", "run_answer", "level_result"), CASES, ids=[c[0] for c in CASES])
def test_judge_agrees_with_the_level_run(run, log, level, run_answer, level_result):
    summary = json.loads((RUNS / run / "summary.json").read_text())
    assert summary["result"] == level_result  # what the level run itself concluded on the GPU
    alone = judge_log(RUNS / run / log)
    assert (alone.result, alone.category) == run_answer
    leveled = judge_log(RUNS / run / log, level=level, bridge_src=BRIDGE_SRC, level_rule=True)
    assert leveled.level_result == summary["result"], leveled.to_json()


def test_level3_failure_is_the_weight_sync_after_the_engine_was_up():
    v = judge_log(RUNS / "level3_fsdp_weight_sync" / "verl.log")
    assert "mixed torch.Tensor and DTensor" in v.first_error
    assert "Level 0" in v.hint and "rollout engine failed before the actor" not in v.hint


@pytest.mark.parametrize("run", ["level1_save_resume_pass", "h100_level1_save_resume_pass"])
def test_level1_run_a_alone_does_not_pass_level1_and_says_which_log_shows_the_rest(run):
    v = judge_log(RUNS / run / "verl-A.log", level=1, bridge_src=BRIDGE_SRC, level_rule=True)
    assert v.result == "Pass" and v.level_result != "Pass"
    unseen = [c.name for c in v.criteria if c.status == "not shown"]
    assert unseen and not [c for c in v.criteria if c.status == "Fail"]
    # no error to read: the follow-up is the log that shows what this one cannot
    assert len(v.follow_ups) == len(unseen) and all("run B's log" in f for f in v.follow_ups), v.follow_ups
    assert not any("first error" in f for f in v.follow_ups)


def test_modelopt_came_from_the_wheel_folder_and_level1_was_blocked_before_it():
    blocked = json.loads((RUNS / "level1_blocked_modelopt" / "summary.json").read_text())
    assert blocked["result"] == "Blocked" and "--find-links" in blocked["sentence"]
    record = json.loads(next((RUNS / "container_setup").glob("*modelopt*.json")).read_text())
    assert record["action"] == "installed" and "local wheel folder" in record["source"]


def test_level5_on_a_random_model_is_no_learning_signal():
    """Level 5 --steps 6 on the random tiny model (second H200 session): critic/score/mean 0 at steps 1-5 and 1/64 at
    step 6. The level run then said Pass — one-point windows gave the trend no error estimate; with two-point
    windows (the rule now) one lucky step is within the noise: no learning signal, Level 5 Fail. The run itself
    (6/6 steps, exit 0) still passes."""
    run = RUNS / "level5_steps6"
    assert json.loads((run / "summary.json").read_text())["result"] == "Pass"  # what the GPU run said, before the fix
    alone = judge_log(run / "verl.log")
    assert (alone.result, alone.category, alone.steps_completed) == ("Pass", "success", 6)
    leveled = judge_log(run / "verl.log", level=5, bridge_src=BRIDGE_SRC, level_rule=True)
    assert leveled.level_result == "Fail", leveled.to_json()
    assert "flat" in json.dumps(leveled.to_json()) and "critic/score/mean" in json.dumps(leveled.to_json())


def test_level0_with_the_heavy_probes_alongside_verl():
    """Third H200 session: Level 0 cold (--fresh-probe) twice each way, back to back on one host. Alongside, verl
    started 3.5 s after preflight began and the heavy probes answered at 31.6 s, all of them passing; with
    --probe-first verl started at 31.5 s. The record says which it was, and the import deliverable is the probe's."""
    along = json.loads((RUNS / "level0_alongside" / "run.json").read_text())
    first = json.loads((RUNS / "level0_probe_first" / "run.json").read_text())
    assert along["heavy_alongside"] is True and first["heavy_alongside"] is False
    started = along["runs"][0]["started"] - along["preflight_started"]
    answered = along["evidence"]["preflight_timings"]["total_s"]
    assert started < 5 < answered, (started, answered)
    assert first["runs"][0]["started"] - first["preflight_started"] > first["evidence"]["preflight_timings"]["cheap_s"]
    for record in (along, first):
        heavy = {c["name"]: c["status"] for c in record["preflight"]}
        assert heavy["megatron.bridge imports"] == "ok" and heavy["Ray worker imports the local Bridge"] == "ok"
    summary = json.loads((RUNS / "level0_alongside" / "summary.json").read_text())
    assert {d["name"]: d["status"] for d in summary["deliverables"]}["Local Bridge import in verl"] == "Pass"


def test_a_log_cut_while_the_rollout_engine_warmed_up_is_no_pass_and_says_where_it_stopped():
    """2026-12-05, the tool at bd2b7b9 on the H200: the hold ended while Level 0 ran (the log stops in vLLM 0.24's
    CUDA-graph capture, before step 1; no exit code, no footer). vLLM 0.24 under verl 0.9 prints no 'Initializing
    ... LLM engine' line: the capture bar is what shows the rollout engine starting."""
    log = RUNS / "level0_host_lost_mid_run" / "verl.log"
    assert "Capturing CUDA graphs" in log.read_text(errors="replace").splitlines()[-1]
    v = judge_log(log, level=0, bridge_src=BRIDGE_SRC, level_rule=True)
    assert (v.result, v.category, v.phase) == ("Fail", "unknown", "rollout-up")
    assert (v.steps_completed, v.steps_expected) == (0, 1) and v.exit_code is None
    assert "still running" in v.hint and v.level_result == "Fail"
    shown = {c["name"]: c["status"] for c in v.to_json()["criteria"]}
    assert shown["exit code 0"] == "not shown" and shown["expected steps completed"] == "Fail"


def test_the_plans_peft_switch_reached_the_actors_expert_lora():
    """Level 4 MoE on one H100, with (B) and without (A, cut off after model build) the override `invoke plan`
    proposes for a PEFT option that acts only on MoE experts' LoRA: every PEFT block is read, in verl's build order
    (critic, then actor), and only the actor's shrinks: its experts' LoRA rank went from 4 to 4 // top-k."""
    run = RUNS / "h100_level4_moe_peft_switch"
    with_switch = judge_log(run / "verl.log")
    without = judge_log(run / "verl-A-cut-off.log")
    assert [b["adapter"] for b in without.adapters] == [17408, 17408]
    assert [b["adapter"] for b in with_switch.adapters] == [17408, 13824]
    assert without.steps_completed == 0 and without.result != "Pass"  # A's PPO step is not shown
    assert sum("Adapter parameters" in line for line in with_switch.key_lines) == 2
