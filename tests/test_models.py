"""`invoke download-model` and a level's `--download`, through the real `invoke` and the real huggingface_hub,
against a local server that answers the hub's API for tiny repos (HF_ENDPOINT)."""

from __future__ import annotations

import json
import socket

import pytest

from tests.fake_hub import FakeHub

TINY = {"config.json": b'{"model_type": "qwen2", "hidden_size": 64}', "model.safetensors": b"\0" * 4096,
        "tokenizer/tokenizer.json": b"{}"}


def _hub_env(workspace, url: str, scratch) -> dict[str, str]:
    for k in [k for k in workspace.env if k.startswith("HF_")]:
        del workspace.env[k]
    return {"HF_ENDPOINT": url, "SCRATCH_DIR": str(scratch), "HF_HUB_OFFLINE": "0"}


def _closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_first_call_downloads_second_downloads_nothing(workspace, tmp_path):
    scratch = tmp_path / "scratch"
    with FakeHub({"tiny/model": TINY}) as hub:
        env = _hub_env(workspace, hub.url, scratch)
        first = workspace.invoke("download-model", "--model", "tiny/model", env=env)
        assert first.returncode == 0, first.stderr
        target = scratch / "tiny" / "model"
        assert first.stdout.strip().splitlines()[-1] == f"MODEL_PATH={target}"
        assert sorted(p.rsplit("/", 1)[-1] for p in hub.downloads()) == ["config.json", "model.safetensors",
                                                                         "tokenizer.json"]
        assert (target / "model.safetensors").read_bytes() == TINY["model.safetensors"]
        assert (target / "tokenizer" / "tokenizer.json").is_file()
        assert f"HF_HOME={scratch / '.hf_home'}" in first.stderr
        assert not (workspace.home / ".cache" / "huggingface" / "hub").exists()  # nothing under a small $HOME

        hub.requests.clear()
        second = workspace.invoke("download-model", "--model", "tiny/model", env=env)
        assert second.returncode == 0, second.stderr
        assert hub.downloads() == []
        assert hub.requests, "the second call still asks the hub what is current"
        assert "nothing to download" in second.stderr
        assert second.stdout.strip().splitlines()[-1] == f"MODEL_PATH={target}"

        # a file lost locally: only that one comes again
        (target / "model.safetensors").unlink()
        hub.requests.clear()
        third = workspace.invoke("download-model", "--model", "tiny/model", env=env)
        assert third.returncode == 0, third.stderr
        assert [p.rsplit("/", 1)[-1] for p in hub.downloads()] == ["model.safetensors"]

    # offline afterwards: the complete earlier download is kept, exit 0
    offline = workspace.invoke("download-model", "--model", "tiny/model",
                               env=dict(env, HF_ENDPOINT=_closed_port_url()))
    assert offline.returncode == 0, offline.stderr
    assert "unreachable; keeping the complete earlier download" in offline.stderr


def test_reward_model_and_explicit_local_dir(workspace, tmp_path):
    rm_id = "Skywork/Skywork-Reward-V2-Llama-3.2-1B"
    with FakeHub({rm_id: TINY}) as hub:
        env = _hub_env(workspace, hub.url, tmp_path / "scratch")
        proc = workspace.invoke("download-model", "--reward-model", env=env)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip().splitlines()[-1] == f"RM_MODEL_PATH={tmp_path / 'scratch' / rm_id}"
        dest = tmp_path / "exact"
        proc = workspace.invoke("download-model", "--model", rm_id, "--local-dir", str(dest), env=env)
        assert proc.returncode == 0 and (dest / "config.json").is_file()


@pytest.mark.parametrize("case", ["unknown_repo", "offline", "no_space", "bad_name"])
def test_clear_one_line_errors(workspace, tmp_path, case):
    scratch = tmp_path / "scratch"
    sizes = {"model.safetensors": 10**16} if case == "no_space" else None
    with FakeHub({"tiny/model": TINY}, sizes=sizes) as hub:
        env = _hub_env(workspace, hub.url, scratch)
        model = {"unknown_repo": "tiny/does-not-exist", "bad_name": "not a repo"}.get(case, "tiny/model")
        if case == "offline":
            env["HF_ENDPOINT"] = _closed_port_url()
        proc = workspace.invoke("download-model", "--model", model, env=env)
        downloads = hub.downloads()
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    expect = {
        "unknown_repo": (2, "unknown model repo tiny/does-not-exist"),
        "offline": (1, "cannot reach http://127.0.0.1:"),
        "no_space": (1, "no space for tiny/model: 9094.9 TiB to download"),
        "bad_name": (2, "--model must look like ORG/NAME"),
    }[case]
    assert proc.returncode == expect[0] and expect[1] in errors[0], proc.stderr
    assert downloads == []
    assert not (scratch / "tiny" / "model" / "config.json").exists()


def test_dry_run_downloads_nothing(workspace, tmp_path):
    with FakeHub({"tiny/model": TINY}) as hub:
        env = _hub_env(workspace, hub.url, tmp_path / "scratch")
        proc = workspace.invoke("download-model", "--model", "tiny/model", "--dry-run", env=env)
        assert proc.returncode == 0 and hub.requests == []
    assert "would snapshot tiny/model" in proc.stderr and not (tmp_path / "scratch").exists()


def test_level_download_flag_fetches_an_absent_model(workspace, tmp_path):
    model_path = tmp_path / "fresh" / "Qwen2.5-0.5B"
    repo = {"config.json": (workspace.model / "config.json").read_bytes(), "tokenizer.json": b"{}",
            "tokenizer_config.json": b"{}", "model.safetensors": b"\0" * 64}
    with FakeHub({"Qwen/Qwen2.5-0.5B": repo}) as hub:
        env = dict(_hub_env(workspace, hub.url, tmp_path / "scratch"), MODEL_PATH=str(model_path))
        dry = workspace.invoke("level0", "--skip-bridge-checks", "--download", "--dry-run", env=env)
        assert dry.returncode == 0 and hub.requests == [] and not model_path.exists(), dry.stdout
        assert "would download Qwen/Qwen2.5-0.5B" in dry.stdout

        blocked = workspace.invoke("level0", "--skip-bridge-checks", env=env)
        assert blocked.returncode == 3 and hub.requests == []

        proc = workspace.invoke("level0", "--skip-bridge-checks", "--download", env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert (model_path / "config.json").read_bytes() == repo["config.json"]
    run_dir = workspace.run_dirs()[-1]
    checks = {c["name"]: c for c in json.loads((run_dir / "run.json").read_text())["preflight"]}
    assert checks["model download"]["status"] == "ok"
    assert len(hub.downloads()) == 4


def test_a_config_json_only_folder_is_not_downloaded_for_preflight_and_download_model(workspace, tmp_path):
    """An interrupted download (config.json, no weights): one answer everywhere, "not downloaded yet"."""
    folder = tmp_path / "partial" / "tiny" / "model"
    folder.mkdir(parents=True)
    (folder / "config.json").write_bytes(TINY["config.json"])
    env = {"MODEL_PATH": str(folder)}

    doctor = workspace.invoke("doctor", env=env)
    reason = (f"no HF checkpoint at {folder} (config.json but no weights (*.safetensors, pytorch_model*.bin): "
              "not downloaded yet)")
    assert reason in doctor.stdout, doctor.stdout

    level = workspace.invoke("level0", "--skip-bridge-checks", env=env)
    assert level.returncode == 3, level.stdout[-3000:] + level.stderr[-2000:]
    summary = json.loads((workspace.run_dirs()[-1] / "summary.json").read_text())
    assert summary["result"] == "Blocked" and reason in json.dumps(summary)

    offline = workspace.invoke("download-model", "--model", "tiny/model", "--local-dir", str(folder),
                               env=dict(_hub_env(workspace, _closed_port_url(), tmp_path / "scratch")))
    assert offline.returncode == 1
    assert f"tiny/model is not downloaded to {folder} yet" in offline.stderr, offline.stderr

    with FakeHub({"tiny/model": TINY}) as hub:
        proc = workspace.invoke("download-model", "--model", "tiny/model", "--local-dir", str(folder),
                                env=_hub_env(workspace, hub.url, tmp_path / "scratch"))
        assert proc.returncode == 0, proc.stderr
        assert "model.safetensors" in [p.rsplit("/", 1)[-1] for p in hub.downloads()]
    doctor = workspace.invoke("doctor", env=env)
    assert f"{folder} (MODEL_PATH env)" in doctor.stdout, doctor.stdout
