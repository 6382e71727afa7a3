"""The skimming reader (sessions/judge/skim.py) gives the verdict of feeding every prefilter hit line.

`judge_log` skims after each progress and goes back when it must; the reference here feeds every line `scan_file`
yields. They are compared on the verdict JSON (plain and level 5) for seeded mixes of real and corpus log lines with
synthetic blocks (metrics runs, error storms past the event cap, noise, missing extensions, tqdm bars, final
validation), under small chunks, windows and skip limits so that regions cross chunks, overflow and end the log.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from sessions.judge import skim
from sessions.judge.decide import decide
from sessions.judge.evidence import MAX_EVENTS, Evidence
from sessions.judge.logstream import scan_file
from sessions.judge.patterns import LAST_ONLY_NEEDLE
from sessions.judge.verdict import judge_log, lasting_lines, scan_matcher, sniff
from tests.conftest import REAL_LOGS

ROOT = Path(__file__).resolve().parent
TR = b"\x1b[36m(TaskRunnerV1 pid=2101)\x1b[0m "

pytestmark = pytest.mark.skipif(not lasting_lines().available, reason="hyperscan is not installed: no skimming")


def reference(path: Path, chunk: int, level: int | None) -> dict:
    ev = Evidence(level, None, None, None, None)
    ev.input_note = sniff(path)
    for raw in scan_file(path, scan_matcher(), last_only_needle=LAST_ONLY_NEEDLE.encode(), chunk_size=chunk):
        ev.feed_bytes(raw)
    return decide(ev, level_rule=level is not None, log_path=str(path)).to_json()


def same_verdicts(path: Path, chunk: int) -> None:
    for level in (None, 5):
        want = json.dumps(reference(path, chunk, level), sort_keys=True)  # NaN metrics compare equal as text
        got = json.dumps(judge_log(path, chunk_size=chunk, level=level, level_rule=level is not None).to_json(),
                         sort_keys=True)
        assert got == want, f"{path.name}, chunk {chunk}, level {level}"


def sources() -> list[list[bytes]]:
    logs = sorted((ROOT / "logs").glob("*.log")) + sorted(REAL_LOGS.glob("*.log"))
    return [p.read_bytes().split(b"\n") for p in logs]


def synthetic(rng: random.Random) -> list[bytes]:
    kind = rng.randrange(9)
    if kind == 0:  # a metrics run, sometimes with a NaN
        steps = sorted(rng.sample(range(1, 40), rng.randrange(1, 6)))
        return [TR + b"step:%d - training/global_step:%d - actor/pg_loss:%s - critic/score/mean:0.5"
                % (s, s, rng.choice([b"0.1", b"nan", b"np.float64(0.2)"])) for s in steps]
    if kind == 1:  # an error storm, past the kept events at times
        line = rng.choice([b"(WorkerDict pid=1) RuntimeError: boom", b"ERROR 12 oops",
                           b"Traceback (most recent call last):", b'  File "/x/verl/trainer/ppo.py", line 3, in fit',
                           b"torch.OutOfMemoryError: CUDA out of memory"])
        return [line] * rng.choice([1, 50, MAX_EVENTS + 50])
    if kind == 2:  # shutdown chatter (residual noise)
        return [rng.choice([b"(raylet) Shutting down the worker", b"resource_tracker: leaked",
                            b"Exception ignored in: <x>", b"SIGTERM received",
                            b"(WorkerDict pid=1) Exception in thread Thread-2:"])]
    if kind == 3:  # missing compiled extensions
        return [b"(WorkerDict pid=3) No module named 'vllm._%s'" % rng.choice([b"C", b"moe_C", b"flash"]),
                b"ModuleNotFoundError: No module named 'vllm._C'"]
    if kind == 4:
        n = rng.randrange(1, 12)
        return [TR + b"\rTraining Progress: %d%%|#| %d/10 [00:01<00:01]" % (n * 10, n)]
    if kind == 5:
        return [TR + b"(\"Final validation metrics: {'val-core/acc': 0.5}\")",
                b"wandb:     training/global_step %d" % rng.randrange(1, 40)]
    if kind == 6:  # validation-only and one-per-line metrics
        return [b"step:%d - val/test_score/x:0.5" % rng.randrange(0, 40), b"epoch 0, step:%d" % rng.randrange(0, 40),
                b"critic/score/mean:0.3 - actor/pg_loss:0.1"]
    if kind == 7:
        return [TR + b"Saving checkpoint to /c/global_step_%d" % rng.randrange(1, 40), TR + b"Enabling LORA with rank 8",
                b"(vLLM pid=2) Initializing a V1 LLM engine"]
    return [b"+ VANILLA_MBRIDGE=%s" % rng.choice([b"True", b"False"]), b"++ TOTAL_TRAIN_STEPS=%d" % rng.randrange(1, 40)]


def mixed_log(path: Path, seed: int, pool: list[list[bytes]]) -> None:
    rng = random.Random(seed)
    out: list[bytes] = []
    size, total = rng.choice([20_000, 100_000, 300_000]), 0
    while total < size:
        if rng.random() < 0.3:
            block = synthetic(rng)
        else:
            lines = rng.choice(pool)
            first = rng.randrange(len(lines))
            block = lines[first : first + rng.randrange(1, 300)]
        out.extend(block)
        total += sum(len(line) + 1 for line in block)
    path.write_bytes(b"\n".join(out) + (b"\n" if rng.random() < 0.7 else b""))


@pytest.mark.parametrize("seed", range(16))
def test_mixed_logs(seed, tmp_path, monkeypatch):
    rng = random.Random(1000 + seed)
    monkeypatch.setattr(skim, "PENDING_LIMIT", rng.choice([1 << 10, 1 << 14, 2 << 20]))
    monkeypatch.setattr(skim, "EXACT_WINDOW", rng.choice([1 << 9, 1 << 14, 256 << 10]))
    path = tmp_path / f"mix{seed}.log"
    mixed_log(path, seed, sources())
    same_verdicts(path, rng.choice([1 << 12, 1 << 14, 1 << 16]))


def test_storm_then_progress_and_a_storm_at_the_end(tmp_path, monkeypatch):
    """Past MAX_EVENTS errors the noise and a new missing extension depend on the cap: the reader reads those
    regions exactly; the log ends inside a skipped region that spans chunks."""
    monkeypatch.setattr(skim, "PENDING_LIMIT", 1 << 20)
    lines = [b"+ TOTAL_TRAIN_STEPS=9"]
    for step in range(1, 5):
        lines.append(TR + b"step:%d - training/global_step:%d - actor/pg_loss:0.1" % (step, step))
        lines += [b"(WorkerDict pid=1) RuntimeError: boom %d" % i for i in range(MAX_EVENTS + 10)]
        lines += [b"(raylet) Shutting down the worker", b"(WorkerDict pid=3) No module named 'vllm._moe_C'"]
    lines += [b"torch.OutOfMemoryError: CUDA out of memory"] * 20
    path = tmp_path / "storm.log"
    path.write_bytes(b"\n".join(lines) + b"\n")
    for chunk in (1 << 12, 1 << 16, 1 << 20):
        same_verdicts(path, chunk)


def test_metrics_runs_with_nan_and_wrapped_lines(tmp_path):
    lines = [TR + b"Total training steps: 400"]
    for step in range(1, 400):
        value = b"nan" if step in (7, 300) else b"np.float64(0.%d)" % step
        lines.append(TR + b"step:%d - training/global_step:%d - actor/pg_loss:%s - critic/score/mean:0.5"
                     % (step, step, value))
        if step % 50 == 0:  # a paste wrapped it: the continuation is joined
            lines[-1] = b"step:%d - training/global_step:%d - actor/pg_" % (step, step)
            lines.append(b"loss:0.25 - critic/score/mean:0.5")
        lines.append(TR + b"\rTraining Progress: %d%%|#| %d/400 [00:01<00:01]" % (step // 4, step))
    path = tmp_path / "metrics.log"
    path.write_bytes(b"\n".join(lines) + b"\n")
    for chunk in (1 << 12, 1 << 14, 1 << 20):
        same_verdicts(path, chunk)


def test_long_text_answers_as_re():
    """LongText (Hyperscan for the table's regexes and the death causes on long lines) agrees with re.search on
    long lines made of real and corpus lines, each pattern on the text it is searched in."""
    from sessions.judge.evidence import _head
    from sessions.judge.needles import LONG, LongText, search_other, search_pattern
    from sessions.judge.patterns import compiled

    table = compiled()
    rng = random.Random(7)
    pool = [line.decode("utf-8", "replace") for lines in sources() for line in lines if line]
    texts = []
    while len(texts) < 300:
        text = " ".join(rng.choice(pool) for _ in range(rng.randrange(5, 60)))
        if LongText.usable(text):
            texts.append(text)
    checked = 0
    for index, (pattern, regex) in enumerate(table):
        if LONG.database(index) is None:
            continue
        for text in texts:
            head = _head(text)
            assert bool(search_pattern(index, regex, head, {})) == bool(regex.search(head)), (pattern.name, head[:200])
            checked += 1
    assert checked > 100 * 50, "LongText took too few patterns"
    from sessions.judge.patterns import ACTOR_DEATH_CAUSES

    texts += [text + " memory limit exceeded, node 3 lost; SIGKILL" for text in texts[:50]]
    for cause_re, cause in ACTOR_DEATH_CAUSES:
        for text in texts:
            assert bool(search_other(cause_re, text, {})) == bool(cause_re.search(text)), (cause, text[:200])


def test_progress_facts_name_every_fact_that_goes_on_training():
    """Evidence.storm_sensitive trusts PROGRESS_FACTS to name the facts whose handler calls _progressed: read
    _fact's branches and check."""
    import ast
    import inspect
    import textwrap

    from sessions.judge.evidence import PROGRESS_FACTS

    tree = ast.parse(textwrap.dedent(inspect.getsource(Evidence._fact)))
    progressing = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
            continue
        names = [c.value for c in ast.walk(node.test) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
        calls = [c for stmt in node.body for c in ast.walk(stmt)
                 if isinstance(c, ast.Attribute) and c.attr == "_progressed"]
        if calls:
            progressing.update(names)
    assert progressing and progressing <= set(PROGRESS_FACTS), progressing - set(PROGRESS_FACTS)


def test_a_thread_traceback_outlasts_the_next_step(tmp_path):
    """`Exception in thread` marks its source for good (its exception line is no cause): a line the next progress
    does not clear, so the reader must not skip it."""
    lines = [b"+ TOTAL_TRAIN_STEPS=3"]
    lines.append(TR + b"step:1 - training/global_step:1 - actor/pg_loss:0.1")
    lines += [b"(WorkerDict pid=7) Exception in thread Thread-3:", b"(WorkerDict pid=7) Traceback (most recent call last):"]
    lines.append(TR + b"step:2 - training/global_step:2 - actor/pg_loss:0.1")
    lines.append(b"(WorkerDict pid=7) ValueError: the thread's own error")
    path = tmp_path / "thread.log"
    path.write_bytes(b"\n".join(lines) + b"\n")
    for chunk in (1 << 12, 1 << 20):
        same_verdicts(path, chunk)


def test_the_dense_pass_locates_every_line_may_last_keeps():
    """The dense pass locates a line only where one of its literals' condition literals (a needle, a telling
    required word, `step:`, `._`) is in it too: a superset of what may_last keeps. Every corpus and real-log line
    (and the synthetic ones) that may_last keeps with the mask of all the lasting literals it holds, for evidence
    that has noted no missing extension yet, is located with a mask may_last keeps it with (a prefilter hit line:
    the others the dense pass drops, as before)."""
    finder = lasting_lines()
    lines = [line for lines in sources() for line in lines if line]
    rng = random.Random(3)
    lines += [line for _ in range(300) for line in synthetic(rng)]
    buf = bytearray(b"\n".join(lines) + b"\n")
    starts, masks, _ = finder.line_starts(buf, len(buf), True)
    located = dict(zip(starts, masks, strict=True))
    fresh = Evidence(None, None, None, None, None)
    kept = pos = 0
    for line in lines:
        mask = sum(1 << i for i, literal in enumerate(finder.kept) if literal in line)
        hit = any(needle in line for needle in finder.prefilter.needles)  # a line no prefilter needle is in: none
        if mask and hit and finder.may_last(line, mask, fresh):
            kept += 1
            assert pos in located and finder.may_last(line, located[pos], fresh), line[:200]
        pos += len(line) + 1
    assert kept > 1000, kept


@pytest.mark.parametrize("seed", range(6))
def test_a_storm_past_the_cap_read_for_its_fed_lines_only(seed, tmp_path, monkeypatch):
    """Past MAX_EVENTS the exact reader looks only for the lines Evidence still feeds (CappedReading): the verdict
    is the one of feeding every hit line, with facts, raylet and step lines inside the storm, a progress lifting
    the cap mid-window, wrapped step lines across chunks, a thread's traceback, and a log ending in the storm."""
    rng = random.Random(2000 + seed)
    monkeypatch.setattr(skim, "EXACT_WINDOW", rng.choice([1 << 9, 1 << 12, 256 << 10]))
    calls = []
    capped = skim.Skim._capped
    monkeypatch.setattr(skim.Skim, "_capped", lambda self, *a: calls.append(1) or capped(self, *a))
    inside = [b"+ VANILLA_MBRIDGE=False", b"(raylet) Shutting down the worker", TR + b"step:1 - actor/pg_loss:0.1",
              b"(WorkerDict pid=3) No module named 'vllm._moe_C'", TR + b"Total training steps: 40",
              b"(WorkerDict pid=1) Exception in thread Thread-2:", b"(WorkerDict pid=1) Saving checkpoint failed: boom",
              TR + b"Saving checkpoint to /c/global_step_3", b"torch.OutOfMemoryError: CUDA out of memory",
              TR + b"\rTraining Progress:  10%|#| 4/40 [00:01<00:09]"]
    lines = [b"+ TOTAL_TRAIN_STEPS=40", TR + b"step:1 - training/global_step:1 - actor/pg_loss:0.1"]
    step = 1
    for _storm in range(rng.randrange(2, 5)):
        for i in range(MAX_EVENTS + rng.randrange(20, 3000)):
            lines.append(b"(WorkerDict pid=%d) ERROR worker.py:%d RuntimeError: shard %d lost"
                         % (rng.randrange(99), i, rng.randrange(10**6)))
            if rng.random() < 0.01:
                lines.append(rng.choice(inside))
        if rng.random() < 0.7:  # training goes on: the cap is lifted (a wrapped step line at times)
            step += 1
            if rng.random() < 0.5:
                lines += [TR + b"step:%d - training/global_step:%d - actor/pg_" % (step, step), b"loss:0.25"]
            else:
                lines.append(TR + b"step:%d - training/global_step:%d - actor/pg_loss:0.2" % (step, step))
    path = tmp_path / "storm.log"
    path.write_bytes(b"\n".join(lines) + (b"\n" if rng.random() < 0.5 else b""))
    for chunk in (1 << 12, 1 << 16, 1 << 20):
        same_verdicts(path, chunk)
    assert calls, "the storm was never read past the cap"


def test_a_storm_whose_cap_falls_on_a_window_end_still_notes_the_unkept_lines(tmp_path, monkeypatch):
    """The cap reached by the last line of an exact window: every later storm line is unfed, and only the capped
    search can note that error lines went unkept (as feeding them does)."""
    head = [b"+ TOTAL_TRAIN_STEPS=40", TR + b"step:1 - actor/pg_loss:0.1"]
    storm = [b"(WorkerDict pid=1) RuntimeError: shard %06d lost" % i for i in range(MAX_EVENTS + 600)]
    # the exact reading starts at the log's start: its first window ends with the storm's 400th line
    monkeypatch.setattr(skim, "EXACT_WINDOW", sum(len(x) + 1 for x in head) + MAX_EVENTS * (len(storm[0]) + 1))
    dropped = []
    capped = skim.Skim._capped
    monkeypatch.setattr(skim.Skim, "_capped",
                        lambda self, *a: dropped.append(self.ev.events_dropped) or capped(self, *a))
    path = tmp_path / "storm.log"
    path.write_bytes(b"\n".join([*head, *storm]) + b"\n")
    same_verdicts(path, 1 << 20)
    assert dropped and dropped[0] == 0, dropped  # nothing noted when the capped reading began
    assert any("not kept" in note for note in judge_log(path, chunk_size=1 << 20).limitations)


def test_the_metrics_fast_path_reads_every_real_step_line_as_the_slow_path_does(monkeypatch):
    """metrics_match's fast path (no decoding or normalising) takes plain metrics lines of both of verl's layouts:
    the newer one naming `training/global_step`, the older one without it. On every step line of the real logs and
    on the old layout's look-alikes (a validation-only last line, an ANSI code or a `[repeated Nx ...]` after the
    step) the verdict is the one of the slow path (_line after normalise)."""
    from sessions.judge import evidence as evidence_module

    lines = [line for p in sorted(REAL_LOGS.glob("*.log")) for line in p.read_bytes().split(b"\n") if b"step:" in line]
    lines += [TR + b"step:41 - actor/pg_loss:0.1 - critic/score/mean:0.5",  # old layout, plain
              TR + b"step:42 - val/test_score/openai/gsm8k:0.31",  # old layout's validation-only last line
              TR + b"step:43 - actor/pg_loss:\x1b[1m0.1\x1b[0m - critic/score/mean:0.5",
              TR + b"step:44 - actor/pg_loss:0.1 - critic/score/mean:nan [repeated 2x across cluster]"]
    taken = [line for line in lines if evidence_module.metrics_match(line) is not None]
    assert any(b"training/global_step" not in line for line in taken), "the old layout takes the fast path"
    assert not any(line.startswith(TR + b"step:4") and b"step:41" not in line for line in taken)

    def judged() -> str:
        ev = Evidence(5, None, None, None, None)
        for line in lines:
            ev.feed_bytes(line)
        return json.dumps(decide(ev, level_rule=True).to_json(), sort_keys=True)

    fast = judged()
    monkeypatch.setattr(evidence_module, "metrics_match", lambda raw, step=None: None)
    assert judged() == fast
