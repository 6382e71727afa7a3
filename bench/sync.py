"""Benchmark: shipping a one-file change of a >= 5,000-file checkout to a host, three ways, in one run.

    .venv/bin/python bench/sync.py [--files 6000] [--kib 4]

Starts the test sshd on 127.0.0.1 (tests/sshd.py; needs sshd, ssh, rsync), builds a synthetic git checkout,
syncs it once, changes one file, then measures for that change:
  - ours: `invoke remote`'s sync (git change set + probe + rsync of the changed file + manifest),
  - rsync -az of the whole tree into an up-to-date copy, and into an empty folder,
  - `git archive` of the working state piped into `ssh host tar -x`.
Bytes are payload bytes sent (rsync's "Total bytes sent", our commands and stdin, the tar stream), not SSH framing.
"""

from __future__ import annotations

import argparse
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from env.launchers.remote_host import RemoteHost  # noqa: E402
from env.launchers.sync import RSYNC_BYTES, apply_plan, local_trees, make_plan  # noqa: E402
from tests.sshd import DIRECT_ALIAS, sshd_available, start_sshd  # noqa: E402


def make_checkout(root: Path, n_files: int, kib: int) -> Path:
    repo = root / "big checkout"
    rng = random.Random(5)
    words = [f"tok{i}" for i in range(2000)]
    for i in range(n_files):
        path = repo / f"pkg{i % 40}" / f"mod{i % 7}" / f"file_{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        lines, size = [], 0
        while size < kib * 1024:
            line = " ".join(rng.choices(words, k=12)) + "\n"
            lines.append(line)
            size += len(line)
        path.write_text("".join(lines))
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=bench", "-c", "user.email=b@example.com", "commit",
                    "-q", "-m", "bench"], check=True)
    return repo


def rsync_full(ssh_cmd: str, source: Path, target: str) -> tuple[int, float]:
    start = time.monotonic()
    proc = subprocess.run(["rsync", "-az", "-s", "--delete", "--stats", "--exclude=.git", "-e", ssh_cmd,
                           f"{source}/", target], capture_output=True, text=True, check=True)
    elapsed = time.monotonic() - start
    return int(RSYNC_BYTES.search(proc.stdout).group(1).replace(",", "")), elapsed


def git_archive_over_ssh(ssh_config: Path, repo: Path, remote_dir: str) -> tuple[int, float]:
    import shlex

    start = time.monotonic()
    # the working state of tracked files, as a commit object git can archive (falls back to HEAD when clean)
    treeish = subprocess.run(["git", "-C", str(repo), "stash", "create"], capture_output=True, text=True,
                             check=True).stdout.strip() or "HEAD"
    archive = subprocess.Popen(["git", "-C", str(repo), "archive", "--format=tar", treeish], stdout=subprocess.PIPE)
    remote_cmd = f"mkdir -p {shlex.quote(remote_dir)} && tar -x -C {shlex.quote(remote_dir)}"
    ssh = subprocess.Popen(["ssh", "-F", str(ssh_config), DIRECT_ALIAS, remote_cmd], stdin=subprocess.PIPE)
    sent = 0
    while chunk := archive.stdout.read(1 << 16):
        ssh.stdin.write(chunk)
        sent += len(chunk)
    ssh.stdin.close()
    if archive.wait() or ssh.wait():
        raise SystemExit("git archive | ssh tar -x failed")
    return sent, time.monotonic() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=6000, help="files in the synthetic checkout (>= 5000)")
    parser.add_argument("--kib", type=int, default=4, help="size of each file in KiB")
    args = parser.parse_args()
    if not sshd_available():
        print("needs sshd, ssh and rsync", file=sys.stderr)
        return 3
    work = Path(tempfile.mkdtemp(prefix="verl-e2e-bench-"))
    server = start_sshd(work / "sshd")
    try:
        repo = make_checkout(work, args.files, args.kib)
        n_files = len(subprocess.run(["git", "-C", str(repo), "ls-files"], capture_output=True, text=True,
                                     check=True).stdout.splitlines())
        ssh_cmd = f"ssh -F {server.ssh_config}"
        host = RemoteHost(DIRECT_ALIAS, server.ssh_config)
        host.open()
        ours_dir = work / "remote ours"
        t0 = time.monotonic()
        first = apply_plan(host, make_plan(host, local_trees("bench", repo, str(ours_dir)), force=False,
                                           checkout=False), force=False)
        first_s = time.monotonic() - t0
        up_to_date = f"{DIRECT_ALIAS}:{work}/remote rsync incremental/"
        rsync_full(ssh_cmd, repo, up_to_date)  # bring the rsync copy up to date before the change

        changed = repo / "pkg3" / "mod3" / "file_3.py"
        changed.write_text(changed.read_text().replace("tok1 ", "tokX ", 1) + "# one local edit\n")

        t0 = time.monotonic()
        result = apply_plan(host, make_plan(host, local_trees("bench", repo, str(ours_dir)), force=False,
                                            checkout=False), force=False)
        ours_s = time.monotonic() - t0
        assert (ours_dir / "pkg3/mod3/file_3.py").read_bytes() == changed.read_bytes()
        incr_bytes, incr_s = rsync_full(ssh_cmd, repo, up_to_date)
        full_bytes, full_s = rsync_full(ssh_cmd, repo, f"{DIRECT_ALIAS}:{work}/remote rsync full/")
        tar_bytes, tar_s = git_archive_over_ssh(server.ssh_config, repo, f"{work}/remote tar")
        host.close()

        tree_mib = sum(p.stat().st_size for p in repo.rglob("*") if ".git" not in p.parts and p.is_file()) / 2**20
        print(f"checkout: {n_files} files, {tree_mib:.1f} MiB; change: 1 file; host: sshd on 127.0.0.1")
        print(f"{'method':<44}{'bytes sent':>14}{'wall s':>10}")
        rows = [
            ("ours: invoke remote sync (one-file change)", result.bytes_sent, ours_s),
            ("rsync -az, whole tree into up-to-date copy", incr_bytes, incr_s),
            ("rsync -az, whole tree into empty folder", full_bytes, full_s),
            ("git archive | ssh tar -x (working state)", tar_bytes, tar_s),
            ("ours: first sync (shallow pack + checkout)", first.bytes_sent, first_s),
        ]
        for name, sent, secs in rows:
            print(f"{name:<44}{sent:>14,}{secs:>10.2f}")
        return 0
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
