"""Benchmark: `invoke plan` against labelled real Megatron-Bridge commits.

    /work/venv/bin/python bench/plan_cases.py --bridge /path/to/Megatron-Bridge-clone --cases plan-cases.tsv \
        [--verl /path/to/verl] [--extra 10] [--verbose]

For each commit of the cases file (TSV: commit, kind, expected_levels, ...; expected like
`L0,L4:moe (arguable: L2m)` or `none (arguable: L0)`), checks the commit out (detached) in the given clone, plans
the commit against its parent with verl's surface read from --verl, and prints the required levels, the optional
ones, and the verdict: exact, under (a required level missing) or over (a level neither required nor arguable).
Optional (offered) levels never count as selected. `--extra N` also plans the N most recent first-parent commits of
the clone's starting point that the cases file does not list, for eyeballing. The clone must be clean; its
starting HEAD (branch or commit) is checked out again at the end, also after an error or Ctrl-C.
"""

from __future__ import annotations

import argparse
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


def parse_expected(text: str) -> tuple[set[str], set[str]]:
    """`L0,L4:moe (arguable: L2m)` → ({L0, L4:moe}, {L2m})."""
    m = re.match(r"\s*(.*?)\s*(?:\(arguable:\s*(.*?)\))?\s*$", text)
    required, arguable = m.group(1), m.group(2) or ""
    split = lambda s: {x.strip() for x in s.split(",") if x.strip() and x.strip() != "none"}  # noqa: E731
    return split(required), split(arguable)


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
    ap.add_argument("--cases", required=True, type=Path, help="TSV: commit, kind, expected_levels, ...")
    ap.add_argument("--verl", type=Path, default=Path("/work/upstream/verl-head"), help="verl checkout")
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
    if not args.cases.is_file():
        print(f"error: cases file {args.cases} does not exist", file=sys.stderr)
        return 2
    rows = [line.split("\t") for line in args.cases.read_text().splitlines()[1:] if line.strip()]
    if args.only:
        rows = [r for r in rows if r[0] in args.only.split(",")]
    start = repo.active_branch.name if not repo.head.is_detached else repo.head.commit.hexsha
    exact = under = over = 0
    misses = []
    try:
        for row in rows:
            commit, kind, expected = row[0], row[1], row[2]
            required, arguable = parse_expected(expected)
            t0 = time.time()
            try:
                plan = plan_commit(repo, commit, args.verl)
            except UsageError as e:
                print(f"{commit}: error: {e}")
                continue
            got = {level_key(e) for e in plan.entries}
            offered = {level_key(e) for e in plan.optional}
            missing, extra = required - got, got - required - arguable
            verdict = "exact" if not (missing or extra) else "UNDER" if missing else "over"
            exact += verdict == "exact"
            under += bool(missing)
            over += bool(extra) and not missing
            print(f"{commit} {verdict:5} expected {expected} | got {','.join(sorted(got)) or 'none'}"
                  + (f" (optional: {','.join(sorted(offered))})" if offered else "")
                  + (f" | missing {','.join(sorted(missing))}" if missing else "")
                  + (f" | extra {','.join(sorted(extra))}" if extra else "") + f" | {time.time() - t0:.0f}s")
            print(f"    {kind}")
            if verdict != "exact" or args.verbose:
                misses.append(commit)
                print("\n".join(describe(plan, args.verbose)))
        print(f"\nscore: {exact}/{len(rows)} exact, {under} under-selected, {over} over-selected"
              + (f"; misses: {', '.join(c for c in misses)}" if misses else ""))
        if args.extra:
            listed = {r[0][:9] for r in rows}
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
