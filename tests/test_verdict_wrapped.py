"""Hard-wrapped pastes (SPEC: "lines hard-wrapped by a paste"): every shared real log, broken into pieces of 120
and of 80 columns as a terminal paste or `fold` does, is judged as it is unwrapped (result and category). The
reader sees the wrap in the file's head (no line longer than W, several different lines exactly W long) and joins
each W-long line with the next unless that one starts a log line (logstream.open_log)."""

from __future__ import annotations

import io
import random

import pytest

from sessions.judge import logstream
from sessions.judge.logstream import (
    WIDE_RE,
    HardWrapJoined,
    _text_columns,
    hard_wrap_width,
    join_hard_wrapped,
    open_log_text,
)
from sessions.judge.verdict import judge_log
from tests.conftest import real_logs

WIDTHS = (120, 80)
# (file, width) -> why its verdict cannot hold once wrapped; none so far
EXCEPTIONS: dict[tuple[str, int], str] = {}


def hard_wrap(text: str, width: int) -> str:
    """Every line wider than `width` terminal columns broken into pieces of `width` columns, as a terminal wraps it
    (a wide CJK character takes two columns and moves whole to the next row when one column is left)."""
    out = []
    for line in text.split("\n"):
        piece, used = [], 0
        for char in line:
            cols = 2 if WIDE_RE.match(char) else 1
            if used + cols > width:
                out.append("".join(piece))
                piece, used = [], 0
            piece.append(char)
            used += cols
        out.append("".join(piece))
    return "\n".join(out)


@pytest.mark.parametrize("width", WIDTHS)
def test_every_real_log_hard_wrapped_is_judged_as_unwrapped(tmp_path, width):
    folder = real_logs()
    changed = []
    for path in sorted(folder.glob("*.log")):
        plain = judge_log(path)
        text = path.read_bytes().decode("utf-8", "surrogateescape")
        wrapped = tmp_path / path.name
        wrapped.write_bytes(hard_wrap(text, width).encode("utf-8", "surrogateescape"))
        got = judge_log(wrapped)
        if (got.result, got.category) != (plain.result, plain.category) and (path.name, width) not in EXCEPTIONS:
            changed.append(f"{path.name}: {plain.result}/{plain.category} -> {got.result}/{got.category}")
    assert not changed, "\n".join(changed)


def _read(data: bytes, width: int) -> bytes:
    joined = HardWrapJoined(io.BytesIO(data), width)
    out = bytearray()
    buf = bytearray(1000)
    while n := joined.readinto(memoryview(buf)):
        out += buf[:n]
    return bytes(out)


@pytest.mark.parametrize("block", [5, 64, 1 << 20])
def test_the_joined_reader_gives_back_the_lines_before_the_paste(monkeypatch, block):
    """Across read blocks, with or without a last newline, multi-byte characters counted as one column; a line of
    exactly W*k characters is the one case a wrap cannot show (its next line would be joined), so none here."""
    monkeypatch.setattr(logstream, "WRAP_BLOCK", block)
    rng = random.Random(7)
    for _ in range(200):
        lines = []
        for _ in range(rng.randint(1, 25)):
            n = rng.choice([0, 5, 30, 79, 81, 150, 239, 401])
            prefix = rng.choice(["(TaskRunner pid=12) ", "", "  File \"x.py\", line 3, in f ", "\x1b[36m(raylet)\x1b[0m "])
            lines.append(prefix + "".join(rng.choice("abc é:-_/中文") for _ in range(n)))
        # a last piece of 80 columns (or 79, then a wide character) is what a wrap cannot tell from a piece
        lines = [line for line in lines if _text_columns(hard_wrap(line, 80).split("\n")[-1]) not in (79, 80)]
        text = "\n".join(lines) + rng.choice(["", "\n"])
        assert _read(hard_wrap(text, 80).encode(), 80) == text.encode()


def test_a_piece_that_starts_a_log_line_is_not_joined():
    w = 40
    lines = [b"x" * w, b"(WorkerDict pid=7) next line", b"y" * w, b"Traceback (most recent call last):",
             b"z" * w, b"tail"]
    assert list(join_hard_wrapped(lines, w)) == [b"x" * w, b"(WorkerDict pid=7) next line", b"y" * w,
                                                   b"Traceback (most recent call last):", b"z" * w + b"tail"]


@pytest.mark.parametrize("head, width", [
    (b"(WorkerDict pid=1) " + b"a" * 100 + b"\nshort\n", None),  # one longest line: no wrap
    (b"\n".join([b"[rank%d]: Watchdog caught collective operation timeout: " % r + b"x" * 60 for r in range(8)])
     + b"\n", None),  # every rank's line has the same length: one line in numbers, no wrap
    (hard_wrap("Traceback (most recent call last):\n" + "(TaskRunner pid=5) " + "q" * 300 + "\nRuntimeError: "
               + "r" * 200 + "\n", 80).encode(), 80),
])
def test_the_wrap_width_is_seen_in_the_head(head, width):
    assert hard_wrap_width(head, True) == width


def test_the_traced_command_of_a_wrapped_paste_is_one_line_again(tmp_path):
    command = "+ python3 -m verl.trainer.main_ppo " + " ".join(f"trainer.key_{i}=value_{i}" for i in range(40))
    path = tmp_path / "w.log"
    path.write_text(hard_wrap(command + "\n+ echo done\n" + "Error executing job " + "e" * 150 + "\n", 80))
    with open_log_text(path) as f:
        assert f.readline().rstrip("\n") == command


def test_a_crlf_paste_is_joined_without_its_line_ends(tmp_path):
    text = "(TaskRunner pid=1) step:1 - training/global_step:1 - actor/pg_loss:0.5 - " + "x/y:1 - " * 30 + "z:2"
    error = "RuntimeError: " + "boom " * 40
    path = tmp_path / "crlf.log"
    path.write_bytes((hard_wrap(text + "\n" + error, 80).replace("\n", "\r\n") + "\r\n").encode())
    joined = _read(path.read_bytes(), 80).split(b"\r\n")
    assert joined[0] == text.encode() and joined[1] == error.encode()


def test_an_unwrapped_excerpt_that_looks_wrapped_keeps_its_exception_line(tmp_path):
    """Two different longest lines of one length, each followed by a line that starts no Ray line: the head looks
    wrapped; the exception line still starts a line of its own (it is never joined onto the frame before it)."""
    lines = ["Traceback (most recent call last):", '  File "/a/b/module.py", line 10, in forward_aaa', "    x = y",
             '  File "/a/b/module.py", line 20, in forward_bbb', "ValueError: boom in the model"]
    path = tmp_path / "excerpt.log"
    path.write_text("\n".join(lines) + "\n")
    assert hard_wrap_width(path.read_bytes(), True) == len(lines[1])
    verdict = judge_log(path)
    assert verdict.first_error == "ValueError: boom in the model", verdict.first_error
