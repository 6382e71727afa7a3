"""Judging a file without feeding the lines whose effect the next progress clears (same verdict, less work).

Evidence has two kinds of state: lasting facts (steps, planned totals, settings, phases, ...) and what only the
error events since the last progress hold (events, traceback areas, the driver's failure, death causes). A line of
the second kind — an error, a traceback frame, a logger's ERROR line — matters only when no progress (a new step, a
complete bar, final validation) follows it. On real logs most prefilter hits are of that kind.

So after each progress the reader skims: one small Hyperscan pass per chunk finds the lines that can hold a lasting
effect (the literals of the table's fact / limitation / noise / phase-marker patterns, `step:`, `No module`) and only
those are fed; the other lines of the chunk are not even located. When the next progress comes, what was skipped is
cleared anyway. When the log ends first (or a line whose lasting effect depends on the error-storm cap comes, or the
skipped region grows past PENDING_LIMIT), the evidence goes back to its copy from the region's start and the region is
read again exactly, every prefilter hit fed in order. Both ways feed Evidence the same lines `scan_file` yields, in
the same chunks, so the verdict is the one of feeding every hit line (tests/test_judge_skim.py checks it).

A skimmed line is fed with its lasting candidates only (LastingLines.lasting_only): what the error, ignore and
traceback patterns would do is what the next progress clears or the exact re-read redoes.
"""

from __future__ import annotations

import os
import re
from bisect import bisect_left
from itertools import repeat

try:
    import hyperscan
except ImportError:  # LastingLines and CappedReading are then unavailable: the reader reads every hit line
    hyperscan = None

from sessions.judge.evidence import (
    LATE_KINDS_SET,
    MAX_EVENTS,
    PROGRESS_FACTS,
    THREAD_HEADER,
    Evidence,
    lasting,
    metrics_match,
    plain_metrics,
)
from sessions.judge.literals import required_words
from sessions.judge.logstream import (
    ANSI_BYTES_RE,
    ANSI_RESIDUE_BYTES_RE,
    NeedleMatcher,
    ScanStats,
    hyperscan_database,
    last_bar_start,
    line_at,
    read_chunks,
)
from sessions.judge.needles import DISPATCH, MAX_MEMO, needles_of
from sessions.judge.patterns import PATTERNS
from sessions.judge.record import PHASE_INDEX

EXACT_WINDOW = 256 << 10  # exact reading locates hit lines this much at a time (it stops at the next progress)
PENDING_LIMIT = 2 << 20  # skipped bytes kept across chunks for a possible re-read; past it: read them exactly now
RAY_UP = PHASE_INDEX["ray-up"]
CONTINUATION_NEVER = b"\x1b+["  # first bytes of a line that never continues a wrapped step line (_is_continuation)
NONFINITE = hyperscan_database((b"nan", b"inf"))  # what makes Evidence check a metrics line's values
WASTED_PER_BYTE = 300 / (1 << 20)  # lines looked at and not fed, per MiB, past which LastingLines changes way
# Checked by Evidence._line in the normalised text, not through the pattern table. Like the table's dispatch (which
# looks for literals in the raw line), this assumes an ANSI code never splits a word: "step" covers `step:`.
TEXT_LITERALS = ("step", "No module", THREAD_HEADER)
LITERAL_BASE = 64  # in the dense pass a condition literal reports its literal's index, the literal this + it
BOTH_BASE = 128  # ... and a condition literal holding its literal this + the index (both at once)
LOW_BITS = (1 << LITERAL_BASE) - 1
# a required word looked for with the literal when this long (shorter ones, `pid`, `in`, `True`, are in most lines)
TELLING_WORD = 6


class LastingLines:
    """The prefilter hit lines of a chunk that may hold a lasting effect: a literal of a lasting pattern (the
    literals the table's dispatch looks for in the raw line) or of TEXT_LITERALS. Two ways, same lines: `dense`
    (many hits the next progress clears, real logs' tracebacks and warnings): one pass for the lasting literals
    and their condition literals (a literal's line is located only where a condition literal of it is there too:
    `Saving` with `heckpoint`), then the few lines found by a literal that holds no prefilter needle (tqdm's
    `Training Progress`) checked against the prefilter; else one prefilter pass, its hit lines then checked for a
    lasting literal.

    The dense way also tells which literals each line holds: `may_last` then drops the lines no lasting pattern
    can match (the words its regex requires are missing: a config dump's `'checkpoint': {...}` is no `Saving
    checkpoint to`), no step line, no new missing extension."""

    def __init__(self, prefilter: NeedleMatcher):
        found = {lit for p in PATTERNS if lasting(p) for lit in needles_of(p)} | set(TEXT_LITERALS)
        # a literal holding another finds no line the other does not (fewer literals: a faster pass)
        kept = sorted(lit for lit in found if not any(o != lit and o in lit for o in found))
        literals = [lit.encode() for lit in kept]
        self.prefilter = prefilter
        self.literals = NeedleMatcher(literals)
        self.sure = [any(n in literal for n in prefilter.needles) for literal in literals]
        # per literal: what a line holding it may match (a pattern: its needles and required words; TEXT_LITERALS)
        self.conditions: list[list] = []
        # ... and, for the dense pass, a literal per way a condition can hold (id: the literal's index) that every
        # line meeting it holds: a required word (`Saving` for `[Ss]aving checkpoint to`), a needle, `step:`, `._`;
        # a line holding a literal is looked at only where one of that literal's expressions is in it too (see
        # _by_literal). Literals, not `Saving.*checkpoint.*to`: Hyperscan compiles those ~30x faster (process start)
        expressions: list[tuple[bytes, bool, int]] = []
        for index, literal in enumerate(kept):
            conditions: list = [text for text in TEXT_LITERALS if literal in text]
            for text in conditions:
                expressions.extend((expression, False, index) for expression in TEXT_EXPRESSIONS[text])
            for p in PATTERNS:
                needles = needles_of(p)
                if lasting(p) and any(literal in n for n in needles):
                    words = required_words(p.regex)
                    caseless = bool(re.compile(p.regex).flags & re.IGNORECASE)
                    expressions.extend((e, c, index) for e, c in _telling(literal, needles, words, caseless))
                    # the line holds `literal`: a pattern needing just that is a candidate (no needle to look for)
                    unknown = () if literal in needles else tuple(n.encode() for n in needles)
                    if words is not None:  # words apart from the literal first: they decide soonest
                        lit = literal.lower() if caseless else literal
                        words = tuple(tuple(w.encode() for w in sorted(alt, key=lambda w: (w in lit or lit in w,
                                                                                          -len(w))))
                                      for alt in words)
                    conditions.append((unknown, caseless, words))
            self.conditions.append(conditions)
        self.kept = literals
        assert len(literals) <= LITERAL_BASE and BOTH_BASE + len(literals) <= 0xFF, "ids in _by_literal's byte"
        self.sure_mask = sum(1 << i for i, certain in enumerate(self.sure) if certain)
        # a case-sensitive condition literal that holds its literal reports both (BOTH_BASE + index); a literal
        # is reported by itself only where one of its condition literals does not hold it (`Saving`)
        both = [(e, c, BOTH_BASE + i if not c and literals[i] in e else i) for e, c, i in expressions]
        alone = {i for _, _, i in both if i < LITERAL_BASE}
        expressions = both + [(literal, False, LITERAL_BASE + i) for i, literal in enumerate(literals) if i in alone]
        self._lasting_only: dict[tuple[int, ...], tuple[int, ...]] = {}
        self.expressions = _expression_database(expressions)

    def lasting_only(self, candidates: tuple[int, ...]) -> tuple[int, ...]:
        """The candidates a skimmed line is fed with: its lasting patterns (what the others do, error events,
        traceback areas, the driver's failure, the next progress clears or the exact re-read redoes), all of them
        where one may go on training (an error after that progress in the line outlives it)."""
        kept = self._lasting_only.get(candidates)
        if kept is None:
            if any(PATTERNS[i].fact in PROGRESS_FACTS for i in candidates):
                kept = candidates
            else:
                kept = tuple(i for i in candidates if lasting(PATTERNS[i]))
            if len(self._lasting_only) < MAX_MEMO:
                self._lasting_only[candidates] = kept
        return kept

    @property
    def available(self) -> bool:
        return (self.literals.database is not None and self.prefilter.database is not None
                and self.expressions is not None)

    def line_starts(self, buf: bytearray, cut: int, dense: bool) -> tuple[list[int], list[int] | None, int]:
        """Dense: (sorted starts of the prefilter hit lines of buf[:cut] holding a lasting literal, the literals
        each holds as a bit mask, how many lines were checked against the prefilter). Else: (the starts of all
        hit lines, None, 0): `literal_mask` and `may_last` tell, for those the reader does not take as metrics lines."""
        if dense:
            starts, masks, unsure = self._by_literal(buf, cut)
            if not unsure:
                return starts, masks, 0
            misses = set(unsure) - _holding(buf, cut, unsure, self.prefilter)
            if misses:
                kept = [i for i, s in enumerate(starts) if s not in misses]
                starts, masks = [starts[i] for i in kept], [masks[i] for i in kept]
            return starts, masks, len(unsure)
        found: set[int] = set()
        self.prefilter.line_starts(buf, cut, found)
        return sorted(found), None, 0

    def literal_mask(self, line: bytes) -> int:
        """The lasting literals the line holds, as may_last's bit mask: one Hyperscan scan (a loop of `in` over the
        literals costs ~14x more on an error storm's lines)."""
        database = self.literals.database
        if database is None:
            return sum(1 << i for i, literal in enumerate(self.kept) if literal in line)
        ids: list[int] = []
        database.scan(line, match_event_handler=lambda i, _f, _t, _fl, _c: ids.append(i))
        mask = 0
        for i in ids:
            mask |= 1 << i
        return mask

    def _by_literal(self, buf: bytearray, cut: int) -> tuple[list[int], list[int], list[int]]:
        """Starts of the lines holding a lasting literal and one of its condition literals, their literal masks
        (only such literals: may_last gives the same answer, the others' conditions cannot hold), those holding
        only unsure ones. One Hyperscan pass for both kinds (a literal reports LITERAL_BASE + its index): a config
        dump's `'checkpoint': {...}` is located but never looked at."""
        found: list[int] = []
        self.expressions.scan(memoryview(buf)[:cut],
                              match_event_handler=lambda i, _f, to, _fl, _c: found.append(to << 8 | i))
        starts: list[int] = []
        masks: list[int] = []
        unsure: list[int] = []
        rfind, find, base, sure = buf.rfind, buf.find, LITERAL_BASE, self.sure_mask
        both, low_bits = BOTH_BASE, LOW_BITS
        line_end = -1
        bits = start = 0
        for code in found:  # in end-offset order: a literal ends in the line it starts in
            to = code >> 8
            if to <= line_end:
                bits |= 1 << (code & 0xFF)
                continue
            if bits:
                mask = (bits >> base & bits | bits >> both) & low_bits  # a literal and a condition literal of it
                if mask:
                    starts.append(start)
                    masks.append(mask)
                    if not mask & sure:
                        unsure.append(start)
            start = rfind(b"\n", 0, to) + 1
            end = find(b"\n", to, cut)
            line_end = cut if end == -1 else end
            bits = 1 << (code & 0xFF)
        if bits:
            mask = (bits >> base & bits | bits >> both) & low_bits
            if mask:
                starts.append(start)
                masks.append(mask)
                if not mask & sure:
                    unsure.append(start)
        return starts, masks, unsure

    def may_last(self, raw: bytes, mask: int, evidence: Evidence) -> bool:
        """Whether the line (holding the literals of `mask`) may change more than the next progress clears."""
        lower = None
        conditions = self.conditions
        while mask:  # plain loops, no generators: this runs for every candidate line
            low = mask & -mask
            mask ^= low
            for condition in conditions[low.bit_length() - 1]:
                if condition == "step":  # `step:`, maybe with a colour code before the colon
                    if b"step:" in raw or (any(c in raw for c in CODE_AFTER_STEP) and b"step:" in _uncoloured(raw)):
                        return True
                    continue
                if condition == "No module":
                    if _new_extension(raw, evidence):
                        return True
                    continue
                if condition == THREAD_HEADER:
                    return True
                needles, caseless, words = condition
                if needles:
                    for needle in needles:
                        if needle in raw:
                            break
                    else:
                        continue
                if words is None:
                    return True
                if caseless and lower is None:
                    lower = raw.lower()
                text = lower if caseless else raw
                for alternative in words:
                    for word in alternative:
                        if word not in text:
                            break
                    else:
                        return True
        return False


THREAD_BYTES = THREAD_HEADER.encode()
JOINABLE_START = re.compile(rb"[^\x1b+\[]")  # a next line's first byte other than CONTINUATION_NEVER's
# step_match_in as one search: the first `step:` not after [A-Za-z0-9_/] that `step:N - ` follows (the lookbehind
# after the literal: the regex engine's literal-prefix scan finds the candidates); the line's start follows a newline
STEP_SEARCH = re.compile(rb"step:(?<![\w/]step:)(\d+)\s+-\s+")
CODE_AFTER_STEP = (b"step\x1b", b"step[", b"step^[")  # an ANSI code (or its residue) right after `step`
# what a line meeting a TEXT_LITERALS condition of may_last holds: `step:` (or `step` and a code), `._` (a missing
# compiled extension, _new_extension), the thread header
TEXT_EXPRESSIONS = {"step": (b"step:", *CODE_AFTER_STEP), "No module": (b"._",), THREAD_HEADER: (THREAD_BYTES,)}
EXTENSION_BYTES_RE = re.compile(rb"No module named '(?:\w+\.)+(_\w+)'")


def _telling(literal: str, needles: tuple[str, ...], words, caseless: bool) -> list[tuple[bytes, bool]]:
    """(literal, caseless) pairs one of which every line meeting may_last's condition for a pattern holds, besides
    `literal`: its needles when the condition needs one (`Found checkpoint`), else per alternative of its required
    words the longest word of 6+ characters apart from the literal (`Saving`), else the longest holding it
    (`total_training_steps` for `step`), else the literal itself."""
    if literal not in needles:
        return [(n.encode(), False) for n in needles]
    if words is None:
        return [(literal.encode(), False)]
    lit = literal.lower() if caseless else literal
    out = []
    for alt in words:
        apart = [w for w in alt if len(w) >= TELLING_WORD and w not in lit and lit not in w]
        holding = [w for w in alt if lit in w]
        word = max(apart or holding, key=len) if apart or holding else None
        out.append((word.encode(), caseless) if word else (literal.encode(), False))
    return out


def _finite(ends: list[int], lo: int, hi: int) -> bool:
    """No `nan`/`inf` whose match ends in `ends` inside [lo, hi)."""
    i = bisect_left(ends, lo + 3)  # a match ending there or later starts inside
    return i == len(ends) or ends[i] > hi


def _expression_database(expressions: list[tuple[bytes, bool, int]]):
    """A block-mode Hyperscan database of (literal, caseless, id), or None where hyperscan is not installed."""
    try:
        import hyperscan
    except ImportError:
        return None
    database = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    database.compile(expressions=[re.escape(e) for e, _, _ in expressions], ids=[i for _, _, i in expressions],
                     elements=len(expressions),
                     flags=[hyperscan.HS_FLAG_CASELESS if caseless else 0 for _, caseless, _ in expressions])
    return database


def _uncoloured(raw: bytes) -> bytes:
    """The line without ANSI codes or their residue (what normalise removes inside a line)."""
    if b"\x1b" in raw:
        raw = ANSI_BYTES_RE.sub(b"", raw)
    if b"[3" in raw or b"[0m" in raw or b"[1;3" in raw or b"[0;0m" in raw:  # as normalise
        raw = ANSI_RESIDUE_BYTES_RE.sub(b"", raw)
    return raw


def _new_extension(raw: bytes, evidence: Evidence) -> bool:
    """Whether the line may note a compiled extension the evidence has not noted yet (Evidence._line: the first
    `No module named 'a.b._c'` of each logical line, up to 20)."""
    if len(evidence.missing_ext) >= 20 or b"._" not in raw:
        return False
    if not raw.isascii():
        return True  # \w beyond ASCII: let Evidence decide
    known = evidence.missing_ext
    return any(name.decode() not in known for name in EXTENSION_BYTES_RE.findall(_uncoloured(raw)))


def _holding(buf: bytearray, cut: int, starts: list[int], matcher: NeedleMatcher) -> set[int]:
    """Those of the line starts whose line holds one of the matcher's needles (the lines joined, one scan)."""
    pieces, offsets, pos, find = [], {}, 0, buf.find
    for start in starts:
        end = find(b"\n", start, cut)
        piece = buf[start : cut if end == -1 else end]
        pieces.append(piece)
        offsets[pos] = start
        pos += len(piece) + 1
    joined = b"\n".join(pieces)
    found: set[int] = set()
    matcher.line_starts(joined, len(joined), found)
    return {offsets[offset] for offset in found}


class CappedReading:
    """An error storm read exactly: once MAX_EVENTS error events are kept, Evidence.feed_bytes drops every line that
    holds no literal of a fact / limitation / marker pattern, `(raylet)` or `step:`, only noting that some line's
    error candidates went unkept. So past the cap a window is searched for those lines only (few: one Hyperscan
    pass), and for one line holding another pattern's literal (the note) — not every error line located and fed.
    Same lines fed, same verdict; the note says that lines were not kept, not how many."""

    def __init__(self):
        late: set[bytes] = set()
        other: set[bytes] = set()
        for pattern in PATTERNS:
            (late if pattern.kind in LATE_KINDS_SET else other).update(n.encode() for n in needles_of(pattern))
        self.fed = NeedleMatcher(sorted(late | {b"(raylet)", b"step:"}))
        self.unkept = NeedleMatcher(sorted(other))
        self.usable = self.fed.database is not None and self.unkept.database is not None


def _stop(*_report) -> bool:
    return True  # a Hyperscan handler's True ends the scan (ScanTerminated)


_CAPPED: list[CappedReading] = []


def capped_reading() -> CappedReading | None:
    """The CappedReading, built at the first storm (its two databases cost process start otherwise); None
    without Hyperscan (then past the cap the lines are read as before it)."""
    if not _CAPPED:
        _CAPPED.append(CappedReading())
    return _CAPPED[0] if _CAPPED[0].usable else None


class Skim:
    """One file through one Evidence (see module docstring). `run` feeds it; `decide` reads it afterwards."""

    def __init__(self, evidence: Evidence, matcher: NeedleMatcher, lasting_lines: LastingLines,
                 last_only: bytes | None):
        self.ev = evidence
        self.matcher = matcher
        self.lasting = lasting_lines
        self.last_only = last_only
        self.skimming = False  # since the region's start only lasting lines are fed
        self.dense = False  # which way LastingLines finds them (the cheaper on the last chunk)
        self.wasted = 0  # this chunk's lines looked at and not fed that the other way would not look at
        self.saved: dict | None = None  # evidence at the region's start (None: nothing fed since)
        self.pending: list[tuple[bytes, int | None]] = []  # earlier chunks' part of the region, with their bar line
        self.pending_bytes = 0
        self.bound = 0  # more than the error events there can be since the region's start (its lines and \r)
        self.counted = 0  # offset in the chunk up to which the region's lines are in bound
        self.region = 0  # where the region starts in this chunk (0: in an earlier one)

    def run(self, path: str | os.PathLike[str], chunk_size: int, stats: ScanStats) -> None:
        chunks = read_chunks(path, chunk_size, stats)
        keep_from = None
        while True:
            try:
                buf, cut, eof = chunks.send(keep_from)
            except StopIteration:
                return
            keep_from = self._chunk(buf, cut, eof)

    # -- one chunk -------------------------------------------------------------------------------------------
    def _chunk(self, buf: bytearray, cut: int, eof: bool) -> int:
        bar = last_bar_start(buf, cut, self.last_only)
        self.nonfinite = None  # ends of this chunk's `nan` and `inf`, when a metrics line first asks
        candidates = None
        pos = self.region = self.counted = 0
        while True:
            if not self.skimming:
                pos, progressed = self._exact(buf, pos, cut, eof, bar)
                if not progressed:
                    return pos
                self._new_region(pos)
                continue
            if candidates is None:
                candidates, masks, looked = self.lasting.line_starts(buf, cut, self.dense)
                self.wasted = looked  # lines looked at and not fed, that the other way would not look at
            pos, done = self._skim(buf, pos, cut, eof, bar, candidates, masks)
            if self.wasted > cut * WASTED_PER_BYTE:  # the other way looks at fewer lines: take it next chunk
                self.dense, self.wasted = not self.dense, 0
            region = self.region
            if done and not eof:
                keep_from = pos
                if self.pending_bytes + keep_from - region <= PENDING_LIMIT:
                    if keep_from > region:
                        self._bound(buf, keep_from)
                        self.pending.append((bytes(buf[region:keep_from]),
                                             bar - region if bar is not None and region <= bar < keep_from else None))
                        self.pending_bytes += keep_from - region
                    return keep_from
            self._go_back()  # the log ends, a storm-sensitive line, or too much skipped: read the region exactly
            pos = region

    def _exact(self, buf, pos: int, cut: int, eof: bool, bar: int | None) -> tuple[int, bool]:
        """Feed every hit line from pos on; stop after a progress. -> (offset reached, progressed); a deferred step
        line stops it at its start (the chunk ends there)."""
        ev = self.ev
        while pos < cut:
            hi = buf.find(b"\n", min(cut, pos + EXACT_WINDOW) - 1, cut) + 1 or cut
            if len(ev.events) >= MAX_EVENTS and (capped := capped_reading()) is not None:
                pos, progressed, stop = self._capped(capped, buf, pos, hi, cut, eof, bar)
                if stop:
                    return pos, progressed
                continue
            starts: set[int] = set()
            self.matcher.line_starts(buf, hi, starts, lo=pos)
            if bar is not None and pos <= bar < hi:
                starts.add(bar)
            for start in sorted(starts):
                if start < pos:
                    continue
                line, nxt, deferred, _ = line_at(buf, start, cut, eof)
                if deferred:
                    return start, False
                count = ev.progress_count
                ev.feed_bytes(line)
                pos = nxt
                if ev.progress_count != count and ev.reached >= RAY_UP and ev.skimmable:
                    return pos, True
            pos = max(pos, hi)
        return cut, False

    def _capped(self, capped: CappedReading, buf, pos: int, hi: int, cut: int, eof: bool,
                bar: int | None) -> tuple[int, bool, bool]:
        """_exact of the window buf[pos:hi] past the cap (CappedReading). -> (offset, progressed, stop): stop as
        _exact returns; else go on from offset (hi, or after a line whose progress lifted the cap)."""
        ev = self.ev
        starts: set[int] = set()
        capped.fed.line_starts(buf, hi, starts, lo=pos)
        if bar is not None and pos <= bar < hi:
            starts.add(bar)
        gap = pos  # the lines from here to the next fed one are not fed
        for start in sorted(starts):
            if start < pos or (start != bar and not self._prefiltered(buf, start, cut)):
                continue  # inside a joined step line; or no prefilter hit, which _exact never looks at
            line, nxt, deferred, _ = line_at(buf, start, cut, eof)
            self._note_unkept(capped, buf, gap, start)
            if deferred:
                return start, False, True
            count = ev.progress_count
            ev.feed_bytes(line)
            pos = gap = nxt
            if ev.progress_count != count and ev.reached >= RAY_UP and ev.skimmable:
                return pos, True, True
            if len(ev.events) < MAX_EVENTS:  # a progress cleared the events: read on line by line
                return pos, False, False
        self._note_unkept(capped, buf, gap, hi)
        return max(pos, hi), False, False

    def _prefiltered(self, buf, start: int, cut: int) -> bool:
        end = buf.find(b"\n", start, cut)
        found: set[int] = set()
        self.matcher.line_starts(buf, cut if end == -1 else end, found, lo=start)
        return bool(found)

    def _note_unkept(self, capped: CappedReading, buf, lo: int, hi: int) -> None:
        """Evidence's note of an unkept error line, when a prefilter hit line in buf[lo:hi] holds a literal of a
        pattern the cap drops (the first one found ends the search)."""
        if self.ev.events_dropped or lo >= hi:
            return
        rfind = buf.rfind

        def hit(_id, _from, to, _flags, _context) -> bool:  # True ends the scan
            return self._prefiltered(buf, rfind(b"\n", 0, lo + to) + 1, hi)

        try:
            capped.unkept.database.scan(memoryview(buf)[lo:hi], match_event_handler=hit)
        except hyperscan.ScanTerminated:
            self.ev.events_dropped += 1

    def _skim(self, buf, pos: int, cut: int, eof: bool, bar: int | None, candidates: list[int],
              masks: list[int] | None) -> tuple[int, bool]:
        """Feed the lasting lines from pos on; after each progress the region starts again after it. -> (offset,
        True) at the chunk's end or a deferred step line (offset = its start), (its start, False) at a line that
        needs the skipped lines first, (cut, False) at the log's end."""
        ev = self.ev
        index, count = bisect_left(candidates, pos), len(candidates)
        if bar is not None and bar < pos:
            bar = None  # fed already
        while True:
            if bar is not None and (index == count or bar <= candidates[index]):
                start, mask, unchecked = bar, None, False  # the chunk's last tqdm bar, fed in its place
                if index < count and candidates[index] == bar:
                    index += 1
                bar = None
            elif index < count:
                start, mask, unchecked = candidates[index], None if masks is None else masks[index], masks is None
                index += 1
            else:
                return cut, not eof
            if start < pos:
                continue
            line, nxt, deferred, step = line_at(buf, start, cut, eof)
            if deferred:
                return start, True
            match = metrics_match(line, step) if step is not None else None
            if match is not None and int(match.group(1)) > ev.max_step:  # goes on training whatever was skipped
                finite = nxt == start + len(line) + 1 and self._finite(buf, cut, start + match.end(), start + len(line))
                ev.feed_metrics(line, match, finite)
                index, pos = self._metrics_run(buf, cut, candidates, index, nxt, bar)
                self._new_region(pos)
                continue
            if match is None and unchecked:
                mask = self.lasting.literal_mask(line)
            if match is None and mask is not None and not self.lasting.may_last(line, mask, ev):
                self.wasted += unchecked  # a hit the dense way would not have looked at
                continue
            if THREAD_BYTES in line:  # after it the skipped lines may matter for good (Evidence.skimmable)
                return start, False
            if match is None:
                cands = DISPATCH.candidates(line)
                if self._bound(buf, start) >= MAX_EVENTS and ev.storm_sensitive(line, cands):
                    return start, False
                cands = self.lasting.lasting_only(cands)
            else:  # a metrics line not past the highest step: feed_bytes takes it without candidates
                cands = ()
            if self.saved is None:
                self.saved = ev.snapshot()
            progress = ev.progress_count
            ev.feed_bytes(line, cands)
            pos = nxt
            if ev.progress_count != progress:
                self._new_region(pos)

    def _metrics_run(self, buf, cut: int, candidates: list[int], index: int, pos: int,
                     bar: int | None) -> tuple[int, int]:
        """Feed at once the candidates from `index` on that are plain metrics lines going on training (what
        _skim's first branch takes, one step past the other, before the bar line): a long run's metrics lines,
        looked at in the chunk without copying them, a batch at a time (each test one C-level map over the
        batch; the batch doubles while every line passes). -> (index of the first candidate not taken, offset
        after the last taken)."""
        find, last = buf.find, self.ev.max_step
        run = MetricsRun(buf)
        stop = cut if bar is None else bar
        limit = bisect_left(candidates, stop, index)  # the candidates starting before the bar line
        size = 8
        while index < limit:
            starts = candidates[index : min(limit, index + size)]
            ends = list(map(find, repeat(b"\n"), starts, repeat(cut)))
            # not the chunk's last line (a line ends, and a next one follows in the chunk)
            n = next((j for j, end in enumerate(ends) if end == -1 or end + 1 >= cut), len(ends))
            # a next line no continuation starts so: line_at would not join it
            nexts = bytes(map(buf.__getitem__, map((1).__add__, ends[:n])))
            joinable = JOINABLE_START.search(nexts)
            n = n if joinable is None else joinable.start()
            starts, ends = starts[:n], ends[:n]
            returns = map(find, repeat(b"\r"), starts, ends)  # metrics_match: no tqdm redraw ...
            globals_ = map(find, repeat(b"training/global_step"), starts, ends)  # ... the global step ...
            matches = map(STEP_SEARCH.search, repeat(buf), starts, ends)  # ... and `step:N - `
            nonfinite = self._nonfinite(buf, cut)
            taken = 0
            for start, end, cr, glob, match in zip(starts, ends, returns, globals_, matches, strict=False):
                if cr != -1 or match is None or (glob == -1 and not plain_metrics(buf, start, match.end(), end)):
                    break  # (no global step: the older layout's plain metrics line)
                step = int(match.group(1))
                if step <= last:
                    break
                if nonfinite and not _finite(nonfinite, match.end(), end):
                    run.nonfinite.append(len(run.steps))
                run.add(start, match.end(), end, step)
                last, pos = step, end + 1
                taken += 1
            index += taken
            if taken < size:
                break
            size = min(size * 2, 4096)
        if run.steps:
            self.ev.feed_metrics_run(run)
        return index, pos

    def _nonfinite(self, buf, cut: int) -> list[int]:
        """The ends of this chunk's `nan` and `inf` (one search of the chunk for both, when first asked)."""
        if self.nonfinite is None:
            ends: list[int] = []
            NONFINITE.scan(memoryview(buf)[:cut], match_event_handler=lambda _i, _f, to, _fl, _c: ends.append(to))
            self.nonfinite = ends
        return self.nonfinite

    def _finite(self, buf, cut: int, lo: int, hi: int) -> bool:
        """No `nan`/`inf` in buf[lo:hi] (a line's metrics)."""
        return _finite(self._nonfinite(buf, cut), lo, hi)

    def _new_region(self, start: int) -> None:
        """A progress: nothing skipped before `start` matters any more."""
        self.skimming = True
        self.region = self.counted = start
        if self.saved is not None:
            self.saved = None
        if self.pending:
            self.pending = []
            self.pending_bytes = 0
        self.bound = len(self.ev.events) + 1  # + the last line, when it has no newline

    def _bound(self, buf, upto: int) -> int:
        """bound, with the region's lines up to `upto` counted (only until it reaches MAX_EVENTS: then it stays)."""
        if self.bound < MAX_EVENTS and upto > self.counted:
            self.bound += buf.count(b"\n", self.counted, upto) + buf.count(b"\r", self.counted, upto)
            self.counted = upto
        return self.bound

    def _go_back(self) -> None:
        """Evidence as at the region's start, and the region's earlier chunks read exactly (this chunk's part is
        the caller's)."""
        if self.saved is not None:
            self.ev.restore(self.saved)
            self.saved = None
        for segment, bar in self.pending:
            pos = 0
            while pos < len(segment):
                pos, _ = self._exact(segment, pos, len(segment), True, bar)
        self.pending = []
        self.pending_bytes = 0
        self.skimming = False


class MetricsRun:
    """Plain metrics lines of one chunk, as offsets (Evidence.feed_metrics_run copies only what it keeps)."""

    def __init__(self, buf: bytearray):
        self.buf = buf
        self.steps: list[int] = []
        self.nonfinite: list[int] = []  # indices of the lines whose metrics hold `nan` or `inf`
        self._spans: list[tuple[int, int, int]] = []  # (line start, metrics start, line end)

    def add(self, start: int, metrics: int, end: int, step: int) -> None:
        self.steps.append(step)
        self._spans.append((start, metrics, end))

    def raw(self, i: int) -> bytes:
        start, _, end = self._spans[i]
        return bytes(self.buf[start:end])

    def rest(self, i: int) -> bytes:
        _, metrics, end = self._spans[i]
        return bytes(self.buf[metrics:end])
