"""`nox -s bridge_unit` with the real nox and the real uv against the fixture Bridge checkout, and the level's use
of its records (matching state reused; other commit or dirty state ignored; run by the level when none matches).

The fixture Bridge keeps pytest in its `test` dependency group, as Megatron-Bridge does at HEAD: a plain `uv sync`
would leave it out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import git
import pytest

from env.repos import bridge_state
from sessions.bridge_unit.records import find_record, records_dir
from sessions.bridge_unit.session import check_paths, environment_gap, junit_counts
from tests.conftest import PROJECT

MIXIN = "tests/unit_tests/models/test_model_provider_mixin.py"
MAPPING = "tests/unit_tests/models/test_param_mapping.py"
INTEGRATION = "tests/unit_tests/training/test_integration.py"


def nox_bridge_unit(workspace, *posargs: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "nox", "-f", str(PROJECT / "noxfile.py"), "-s", "bridge_unit", "--", *posargs],
        cwd=PROJECT, env={**workspace.env, **(env or {})}, capture_output=True, text=True, timeout=300)


def record_for(workspace) -> dict:
    record = find_record(workspace.log_dir, bridge_state(workspace.bridge))
    assert record is not None, list(records_dir(workspace.log_dir).glob("*"))
    return record


def commit(workspace, message: str) -> None:
    repo = git.Repo(workspace.bridge)
    repo.git.add("-A")
    repo.index.commit(message)


def break_test(workspace) -> None:
    path = workspace.bridge / MAPPING
    path.write_text(path.read_text() + "\n\ndef test_mapping_regression():\n    assert {'a': 1} == {'a': 2}\n")


def summary_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def deliverable(summary: dict, name: str) -> dict:
    return next(d for d in summary["deliverables"] if d["name"] == name)


# --- the session -------------------------------------------------------------------------------------------------

def test_passing_run_is_recorded_and_leaves_the_checkout_as_it_was(workspace):
    extra = "tests/unit_tests/models/qwen/test_qwen3_provider.py"
    (workspace.bridge / extra).parent.mkdir()
    (workspace.bridge / extra).write_text("def test_qwen3():\n    assert 2 + 2 == 4\n")
    commit(workspace, "qwen3 provider test")
    before = bridge_state(workspace.bridge)

    proc = nox_bridge_unit(workspace, extra)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "4 passed" in proc.stdout
    after = bridge_state(workspace.bridge)
    assert after.fingerprint == before.fingerprint and after.dirty == []  # .venv ignored, uv.lock committed
    assert (workspace.bridge / ".venv").is_dir()  # uv made the Bridge's own environment

    record = record_for(workspace)
    assert record["result"] == "Pass"
    assert record["counts"] == {"passed": 4, "failed": 0, "errors": 0, "skipped": 0}
    assert record["missing_paths"] == [] and record["paths"][-1] == extra
    assert ("HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 uv run --no-sync python -m pytest -q -m 'not pleasefixme' "
            "--junitxml=") in record["command"] and record["command"].endswith(extra)
    assert record["sync"] == "uv sync --locked --group test"
    assert record["environment"] == str(workspace.bridge / ".venv") and record["blocked_by"] is None
    assert Path(record["junit"]).is_file() and record["duration_s"] > 0
    assert record["bridge"]["head"] == before.head


def test_failing_test_is_fail_with_counts(workspace):
    clean = bridge_state(workspace.bridge)
    break_test(workspace)
    proc = nox_bridge_unit(workspace)
    assert proc.returncode != 0
    assert "Bridge-side checks Fail: tests failed (pytest exit 1): 3 passed, 1 failed" in proc.stderr + proc.stdout
    record = record_for(workspace)
    assert record["result"] == "Fail" and record["counts"]["failed"] == 1 and record["counts"]["passed"] == 3
    assert f" M {MAPPING}" in record["bridge"]["dirty"]
    assert record["fingerprint"] != clean.fingerprint
    assert find_record(workspace.log_dir, clean) is None  # the clean state has no record


def test_renamed_targeted_path_is_traced_to_its_new_name(workspace):
    repo = git.Repo(workspace.bridge)
    moved = "tests/unit_tests/training/test_training_integration.py"
    repo.git.mv(INTEGRATION, moved)
    commit(workspace, "rename integration test")
    sha = repo.head.commit.hexsha

    proc = nox_bridge_unit(workspace)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert (f"missing at {sha[:7]}: {INTEGRATION}: renamed to {moved} by {sha[:9]} "
            f"({repo.head.commit.committed_datetime:%Y-%m-%d}) 'rename integration test'; that commit carries the "
            f"tests on in: {moved}") in out
    assert f"nox -s bridge_unit -- --allow-missing {moved} (a level: --allow-missing --bridge-tests {moved})" in out
    assert "exit 4" not in out
    record = record_for(workspace)
    assert record["result"] == "Blocked" and record["missing_paths"] == [INTEGRATION]
    assert record["blocked_by"] == "missing-path" and record["successors"] == {INTEGRATION: [moved]}
    assert record["junit"] is None and record["pytest_exit"] is None  # pytest never ran

    proc = nox_bridge_unit(workspace, "--allow-missing")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = record_for(workspace)
    assert record["result"] == "Pass" and record["missing_paths"] == [INTEGRATION]
    assert record["counts"]["passed"] == 2 and INTEGRATION not in record["command"]


def make_pull_request_split(workspace) -> tuple[str, str]:
    """The real case's shape (Megatron-Bridge PR #3813): main never had the integration test; on the PR branch one
    commit added it and a later one moved its tests into existing and new test files; main got the PR squashed.
    Returns (the PR commit that deleted it, the main commit that landed the PR)."""
    repo = git.Repo(workspace.bridge)
    integration = (workspace.bridge / INTEGRATION).read_text()
    repo.git.checkout("--orphan", "trunk")
    repo.git.rm("-q", "-f", INTEGRATION)
    commit(workspace, "Bridge without the integration test")
    repo.git.branch("-D", "main")
    repo.git.branch("-m", "main")
    repo.git.checkout("-b", "feature")
    (workspace.bridge / INTEGRATION).parent.mkdir(parents=True, exist_ok=True)
    (workspace.bridge / INTEGRATION).write_text(integration)
    commit(workspace, "Add external trainer helpers")
    (workspace.bridge / "tests/unit_tests/peft").mkdir(parents=True)
    (workspace.bridge / "tests/unit_tests/peft/test_utils.py").write_text(
        "import json\n\n\ndef test_lora_targets_round_trip():\n"
        "    targets = {'linear_qkv': 4, 'linear_proj': 4}\n    assert json.loads(json.dumps(targets)) == targets\n")
    mapping = workspace.bridge / MAPPING
    mapping.write_text(mapping.read_text() + "\n\ndef test_mapping_moved_here():\n    assert True\n")
    repo.git.rm("-q", INTEGRATION)
    commit(workspace, "Move integration tests into the module test files")
    pr_sha = repo.head.commit.hexsha
    repo.git.update_ref("refs/pull/42/head", pr_sha)
    repo.git.checkout("main")
    repo.git.merge("--squash", "feature")
    commit(workspace, "Add external trainer helpers (#42)")
    repo.git.branch("-D", "feature")  # a clone has the PR only under refs/pull
    return pr_sha, repo.head.commit.hexsha


def test_deleted_targeted_path_is_traced_through_the_pull_request_that_removed_it(workspace):
    pr_sha, main_sha = make_pull_request_split(workspace)
    peft = "tests/unit_tests/peft/test_utils.py"

    proc = nox_bridge_unit(workspace)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    day = git.Repo(workspace.bridge).head.commit.committed_datetime.strftime("%Y-%m-%d")
    assert (f"{INTEGRATION}: deleted by {pr_sha[:9]} ({day}) 'Move integration tests into the module test files' on "
            f"PR #42's branch, landed here as {main_sha[:9]} ({day}) 'Add external trainer helpers (#42)'; that "
            f"commit carries the tests on in: {MAPPING}, {peft}") in out
    # the targeted mapping test runs anyway: the offer adds only the new file
    assert f"nox -s bridge_unit -- --allow-missing {peft} (a level: --allow-missing --bridge-tests {peft})" in out
    assert record_for(workspace)["successors"] == {INTEGRATION: [MAPPING, peft]}

    proc = nox_bridge_unit(workspace, "--allow-missing", peft)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert record_for(workspace)["counts"]["passed"] == 4


def test_path_no_fetched_commit_ever_had_says_so(workspace):
    pr_sha, _ = make_pull_request_split(workspace)
    git.Repo(workspace.bridge).git.update_ref("-d", "refs/pull/42/head")  # a plain clone: no PR refs
    proc = nox_bridge_unit(workspace)
    out = proc.stdout + proc.stderr
    assert (f"{INTEGRATION}: no commit of this clone's history has it (never on the fetched branches; it may have "
            f"lived only on a pull-request branch: git fetch origin '+refs/pull/*/head:refs/pull/*/head', then "
            f"rerun)") in out
    assert "--bridge-tests" not in out and pr_sha[:9] not in out


def test_uv_missing_or_uv_sync_failing_is_blocked(workspace):
    no_uv_path = os.pathsep.join(p for p in workspace.env["PATH"].split(os.pathsep)
                                 if not (Path(p) / "uv").exists())
    proc = nox_bridge_unit(workspace, env={"PATH": no_uv_path})
    assert proc.returncode != 0 and "uv not found on PATH" in proc.stdout + proc.stderr
    assert record_for(workspace)["result"] == "Blocked"

    pyproject = workspace.bridge / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('test = ["pytest>=7"]', 'test = ["pytest>=7",'))
    proc = nox_bridge_unit(workspace)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "`uv sync --locked` failed (exit 2)" in out
    record = record_for(workspace)
    assert record["result"] == "Blocked" and "TOML" in record["detail"]  # uv's own message
    assert record["blocked_by"] == "environment"


def test_pytest_missing_from_the_bridge_environment_is_blocked_not_failed(workspace):
    # no dependency group lists pytest (a plain `uv sync` of Bridge HEAD's default groups is the same situation)
    pyproject = workspace.bridge / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('test = ["pytest>=7"]', 'lint = ["six"]'))
    subprocess.run(["uv", "lock", "-q"], cwd=workspace.bridge, env=workspace.env, check=True)
    commit(workspace, "no pytest in any group")
    proc = nox_bridge_unit(workspace)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "tests failed" not in out
    record = record_for(workspace)
    assert record["result"] == "Blocked" and record["blocked_by"] == "environment"
    assert record["detail"].startswith(
        f"pytest is not installed in the Bridge's environment {workspace.bridge / '.venv'} (no dependency group of "
        f"the Bridge's pyproject.toml lists pytest: ")
    assert "No module named 'pytest'" in record["detail"] and record["pytest_exit"] is None


def test_missing_test_dependency_is_blocked_but_a_missing_bridge_module_fails(workspace):
    mixin = workspace.bridge / MIXIN
    mixin.write_text("import torch\n\n\ndef test_mixin():\n    assert torch\n")
    proc = nox_bridge_unit(workspace)
    assert proc.returncode != 0
    record = record_for(workspace)
    assert record["result"] == "Blocked" and record["blocked_by"] == "environment", record["detail"]
    assert record["detail"].startswith(f"test dependency missing in the Bridge's environment "
                                       f"{workspace.bridge / '.venv'}: No module named 'torch' (pytest exit 2, ")

    mixin.write_text("from megatron.bridge.models.gone import Provider\n\n\ndef test_mixin():\n    assert Provider\n")
    proc = nox_bridge_unit(workspace)
    record = record_for(workspace)
    assert record["result"] == "Fail" and record["detail"].startswith("collection errors or interrupted (pytest exit 2)")


def test_bad_posarg_and_unset_repo(workspace):
    proc = nox_bridge_unit(workspace, "--frobnicate")
    assert proc.returncode != 0 and "error: unknown option '--frobnicate'" in proc.stdout + proc.stderr
    env = {k: v for k, v in workspace.env.items() if k != "BRIDGE_REPO"}
    workspace.env = env
    proc = nox_bridge_unit(workspace)
    assert proc.returncode != 0 and "error: BRIDGE_REPO is not set" in proc.stdout + proc.stderr
    assert not records_dir(workspace.log_dir).exists()


def test_junit_counts_and_environment_gaps(tmp_path):
    junit = tmp_path / "j.xml"
    junit.write_text('<testsuites><testsuite tests="5" failures="1" errors="1" skipped="1"/>'
                     '<testsuite tests="2" failures="0" errors="0" skipped="0"/></testsuites>')
    assert junit_counts(junit) == {"passed": 4, "failed": 1, "errors": 1, "skipped": 1}
    present, missing = check_paths(tmp_path, ["a.py::test_x"])
    assert present == [] and missing[0].path == "a.py::test_x"

    def collection_errors(*texts: str) -> Path:
        cases = "".join(f'<testcase classname="" name="t{i}"><error message="collection failure">{t}</error>'
                        f'</testcase>' for i, t in enumerate(texts))
        junit.write_text(f'<testsuites><testsuite tests="{len(texts)}" errors="{len(texts)}">{cases}</testsuite>'
                         f'</testsuites>')
        return junit

    no_torch = "E   ModuleNotFoundError: No module named 'torch'"
    counts = {"passed": 0, "failed": 0, "errors": 1, "skipped": 0}
    assert environment_gap(2, counts, collection_errors(no_torch), "") == ["torch"]
    assert environment_gap(2, counts, collection_errors(no_torch, "E   SyntaxError: invalid syntax"), "") == []
    assert environment_gap(2, counts, collection_errors("E   ModuleNotFoundError: No module named "
                                                        "'megatron.bridge.gone'"), "") == []
    assert environment_gap(1, {**counts, "failed": 1}, collection_errors(no_torch), "") == []
    # conftest import errors: pytest exits 4 before writing any test case
    conftest = ("ImportError while loading conftest '/b/tests/unit_tests/conftest.py'.\n"
                "tests/unit_tests/conftest.py:3: in <module>\n    import torch\n"
                "E   ModuleNotFoundError: No module named 'torch'\n")
    assert environment_gap(4, {}, tmp_path / "absent.xml", conftest) == ["torch"]


# --- what a level does with it -----------------------------------------------------------------------------------

def test_level_runs_the_checks_then_reuses_only_a_matching_record(workspace):
    first = workspace.invoke("level0")
    assert first.returncode == 0, first.stdout[-3000:]
    [run1] = workspace.run_dirs()
    bc = deliverable(summary_of(run1), "Bridge-side checks")
    assert bc["status"] == "Pass" and "3 passed" in bc["detail"] and str(run1 / "bridge_unit.log") in bc["detail"]
    assert "3 passed" in (run1 / "bridge_unit.log").read_text()
    assert "running nox -s bridge_unit" in first.stdout

    # same Bridge state: the record is reused, nothing is run
    second = workspace.invoke("level0")
    assert second.returncode == 0
    run2 = workspace.run_dirs()[-1]
    assert not (run2 / "bridge_unit.log").exists() and "running nox -s bridge_unit" not in second.stdout
    assert deliverable(summary_of(run2), "Bridge-side checks")["status"] == "Pass"

    # dirty state: the record of the clean commit is ignored
    (workspace.bridge / "src/megatron/bridge/providers.py").write_text(
        (workspace.bridge / "src/megatron/bridge/providers.py").read_text() + "\n# tweak\n")
    third = workspace.invoke("level0")
    run3 = workspace.run_dirs()[-1]
    assert third.returncode == 0 and (run3 / "bridge_unit.log").exists()

    # another commit: ignored as well
    commit(workspace, "tweak")
    fourth = workspace.invoke("level0")
    run4 = workspace.run_dirs()[-1]
    assert fourth.returncode == 0 and (run4 / "bridge_unit.log").exists()
    records = sorted(records_dir(workspace.log_dir).glob("*.json"))
    assert len({json.loads(p.read_text())["fingerprint"] for p in records}) == 3


def test_level_failing_bridge_test_stops_before_verl(workspace):
    break_test(workspace)
    proc = workspace.invoke("level0")
    assert proc.returncode == 1, proc.stdout[-3000:]
    [run_dir] = workspace.run_dirs()
    summary = summary_of(run_dir)
    assert summary["result"] == "Fail"
    assert deliverable(summary, "Bridge-side checks")["status"] == "Fail"
    assert "1 failed" in deliverable(summary, "Bridge-side checks")["detail"]
    assert deliverable(summary, "verl Megatron backend run")["status"] == "Skipped"
    assert not (run_dir / "verl.log").exists()

    kept = workspace.invoke("level0", "--keep-going")
    assert kept.returncode == 1
    run_dir = workspace.run_dirs()[-1]
    assert (run_dir / "verl.log").exists() and not (run_dir / "bridge_unit.log").exists()  # same state: reused
    assert deliverable(summary_of(run_dir), "verl Megatron backend run")["status"] == "Pass"


@pytest.mark.parametrize("allow_missing", [False, True])
def test_level_stale_targeted_path(workspace, allow_missing):
    git.Repo(workspace.bridge).git.rm(INTEGRATION)
    commit(workspace, "drop the integration test")
    args = ["level0", "--allow-missing"] if allow_missing else ["level0"]
    proc = workspace.invoke(*args)
    [run_dir] = workspace.run_dirs()
    summary = summary_of(run_dir)
    bc = deliverable(summary, "Bridge-side checks")
    assert INTEGRATION in bc["detail"]
    missing = [x for x in summary["limitations"] if INTEGRATION in x]
    if allow_missing:
        assert proc.returncode == 0 and bc["status"] == "Pass" and "2 passed" in bc["detail"]
        assert missing == [f"targeted Bridge test path(s) missing at this commit (--allow-missing: the rest ran): "
                           f"{INTEGRATION}"]
    else:
        assert proc.returncode == 3 and bc["status"] == "Blocked" and summary["result"] == "Blocked"
        assert deliverable(summary, "verl Megatron backend run")["status"] == "Skipped"
        assert missing == [f"targeted Bridge test path(s) missing at this commit: {INTEGRATION}"]  # no flag given


def test_level_with_allow_missing_reruns_an_environment_blocked_record(workspace):
    git.Repo(workspace.bridge).git.rm(INTEGRATION)
    commit(workspace, "drop the integration test")
    pyproject = workspace.bridge / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('test = ["pytest>=7"]', 'test = ["pytest>=7",'))
    first = workspace.invoke("level0", "--allow-missing")
    assert first.returncode == 3, first.stdout[-3000:]
    bc = deliverable(summary_of(workspace.run_dirs()[-1]), "Bridge-side checks")
    assert bc["status"] == "Blocked" and bc["detail"].startswith("`uv sync --locked` failed (exit 2)")

    pyproject.write_text(pyproject.read_text().replace('test = ["pytest>=7",', 'test = ["pytest>=7"]'))
    pyproject.write_text(pyproject.read_text().replace('test = ["pytest>=7"]', 'test = ["pytest>=7",'))  # same state
    second = workspace.invoke("level0", "--allow-missing")
    run_dir = workspace.run_dirs()[-1]
    assert (run_dir / "bridge_unit.log").exists(), "an environment-Blocked record must not be reused"
    assert "running nox -s bridge_unit" in second.stdout
    summary = summary_of(run_dir)
    assert [x for x in summary["limitations"] if INTEGRATION in x] == [
        f"targeted Bridge test path(s) missing at this commit (--allow-missing): {INTEGRATION}"]  # nothing ran


def test_level_bridge_tests_are_not_answered_by_a_narrower_record(workspace):
    extra = "tests/unit_tests/models/test_extra_provider.py"
    (workspace.bridge / extra).write_text("def test_extra():\n    assert True\n")
    commit(workspace, "extra test")
    assert nox_bridge_unit(workspace).returncode == 0  # a record of the targeted tests only
    proc = workspace.invoke("level0", "--bridge-tests", extra)
    assert proc.returncode == 0, proc.stdout[-3000:]
    run_dir = workspace.run_dirs()[-1]
    assert (run_dir / "bridge_unit.log").exists()
    assert "4 passed" in deliverable(summary_of(run_dir), "Bridge-side checks")["detail"]


def test_level_stops_hung_bridge_checks(workspace):
    hang = workspace.bridge / MIXIN
    hang.write_text("import time\n\n\ndef test_hangs():\n    time.sleep(120)\n")
    proc = workspace.invoke("level0", env={"STALL_TIMEOUT_MIN": "0.1"}, timeout=120)
    assert proc.returncode == 3, proc.stdout[-3000:]
    [run_dir] = workspace.run_dirs()
    bc = deliverable(summary_of(run_dir), "Bridge-side checks")
    assert bc["status"] == "Blocked" and "stopped (timeout)" in bc["detail"]
    assert not (run_dir / "verl.log").exists()
