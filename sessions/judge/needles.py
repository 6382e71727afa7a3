"""One pass per line instead of a loop over the pattern table: every pattern names the literals (`needles`) that
each of its matches contains; one Hyperscan scan of the line says which literals are
there, and only the patterns of those literals run their regex, in table order. Without Hyperscan the same
literals are found with `bytes in` (same candidates, slower)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from sessions.judge.logstream import hyperscan_database
from sessions.judge.patterns import PATTERNS, Gated, Pattern

MAX_MEMO = 8192
LONG_TEXT = 1024  # chars past which a pattern's regex runs as a Hyperscan pass (re backtracks: `a.*b` on a long line)
PYTHON_ONLY_SPACE = "\x1c\x1d\x1e\x1f"  # what \s matches in Python's str patterns and not in Hyperscan's
# left to re: lookarounds (Hyperscan has none), and `{,n}` (Python's {0,n}, a literal for Hyperscan)
RE_ONLY = ("(?=", "(?!", "(?<=", "(?<!", "{,")


def needles_of(pattern: Pattern) -> tuple[str, ...]:
    """The literals one of which every match of the pattern contains (empty: the pattern is never a candidate)."""
    return pattern.any_of or ((pattern.needle,) if pattern.needle else ())


class Dispatch:
    def __init__(self, patterns: Sequence[Pattern], *, use_hyperscan: bool | None = None):
        groups: dict[bytes, list[int]] = {}
        for index, pattern in enumerate(patterns):
            for literal in needles_of(pattern):
                groups.setdefault(literal.encode(), []).append(index)
        self.literals = tuple(groups)
        self.by_id = tuple(tuple(v) for v in groups.values())
        # every report, not one per literal: a single-match database takes ~15x longer to compile (process start)
        self.database = None if use_hyperscan is False else hyperscan_database(self.literals)
        self.engine = "hyperscan" if self.database is not None else "bytes in"
        self._memo: dict[tuple[int, ...], tuple[int, ...]] = {}

    def literal_ids(self, raw: bytes) -> tuple[int, ...]:
        if self.database is None:
            return tuple(i for i, literal in enumerate(self.literals) if literal in raw)
        ids: set[int] = set()
        self.database.scan(raw, match_event_handler=lambda i, _f, _t, _fl, _c: ids.add(i))
        return tuple(sorted(ids))

    def candidates(self, raw: bytes) -> tuple[int, ...]:
        """Indices (table order) of the patterns that can match this physical line."""
        ids = self.literal_ids(raw)
        found = self._memo.get(ids)
        if found is None:
            found = tuple(sorted({p for i in ids for p in self.by_id[i]}))
            if len(self._memo) < MAX_MEMO:
                self._memo[ids] = found
        return found


class LongText:
    """Whether a regex matches a long text, by Hyperscan: linear time where `re` may backtrack quadratically
    (a 6 KB command line holding `checkpoint` and `error` many times takes `checkpoint.*(?:[Ee]rror|...)` a
    millisecond). Same answer as re.search's truthiness for the texts `usable` accepts (ASCII: the classes, case
    folding and `\\b` agree; none of the control characters Python's \\s also takes; one line: `$` agrees). Not
    for the table's facts (their groups are read) nor lookarounds; each regex is compiled at its first long line."""

    def __init__(self, patterns: Sequence[Pattern]):
        self.patterns = patterns
        self._databases: dict[object, object] = {}  # table index or compiled regex -> database (None: re only)

    @staticmethod
    def usable(text: str) -> bool:
        return len(text) > LONG_TEXT and text.isascii() and not any(c in text for c in PYTHON_ONLY_SPACE)

    def database(self, index: int):
        """The database of table pattern `index`, or None (a fact, or a regex Hyperscan cannot take)."""
        if index not in self._databases:
            pattern = self.patterns[index]
            self._databases[index] = None if pattern.kind == "fact" else self._compiled(pattern.regex, 0)
        return self._databases[index]

    def database_of(self, regex: re.Pattern[str]):
        """The database of any compiled regex (flags kept: re.IGNORECASE), or None."""
        if regex not in self._databases:
            self._databases[regex] = self._compiled(regex.pattern, regex.flags)
        return self._databases[regex]

    @staticmethod
    def _compiled(expression: str, flags: int):
        if any(construct in expression for construct in RE_ONLY):
            return None
        try:
            import hyperscan

            database = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
            database.compile(expressions=[expression.encode()], ids=[0], elements=1,
                             flags=[hyperscan.HS_FLAG_CASELESS if flags & re.IGNORECASE else 0])
            return database
        except Exception:  # not installed, or a construct Hyperscan refuses: re decides
            return None

    @staticmethod
    def search(database, data: bytes) -> bool:
        found: list[int] = []
        database.scan(data, match_event_handler=lambda _i, _f, to, _fl, _c: found.append(to))
        return bool(found)


DISPATCH = Dispatch(PATTERNS)
LONG = LongText(PATTERNS)


def search_pattern(index: int, regex, text: str, encoded: dict[int, bytes] | None):
    """regex.search(text) of table pattern `index`; for a long line (`encoded`: the searched texts' bytes by
    length, filled here) a bool from Hyperscan where LongText takes the pattern (the gate of its `also` literals
    first, as Gated.search does)."""
    database = LONG.database(index) if encoded is not None else None
    if database is None:
        return regex.search(text)
    return _gated_scan(database, regex, text, encoded)


def search_other(regex, text: str, encoded: dict[int, bytes]):
    """search_pattern of a regex outside the table (a Gated or compiled one) on a long line."""
    database = LONG.database_of(regex.regex if isinstance(regex, Gated) else regex)
    return regex.search(text) if database is None else _gated_scan(database, regex, text, encoded)


def _gated_scan(database, regex, text: str, encoded: dict[int, bytes]) -> bool | None:
    if isinstance(regex, Gated):
        seen = text.lower() if regex.folded else text
        if not any(literal in seen for literal in regex.also):
            return None
    data = encoded.get(len(text))
    if data is None:
        data = encoded[len(text)] = text.encode("ascii")
    return LongText.search(database, data)
