"""Prefixed pastes: every shared real log with one more prefix on each line — a quote marker (`> `, `>`), a Markdown
code block's indent (four spaces, a tab), a container runtime's record header (long lines split into partial
records), `kubectl logs --prefix`'s pod name, journald's or `docker compose logs`'s line heads, a bare time of day,
a viewer's line numbers, a quoted paste of a hard-wrapped one — or taken from a web page's source (HTML entities),
or with a byte order mark, is judged as the log itself. The reader sees the prefix in the file's head (nearly every
line has it) and takes it off each line (logstream.open_log); logs whose lines only look alike (srun's rank labels,
a logger's level tags, a few quoted lines) are read as they are, and so is every real log of the repository's sets
that is not itself a quoted paste."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.pastes import PASTES
from sessions.judge import logstream
from sessions.judge.logstream import PrefixStripped, open_log, paste_prefixes
from sessions.judge.verdict import judge_log
from tests.conftest import real_logs

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("paste", sorted(PASTES))
def test_every_real_log_pasted_is_judged_as_itself(tmp_path, paste):
    changed = []
    for path in sorted(real_logs().glob("*.log")):
        plain = judge_log(path)
        pasted = tmp_path / path.name
        pasted.write_bytes(b"\n".join(PASTES[paste](path.read_bytes().split(b"\n"))))
        got = judge_log(pasted)
        if (got.result, got.category, got.steps_completed) != (plain.result, plain.category, plain.steps_completed):
            changed.append(f"{path.name}: {plain.result}/{plain.category} -> {got.result}/{got.category}")
    assert not changed, "\n".join(changed)


STEPS = [b"(TaskRunner pid=7) step:%d - actor/pg_loss:0.1" % i for i in range(1, 20)]


@pytest.mark.parametrize("lines", [
    [*STEPS, b"> a model's output", b"> quoted"],  # a few quoted lines
    [b"%d: " % (i % 2) + line for i, line in enumerate(STEPS)],  # srun --label: a rank, not a line number
    [b"[INFO] " + line for line in STEPS],  # a logger's level tag
    [b"  File \"/x.py\", line 1, in f", b"    x = f()", b"ValueError: x"] * 5,  # a traceback's own indentation
    # a run printing a few entities among more of the characters themselves (a rollout's HTML sample)
    [*STEPS, b"(WorkerDict pid=8) sample: &lt;b&gt;x&lt;/b&gt; said \"<i>hi</i>\" 'a' \"b\" <c> <d> 'e'"],
])
def test_logs_whose_lines_only_look_prefixed_are_read_as_they_are(tmp_path, lines):
    text = b"\n".join(lines) + b"\n"
    assert paste_prefixes(text, True) == []
    log = tmp_path / "x.log"
    log.write_bytes(text)
    with open_log(log) as handle:
        assert not isinstance(handle, PrefixStripped) and handle.read() == text


def test_the_prefix_comes_off_across_blocks_partial_records_join_and_a_last_line_keeps_no_newline(tmp_path,
                                                                                                  monkeypatch):
    monkeypatch.setattr(logstream, "WRAP_BLOCK", 7)
    lines = [b"Traceback (most recent call last):", b'  File "/x.py", line 1, in f', b"", b"ValueError: " + b"x" * 450]
    log = tmp_path / "q.log"
    for paste in ("quote", "container"):
        log.write_bytes(b"\n".join(PASTES[paste](lines)))
        with open_log(log) as handle:
            assert handle.read() == b"\n".join(lines), paste


def test_no_real_log_but_the_quoted_pastes_shows_a_paste_prefix():
    folders = [real_logs(), *sorted((ROOT / "bench").glob("heldout-logs-s*")), ROOT / "tests" / "logs"]
    found = {}
    for folder in folders:
        for path in sorted(folder.rglob("*.log")):
            head = path.read_bytes()[: logstream.WRAP_SNIFF_BYTES]
            layers = paste_prefixes(head, len(head) < logstream.WRAP_SNIFF_BYTES)
            if layers:
                found[path.name] = layers
    # the held-out sets hold pastes quoted in their source (a GitHub comment, a chat export) and one log whose
    # every line starts with a bare time of day (s10's 14: `11:31:43.419 (main_task pid=N) ...`)
    assert found and all(layers in (["quote"], ["clock"]) for layers in found.values()), found
    assert sum(layers == ["clock"] for layers in found.values()) == 1, found
