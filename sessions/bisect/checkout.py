"""The git side of `invoke bisect`: a checkout driven through real `git bisect`, its submodules kept in step, and
the user's starting state (branch, commit, submodule commits, uncommitted changes) put back whatever happens.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import git

from env.repos import RepoError, open_repo

# git's own words are parsed below: keep them untranslated
GIT_ENV = {"LC_ALL": "C", "LANGUAGE": "C", "GIT_TERMINAL_PROMPT": "0"}
FOUND_RE = re.compile(r"^([0-9a-f]{40}) is the first bad commit", re.M)
ONLY_SKIPPED = "There are only 'skip'ped commits left to test."


class GitStepError(Exception):
    """A git command the bisection needs failed (message: the command and git's last words)."""


@dataclass
class Submodule:
    path: str
    head: str  # full SHA checked out in the submodule
    branch: str | None  # None: detached


@dataclass
class StartState:
    """What the user had before the bisection: restored on success, failure and Ctrl-C."""
    branch: str | None
    head: str
    submodules: list[Submodule] = field(default_factory=list)
    stashes: dict[str, str] = field(default_factory=dict)  # repo-relative dir ("" = top) -> stash commit SHA


@dataclass
class BisectState:
    """Where `git bisect` stands after a command: a commit to test, the first bad commit, or only skips left."""
    next_commit: str | None = None
    first_bad: str | None = None
    candidates: list[str] = field(default_factory=list)  # only skipped commits left: the first bad is among these


@dataclass
class CommitInfo:
    sha: str
    subject: str
    author: str
    author_date: str  # ISO 8601
    files: list[str]  # `git show --name-status` lines of the commit (vs. its first parent)
    parent: str | None


class BisectCheckout:
    def __init__(self, path: Path | str, what: str):
        self.path = Path(path)
        self.what = what
        self.repo: git.Repo = open_repo(path, what)

    # -- plain git -------------------------------------------------------------------------------------------
    def _git(self, *args: str, cwd: Path | None = None, check: bool = True) -> tuple[int, str]:
        """(exit status, stdout + stderr) of `git args` in the checkout (or a submodule of it)."""
        runner = self.repo.git if cwd is None else git.Git(str(cwd))
        status, out, err = runner.execute(["git", *args], with_extended_output=True, with_exceptions=False,
                                          env=GIT_ENV, strip_newline_in_stdout=False)
        text = (out or "") + (("\n" if out and err else "") + err if err else "")
        if check and status != 0:
            last = next((ln for ln in reversed(text.strip().splitlines()) if ln.strip()), "no output")
            raise GitStepError(f"git {' '.join(args)} in {cwd or self.path} failed: {last.strip()}")
        return status, text

    def resolve(self, ref: str) -> str:
        """Full SHA of a ref (RepoError for an unknown one)."""
        status, out = self._git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False)
        if status != 0:
            raise RepoError(f"{self.what} {self.path}: unknown ref {ref!r}")
        return out.strip()

    def is_ancestor(self, older: str, newer: str) -> bool:
        return self._git("merge-base", "--is-ancestor", older, newer, check=False)[0] == 0

    def head(self) -> str:
        return self._git("rev-parse", "HEAD")[1].strip()

    def info(self, sha: str) -> CommitInfo:
        fmt = "%H%x00%s%x00%an <%ae>%x00%aI%x00%P"
        out = self._git("show", "-s", f"--format={fmt}", sha)[1].strip()
        full, subject, author, date, parents = out.split("\x00")
        parent = parents.split()[0] if parents.split() else None
        files_out = self._git("diff-tree", "--no-commit-id", "--name-status", "-r", "--root", sha)[1]
        files = [" ".join(line.split("\t")) for line in files_out.splitlines() if line.strip()]
        return CommitInfo(full, subject, author, date, files, parent)

    def in_progress(self) -> bool:
        return (Path(self.repo.git_dir) / "BISECT_START").exists()

    # -- the starting state ----------------------------------------------------------------------------------
    def submodules(self) -> list[tuple[str, str]]:
        """(status flag, path) of every submodule: '-' not initialized, '+' not at the recorded commit, ' ' at it."""
        out = self._git("submodule", "status")[1]
        subs = []
        for line in out.splitlines():
            m = re.match(r"^([ +\-U])([0-9a-f]{40}) (\S+)", line)
            if m:
                subs.append((m.group(1), m.group(3)))
        return subs

    def initialized_submodules(self) -> list[str]:
        return [p for flag, p in self.submodules() if flag != "-" and (self.path / p / ".git").exists()]

    def dirty_files(self) -> list[str]:
        """`git status --short` lines of the checkout and of its initialized submodules (their own edits)."""
        lines = [ln for ln in self._git("status", "--short", "--untracked-files=all", "--ignore-submodules=dirty")[1]
                 .splitlines() if ln.strip()]
        for sub in self.initialized_submodules():
            out = self._git("status", "--short", "--untracked-files=all", cwd=self.path / sub)[1]
            lines += [f"{ln[:3]}{sub}/{ln[3:]}" for ln in out.splitlines() if ln.strip()]
        return lines

    def capture(self) -> StartState:
        try:
            branch = self.repo.active_branch.name
        except TypeError:
            branch = None
        subs = []
        for path in self.initialized_submodules():
            sub = git.Repo(self.path / path)
            try:
                sub_branch = sub.active_branch.name
            except TypeError:
                sub_branch = None
            subs.append(Submodule(path, sub.head.commit.hexsha, sub_branch))
        return StartState(branch, self.head(), subs)

    def stash(self, state: StartState, message: str) -> None:
        """Stash uncommitted changes (untracked files too) of the checkout and of each dirty submodule."""
        places = [""] + [s.path for s in state.submodules]
        for rel in places:
            where = self.path / rel if rel else None
            status = self._git("status", "--porcelain", "--untracked-files=all", "--ignore-submodules=all",
                               cwd=where)[1]
            if not status.strip():
                continue
            self._git("stash", "push", "--include-untracked", "-m", message, cwd=where)
            state.stashes[rel] = self._git("rev-parse", "stash@{0}", cwd=where)[1].strip()

    # -- bisecting -------------------------------------------------------------------------------------------
    def _bisect(self, *args: str) -> BisectState:
        status, out = self._git("bisect", *args, check=False)
        found = FOUND_RE.search(out)
        if found:
            return BisectState(first_bad=found.group(1))
        if ONLY_SKIPPED in out:
            tail = out.split("could be any of:", 1)[-1]
            return BisectState(candidates=re.findall(r"^([0-9a-f]{40})\s*$", tail, re.M))
        if status != 0:
            last = next((ln for ln in reversed(out.strip().splitlines()) if ln.strip()), "no output")
            raise GitStepError(f"git bisect {' '.join(args)} failed: {last.strip()}")
        return BisectState(next_commit=self.head())

    def start(self, bad: str, good: str) -> BisectState:
        return self._bisect("start", bad, good)

    def mark(self, verdict: str, commit: str) -> BisectState:
        assert verdict in ("good", "bad", "skip")
        return self._bisect(verdict, commit)

    def checkout(self, commit: str) -> None:
        """Move HEAD to a commit during the bisection (git bisect reset still returns to the start)."""
        self._git("checkout", "-q", "--detach", commit)

    def log(self) -> str:
        status, out = self._git("bisect", "log", check=False)
        return out if status == 0 else ""

    def remaining(self) -> list[str]:
        """Commits the first bad one may still be (newest first): bad's ancestry not reachable from any good."""
        refs = self._git("for-each-ref", "--format=%(refname)", "refs/bisect/")[1].split()
        bad = [r for r in refs if r == "refs/bisect/bad"]
        goods = [r for r in refs if r.startswith("refs/bisect/good-")]
        if not bad:
            return []
        return self._git("rev-list", bad[0], "--not", *goods)[1].split()

    def sync_submodules(self) -> list[str]:
        """Check out, in each initialized submodule, the commit the current commit records ('a → b' per move)."""
        moves = []
        for flag, path in self.submodules():
            if flag != "+":
                continue
            before = self._git("rev-parse", "HEAD", cwd=self.path / path)[1].strip()
            self._git("submodule", "update", "--", path)
            after = self._git("rev-parse", "HEAD", cwd=self.path / path)[1].strip()
            moves.append(f"{path} {before[:8]} → {after[:8]}")
        return moves

    # -- putting it back -------------------------------------------------------------------------------------
    def restore(self, state: StartState) -> list[str]:
        """`git bisect reset`, then the starting branch/commit, submodule commits and stashes; returns problems."""
        problems = []
        if self.in_progress():
            status, out = self._git("bisect", "reset", check=False)
            if status != 0:
                problems.append(f"git bisect reset: {out.strip().splitlines()[-1] if out.strip() else status}")
        target = state.branch or state.head
        try:
            if self.head() != state.head or self._branch() != state.branch:
                self._git("checkout", "-q", target)
        except GitStepError as e:
            problems.append(str(e))
        for sub in state.submodules:
            where = self.path / sub.path
            try:
                current = self._git("rev-parse", "HEAD", cwd=where)[1].strip()
                if current != sub.head:
                    self._git("checkout", "-q", sub.branch or sub.head, cwd=where)
                if sub.branch and self._git("rev-parse", "HEAD", cwd=where)[1].strip() != sub.head:
                    self._git("checkout", "-q", sub.head, cwd=where)  # the branch moved meanwhile: the commit wins
            except GitStepError as e:
                problems.append(str(e))
        for rel, sha in state.stashes.items():
            where = self.path / rel if rel else None
            try:
                shas = self._git("stash", "list", "--format=%H", cwd=where)[1].split()
                if sha not in shas:
                    problems.append(f"stash {sha[:8]} in {rel or '.'} is gone: nothing to pop")
                    continue
                self._git("stash", "pop", "--index", f"stash@{{{shas.index(sha)}}}", cwd=where)
            except GitStepError as e:
                problems.append(f"{e} — your changes are kept in `git stash list` ({sha[:8]}) of {rel or '.'}")
        return problems

    def _branch(self) -> str | None:
        try:
            return self.repo.active_branch.name
        except TypeError:
            return None
