"""A real single-node Slurm (Debian's slurm-wlm: slurmctld + slurmd) for the `invoke slurm` tests.

`AuthType=auth/none` and `CredType=cred/none` (no munge), the local hostname as controller and only node (address
127.0.0.1), the machine's CPUs and memory, `proctrack/linuxproc` + `task/none` (no cgroups in a container), no
accounting (like many real clusters), state and spool directories under a temp dir, free ports. Both daemons run
in the foreground (`-D`) as children of the test process and are stopped by their pid afterwards. Clients find the
cluster through `SLURM_CONF`.

Run by hand: `python -m tests.slurm_cluster /tmp/slurm-try` starts one and keeps it until Ctrl-C.
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
    node: str
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

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
        """Until sinfo shows the node idle (ready for a job), else raise with both daemons' logs."""
        deadline, state = time.monotonic() + timeout, ""
        while time.monotonic() < deadline:
            for name, proc in self.processes.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited {proc.returncode}\n{self.logs()}")
            out = self.client("sinfo", "-h", "-N", "-o", "%T", "-n", self.node)
            state = out.stdout.strip()
            if out.returncode == 0 and state.rstrip("*") in ("idle", "mixed"):
                return
            if state.startswith(("down", "drain")):
                self.client("scontrol", "update", f"NodeName={self.node}", "State=RESUME")
            time.sleep(0.5)
        raise RuntimeError(f"node {self.node} not idle after {timeout}s (state {state!r})\n{self.logs()}")

    def stop(self) -> None:
        for name in reversed(DAEMONS):
            proc = self.processes.get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def write_conf(root: Path, node: str) -> Path:
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
        f"SlurmdSpoolDir={spool}",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'slurmd.pid'}",
        f"SlurmctldLogFile={root / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'slurmd.log'}",
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
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={mem_mb} State=UNKNOWN",
        f"PartitionName={PARTITION} Nodes={node} Default=YES MaxTime=INFINITE State=UP",
        "",
    ]))
    return conf


def start_cluster(root: Path, timeout: float = 60) -> SlurmCluster:
    """Write slurm.conf under `root`, start slurmctld and slurmd (as root), wait until the node is idle."""
    missing = missing_binaries()
    if missing:
        raise RuntimeError(f"Slurm programs missing: {', '.join(missing)} (apt-get install slurm-wlm)")
    if os.geteuid() != 0:
        raise RuntimeError("the test Slurm runs its daemons as root")
    root.mkdir(parents=True, exist_ok=True)
    node = socket.gethostname().split(".")[0]
    conf = write_conf(root, node)
    cluster = SlurmCluster(root=root, conf=conf, node=node)
    env = {**os.environ, **cluster.env}
    try:
        cluster.processes["slurmctld"] = subprocess.Popen(
            [_find("slurmctld"), "-D", "-i", "-f", str(conf)], env=env, stdout=subprocess.DEVNULL,
            stderr=open(root / "slurmctld.stderr.log", "wb"), start_new_session=True)
        time.sleep(1)
        cluster.processes["slurmd"] = subprocess.Popen(
            [_find("slurmd"), "-D", "-f", str(conf), "-N", node], env=env, stdout=subprocess.DEVNULL,
            stderr=open(root / "slurmd.stderr.log", "wb"), start_new_session=True)
        cluster.wait_idle(timeout)
    except BaseException:
        cluster.stop()
        raise
    return cluster


if __name__ == "__main__":
    c = start_cluster(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/verl-e2e-slurm"))
    print(f"export SLURM_CONF={c.conf}  # node {c.node} idle; Ctrl-C stops it", flush=True)
    try:
        while all(p.poll() is None for p in c.processes.values()):
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        c.stop()
