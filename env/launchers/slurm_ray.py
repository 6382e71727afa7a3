"""`invoke slurm --nodes N`: one Ray cluster across the allocation, the way verl's examples/slurm/ray_on_slurm.slurm
makes it — `ray start --head` on the first node, `ray start --address <head>` on the others (one task per node, the
same container image and mounts), then the level on the head with `trainer.nnodes=N trainer.n_gpus_per_node=G`.

Unlike the recipe's `sleep 10`, every wait is on an event, through files in a rendezvous folder under
`$LOG_DIR/slurm/` (a shared filesystem on a real cluster: that is why a node-local LOG_DIR is refused):
- each node task first probes, with the PYTHONPATH the run gives its Ray workers, where `megatron.bridge` and
  `megatron.core` come from *on that node* (`probe-<node>.json`: a per-node PYTHONPATH or mount mistake is the
  multi-node trap), then starts its Ray node in its own session and marks `up-<node>` once Ray says it started;
- workers wait for `up-<head>`; the head step waits for every `up-*`, then until Ray shows N alive nodes and N×G
  GPUs, reads every probe and names the node that imports another Bridge (exit 3, Blocked: the cluster, not the
  provider), then runs the task with RAY_ADDRESS and NUM_GPUS=N×G;
- teardown: `done` is written on success, failure and Ctrl-C (the driver's EXIT trap); each node task then stops
  the Ray processes *it* started (TERM, then KILL, to that Ray's own process group: `ray stop` would end every
  Ray on the machine, another user's on a shared node or — on the one-machine test cluster — the other node's).
  Slurm ends whatever is left of the step afterwards.

Ray ports: the head's GCS port is --ray-port P (default 6379), its client server P+100; per node the dashboard agent
listens on P+1+rank and workers take a port range offset by the rank; the temp dir is per job and rank — so several
Ray nodes (and the one-machine test cluster) can share a host.
"""

from __future__ import annotations

import shlex

from env.settings import TOOL_PREFIX

JOIN_TIMEOUT_S = 600  # a node's Ray never started / never joined: the allocation is broken, stop (exit 3)
# `ray start` gives up when its raylet has not registered with the GCS within a wait fixed in Ray
# (`raylet_start_wait_time_s = 30`, ray/_private/node.py): a busy machine, not a broken node. That failure alone
# is tried again; any other start failure stops the node at once.
REGISTRATION_TIMEOUT = "The current node timed out during startup"
START_ATTEMPTS = 3

# Runs in the node's Python, with the workers' PYTHONPATH. argv: output file.
NODE_PROBE = r"""
import importlib, json, os, socket, sys
res = {"node": os.environ.get("SLURMD_NODENAME"), "rank": os.environ.get("SLURM_NODEID"),
       "host": socket.gethostname(), "python": sys.executable, "pythonpath": os.environ.get("PYTHONPATH", ""),
       "node_pythonpath": os.environ.get("VERL_E2E_NODE_PYTHONPATH", "")}
for mod in ("megatron.bridge", "megatron.core"):
    try:
        m = importlib.import_module(mod)
        res[mod] = {"file": getattr(m, "__file__", None) or list(getattr(m, "__path__", []))[0]}
    except BaseException as e:
        res[mod] = {"error": f"{type(e).__name__}: {e}".splitlines()[0]}
tmp = sys.argv[1] + ".tmp"
with open(tmp, "w") as f:
    json.dump(res, f)
os.replace(tmp, sys.argv[1])
"""

# Runs on the head (the run's Python). argv: rendezvous dir, Bridge src, nodes (space separated). Exit 3 on a node
# that imports another Bridge (or none), naming it.
PROBE_CHECK = r"""
import json, os, sys
rdv, src, nodes = sys.argv[1], sys.argv[2].rstrip("/"), sys.argv[3].split()
bad = []
for node in nodes:
    path = os.path.join(rdv, f"probe-{node}.json")
    if not os.path.isfile(path):
        bad.append(f"node {node}: no import probe result (its task did not get that far; see its lines above)")
        continue
    p = json.load(open(path))
    b = p.get("megatron.bridge", {})
    f = b.get("file") or ""
    if b.get("error"):
        bad.append(f"node {node} (host {p['host']}): megatron.bridge does not import: {b['error']} "
                   f"(workers' PYTHONPATH={p['pythonpath']})")
    elif not (f == src or f.startswith(src + os.sep)):
        bad.append(f"node {node} (host {p['host']}) imports megatron.bridge from {f}, not from {src}: another "
                   f"Bridge (workers' PYTHONPATH={p['pythonpath']}; the checkout must be at that path, and mounted, "
                   f"on every node)")
    else:
        core = (p.get("megatron.core") or {}).get("file") or (p.get("megatron.core") or {}).get("error")
        print(f"[verl-e2e] node {node} (host {p['host']}): megatron.bridge from {f}; megatron.core from {core}",
              flush=True)
for line in bad:
    print(f"[verl-e2e] {line}", flush=True)
if bad:
    print(f"[verl-e2e] worker import probe: {len(bad)} of {len(nodes)} node(s) would not run this Bridge: "
          f"Blocked (cluster setup, not evidence against the provider)", flush=True)
    sys.exit(3)
print(f"[verl-e2e] worker import probe: all {len(nodes)} nodes import megatron.bridge from {src}", flush=True)
"""

# Runs on the head (the run's Python). argv: address, nodes, GPUs per node (0: not checked), timeout s.
CLUSTER_WAIT = r"""
import sys, time
address, n, g, timeout = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
try:
    import ray
    ray.init(address=address, log_to_driver=False)
except BaseException as e:
    print(f"[verl-e2e] cannot attach to the Ray head at {address}: {type(e).__name__}: {e}".splitlines()[0],
          flush=True)
    sys.exit(3)
deadline = time.monotonic() + timeout
while True:
    alive = [x for x in ray.nodes() if x.get("Alive")]
    gpus = sum(x.get("Resources", {}).get("GPU", 0) for x in alive)
    if len(alive) >= n and gpus >= n * g:
        ips = ", ".join(sorted(x["NodeManagerAddress"] for x in alive))
        print(f"[verl-e2e] ray cluster at {address}: {len(alive)} nodes ({ips}), {gpus:g} GPUs", flush=True)
        break
    if time.monotonic() > deadline:
        print(f"[verl-e2e] ray cluster at {address} shows {len(alive)} node(s) and {gpus:g} GPU(s) after "
              f"{timeout:.0f}s, not {n} and {n * g}: Blocked (cluster setup)", flush=True)
        sys.exit(3)
    time.sleep(0.5)
ray.shutdown()
"""


def _wait_file(path: str, what: str, timeout_s: int, also_fail: str | None = None) -> list[str]:
    """Shell lines: wait until `path` exists (or the rendezvous says the run is over), else exit 3."""
    fail = f' || [ -e {also_fail} ]' if also_fail else ""
    return [
        f"_w=0; until [ -e {path} ]{fail} || [ -e \"$rdv/done\" ] || [ -e \"$rdv/nodes.exit\" ]; do",
        f"  _w=$((_w+1)); if [ \"$_w\" -gt {timeout_s * 5} ]; then",
        f"    echo \"{TOOL_PREFIX} node $node: {what} not within {timeout_s}s: Blocked (cluster setup)\"; exit 3; fi",
        "  sleep 0.2",
        "done",
    ]


def node_script(*, python: str, ray_port: int, gpus_per_node: int | None, worker_pythonpath: str,
                setup: list[str], exports: list[str], workdir: str, timeout_s: int = JOIN_TIMEOUT_S) -> str:
    """What each node's task runs (one task per node): probe, start its Ray node, wait for `done`, stop it."""
    q = shlex.quote
    ray_main = "import sys; from ray.scripts.scripts import main; sys.argv[0] = 'ray'; sys.exit(main())"
    gpus = f" --num-gpus={int(gpus_per_node)}" if gpus_per_node else ""
    lines = [
        "set -u",
        'node=${SLURMD_NODENAME:-$(hostname -s)}; rank=${SLURM_NODEID:-0}; rdv=$VERL_E2E_RAY_RDV',
        # whatever stops this task early tells the others (they wait on files, not on time)
        # Ray's temp dir is per cluster, not per job id: two Slurm clusters (two suites, a test's own cluster
        # after another's) both have a job 1, and one's `ray stop` removed the other's raylet socket (seen)
        'ray_pid=; tmp=/tmp/verl-e2e-ray-${SLURM_JOB_ID:-0}-$(printf %s "$rdv" | cksum | cut -d" " -f1)-$rank',
        # stops exactly the Ray this task started (its own session / process group): at the end, and on
        # scancel / srun's TERM / Ctrl-C too — an orphaned Ray would escape the step (linuxproc tracks by parent)
        "kill_ray_group() {  # TERM, then KILL, to the process group of the Ray this task started",
        '  kill -TERM -- -"$1" 2>/dev/null',
        '  _s=0; while kill -0 -- -"$1" 2>/dev/null && [ "$_s" -lt 50 ]; do sleep 0.2; _s=$((_s+1)); done',
        '  kill -KILL -- -"$1" 2>/dev/null',
        '  _s=0; while kill -0 -- -"$1" 2>/dev/null && [ "$_s" -lt 50 ]; do sleep 0.2; _s=$((_s+1)); done',
        "}",
        "stop_ray() {",
        '  [ -n "$ray_pid" ] || return 0',
        '  pg=$(cat "$rdv/ray-$node.pgid" 2>/dev/null || echo "$ray_pid"); ray_pid=',
        '  if kill -0 -- -"$pg" 2>/dev/null; then',
        '    kill_ray_group "$pg"',
        f'    echo "{TOOL_PREFIX} node $node: ray stopped"',
        "  else",
        f'    echo "{TOOL_PREFIX} node $node: ray had already exited"; tail -n 20 "$rdv/ray-$node.log"',
        "  fi",
        '  rm -rf "$tmp"; touch "$rdv/stopped-$node"',
        "}",
        "trap 'rc=$?; stop_ray; [ \"$rc\" -eq 0 ] || touch \"$rdv/failed-$node\"' EXIT",
        "trap 'exit 143' TERM INT",
        f'echo "{TOOL_PREFIX} slurm step: job ${{SLURM_JOB_ID:-?}} step ${{SLURM_STEP_ID:-?}} on $(hostname) '
        f'(node $node, rank $rank: ray $([ "$rank" = 0 ] && echo head || echo worker))"',
        *exports,
        f"cd {q(workdir)}",
        *setup,
        # the node's own address, as the driver found it (Slurm's NodeAddr, resolved)
        'ip=""; for pair in $VERL_E2E_RAY_NODES; do [ "${pair%%=*}" = "$node" ] && ip=${pair#*=}; done',
        f'[ -n "$ip" ] || {{ echo "{TOOL_PREFIX} node $node is not in this run\'s node list '
        f'($VERL_E2E_RAY_NODES)"; exit 3; }}',
        'export VERL_E2E_NODE_PYTHONPATH="${PYTHONPATH:-}"',
        f"export PYTHONPATH={q(worker_pythonpath)}",
        f'{q(python)} -c {q(NODE_PROBE)} "$rdv/probe-$node.json" || '
        f'echo "{TOOL_PREFIX} node $node: the import probe itself failed"',
        'head=${VERL_E2E_RAY_HEAD%%=*}',
        f'common="--node-ip-address=$ip{gpus} --disable-usage-stats --block --temp-dir=$tmp '
        f'--dashboard-agent-listen-port=$(({int(ray_port)} + 1 + rank)) --min-worker-port=$((10002 + 1000 * rank)) '
        '--max-worker-port=$((11001 + 1000 * rank))"',
        'if [ -n "${SLURM_CPUS_PER_TASK:-}" ]; then common="$common --num-cpus=$SLURM_CPUS_PER_TASK"; fi',
        'if [ "$rank" = 0 ]; then',
        f'  args="--head --port={int(ray_port)} --ray-client-server-port={int(ray_port) + 100} '
        '--include-dashboard=false $common"',
        "else",
        *("  " + x for x in _wait_file('"$rdv/up-$head"', "the Ray head did not start", timeout_s,
                                      also_fail='"$rdv/failed-$head"')),
        '  [ -e "$rdv/up-$head" ] || exit 3',
        '  args="--address=${VERL_E2E_RAY_HEAD#*=} $common"',
        "fi",
        f"for attempt in $(seq 1 {START_ATTEMPTS}); do",
        # its own session: teardown stops exactly this Ray (its process group), nothing else on the machine
        f"  setsid bash -c 'echo $$ > \"$1\"; shift; exec \"$@\"' _ \"$rdv/ray-$node.pgid\" {q(python)} -c "
        f'{q(ray_main)} start $args > "$rdv/ray-$node.log" 2>&1 < /dev/null &',
        '  ray_pid=$!; disown "$ray_pid" 2>/dev/null || true  # stopped by us: no "Killed" line from bash',
        f'  echo "{TOOL_PREFIX} node $node: ray start $args"',
        '  until grep -q "Ray runtime started" "$rdv/ray-$node.log" 2>/dev/null || ! kill -0 "$ray_pid" 2>/dev/null; '
        "do sleep 0.2; done",
        '  kill -0 "$ray_pid" 2>/dev/null && break',
        f'  if [ "$attempt" -lt {START_ATTEMPTS} ] && grep -q {q(REGISTRATION_TIMEOUT)} "$rdv/ray-$node.log"; then',
        # what it left of its raylet goes before the next try (its process group; GCS drops the dead node)
        '    kill_ray_group "$(cat "$rdv/ray-$node.pgid" 2>/dev/null || echo "$ray_pid")"',
        f'    echo "{TOOL_PREFIX} node $node: ray start gave up waiting for its raylet to register (Ray\'s fixed '
        'wait; a loaded node or GCS); starting it again"; cp "$rdv/ray-$node.log" "$rdv/ray-$node.log.$attempt"',
        "    continue",
        "  fi",
        f'  echo "{TOOL_PREFIX} node $node: ray start failed:"; tail -n 20 "$rdv/ray-$node.log"',
        '  touch "$rdv/failed-$node"; exit 3',
        "done",
        'touch "$rdv/up-$node"',
        f'echo "{TOOL_PREFIX} node $node: ray node up at $ip (pid $ray_pid)"',
        'until [ -e "$rdv/done" ] || ! kill -0 "$ray_pid" 2>/dev/null; do sleep 0.2; done',
        "stop_ray",
    ]
    return "\n".join(lines) + "\n"


def head_checks(*, python: str, nodes: int, gpus_per_node: int | None, bridge_src: str,
                timeout_s: int = JOIN_TIMEOUT_S) -> list[str]:
    """Shell lines of the head step before the task: every node up, the cluster's size, the per-node imports."""
    q = shlex.quote
    return [
        'rdv=$VERL_E2E_RAY_RDV; node=${SLURMD_NODENAME:-$(hostname -s)}',
        "for n in $VERL_E2E_RAY_NODES; do",
        "  n=${n%%=*}",
        *("  " + x for x in _wait_file('"$rdv/up-$n"', 'Ray on node $n did not start', timeout_s,
                                      also_fail='"$rdv/failed-$n"')),
        f'  [ -e "$rdv/up-$n" ] || {{ echo "{TOOL_PREFIX} node $n: Ray did not start: Blocked (cluster setup)"; '
        "exit 3; }",
        "done",
        f'{q(python)} -c {q(PROBE_CHECK)} "$rdv" {q(bridge_src)} '
        '"$(for n in $VERL_E2E_RAY_NODES; do printf "%s " "${n%%=*}"; done)" || exit 3',
        f'{q(python)} -c {q(CLUSTER_WAIT)} "${{VERL_E2E_RAY_HEAD#*=}}" {int(nodes)} {int(gpus_per_node or 0)} '
        f"{timeout_s} || exit 3",
        'export RAY_ADDRESS="${VERL_E2E_RAY_HEAD#*=}"',
    ]


def driver_script(*, srun: list[str], nodes: int, node_argv: list[str], head_argv: list[str],
                  stage_argv: list[str] | None, jobs_dir: str, ray_port: int, exit_file: str | None,
                  header: list[str]) -> str:
    """The script that holds the whole multi-node run inside the allocation (sbatch body, salloc command, or run
    here against --jobid): node list and addresses, optional staging, the Ray node step, the head step, teardown."""
    q = shlex.quote
    srun_s = " ".join(f'"{a}"' if "${job}" in a else q(a) for a in srun)  # --jobid=${job}: expanded here
    lines = [
        "#!/bin/bash",
        *header,
        "set -u",
        'job=${VERL_E2E_JOB:-${SLURM_JOB_ID:-}}',
        f'[ -n "$job" ] || {{ echo "{TOOL_PREFIX} no allocation: run inside one (sbatch/salloc) or pass --jobid"; '
        "exit 3; }",
        f"rdv={q(jobs_dir)}/ray-$job-$(date -u +%Y%m%dT%H%M%SZ)-$$",
        'mkdir -p "$rdv"',
        'nodelist=${SLURM_JOB_NODELIST:-}',
        '[ -n "$nodelist" ] && [ -z "${VERL_E2E_JOB:-}" ] || nodelist=$(squeue -h -j "$job" -o %N)',
        'mapfile -t all < <(scontrol show hostnames "$nodelist")',
        f'if [ "${{#all[@]}}" -lt {nodes} ]; then',
        f'  echo "{TOOL_PREFIX} allocation $job has ${{#all[@]}} node(s) ($nodelist), this run needs {nodes}: '
        'Blocked (cluster setup)"; exit 3',
        "fi",
        f'use=("${{all[@]:0:{nodes}}}")',
        'pairs=""',
        'for n in "${use[@]}"; do',
        # Slurm's own address for the node (NodeAddr), resolved to an IP; else the name itself
        '  addr=$(scontrol show node -o "$n" | sed -n "s/.*NodeAddr=\\([^ ]*\\).*/\\1/p")',
        '  ip=$(getent ahostsv4 "${addr:-$n}" 2>/dev/null | awk "NR==1{print \\$1}")',
        '  pairs="$pairs $n=${ip:-${addr:-$n}}"',
        "done",
        'export VERL_E2E_RAY_NODES="${pairs# }" VERL_E2E_RAY_RDV="$rdv"',
        f'head_pair=${{VERL_E2E_RAY_NODES%% *}}; export VERL_E2E_RAY_HEAD="$head_pair:{int(ray_port)}"',
        'head=${head_pair%%=*}',
        f'echo "{TOOL_PREFIX} slurm allocation $job: ray head $head (${{VERL_E2E_RAY_HEAD#*=}}), nodes '
        '$VERL_E2E_RAY_NODES; rendezvous $rdv"',
        "ray_step=; task_step=; rc=3",
        "teardown() {",
        '  [ -n "$task_step" ] && kill -0 "$task_step" 2>/dev/null && kill -TERM "$task_step" 2>/dev/null',
        '  [ -n "$task_step" ] && wait "$task_step" 2>/dev/null',
        '  touch "$rdv/done"',
        '  if [ -n "$ray_step" ]; then',
        '    n=0; while kill -0 "$ray_step" 2>/dev/null && [ "$n" -lt 300 ]; do sleep 0.2; n=$((n+1)); done',
        '    kill -0 "$ray_step" 2>/dev/null && kill -TERM "$(cat "$rdv/nodes.pid")" 2>/dev/null',
        '    wait "$ray_step" 2>/dev/null',
        "  fi",
        *([f'  echo "$rc" > {exit_file}'] if exit_file else []),  # shell text: may hold $job
        f'  echo "{TOOL_PREFIX} ray cluster torn down; slurm step exit code $rc"',
        "}",
        "trap teardown EXIT",
        f"trap 'echo \"{TOOL_PREFIX} interrupted: stopping the task and the Ray of every node\"; rc=130; exit 130' "
        "INT TERM",
    ]
    if stage_argv is not None:
        lines += [
            f'echo "{TOOL_PREFIX} staging model and data once for the allocation on $head"',
            f'{srun_s} --nodes=1 --ntasks=1 -w "$head" {" ".join(q(a) for a in stage_argv)}',
            "src=$?",
            f'if [ "$src" -ne 0 ]; then echo "{TOOL_PREFIX} staging failed (exit $src): Blocked (setup)"; '
            "rc=3; exit 3; fi",
        ]
    nodes_csv = '"$(IFS=,; echo "${use[*]}")"'
    lines += [
        # the Ray node step; when it ends (all nodes' Ray stopped, or it failed) `nodes.exit` says so to the waiters
        f'{{ {srun_s} --nodes={nodes} --ntasks={nodes} --ntasks-per-node=1 -w {nodes_csv} '
        f'{" ".join(q(a) for a in node_argv)} & echo $! > "$rdv/nodes.pid"; wait $!; echo $? > "$rdv/nodes.exit"; }} &',
        "ray_step=$!",
        f'{srun_s} --nodes=1 --ntasks=1 -w "$head" {" ".join(q(a) for a in head_argv)} &',
        "task_step=$!",
        'wait "$task_step"; rc=$?; task_step=',
        'exit "$rc"',
        "",
    ]
    return "\n".join(lines)
