"""How many GPUs this machine offers a run (nvidia-smi, else torch); NUM_GPUS/--num-gpus always win."""

from __future__ import annotations

import shutil
import subprocess


def detect_gpus() -> tuple[int, str]:
    """(count, how it was found). Never raises: no tool means 0 GPUs."""
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
            if out.returncode == 0:
                return sum(1 for ln in out.stdout.splitlines() if ln.startswith("GPU ")), "nvidia-smi -L"
        except (OSError, subprocess.TimeoutExpired):
            pass
    try:
        import torch  # noqa: PLC0415 - optional, heavy

        return torch.cuda.device_count(), "torch.cuda.device_count()"
    except Exception:
        return 0, "no nvidia-smi, no torch"
