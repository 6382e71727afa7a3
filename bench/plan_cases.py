"""Benchmark: `invoke plan` against labelled real Megatron-Bridge commits.

    /work/venv/bin/python bench/plan_cases.py --bridge /path/to/Megatron-Bridge-clone \
        [--cases ../shared/plan-cases.tsv] [--own bench/plan-cases-own.tsv] [--fresh bench/plan-cases-fresh.tsv] [--s5 bench/plan-cases-s5.tsv] [--s10 bench/plan-cases-s10.tsv] [--s11 ...] [--s12 ...] [--s13 ...] [--s14 ...] [--s15 ...] [--s16 ...] [--s17 ...] [--s18 ...] \
        [--split dev|heldout|fresh|s5|s10|s11|s12|s13|s14|s15|s16|s17|s18|all] \
        [--verl /path/to/verl] [--extra 10] [--verbose]

Two case files: the shared one (TSV: commit, kind, expected_levels, ...) and this project's own
(bench/plan-cases-own.tsv: commit, kind, expected_levels, split, note — labelled by the procedure by a helper who
never saw the planner's output; `split` is dev when the short sha's first hex digit is 0-7, heldout for 8-f; the
heldout half is never tuned on). Expected levels read like `L0,L4:moe (arguable: L2m)` or `none (arguable: L0)`.
For each commit, checks it out (detached) in the given clone, plans the commit against its parent with verl's
surface read from --verl, and prints the required levels, the optional ones, and the verdict: exact, under (a
required level missing) or over (a level neither required nor arguable). Optional (offered) levels never count as
selected. At the end: exact / under / over for shared, own-dev, own-heldout and own-fresh (bench/plan-cases-fresh.tsv: a
second blind labelling of 72 further commits, by a helper who saw neither the planner nor the first labels; never
tuned on), own-s5 (bench/plan-cases-s5.tsv: a third, 40 commits labelled blind in session 5; never tuned on) and
own-s10 (bench/plan-cases-s10.tsv: a fourth, 32 commits drawn at random from the Bridge's models/ and peft/ history
that no other file lists, labelled blind in session 10 by a helper who saw neither the planner nor its files) and
own-s11 (bench/plan-cases-s11.tsv: a fifth, 36 drawn the same way in session 11 and labelled twice, blind; the misses
of its odd-numbered rows (1st, 3rd, ...) were looked at, its even-numbered rows' never) and own-s12
(bench/plan-cases-s12.tsv: a sixth, 36 drawn the same way in session 12 from the commits no file listed, labelled
twice, blind, and committed before the planner first ran on them) and own-s13 (bench/plan-cases-s13.tsv: a seventh,
36 drawn the same way in session 14, labelled twice, blind, committed before the planner first ran on them; scored in
halves like s11: its odd rows' misses may be looked at, its even rows' never) and own-s14 (bench/plan-cases-s14.tsv:
an eighth, 36 drawn the same way in session 16 (seed 20261203), labelled twice, blind, committed before the planner
first ran on them, halved like s13) and own-s15 (bench/plan-cases-s15.tsv: a ninth, 36 drawn the same way in
session 21 (seed 20261204), labelled twice, blind, committed before the planner first ran on them, halved like s13)
and own-s16 (bench/plan-cases-s16.tsv: a tenth, 36 drawn the same way on 2026-12-07 (seed 20261207), labelled twice,
blind, committed before the planner first ran on them, halved like s13) and own-s17 (bench/plan-cases-s17.tsv: an
eleventh, 36 drawn the same way later on 2026-12-07 (seed 20261208) from the 152 models/ and peft/ commits no file
listed, labelled once, blind, committed before the planner first ran on them, halved like s13) and own-s18
(bench/plan-cases-s18.tsv: a twelfth, 36 drawn the same way on 2026-12-08 (seed 20261209) from the 123 models/ and
peft/ commits no file listed then, labelled once, blind, committed before the planner first ran on them, halved).
Labels are judgements: bench/plan-cases-second.tsv (`--second`) labels the same own, fresh, s5, s10, s11, s12, s13, s14,
s15 and s16 commits again, blind (session 8; s10 to s16 in sessions 10, 11, 12, 14, 16, 21 and on 2026-12-07), by helpers who saw neither the first labels nor the planner. Each
group then also scores against the second labels and against their consensus (required: what both require;
arguable: what either names besides), and prints how the two labellings agree when each is read against the other as a plan is. A commit the plan
refuses (exit 2, e.g. a checkout from before the package's rename) is listed apart, never scored. `--extra N` also plans the N most
recent first-parent commits no case file lists, for eyeballing. The clone must be clean; its starting HEAD (branch
or commit) is checked out again at the end, also after an error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

import git

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from env.settings import UsageError  # noqa: E402
from sessions.plan.planner import analyse, read_change, recommend  # noqa: E402

FEATURE_KEYS = {"custom-layer": "custom", "quantized": "quant"}
# this project's own labelled sets: option → (file, what it is). `own` has a split column (dev / heldout); every
# other set is its own split, named like its option, and was never tuned on when it was added.
OWN_SETS: dict[str, tuple[Path, str]] = {
    "own": (ROOT / "bench" / "plan-cases-own.tsv", "this project's cases TSV with a split column (dev / heldout)"),
    "fresh": (ROOT / "bench" / "plan-cases-fresh.tsv", "a second own labelling, split 'fresh' (never tuned on)"),
    "s5": (ROOT / "bench" / "plan-cases-s5.tsv", "a third own labelling, split 's5' (session 5, never tuned on)"),
    "s10": (ROOT / "bench" / "plan-cases-s10.tsv", "a fourth, split 's10' (session 10, blind, random draw)"),
    "s11": (ROOT / "bench" / "plan-cases-s11.tsv", "a fifth, split 's11' (session 11, blind, random draw)"),
    "s12": (ROOT / "bench" / "plan-cases-s12.tsv", "a sixth, split 's12' (session 12, blind, random draw)"),
    "s13": (ROOT / "bench" / "plan-cases-s13.tsv", "a seventh, split 's13' (session 14, blind, random draw, halved)"),
    "s14": (ROOT / "bench" / "plan-cases-s14.tsv", "an eighth, split 's14' (session 16, blind, random draw, halved)"),
    "s15": (ROOT / "bench" / "plan-cases-s15.tsv", "a ninth, split 's15' (session 21, blind, random draw, halved)"),
    "s16": (ROOT / "bench" / "plan-cases-s16.tsv", "a tenth, split 's16' (2026-12-07, blind, random draw, halved)"),
    "s17": (ROOT / "bench" / "plan-cases-s17.tsv", "an eleventh, split 's17' (2026-12-07 late, blind, random draw, "
            "one labelling, halved)"),
    "s18": (ROOT / "bench" / "plan-cases-s18.tsv", "a twelfth, split 's18' (2026-12-08, blind, random draw, "
            "one labelling, halved)"),
}
SPLIT_SETS = [name for name in OWN_SETS if name != "own"]  # the sets that are a split of their own
# sets whose misses were looked at in their odd-numbered rows only: each half is also scored apart
HALVED = {"s11", "s13", "s14", "s15", "s16", "s17", "s18"}
HALVES = ("odd rows (looked at)", "even rows (never opened)")  # row 1, 3, ... / row 2, 4, ...


def parse_expected(text: str) -> tuple[set[str], set[str]]:
    """`L0,L4:moe (arguable: L2m)` → ({L0, L4:moe}, {L2m})."""
    m = re.match(r"\s*(.*?)\s*(?:\(arguable:\s*(.*?)\))?\s*$", text)
    required, arguable = m.group(1), m.group(2) or ""
    split = lambda s: {x.strip() for x in s.split(",") if x.strip() and x.strip() != "none"}  # noqa: E731
    return split(required), split(arguable)


def selection_verdict(got: set[str], required: set[str], arguable: set[str]) -> str:
    """exact (every required level, nothing outside required + arguable), UNDER (a required one missing) or over."""
    return "UNDER" if required - got else "over" if got - required - arguable else "exact"


def consensus(first: tuple[set[str], set[str]], second: tuple[set[str], set[str]]) -> tuple[set[str], set[str]]:
    """Two labellings as one: required what both require, arguable what either names besides. A plan under it
    missed a level two blind labellers both required; over it, it chose a level neither named."""
    required = first[0] & second[0]
    return required, (first[0] | first[1] | second[0] | second[1]) - required


def read_second(path: Path) -> dict[str, tuple[set[str], set[str]]]:
    """commit → (required, arguable) of the second, independent labelling (bench/plan-cases-second.tsv)."""
    lines = path.read_text().splitlines()
    header = lines[0].split("\t")
    column = header.index("expected_levels")
    return {cells[0][:9]: parse_expected(cells[column]) for cells in (line.split("\t") for line in lines[1:]
                                                                      if line.strip())}


def agreement(first: dict[str, tuple[set[str], set[str]]], second: dict[str, tuple[set[str], set[str]]]) -> str:
    """How two blind labellings of the same commits agree, scored as a plan is: each one's required levels read
    against the other's labels, and both ways exact."""
    common = [c for c in first if c in second]
    if not common:
        return "no commit labelled twice"
    one = [selection_verdict(second[c][0], *first[c]) for c in common]
    other = [selection_verdict(first[c][0], *second[c]) for c in common]
    both = sum(a == b == "exact" for a, b in zip(one, other, strict=True))
    n = len(common)
    return (f"second read against first {one.count('exact')}/{n} exact, {one.count('UNDER')} under; first against "
            f"second {other.count('exact')}/{n} exact, {other.count('UNDER')} under; both ways exact {both}/{n} "
            f"({100 * both / n:.0f} %)")


def level_key(entry) -> str:
    key = f"L{entry.level}" + {"dense": "d", "moe": "m"}.get(entry.variant or "", "")
    return key + (f":{FEATURE_KEYS.get(entry.feature, entry.feature)}" if entry.feature else "")


def plan_commit(repo: git.Repo, commit: str, verl: Path):
    repo.git.checkout("-q", "--detach", commit)
    parent = repo.commit(commit).parents[0].hexsha
    change = read_change(repo.working_tree_dir, parent)
    return recommend(change, analyse(change, verl))


def describe(plan, verbose: bool) -> list[str]:
    lines = []
    for e in plan.entries + plan.optional:
        why = "; ".join(f"{r.rule}: " + ", ".join(u["unit"] for u in r.units[:2]) for r in e.reasons)
        lines.append(f"      {'optional ' if e.optional else ''}{level_key(e)} [{why}] model={e.model or 'dummy'}")
        if verbose:
            for r in e.reasons:
                for u in r.units[:2]:
                    lines.append(f"          {r.rule} {u['unit']} {u['tier']} matched={u.get('matched')} "
                                 f"path={' → '.join(u['path'][-3:])}")
    for n in plan.notes:
        if n.startswith("not on verl's path"):
            lines.append(f"      note: {n[:200]}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bridge", required=True, type=Path, help="a Megatron-Bridge clone (checked out per commit)")
    shared = next((d / "shared" / "plan-cases.tsv" for d in (ROOT.parent, ROOT.parent.parent)
                   if (d / "shared" / "plan-cases.tsv").is_file()), ROOT.parent / "shared" / "plan-cases.tsv")
    ap.add_argument("--cases", type=Path, default=shared,
                    help="the shared cases TSV: commit, kind, expected_levels, ... ('-' for none)")
    for name, (path, what) in OWN_SETS.items():
        ap.add_argument(f"--{name}", type=Path, default=path, help=f"{what} ('-' for none)")
    ap.add_argument("--second", type=Path, default=ROOT / "bench" / "plan-cases-second.tsv",
                    help="a second blind labelling of the own commits (commit, set, kind, expected_levels, note; "
                         "'-' for none): scores against it and against both labellings' consensus")
    ap.add_argument("--split", choices=("dev", "heldout", *SPLIT_SETS, "all"), default="all",
                    help="which part of the own cases to run (develop on dev only)")
    ap.add_argument("--verl", type=Path, default=Path("/work/upstream/verl-head"),
                    help="a current verl checkout (verl-project/verl: an older one lacks the Bridge calls verl "
                         "makes now, and every level they justify goes missing)")
    ap.add_argument("--extra", type=int, default=0, help="also plan N recent commits not in the cases file")
    ap.add_argument("--only", help="comma-separated commits of the cases file to run")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    try:
        repo = git.Repo(args.bridge)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        print(f"error: {args.bridge} is not a git checkout", file=sys.stderr)
        return 2
    if repo.is_dirty(untracked_files=False):
        print(f"error: {args.bridge} has uncommitted changes; the bench checks out commits and needs a clean clone",
              file=sys.stderr)
        return 2
    second: dict[str, tuple[set[str], set[str]]] = {}
    if str(args.second) != "-":
        if not args.second.is_file():
            print(f"error: second labelling {args.second} does not exist", file=sys.stderr)
            return 2
        second = read_second(args.second)
    rows = []
    every_case: set[str] = set()  # every labelled commit, whatever its split: --extra never plans a held-out one
    for path, own in ((args.cases, False), *((getattr(args, name), True) for name in OWN_SETS)):
        if str(path) == "-":
            continue
        if not path.is_file():
            print(f"error: cases file {path} does not exist", file=sys.stderr)
            return 2
        lines = path.read_text().splitlines()
        header = lines[0].split("\t")
        for position, line in enumerate((x for x in lines[1:] if x.strip()), start=1):
            cells = line.split("\t")
            every_case.add(cells[0][:9])
            group = "shared"
            if own:
                split = cells[header.index("split")] if "split" in header else (
                    "dev" if cells[0][0] in "01234567" else "heldout")
                if args.split != "all" and split != args.split:
                    continue
                group = f"own-{split}"
            half = f"{group} {HALVES[1 - position % 2]}" if own and split in HALVED else None
            rows.append((group, cells, half))
    if args.only:
        rows = [(g, r, h) for g, r, h in rows if r[0] in args.only.split(",")]
    start = repo.active_branch.name if not repo.head.is_detached else repo.head.commit.hexsha
    score: dict[str, list[int]] = {}  # group → [cases, exact, under, over]
    firsts: dict[str, dict[str, tuple[set[str], set[str]]]] = {}  # group → commit → the first labels
    refused: dict[str, list[str]] = {}  # group → commits the plan refused (a usage error)
    misses = []
    # two runs checking out commits in one clone plan each other's trees: the second is refused while a lock holds
    lock = Path(repo.git_dir) / "plan_cases.lock"
    try:
        lock_fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        print(f"error: {args.bridge} is in use by another plan_cases run (pid {lock.read_text().strip() or '?'}); "
              f"give each run its own clone (or remove {lock} if that run is gone)", file=sys.stderr)
        return 2
    os.write(lock_fd, f"{os.getpid()}\n".encode())
    os.close(lock_fd)
    try:
        for group, row, half in rows:
            commit, kind, expected = row[0], row[1], row[2]
            required, arguable = parse_expected(expected)
            t0 = time.time()
            try:
                plan = plan_commit(repo, commit, args.verl)
            except UsageError as e:  # the plan refuses the checkout (exit 2): counted apart, never as exact
                print(f"[{group}] {commit} refused: {e}")
                refused.setdefault(group, []).append(commit)
                continue
            got = {level_key(e) for e in plan.entries}
            offered = {level_key(e) for e in plan.optional}
            missing, extra = required - got, got - required - arguable
            verdict = selection_verdict(got, required, arguable)
            again = second.get(commit[:9])
            labellings = [(group, (required, arguable))] + ([(half, (required, arguable))] if half else [])
            if again is not None:
                firsts.setdefault(group, {})[commit[:9]] = (required, arguable)
                labellings += [(group + " vs second labels", again),
                               (group + " vs consensus", consensus((required, arguable), again))]
            for name, (req, arg) in labellings:
                judged = selection_verdict(got, req, arg)
                tally = score.setdefault(name, [0, 0, 0, 0])
                tally[0] += 1
                tally[1] += judged == "exact"
                tally[2] += judged == "UNDER"
                tally[3] += judged == "over"
            print(f"[{group}] {commit} {verdict:5} expected {expected} | got {','.join(sorted(got)) or 'none'}"
                  + (f" (optional: {','.join(sorted(offered))})" if offered else "")
                  + (f" | missing {','.join(sorted(missing))}" if missing else "")
                  + (f" | extra {','.join(sorted(extra))}" if extra else "") + f" | {time.time() - t0:.0f}s")
            print(f"    {kind}")
            if verdict != "exact" or args.verbose:
                misses.append(commit)
                print("\n".join(describe(plan, args.verbose)))
        print()
        for group in ("shared", "own-dev", "own-heldout", *(f"own-{name}" for name in SPLIT_SETS)):
            for name in (group, *(f"{group} {h}" for h in HALVES), group + " vs second labels",
                         group + " vs consensus"):
                if name in score:
                    n, exact, under, over = score[name]
                    print(f"score {name}: {exact}/{n} exact ({100 * exact / n:.0f} %), {under} under-selected, "
                          f"{over} over-selected")
            if group in refused:
                print(f"refused {group}: {len(refused[group])} commit(s) the plan refuses (not in the scores): "
                      + ", ".join(refused[group]))
            if group in firsts:
                print(f"labellers {group}: {agreement(firsts[group], second)}")
        if misses:
            print(f"misses: {', '.join(misses)}")
        if args.extra:
            listed = every_case
            recent = [c for c in repo.iter_commits(start, first_parent=True, max_count=args.extra + len(rows) + 5)
                      if c.hexsha[:9] not in listed and len(c.parents) == 1][:args.extra]
            print(f"\n{len(recent)} further recent commits (not labelled; for eyeballing):")
            for c in recent:
                try:
                    plan = plan_commit(repo, c.hexsha, args.verl)
                except UsageError as e:
                    print(f"{c.hexsha[:9]}: error: {e}")
                    continue
                got = ",".join(level_key(e) for e in plan.entries) or "none"
                opt = ",".join(level_key(e) for e in plan.optional)
                files = ", ".join(f.path for f in plan.change.files[:4]) + (" ..." if len(plan.change.files) > 4
                                                                          else "")
                print(f"{c.hexsha[:9]} {c.summary[:90]}\n    got {got}" + (f" (optional: {opt})" if opt else "")
                      + f"\n    files: {files}")
                print("\n".join(describe(plan, args.verbose)))
    finally:
        repo.git.checkout("-q", start)
        lock.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
