"""`invoke remote` sync against a real sshd on 127.0.0.1: three trees, only the local changes move, remote edits kept."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.remote_fixtures import Trees, commit_all, git_out, sshd, tree_snapshot, write  # noqa: F401
from tests.sshd import JUMP_ALIAS

pytestmark = pytest.mark.ssh


@pytest.fixture
def trees(tmp_path, sshd, monkeypatch):  # noqa: F811
    return Trees(tmp_path, sshd, monkeypatch)


def test_first_sync_ships_git_visible_files_at_the_same_commit(trees):
    write(trees.verl / "verl/new_module.py", "NEW = 1\n")  # untracked, not ignored: goes
    write(trees.verl / "verl/utils/dataset/cache.parquet", "ignored\n")  # untracked and ignored: stays
    write(trees.bridge / "debug.log", "ignored too\n")
    (trees.bridge / "README.md").unlink()  # a tracked file deleted locally is deleted there too

    assert trees.sync() == 0, trees.err
    for local, remote in ((trees.bridge, trees.r_bridge), (trees.verl, trees.r_verl), (trees.tool, trees.r_tool),
                          (trees.bridge / "3rdparty/Megatron-LM", trees.r_bridge / "3rdparty/Megatron-LM")):
        assert git_out(remote, "rev-parse", "HEAD") == git_out(local, "rev-parse", "HEAD")
    assert (trees.r_verl / "verl/utils/dataset/rl_dataset.py").read_text() == "ROWS = 1\n"  # tracked under ignored
    assert (trees.r_verl / "verl/new_module.py").read_text() == "NEW = 1\n"
    assert not (trees.r_verl / "verl/utils/dataset/cache.parquet").exists()
    assert not (trees.r_bridge / "debug.log").exists()
    assert not (trees.r_bridge / "README.md").exists()
    assert (trees.r_bridge / "3rdparty/Megatron-LM/megatron/core/parallel_state.py").read_text() == "TP = 1\n"
    assert (trees.r_bridge / "scripts/run.sh").stat().st_mode & 0o100  # modes come along
    # The remote is the local state, and git there sees exactly the local change set.
    assert git_out(trees.r_bridge, "status", "--porcelain") == git_out(trees.bridge, "status", "--porcelain")
    assert "[first-sync]" in trees.out


def test_change_add_delete_sync_moves_only_the_change_set(trees):
    assert trees.sync() == 0, trees.err
    untouched = trees.r_bridge / "src/megatron/bridge/__init__.py"
    before = untouched.stat().st_mtime_ns
    write(trees.bridge / "src/megatron/bridge/models/provider.py", "class Provider:\n    tp = 2\n")
    write(trees.bridge / "src/megatron/bridge/models/new_model.py", "NEW = True\n")
    (trees.verl / "verl/trainer/main_ppo.py").unlink()
    write(trees.verl / "verl/utils/dataset/rl_dataset.py", "ROWS = 2\n")  # tracked, under ignored `dataset/`

    assert trees.sync(host=JUMP_ALIAS) == 0, trees.err  # Fabric and rsync both through ProxyJump
    assert (trees.r_bridge / "src/megatron/bridge/models/provider.py").read_text().endswith("tp = 2\n")
    assert (trees.r_bridge / "src/megatron/bridge/models/new_model.py").read_text() == "NEW = True\n"
    assert not (trees.r_verl / "verl/trainer/main_ppo.py").exists()
    assert (trees.r_verl / "verl/utils/dataset/rl_dataset.py").read_text() == "ROWS = 2\n"
    assert untouched.stat().st_mtime_ns == before  # not rewritten
    assert "bridge: " in trees.out and "2 to write, 0 to delete" in trees.out


def test_locally_reverted_files_are_restored_remotely(trees):
    assert trees.sync() == 0
    write(trees.bridge / "src/megatron/bridge/models/provider.py", "changed\n")
    write(trees.bridge / "scratch_notes.md", "temporary\n")
    (trees.verl / "verl/trainer/main_ppo.py").unlink()
    assert trees.sync() == 0
    subprocess.run(["git", "-C", str(trees.bridge), "checkout", "--", "src/megatron/bridge/models/provider.py"],
                   check=True)
    (trees.bridge / "scratch_notes.md").unlink()
    subprocess.run(["git", "-C", str(trees.verl), "checkout", "--", "verl/trainer/main_ppo.py"], check=True)

    assert trees.sync() == 0, trees.err
    assert tree_snapshot(trees.r_bridge) == tree_snapshot(trees.bridge)
    assert tree_snapshot(trees.r_verl) == tree_snapshot(trees.verl) | {}
    assert git_out(trees.r_bridge, "status", "--porcelain") == ""
    assert "restore: src/megatron/bridge/models/provider.py" in trees.out


def test_unrelated_remote_edits_are_left_byte_identical_and_listed(trees):
    assert trees.sync() == 0
    remote_edit = trees.r_bridge / "README.md"
    remote_edit.write_bytes(b"edited on the GPU host\r\n\x00binary")
    write(trees.r_verl / "remote_only.txt", "made there\n")
    write(trees.bridge / "src/megatron/bridge/models/provider.py", "local change\n")

    assert trees.sync() == 0, trees.err
    assert remote_edit.read_bytes() == b"edited on the GPU host\r\n\x00binary"
    assert (trees.r_verl / "remote_only.txt").read_text() == "made there\n"
    assert (trees.r_bridge / "src/megatron/bridge/models/provider.py").read_text() == "local change\n"
    assert "left alone (edited on the remote, not changed here): README.md" in trees.out
    assert "remote_only.txt" in trees.out


def _conflict(trees):
    write(trees.bridge / "src/megatron/bridge/models/provider.py", "ours v1\n")
    assert trees.sync() == 0
    write(trees.r_bridge / "src/megatron/bridge/models/provider.py", "edited remotely\n")
    write(trees.bridge / "src/megatron/bridge/models/provider.py", "ours v2\n")
    write(trees.verl / "verl/trainer/main_ppo.py", "another local change\n")


def test_conflict_is_refused_with_nothing_written(trees):
    _conflict(trees)
    manifest = trees.r_bridge / ".git/verl-e2e-sync.json"
    before = {name: tree_snapshot(root) for name, root in (("bridge", trees.r_bridge), ("verl", trees.r_verl))}
    manifest_before = manifest.read_bytes()

    assert trees.sync() == 2
    assert "src/megatron/bridge/models/provider.py" in trees.err and "--force" in trees.err
    assert {name: tree_snapshot(root) for name, root in (("bridge", trees.r_bridge), ("verl", trees.r_verl))} == before
    assert manifest.read_bytes() == manifest_before


def test_force_keeps_the_remote_version_as_a_named_backup(trees):
    _conflict(trees)
    assert trees.sync(force=True) == 0, trees.err
    target = trees.r_bridge / "src/megatron/bridge/models/provider.py"
    assert target.read_text() == "ours v2\n"
    backups = list(target.parent.glob("provider.py.remote-backup-*"))
    assert [b.read_text() for b in backups] == ["edited remotely\n"]
    assert backups[0].name in trees.out
    assert (trees.r_verl / "verl/trainer/main_ppo.py").read_text() == "another local change\n"


def test_different_commit_is_refused_and_checkout_moves_a_clean_tree(trees):
    write(trees.bridge / "src/megatron/bridge/models/provider.py", "synced before the commit\n")
    assert trees.sync() == 0
    old, new = git_out(trees.r_bridge, "rev-parse", "HEAD").strip(), commit_all(trees.bridge, "provider change")

    assert trees.sync() == 2
    assert old[:12] in trees.err and new[:12] in trees.err
    assert trees.sync(checkout=True) == 2  # the remote (a shallow first sync) does not have the new commit
    assert "not in the remote repository" in trees.err

    subprocess.run(["git", "-C", str(trees.r_bridge), "fetch", "-q", str(trees.bridge), "main"], check=True)
    write(trees.r_bridge / "README.md", "remote edit\n")
    assert trees.sync(checkout=True) == 2  # a foreign edit: not clean
    assert "README.md" in trees.err
    subprocess.run(["git", "-C", str(trees.r_bridge), "checkout", "--", "README.md"], check=True)

    # Our own earlier sync of provider.py does not make the tree dirty for --checkout.
    assert trees.sync(checkout=True) == 0, trees.err
    assert git_out(trees.r_bridge, "rev-parse", "HEAD").strip() == new
    assert git_out(trees.r_bridge, "status", "--porcelain") == ""


def test_submodule_is_synced_as_its_own_tree(trees):
    assert trees.sync() == 0
    sub = "3rdparty/Megatron-LM/megatron/core/parallel_state.py"
    write(trees.bridge / sub, "TP = 8\n")
    write(trees.bridge / "3rdparty/Megatron-LM/megatron/core/extra.py", "EXTRA = 1\n")

    assert trees.sync() == 0, trees.err
    assert (trees.r_bridge / sub).read_text() == "TP = 8\n"
    assert (trees.r_bridge / "3rdparty/Megatron-LM/megatron/core/extra.py").read_text() == "EXTRA = 1\n"
    assert "bridge/3rdparty/Megatron-LM: " in trees.out
    manifest = json.loads((trees.r_bridge / ".git/modules/3rdparty/Megatron-LM/verl-e2e-sync.json").read_text()
                          if (trees.r_bridge / ".git/modules").exists()
                          else (trees.r_bridge / "3rdparty/Megatron-LM/.git/verl-e2e-sync.json").read_text())
    assert set(manifest["files"]) == {"megatron/core/parallel_state.py", "megatron/core/extra.py"}


def test_dry_run_prints_the_plan_and_writes_nothing(trees):
    write(trees.bridge / "src/megatron/bridge/models/provider.py", "dry\n")
    assert trees.invoke(["echo", "--model", "m"], dry_run=True) == 0, trees.err
    assert not trees.remote_root.exists()
    assert "write: src/megatron/bridge/models/provider.py" in trees.out
    assert "bash -lc" in trees.out and "invoke echo --model m" in trees.out


def test_paths_with_spaces_and_quotes(tmp_path, sshd, monkeypatch):  # noqa: F811
    trees = Trees(tmp_path, sshd, monkeypatch, remote_root=tmp_path / "it's a \"remote\" $(dir)")
    odd = "docs/my \"notes\" it's $(touch pwned).md"
    write(trees.bridge / odd, "odd name\n")
    assert trees.sync() == 0, trees.err
    assert (trees.r_bridge / odd).read_text() == "odd name\n"
    write(trees.bridge / odd, "odd name, changed\n")
    assert trees.sync() == 0, trees.err
    assert (trees.r_bridge / odd).read_text() == "odd name, changed\n"
    assert not list(tmp_path.rglob("pwned"))


def test_a_sync_interrupted_before_rsync_is_not_a_conflict_next_time(trees, monkeypatch):
    """The manifest is written before rsync; if rsync never ran, the next sync writes again without --force."""
    import env.launchers.sync

    assert trees.sync() == 0
    write(trees.bridge / "src/megatron/bridge/models/provider.py", "first attempt\n")

    def rsync_dies(*args, **kwargs):
        raise env.launchers.sync.TransferFailed("rsync to host failed (12): connection unexpectedly closed")

    monkeypatch.setattr(env.launchers.sync, "rsync_files", rsync_dies)
    assert trees.sync() == 3  # Blocked, one line
    assert trees.err == "error: rsync to host failed (12): connection unexpectedly closed\n"
    monkeypatch.undo()
    monkeypatch.setenv("BRIDGE_REPO", str(trees.bridge))
    monkeypatch.setenv("VERL_REPO", str(trees.verl))
    monkeypatch.setenv("LOG_DIR", str(trees.log_dir))
    assert (trees.r_bridge / "src/megatron/bridge/models/provider.py").read_text().startswith("class Provider")
    write(trees.bridge / "src/megatron/bridge/models/provider.py", "second attempt\n")
    assert trees.sync() == 0, trees.err
    assert (trees.r_bridge / "src/megatron/bridge/models/provider.py").read_text() == "second attempt\n"


def test_a_file_the_last_sync_added_then_deleted_remotely_is_a_conflict(trees):
    """Found by the sync property test (an intermittent draw): a finished sync's pre-sync states must not excuse a
    remote edit. The last sync added the file; someone deleted it there: refused, not silently written back."""
    write(trees.bridge / "src/megatron/bridge/models/new_provider.py", "added locally\n")
    assert trees.sync() == 0, trees.err
    remote = trees.r_bridge / "src/megatron/bridge/models/new_provider.py"
    assert remote.read_text() == "added locally\n"
    assert json.loads((trees.r_bridge / ".git/verl-e2e-sync.json").read_text())["complete"] is True
    remote.unlink()
    assert trees.sync() == 2
    assert "src/megatron/bridge/models/new_provider.py" in trees.err and "--force" in trees.err
    assert not remote.exists()  # nothing written
