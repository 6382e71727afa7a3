"""The two checkouts under test: their commit, dirty files and a fingerprint of their exact state (gitpython)."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

import git

from env.presets import WRAPPER

MEGATRON_LM = "3rdparty/Megatron-LM"


class RepoError(Exception):
    """The path is not a usable checkout (missing, not a git repo, no commit)."""


@dataclass
class RepoState:
    path: str
    head: str  # short SHA
    head_full: str
    branch: str | None
    dirty: list[str] = field(default_factory=list)  # `git status --short` lines
    submodules: dict[str, RepoState] = field(default_factory=dict)
    fingerprint: str = ""  # HEAD + content of every dirty/untracked file (+ submodules)

    @property
    def is_dirty(self) -> bool:
        return bool(self.dirty) or any(s.is_dirty for s in self.submodules.values())

    def describe(self) -> str:
        """`abc1234 plus 2 dirty files: M src/x.py, ?? new.py` — the report's Evidence line."""
        parts = [self.head + (f" ({self.branch})" if self.branch else "")]
        parts.append(f"plus {len(self.dirty)} dirty file(s): " + ", ".join(self.dirty) if self.dirty else "clean")
        for name, sub in self.submodules.items():
            parts.append(f"[{name}: {sub.head}, " + (f"{len(sub.dirty)} dirty: " + ", ".join(sub.dirty) if sub.dirty else "clean") + "]")
        return " ".join(parts)

    def to_json(self) -> dict:
        data = asdict(self)
        data["submodules"] = {k: v.to_json() for k, v in self.submodules.items()}
        return data


def open_repo(path: Path | str, what: str) -> git.Repo:
    path = Path(path)
    if not path.exists():
        raise RepoError(f"{what} {path} does not exist")
    try:
        repo = git.Repo(path)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        try:
            top = git.Repo(path, search_parent_directories=True).working_tree_dir
        except (git.InvalidGitRepositoryError, git.NoSuchPathError):
            raise RepoError(f"{what} {path} is not a git checkout") from None
        raise RepoError(f"{what} {path} is not the top of a git checkout (top: {top})") from None
    try:
        _ = repo.head.commit  # raises on a repo without commits
    except ValueError:
        raise RepoError(f"{what} {path} has no commit yet") from None
    return repo


def _status_lines(repo: git.Repo) -> list[str]:
    # --ignore-submodules=dirty: a submodule's own edits are reported in its own state, not as one line here
    out = repo.git.status("--short", "--untracked-files=all", "--ignore-submodules=dirty")
    return [line for line in out.splitlines() if line.strip()]


def _fingerprint(repo: git.Repo, dirty: list[str], subs: dict[str, RepoState]) -> str:
    h = hashlib.sha256(repo.head.commit.hexsha.encode())
    root = Path(repo.working_tree_dir or ".")
    for line in sorted(dirty):
        rel = line[3:].split(" -> ")[-1].strip('"')
        h.update(line.encode())
        f = root / rel
        if f.is_file():
            h.update(hashlib.sha256(f.read_bytes()).digest())
    for name in sorted(subs):
        h.update(name.encode() + subs[name].fingerprint.encode())
    return h.hexdigest()[:16]


def repo_state(path: Path | str, what: str = "repo", submodules: tuple[str, ...] = ()) -> RepoState:
    repo = open_repo(path, what)
    dirty = _status_lines(repo)
    subs: dict[str, RepoState] = {}
    for rel in submodules:
        sub_path = Path(path) / rel
        if (sub_path / ".git").exists():
            subs[rel] = repo_state(sub_path, f"{what} submodule")
    try:
        branch = repo.active_branch.name
    except TypeError:
        branch = None  # detached HEAD
    commit = repo.head.commit
    return RepoState(
        path=str(Path(path).resolve()),
        head=repo.git.rev_parse("--short", "HEAD"),
        head_full=commit.hexsha,
        branch=branch,
        dirty=dirty,
        submodules=subs,
        fingerprint=_fingerprint(repo, dirty, subs),
    )


def bridge_state(path: Path | str) -> RepoState:
    return repo_state(path, "BRIDGE_REPO", submodules=(MEGATRON_LM,))


def verl_state(path: Path | str) -> RepoState:
    state = repo_state(path, "VERL_REPO")
    if not (Path(path) / WRAPPER).is_file():
        raise RepoError(f"VERL_REPO {path} has no {WRAPPER} (not a verl checkout, or a release without it)")
    return state
