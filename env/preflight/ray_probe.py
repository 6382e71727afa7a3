"""Preflight 3: a Ray worker imports the same `megatron.bridge` as the driver.

verl does not ship code to its workers: they import what their environment has, and the run gives them
PYTHONPATH through `++ray_kwargs.ray_init.runtime_env.env_vars.PYTHONPATH=...`. The probe does the same thing
with Ray itself: `ray.init(runtime_env={"env_vars": {"PYTHONPATH": ...}})` — on the cluster at `--ray-address`,
else on a throwaway local cluster — and asks one task per alive node where `megatron.bridge` and
`megatron.core` come from. The driver process gets no Bridge on its own PYTHONPATH, so only runtime_env can make
the worker import pass, as in the real run.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from env.preflight import probe_cache
from env.preflight.checks import BLOCKED, OK, SKIPPED, WARN, Check
from env.preflight.pythonpath import is_under, run_entries, run_probe
from env.preflight.ray_function import RAY_FUNCTION
from env.repos import MEGATRON_LM

if TYPE_CHECKING:
    from env.preflight.checks import RunContext

PROBE_TIMEOUT_S = 180.0  # local cluster start + worker start; a hung probe must not eat the run

# Runs in the run's Python; prints one JSON line. argv: address ("" = throwaway local), worker PYTHONPATH.
_RAY_PROBE = RAY_FUNCTION + r"""
import json, sys
print(json.dumps(ray_answer(sys.argv[1], sys.argv[2])))
"""


@dataclass
class RayProbe:
    address: str | None  # None: a throwaway local cluster
    workers: list[dict] = field(default_factory=list)  # one per alive node
    cluster_cpus: float | None = None
    driver_error: str | None = None


def _driver_pythonpath(environ: dict[str, str], own_entries: list[str]) -> str:
    """The driver's PYTHONPATH without the run's own entries (the checkouts under test): the worker must get those
    from runtime_env alone. Everything else the user has there (e.g. the stack with ray itself) stays."""
    own = set(own_entries)
    return os.pathsep.join(p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in own)


def probe_ray_worker(python: str, pythonpath: str, address: str | None = None, cwd: Path | None = None,
                     environ: dict[str, str] | None = None, timeout: float = PROBE_TIMEOUT_S,
                     own_entries: list[str] | None = None) -> RayProbe:
    """Ask a Ray worker (one per node) where it imports megatron.bridge / megatron.core from.

    own_entries: the checkouts' PYTHONPATH entries, kept from the driver (default: all of `pythonpath`)."""
    environ = dict(os.environ if environ is None else environ)
    env = {k: v for k, v in environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = _driver_pythonpath(environ, own_entries if own_entries is not None
                                           else pythonpath.split(os.pathsep))
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    probe = RayProbe(address)
    try:
        proc = run_probe([python, "-c", _RAY_PROBE, address or "", pythonpath], env=env, cwd=cwd, timeout=timeout)
    except FileNotFoundError:
        probe.driver_error = f"Python {python!r} not found"
        return probe
    except subprocess.TimeoutExpired:
        probe.driver_error = f"Ray probe did not finish in {timeout:.0f}s"
        return probe
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        probe.driver_error = f"Ray probe exited {proc.returncode}: {tail}"
        return probe
    data = json.loads(lines[-1])
    probe.workers = data.get("workers") or []
    probe.cluster_cpus = data.get("cluster_cpus")
    probe.driver_error = data.get("driver_error")
    return probe


def _ray_fact(ctx: RunContext) -> RayProbe:
    """The worker probe. A throwaway local cluster's answer depends only on the run's Python, PYTHONPATH and files:
    it goes through the probe cache. An attached cluster (RAY_ADDRESS / --ray-address) is asked every time: its
    nodes can change under us, and attaching costs no cluster start."""
    address = ctx.settings.ray_address

    def run() -> tuple[dict, bool]:
        probe = probe_ray_worker(ctx.python, ctx.pythonpath, address, cwd=Path(ctx.verl.path), environ=ctx.environ,
                                 own_entries=run_entries(Path(ctx.bridge.path), Path(ctx.verl.path)))
        return asdict(probe), probe.driver_error is None

    if address:
        return RayProbe(**run()[0])
    return RayProbe(**probe_cache.through(ctx, "ray", ["local"], run))


def ray_probe_on(ctx: RunContext) -> bool:
    return bool(ctx.probe and ctx.settings.values.get("ray_probe", True))


def start_ray_probe(ctx: RunContext) -> None:
    """Start the worker probe next to the driver's import probe (the heavy phase), when it is switched on."""
    if ray_probe_on(ctx):
        ctx.facts.start("ray", lambda: _ray_fact(ctx))


def check_ray_worker(ctx: RunContext) -> Iterable[Check]:
    """Preflight 3: a Ray worker, given the run's runtime_env PYTHONPATH, imports this Bridge checkout."""
    name = "Ray worker imports the local Bridge"
    if not ctx.probe:
        yield Check(name, SKIPPED, "dry-run: Ray probe not run")
        return
    if not ctx.settings.values.get("ray_probe", True):
        ctx.limitations.append("Ray worker import not probed before the run (VERL_E2E_RAY_PROBE=0): only the driver "
                               "import was checked")
        yield Check(name, SKIPPED, "VERL_E2E_RAY_PROBE=0: worker import not checked before the run")
        return
    address = ctx.settings.ray_address
    where = f"Ray cluster at {address}" if address else "a throwaway local Ray cluster"
    fix = f"++ray_kwargs.ray_init.runtime_env.env_vars.PYTHONPATH={ctx.pythonpath} (the level adds it)"
    probe = ctx.facts.get("ray", lambda: _ray_fact(ctx))
    if address and probe.cluster_cpus is not None:
        ctx.evidence["ray_cluster_cpus"] = probe.cluster_cpus
    if probe.driver_error:
        missing_ray = probe.driver_error.startswith("cannot import ray")
        if address:
            fix_driver = ("check RAY_ADDRESS / --ray-address, that the cluster is up and, with Ray token auth, "
                          "that RAY_AUTH_TOKEN or ~/.ray/auth_token holds its token")
        elif missing_ray:
            fix_driver = f"install ray in {ctx.python} (the Python that runs verl)"
        else:  # ray is there but a local cluster would not start (load, /tmp space, ports)
            fix_driver = ("check that `ray start --head` works on this host (load, /tmp space, ports), "
                          "or attach to a running cluster with --ray-address")
        category = "env-dependency" if missing_ray else "env-ray-import"
        yield Check(name, BLOCKED, f"{where}: {probe.driver_error}", fix_driver, category)
        return
    bridge_src = Path(ctx.bridge.path) / "src"
    expected_core = Path(ctx.bridge.path) / MEGATRON_LM
    for worker in probe.workers:
        host = worker.get("host", "?")
        bridge = worker.get("megatron.bridge", {})
        bridge_file = bridge.get("file")
        if bridge.get("error") and not is_under(bridge_file, bridge_src):
            yield Check(name, BLOCKED,
                        f"{where}, worker on {host}: {bridge['error']} (worker PYTHONPATH={worker.get('pythonpath')})",
                        f"give the workers the checkout through runtime_env: {fix}; on a multi-node cluster the "
                        f"checkout must exist at {bridge_src} on every node", "env-ray-import")
            return
        if not is_under(bridge_file, bridge_src):
            yield Check(name, BLOCKED, f"{where}, worker on {host} imports megatron.bridge from {bridge_file}, "
                        f"not {bridge_src}", f"put {bridge_src} first in the workers' PYTHONPATH: {fix}",
                        "wrong-bridge")
            return
        ctx.evidence.setdefault("worker_bridge_file", bridge_file)
        core = worker.get("megatron.core", {})
        ctx.evidence.setdefault("worker_core_file", core.get("file"))
        detail = (f"{where}, worker on {host} resolves megatron.bridge to {bridge_file} (find_spec; imported "
                  "once, by the driver probe, same Python)")
        driver_error = ctx.imports.error_of("megatron.bridge") if ctx.imports is not None else None
        if driver_error and not bridge.get("error"):
            # found where it should be, but the same Python cannot import it: never a ✔
            bridge = dict(bridge, error=driver_error)
        if bridge.get("error"):
            # the checkout is found but does not import: never a ✔ (the driver check names the missing package)
            yield Check(name, BLOCKED, f"{detail}, but importing it fails: {bridge['error']}",
                        "install the missing package in the run's Python (the workers run the same Python)",
                        "env-dependency")
            return
        yield Check(name, OK, detail)
        if is_under(core.get("file"), expected_core):
            yield Check("Ray worker megatron.core origin", OK, f"{core.get('file')} ({host})")
        else:
            yield Check("Ray worker megatron.core origin", WARN,
                        f"worker on {host}: megatron.core from {core.get('file') or core.get('error')}, "
                        f"not {expected_core}", f"check out the {MEGATRON_LM} submodule (git submodule update --init)")
