"""Check the tool against real upstream checkouts: every level's command composes with verl's own Hydra config, and
`nox -s bridge_unit` runs on the real Megatron-Bridge.

    /work/venv/bin/python bench/upstream.py --verl ~/verl-v090 --verl ~/verl --bridge ~/Megatron-Bridge \
        [--scratch DIR] [--hydra-python PY] [--skip-bridge-unit]

The checkouts are copied to DIR first (bridge_unit writes a .venv and records; nothing touches the originals). For
each verl checkout and each level (and level 2 variant): the level's own `--dry-run` gives the environment and the
command the run would start (preflight runs as for a run: missing Apex / nsys append their overrides); the real
wrapper `tests/special_e2e/run_ppo_trainer_megatron.sh` runs with that environment and command, with `python3`,
`python` and `uv` stubbed, which records the trainer's override list; `hydra.compose` on the checkout's own
`verl/trainer/config` composes that list (in a scratch venv with hydra-core, made with uv outside this project unless
--hydra-python is given). One line per level and verl version: `valid` or the Hydra error, and, where the tool
turned gradient_accumulation_fusion off, whether the ref still holds the actor's whole override_transformer_config.
Then `nox -s bridge_unit` on the Bridge copy prints its record's result and reason.
Exit 0 when every line is valid, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WRAPPER = "tests/special_e2e/run_ppo_trainer_megatron.sh"
LEVELS = [("0", []), ("1", []), ("2", ["--variant", "dense"]), ("2", ["--variant", "moe"]), ("3", []), ("4", []),
          ("5", [])]
TRAINER = "verl.trainer.main_ppo"

# Stands in for python3 / python / uv: device detection (`python3 -`) answers cuda, everything else is recorded.
STUB = """#!/usr/bin/env bash
if [ "${@: -1}" = "-" ]; then cat >/dev/null; echo cuda; exit 0; fi
printf '%s\\0' "$@" > "$TRACE_DIR/$(date +%s%N).argv"
"""

COMPOSE = r"""
import json, sys
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
config_dir, config_name, overrides = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
out = {}
try:
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose(config_name=config_name, overrides=overrides)
    def otc(role):
        node = OmegaConf.select(cfg, role + ".megatron.override_transformer_config")
        return OmegaConf.to_container(node, resolve=True) if node is not None else None
    out["actor"] = otc("actor_rollout_ref.actor")
    out["ref"] = otc("actor_rollout_ref.ref")
    out["critic"] = otc("critic")
    out["valid"] = True
except Exception as e:
    out["error"] = f"{type(e).__name__}: {e}".strip()
print(json.dumps(out))
"""


def say(msg: str) -> None:
    print(msg, flush=True)


def copy_checkout(src: Path, scratch: Path, name: str) -> Path:
    dest = scratch / name
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest, symlinks=True)
    return dest


def version_of(verl: Path) -> str:
    tag = subprocess.run(["git", "-C", str(verl), "describe", "--tags", "--exact-match"], capture_output=True,
                         text=True).stdout.strip()
    head = subprocess.run(["git", "-C", str(verl), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    return f"{tag} ({head})" if tag else f"HEAD {head}"


def hydra_python(scratch: Path, given: str | None) -> str:
    if given:
        return given
    venv = scratch / "hydra-venv"
    if not (venv / "bin/python").exists():
        subprocess.run(["uv", "venv", "-q", "--python", sys.executable, str(venv)], check=True)
        subprocess.run(["uv", "pip", "install", "-q", "--python", str(venv / "bin/python"), "hydra-core",
                        "omegaconf"], check=True)
    return str(venv / "bin/python")


def dry_run(level: str, args: list[str], env: dict[str, str]) -> list[tuple[dict[str, str], list[str]]]:
    """[(exported environment, wrapper argv)] for each run of the level, from its --dry-run."""
    proc = subprocess.run([sys.executable, "-m", "invoke", f"level{level}", *args, "--dry-run"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"invoke level{level} --dry-run exit {proc.returncode}: "
                           f"{(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
    runs, exports = [], {}
    for line in proc.stdout.splitlines():
        if line.startswith("# run "):
            exports = {}
        elif line.startswith("export "):
            key, _, value = line[len("export "):].partition("=")
            exports[key] = (shlex.split(value) or [""])[0]
        elif line.startswith(f"bash {WRAPPER}"):
            runs.append((exports, shlex.split(line)))
    if not runs:
        raise RuntimeError(f"invoke level{level} --dry-run printed no wrapper command")
    return runs


def trace_wrapper(verl: Path, exports: dict[str, str], argv: list[str], base_env: dict[str, str],
                  scratch: Path) -> list[str]:
    """The trainer's override list, as the real wrapper builds it (python and uv stubbed)."""
    stubs = Path(tempfile.mkdtemp(prefix="stubs-", dir=scratch))
    trace = stubs / "trace"
    trace.mkdir()
    for name in ("python3", "python", "uv"):
        (stubs / name).write_text(STUB)
        (stubs / name).chmod(0o755)
    env = dict(base_env, **exports, TRACE_DIR=str(trace))
    env["PATH"] = f"{stubs}{os.pathsep}{env.get('PATH', '')}"
    proc = subprocess.run(argv, cwd=verl, env=env, capture_output=True, text=True, timeout=120)
    calls = [f.read_bytes().split(b"\0")[:-1] for f in sorted(trace.glob("*.argv"))]
    for call in calls:
        args = [a.decode() for a in call]
        if TRAINER in args:
            rest = args[args.index(TRAINER) + 1:]
            return [a for a in rest if not a.startswith("--config-")]
    raise RuntimeError(f"the wrapper never started {TRAINER} (exit {proc.returncode}): "
                       f"{proc.stderr.strip().splitlines()[-1:] if proc.stderr.strip() else 'no output'}")


def compose(python: str, verl: Path, overrides: list[str]) -> dict:
    proc = subprocess.run([python, "-c", COMPOSE, str(verl / "verl/trainer/config"), "ppo_megatron_trainer",
                           json.dumps(overrides)], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0 or not proc.stdout.strip():
        return {"error": f"compose exited {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def judge_composed(result: dict, overrides: list[str]) -> tuple[bool, str]:
    if "error" in result:
        return False, result["error"].splitlines()[0]
    text = f"valid ({len(overrides)} overrides)"
    if any("gradient_accumulation_fusion=False" in o for o in overrides):
        actor, ref = result.get("actor") or {}, result.get("ref") or {}
        if ref.get("gradient_accumulation_fusion") is not False:
            return False, f"composes, but the ref keeps gradient_accumulation_fusion on ({len(overrides)} overrides)"
        if ref != actor:
            lost = sorted(set(actor) - set(ref))
            return False, (f"composes, but the ref lost the actor's override_transformer_config keys: "
                           f"{', '.join(lost)} ({len(overrides)} overrides)")
        text += (f"; ref keeps the actor's override_transformer_config ({len(ref)} keys) with "
                 f"gradient_accumulation_fusion=False")
    return True, text


def bridge_unit(bridge: Path, log_dir: Path, env: dict[str, str], posargs: list[str] = ()) -> dict:
    """`nox -s bridge_unit [-- posargs]` on the Bridge copy: its record."""
    proc = subprocess.run([sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), "-s", "bridge_unit",
                           *(["--", *posargs] if posargs else [])],
                          cwd=ROOT, env=dict(env, BRIDGE_REPO=str(bridge), LOG_DIR=str(log_dir)),
                          capture_output=True, text=True, timeout=3600)
    out = proc.stdout + proc.stderr
    with open(log_dir / "bridge_unit.out", "a") as f:
        f.write(out)
    record_line = [ln for ln in out.splitlines() if ln.startswith("bridge_unit record: ")]
    if not record_line:
        return {"result": "no record", "detail": f"exit {proc.returncode}: {out.strip().splitlines()[-1:]}"}
    return json.loads(Path(record_line[-1].split(": ", 1)[1]).read_text())


def describe_record(record: dict) -> str:
    reached = "reached pytest" if record.get("pytest_exit") is not None else "did not reach pytest"
    return f"{record['result']} ({reached}): {record['detail']}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--verl", action="append", required=True, help="a verl checkout (repeat for several versions)")
    ap.add_argument("--bridge", required=True, help="a Megatron-Bridge checkout")
    ap.add_argument("--scratch", help="where the copies, the hydra venv and the logs go (default: a new temp dir)")
    ap.add_argument("--hydra-python", help="a Python with hydra-core (default: a scratch venv made with uv)")
    ap.add_argument("--skip-bridge-unit", action="store_true")
    opts = ap.parse_args(argv)
    for path in [*opts.verl, opts.bridge]:
        if not (Path(path) / ".git").exists():
            print(f"error: {path} is not a git checkout", file=sys.stderr)
            return 2
    scratch = Path(opts.scratch or tempfile.mkdtemp(prefix="verl-e2e-upstream-")).absolute()
    scratch.mkdir(parents=True, exist_ok=True)
    say(f"scratch: {scratch}")
    bridge = copy_checkout(Path(opts.bridge).expanduser(), scratch, "bridge")
    verls = [copy_checkout(Path(v).expanduser(), scratch, f"verl-{i}") for i, v in enumerate(opts.verl)]
    python = hydra_python(scratch, opts.hydra_python)
    data = scratch / "data"
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("BRIDGE_", "VERL_", "RAY_"))}
    base_env.update(MODEL_ID="Qwen/Qwen2.5-0.5B", MODEL_PATH=str(scratch / "models/Qwen2.5-0.5B"),
                    TRAIN_FILES=str(data / "train.parquet"), VAL_FILES=str(data / "test.parquet"), NUM_GPUS="8",
                    LOG_DIR=str(scratch / "logs"), BRIDGE_REPO=str(bridge), VERL_E2E_RAY_PROBE="0")
    all_valid = True
    for verl in verls:
        version = version_of(verl)
        env = dict(base_env, VERL_REPO=str(verl))
        for level, args in LEVELS:
            name = f"verl {version} level{level}{' ' + args[-1] if args else ''}"
            try:
                for i, (exports, wrapper_argv) in enumerate(dry_run(level, args, env)):
                    overrides = trace_wrapper(verl, exports, wrapper_argv, env, scratch)
                    ok, text = judge_composed(compose(python, verl, overrides), overrides)
                    all_valid &= ok
                    say(f"{name}{' run ' + 'AB'[i] if level == '1' else ''}: {text}")
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                all_valid = False
                say(f"{name}: error: {e}")
    if not opts.skip_bridge_unit:
        log_dir = scratch / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        head = subprocess.run(["git", "-C", str(bridge), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
        record = bridge_unit(bridge, log_dir, base_env)
        say(f"nox -s bridge_unit on Megatron-Bridge {head}: {describe_record(record)}")
        if record.get("blocked_by") == "missing-path":  # then what the tool offers: the rest + the successors
            carried = [t for ts in (record.get("successors") or {}).values() for t in ts]
            posargs = ["--allow-missing", *dict.fromkeys(carried)]
            record = bridge_unit(bridge, log_dir, base_env, posargs)
            say(f"nox -s bridge_unit -- {shlex.join(posargs)}: {describe_record(record)}")
    return 0 if all_valid else 1


if __name__ == "__main__":
    sys.exit(main())
