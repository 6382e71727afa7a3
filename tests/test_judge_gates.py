"""The judge's speed gates give the same answers as the plain regexes they guard (patterns.py `also`, Gated).

A gate is a set of literals one of which every match of its regex holds; checked on every line of tests/logs and
of the shared real logs (where present), and on lines made to match each gated regex.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sessions.judge.logstream import normalise
from sessions.judge.patterns import ACTOR_DEATH_CAUSES, PATTERNS, Gated, compiled
from tests.conftest import REAL_LOGS

LOGS = Path(__file__).parent / "logs"
# the regex steps-config had before its lookbehind moved after the literal
STEPS_CONFIG_BEFORE = r"(?<![\w.])total_training_steps['\"]?\s*[:=]\s*(\d+)"

MATCHING = [  # lines each gated regex matches (one or more per gate)
    "ValueError: target_modules ['q_proj'] not found in the base model",
    "AssertionError: tensor_model_parallel_size 2 does not match, but mpu was initialized with 1",
    "model parallel group is not initialized", "parallel state is not initialized",
    "RuntimeError: not enough GPUs: requires 8 gpus but only 4", "Total available gpus 2 is less than 8",
    "ERROR vLLMAsyncRollout got an error", "vLLM engine loop error",
    "megatron.core.dist_checkpointing.core.CheckpointingException: bad", "checkpoint load failed: corrupt",
    "OSError: reward model /m does not appear to have a file named config.json",
    "NotImplementedError: Reward function is not implemented for data_source=x",
    "Saving checkpoint to /ckpt/global_step_5", "saving checkpoint to: /x",
    "The node with node id abc has been marked dead", "raylet: worker killed by the OOM killer (memory limit)",
    "Fatal Python error: Segmentation fault", "Killed", "received SIGKILL",
    "data.total_training_steps: 12", "'total_training_steps': 40", "x.total_training_steps=3 total_training_steps=7",
]


def corpus_lines() -> list[str]:
    paths = sorted(LOGS.glob("*.log"))
    if REAL_LOGS.is_dir():
        paths += sorted(REAL_LOGS.glob("*.log"))
    lines = list(MATCHING)
    for path in paths:
        for raw in path.read_bytes().decode("utf-8", "replace").splitlines():
            lines.append(raw)
            lines.extend(line.text for line in normalise(raw))
    return lines


def gates() -> list[tuple[str, Gated]]:
    table = [(p.name, regex) for p, regex in compiled() if isinstance(regex, Gated)]
    return table + [(f"death cause {cause}", regex) for regex, cause in ACTOR_DEATH_CAUSES]


@pytest.fixture(scope="module")
def lines() -> list[str]:
    return corpus_lines()


@pytest.mark.parametrize("name,gated", gates(), ids=[name for name, _ in gates()])
def test_a_gate_never_hides_a_match(lines, name, gated):
    found = 0
    for text in lines:
        plain = gated.regex.search(text)
        assert (gated.search(text) is not None) == (plain is not None), (name, text)
        found += plain is not None
    assert found, f"{name}: no line of the corpus matches (add one to MATCHING)"


def test_every_gated_pattern_names_its_gate():
    assert {p.name for p in PATTERNS if p.also} <= {name for name, _ in gates()}


def test_steps_config_finds_what_it_found_before(lines):
    now = next(regex for p, regex in compiled() if p.name == "steps-config")
    before = re.compile(STEPS_CONFIG_BEFORE)
    for text in lines + ["atotal_training_steps=1", "_total_training_steps=1 ,total_training_steps =2"]:
        a, b = before.search(text), now.search(text)
        assert (a and (a.span(), a.group(1))) == (b and (b.span(), b.group(1))), text
