"""What happened to a targeted Bridge test path that is missing at this commit, read from the Bridge's git history.

The commit that deleted (or renamed) the path, and the test files that same commit added, changed or renamed to:
those carry the tests on (e.g. Megatron-Bridge's `tests/unit_tests/training/test_integration.py` was split into
`peft/test_utils.py`, `training/utils/test_config_utils.py` and `training/utils/test_train_utils.py` by 63095f5 on
PR #3813's branch, which landed on main squashed as 691a377). A deletion on a pull-request branch is traced to
where it landed: the commit of this branch whose subject names the same PR number.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

PR_REF = re.compile(r"^refs/(?:remotes/[^/]+/)?pulls?/(\d+)/")
FETCH_PR_REFS = "git fetch origin '+refs/pull/*/head:refs/pull/*/head'"


@dataclass
class Commit:
    sha: str
    subject: str
    date: str

    def describe(self) -> str:
        return f"{self.sha[:9]} ({self.date}) {self.subject!r}"


@dataclass
class Successor:
    """Where a missing test path went."""

    path: str
    deleted_by: Commit | None = None  # None: no commit of the fetched history ever had the path
    renamed_to: str | None = None
    tests: list[str] = field(default_factory=list)  # test files of that commit that exist now
    pull_request: int | None = None  # the deletion was on this PR's branch (not on HEAD's history)
    landed_as: Commit | None = None  # the commit of HEAD's history that carries that PR

    def describe(self) -> str:
        if self.deleted_by is None:
            return (f"{self.path}: no commit of this clone's history has it (never on the fetched branches; it may "
                    f"have lived only on a pull-request branch: {FETCH_PR_REFS}, then rerun)")
        how = f"renamed to {self.renamed_to}" if self.renamed_to else "deleted"
        text = f"{self.path}: {how} by {self.deleted_by.describe()}"
        if self.pull_request is not None:
            text += f" on PR #{self.pull_request}'s branch"
            text += (f", landed here as {self.landed_as.describe()}" if self.landed_as
                     else ", not on this branch's history")
        if self.tests:
            text += f"; that commit carries the tests on in: {', '.join(self.tests)}"
        else:
            text += "; that commit touched no test file that exists now"
        return text


def _git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    return proc.stdout if proc.returncode == 0 else ""


def _commit(repo: Path, sha: str) -> Commit:
    sha_, date, subject = (_git(repo, "show", "-s", "--format=%H%x09%as%x09%s", sha).strip().split("\t", 2)
                           + ["", ""])[:3]
    return Commit(sha_ or sha, subject, date)


def is_test_file(path: str) -> bool:
    name = Path(path).name
    return path.startswith("tests/") and name.startswith("test_") and name.endswith(".py")


def _deleting_commit(repo: Path, path: str) -> str | None:
    """Newest commit that removed `path`: first on HEAD's own history, then on any ref this clone has."""
    for scope in (["HEAD"], ["--all"]):
        out = _git(repo, "log", *scope, "--diff-filter=D", "--no-renames", "--format=%H", "-1", "--", path)
        if out.strip():
            return out.split()[0]
    return None


def _changes(repo: Path, sha: str) -> list[tuple[str, str, str | None]]:
    """(status letter, path, rename target) of every file the commit changed against its first parent."""
    out = _git(repo, "show", "-M", "--first-parent", "--name-status", "--format=", sha)
    changes = []
    for line in out.splitlines():
        parts = line.split("\t")
        if len(parts) >= 2 and parts[0]:
            status = parts[0][0]
            changes.append((status, parts[1], parts[2] if status in "RC" and len(parts) > 2 else None))
    return changes


def _pull_request_of(repo: Path, sha: str) -> int | None:
    for ref in _git(repo, "for-each-ref", "--contains", sha, "--format=%(refname)").splitlines():
        m = PR_REF.match(ref)
        if m:
            return int(m.group(1))
    return None


def _landed_as(repo: Path, number: int) -> Commit | None:
    """The commit of HEAD's history that merged PR #number: a squash `... (#N)` or `Merge pull request #N ...`."""
    out = _git(repo, "log", "HEAD", "-E", f"--grep=(\\(#{number}\\)|[Mm]erge pull request #{number}\\b)",
               "--format=%H", "-1")
    return _commit(repo, out.split()[0]) if out.strip() else None


def successor(repo: Path | str, path: str) -> Successor:
    """Where a test path that does not exist at HEAD went, from the history this clone has."""
    repo = Path(repo)
    file_path = path.split("::")[0]
    sha = _deleting_commit(repo, file_path)
    if sha is None:
        return Successor(path)
    found = Successor(path, deleted_by=_commit(repo, sha))
    changes = _changes(repo, sha)
    renamed = [new for status, old, new in changes if status == "R" and old == file_path and new]
    if renamed:
        found.renamed_to = renamed[0]
    tests = renamed + [p for status, p, _ in changes if status in "AM" and p != file_path]
    tests += [new for status, _, new in changes if status in "RC" and new and new not in renamed]
    found.tests = [t for t in dict.fromkeys(tests) if is_test_file(t) and (repo / t).is_file()]
    on_head = subprocess.run(["git", "-C", str(repo), "merge-base", "--is-ancestor", sha, "HEAD"],
                             capture_output=True).returncode == 0
    if not on_head:
        found.pull_request = _pull_request_of(repo, sha)
        if found.pull_request is not None:
            found.landed_as = _landed_as(repo, found.pull_request)
    return found
