"""The ways users and collectors paste a verl log, as functions of its byte lines (no newlines): what
tests/test_verdict_pasted.py asserts the verdict survives and bench/paste_robustness.py counts."""

from __future__ import annotations

import html

from tests.test_verdict_wrapped import hard_wrap


def quote(lines, marker=b"> "):
    return [marker + line if line else b">" for line in lines]


def container(lines):
    """CRI records: a line longer than 200 bytes split into partial (P) records and its final (F) one."""
    out = []
    for i, line in enumerate(lines):
        head = b"2025-08-14T12:00:%02d.123456789Z stdout " % (i % 60)
        while len(line) > 200:
            out.append(head + b"P " + line[:200])
            line = line[200:]
        out.append(head + b"F " + line)
    return out


PASTES = {
    "quote": quote,
    "quote-bare": lambda lines: quote(lines, b">"),
    "indent": lambda lines: [b"    " + line for line in lines],
    "tab": lambda lines: [b"\t" + line for line in lines],
    "container": container,
    "pod": lambda lines: [b"[pod/verl-trainer-7f9c/main] " + line for line in lines],
    "journal": lambda lines: [b"Aug 14 12:00:%02d gpu01 python3[4242]: " % (i % 60) + line
                              for i, line in enumerate(lines)],
    "compose": lambda lines: [b"verl-trainer-1  | " + line for line in lines],
    "clock": lambda lines: [b"12:00:%02d " % (i % 60) + line for i, line in enumerate(lines)],
    "line-numbers": lambda lines: [b"%6d\t" % (i + 1) + line for i, line in enumerate(lines)],
    # a web page's source (every `"`, `<`, `>`, `'` an entity), a Windows editor's byte order mark
    "html": lambda lines: [html.escape(line.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")
                           for line in lines],
    "bom": lambda lines: [b"\xef\xbb\xbf" + lines[0], *lines[1:]],
    "quoted-wrap": lambda lines: quote(hard_wrap(b"\n".join(lines).decode("utf-8", "surrogateescape"), 120)
                                       .encode("utf-8", "surrogateescape").split(b"\n")),
}
