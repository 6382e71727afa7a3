"""GSM8K parquet as verl's `examples/data_preprocess/gsm8k.py` writes it, and its validation (pyarrow)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

# column -> nested fields that verl's PPO data path reads (verl-interface.md, "Data")
REQUIRED_COLUMNS: dict[str, tuple[str, ...]] = {
    "data_source": (),
    "prompt": ("role", "content"),
    "ability": (),
    "reward_model": ("style", "ground_truth"),
    "extra_info": ("split", "index"),
}


def _struct_fields(t: pa.DataType) -> set[str] | None:
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
