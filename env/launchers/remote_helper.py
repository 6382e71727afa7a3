"""The remote half of `invoke remote`'s sync: one self-contained script, stdlib only, Python >= 3.7.

env/launchers/sync.py imports it for hashing local files (so both sides hash the same way) and ships its source to the
remote as `python3 -c <source> <command>` with a JSON request on stdin; the JSON answer follows MARKER on stdout
(login shells may print banners before it).

A file's state is git's own identity: "<mode> <blob sha1>" (mode 100644, 100755 or 120000), so it compares
directly with `git ls-tree` output; None means absent, "dir" a directory or other non-file.
"""

import hashlib
import json
import os
import stat
import subprocess
import sys

MARKER = "@@verl-e2e-helper@@"
MANIFEST_NAME = "verl-e2e-sync.json"


def file_state(path):
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISLNK(st.st_mode):
        data, mode = os.fsencode(os.readlink(path)), "120000"
    elif stat.S_ISREG(st.st_mode):
        with open(path, "rb") as f:
            data = f.read()
        mode = "100755" if st.st_mode & stat.S_IXUSR else "100644"
    else:
        return "dir"
    blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    return mode + " " + blob


def _git(root, *args):
    out = subprocess.run(("git", "--no-optional-locks", "-C", root) + args, capture_output=True)
    if out.returncode != 0:
        raise RuntimeError("git {} in {}: {}".format(args[0], root, out.stderr.decode(errors="replace").strip()))
    return out.stdout


def _git_dir(root):
    return _git(root, "rev-parse", "--absolute-git-dir").decode().strip()


def _status_entries(root):
    """(status code, path) of everything that differs from HEAD, untracked-not-ignored included, no submodules."""
    raw = _git(root, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--ignore-submodules=all",
               "--no-renames")
    return [(e[:2].decode(), e[3:].decode("utf-8", "surrogateescape")) for e in raw.split(b"\0") if e]


def _probe_tree(req):
    root = os.path.abspath(os.path.expanduser(req["root"]))
    answer = {"root": root, "exists": os.path.isdir(root), "empty": True, "is_git": False}
    if not answer["exists"]:
        return answer
    answer["empty"] = not os.listdir(root)
    if not os.path.exists(os.path.join(root, ".git")):
        return answer
    answer["is_git"] = True
    answer["head"] = _git(root, "rev-parse", "HEAD").decode().strip()
    has = subprocess.run(["git", "-C", root, "cat-file", "-e", req["commit"] + "^{commit}"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    answer["has_commit"] = has.returncode == 0
    entries = _status_entries(root)
    answer["dirty"] = [path for _code, path in entries]
    answer["untracked"] = [path for code, path in entries if code == "??"]
    manifest_path = os.path.join(_git_dir(root), MANIFEST_NAME)
    answer["manifest"] = None
    if os.path.exists(manifest_path):
        with open(manifest_path) as f:
            answer["manifest"] = json.load(f)
    wanted = set(req.get("paths", [])) | set(answer["dirty"])
    wanted |= set((answer["manifest"] or {}).get("files", {})) | set((answer["manifest"] or {}).get("previous", {}))
    answer["states"] = {p: file_state(os.path.join(root, p)) for p in sorted(wanted)}
    return answer


def _list_dir(path):
    path = os.path.abspath(os.path.expanduser(path))
    return {"path": path, "entries": sorted(os.listdir(path)) if os.path.isdir(path) else []}


def probe(request):
    return {"trees": [_probe_tree(t) for t in request["trees"]],
            "listings": [_list_dir(p) for p in request.get("list_dirs", [])]}


def _remove_empty_parents(root, rel):
    parent = os.path.dirname(rel)
    while parent:
        try:
            os.rmdir(os.path.join(root, parent))
        except OSError:
            return
        parent = os.path.dirname(parent)


def prepare(request):
    """Backups (--force), deletions and the new manifest, before rsync writes the changed files."""
    for tree in request["trees"]:
        root = os.path.abspath(os.path.expanduser(tree["root"]))
        _write_manifest(root, tree["manifest"])
        for rel, backup in tree.get("backups", []):
            os.rename(os.path.join(root, rel), os.path.join(root, backup))
        for rel in tree.get("deletes", []):
            target = os.path.join(root, rel)
            if os.path.lexists(target):
                os.unlink(target)
            _remove_empty_parents(root, rel)
    return {"ok": True}


def checkout(request):
    """--checkout: put our own synced files back to HEAD, then move the clean tree to the wanted commit."""
    root = os.path.abspath(os.path.expanduser(request["root"]))
    if request["reset_paths"]:
        _git(root, "checkout", "-q", "HEAD", "--", *request["reset_paths"])
    for rel in request["remove_paths"]:
        os.unlink(os.path.join(root, rel))
        _remove_empty_parents(root, rel)
    _git(root, "-c", "advice.detachedHead=false", "checkout", "-q", "--detach", request["commit"])
    manifest_path = os.path.join(_git_dir(root), MANIFEST_NAME)
    if os.path.exists(manifest_path):
        os.unlink(manifest_path)
    return {"ok": True}


def _write_manifest(root, manifest):
    """The sync manifest lives in the git directory (never the work tree); written atomically."""
    manifest_path = os.path.join(_git_dir(root), MANIFEST_NAME)
    with open(manifest_path + ".tmp", "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    os.replace(manifest_path + ".tmp", manifest_path)


def complete(request):
    """After rsync wrote every change: the manifest says the sync finished, so its "previous" states no longer
    excuse anything (a file the sync added and someone then deleted there is their edit, not an unfinished sync)."""
    for root in request["roots"]:
        manifest_path = os.path.join(_git_dir(os.path.abspath(os.path.expanduser(root))), MANIFEST_NAME)
        with open(manifest_path) as f:
            manifest = json.load(f)
        manifest["complete"] = True
        _write_manifest(os.path.abspath(os.path.expanduser(root)), manifest)
    return {"ok": True}


COMMANDS = {"probe": probe, "prepare": prepare, "checkout": checkout, "complete": complete}


def main():
    request = json.loads(sys.stdin.read() or "{}")
    try:
        answer = COMMANDS[sys.argv[1]](request)
    except Exception as e:  # reported to the local side as one line
        answer = {"error": f"{type(e).__name__}: {e}"}
    sys.stdout.write("\n" + MARKER + json.dumps(answer) + "\n")


if __name__ == "__main__":
    main()
