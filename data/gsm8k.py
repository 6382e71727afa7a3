"""GSM8K parquet as verl's `examples/data_preprocess/gsm8k.py` writes it, and its validation (pyarrow)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from env.protocol import exits

# pyarrow is imported where a parquet file is read: importing this module (every `invoke` task does, through
# tasks.py) must not cost pyarrow's 0.7 s start-up, e.g. for `invoke judge`.

# column -> nested fields that verl's PPO data path reads (verl-interface.md, "Data")
REQUIRED_COLUMNS: dict[str, tuple[str, ...]] = {
    "data_source": (),
    "prompt": ("role", "content"),
    "ability": (),
    "reward_model": ("style", "ground_truth"),
    "extra_info": ("split", "index"),
}


def _struct_fields(t: Any) -> set[str] | None:
    import pyarrow as pa

    if pa.types.is_list(t) or pa.types.is_large_list(t):
        t = t.value_type
    if pa.types.is_struct(t):
        return {t.field(i).name for i in range(t.num_fields)}
    return None


def validate_parquet(path: Path | str) -> list[str]:
    """Problems with one GSM8K parquet file, each naming the file; [] when valid. Reads only metadata + schema."""
    path = Path(path)
    if not path.is_file():
        return [f"{path}: missing"]
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises several types for corrupt files
        return [f"{path}: not a readable parquet file ({type(e).__name__}: {str(e).splitlines()[0]})"]
    problems = []
    if pf.metadata.num_rows == 0:
        problems.append(f"{path}: 0 rows")
    schema = pf.schema_arrow
    for column, fields in REQUIRED_COLUMNS.items():
        if column not in schema.names:
            problems.append(f"{path}: missing column '{column}'")
            continue
        if fields:
            present = _struct_fields(schema.field(column).type) or set()
            for f in fields:
                if f not in present:
                    problems.append(f"{path}: column '{column}' lacks field '{f}'")
    return problems


# --- prep-data: verl's own preprocessing script, then the validation above ---------------------------------------

PREPROCESS_SCRIPT = "examples/data_preprocess/gsm8k.py"
SPLITS = ("train.parquet", "test.parquet")


def row_count(path: Path) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_rows


def prep_argv(python: str, out_dir: Path, local_dataset_path: Path | None) -> list[str]:
    """verl's flags: --local_save_dir always; --local_dataset_path only for a copy that exists (else the hub)."""
    argv = [python, PREPROCESS_SCRIPT, "--local_save_dir", str(out_dir)]
    if local_dataset_path is not None and Path(local_dataset_path).exists():
        argv += ["--local_dataset_path", str(local_dataset_path)]
    return argv


def prep_data(verl_repo: Path, out_dir: Path, local_dataset_path: Path | None, python: str,
              environ: dict[str, str], dry_run: bool = False, echo=print) -> int:
    """Write and validate GSM8K parquet; 0 when valid files are there (before or after), 1 otherwise."""
    import os
    import shlex
    import subprocess

    files = [out_dir / name for name in SPLITS]
    before = {f: validate_parquet(f) for f in files}
    if not any(before.values()):
        counts = ", ".join(f"{f.name} {row_count(f)} rows" for f in files)
        echo(f"valid GSM8K parquet already in {out_dir} ({counts}): nothing to do")
        return 0
    for problems in before.values():
        for p in problems:
            if not p.endswith(": missing"):
                echo(f"regenerating: {p}")
    script = Path(verl_repo) / PREPROCESS_SCRIPT
    if not script.is_file():
        echo(f"error: {script} not found (is VERL_REPO a verl checkout?)")
        return exits.BLOCKED
    argv = prep_argv(python, out_dir, local_dataset_path)
    if local_dataset_path is not None and "--local_dataset_path" not in argv:
        echo(f"{local_dataset_path} does not exist: verl's script downloads openai/gsm8k from the hub instead")
    # verl's script imports verl (hdfs_io): the checkout must be importable
    old = environ.get("PYTHONPATH")
    env = dict(environ, PYTHONPATH=os.pathsep.join([str(verl_repo)] + ([old] if old else [])))
    echo(f"{'dry-run: ' if dry_run else ''}cd {shlex.quote(str(verl_repo))} && PYTHONPATH={shlex.quote(env['PYTHONPATH'])} "
         f"{shlex.join(argv)}")
    if dry_run:
        return 0
    try:
        proc = subprocess.run(argv, cwd=verl_repo, env=env, capture_output=True, text=True)
    except FileNotFoundError:
        echo(f"error: Python {python!r} not found (set VERL_PYTHON / --python)")
        return exits.BLOCKED
    if proc.returncode != 0:
        lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()] or ["no output"]
        echo(f"error: {PREPROCESS_SCRIPT} failed (exit {proc.returncode}): {lines[-1]}")
        # a missing package (datasets, verl's own imports) is the environment, as everywhere else: Blocked
        return exits.BLOCKED if "No module named" in proc.stderr else exits.FAIL
    problems = [p for f in files for p in validate_parquet(f)]
    if problems:
        echo(f"error: {PREPROCESS_SCRIPT} wrote invalid parquet: {'; '.join(problems)}")
        return 1
    counts = ", ".join(f"{f.name} {row_count(f)} rows" for f in files)
    echo(f"wrote {out_dir} ({counts})")
    print(f"TRAIN_FILES={files[0]}\nVAL_FILES={files[1]}", flush=True)
    return 0


def prep_data_command(c, flags: dict, dry_run: bool = False) -> int:
    """Body of `invoke prep-data` (settings: GSM8K_DIR, GSM8K_SOURCE_DIR, VERL_REPO, VERL_PYTHON)."""
    import os
    import sys

    from env.settings import UsageError, config_section, resolve

    settings = resolve(flags, os.environ, config_section(getattr(c, "config", None)))
    if settings.verl_repo is None:
        raise UsageError("VERL_REPO is not set (--verl-repo or VERL_REPO): prep-data runs verl's own script")
    if not Path(settings.verl_repo).is_dir():
        raise UsageError(f"VERL_REPO {settings.verl_repo} does not exist")
    source = settings.gsm8k_source
    if source is not None and settings.source("gsm8k_source") == "flag" and not Path(source).exists():
        # a path typed on the command line is meant: no silent hub download (GSM8K_SOURCE_DIR may point ahead)
        raise UsageError(f"--local-dataset-path {source} does not exist")

    def say(msg: str) -> None:
        stream = sys.stderr if msg.startswith("error: ") else sys.stdout
        print(msg if msg.startswith("error: ") else f"[prep-data] {msg}", file=stream, flush=True)

    return prep_data(Path(settings.verl_repo), Path(settings.gsm8k_dir), settings.gsm8k_source,
                     str(settings.python or "python3"), dict(os.environ), dry_run, say)
