"""The Ray worker probe's code, as source text run in the run's Python (ray_probe.py runs it alone; pythonpath.py
runs it inside the import probe's process). A module of its own so both import it without importing each other;
probe_cache.py keys cached answers on this folder's files, this one included."""

# One function, run in the run's Python: by the Ray probe alone, or in the import probe's own process (the heavy
# phase's one process: the cluster starts while the imports run). Returns the probe's JSON answer.
RAY_FUNCTION = r"""
def ray_answer(address, pythonpath):
    import json, sys
    out = {}
    try:
        import ray
    except BaseException as e:
        return {"driver_error": f"cannot import ray: {type(e).__name__}: {e}".splitlines()[0]}
    runtime_env = {"env_vars": {"PYTHONPATH": pythonpath}}
    try:
        if address:
            ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
        else:
            ray.init(address="local", num_cpus=1, include_dashboard=False, runtime_env=runtime_env,
                     log_to_driver=False)
    except BaseException as e:
        return {"driver_error": f"ray.init failed: {type(e).__name__}: {e}".splitlines()[0]}

    @ray.remote(num_cpus=0)
    def where():
        import importlib.util, os, socket
        res = {"host": socket.gethostname(), "pythonpath": os.environ.get("PYTHONPATH", ""), "python": sys.executable}
        for mod in ("megatron.bridge", "megatron.core"):
            # where the worker resolves it (find_spec: no module code runs). The import itself is the driver
            # probe's, in the same Python with the same PYTHONPATH: nothing is imported twice.
            try:
                spec = importlib.util.find_spec(mod)
            except BaseException as e:
                res[mod] = {"error": f"{type(e).__name__}: {e}".splitlines()[0]}
                continue
            if spec is None:
                res[mod] = {"error": f"ModuleNotFoundError: No module named '{mod}'"}
            elif spec.origin not in (None, "namespace"):
                res[mod] = {"file": spec.origin}
            else:
                res[mod] = {"file": list(spec.submodule_search_locations)[0]}
        return res

    try:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        refs = [where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote()
                for n in nodes] or [where.remote()]
        out["workers"] = ray.get(refs, timeout=90)
        out["cluster_cpus"] = ray.cluster_resources().get("CPU", 0)
    except BaseException as e:
        out["driver_error"] = f"worker probe failed: {type(e).__name__}: {e}".splitlines()[0]
    finally:
        ray.shutdown()
    return out
"""
