"""`invoke plan`: levels from the Bridge change (real git checkouts: commits, uncommitted and untracked files),
and `plan --run` through the real `invoke levelN` tasks against the fixture verl checkout.
"""

from __future__ import annotations

import json
from pathlib import Path

import git

from sessions.plan.planner import analyse, read_change, recommend

SRC = "src/megatron/bridge/"


def _write(repo: Path, rel: str, text: str) -> None:
    path = repo / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _feature_commit(repo: Path, files: dict[str, str], message: str = "change") -> git.Repo:
    r = git.Repo(repo)
    if r.active_branch.name == "main":
        r.git.checkout("-b", "feature")
    for rel, text in files.items():
        _write(repo, rel, text)
    r.git.add("-A")
    r.index.commit(message)
    return r


def _verl_uses(ws, *lines: str) -> None:
    """The workspace's verl checkout imports these Bridge names (as real verl imports AutoBridge, create_peft...)."""
    path = ws.verl / "verl" / "bridge_use.py"
    path.write_text("\n".join(lines) + "\n")
    job = ws.verl / "verl" / "trainer" / "main_ppo.py"  # the RL job loads it, as real verl's job loads its workers
    job.write_text(job.read_text() + "\n\ndef _bridge_use():\n    import verl.bridge_use  # noqa: F401\n")
    r = git.Repo(ws.verl)
    r.git.add("-A")
    r.index.commit("verl uses Bridge")


def _plan(ws):
    change = read_change(ws.bridge)
    return recommend(change, analyse(change, ws.verl))


def test_uncommitted_and_untracked_files_count(workspace):
    # Nothing committed: an edited tracked file verl imports and a new, untracked provider family nothing imports.
    _verl_uses(workspace, "from megatron.bridge.providers import provide")
    providers = workspace.bridge / "src/megatron/bridge/providers.py"
    providers.write_text(providers.read_text().replace('"tensor_model_parallel_size": 1', '"hidden": 8'))
    new = SRC + "models/newarch/newarch_provider.py"
    _write(workspace.bridge, new, "class NewArchProvider:\n    hidden_size = 64\n")
    change = read_change(workspace.bridge)
    by_path = {f.path: f for f in change.files}
    assert by_path[new].origins == ["untracked"] and by_path[new].status == "??"
    assert by_path["src/megatron/bridge/providers.py"].origins == ["uncommitted"]
    plan = recommend(change, analyse(change, workspace.verl))
    assert [e.key for e in plan.entries] == ["L0"]
    assert [(r.rule, r.files) for r in plan.entries[0].reasons] == [
        ("verl-runs-it", ["src/megatron/bridge/providers.py"])]
    assert plan.entries[0].reasons[0].units[0]["unit"] == "provide"
    # the untracked family is not imported by anything verl reaches: it justifies nothing, and says so
    assert plan.notes[0].startswith("not on verl's path (verl never imports these; Bridge's own training loop, "
                                    "recipes or scripts): src/megatron/bridge/models/newarch/newarch_provider.py")


def test_docs_only_change_recommends_nothing_and_says_so(workspace):
    _feature_commit(workspace.bridge, {"docs/models/qwen.md": "# Qwen\n", "README.md": "# Bridge\n"})
    _write(workspace.bridge, "docs/new.rst", "x\n")  # untracked doc too
    proc = workspace.invoke("plan")
    assert proc.returncode == 0, proc.stderr
    assert "Documentation-only change (3 file(s))" in proc.stdout
    assert "nothing recommended" in proc.stdout
    assert "Recommended levels" not in proc.stdout
    data = json.loads(workspace.invoke("plan", "--json", check=True).stdout)
    assert data["docs_only"] is True and data["recommendation"] == []
    run = workspace.invoke("plan", "--run")
    assert run.returncode == 0 and "Nothing to run." in run.stdout
    assert workspace.run_dirs() == []


def test_no_change_says_so(workspace):
    data = json.loads(workspace.invoke("plan", "--json", check=True).stdout)
    assert data["recommendation"] == [] and data["docs_only"] is False
    assert data["message"].startswith("no change against main")


def test_default_base_is_origin_main_and_bad_base_is_one_line(workspace, tmp_path):
    clone = tmp_path / "clone"
    git.Repo(workspace.bridge).clone(clone)
    r = git.Repo(clone)
    with r.config_writer() as cw:
        cw.set_value("user", "name", "t")
        cw.set_value("user", "email", "t@example.com")
    _verl_uses(workspace, "from megatron.bridge.training.losses import loss_func")
    _feature_commit(clone, {SRC + "training/losses.py": "def loss_func(x):\n    return x\n"})
    out = workspace.invoke("plan", "--json", "--bridge-repo", str(clone), check=True)
    data = json.loads(out.stdout)
    assert data["base"] == "origin/main"
    assert data["counts"]["committed"] == 1
    assert [(e["level"], e.get("variant")) for e in data["recommendation"]] == [(0, None), (5, None)]
    loss = data["recommendation"][1]["reasons"][0]
    assert (loss["rule"], loss["files"], loss["why"]) == (
        "loss", [SRC + "training/losses.py"], "loss changed: actor/critic losses must stay finite and move")
    assert [(u["unit"], u["tier"], u["matched"]) for u in loss["units"]] == [("loss_func", "calls", ["loss_func"])]
    assert loss["units"][0]["path"] == [
        "loss_func [verl calls loss_func (verl/bridge_use.py:1)]"]
    bad = workspace.invoke("plan", "--base", "no-such-ref", "--bridge-repo", str(clone))
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [f"error: --base 'no-such-ref' is not a commit or branch of {clone}"]
    assert "Traceback" not in bad.stdout + bad.stderr


def test_json_recommendation_shape(workspace):
    _verl_uses(workspace, "from megatron.bridge.models.qwen_vl.qwen3_vl_provider import P",
               "from megatron.bridge.models.model_provider import finalize")
    _feature_commit(workspace.bridge, {SRC + "models/qwen_vl/qwen3_vl_provider.py":
                                       "class P:\n    vision_config = None\n    pixel_values = 1\n",
                                       SRC + "models/model_provider.py":  # finalize reads a parallel size
                                       "def finalize(self):\n    self.tp = self.tensor_model_parallel_size\n"})
    data = json.loads(workspace.invoke("plan", "--json", check=True).stdout)
    recs = data["recommendation"]
    assert [r["level"] for r in recs] == [0, 2, 4]
    assert recs[1]["variant"] == "dense" and "feature" not in recs[1]
    assert recs[2]["feature"] == "vlm" and "variant" not in recs[2]
    for r in recs:
        assert isinstance(r["level"], int) and r["reasons"]
        assert all(set(x) == {"rule", "files", "why", "units"} for x in r["reasons"])
    assert data["families"][0]["family"] == "qwen3-vl"


def test_run_stops_at_failing_level0_and_skips_the_rest(workspace):
    # PEFT (→ 1) and finalization (→ 2) changed; the fixture trainer fails while building the provider.
    _verl_uses(workspace, "from megatron.bridge.peft.lora import LoRA",
               "from megatron.bridge.models.model_provider import finalize")
    _feature_commit(workspace.bridge, {SRC + "peft/lora.py": "class LoRA:\n    pass\n",
                                       SRC + "models/model_provider.py":
                                       "def finalize(self):\n    self.tp = self.tensor_model_parallel_size\n"})
    proc = workspace.invoke("plan", "--run", "--skip-bridge-checks", "--json", env={"FIXTURE_FAIL": "provider"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["result"] == "Fail"
    levels = summary["levels"]
    assert [(lv["level"], lv["status"]) for lv in levels] == [(0, "Fail"), (1, "Skipped"), (2, "Skipped")]
    level0_dir = Path(levels[0]["run_dir"])
    assert level0_dir.is_dir() and json.loads((level0_dir / "summary.json").read_text())["result"] == "Fail"
    for lv in levels[1:]:
        assert lv["run_dir"] is None
        assert lv["reason"].startswith("not run: Level 0 was Fail")
    # Only Level 0 ran: one level run directory, plus the plan's own.
    assert workspace.run_dirs() == [level0_dir]
    plan_dir = Path(summary["run_dir"])
    assert plan_dir.parent == workspace.log_dir and "-plan-" in plan_dir.name
    md = (plan_dir / "summary.md").read_text()
    assert md.startswith("Result: Fail - Level 0 (LoRA + DDP smoke) Fail")
    for name in ("Bridge-side checks", "Local Bridge import in verl", "verl Megatron backend run",
                 "Requested variants", "Log capture"):
        assert f"\n- {name}: " in md
    assert "- verl Megatron backend run: Fail - Level 0: Fail" in md
    assert "- Requested variants: Skipped - Level 1: Skipped - not run: Level 0 was Fail" in md
    assert "## Level 0 (LoRA + DDP smoke): Fail" in md
    assert "## Level 1 (save/resume): Skipped" in md
    assert "## Level 2 --variant dense (parallel stress): Skipped" in md
    assert (level0_dir / "summary.md").read_text().strip() in md  # the level's own section, verbatim
    junit = (plan_dir / "junit.xml").read_text()
    assert junit.count("<testcase") == 3 and 'failures="1"' in junit and 'skipped="2"' in junit
    assert json.loads((plan_dir / "plan.json").read_text())["recommendation"][0]["level"] == 0


def test_run_blocked_in_preflight_is_a_blocked_plan(workspace, tmp_path):
    # Level 0 stops in preflight (its data file is missing): its import deliverables are "Not shown"; the plan's
    # combined report says Blocked (not Pass, not a traceback) and runs nothing after it.
    _verl_uses(workspace, "from megatron.bridge.peft.lora import LoRA")
    _feature_commit(workspace.bridge, {SRC + "peft/lora.py": "class LoRA:\n    pass\n"})
    proc = workspace.invoke("plan", "--run", "--skip-bridge-checks", "--json",
                            env={"TRAIN_FILES": str(tmp_path / "missing.parquet")})
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["result"] == "Blocked"
    assert [(lv["level"], lv["status"]) for lv in summary["levels"]] == [(0, "Blocked"), (1, "Skipped")]
    level0 = json.loads((Path(summary["levels"][0]["run_dir"]) / "summary.json").read_text())
    assert "Not shown" in {d["status"] for d in level0["deliverables"]}
    combined = {d["name"]: d["status"] for d in summary["deliverables"]}
    assert "Pass" not in combined.values() and combined["Local Bridge import in verl"] == "Not shown"


def test_keep_going_runs_every_level(workspace):
    _verl_uses(workspace, "from megatron.bridge.peft.lora import LoRA")
    _feature_commit(workspace.bridge, {SRC + "peft/lora.py": "class LoRA:\n    pass\n"})
    proc = workspace.invoke("plan", "--run", "--keep-going", "--skip-bridge-checks", "--json",
                            env={"FIXTURE_FAIL": "provider"})
    summary = json.loads(proc.stdout)
    assert [(lv["level"], lv["status"]) for lv in summary["levels"]] == [(0, "Fail"), (1, "Fail")]
    assert len(workspace.run_dirs()) == 2
    assert proc.returncode == 1


def test_run_dry_run_runs_nothing(workspace):
    _verl_uses(workspace, "from megatron.bridge.peft.lora import LoRA")
    _feature_commit(workspace.bridge, {SRC + "peft/lora.py": "class LoRA:\n    pass\n"})
    proc = workspace.invoke("plan", "--run", "--dry-run", "--skip-bridge-checks")
    assert proc.returncode == 0, proc.stderr
    assert "invoke level0 --skip-bridge-checks --dry-run" in proc.stdout
    assert "invoke level1 --skip-bridge-checks --dry-run" in proc.stdout
    assert "SAVE_FREQ=1" in proc.stdout  # level 1's own dry-run printed its environment
    # no run directory (preflight's probe cache, a dotfile, may be there)
    assert not workspace.log_dir.exists() or [p for p in workspace.log_dir.iterdir() if not p.name.startswith(".")] == []


def test_run_passes_when_every_level_passes(workspace):
    _verl_uses(workspace, "from megatron.bridge.peft.lora import LoRA")
    _feature_commit(workspace.bridge, {SRC + "peft/lora.py": "class LoRA:\n    pass\n"})
    proc = workspace.invoke("plan", "--run", "--skip-bridge-checks", "--no-reward-model")
    plan_dir = next(workspace.log_dir.glob("*-plan-*"))
    summary = json.loads((plan_dir / "summary.json").read_text())
    assert [(lv["level"], lv["status"]) for lv in summary["levels"]] == [(0, "Pass"), (1, "Pass")], proc.stdout
    assert summary["result"] == "Pass" and proc.returncode == 0
    assert "Result: Pass - every recommended level passed (Level 0, Level 1)." in proc.stdout
    assert "- Requested variants: Pass - Level 1: Pass - save/resume" in proc.stdout
    assert all("--no-reward-model" in lv["command"] for lv in summary["levels"])


def test_model_proposal_is_used_when_the_user_chose_none(workspace):
    _verl_uses(workspace, "from megatron.bridge.models.qwen.qwen3_bridge import Qwen3Bridge")
    _feature_commit(workspace.bridge, {SRC + "models/qwen/qwen3_bridge.py": "class Qwen3Bridge:\n    pass\n"})
    env = {k: v for k, v in workspace.env.items() if k not in ("MODEL_ID", "MODEL_PATH")}
    workspace.env = env
    proc = workspace.invoke("plan", check=True)
    assert "Provider family: qwen3 (1 file(s)) → Qwen/Qwen3-0.6B" in proc.stdout
    assert "invoke level0 --model Qwen/Qwen3-0.6B" in proc.stdout
    chosen = workspace.invoke("plan", "--model", "Qwen/Qwen3-1.7B", check=True)
    assert "invoke level0 --model Qwen/Qwen3-1.7B" in chosen.stdout


def test_bad_bridge_repo_is_one_line(workspace, tmp_path):
    proc = workspace.invoke("plan", "--bridge-repo", str(tmp_path / "nowhere"))
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: BRIDGE_REPO {tmp_path / 'nowhere'} does not exist"
    bad_model = workspace.invoke("plan", "--model", "not a model")
    assert bad_model.returncode == 2 and bad_model.stderr.startswith("error: --model must look like ORG/NAME")


def test_verl_checkout_that_uses_no_bridge_is_one_line(workspace):
    _feature_commit(workspace.bridge, {SRC + "peft/lora.py": "class LoRA:\n    pass\n"})
    # the fixture verl imports Bridge like verl v0.9.0 (model build, checkpoint manager): this one imports nothing
    import subprocess
    for rel in ("verl/models/mcore/bridge.py", "verl/utils/megatron_utils.py",
                "verl/utils/checkpoint/megatron_checkpoint_manager.py"):
        (workspace.verl / rel).unlink()
    subprocess.run(["git", "-C", str(workspace.verl), "commit", "-qam", "no Bridge"], check=True, capture_output=True)
    proc = workspace.invoke("plan")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"error: verl checkout {workspace.verl} imports nothing from megatron.bridge: it "
                                   "cannot tell what verl reaches (is it a verl checkout with the Megatron-Bridge "
                                   "backend?)")
    workspace.env = {k: v for k, v in workspace.env.items() if k != "VERL_REPO"}
    unset = workspace.invoke("plan")
    assert unset.returncode == 2 and "Traceback" not in unset.stderr
    assert unset.stderr.strip() == ("error: VERL_REPO is not set (--verl-repo or VERL_REPO): the plan reads which "
                                    "Bridge names verl uses from the verl checkout")


def test_a_git_checkout_that_is_no_bridge_is_one_line_and_left_alone(workspace, tmp_path):
    other = tmp_path / "other"
    r = git.Repo.init(other, initial_branch="main")
    with r.config_writer() as cw:
        cw.set_value("user", "name", "t")
        cw.set_value("user", "email", "t@example.com")
    _write(other, "a.py", "x = 1\n")
    r.git.add("-A")
    r.index.commit("not a Bridge")
    _write(other, "a.py", "x = 2\n")  # a dirty tree: the plan reads it and changes nothing
    head = r.head.commit.hexsha
    proc = workspace.invoke("plan", "--bridge-repo", str(other), "--base", "HEAD")
    assert proc.returncode == 2 and "Traceback" not in proc.stdout + proc.stderr
    assert proc.stderr.strip() == (f"error: BRIDGE_REPO {other} is not a Megatron-Bridge checkout (no "
                                   "src/megatron package)")
    assert r.head.commit.hexsha == head and (other / "a.py").read_text() == "x = 2\n"
    # the package's name before its rename (megatron.hub): verl's imports reach none of it, so no plan either
    _write(other, "src/megatron/hub/peft/lora.py", "class LoRA:\n    rank = 2\n")
    old = workspace.invoke("plan", "--bridge-repo", str(other), "--base", "HEAD")
    assert old.returncode == 2 and "Traceback" not in old.stdout + old.stderr
    assert old.stderr.strip() == (f"error: BRIDGE_REPO {other} names its package megatron.hub (before its rename to "
                                  "megatron.bridge): verl imports megatron.bridge, so no verl level can run against "
                                  "this checkout and the plan cannot follow verl's calls into it")
    assert (other / "src/megatron/hub/peft/lora.py").read_text() == "class LoRA:\n    rank = 2\n"
    # a dirty Bridge tree is part of the change, never reset or overwritten
    _write(workspace.bridge, SRC + "peft/lora.py", "class LoRA:\n    rank = 2\n")
    before = git.Repo(workspace.bridge).head.commit.hexsha
    ok = workspace.invoke("plan", "--json", check=True)
    assert json.loads(ok.stdout)["counts"]["uncommitted"] + json.loads(ok.stdout)["counts"]["untracked"] == 1
    assert (workspace.bridge / SRC / "peft/lora.py").read_text() == "class LoRA:\n    rank = 2\n"
    assert git.Repo(workspace.bridge).head.commit.hexsha == before
