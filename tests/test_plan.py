"""`invoke plan`: levels from the Bridge change (real git checkouts: commits, uncommitted and untracked files),
and `plan --run` through the real `invoke levelN` tasks against the fixture verl checkout.
"""

from __future__ import annotations

import json
from pathlib import Path

import git
import pytest

from env import plan_rules
from sessions.plan import read_change, recommend

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


def _levels(plan) -> dict[tuple, set[str]]:
    return {(e.level, e.variant, e.feature): {r.rule for r in e.reasons} for e in plan.entries}


# One change per rule: (files written and committed on a feature branch, the entry and rule it must produce).
RULE_CASES = {
    "provider": ({SRC + "models/qwen/qwen3_bridge.py": "class Qwen3Bridge:\n    hidden = 8\n"}, (0, None, None)),
    "hf-import": ({SRC + "models/conversion/mapping_registry.py": "REGISTRY = {}\n"}, (0, None, None)),
    "peft": ({SRC + "peft/lora.py": "class LoRA:\n    pass\n"}, (1, None, None)),
    "checkpointing": ({SRC + "training/checkpointing.py": "X = 1\n"}, (1, None, None)),
    "hf-export": ({SRC + "models/conversion/auto_bridge.py": "def save_hf_pretrained(model, path):\n    pass\n"},
                  (1, None, None)),
    "adapter-export": ({SRC + "models/conversion/peft_bridge.py": "def export_adapter_weights(m):\n    pass\n"},
                       (1, None, None)),
    "optimizer-state": ({SRC + "training/optim.py": "def setup():\n    pass\n"}, (1, None, None)),
    "resume": ({SRC + "training/train.py": "def step(state):\n    resume_iteration = state.it\n"}, (1, None, None)),
    "provider-finalization": ({SRC + "models/model_provider.py": "def finalize(self):\n    return self\n"},
                              (2, "dense", None)),
    "mpu-derived": ({SRC + "models/gpt_provider.py":
                     "from megatron.core import parallel_state\nn = parallel_state.get_tensor_model_parallel_world_size()\n"},
                    (2, "dense", None)),
    "tp-pp-cp": ({SRC + "models/llama/llama_bridge.py": "cfg.pipeline_model_parallel_size = 2\n"}, (2, "dense", None)),
    "sequence-parallel": ({SRC + "models/common/heads.py": "sequence_parallel = True\n"}, (2, "dense", None)),
    "expert-parallel": ({SRC + "models/olmoe/olmoe_provider.py": "expert_model_parallel_size = 2\n"},
                        (2, "moe", None)),
    "dispatcher": ({SRC + "training/flex_dispatcher_backend.py": "BACKEND = 'deepep'\n"}, (2, "moe", None)),
    "megatron-fsdp": ({SRC + "training/fsdp_compat.py": "X = 1\n"}, (3, None, None)),
    "vlm": ({SRC + "models/qwen_vl/qwen3_vl_provider.py": "class P:\n    pass\n"}, (4, None, "vlm")),
    "moe": ({SRC + "models/qwen/qwen3_moe_bridge.py": "class B:\n    pass\n"}, (4, None, "moe")),
    "mtp": ({SRC + "models/deepseek/deepseek_v3_bridge.py": "mtp_num_layers = 1\n"}, (4, None, "mtp")),
    "qat-modelopt": ({SRC + "models/conversion/modelopt_utils.py": "X = 1\n"}, (4, None, "qat")),
    "quantized-weights": ({SRC + "models/conversion/quant_bridge.py": "X = 1\n"}, (4, None, "quantized")),
    "custom-layer": ({SRC + "models/gemma/modules.py": "class Norm:\n    pass\n"}, (4, None, "custom-layer")),
    "optimizer": ({SRC + "training/optim.py": "cfg = OptimizerConfig(weight_decay=0.1)\n"}, (5, None, None)),
    "scheduler": ({SRC + "training/train.py": "sched = OptimizerParamScheduler(opt)\n"}, (5, None, None)),
    "loss": ({SRC + "training/losses.py": "def loss_func(x):\n    return x\n"}, (5, None, None)),
    "reward": ({SRC + "training/gpt_step.py": "reward_scale = 1.0\n"}, (5, None, None)),
    "peft-trainability": ({SRC + "peft/lora.py": "def freeze(p):\n    p.requires_grad = False\n"}, (5, None, None)),
    "gradient-flow": ({SRC + "training/utils/train_utils.py": "g = param.main_grad\n"}, (5, None, None)),
    "megatron-lm": ({}, (0, None, None)),  # the submodule commit moves (see test)
}


def test_every_rule_has_a_case():
    assert set(RULE_CASES) | {"bridge-source"} == {r.name for r in plan_rules.RULES}


@pytest.mark.parametrize("rule", sorted(RULE_CASES))
def test_rule_fires_on_its_files(workspace, rule):
    files, key = RULE_CASES[rule]
    if rule == "megatron-lm":
        sub = git.Repo(workspace.bridge / "3rdparty/Megatron-LM")
        (workspace.bridge / "3rdparty/Megatron-LM/new.py").write_text("x = 1\n")
        sub.git.add("-A")
        sub.index.commit("bump")
    _feature_commit(workspace.bridge, files)
    plan = recommend(read_change(workspace.bridge))
    levels = _levels(plan)
    assert key in levels, (rule, levels)
    assert rule in levels[key]
    reason = next(r for e in plan.entries if (e.level, e.variant, e.feature) == key for r in e.reasons
                  if r.rule == rule)
    assert reason.files == (list(files) or ["3rdparty/Megatron-LM"])
    assert (0, None, None) in levels  # Level 0 always comes with any level
    assert plan.entries[0].level == 0
    assert [e.level for e in plan.entries] == sorted(e.level for e in plan.entries)
    if key[0] != 3:
        assert all(e.level != 3 for e in plan.entries)
        assert plan_rules.FSDP_ON_REQUEST in plan.notes
    else:
        assert plan_rules.FSDP_ON_REQUEST not in plan.notes


def test_plain_provider_change_asks_level0_only_with_family_checkpoint(workspace):
    _feature_commit(workspace.bridge, {SRC + "models/qwen/qwen3_bridge.py": "class Qwen3Bridge:\n    hidden = 8\n"})
    plan = recommend(read_change(workspace.bridge))
    assert [(e.level, e.variant, e.feature) for e in plan.entries] == [(0, None, None)]
    assert plan.entries[0].model == "Qwen/Qwen3-0.6B"
    assert [h.family for h in plan.families] == ["qwen3"]


def test_moe_expert_change_gets_level2_moe_with_a_moe_checkpoint(workspace):
    _feature_commit(workspace.bridge, {SRC + "models/qwen/qwen3_moe_bridge.py":
                                       "class B:\n    num_moe_experts = 128\n    moe_router_topk = 8\n"})
    plan = recommend(read_change(workspace.bridge))
    by_key = {(e.level, e.variant, e.feature): e for e in plan.entries}
    assert (2, "moe", None) in by_key and (4, None, "moe") in by_key
    assert (2, "dense", None) not in by_key
    assert by_key[(2, "moe", None)].model == "Qwen/Qwen3-30B-A3B"


def test_uncommitted_and_untracked_new_provider_count(workspace):
    # Nothing committed: an edited tracked file and a new, untracked provider family.
    providers = workspace.bridge / "src/megatron/bridge/providers.py"
    providers.write_text(providers.read_text() + "VERSION = 2\n")
    new = SRC + "models/newarch/newarch_provider.py"
    _write(workspace.bridge, new, "class NewArchProvider:\n    hidden_size = 64\n")
    change = read_change(workspace.bridge)
    by_path = {f.path: f for f in change.files}
    assert by_path[new].origins == ["untracked"] and by_path[new].status == "??"
    assert by_path["src/megatron/bridge/providers.py"].origins == ["uncommitted"]
    plan = recommend(change)
    level0 = plan.entries[0]
    assert level0.level == 0
    rules = {r.rule: r.files for r in level0.reasons}
    assert rules["provider"] == [new]
    assert rules["bridge-source"] == ["src/megatron/bridge/providers.py"]
    # An unknown family: no public checkpoint, the dummy-model path with a minimal config instead.
    assert plan.families[0].family == "newarch" and plan.families[0].checkpoint is None
    assert level0.model is None and level0.dummy["USE_DUMMY_MODEL"] == "True"
    assert level0.dummy["minimal_config"]["num_hidden_layers"] == 2


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
    _feature_commit(clone, {SRC + "training/losses.py": "def loss_func(x):\n    return x\n"})
    out = workspace.invoke("plan", "--json", "--bridge-repo", str(clone), check=True)
    data = json.loads(out.stdout)
    assert data["base"] == "origin/main"
    assert data["counts"]["committed"] == 1
    assert [(e["level"], e.get("variant")) for e in data["recommendation"]] == [(0, None), (5, None)]
    assert data["recommendation"][1]["reasons"][0] == {
        "rule": "loss", "files": [SRC + "training/losses.py"], "why": plan_rules.BY_NAME["loss"].reason}
    bad = workspace.invoke("plan", "--base", "no-such-ref", "--bridge-repo", str(clone))
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [f"error: --base 'no-such-ref' is not a commit or branch of {clone}"]
    assert "Traceback" not in bad.stdout + bad.stderr


def test_json_recommendation_shape(workspace):
    _feature_commit(workspace.bridge, {SRC + "models/qwen_vl/qwen3_vl_provider.py": "class P:\n    pass\n",
                                       SRC + "models/model_provider.py": "def finalize(self):\n    pass\n"})
    data = json.loads(workspace.invoke("plan", "--json", check=True).stdout)
    recs = data["recommendation"]
    assert [r["level"] for r in recs] == [0, 2, 4]
    assert recs[1]["variant"] == "dense" and "feature" not in recs[1]
    assert recs[2]["feature"] == "vlm" and "variant" not in recs[2]
    for r in recs:
        assert isinstance(r["level"], int) and r["reasons"]
        assert all(set(x) == {"rule", "files", "why"} for x in r["reasons"])
    assert data["families"][0]["family"] == "qwen3-vl"


def test_run_stops_at_failing_level0_and_skips_the_rest(workspace):
    # PEFT (→ 1) and finalization (→ 2) changed; the fixture trainer fails while building the provider.
    _feature_commit(workspace.bridge, {SRC + "peft/lora.py": "class LoRA:\n    pass\n",
                                       SRC + "models/model_provider.py": "def finalize(self):\n    pass\n"})
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


def test_keep_going_runs_every_level(workspace):
    _feature_commit(workspace.bridge, {SRC + "peft/lora.py": "class LoRA:\n    pass\n"})
    proc = workspace.invoke("plan", "--run", "--keep-going", "--skip-bridge-checks", "--json",
                            env={"FIXTURE_FAIL": "provider"})
    summary = json.loads(proc.stdout)
    assert [(lv["level"], lv["status"]) for lv in summary["levels"]] == [(0, "Fail"), (1, "Fail")]
    assert len(workspace.run_dirs()) == 2
    assert proc.returncode == 1


def test_run_dry_run_runs_nothing(workspace):
    _feature_commit(workspace.bridge, {SRC + "peft/lora.py": "class LoRA:\n    pass\n"})
    proc = workspace.invoke("plan", "--run", "--dry-run", "--skip-bridge-checks")
    assert proc.returncode == 0, proc.stderr
    assert "invoke level0 --skip-bridge-checks --dry-run" in proc.stdout
    assert "invoke level1 --skip-bridge-checks --dry-run" in proc.stdout
    assert "SAVE_FREQ=1" in proc.stdout  # level 1's own dry-run printed its environment
    assert not workspace.log_dir.exists() or list(workspace.log_dir.iterdir()) == []


def test_run_passes_when_every_level_passes(workspace):
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
