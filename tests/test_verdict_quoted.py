"""Quoted pastes (a GitHub comment's or a mail's `> `, a chat export): every shared real log with each line behind a
quote marker is judged as the log itself — also when the quoted paste was hard-wrapped first. The reader sees the
markers in the file's head (most lines start with `>`) and takes one off each line (logstream.open_log)."""

from __future__ import annotations

import pytest

from sessions.judge.logstream import QuoteStripped, open_log, quoted_paste
from sessions.judge.verdict import judge_log
from tests.conftest import real_logs
from tests.test_verdict_wrapped import hard_wrap


def quote(text: bytes, marker: bytes) -> bytes:
    return b"\n".join(marker + line if line or marker == b">" else b">" for line in text.split(b"\n"))


@pytest.mark.parametrize("marker, width", [(b"> ", None), (b">", None), (b"> ", 120)])
def test_every_real_log_quoted_is_judged_as_itself(tmp_path, marker, width):
    changed = []
    for path in sorted(real_logs().glob("*.log")):
        plain = judge_log(path)
        text = path.read_bytes()
        if width:
            text = hard_wrap(text.decode("utf-8", "surrogateescape"), width).encode("utf-8", "surrogateescape")
        quoted = tmp_path / path.name
        quoted.write_bytes(quote(text, marker))
        got = judge_log(quoted)
        if (got.result, got.category, got.steps_completed) != (plain.result, plain.category, plain.steps_completed):
            changed.append(f"{path.name}: {plain.result}/{plain.category} -> {got.result}/{got.category}")
    assert not changed, "\n".join(changed)


def test_a_log_with_a_few_quoted_lines_is_read_as_is(tmp_path):
    lines = [b"(TaskRunner pid=7) step:%d - actor/pg_loss:0.1" % i for i in range(1, 20)] + [b"> a model's output"]
    assert not quoted_paste(b"\n".join(lines) + b"\n", True)
    log = tmp_path / "x.log"
    log.write_bytes(b"\n".join(lines) + b"\n")
    with open_log(log) as handle:
        assert not isinstance(handle, QuoteStripped) and handle.read() == log.read_bytes()


def test_the_markers_come_off_across_blocks_and_a_last_line_without_newline(tmp_path, monkeypatch):
    from sessions.judge import logstream

    monkeypatch.setattr(logstream, "WRAP_BLOCK", 7)
    log = tmp_path / "q.log"
    log.write_bytes(b"> Traceback (most recent call last):\n>   File \"/x.py\", line 1, in f\n>\n> ValueError: x")
    with open_log(log) as handle:
        assert handle.read() == b"Traceback (most recent call last):\n  File \"/x.py\", line 1, in f\n\nValueError: x"
