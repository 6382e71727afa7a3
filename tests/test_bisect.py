"""`invoke bisect` end to end: real git bisect over a fixture Bridge history, the real `invoke level0` at each commit.

The history (built here with gitpython on top of the fixture Bridge checkout) is linear, 13 commits past the
fixture's own: G (good: the package builds its provider inside verl's workers), then c1..c12 with
- c6: the Bridge is unimportable (preflight Blocks the level: skip), fixed again in c7,
- c8: moves the 3rdparty/Megatron-LM submodule to a new commit (so git's first pick, c6, moves it back),
- c9: the provider breaks (the fixture trainer's worker import builds the provider and fails: a provider Fail).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import git
import pytest

from tests.conftest import PROJECT
from tests.remote_fixtures import sshd  # noqa: F401

FIXTURE_DEV = git.Actor("Fixture Dev", "dev@example.com")
INIT = "src/megatron/bridge/__init__.py"
PROVIDERS = "src/megatron/bridge/providers.py"
# verl's Megatron workers run with CUDA_DEVICE_MAX_CONNECTIONS=1 (the wrapper exports it); the driver's import
# probe does not. So the package imports everywhere and builds its provider only where verl builds the model.
INIT_WITH_PROVIDER = '''"""FIXTURE Megatron-Bridge package (verl-bridge-e2e tests)."""
import os

__version__ = "0.6.2+fixture"

if os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"):  # inside verl's Megatron workers: build the provider
    from megatron.bridge.providers import provide

    provide("qwen2")
'''
INIT_UNIMPORTABLE = INIT_WITH_PROVIDER.replace("import os\n", "import os\nimport megatron_bridge_missing_dep  # noqa\n")
PROVIDER_BROKEN = '''def provide(name):
    cfg = {"name": name, "tensor_model_parallel_size": 2}
    assert cfg["tensor_model_parallel_size"] == 1, (
        "provider finalized with tensor_model_parallel_size=2 but Megatron mpu was initialized with 1")
    return cfg
'''


@dataclass
class History:
    good: str  # G
    commits: list[str]  # c1..c12 (index 0 = c1)
    mlm_old: str
    mlm_new: str

    def c(self, n: int) -> str:
        return self.commits[n - 1]


def _commit(repo: git.Repo, message: str, files: dict[str, str]) -> str:
    root = Path(repo.working_tree_dir)
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    repo.git.add("-A")
    return repo.index.commit(message, author=FIXTURE_DEV, committer=FIXTURE_DEV).hexsha


def build_history(bridge: Path) -> History:
    repo = git.Repo(bridge)
    mlm = git.Repo(bridge / "3rdparty/Megatron-LM")
    mlm_old = mlm.head.commit.hexsha
    good = _commit(repo, "Build the provider in verl's workers", {INIT: INIT_WITH_PROVIDER})
    commits = []
    for n in range(1, 13):
        files = {f"docs/notes/{n:02d}.md": f"note {n}\n"}
        message = f"Docs: note {n}"
        if n == 8:  # the submodule moves: a new Megatron-LM commit, recorded by the Bridge
            (bridge / "3rdparty/Megatron-LM/megatron/core/moved.py").write_text("MOVED = True\n")
            mlm.git.add("-A")
            mlm.index.commit("Megatron-LM: a newer commit", author=FIXTURE_DEV, committer=FIXTURE_DEV)
            message = "Bump 3rdparty/Megatron-LM"
        elif n == 6:
            files[INIT], message = INIT_UNIMPORTABLE, "Import a dependency that is not there"
        elif n == 7:
            files[INIT], message = INIT_WITH_PROVIDER, "Drop the missing dependency again"
        elif n == 9:
            files[PROVIDERS], message = PROVIDER_BROKEN, "Provider: default tensor parallel size 2"
        commits.append(_commit(repo, message, files))
    return History(good, commits, mlm_old, mlm.head.commit.hexsha)


def bisect_dirs(ws) -> list[Path]:
    return sorted(p for p in ws.log_dir.glob("*-bisect-*") if p.is_dir())


def checkout_state(bridge: Path) -> dict:
    repo = git.Repo(bridge)
    return {"branch": repo.active_branch.name if not repo.head.is_detached else None,
            "head": repo.head.commit.hexsha,
            "mlm": git.Repo(bridge / "3rdparty/Megatron-LM").head.commit.hexsha,
            "status": repo.git.status("--porcelain", "--untracked-files=all"),
            "stashes": repo.git.stash("list"),
            "bisecting": (bridge / ".git/BISECT_START").exists()}


@pytest.fixture
def history(workspace) -> History:
    return build_history(workspace.bridge)


def _summary(report_dir: Path) -> dict:
    return json.loads((report_dir / "summary.json").read_text())


def _run_json(run_dir: str) -> dict:
    return json.loads((Path(run_dir) / "run.json").read_text())


def test_finds_the_provider_break_skips_the_blocked_commit_restores_and_reuses(workspace, history):
    ws = workspace
    before = checkout_state(ws.bridge)
    assert before["branch"] == "main" and before["head"] == history.c(12) and before["mlm"] == history.mlm_new

    t0 = time.monotonic()
    proc = ws.invoke("bisect", "--good", history.good, "level0", "--skip-bridge-checks", timeout=900)
    first_s = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert checkout_state(ws.bridge) == before  # branch, commit, submodule, clean tree, no bisect left
    [report_dir] = bisect_dirs(ws)
    assert report_dir.name.endswith("-bisect-level0-Qwen2.5-0.5B")
    s = _summary(report_dir)
    assert s["result"] == "found" and s["exit_code"] == 0 and s["first_bad"] == history.c(9)
    by_commit = {st["commit"]: st for st in s["steps"]}
    # the unimportable Bridge: Blocked by preflight, skipped, and named as skipped with the reason
    blocked = by_commit[history.c(6)]
    assert (blocked["result"], blocked["mark"]) == ("Blocked", "skip")
    assert [st["commit"] for st in s["steps"] if st["mark"] == "skip"] == [history.c(6)]
    # the break and its parent, each with its own verdict and category
    assert (by_commit[history.c(9)]["result"], by_commit[history.c(9)]["category"]) == ("Fail", "provider")
    assert by_commit[history.c(9)]["mark"] == "bad"
    assert (by_commit[history.c(8)]["result"], by_commit[history.c(8)]["mark"]) == ("Pass", "good")
    assert "tensor_model_parallel_size=2" in by_commit[history.c(9)]["first_error"]
    assert all(not st["reused"] for st in s["steps"]) and s["runs"] == len(s["steps"])
    # each step ran with the submodule commit its Bridge commit records
    for st in s["steps"]:
        want = history.mlm_old if history.commits.index(st["commit"]) < 7 else history.mlm_new
        record = _run_json(st["run_dir"])
        assert record["bridge"]["head_full"] == st["commit"]
        assert record["bridge"]["submodules"]["3rdparty/Megatron-LM"]["head_full"] == want, st
        assert record["bridge"]["dirty"] == []
    moved = [st for st in s["steps"] if st["submodules"]]
    assert moved and all(m["submodules"][0].startswith("3rdparty/Megatron-LM ") for m in moved)
    assert s["steps"][0]["commit"] == history.c(6)  # git's first pick: the middle of c1..c12
    assert s["steps"][0]["submodules"] == [f"3rdparty/Megatron-LM {history.mlm_new[:8]} → {history.mlm_old[:8]}"]
    md = (report_dir / "summary.md").read_text()
    assert f"- hash: {history.c(9)}" in md and "- subject: Provider: default tensor parallel size 2" in md
    assert "  - M src/megatron/bridge/providers.py" in md and "- author date: " in md
    assert "verdict at its parent " + history.c(8)[:12] + ": **Pass**" in md
    assert "## Skipped commits" in md and f"- {history.c(6)[:12]} Import a dependency that is not there" in md
    assert "Fail → bad for bridge-checks, checkpoint, nan-metrics, provider; skip for every other category " \
           "(defaults)" in md
    # the replay file is git's own: `git bisect replay` reaches the same first bad commit
    replay = report_dir / "bisect-replay.log"
    assert f"# first bad commit: [{history.c(9)}]" in replay.read_text()
    out = git.Repo(ws.bridge).git.bisect("replay", str(replay))
    assert f"{history.c(9)} is the first bad commit" in out
    git.Repo(ws.bridge).git.bisect("reset")
    assert checkout_state(ws.bridge) == before

    # second run, same settings: every Pass/Fail comes from the first run's directories; only the Blocked commit
    # runs again (what blocked it may have been fixed meanwhile)
    t0 = time.monotonic()
    again = ws.invoke("bisect", "--good", history.good, "level0", "--skip-bridge-checks", timeout=900)
    second_s = time.monotonic() - t0
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    s2 = _summary(bisect_dirs(ws)[-1])
    assert s2["first_bad"] == history.c(9) and s2["runs"] == 1 and s2["reused"] == len(s["steps"]) - 1
    assert [(st["commit"], st["reused"]) for st in s2["steps"]] == \
        [(st["commit"], st["result"] != "Blocked") for st in s["steps"]]
    assert [st["run_dir"] for st in s2["steps"] if st["reused"]] == \
        [st["run_dir"] for st in s["steps"] if st["result"] != "Blocked"]
    assert checkout_state(ws.bridge) == before
    print(f"\nbisect timing: first run {first_s:.1f}s ({s['runs']} level runs), second run {second_s:.1f}s "
          f"({s2['reused']} verdicts reused, {s2['runs']} runs)")

    # --on provider=skip: the provider Fails no longer count, only skips are left: ambiguous, candidates listed
    amb = ws.invoke("bisect", "--good", history.good, "--on", "provider=skip", "level0", "--skip-bridge-checks",
                    timeout=900)
    assert amb.returncode == 3, amb.stdout[-3000:] + amb.stderr[-3000:]
    s3 = _summary(bisect_dirs(ws)[-1])
    assert s3["result"] == "ambiguous" and s3["first_bad"] is None
    assert sorted(s3["candidates"]) == sorted(history.commits[8:])  # c9..c12
    assert "Fail/provider → skip (--on provider=skip)" in {st["rule"] for st in s3["steps"]}
    assert "(--on: provider=skip)" in (bisect_dirs(ws)[-1] / "summary.md").read_text()
    assert checkout_state(ws.bridge) == before

    # the --bad commit itself is the break: git names it untested, so bisect judges it (and its parent) itself
    edge = ws.invoke("bisect", "--good", history.c(7), "--bad", history.c(9), "level0", "--skip-bridge-checks",
                     timeout=900)
    assert edge.returncode == 0, edge.stdout[-3000:] + edge.stderr[-3000:]
    s4 = _summary(bisect_dirs(ws)[-1])
    assert s4["first_bad"] == history.c(9)
    assert [(st["commit"], st["purpose"], st["result"]) for st in s4["steps"]] == \
        [(history.c(8), "bisect", "Pass"), (history.c(9), "confirm", "Fail")]
    # an endpoint that contradicts the level: --bad c8 passes, so no first bad commit is claimed
    wrong = ws.invoke("bisect", "--good", history.c(7), "--bad", history.c(8), "level0", "--skip-bridge-checks",
                      timeout=900)
    assert wrong.returncode == 3, wrong.stdout[-3000:] + wrong.stderr[-3000:]
    s5 = _summary(bisect_dirs(ws)[-1])
    assert s5["first_bad"] is None and "passes: --bad " + history.c(8) + " is not bad" in s5["contradiction"]
    assert checkout_state(ws.bridge) == before


def test_max_steps_stops_with_the_remaining_range_and_restores_the_stash(workspace, history):
    ws = workspace
    (ws.bridge / "README.local").write_text("my notes\n")  # untracked
    (ws.bridge / PROVIDERS).write_text((ws.bridge / PROVIDERS).read_text() + "# my edit\n")  # modified
    before = checkout_state(ws.bridge)
    proc = ws.invoke("bisect", "--good", history.good, "--max-steps", "2", "--stash", "level0",
                     "--skip-bridge-checks", timeout=600)
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    s = _summary(bisect_dirs(ws)[0])
    assert s["result"] == "stopped" and s["runs"] == 2
    # c6 (the middle) skipped; git's next pick near it (which one depends on commit order within one second)
    # decides the range that remains: after it when it passed (c1..c8), up to it when it failed (c9..c12)
    first, second = s["steps"]
    assert (first["commit"], first["result"], first["mark"]) == (history.c(6), "Blocked", "skip")
    i = history.commits.index(second["commit"])
    assert (second["result"], second["mark"]) == (("Pass", "good") if i < 8 else ("Fail", "bad"))
    want = history.commits[i + 1:] if i < 8 else history.commits[: i + 1]
    assert s["remaining"] == want[::-1]
    assert f"## Range that remains ({len(want)} commits, newest first)" in \
        (bisect_dirs(ws)[0] / "summary.md").read_text()
    # the stashed edits ran nowhere (each step was clean) and are back, byte for byte
    assert all(_run_json(st["run_dir"])["bridge"]["dirty"] == [] for st in s["steps"])
    assert checkout_state(ws.bridge) == before
    assert (ws.bridge / "README.local").read_text() == "my notes\n"
    assert (ws.bridge / PROVIDERS).read_text().endswith("# my edit\n")


def test_a_failure_mid_bisection_restores_the_checkout_and_says_why(workspace, history, monkeypatch, capsys):
    """Whatever breaks inside the loop (here the level cannot be started at all), the user's state comes back."""
    from sessions.bisect import driver as bisect_mod

    ws = workspace
    (ws.bridge / "README.local").write_text("my notes\n")
    before = checkout_state(ws.bridge)
    for key in [k for k in os.environ if k.startswith(("BRIDGE_", "VERL_", "MODEL_", "FIXTURE_"))]:
        monkeypatch.delenv(key)
    for key, value in ws.env.items():
        monkeypatch.setenv(key, value)

    def cannot_start(self):
        raise FileNotFoundError(2, "No such file or directory", "python3.99")

    monkeypatch.setattr(bisect_mod.LevelRunner, "run", cannot_start)
    code = bisect_mod.bisect_command(None, good=history.good, bad=None, repo="bridge", max_steps=None, on=[],
                                     stash=True, task_line=["level0", "--skip-bridge-checks"], remainder="")
    assert code == 3
    s = _summary(bisect_dirs(ws)[0])
    assert s["result"] == "failed" and "FileNotFoundError" in s["error"] and "python3.99" in s["error"]
    assert s["remaining"] == history.commits[::-1]  # nothing was marked: the whole range remains
    assert checkout_state(ws.bridge) == before


@pytest.mark.timeout(900)
def test_ctrl_c_stops_the_level_and_restores_branch_submodule_and_stash(workspace, history, reaper):
    ws = workspace
    (ws.bridge / "README.local").write_text("my notes\n")
    before = checkout_state(ws.bridge)
    env = {**ws.env, "FIXTURE_STEP_SLEEP": "120"}  # the first level run sits in its training step
    proc = subprocess.Popen([sys.executable, "-m", "invoke", "bisect", "--good", history.good, "--stash", "level0",
                             "--skip-bridge-checks"], cwd=PROJECT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    reaper(proc)  # whatever happens below, no bisect, level or trainer outlives the test
    deadline = time.monotonic() + 400  # generous: the event is the log line, not the time
    log = None
    while time.monotonic() < deadline:
        # the level in training (an earlier step may have failed before training: a provider break)
        log = next((p for p in ws.log_dir.glob("*-level0-*/verl.log")
                    if "Total training steps" in p.read_text(errors="replace")), None)
        if log is not None:
            break
        time.sleep(0.5)
    if log is None:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"the level never reached training:\n{out[-4000:]}\n{err[-2000:]}")
    mid = checkout_state(ws.bridge)
    # mid-bisection: the checkout sits at the commit under test (c6 was Blocked in preflight: never in training)
    assert mid["bisecting"] and mid["head"] == _run_json(str(log.parent))["bridge"]["head_full"] != before["head"]
    proc.send_signal(signal.SIGINT)  # to the bisect process itself, as a terminal's Ctrl-C would
    out, err = proc.communicate(timeout=400)
    assert proc.returncode == 130, out[-3000:] + err[-3000:]
    assert checkout_state(ws.bridge) == before
    assert (ws.bridge / "README.local").read_text() == "my notes\n"
    s = _summary(bisect_dirs(ws)[0])
    assert s["result"] == "interrupted" and s["exit_code"] == 130
    assert s["steps"][-1]["result"] == "interrupted" and s["steps"][-1]["mark"] is None
    level = json.loads((log.parent / "summary.json").read_text())
    assert level["category"] == "interrupted"  # the level stopped verl and judged it, not killed mid-write


@pytest.mark.parametrize("args, message", [
    (lambda h: ["--good", h.c(9), "--bad", h.c(3), "level0"], "is not an ancestor of"),
    (lambda h: ["--good", "no-such-ref", "level0"], "unknown ref 'no-such-ref'"),
    (lambda h: ["--good", h.good, "--bad", "v9.9.9", "level0"], "unknown ref 'v9.9.9'"),
    (lambda h: ["--good", h.good, "prep-data"], "'prep-data' is not a level task"),
    (lambda h: ["--good", h.good], "name the level to bisect"),
    (lambda h: ["--bad", h.c(3), "level0"], "--good REF is required"),
    (lambda h: ["--good", h.good, "--on", "oom=maybe", "level0"], "want FAIL-CATEGORY=bad"),
    (lambda h: ["--good", h.good, "--on", "flaky=bad", "level0"], "unknown Fail category 'flaky'"),
    (lambda h: ["--good", h.good, "--max-steps", "0", "level0"], "--max-steps must be >= 1"),
    (lambda h: ["--good", h.good, "--repo", "nemo", "level0"], "--repo must be one of bridge, verl"),
    (lambda h: ["--good", h.good, "level0", "--bogus"], "level0: No idea what '--bogus' is"),
    (lambda h: ["--good", h.good, "level0", "--dry-run"], "drop --dry-run"),
    (lambda h: ["--good", h.c(12), "level0"], "are the same commit"),
    # the Hydra overrides after `--` reach the level's own validation
    (lambda h: ["--good", h.good, "level1", "--", "trainer.default_local_dir=/tmp/x"],
     "level 1 owns trainer.default_local_dir"),
])
def test_bad_usage_is_one_line_exit_2_and_touches_nothing(workspace, history, args, message):
    ws = workspace
    before = checkout_state(ws.bridge)
    proc = ws.invoke("bisect", *args(history), timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("error: ") and message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert checkout_state(ws.bridge) == before
    assert not bisect_dirs(ws) and not ws.run_dirs()


def test_a_dirty_tree_is_refused_with_its_files_named(workspace, history):
    ws = workspace
    (ws.bridge / "README.local").write_text("mine\n")
    (ws.bridge / INIT).write_text((ws.bridge / INIT).read_text() + "# edit\n")
    (ws.bridge / "3rdparty/Megatron-LM/megatron/core/__init__.py").write_text("# edited in the submodule\n")
    before = checkout_state(ws.bridge)
    proc = ws.invoke("bisect", "--good", history.good, "level0", timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "has uncommitted changes: " in proc.stderr and "--stash" in proc.stderr
    for name in ("?? README.local", f" M {INIT}", " M 3rdparty/Megatron-LM/megatron/core/__init__.py"):
        assert name in proc.stderr, name
    assert checkout_state(ws.bridge) == before and not bisect_dirs(ws)


def test_a_bisection_already_in_progress_is_left_alone(workspace, history):
    ws = workspace
    repo = git.Repo(ws.bridge)
    repo.git.bisect("start", history.c(12), history.good)
    head = repo.head.commit.hexsha
    proc = ws.invoke("bisect", "--good", history.good, "level0", timeout=120)
    assert proc.returncode == 2 and "already in progress" in proc.stderr, proc.stderr
    assert repo.head.commit.hexsha == head and (ws.bridge / ".git/BISECT_START").exists()


def test_slurm_runs_the_whole_bisection_as_one_step(workspace, history):
    """`invoke slurm ... bisect ...`: one allocation, the bisection (and every level it runs) inside the step."""
    from env.launchers.slurm import SlurmOptions, plan

    line = ["bisect", "--good", history.good, "--max-steps", "4", "level0", "--skip-bridge-checks", "--", "a=b"]
    step = plan(SlurmOptions(task_line=line, image="verlai/verl:vllm017.latest", dry_run=True,
                             allow_local_logs=True), environ=workspace.env)
    assert step.inner_command == ["python3", "-m", "nox", "-s", "verl", "--", *line]
    assert str(workspace.bridge) in {src for src, _ in step.mounts}  # git bisect runs on the mounted checkout
    bare = plan(SlurmOptions(task_line=line, no_container=True, dry_run=True, allow_local_logs=True),
                environ=workspace.env)
    assert bare.inner_command == [sys.executable, "-m", "invoke", *line]
    assert checkout_state(workspace.bridge)["bisecting"] is False and not bisect_dirs(workspace)
    # the same through the real command line: slurm's flags, then bisect's, then the level's, then `--`
    proc = workspace.invoke("slurm", "--dry-run", "--no-container", "--allow-local-logs", *line, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert shlex.join(line) in proc.stdout, proc.stdout
    assert not bisect_dirs(workspace) and not workspace.run_dirs()


@pytest.mark.ssh
def test_remote_dry_run_forwards_the_bisection_with_the_local_checkouts(tmp_path, sshd, monkeypatch):  # noqa: F811
    """`invoke remote --host H bisect ...`: the bisect line runs on the host against the synced checkouts."""
    from tests.remote_fixtures import Trees

    trees = Trees(tmp_path, sshd, monkeypatch)
    line = ["bisect", "--good", "HEAD", "--on", "oom=bad", "level0", "--bridge-repo", str(trees.bridge), "--model",
            "Qwen/Qwen2.5-0.5B"]
    assert trees.invoke(line, dry_run=True) == 0, trees.err
    assert "-m invoke bisect --good HEAD --on oom=bad level0 --model Qwen/Qwen2.5-0.5B" in trees.out, trees.out
    assert f"BRIDGE_REPO={trees.r_bridge}" in trees.out and "--bridge-repo" not in trees.out.split("remote command")[-1]
    assert not trees.r_bridge.exists()  # dry run: nothing synced


def test_verl_checkout_is_bisected_with_on_rules_and_a_commit_the_level_refuses(workspace):
    """--repo verl: the Bridge stays put; a verl commit without the wrapper (the level refuses it, exit 2, no run
    directory) is skipped; a Fail of category nccl counts as bad only because --on nccl=bad says so."""
    ws = workspace
    repo = git.Repo(ws.verl)
    good = repo.head.commit.hexsha
    wrapper = ws.verl / "tests/special_e2e/run_ppo_trainer_megatron.sh"
    trainer = ws.verl / "verl/trainer/main_ppo.py"
    commits = []
    for n in range(1, 7):
        files = {f"docs/v{n}.md": f"v{n}\n"}
        if n == 3:
            saved = wrapper.read_text()
            wrapper.unlink()
        elif n == 4:
            files[str(wrapper.relative_to(ws.verl))] = saved
        elif n == 5:
            files["verl/trainer/main_ppo.py"] = trainer.read_text().replace(
                'FAIL = os.environ.get("FIXTURE_FAIL", "")', 'FAIL = os.environ.get("FIXTURE_FAIL", "nccl")')
            assert files["verl/trainer/main_ppo.py"] != trainer.read_text()
        commits.append(_commit(repo, f"verl change {n}", files))
    before_bridge, before_verl = checkout_state(ws.bridge), git.Repo(ws.verl).head.commit.hexsha
    proc = ws.invoke("bisect", "--repo", "verl", "--good", good, "--on", "nccl=bad", "level0", "--skip-bridge-checks",
                     timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    s = _summary(bisect_dirs(ws)[0])
    assert s["repo"] == "verl" and s["first_bad"] == commits[4]
    by_commit = {st["commit"]: st for st in s["steps"]}
    refused = by_commit[commits[2]]
    assert refused["mark"] == "skip" and refused["exit_code"] == 2 and refused["run_dir"] is None
    assert "has no tests/special_e2e/run_ppo_trainer_megatron.sh" in refused["first_error"]
    assert (by_commit[commits[4]]["category"], by_commit[commits[4]]["rule"]) == \
        ("nccl", "Fail/nccl → bad (--on nccl=bad)")
    assert checkout_state(ws.bridge) == before_bridge
    assert git.Repo(ws.verl).head.commit.hexsha == before_verl and git.Repo(ws.verl).active_branch.name == "main"
    assert not git.Repo(ws.verl).is_dirty(untracked_files=True)
