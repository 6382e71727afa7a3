"""verl's entry points at an older Bridge commit: what verl's import stands for when the name does not exist yet.

verl is read at its HEAD; the Bridge change may be older. A name verl imports that this Bridge commit does not define
(a factory added later, `create_peft`) still stands for Bridge code that exists now: what the name runs in the newest
Bridge the checkout knows (its upstream default branch), where that code exists at this commit under the same
module and class names (the PEFT classes the factory builds). Those units seed verl's reach in its place.
"""

from __future__ import annotations

from collections.abc import Mapping

import git

from sessions.plan.index import PACKAGE_DIR, BridgeIndex
from sessions.plan.reach import Step, reach

NEWER_REFS = ("origin/HEAD", "origin/main", "main")


class _TreeSources(Mapping):
    """A commit's Python sources under the package, read from git on first use."""

    def __init__(self, tree: git.Tree):
        self._blobs = {b.path: b for b in tree.traverse() if b.type == "blob" and b.path.endswith(".py")}
        self._text: dict[str, str | None] = {}

    def __iter__(self):
        return iter(self._blobs)

    def __len__(self) -> int:
        return len(self._blobs)

    def __getitem__(self, rel: str) -> str | None:
        if rel not in self._text:
            try:
                self._text[rel] = self._blobs[rel].data_stream.read().decode("utf-8")
            except (KeyError, UnicodeDecodeError):
                raise KeyError(rel) from None
        return self._text[rel]


def newer_index(root) -> tuple[BridgeIndex, str] | None:
    """The Bridge index of the checkout's upstream default branch, when it is not the checked-out commit."""
    try:
        repo = git.Repo(root)
        head = repo.head.commit.hexsha
    except (git.InvalidGitRepositoryError, git.NoSuchPathError, ValueError):
        return None
    for ref in NEWER_REFS:
        try:
            commit = repo.commit(ref)
        except (git.BadName, ValueError, git.GitCommandError):
            continue
        if commit.hexsha == head:
            return None
        try:
            tree = commit.tree / PACKAGE_DIR
        except KeyError:
            return None
        return BridgeIndex(root, sources=_TreeSources(tree)), ref
    return None


def stand_ins(index: BridgeIndex, surface) -> list[tuple[str, Step]]:
    """Seeds for the names verl imports that this commit lacks: the units those names run in the newer Bridge that
    exist here too."""
    missing = [s for s in surface.imports if s.name and index.resolve(s.module, s.name) is None]
    if not missing:
        return []
    found = newer_index(index.root)
    if found is None:
        return []
    newer, ref = found
    out: list[tuple[str, Step]] = []
    seen: set[str] = set()
    for s in missing:
        t = newer.resolve(s.module, s.name)
        if not t or t[0] != "unit":
            continue
        ran = reach(newer, [(t[1], Step(None, "verl"))], {}, imports=False, modules_gate=set(newer.modules.files))
        for key in [*ran.steps, *ran.live]:
            if ":" not in key or key in seen or index.unit(key) is None:
                continue
            seen.add(key)
            name = key.split(":", 1)[1]
            out.append((key, Step(None, f"verl {s.where}: {s.dotted} (not at this commit; at {ref} it runs "
                                        f"{name}, which exists here)")))
    return out
