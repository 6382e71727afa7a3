"""Benchmark and check of `invoke bisect`'s git side on a real checkout (e.g. a Megatron-Bridge clone with its
Megatron-LM submodule initialized): the real Bisection loop, with the level replaced by a probe of the checked-out
working tree (Fail/provider when FILE contains STRING, else Pass), so it runs anywhere without GPUs.

    python bench/bisect_git.py CHECKOUT --verl VERL_CHECKOUT --good REF [--bad REF] --file PATH --string TEXT

Prints: the range, the commit git bisect names against the truth (the oldest commit of good..bad whose FILE holds
STRING, read with `git show`), every step with the time its checkout + submodule update took and whether the
submodule matched the commit's gitlink when the probe ran, and whether branch, commit, submodules and status were
restored. The checkout must be clean; it is left as it was.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from env.repos import bridge_state  # noqa: E402
from sessions.bisect import driver as bisect_mod  # noqa: E402
from sessions.bisect.checkout import BisectCheckout  # noqa: E402
from sessions.bisect.driver import Bisection, LevelRunner, Options, parse_level_line, parse_rules  # noqa: E402


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def truth(repo: Path, good: str, bad: str, file: str, text: str) -> str | None:
    for sha in git(repo, "rev-list", "--reverse", "--first-parent", f"{good}..{bad}").split():
        shown = subprocess.run(["git", "-C", str(repo), "show", f"{sha}:{file}"], capture_output=True, text=True)
        if shown.returncode == 0 and text in shown.stdout:
            return sha
    return None


class TreeProbe(LevelRunner):
    """The 'level': reads FILE in the working tree; writes a run directory shaped like a level's."""

    def __init__(self, line, file: str, text: str, timings: list):
        super().__init__(line, echo=lambda _line: None)
        self.file, self.text, self.timings = file, text, timings
        self.sync_started = None

    def find_judged(self):
        return None  # every step probes

    def run(self):
        repo = Path(self.line.settings.bridge_repo)
        state = bridge_state(repo)
        sub_ok = all(git(repo, "ls-tree", "HEAD", p).split()[2] == s.head_full for p, s in state.submodules.items())
        path = repo / self.file
        bad = path.is_file() and self.text in path.read_text(errors="replace")
        run_dir = Path(tempfile.mkdtemp(prefix="probe-", dir=self.log_dir))
        (run_dir / "run.json").write_text(json.dumps({"level": 0, "finished": time.time(),
                                                      "bridge": state.to_json()}))
        (run_dir / "summary.json").write_text(json.dumps({
            "result": "Fail" if bad else "Pass", "category": "provider" if bad else "success", "deliverables": [],
            "sentence": f"{self.file} {'holds' if bad else 'lacks'} the string", "exit_code": 1 if bad else 0}))
        self.timings.append({"commit": state.head_full, "submodule_matches_gitlink": sub_ok, "dirty": state.dirty})
        return (1 if bad else 0), run_dir, [], False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkout", type=Path)
    ap.add_argument("--verl", type=Path, required=True)
    ap.add_argument("--good", required=True)
    ap.add_argument("--bad", default="HEAD")
    ap.add_argument("--file", required=True)
    ap.add_argument("--string", required=True)
    args = ap.parse_args()
    repo = args.checkout.resolve()
    co = BisectCheckout(repo, "checkout")
    good, bad = co.resolve(args.good), co.resolve(args.bad)
    before = (co.capture(), git(repo, "status", "--porcelain"))
    expected = truth(repo, good, bad, args.file, args.string)
    n = len(git(repo, "rev-list", f"{good}..{bad}").split())
    bumps = git(repo, "log", "--format=%h", f"{good}..{bad}", "--", "3rdparty/Megatron-LM").split()
    print(f"range {good[:12]}..{bad[:12]}: {n} commits, {len(bumps)} of them move 3rdparty/Megatron-LM")
    print(f"truth (oldest commit whose {args.file} holds the string): {expected[:12] if expected else None}")

    with tempfile.TemporaryDirectory() as log_dir:
        line = parse_level_line(["level0", "--bridge-repo", str(repo), "--verl-repo", str(args.verl.resolve()),
                                 "--log-dir", log_dir, "--skip-bridge-checks"], "")
        probes: list = []
        b = Bisection(Options(args.good, args.bad, "bridge", None, parse_rules([]), set(), False), line,
                      runner=TreeProbe(line, args.file, args.string, probes))
        bisect_mod._say = lambda _msg: None
        t0 = time.monotonic()
        try:
            b.run()
        finally:
            t_restore = time.monotonic()
            b.finish()
            restore_s = time.monotonic() - t_restore
        total = time.monotonic() - t0
    found = b.state.first_bad if b.state else None
    print(f"git bisect says: {found[:12] if found else None} ({b.outcome}) — "
          f"{'MATCHES' if found == expected else 'DIFFERS FROM'} the truth")
    print(f"{'#':>2} {'commit':12} {'probe':5} {'mark':4} {'submodule update + probe s':>26} submodule moves")
    for s, p in zip(b.steps, probes, strict=False):
        assert p["submodule_matches_gitlink"], p
        print(f"{s.n:>2} {s.commit[:12]} {s.result:5} {s.mark:4} {s.duration_s:>26.2f} {'; '.join(s.submodules)}")
    print(f"steps: {len(b.steps)} for {n} commits; submodule matched the gitlink at every probe: "
          f"{all(p['submodule_matches_gitlink'] for p in probes)}; tree clean at every probe: "
          f"{all(not p['dirty'] for p in probes)}")
    after = (co.capture(), git(repo, "status", "--porcelain"))
    print(f"total {total:.1f}s, restore {restore_s:.2f}s; restored exactly (branch, commit, submodules, status): "
          f"{after == before}; problems: {b.restore_problems or 'none'}")
    return 0 if found == expected and after == before else 1


if __name__ == "__main__":
    sys.exit(main())
