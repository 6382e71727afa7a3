"""The words every match of a regex contains, read from the regex itself (as ripgrep derives its literals).

`required_words(regex)` -> alternatives, one of which every match holds all the words of (a word: a run of
[A-Za-z0-9_], which an ANSI colour code never splits — the same assumption as the table's needles, looked for in the
raw line). `[Ss]aving checkpoint to` -> (("Saving", "checkpoint", "to"), ("saving", "checkpoint", "to")). None when
the regex names no such word (`\\d+`, a class, an optional part).
"""

from __future__ import annotations

import re

try:  # Python 3.11+
    import re._parser as sre_parse  # type: ignore[import-not-found]
except ImportError:  # Python 3.10
    import sre_parse  # type: ignore[no-redef]

# the opcodes, from the parser that emits them (it re-exports its constants module on 3.10 and 3.11+ alike)
ASSERT, ASSERT_NOT, AT, BRANCH, IN, LITERAL, MAX_REPEAT, MIN_REPEAT, SUBPATTERN = (
    sre_parse.ASSERT, sre_parse.ASSERT_NOT, sre_parse.AT, sre_parse.BRANCH, sre_parse.IN, sre_parse.LITERAL,
    sre_parse.MAX_REPEAT, sre_parse.MIN_REPEAT, sre_parse.SUBPATTERN)

MAX_ALTERNATIVES = 16  # exact strings followed through a class or a branch ([Ss]aving: 2)
WORD_RE = re.compile(r"[A-Za-z0-9_]+")

Words = tuple[tuple[str, ...], ...]


def required_words(regex: str) -> Words | None:
    """See module docstring. Lower-cased for a `(?i)` regex (compare with the lower-cased line)."""
    parsed = sre_parse.parse(regex)
    _, required = _sequence(list(parsed))
    if required is None:
        return None
    if parsed.state.flags & re.IGNORECASE:
        required = tuple(tuple(w.lower() for w in alt) for alt in required)
    return required


def _score(words: Words) -> int:
    """How selective: the fewest word characters any alternative holds."""
    return min(sum(len(w) for w in alt) for alt in words)


def _words_of(strings: set[str]) -> Words | None:
    alternatives = []
    for s in sorted(strings):
        words = tuple(WORD_RE.findall(s))
        if not words or not s.isascii():
            return None
        alternatives.append(words)
    return tuple(alternatives)


def _better(a: Words | None, b: Words | None) -> Words | None:
    if a is None:
        return b
    if b is None:
        return a
    return a if _score(a) >= _score(b) else b


def _sequence(items: list) -> tuple[set[str] | None, Words | None]:
    """(the strings the sequence matches when finitely many, else None; its best word requirement)."""
    run: set[str] | None = {""}  # exact strings of the current unbroken part
    exact = True  # the whole sequence is one unbroken part so far
    best: Words | None = None

    def finish():
        nonlocal run, best
        if run and run != {""}:
            best = _better(best, _words_of(run))
        run = {""}

    for op, av in items:
        strings: set[str] | None = None
        required: Words | None = None
        if op is LITERAL:
            strings = {chr(av)}
        elif op is IN:
            if all(kind is LITERAL for kind, _ in av) and len(av) <= 4:
                strings = {chr(value) for _, value in av}
        elif op is SUBPATTERN:
            if not av[1] & re.IGNORECASE:  # a caseless group (?i:...) holds no word of known case
                strings, required = _sequence(list(av[-1]))
        elif op is BRANCH:
            branches = [_sequence(list(alt)) for alt in av[1]]
            if all(s is not None for s, _ in branches):
                strings = set().union(*(s for s, _ in branches))
            elif all(r is not None or (s is not None and _words_of(s)) for s, r in branches):
                required = tuple(alt for s, r in branches for alt in (r if r is not None else _words_of(s)))
        elif op in (MAX_REPEAT, MIN_REPEAT):
            low, high, body = av
            inner, required = _sequence(list(body))
            if low == high == 1:
                strings = inner
            elif low >= 1 and inner is not None:
                required = _better(required, _words_of(inner) if inner != {""} else None)
            elif low == 0:
                required = None
        elif op in (AT, ASSERT, ASSERT_NOT):
            continue  # zero width: the parts around it are still adjacent in the text
        if strings is not None and run is not None and len(run) * len(strings) <= MAX_ALTERNATIVES:
            run = {a + b for a in run for b in strings}
            continue
        exact = False
        finish()
        if strings is not None and len(strings) <= MAX_ALTERNATIVES:
            run = set(strings)  # starts the next unbroken part
        best = _better(best, required)
    finish_exact = run if exact else None
    finish()
    return finish_exact, best
