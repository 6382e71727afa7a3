"""The Bridge change `invoke plan` reads: committed since the merge-base with the base (default: the upstream main
branch), plus uncommitted (staged or not) and untracked files, with gitpython; per file the changed line numbers
of both sides (hunk headers and context never count).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import git

from env.repos import RepoError, open_repo
from env.settings import UsageError
from sessions.plan import rules as plan_rules

MAX_UNTRACKED_BYTES = 2_000_000  # larger untracked files count by path only
BASE_CANDIDATES = ("upstream/main", "origin/main")
HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass
class ChangedFile:
    path: str  # repo-relative POSIX path (the new path of a rename)
    status: str  # A | M | D | R | T | ?? (untracked)
    origins: list[str] = field(default_factory=list)  # committed | uncommitted | untracked
    added: list[int] = field(default_factory=list)  # new-side line numbers of added lines
    removed: list[int] = field(default_factory=list)  # old-side line numbers of removed lines
    old_path: str | None = None  # where it was at the merge-base (None: new file)
    old_text: str | None = None  # its text at the merge-base (Python under src/ only)


@dataclass
class Change:
    repo: str
    head: str
    base: str
    merge_base: str
    files: list[ChangedFile]

    def counts(self) -> dict[str, int]:
        out = {"committed": 0, "uncommitted": 0, "untracked": 0}
        for f in self.files:
            for o in f.origins:
                out[o] += 1
        return out


def default_base(repo: git.Repo) -> str:
    """upstream/main, then origin/main, then what local main tracks, then local main."""
    refs = {r.name for r in repo.refs}
    for name in BASE_CANDIDATES:
        if name in refs:
            return name
    if "main" in repo.heads:
        tracking = repo.heads["main"].tracking_branch()
        if tracking is not None and tracking.name in refs:
            return tracking.name
        return "main"
    raise UsageError(f"{repo.working_tree_dir}: no upstream/main, origin/main or main branch to compare with; "
                     f"pass --base REF")


def _unquote(path: str) -> str:
    if path.startswith('"') and path.endswith('"'):
        return path[1:-1].encode("latin-1", "backslashreplace").decode("unicode_escape").encode("latin-1").decode()
    return path


def _name_status(repo: git.Repo, *args: str) -> dict[str, str]:
    out = repo.git.diff("--name-status", "-z", "-M", "--ignore-submodules=dirty", *args)
    tokens = [t for t in out.split("\0")]
    result, i = {}, 0
    while i < len(tokens) and tokens[i]:
        status = tokens[i]
        if status[0] in "RC":
            result[tokens[i + 2]] = status[0]
            i += 3
        else:
            result[tokens[i + 1]] = status[0]
            i += 2
    return result


def _diff_lines(repo: git.Repo, merge_base: str) -> dict[str, tuple[str | None, list[int], list[int]]]:
    """Per file, merge-base → working tree: (old path, added line numbers, removed line numbers). Only the
    changed lines: hunk headers and context never count."""
    text = repo.git.diff("-U0", "--no-color", "--no-ext-diff", "-M", "--ignore-submodules=dirty", merge_base)
    out: dict[str, tuple[str | None, list[int], list[int]]] = {}
    old = current = None
    new_line = old_line = 0
    for raw in text.splitlines():
        if raw.startswith("diff --git "):
            old = current = None
        elif raw.startswith("--- ") and current is None:
            old = None if raw[4:] == "/dev/null" else _unquote(raw[4:])[2:]
        elif raw.startswith("+++ ") and current is None:
            current = old if raw[4:] == "/dev/null" else _unquote(raw[4:])[2:]
            if current is not None:
                out.setdefault(current, (old, [], []))
        elif current is None:
            continue
        elif m := HUNK.match(raw):
            old_line, new_line = int(m.group(1)), int(m.group(3))
        elif raw.startswith("+"):
            out[current][1].append(new_line)
            new_line += 1
        elif raw.startswith("-"):
            out[current][2].append(old_line)
            old_line += 1
    return out


def _read_text(path: Path) -> str | None:
    try:
        if path.stat().st_size > MAX_UNTRACKED_BYTES:
            return None
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None  # binary or unreadable: it still counts by its path


def _is_bridge_python(path: str) -> bool:
    return path.startswith(plan_rules.SRC) and path.endswith(".py")


def read_change(bridge_repo: Path | str, base: str | None = None) -> Change:
    """The Bridge change: committed since merge-base(base, HEAD), plus uncommitted and untracked files."""
    try:
        repo = open_repo(bridge_repo, "BRIDGE_REPO")
    except RepoError as e:
        raise UsageError(str(e)) from None
    package = Path(repo.working_tree_dir or ".") / "src" / "megatron"
    if not package.is_dir():
        raise UsageError(f"BRIDGE_REPO {repo.working_tree_dir} is not a Megatron-Bridge checkout (no "
                         "src/megatron package)")
    if not (package / "bridge").is_dir() and (package / "hub").is_dir():
        # before 2025-07 the package was megatron.hub: verl's `megatron.bridge` imports cannot reach it, so the
        # plan would follow no verl call into it and say "no level" for any change (a PEFT port included)
        raise UsageError(f"BRIDGE_REPO {repo.working_tree_dir} names its package megatron.hub (before its rename "
                         "to megatron.bridge): verl imports megatron.bridge, so no verl level can run against this "
                         "checkout and the plan cannot follow verl's calls into it")
    base = base or default_base(repo)
    try:
        repo.commit(base)
    except (git.BadName, ValueError, git.GitCommandError):
        raise UsageError(f"--base {base!r} is not a commit or branch of {repo.working_tree_dir}") from None
    bases = repo.merge_base(base, "HEAD")
    if not bases:
        raise UsageError(f"{base} and HEAD of {repo.working_tree_dir} share no history (no merge-base)")
    merge_base = bases[0].hexsha
    committed = _name_status(repo, merge_base, "HEAD")
    uncommitted = _name_status(repo, "HEAD")
    lines = _diff_lines(repo, merge_base)
    files: dict[str, ChangedFile] = {}
    for origin, table in (("committed", committed), ("uncommitted", uncommitted)):
        for path, status in table.items():
            f = files.setdefault(path, ChangedFile(path, status))
            f.status = status if origin == "uncommitted" else f.status
            f.origins.append(origin)
    root = Path(repo.working_tree_dir or ".")
    for path, f in files.items():
        f.old_path, f.added, f.removed = lines.get(path, (path if f.status != "A" else None, [], []))
        if f.old_path and f.removed and _is_bridge_python(f.old_path):
            try:
                f.old_text = repo.git.show(f"{merge_base}:{f.old_path}")
            except git.GitCommandError:
                f.old_text = None
    for path in repo.untracked_files:
        text = _read_text(root / path)
        files[path] = ChangedFile(path, "??", ["untracked"], list(range(1, len(text.splitlines()) + 1))
                                  if text else [])
    return Change(repo=str(root.resolve()), head=repo.head.commit.hexsha[:7], base=base,
                  merge_base=merge_base[:7], files=sorted(files.values(), key=lambda f: f.path))
