"""GSM8K parquet: real pyarrow over good, empty, corrupt and schema-wrong files; `invoke prep-data` running the
(fixture) verl preprocessing script in the right Python, skipping valid files, and validating what it wrote."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data.gsm8k import validate_parquet

GOOD_ROW = {
    "data_source": "openai/gsm8k",
    "prompt": [{"role": "user", "content": "What is 1 + 1?"}],
    "ability": "math",
    "reward_model": {"style": "rule", "ground_truth": "2"},
    "extra_info": {"split": "train", "index": 0, "answer": "1 + 1 = 2\n#### 2", "question": "What is 1 + 1?"},
}


def _write(path, rows, schema=None):
    table = pa.Table.from_pylist(rows, schema=schema) if rows else schema.empty_table()
    pq.write_table(table, path)
    return path


def test_good_file_from_verls_script_is_valid(workspace):
    for name in ("train.parquet", "test.parquet"):
        assert validate_parquet(workspace.data / name) == []


def test_empty_file(tmp_path):
    schema = pa.Table.from_pylist([GOOD_ROW]).schema
    path = _write(tmp_path / "empty.parquet", [], schema)
    assert validate_parquet(path) == [f"{path}: 0 rows"]


@pytest.mark.parametrize("damage", ["garbage", "truncated", "zero_bytes"])
def test_corrupt_file(workspace, tmp_path, damage):
    path = tmp_path / "train.parquet"
    good = (workspace.data / "train.parquet").read_bytes()
    path.write_bytes({"garbage": b"not parquet at all" * 10, "truncated": good[: len(good) // 2],
                      "zero_bytes": b""}[damage])
    [problem] = validate_parquet(path)
    assert problem.startswith(f"{path}: not a readable parquet file")


def test_schema_wrong_files_name_the_file_and_the_field(tmp_path):
    no_reward = _write(tmp_path / "a.parquet", [{k: v for k, v in GOOD_ROW.items() if k != "reward_model"}])
    assert validate_parquet(no_reward) == [f"{no_reward}: missing column 'reward_model'"]

    no_truth = _write(tmp_path / "b.parquet", [dict(GOOD_ROW, reward_model={"style": "rule"})])
    assert validate_parquet(no_truth) == [f"{no_truth}: column 'reward_model' lacks field 'ground_truth'"]

    flat_prompt = _write(tmp_path / "c.parquet", [dict(GOOD_ROW, prompt="What is 1 + 1?")])
    assert validate_parquet(flat_prompt) == [f"{flat_prompt}: column 'prompt' lacks field 'role'",
                                             f"{flat_prompt}: column 'prompt' lacks field 'content'"]

    assert validate_parquet(tmp_path / "nope.parquet") == [f"{tmp_path / 'nope.parquet'}: missing"]


def _out_lines(proc):
    return [ln for ln in proc.stdout.splitlines() if ln.startswith(("TRAIN_FILES=", "VAL_FILES="))]


def test_prep_data_runs_verls_script_then_does_nothing(workspace, tmp_path):
    out = tmp_path / "gsm8k"
    # the real script imports verl: prove the checkout is on its PYTHONPATH
    script = workspace.verl / "examples/data_preprocess/gsm8k.py"
    script.write_text("import verl  # noqa\n" + script.read_text())
    proc = workspace.invoke("prep-data", "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _out_lines(proc) == [f"TRAIN_FILES={out / 'train.parquet'}", f"VAL_FILES={out / 'test.parquet'}"]
    assert "train.parquet 12 rows, test.parquet 4 rows" in proc.stdout
    assert "--local_dataset_path" not in proc.stdout  # no local copy given: the hub (here: synthetic) path
    mtimes = [p.stat().st_mtime_ns for p in sorted(out.iterdir())]

    again = workspace.invoke("prep-data", "--out", str(out))
    assert again.returncode == 0 and "nothing to do" in again.stdout
    assert [p.stat().st_mtime_ns for p in sorted(out.iterdir())] == mtimes


def test_prep_data_local_dataset_only_when_it_exists(workspace, tmp_path):
    raw = tmp_path / "gsm8k_raw"
    raw.mkdir()
    for split, n in (("train", 5), ("test", 3)):
        (raw / f"{split}.jsonl").write_text("".join(
            json.dumps({"question": f"q{i}", "answer": f"a\n#### {i}"}) + "\n" for i in range(n)))
    out = tmp_path / "from_local"
    proc = workspace.invoke("prep-data", "--out", str(out), "--local-dataset-path", str(raw))
    assert proc.returncode == 0, proc.stderr
    assert f"--local_dataset_path {raw}" in proc.stdout and "train.parquet 5 rows, test.parquet 3 rows" in proc.stdout

    out2 = tmp_path / "absent_local"
    proc = workspace.invoke("prep-data", "--out", str(out2), env={"GSM8K_SOURCE_DIR": str(tmp_path / "missing")})
    assert proc.returncode == 0, proc.stderr
    assert "does not exist: verl's script downloads openai/gsm8k from the hub instead" in proc.stdout
    assert "--local_dataset_path" not in proc.stdout.split("&&")[-1]


def test_prep_data_regenerates_a_corrupt_file(workspace, tmp_path):
    out = tmp_path / "gsm8k"
    assert workspace.invoke("prep-data", "--out", str(out)).returncode == 0
    (out / "test.parquet").write_bytes(b"PAR1 broken")
    proc = workspace.invoke("prep-data", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert f"regenerating: {out / 'test.parquet'}: not a readable parquet file" in proc.stdout
    assert validate_parquet(out / "test.parquet") == []


def test_prep_data_errors_are_one_line(workspace, tmp_path):
    out = tmp_path / "gsm8k"
    offline = workspace.invoke("prep-data", "--out", str(out), env={"FIXTURE_OFFLINE": "1"})
    assert offline.returncode == 1 and "Traceback" not in offline.stdout + offline.stderr
    [err] = [ln for ln in offline.stderr.splitlines() if ln.startswith("error: ")]
    assert "ConnectionError: Couldn't reach 'openai/gsm8k'" in err
    assert not (out / "train.parquet").exists()

    env = {k: v for k, v in workspace.env.items() if k != "VERL_REPO"}
    workspace.env = env
    proc = workspace.invoke("prep-data", "--out", str(out))
    assert proc.returncode == 2 and proc.stderr.strip().startswith("error: VERL_REPO is not set")


def test_prep_data_dry_run_writes_nothing(workspace, tmp_path):
    out = tmp_path / "gsm8k"
    proc = workspace.invoke("prep-data", "--out", str(out), "--dry-run")
    assert proc.returncode == 0 and "dry-run: cd " in proc.stdout
    assert f"PYTHONPATH={workspace.verl}{os.pathsep}" in proc.stdout
    assert not out.exists()
