"""Check, on real checkouts, the fact behind the plan's PEFT-switch settings: a `++actor_rollout_ref.model.lora.X=V`
override reaches the PEFT object verl builds (verl's own `get_peft_cls`, which hands `model.lora` to Bridge's
`create_peft`).

    /work/venv/bin/python bench/peft_switch.py --python PY --verl VERL --bridge BRIDGE [--field normalize_moe_lora=True]

PY: a Python with verl's and Bridge's dependencies (torch, hydra-core, omegaconf, transformers, megatron-core's);
`VERL`, `BRIDGE/src` and `BRIDGE/3rdparty/Megatron-LM` go on its PYTHONPATH (before the caller's own). For each field it composes verl's
`ppo_megatron_trainer` config (LoRA rank 4) with and without the override, builds the PEFT object through verl's
`get_peft_cls`, and prints the class and the field's value in both. Exit 0 when the override sets the field and the
default does not, 1 otherwise, 2 on bad usage. Nothing is written to the checkouts.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, sys, types
from hydra import compose, initialize_config_dir
from verl.workers.config.megatron_peft import get_peft_cls

config_dir, field, value = sys.argv[1], sys.argv[2], sys.argv[3]
out = {}
for name, extra in (("default", []), ("override", [f"++actor_rollout_ref.model.lora.{field}={value}"])):
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose(config_name="ppo_megatron_trainer", overrides=["actor_rollout_ref.model.lora.rank=4", *extra])
    peft = get_peft_cls(types.SimpleNamespace(lora=cfg.actor_rollout_ref.model.lora), object(), object())
    out[name] = {"class": type(peft).__name__, "value": repr(getattr(peft, field, "<no such field>"))}
print("RESULT " + json.dumps(out))
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", required=True, help="a Python with verl's and Bridge's dependencies")
    ap.add_argument("--verl", required=True, type=Path)
    ap.add_argument("--bridge", required=True, type=Path)
    ap.add_argument("--field", action="append", default=[], help="FIELD=VALUE (default normalize_moe_lora=True)")
    args = ap.parse_args(argv)
    config_dir = args.verl / "verl" / "trainer" / "config"
    if not (config_dir / "ppo_megatron_trainer.yaml").is_file() or not (args.bridge / "src" / "megatron").is_dir():
        print(f"error: need a verl checkout ({config_dir}) and a Megatron-Bridge checkout ({args.bridge}/src)",
              file=sys.stderr)
        return 2
    fields = args.field or ["normalize_moe_lora=True"]
    if any("=" not in f for f in fields):
        print("error: --field must read FIELD=VALUE", file=sys.stderr)
        return 2
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(args.verl), str(args.bridge / "src"), str(args.bridge / "3rdparty" / "Megatron-LM"),
         *filter(None, [os.environ.get("PYTHONPATH")])])}  # the caller's own entries after the checkouts
    ok = True
    for spec in fields:
        field, value = spec.split("=", 1)
        proc = subprocess.run([args.python, "-c", CHILD, str(config_dir), field, value], env=env,
                              capture_output=True, text=True, timeout=600)
        line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            print(f"{field}: no result (rc {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
            ok = False
            continue
        got = json.loads(line[len("RESULT "):])
        reached = got["override"]["value"] == value and got["default"]["value"] != value
        ok &= reached
        print(f"{field}: default {got['default']['class']}.{field}={got['default']['value']}; with "
              f"++actor_rollout_ref.model.lora.{field}={value}: {got['override']['class']}.{field}="
              f"{got['override']['value']} -> {'reaches the PEFT object' if reached else 'NOT reached'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
