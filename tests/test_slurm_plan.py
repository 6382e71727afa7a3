"""`invoke slurm` composition as data: the pyxis flags, mounts, workdir, image tag, inner `nox -s verl` command,
quoting of paths with spaces, the batch script, refusals. No Slurm and no pyxis needed (those runs are in
tests/test_slurm_cluster.py); the batch script is parsed by a real bash against a recording `srun`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from env.launchers.slurm import PROJECT, SlurmOptions, check_image, image_engine, plan
from env.settings import BY_NAME, UsageError

PROJECT_ROOT = Path(__file__).resolve().parents[1]  # this checkout, said without the code under test


@pytest.fixture
def spaced(tmp_path) -> dict[str, str]:
    """An environment whose checkouts, data, model and logs live under a folder with a space (off /tmp)."""
    root = Path.home() / f".verl-e2e-test {os.getpid()}" / tmp_path.name
    paths = {k: root / v for k, v in (("BRIDGE_REPO", "my repos/Megatron-Bridge"), ("VERL_REPO", "my repos/verl"),
                                      ("MODEL_PATH", "models/Qwen 0.5B"), ("RM_MODEL_PATH", "models/rm"),
                                      ("LOG_DIR", "shared logs"), ("HF_HOME", "hf"))}
    for p in paths.values():
        p.mkdir(parents=True, exist_ok=True)
    data = root / "data dir"
    data.mkdir(parents=True)
    (data / "train.parquet").write_bytes(b"x")
    (data / "test.parquet").write_bytes(b"x")
    env = {k: str(v) for k, v in paths.items()}
    env.update(TRAIN_FILES=str(data / "train.parquet"), VAL_FILES=str(data / "test.parquet"),
               GSM8K_DIR=str(data), PATH=os.environ["PATH"], HOME=os.environ["HOME"])
    yield env
    import shutil

    shutil.rmtree(root.parent, ignore_errors=True)


def _plan(env, *task, **kw):
    return plan(SlurmOptions(task_line=list(task), **kw), environ=env)


def test_container_step_flags_mounts_workdir_and_inner_nox(spaced):
    p = _plan(spaced, "level0", "--model", "Qwen/Qwen2.5-0.5B", "--", "trainer.val_before_train=False",
              image="verlai/verl:vllm017.latest", partition="gpu", gpus=8, time="01:00:00", cpus=16)
    argv = p.srun_argv()
    assert argv[0] == "srun"
    assert argv[1:7] == ["--nodes=1", "--ntasks=1", "--partition=gpu", "--time=01:00:00", "--gpus=8",
                         "--cpus-per-task=16"]
    assert "--container-image=verlai/verl:vllm017.latest" in argv
    assert f"--container-workdir={PROJECT}" in argv
    mounts_flag = next(a for a in argv if a.startswith("--container-mounts="))
    mounts = [m.split(":") for m in mounts_flag.split("=", 1)[1].split(",")]
    # every mount at its own host path: paths in settings, logs and reports mean the same file inside
    assert all(src == dst for src, dst in mounts)
    sources = {src for src, _ in mounts}
    for key in ("BRIDGE_REPO", "VERL_REPO", "MODEL_PATH", "RM_MODEL_PATH", "LOG_DIR", "HF_HOME"):
        assert spaced[key] in sources, key
    assert str(Path(spaced["TRAIN_FILES"]).parent) in sources  # data: the folder, not the file
    assert str(PROJECT) in sources
    assert len(sources) == len(mounts)
    # the inner command: nox -s verl -- <the task line, untouched>
    assert p.inner_command == ["python3", "-m", "nox", "-s", "verl", "--", "level0", "--model", "Qwen/Qwen2.5-0.5B",
                               "--", "trainer.val_before_train=False"]
    assert p.step_env["VERL_IMAGE"] == p.step_env["VERL_E2E_CONTAINER_IMAGE"] == "verlai/verl:vllm017.latest"
    assert p.step_env["LOG_DIR"] == spaced["LOG_DIR"]
    assert p.image_source == "flag"


def test_nested_paths_fold_into_their_parent_and_absent_ones_are_said(spaced, tmp_path):
    env = dict(spaced, VERL_REPO=str(Path(spaced["BRIDGE_REPO"]) / "sub verl"),
               RM_MODEL_PATH=str(Path(spaced["BRIDGE_REPO"]).parent / "absent rm"))
    Path(env["VERL_REPO"]).mkdir()
    p = _plan(env, "level0")
    sources = [s for s, _ in p.mounts]
    assert env["VERL_REPO"] not in sources and spaced["BRIDGE_REPO"] in sources
    assert env["RM_MODEL_PATH"] not in sources
    assert any("absent" in n and env["RM_MODEL_PATH"] in n for n in p.notes)


def test_an_absent_log_dir_is_still_mounted_it_is_created_before_the_step(spaced):
    env = dict(spaced, LOG_DIR=str(Path(spaced["LOG_DIR"]).parent / "new logs"))
    p = _plan(env, "level0")
    assert not Path(env["LOG_DIR"]).exists()
    assert (env["LOG_DIR"], env["LOG_DIR"]) in p.mounts
    assert not any("absent" in n and env["LOG_DIR"] in n for n in p.notes)


def test_extra_mounts_and_site_args_pass_through(spaced):
    extra = Path(spaced["LOG_DIR"]).parent / "scratch"
    extra.mkdir()
    site = "-A my_acct --qos=high --reservation 'res one' --exclusive"
    p = _plan(spaced, "level0", srun_args=site, mounts=f"{extra}:/scratch:ro,{extra}")
    assert p.site_args == shlex.split(site)
    argv = p.srun_argv()
    i = argv.index("-A")
    assert argv[i:i + 6] == ["-A", "my_acct", "--qos=high", "--reservation", "res one", "--exclusive"]
    assert (str(extra), "/scratch:ro") in p.mounts and (str(extra), str(extra)) in p.mounts


def test_step_script_exports_settings_drops_rocr_and_execs_the_task(spaced):
    p = _plan(spaced, "level0", image="verlai/verl:vllm017.latest")
    script = p.step_script()
    assert "unset ROCR_VISIBLE_DEVICES" in script
    assert f"export LOG_DIR={shlex.quote(spaced['LOG_DIR'])}" in script
    assert f"export BRIDGE_REPO={shlex.quote(spaced['BRIDGE_REPO'])}" in script
    assert "export VERL_IMAGE=verlai/verl:vllm017.latest" in script
    assert script.rstrip().endswith("exec python3 -m nox -s verl -- level0")
    assert subprocess.run(["bash", "-n", "-c", script]).returncode == 0


def test_no_container_runs_invoke_in_this_python(spaced):
    p = _plan(spaced, "level0", "--skip-bridge-checks", no_container=True)
    assert p.container_args == [] and p.image is None and "VERL_IMAGE" not in p.step_env
    assert p.inner_command == [sys.executable, "-m", "invoke", "level0", "--skip-bridge-checks"]
    assert not any(a.startswith("--container") for a in p.srun_argv())


def test_relative_path_flags_are_made_absolute(spaced, monkeypatch, tmp_path):
    monkeypatch.chdir(Path(spaced["LOG_DIR"]).parent)
    p = _plan(spaced, "level0", "--log-dir", "shared logs", "--model-path=models/Qwen 0.5B")
    assert p.task_line == ["level0", "--log-dir", spaced["LOG_DIR"], f"--model-path={spaced['MODEL_PATH']}"]
    assert p.log_dir == Path(spaced["LOG_DIR"])


def test_batch_script_holds_the_same_step_bash_parses_it_to_the_same_argv(spaced, tmp_path):
    """A real bash runs the batch script against a recording `srun`: the argv it gets is exactly ours."""
    p = _plan(spaced, "level0", "--model", "Qwen/Qwen2.5-0.5B", srun_args="-A 'acct with space'",
              image="verlai/verl:vllm017.latest")
    jobs = Path(spaced["LOG_DIR"]) / "slurm"
    jobs.mkdir()
    script = tmp_path / "batch.sh"
    script.write_text(p.batch_script(jobs))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "argv.json"
    srun = bin_dir / "srun"
    srun.write_text(f"#!{sys.executable}\nimport json, sys\njson.dump(sys.argv[1:], open({str(record)!r}, 'w'))\n"
                    "sys.exit(5)\n")
    srun.chmod(srun.stat().st_mode | stat.S_IXUSR)
    out = subprocess.run(["bash", str(script)], env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
                                                     "SLURM_JOB_ID": "42"}, capture_output=True, text=True)
    argv = json.loads(record.read_text())
    assert argv[:5] == ["--nodes=1", "--ntasks=1", "-A", "acct with space",
                        "--container-image=verlai/verl:vllm017.latest"]
    flag, mounts = argv[5].split("=", 1)
    assert flag == "--container-mounts"
    mounted = (str(Path(spaced["TRAIN_FILES"]).parent), spaced["HF_HOME"], spaced["MODEL_PATH"],
               spaced["RM_MODEL_PATH"], spaced["BRIDGE_REPO"], spaced["VERL_REPO"], spaced["LOG_DIR"], str(PROJECT_ROOT))
    assert sorted(mounts.split(",")) == sorted(f"{m}:{m}" for m in mounted)
    assert argv[6:10] == [f"--container-workdir={PROJECT_ROOT}", "--container-writable", "bash", "-c"]
    assert len(argv) == 11
    step = argv[10].splitlines()
    assert step[1] == f"touch {shlex.quote(str(jobs))}/\"$SLURM_JOB_ID\".started"
    assert f"export LOG_DIR={shlex.quote(spaced['LOG_DIR'])}" in step
    assert f"export MODEL_PATH={shlex.quote(spaced['MODEL_PATH'])}" in step
    assert "export VERL_IMAGE=verlai/verl:vllm017.latest" in step
    assert f"cd {shlex.quote(str(PROJECT_ROOT))}" in step
    assert step[-1] == "exec python3 -m nox -s verl -- level0 --model Qwen/Qwen2.5-0.5B"
    # this srun never started the step (no 42.started): cluster setup, exit 3 (Blocked), not the task's 5
    assert out.returncode == 3 and (jobs / "42.exit").read_text().strip() == "3"
    assert "srun exited 5 before the step started" in out.stdout
    # a step that started keeps its own exit code
    (jobs / "42.started").touch()
    out = subprocess.run(["bash", str(script)], env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
                                                     "SLURM_JOB_ID": "42"}, capture_output=True, text=True)
    assert out.returncode == 5 and (jobs / "42.exit").read_text().strip() == "5"
    sbatch = p.sbatch_argv(jobs, script)
    assert sbatch[:2] == ["sbatch", "--parsable"] and f"--output={jobs / 'slurm-%j.log'}" in sbatch
    assert sbatch[-3:] == ["-A", "acct with space", str(script)]


def test_default_image_is_a_vllm_verlai_tag():
    # verl's stable vLLM image (docker/README.md of verl-project/verl, 2026-03: vllm==0.17.0)
    assert BY_NAME["verl_image"].default == "verlai/verl:vllm017.latest"
    assert image_engine("verlai/verl:vllm017.latest") == "vllm"


@pytest.mark.parametrize("image,engine", [
    ("verlai/verl:sgl059.latest", "sglang"),
    ("verlai/verl:app-verl0.4-sglang0.4.6.post5-vllm0.8.5-mcore0.12.1", "sglang"),
    ("verlai/verl:trtllm1.2.0rc6", "trtllm"),
    ("verlai/verl:vllm017.latest", "vllm"),
    ("verlai/verl:app-verl0.5-transformers4.55.4-vllm0.10.0-mcore0.13.0-te2.2", "vllm"),
    ("nvcr.io/nvidia/pytorch:25.01-py3", None),
])
def test_image_engine(image, engine):
    assert image_engine(image) == engine


def test_non_vllm_image_with_engine_vllm_is_refused_with_the_reason(spaced):
    with pytest.raises(UsageError, match=r"sglang-flavoured but the levels run ENGINE=vllm.*before the model"):
        _plan(spaced, "level0", image="verlai/verl:sgl059.latest")
    with pytest.raises(UsageError, match="trtllm-flavoured"):
        _plan(dict(spaced, VERL_IMAGE="verlai/verl:trtllm1.2.0rc6"), "level0")
    assert any("cannot tell the rollout engine" in w for w in check_image("nvcr.io/nvidia/pytorch:25.01-py3"))
    assert any("moving tag" in w for w in check_image("verlai/verl:vllm017.latest"))
    assert not check_image("verlai/verl@sha256:" + "0" * 64 + "-vllm")


def test_node_local_log_dir_is_refused_unless_allowed(spaced):
    env = dict(spaced, LOG_DIR="/tmp/verl logs")
    with pytest.raises(UsageError, match="node-local"):
        _plan(env, "level0")
    with pytest.raises(UsageError, match="node-local"):
        _plan(spaced, "level0", "--log-dir", "/dev/shm/x")
    p = _plan(env, "level0", allow_local_logs=True)
    assert any("node-local" in w for w in p.warnings)


@pytest.mark.parametrize("task,kw,message", [
    ((), {}, "name the task"),
    (("--model", "x"), {}, "not a task name"),
    (("slurm-status", "3"), {}, "makes no sense"),
    (("level0",), {"gpus": 0}, "--gpus must be >= 1"),
    (("level0",), {"time": "an hour"}, "not a Slurm time"),
    (("level0",), {"srun_args": "-A 'unclosed"}, "cannot parse --srun-args"),
    (("level0",), {"mounts": "/a:b"}, "container path must be absolute"),
    (("level0",), {"mounts": "/data:/workspace"}, "would hide the image's /workspace/Megatron-LM"),
])
def test_bad_invocations(spaced, task, kw, message):
    with pytest.raises(UsageError, match=message):
        _plan(spaced, *task, **kw)


def test_a_comma_in_a_mounted_path_is_refused(spaced):
    odd = Path(spaced["LOG_DIR"]).parent / "a,b"
    odd.mkdir()
    with pytest.raises(UsageError, match="cannot express"):
        _plan(dict(spaced, HF_HOME=str(odd)), "level0")


def test_invoke_slurm_dry_run_via_the_real_cli(spaced):
    """`invoke slurm --dry-run --detach ...` as a user runs it: the step, the sbatch line, nothing written."""
    env = {**os.environ, **spaced}
    env.pop("SLURM_CONF", None)
    out = subprocess.run([sys.executable, "-m", "invoke", "slurm", "--dry-run", "--detach", "--gpus", "2",
                          "--srun-args", "--qos=q", "level0", "--model", "Qwen/Qwen2.5-0.5B", "--", "a=b"],
                         cwd=PROJECT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "--container-image=verlai/verl:vllm017.latest" in out.stdout
    assert "exec python3 -m nox -s verl -- level0 --model Qwen/Qwen2.5-0.5B -- a=b" in out.stdout
    assert "# --detach: sbatch --parsable" in out.stdout and "--qos=q" in out.stdout
    assert "container image: verlai/verl:vllm017.latest (from default)" in out.stdout
    assert not (Path(spaced["LOG_DIR"]) / "slurm").exists()


def test_invoke_slurm_refusals_are_one_line_exit_2(spaced):
    env = {**os.environ, **spaced}
    for args, message in ((["slurm", "--image", "verlai/verl:sgl059.latest", "level0"], "sglang-flavoured"),
                          (["slurm"], "name the task"),
                          (["slurm", "--gpus", "two", "level0"], "--gpus must be an integer")):
        out = subprocess.run([sys.executable, "-m", "invoke", *args], cwd=PROJECT, env=env, capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert out.stderr.startswith("error: ") and message in out.stderr and "Traceback" not in out.stderr


def test_the_container_image_lands_in_the_run_record(workspace):
    """What the container step exports (VERL_E2E_CONTAINER_IMAGE) reaches preflight, run.json and summary.json."""
    image = "verlai/verl:vllm017.latest"
    out = workspace.invoke("level0", "--skip-bridge-checks",
                           env={"VERL_E2E_CONTAINER_IMAGE": image, "VERL_IMAGE": image})
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(rf"container image +{re.escape(image)} \(the exact tag", out.stdout), out.stdout
    (run_dir,) = workspace.run_dirs()
    run = json.loads((run_dir / "run.json").read_text())
    assert run["evidence"]["container_image"] == image
    assert run["settings"]["verl_image"] == image and run["setting_sources"]["verl_image"] == "env"
    assert any(image in n for n in json.loads((run_dir / "summary.json").read_text())["notes"])
    assert json.loads((run_dir / "env.json").read_text())["VERL_IMAGE"] == image


# --- --jobid, image files, --nodes, --stage (issue 28); the launcher interface (env/launchers/base.py) ---------


def test_jobid_runs_the_same_step_inside_the_allocation(spaced):
    p = _plan(spaced, "level0", jobid="77", gpus=2, cpus=8, image="verlai/verl:vllm017.latest")
    argv = p.srun_argv()
    assert argv[1:7] == ["--jobid=77", "--overlap", "--nodes=1", "--ntasks=1", "--gpus=2", "--cpus-per-task=8"]
    assert "--container-image=verlai/verl:vllm017.latest" in argv  # explicit image, mounts and workdir, as before
    assert any(a.startswith("--container-mounts=") for a in argv) and f"--container-workdir={PROJECT}" in argv
    assert any("existing allocation 77" in n for n in p.notes)
    script = p.background_script(Path(spaced["LOG_DIR"]) / "slurm", Path(spaced["LOG_DIR"]) / "slurm" / "77.k.key")
    assert subprocess.run(["bash", "-n", "-c", script]).returncode == 0
    assert "srun --jobid=77 --overlap" in script


@pytest.mark.parametrize("kw,message", [
    ({"jobid": "77", "partition": "gpu"}, "--partition with --jobid"),
    ({"jobid": "77", "time": "10"}, "--time with --jobid"),
    ({"jobid": "7; rm -rf /"}, "not a Slurm job id"),
    ({"nodes": 0}, "--nodes must be >= 1"),
    ({"nodes": 2, "gpus": 8}, "--gpus with --nodes"),
    ({"gpus": 2, "gpus_per_node": 2}, "give one"),
    ({"ray_port": 0}, "not a port"),
])
def test_bad_multinode_and_jobid_invocations(spaced, kw, message):
    with pytest.raises(UsageError, match=message):
        _plan(spaced, "level0", **kw)


@pytest.fixture
def sqsh(spaced) -> Path:
    path = Path(spaced["LOG_DIR"]).parent / "images" / "verl vllm017.sqsh"
    path.parent.mkdir()
    path.write_bytes(b"hsqs")  # SquashFS magic; pyxis reads it, we only pass the path on
    return path


def test_image_file_with_its_source_tag(spaced, sqsh):
    p = _plan(spaced, "level0", image=str(sqsh), image_source="verlai/verl:vllm017.latest")
    assert f"--container-image={sqsh}" in p.srun_argv()
    assert p.step_env["VERL_IMAGE"] == str(sqsh)
    assert p.step_env["VERL_IMAGE_SOURCE"] == "verlai/verl:vllm017.latest"
    assert p.step_env["VERL_E2E_CONTAINER_IMAGE"] == f"{sqsh} (source tag verlai/verl:vllm017.latest)"
    assert str(sqsh.parent) not in {s for s, _ in p.mounts}  # pyxis reads the image itself: no mount
    assert not any("no source tag" in w for w in p.warnings)
    # the same from the environment
    env = dict(spaced, VERL_IMAGE=str(sqsh), VERL_IMAGE_SOURCE="verlai/verl:vllm017.latest")
    assert _plan(env, "level0").image_tag == "verlai/verl:vllm017.latest"


def test_image_file_without_a_source_tag_is_a_warning_in_the_run_record(spaced, sqsh):
    p = _plan(spaced, "level0", image=str(sqsh))
    assert any("has no source tag: pass --image-source" in w for w in p.warnings)
    assert p.step_env["VERL_E2E_CONTAINER_IMAGE"].startswith(f"{sqsh} (no source tag — warning: pass --image-source")
    assert "VERL_IMAGE_SOURCE" not in p.step_env


def test_image_file_refusals(spaced, sqsh):
    with pytest.raises(UsageError, match="sglang-flavoured"):
        _plan(spaced, "level0", image=str(sqsh), image_source="verlai/verl:sgl059.latest")
    with pytest.raises(UsageError, match="does not exist here"):
        _plan(spaced, "level0", image=str(sqsh.parent / "absent.sqsh"))
    with pytest.raises(UsageError, match="is a tag already"):
        _plan(spaced, "level0", image="verlai/verl:vllm017.latest", image_source="verlai/verl:vllm016.latest")
    trt = sqsh.parent / "verl-trtllm1.2.sqsh"
    trt.write_bytes(b"hsqs")
    with pytest.raises(UsageError, match="trtllm-flavoured"):
        _plan(spaced, "level0", image=str(trt))


def test_nodes_make_one_ray_cluster_with_the_level_on_the_head(spaced):
    p = _plan(spaced, "level2", "--variant", "dense", "--", "a=b", nodes=2, gpus_per_node=8, cpus=32,
              partition="gpu", image="verlai/verl:vllm017.latest")
    assert p.multinode and p.alloc_args == ["--nodes=2", "--ntasks-per-node=1", "--partition=gpu",
                                            "--gpus-per-node=8", "--cpus-per-task=32"]
    # the level on the head: the user's overrides, then verl's multi-node ones (later wins in Hydra)
    assert p.task_line == ["level2", "--variant", "dense", "--", "a=b", "trainer.nnodes=2",
                           "trainer.n_gpus_per_node=8"]
    assert p.step_env["NUM_GPUS"] == "16"  # the level's GPU check: N×G
    assert p.worker_pythonpath.split(":")[:3] == [f"{spaced['BRIDGE_REPO']}/src",
                                                  f"{spaced['BRIDGE_REPO']}/3rdparty/Megatron-LM", spaced["VERL_REPO"]]
    node = p.node_script()
    assert "--head --port=6379" in node and "--address=${VERL_E2E_RAY_HEAD#*=}" in node and "--num-gpus=8" in node
    assert "install-modelopt" in node  # every node's container gets the same setup as the head's
    head = p.step_script()
    assert "worker import probe" in head and "export RAY_ADDRESS=" in head
    assert head.rstrip().endswith("exec python3 -m nox -s verl -- level2 --variant dense -- a=b trainer.nnodes=2 "
                                  "trainer.n_gpus_per_node=8")
    jobs = Path(spaced["LOG_DIR"]) / "slurm"
    driver = p.batch_script(jobs)
    for text in (driver, node, head):
        assert subprocess.run(["bash", "-n", "-c", text]).returncode == 0
    assert "--ntasks-per-node=1" in driver and "--gpus-per-node=8" in driver and "--container-image=" in driver
    assert "trap teardown EXIT" in driver and '"$SLURM_JOB_ID".exit' in driver
    assert p.salloc_argv(jobs / "d.sh")[:2] == ["salloc", "--job-name=verl-e2e-level2"]
    with pytest.raises(UsageError, match="drop RAY_ADDRESS"):
        _plan(dict(spaced, RAY_ADDRESS="10.0.0.1:6379"), "level0", nodes=2, gpus_per_node=8)
    with pytest.raises(UsageError, match="BRIDGE_REPO and VERL_REPO"):
        _plan({k: v for k, v in spaced.items() if k != "BRIDGE_REPO"}, "level0", nodes=2, gpus_per_node=8)


def test_plan_run_on_several_nodes_passes_the_cluster_to_every_level(spaced):
    p = _plan(spaced, "plan", "--run", nodes=2, gpus_per_node=4, no_container=True)
    assert p.inner_command[-5:] == ["plan", "--run", "--", "trainer.nnodes=2", "trainer.n_gpus_per_node=4"]
    assert p.step_env["NUM_GPUS"] == "8"


def test_stage_downloads_and_prepares_once_in_the_same_container(spaced):
    p = _plan(spaced, "level0", stage=True, image="verlai/verl:vllm017.latest")
    assert p.step_env["HF_HUB_OFFLINE"] == "1" and p.step_env["VERL_E2E_STAGING"].endswith(".jsonl")
    script = p.step_script()
    assert "env -u HF_HUB_OFFLINE python3 -m nox -s verl -- download-model" in script
    assert "env -u HF_HUB_OFFLINE python3 -m nox -s verl -- prep-data" in script
    assert script.index("download-model") < script.index("exec python3 -m nox -s verl -- level0")
    multi = _plan(spaced, "level0", stage=True, nodes=2, gpus_per_node=1, no_container=True)
    driver = multi.batch_script(Path(spaced["LOG_DIR"]) / "slurm")
    assert driver.index("staging model and data once") < driver.index("--ntasks-per-node=1 -w")


@pytest.mark.parametrize("args,expected", [
    (["slurm", "--dry-run", "--jobid", "77", "level0"], "srun --jobid=77 --overlap --nodes=1 --ntasks=1"),
    (["slurm", "--dry-run", "--image", "{sqsh}", "--image-source", "verlai/verl:vllm017.latest", "level0"],
     "container image: {sqsh} (source tag verlai/verl:vllm017.latest)"),
    (["slurm", "--dry-run", "--nodes", "2", "--gpus-per-node", "8", "level0"],
     "# ray cluster: 2 nodes × 8 GPUs, head on the first node (port 6379); the task on the head: level0 -- "
     "trainer.nnodes=2 trainer.n_gpus_per_node=8"),
    (["slurm", "--dry-run", "--detach", "--jobid", "77", "--nodes", "2", "--gpus-per-node", "8", "level0"],
     "# --detach with --jobid: run here in the background"),
])
def test_new_slurm_flags_in_dry_run_via_the_real_cli(spaced, sqsh, args, expected):
    env = {**os.environ, **spaced}
    env.pop("SLURM_CONF", None)
    args = [a.replace("{sqsh}", str(sqsh)) for a in args]
    out = subprocess.run([sys.executable, "-m", "invoke", *args], cwd=PROJECT, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    text = re.sub(r"\s*\\\n\s*", " ", out.stdout).replace("'", "")  # the step is printed one flag a line
    assert expected.replace("{sqsh}", str(sqsh)) in text, out.stdout
    assert not (Path(spaced["LOG_DIR"]) / "slurm").exists()


def test_the_image_file_and_its_source_tag_land_in_the_run_record(workspace, tmp_path):
    record = f"{tmp_path}/verl.sqsh (source tag verlai/verl:vllm017.latest)"
    out = workspace.invoke("level0", "--skip-bridge-checks",
                           env={"VERL_E2E_CONTAINER_IMAGE": record, "VERL_IMAGE": f"{tmp_path}/verl.sqsh",
                                "VERL_IMAGE_SOURCE": "verlai/verl:vllm017.latest"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(rf"container image +{re.escape(record)}", out.stdout), out.stdout  # the preflight table
    (run_dir,) = workspace.run_dirs()
    assert json.loads((run_dir / "run.json").read_text())["evidence"]["container_image"] == record
    assert json.loads((run_dir / "env.json").read_text())["VERL_IMAGE_SOURCE"] == "verlai/verl:vllm017.latest"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert record in summary["evidence"]["command"] and any(record in n for n in summary["notes"])
    assert record in (run_dir / "summary.md").read_text()


def test_task_line_is_parsed_once_for_every_launcher():
    from env.launchers.base import TaskLine, run_dirs_in

    line = TaskLine.parse(["level0", "--model", "m", "--", "a=b"], "'c=d e' f=g", launcher="slurm")
    assert (line.task, line.args, line.overrides) == ("level0", ["--model", "m"], ["a=b", "c=d e", "f=g"])
    assert line.tokens == ["level0", "--model", "m", "--", "a=b", "c=d e", "f=g"]
    assert line.with_overrides(["x=1"]).overrides[-1] == "x=1" and line.overrides[-1] == "f=g"
    kept, taken = TaskLine.parse(["level0", "--bridge-repo=/b", "--verl-repo", "/v", "-x"],
                                 launcher="remote").without_flags(("--bridge-repo", "--verl-repo"))
    assert kept.tokens == ["level0", "-x"] and taken == {"--bridge-repo": "/b", "--verl-repo": "/v"}
    with pytest.raises(UsageError, match="makes no sense"):
        TaskLine.parse(["slurm-logs"], launcher="slurm", not_forwardable=("slurm-logs",))
    out = b"x\n[verl-e2e] run directory: /a b\r\n[verl-e2e] status\r[verl-e2e] run directory: /c\n"
    assert run_dirs_in(out) == ["/a b", "/c"] and run_dirs_in(out.decode()) == ["/a b", "/c"]


def test_local_launcher_runs_the_task_here_and_finds_its_run_directory(workspace, monkeypatch):
    from env.launchers.base import TaskLine
    from env.launchers.local import LocalLauncher

    for k, v in workspace.env.items():
        monkeypatch.setenv(k, v)
    launcher = LocalLauncher(TaskLine.parse(["level0", "--skip-bridge-checks"], launcher="local"))
    p = launcher.plan()
    assert p.describe().splitlines()[1].endswith("-m invoke level0 --skip-bridge-checks")
    assert launcher.run_attached(p) == 0
    (run_dir,) = workspace.run_dirs()
    assert p.run_dirs[-1] == str(run_dir)


def test_every_path_flag_of_the_forwarded_task_is_mounted_absolute_from_its_flag_table(spaced, tmp_path, monkeypatch):
    """The mounts come from the task's flag table (`Flag(kind="path")`), not a list here: `install-modelopt
    --find-links DIR` (a flag the old list lacked) and `judge --log F` get their folders mounted, given relative."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    log = tmp_path / "logs" / "verl.log"
    log.parent.mkdir()
    log.write_text("step:1 - x:1\n")
    monkeypatch.chdir(tmp_path)
    p = _plan(spaced, "install-modelopt", "--find-links", "wheels")
    assert (str(wheels), str(wheels)) in p.mounts, p.mounts
    assert f"--find-links {wheels}" in " ".join(p.step_script().split())
    p = _plan(spaced, "judge", "--log", "logs/verl.log")
    assert (str(log.parent), str(log.parent)) in p.mounts, p.mounts


def test_path_flags_are_found_when_only_some_tasks_were_made():
    """A process that made only the level tasks (an xdist worker, a bench) still reads install-modelopt's path flags:
    the declared table is completed from tasks.py (CI caught the first version answering nothing there)."""
    code = ("from sessions.run.level import make_level_task; make_level_task(0)\n"
            "from env.protocol import flags; print(flags.path_options('install-modelopt'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=PROJECT, capture_output=True, text=True)
    assert "--find-links" in out.stdout, out.stdout + out.stderr
