"""Ship exactly the local changes of three git trees (Bridge + its submodules, verl, this project) to a remote host.

Three states meet for every path: HEAD (the commit both sides must be at), the local work tree and the remote
work tree, plus what our last sync wrote (its manifest, kept in the remote's git directory). The file lists come
from git (`git diff HEAD` for tracked changes, `git ls-files --others --exclude-standard` for new files), never
from rsync's .gitignore filter, which drops tracked files under ignored paths (verl's `verl/utils/dataset/`).

For each path the local side changed now or at the last sync:
  wanted   = the local file (or HEAD's version when it was reverted locally; absent = delete)
  expected = what the remote should hold if nobody touched it = our last write there, else HEAD
  remote == wanted → nothing to do; remote == expected → write/delete; else a conflict (edited on the remote).
Everything else the remote changed is left byte-identical and listed.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from env.launchers.remote_helper import file_state
from env.settings import UsageError

if TYPE_CHECKING:
    from env.launchers.remote_host import RemoteHost

GITLINK_MODE = "160000"
MANIFEST_VERSION = 1


class SyncRefused(UsageError):
    """The sync would overwrite something it must not, or the trees are at different commits."""


class TransferFailed(Exception):
    """rsync could not move the files (network, disk, permissions on the host): the run is Blocked, exit 3."""


def git(repo: Path, *args: str, stdin: bytes | None = None) -> bytes:
    proc = subprocess.run(["git", "-C", str(repo), *args], input=stdin, capture_output=True)
    if proc.returncode != 0:
        raise UsageError(f"git {args[0]} in {repo}: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout


def _split_z(raw: bytes) -> list[str]:
    return [p.decode("utf-8", "surrogateescape") for p in raw.split(b"\0") if p]


@dataclass
class LocalTree:
    """One git work tree to sync: `name` for messages, `local` here, `remote` there (absolute or home-relative)."""

    name: str
    local: Path
    remote: str
    head: str
    branch: str | None
    head_states: dict[str, str]  # path -> "<mode> <blob>" at HEAD, submodule gitlinks left out
    changes: dict[str, str | None]  # the local change set vs HEAD: path -> local state (None = deleted)
    submodules: list[str] = field(default_factory=list)  # gitlink paths (initialized ones are trees of their own)


def scan_local(name: str, local: Path, remote: str) -> LocalTree:
    if not (local / ".git").exists():
        raise UsageError(f"{name}: {local} is not a git checkout")
    head = git(local, "rev-parse", "HEAD").decode().strip()
    branch = git(local, "rev-parse", "--abbrev-ref", "HEAD").decode().strip()
    head_states, submodules = {}, []
    for entry in git(local, "ls-tree", "-r", "-z", "--full-tree", "HEAD").split(b"\0"):
        if not entry:
            continue
        meta, path = entry.split(b"\t", 1)
        mode, _kind, blob = meta.decode().split()
        rel = path.decode("utf-8", "surrogateescape")
        if mode == GITLINK_MODE:
            submodules.append(rel)
        else:
            head_states[rel] = f"{mode} {blob}"
    changed = _split_z(git(local, "diff", "--name-only", "-z", "--no-renames", "--ignore-submodules=all", "HEAD"))
    untracked = [p for p in _split_z(git(local, "ls-files", "-z", "--others", "--exclude-standard"))
                 if not p.endswith("/")]  # a trailing slash is a nested repository, not a file
    changes: dict[str, str | None] = {}
    for rel in sorted(set(changed) | set(untracked)):
        state = file_state(str(local / rel))
        if state == "dir" or state == head_states.get(rel):
            continue  # a stat-only difference, or not a file git can sync
        changes[rel] = state
    return LocalTree(name, local, remote, head, None if branch == "HEAD" else branch, head_states, changes,
                     submodules)


def local_trees(name: str, local: Path, remote: str) -> list[LocalTree]:
    """The tree and, after it, each initialized submodule (recursively) as a tree of its own."""
    tree = scan_local(name, local, remote)
    out = [tree]
    for sub in tree.submodules:
        if (local / sub / ".git").exists():
            out.extend(local_trees(f"{name}/{sub}", local / sub, f"{remote.rstrip('/')}/{sub}"))
    return out


@dataclass
class TreePlan:
    tree: LocalTree
    remote_root: str = ""  # absolute, as the remote resolved it
    action: str = "incremental"  # first-sync | checkout | incremental
    writes: list[str] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)  # reverted locally, put back to HEAD remotely
    conflicts: list[str] = field(default_factory=list)
    backups: list[tuple[str, str]] = field(default_factory=list)  # (path, backup name) with --force
    unrelated: list[str] = field(default_factory=list)  # remote edits we leave alone
    checkout_reset: list[str] = field(default_factory=list)
    checkout_remove: list[str] = field(default_factory=list)
    remote_before: dict[str, str | None] = field(default_factory=dict)  # states of the paths we change
    refusal: str | None = None

    def manifest(self) -> dict[str, Any]:
        # Written before rsync runs (one round trip less); "previous" keeps an interrupted sync from turning
        # into false conflicts: a path still in its pre-sync state is ours to write again. Marked "complete"
        # after rsync (remote_helper.complete): then "previous" excuses nothing.
        previous = {p: self.remote_before.get(p) for p in self.writes + self.deletes}
        return {"version": MANIFEST_VERSION, "commit": self.tree.head, "files": self.tree.changes,
                "previous": previous,
                "synced_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "source": f"{os.uname().nodename}:{self.tree.local}"}


def plan_paths(
    changes: dict[str, str | None],
    manifest_files: dict[str, str | None],
    head_states: dict[str, str],
    remote_state: dict[str, str | None],
    manifest_previous: dict[str, str | None] | None = None,
) -> tuple[list[str], list[str], list[str], list[str]]:
    """Pure core of the sync: (writes, deletes, restored, conflicts) for one tree at one commit."""
    writes, deletes, restored, conflicts = [], [], [], []
    previous = manifest_previous or {}
    for rel in sorted(set(changes) | set(manifest_files) | set(previous)):
        wanted = changes[rel] if rel in changes else head_states.get(rel)
        expected = manifest_files[rel] if rel in manifest_files else head_states.get(rel)
        current = remote_state.get(rel)
        if current == wanted:
            continue
        if current != expected and not (rel in previous and current == previous[rel]):
            conflicts.append(rel)
        (writes if wanted is not None else deletes).append(rel)
        if rel not in changes:
            restored.append(rel)
    return writes, deletes, restored, conflicts


def plan_tree(tree: LocalTree, probe: dict[str, Any], *, force: bool, checkout: bool, stamp: str) -> TreePlan:
    plan = TreePlan(tree, remote_root=probe["root"])
    manifest_files: dict[str, str | None] = {}
    manifest_previous: dict[str, str | None] = {}
    if not probe["exists"] or (probe["empty"] and not probe["is_git"]):
        plan.action = "first-sync"
        remote_state: dict[str, str | None] = {p: tree.head_states.get(p) for p in tree.changes}
    elif not probe["is_git"]:
        plan.refusal = f"{probe['root']} exists and is not a git checkout; give an empty or missing path"
        return plan
    else:
        manifest = probe.get("manifest") or {}
        if manifest.get("version") == MANIFEST_VERSION:
            manifest_files = manifest.get("files", {})
            # only an unfinished sync's pre-sync states excuse a difference (a finished one's are someone's edit)
            manifest_previous = {} if manifest.get("complete") else manifest.get("previous", {})
        remote_state = dict(probe["states"])
        if probe["head"] != tree.head:
            if not checkout:
                plan.refusal = (f"different commits: local {tree.head[:12]}, remote {probe['head'][:12]} "
                                "(commit/push and check out the same commit there, or pass --checkout)")
                return plan
            if not probe["has_commit"]:
                plan.refusal = (f"--checkout: commit {tree.head[:12]} is not in the remote repository "
                                f"(push it and `git fetch` there, or sync into a fresh --remote-root)")
                return plan
            ours = [p for p in probe["dirty"] if p in manifest_files and remote_state.get(p) == manifest_files[p]]
            foreign = sorted(set(probe["dirty"]) - set(ours))
            if foreign:
                plan.refusal = (f"--checkout needs a clean remote tree; edited there: {_short_list(foreign)}")
                return plan
            plan.action = "checkout"
            untracked = set(probe["untracked"])
            plan.checkout_reset = [p for p in ours if p not in untracked]
            plan.checkout_remove = [p for p in ours if p in untracked]
            manifest_files, manifest_previous = {}, {}
            remote_state = {p: tree.head_states.get(p) for p in tree.changes}  # after the checkout
        else:
            plan.unrelated = sorted(set(probe["dirty"]) - set(tree.changes) - set(manifest_files)
                                    - set(manifest_previous))
    plan.writes, plan.deletes, plan.restored, plan.conflicts = plan_paths(
        tree.changes, manifest_files, tree.head_states, remote_state, manifest_previous)
    plan.remote_before = {p: remote_state.get(p) for p in plan.writes + plan.deletes}
    if plan.conflicts and force:
        plan.backups = [(p, f"{p}.remote-backup-{stamp}") for p in plan.conflicts
                        if remote_state.get(p) is not None]
    return plan


def _short_list(paths: list[str], limit: int = 8) -> str:
    shown = ", ".join(paths[:limit])
    return shown + (f" (+{len(paths) - limit} more)" if len(paths) > limit else "")


@dataclass
class SyncPlan:
    trees: list[TreePlan]

    def refusals(self, force: bool) -> list[str]:
        out = [f"{p.tree.name}: {p.refusal}" for p in self.trees if p.refusal]
        if not force:
            out += [f"{p.tree.name}: edited on the remote since our last sync, and changed here: "
                    f"{_short_list(p.conflicts)} (nothing was written; pass --force to keep the remote "
                    "versions as *.remote-backup-* files and overwrite)" for p in self.trees if p.conflicts]
        return out

    def describe(self) -> str:
        lines = []
        for p in self.trees:
            t = p.tree
            where = p.remote_root or t.remote
            if p.refusal:
                lines.append(f"  {t.name}: REFUSED - {p.refusal}")
                continue
            head = f"{t.head[:12]}" + (f" ({t.branch})" if t.branch else "")
            lines.append(f"  {t.name}: {t.local} -> {where} @ {head} [{p.action}]: "
                         f"{len(p.writes)} to write, {len(p.deletes)} to delete"
                         + (f", {len(p.restored)} restored to HEAD" if p.restored else ""))
            for label, paths in (("write", p.writes), ("delete", p.deletes), ("restore", p.restored),
                                 ("conflict", p.conflicts)):
                for rel in paths[:20]:
                    lines.append(f"      {label}: {rel}")
                if len(paths) > 20:
                    lines.append(f"      ... {len(paths) - 20} more to {label}")
            for _rel, backup in p.backups:
                lines.append(f"      remote version kept as: {backup}")
            if p.checkout_reset or p.checkout_remove:
                lines.append(f"      checkout first resets our earlier sync of {len(p.checkout_reset) + len(p.checkout_remove)} file(s)")
            if p.unrelated:
                lines.append(f"      left alone (edited on the remote, not changed here): {_short_list(p.unrelated, 20)}")
        return "\n".join(lines)


def make_plan(host: RemoteHost, trees: list[LocalTree], *, force: bool, checkout: bool) -> SyncPlan:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    # The remote adds its own dirty paths and the last manifest's paths to the states it reports.
    request = {"trees": [{"root": t.remote, "commit": t.head, "paths": sorted(t.changes)} for t in trees]}
    answer = host.helper("probe", request)
    plans = [plan_tree(t, probe, force=force, checkout=checkout, stamp=stamp)
             for t, probe in zip(trees, answer["trees"], strict=True)]
    return SyncPlan(plans)


def shallow_pack(repo: Path, commit: str) -> bytes:
    """A pack holding one commit and everything its tree needs: a remote with it is a shallow clone at it."""
    objects = git(repo, "rev-list", "--objects", "--no-object-names", "-n", "1", commit)
    # --window=0: no delta search; within one commit it saves little and took 7 s of 9 on 6,000 files (bench)
    return git(repo, "pack-objects", "--stdout", "-q", "--window=0", stdin=objects)


def first_sync_script(root: str, commit: str, branch: str | None) -> str:
    q = shlex.quote
    ref = (f"git update-ref {q('refs/heads/' + branch)} {commit} && git symbolic-ref HEAD {q('refs/heads/' + branch)}"
           if branch else f"git update-ref --no-deref HEAD {commit}")
    return (f"set -e; mkdir -p {q(root)}; cd {q(root)}; test -z \"$(ls -A)\"; git init -q; "
            f"git index-pack --stdin >/dev/null; echo {commit} > \"$(git rev-parse --git-dir)/shallow\"; "
            f"{ref}; git reset -q --hard {commit}")


RSYNC_BYTES = re.compile(r"Total bytes sent:\s*([\d,.]+)")


def rsync_files(host: RemoteHost, local: Path, remote_root: str, paths: Iterable[str]) -> int:
    """rsync exactly these paths (relative to `local`) to the same paths under remote_root; returns bytes sent."""
    paths = list(paths)
    if not paths:
        return 0
    with tempfile.NamedTemporaryFile("wb", suffix=".files") as listing:
        listing.write(b"\0".join(os.fsencode(p) for p in paths) + b"\0")
        listing.flush()
        # -I: always compare contents (a same-size, same-mtime remote edit must not be skipped);
        # -s: remote paths are not split or expanded by the remote shell.
        cmd = ["rsync", "-a", "-I", "-s", "--from0", f"--files-from={listing.name}", "--stats",
               "-e", host.rsync_ssh_command(), f"{local}/", host.rsync_target(remote_root.rstrip("/") + "/")]
        proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise TransferFailed(f"rsync to {host.display} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    match = RSYNC_BYTES.search(proc.stdout)
    return int(re.sub(r"[,.]", "", match.group(1))) if match else 0


@dataclass
class SyncResult:
    plan: SyncPlan
    bytes_sent: int


def apply_plan(host: RemoteHost, plan: SyncPlan, *, force: bool) -> SyncResult:
    """Write the plan. Order: first syncs/checkouts; backups, deletes and the manifest in one call; rsync."""
    refusals = plan.refusals(force)
    if refusals:
        raise SyncRefused("; ".join(refusals))
    sent_before = host.bytes_sent
    rsync_bytes = 0
    for p in plan.trees:
        if p.action == "first-sync":
            host.exec_with_input(f"bash -lc {shlex.quote(first_sync_script(p.remote_root, p.tree.head, p.tree.branch))}",
                                 shallow_pack(p.tree.local, p.tree.head), what=f"{p.tree.name}: first sync")
        elif p.action == "checkout":
            host.helper("checkout", {"root": p.remote_root, "commit": p.tree.head,
                                     "reset_paths": p.checkout_reset, "remove_paths": p.checkout_remove})
    host.helper("prepare", {"trees": [{"root": p.remote_root, "backups": p.backups, "deletes": p.deletes,
                                       "manifest": p.manifest()} for p in plan.trees]})
    for p in plan.trees:
        rsync_bytes += rsync_files(host, p.tree.local, p.remote_root, p.writes)
    host.helper("complete", {"roots": [p.remote_root for p in plan.trees]})
    return SyncResult(plan, host.bytes_sent - sent_before + rsync_bytes)
