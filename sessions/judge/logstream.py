"""Streaming reader for verl logs: finds candidate lines fast and normalises them.

Two layers:
- `scan_file` reads a file in large binary chunks and yields only the physical lines that contain one of the
  wanted needles (bytes.find in C; no per-line Python work for the bulk of a multi-GB log). Every byte is searched:
  an error in the middle of a 1 GiB log is found like one at its end.
- `normalise` turns one physical line into logical lines: ANSI codes stripped, an external timestamp or srun
  label dropped, Ray prefixes (nested, `ip=`) removed but remembered as the source, `[repeated Nx across
  cluster]` dropped, and `\\r` tqdm redraws split into separate segments.

Pasted logs wrap long `step:N - ...` lines; both readers join the wrapped continuation back onto the step line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from env.settings import TOOL_PREFIX

CHUNK_SIZE = 8 << 20
LAST_ONLY_WINDOW = 1 << 20  # where a chunk's last tqdm bar is looked for (bounded: a bar-free log costs no pass)
MAX_JOINED_STEP = 1 << 20
MAX_LINE_BYTES = 16 << 20  # a wrapped step line longer than this is cut (keeps memory bounded)
OWN_HEADER = TOOL_PREFIX  # our launcher's header lines: never evidence
OWN_EXIT_FOOTER = OWN_HEADER + " wrapper exit code "

ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][AB012]")
EXTERNAL_PREFIX_RE = re.compile(
    r"^(?:\d{1,5}: )?"  # srun --label
    r"(?:\[?\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?\]?\s+)?"
    r"(?:\d{1,5}: )?"
)
RAY_PREFIX_RE = re.compile(
    r"\((?:(?P<name>[A-Za-z_][\w.\-]*)(?:\s+pid=\d+)?|pid=\d+)(?:,\s*ip=[0-9A-Fa-f.:]+)?\)\s?"
)
ANSI_RESIDUE_RE = re.compile(r"(?:\^\[)?\[(?:3\d|39|0)m")
ANSI_BYTES_RE = re.compile(ANSI_RE.pattern.encode())
ANSI_RESIDUE_BYTES_RE = re.compile(ANSI_RESIDUE_RE.pattern.encode())
RANK_PREFIX_RE = re.compile(r"^\[[Rr]ank\d+\]:\s?")
REPEATED_RE = re.compile(r"\s*\[repeated \d+x across cluster\]\s*$")
STEP_AT_BYTES_RE = re.compile(rb"step:(\d+)\s+-\s+")  # the metrics follow match.end()
# A wrapped continuation of a metrics line: fragments of `key:value` joined by ` - `, nothing else.
CONTINUATION_BYTES_RE = re.compile(rb"^ ?(?:- )?[\w./@%()+\-:]*(?: - [\w./@%()+\-:]*)*(?: -)? ?$")
RAY_PREFIX_BYTES_RE = re.compile(rb"\((?:[A-Za-z_][\w.\-]*(?: pid=\d+)?|pid=\d+)(?:, ip=[0-9A-Fa-f.:]+)?\) ")


@dataclass(frozen=True)
class LogLine:
    source: str | None  # outermost Ray actor/process name ("TaskRunnerV1", "WorkerDict", "raylet"), None = driver
    text: str
    inner: str | None = None  # innermost nested Ray prefix name (vLLM's EngineCore/Worker), when nested


def normalise(raw: str) -> list[LogLine]:
    """One physical line -> its logical lines (see module docstring). Our own header lines give none."""
    if "\x1b" in raw:
        raw = ANSI_RE.sub("", raw)
    if "[3" in raw or "[0m" in raw:  # a paste that lost the ESC byte keeps "[36m" or "^[[36m"
        raw = ANSI_RESIDUE_RE.sub("", raw)
    raw = raw.rstrip("\n")
    for _ in range(2):  # a timestamped capture of an already timestamped log has two
        if not (raw[:1].isdigit() or raw[:1] == "["):
            break
        stripped = EXTERNAL_PREFIX_RE.sub("", raw, count=1)
        if stripped == raw:
            break
        raw = stripped
    source = inner = None
    if raw.startswith("("):
        pos = 0
        while True:
            match = RAY_PREFIX_RE.match(raw, pos)
            if not match:
                break
            name = match.group("name") or "pid"
            if source is None:
                source = name
            else:
                inner = name
            pos = match.end()
        raw = raw[pos:]
    if raw.startswith(("[rank", "[Rank")):
        raw = RANK_PREFIX_RE.sub("", raw, count=1)
    if raw.endswith("]") and "across cluster" in raw:
        raw = REPEATED_RE.sub("", raw)
    if raw.startswith(OWN_HEADER):  # the launcher's exit-code footer is its own measurement, not the run's word
        return [LogLine(source, raw.rstrip(), inner)] if raw.startswith(OWN_EXIT_FOOTER) else []
    if "\r" not in raw:
        text = raw.rstrip()
        return [LogLine(source, text, inner)] if text else []
    lines = []
    for segment in raw.split("\r"):
        segment = segment.rstrip()
        if segment.strip():
            lines.append(LogLine(source, segment.lstrip() if source else segment, inner))
    return lines


def step_line_match(line: bytes) -> re.Match[bytes] | None:
    """The `step:N - ` of a metrics line (not `global_step:N`), found with bytes.find before any regex."""
    return step_match_in(line, 0, len(line))


def step_match_in(buf: bytes | bytearray, start: int, end: int) -> re.Match[bytes] | None:
    """step_line_match of the line buf[start:end], without copying it (offsets are buf's)."""
    pos = buf.find(b"step:", start, end)
    while pos != -1:
        before = buf[pos - 1] if pos > start else 32
        if not (48 <= before <= 57 or 65 <= before <= 90 or 97 <= before <= 122 or before in (95, 47)):
            match = STEP_AT_BYTES_RE.match(buf, pos, end)
            if match:
                return match
        pos = buf.find(b"step:", pos + 5, end)
    return None


def _is_step_line(line: bytes) -> bool:
    return step_line_match(line) is not None


def _is_continuation(line: bytes) -> bool:
    stripped = line.rstrip(b"\r\n")
    if not stripped or stripped.startswith((b"\x1b", b"+", b"[")) or _is_step_line(stripped):
        return False
    if stripped.startswith(b"(") and RAY_PREFIX_BYTES_RE.match(stripped):
        return False
    return CONTINUATION_BYTES_RE.match(stripped) is not None


def join_wrapped(lines: Iterable[str]) -> Iterator[str]:
    """Text-line iterator with wrapped step-line continuations joined (for `judge_lines`)."""
    pending: str | None = None
    for line in lines:
        line = line.rstrip("\n")
        if pending is not None:
            if len(pending) < MAX_JOINED_STEP and _is_continuation(line.encode("utf-8", "replace")):
                pending += line.rstrip("\r")
                continue
            yield pending
            pending = None
        if "step:" in line and _is_step_line(line.encode("utf-8", "replace")):
            pending = line.rstrip("\r")
        else:
            yield line
    if pending is not None:
        yield pending


class NeedleMatcher:
    """Finds the lines of a byte buffer that hold any of a fixed set of literal needles, in one pass.

    With Hyperscan (the `hyperscan` dependency where it has wheels: SIMD multi-literal search, one pass over the buffer whatever
    the number of needles) the scan costs about what `grep -E` costs; without it, one C-level `bytes.find` pass per
    needle (same lines found, slower on very large logs).
    """

    def __init__(self, needles: Sequence[bytes], *, use_hyperscan: bool | None = None):
        self.needles = tuple(needles)
        self.database = None
        if use_hyperscan is not False:
            self.database = hyperscan_database(self.needles)
            if use_hyperscan and self.database is None:
                raise RuntimeError("hyperscan is not importable")
        self.engine = "hyperscan" if self.database is not None else "bytes.find"

    def line_starts(self, buf: bytearray | bytes, hi: int, starts: set[int], lo: int = 0) -> None:
        """Add the start offset of every line in buf[lo:hi] that holds a needle (lo: a line start)."""
        if self.database is None:
            for needle in self.needles:
                _collect(buf, needle, lo, hi, starts)
            return
        ends: list[int] = []
        self.database.scan(memoryview(buf)[lo:hi],
                           match_event_handler=lambda _id, _f, to, _fl, _c: ends.append(to + lo))
        rfind = buf.rfind
        last_line = -1
        for to in ends:  # in order: skip hits in the line just added
            if to <= last_line:
                continue
            start = rfind(b"\n", 0, to) + 1
            starts.add(start)
            end = buf.find(b"\n", to, hi)
            last_line = hi if end == -1 else end


def hyperscan_database(needles: Sequence[bytes]):
    """A block-mode hyperscan database of the literals (id = index), or None where hyperscan is not installed."""
    try:
        import hyperscan
    except ImportError:
        return None
    database = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    database.compile(expressions=[re.escape(n) for n in needles], ids=list(range(len(needles))),
                     elements=len(needles), flags=[0] * len(needles))
    return database


@dataclass
class ScanStats:
    bytes_read: int = 0
    lines_yielded: int = 0


def read_chunks(path: str | os.PathLike[str], chunk_size: int, stats: ScanStats) -> Iterator[tuple[bytearray, int, bool]]:
    """(buf, cut, eof) per chunk: buf[:cut] holds whole lines (all of the file's rest at eof). The consumer sends
    back where the next chunk starts (`keep_from`, at most cut: a deferred step line is read again with more)."""
    with open(path, "rb", buffering=0) as handle:
        buf = bytearray(chunk_size + (1 << 16))
        view = memoryview(buf)
        filled = 0  # bytes of buf holding data (carry + new read)
        eof = False
        while not eof:
            if filled >= len(buf) - (1 << 16):  # carry too big (giant line or deferred step): grow
                view.release()
                buf.extend(bytes(len(buf)))
                view = memoryview(buf)
            got = handle.readinto(view[filled:]) or 0
            stats.bytes_read += got
            eof = got == 0
            filled += got
            if eof:
                cut = filled
            else:
                cut = buf.rfind(b"\n", 0, filled) + 1
                if cut == 0 and filled < MAX_LINE_BYTES:  # no newline in the whole buffer yet: read more
                    continue
                cut = cut or filled  # a line longer than MAX_LINE_BYTES is read in pieces (memory stays flat)
            keep_from = yield buf, cut, eof
            keep_from = cut if keep_from is None else keep_from
            carry = filled - keep_from
            buf[:carry] = buf[keep_from:filled]
            filled = carry


def last_bar_start(buf: bytearray, cut: int, needle: bytes | None) -> int | None:
    """Start of the chunk's last `needle` line within its final LAST_ONLY_WINDOW (None: none there)."""
    if needle is None:
        return None
    pos = buf.rfind(needle, max(0, cut - LAST_ONLY_WINDOW), cut)
    return None if pos == -1 else buf.rfind(b"\n", 0, pos) + 1


def line_at(buf: bytearray | bytes, start: int, cut: int, eof: bool) -> tuple[bytes, int, bool, re.Match | None]:
    """(line, offset after it, deferred, its `step:N - ` match) for the line at `start`: a `step:N - ...` line
    with its wrapped continuation lines joined; deferred when those may go on past `cut` (read it again with the
    next chunk)."""
    end = buf.find(b"\n", start, cut)
    end = cut if end == -1 else end
    line = bytes(buf[start:end])
    consumed = end + 1
    step = step_line_match(line) if b"step:" in line else None
    if step is not None:
        nxt = end + 1
        while nxt < cut and len(line) < MAX_JOINED_STEP:
            nxt_end = buf.find(b"\n", nxt, cut)
            if nxt_end == -1:
                nxt_end = cut
            if buf[nxt : nxt + 1] in (b"\x1b", b"+", b"["):  # no continuation starts so (_is_continuation)
                break
            piece = bytes(buf[nxt:nxt_end])
            if not _is_continuation(piece):
                break
            line += piece.rstrip(b"\r")
            consumed = nxt = nxt_end + 1
        if nxt >= cut and not eof and len(line) < MAX_JOINED_STEP:
            return line, consumed, True, step
    return line, consumed, False, step


def scan_file(
    path: str | os.PathLike[str],
    needles: Sequence[bytes] | NeedleMatcher,
    *,
    last_only_needle: bytes | None = b"Training Progress",
    chunk_size: int = CHUNK_SIZE,
    stats: ScanStats | None = None,
) -> Iterator[bytes]:
    """Yield, in file order, every physical line (bytes, no newline) of the file that holds one of `needles`.

    Every byte of the file is searched (no sampling) by a NeedleMatcher over each large chunk, so the Python work is
    proportional to the lines hit, not to the file. Of the lines holding `last_only_needle` (frequent tqdm redraws)
    only the last one in the final LAST_ONLY_WINDOW of each chunk is yielded (a bar says how far training got, never
    that an error was survived). A wrapped `step:N - ...` metrics line comes with its continuation lines joined.
    """
    stats = stats if stats is not None else ScanStats()
    matcher = needles if isinstance(needles, NeedleMatcher) else NeedleMatcher(needles)
    chunks = read_chunks(path, chunk_size, stats)
    keep_from = None
    try:
        while True:
            buf, cut, eof = chunks.send(keep_from)
            starts: set[int] = set()
            matcher.line_starts(buf, cut, starts)
            bar = last_bar_start(buf, cut, last_only_needle)
            if bar is not None:
                starts.add(bar)
            consumed = 0  # lines starting before this offset were already yielded (joined continuations)
            keep_from = cut
            for start in sorted(starts):
                if start < consumed:
                    continue
                line, consumed, deferred, _ = line_at(buf, start, cut, eof)
                if deferred:
                    keep_from = start  # its continuation may be in the next chunk: redo it then
                    break
                stats.lines_yielded += 1
                yield line
    except StopIteration:
        return


def _collect(buf: bytearray, needle: bytes, lo: int, hi: int, starts: set[int]) -> None:
    """Add the start offset of every line in buf[lo:hi] that holds `needle` (one hit per line)."""
    find, rfind = buf.find, buf.rfind
    pos = find(needle, lo, hi)
    while pos != -1:
        line_start = rfind(b"\n", 0, pos) + 1
        starts.add(line_start)
        line_end = find(b"\n", pos, hi)
        if line_end == -1:
            return
        pos = find(needle, line_end + 1, hi)
