"""A real single-node Slurm (Debian's slurm-wlm: slurmctld + slurmd) for the `invoke slurm` tests.

`AuthType=auth/none` and `CredType=cred/none` (no munge), the local hostname as controller and only node (address
127.0.0.1), the machine's CPUs and memory, `proctrack/linuxproc` + `task/none` (no cgroups in a container), no
accounting (like many real clusters), state and spool directories under a temp dir, free ports. Both daemons run
in the foreground (`-D`) as children of the test process and are stopped by their pid afterwards. Clients find the
cluster through `SLURM_CONF`.

Two nodes on one machine (`start_cluster(root, nodes=2)`): Slurm's multiple-slurmd mode, which Debian's build has
(`NodeName=n1,n2`, each with its own `Port=`, one `slurmd -N n1` / `slurmd -N n2` each). The nodes get their own
loopback addresses (NodeAddr 127.0.0.2 / 127.0.0.3: Ray on them shows two nodes) and one count-only GPU each
(`Gres=gpu:1`, gres.conf `File=/dev/null`: `--gpus-per-node=1` is real Slurm GRES accounting, no device behind it).
Each slurmd runs in its own mount namespace (`unshare -m`, private propagation): a test can change what one node
sees (`SlurmCluster.bind_on(node, src, dst)`, through nsenter) — a per-node mount mistake, as on a real cluster.

Run by hand: `python -m tests.slurm_cluster /tmp/slurm-try [nodes]` starts one and keeps it until Ctrl-C.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

DAEMONS = ("slurmctld", "slurmd")
CLIENTS = ("srun", "sbatch", "squeue", "sacct", "sinfo", "scontrol", "scancel")
PARTITION = "debug"


def _find(name: str) -> str | None:
    return shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.path.exists(p)),
                                      None)


def missing_binaries() -> list[str]:
    """The Slurm programs these tests need that are not installed (empty: all there)."""
    return [n for n in DAEMONS + CLIENTS if _find(n) is None]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_resources() -> tuple[int, int]:
    cpus = os.cpu_count() or 1
    mem_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)
    return cpus, max(mem_mb - 512, 256)  # a little under the total: slurmd drains a node that reports less


@dataclass
class SlurmCluster:
    root: Path
    conf: Path
    node: str  # the first node
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    nodes: list[str] = field(default_factory=list)
    binds: list[tuple[str, str]] = field(default_factory=list)  # (node, mount point) made by bind_on

    @property
    def env(self) -> dict[str, str]:
        """What a client process needs to talk to this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def client(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), env={**os.environ, **self.env}, capture_output=True, text=True,
                              timeout=timeout)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-4000:]}"
                         for p in sorted(self.root.glob("*.log")))

    def wait_idle(self, timeout: float = 60) -> None:
        """Until sinfo shows every node idle (ready for a job), else raise with the daemons' logs."""
        deadline, states = time.monotonic() + timeout, {}
        while time.monotonic() < deadline:
            for name, proc in self.processes.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited {proc.returncode}\n{self.logs()}")
            for node in self.nodes or [self.node]:
                out = self.client("sinfo", "-h", "-N", "-o", "%T", "-n", node)
                states[node] = out.stdout.strip()
                if states[node].startswith(("down", "drain")):
                    self.client("scontrol", "update", f"NodeName={node}", "State=RESUME")
            if all(s.rstrip("*") in ("idle", "mixed") for s in states.values()):
                return
            time.sleep(0.5)
        raise RuntimeError(f"nodes not idle after {timeout}s (states {states!r})\n{self.logs()}")

    def slurmd_pid(self, node: str) -> int:
        return self.processes[f"slurmd {node}" if len(self.nodes) > 1 else "slurmd"].pid

    def bind_on(self, node: str, src: Path, dst: Path) -> None:
        """Bind `src` over `dst` in `node`'s mount namespace only (its slurmd's, inherited by its steps)."""
        subprocess.run(["nsenter", "-t", str(self.slurmd_pid(node)), "-m", "mount", "--bind", str(src), str(dst)],
                       check=True, capture_output=True, text=True)
        self.binds.append((node, str(dst)))

    def unbind_all(self) -> None:
        while self.binds:
            node, dst = self.binds.pop()
            subprocess.run(["nsenter", "-t", str(self.slurmd_pid(node)), "-m", "umount", dst], capture_output=True)

    def stop(self) -> None:
        """Cancel what still runs here (a failed test may leave a job: its slurmstepd outlives slurmd), wait until
        the controller holds no running job, then stop every daemon by its pid (slurmds first): TERM, then KILL."""
        self.unbind_all()
        if self.processes.get("slurmctld") and self.processes["slurmctld"].poll() is None:
            self.client("scancel", "--full", "--state=RUNNING,PENDING", "--user=root", timeout=30)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                out = self.client("squeue", "-h", "-t", "RUNNING,PENDING,COMPLETING", "-o", "%i", timeout=30)
                if out.returncode != 0 or not out.stdout.strip():
                    break
                time.sleep(0.5)
        for name in sorted(self.processes, key=lambda n: n.startswith("slurmctld")):
            proc = self.processes[name]
            if proc.poll() is not None:
                continue
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def write_conf(root: Path, node: str, nodes: list[str] | None = None) -> Path:
    """slurm.conf for one node (`node`, the local hostname) or, with `nodes`, several slurmds on this machine."""
    cpus, mem_mb = _node_resources()
    state, spool = root / "state", root / "spool"
    state.mkdir(parents=True, exist_ok=True)
    spool.mkdir(parents=True, exist_ok=True)
    conf = root / "slurm.conf"
    conf.write_text("\n".join([
        "ClusterName=verle2etest",
        f"SlurmctldHost={node}(127.0.0.1)",
        "AuthType=auth/none",
        "CredType=cred/none",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"SlurmctldPort={_free_port()}",
        f"SlurmdPort={_free_port()}",
        f"StateSaveLocation={state}",
        f"SlurmdSpoolDir={spool}" + ("-%n" if nodes else ""),
        f"SlurmctldPidFile={root / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / ('slurmd-%n.pid' if nodes else 'slurmd.pid')}",
        f"SlurmctldLogFile={root / 'slurmctld.log'}",
        f"SlurmdLogFile={root / ('slurmd-%n.log' if nodes else 'slurmd.log')}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",  # 1-CPU jobs share the node (a detached job + an attached step)
        "MpiDefault=none",
        "ReturnToService=2",
        "SwitchType=switch/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",  # accounting off, as on many real clusters
        "JobCompType=jobcomp/none",
        "SlurmctldTimeout=30",
        "SlurmdTimeout=30",
        "InactiveLimit=0",
        "KillWait=5",
        "MinJobAge=300",  # finished jobs stay visible to squeue/scontrol for 5 minutes
        *([f"NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={mem_mb} State=UNKNOWN",
           f"PartitionName={PARTITION} Nodes={node} Default=YES MaxTime=INFINITE State=UP"] if not nodes else [
            "GresTypes=gpu",
            *(f"NodeName={n} NodeHostname={node} NodeAddr=127.0.0.{i + 2} Port={_free_port()} CPUs={cpus} "
              f"RealMemory={mem_mb} Gres=gpu:1 State=UNKNOWN" for i, n in enumerate(nodes)),
            f"PartitionName={PARTITION} Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE State=UP"]),
        "",
    ]))
    if nodes:  # one count-only GPU per node: real GRES accounting, no device behind it
        (root / "gres.conf").write_text(f"NodeName={','.join(nodes)} Name=gpu File=/dev/null\n")
    return conf


def start_cluster(root: Path, timeout: float = 60, nodes: int = 1) -> SlurmCluster:
    """Write slurm.conf under `root`, start slurmctld and the slurmd(s) (as root), wait until every node is idle.

    nodes > 1: multiple-slurmd on this machine (n1, n2, ...), each slurmd in its own mount namespace."""
    missing = missing_binaries()
    if missing:
        raise RuntimeError(f"Slurm programs missing: {', '.join(missing)} (apt-get install slurm-wlm)")
    if os.geteuid() != 0:
        raise RuntimeError("the test Slurm runs its daemons as root")
    root.mkdir(parents=True, exist_ok=True)
    host = socket.gethostname().split(".")[0]
    names = [f"n{i + 1}" for i in range(nodes)] if nodes > 1 else []
    conf = write_conf(root, host, names or None)
    cluster = SlurmCluster(root=root, conf=conf, node=names[0] if names else host, nodes=names)
    env = {**os.environ, **cluster.env}
    try:
        cluster.processes["slurmctld"] = subprocess.Popen(
            [_find("slurmctld"), "-D", "-i", "-f", str(conf)], env=env, stdout=subprocess.DEVNULL,
            stderr=open(root / "slurmctld.stderr.log", "wb"), start_new_session=True)
        _wait_listening(cluster, timeout)
        if not names:
            cluster.processes["slurmd"] = subprocess.Popen(
                [_find("slurmd"), "-D", "-f", str(conf), "-N", host], env=env, stdout=subprocess.DEVNULL,
                stderr=open(root / "slurmd.stderr.log", "wb"), start_new_session=True)
        for n in names:  # unshare execs slurmd: the pid is slurmd's, its namespace is the node's own
            cluster.processes[f"slurmd {n}"] = subprocess.Popen(
                ["unshare", "-m", "--propagation", "private", _find("slurmd"), "-D", "-f", str(conf), "-N", n],
                env=env, stdout=subprocess.DEVNULL, stderr=open(root / f"slurmd-{n}.stderr.log", "wb"),
                start_new_session=True)
        cluster.wait_idle(timeout)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _wait_listening(cluster: SlurmCluster, timeout: float) -> None:
    """Until slurmctld answers (`scontrol ping`), instead of a fixed sleep before the slurmds register."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc = cluster.processes["slurmctld"]
        if proc.poll() is not None:
            raise RuntimeError(f"slurmctld exited {proc.returncode}\n{cluster.logs()}")
        if "UP" in cluster.client("scontrol", "ping", timeout=10).stdout:
            return
        time.sleep(0.2)
    raise RuntimeError(f"slurmctld not answering after {timeout}s\n{cluster.logs()}")


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGTERM, signal.default_int_handler)  # `kill PID` stops the daemons too
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started in the background
    c = start_cluster(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/verl-e2e-slurm"),
                      nodes=int(sys.argv[2]) if len(sys.argv) > 2 else 1)
    print(f"export SLURM_CONF={c.conf}  # node(s) {', '.join(c.nodes or [c.node])} idle; Ctrl-C stops it", flush=True)
    try:
        while all(p.poll() is None for p in c.processes.values()):
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        c.stop()
