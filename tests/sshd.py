"""A real OpenSSH server on 127.0.0.1 for the remote tests and the sync benchmark.

Its own host key and client key, a free port, and a generated ssh_config with two aliases: `e2e-direct` and
`e2e-jump` (reached through `ProxyJump e2e-direct`), so Fabric and rsync are tested with the same config file.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
DIRECT_ALIAS, JUMP_ALIAS = "e2e-direct", "e2e-jump"


REQUIRE_ENV = "VERL_E2E_REQUIRE_SSH"  # set by .ci/run (it installs them): a missing sshd fails, never skips


def sshd_available() -> bool:
    return os.path.exists(SSHD) and shutil.which("ssh") is not None and shutil.which("rsync") is not None


def sshd_required() -> bool:
    return os.environ.get(REQUIRE_ENV) == "1"


@dataclass
class Sshd:
    port: int
    ssh_config: Path
    process: subprocess.Popen
    log: Path

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)


def start_sshd(workdir: Path, session_env: dict[str, str] | None = None) -> Sshd:
    """Start sshd as the current user (root here) on a free port; returns once it accepts connections.

    session_env: variables sshd sets in every session (SetEnv), e.g. a package index for the remote's pip.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    host_key, client_key = workdir / "host_ed25519", workdir / "client_ed25519"
    _keygen(host_key)
    _keygen(client_key)
    authorized = workdir / "authorized_keys"
    authorized.write_text(Path(f"{client_key}.pub").read_text())
    authorized.chmod(0o600)
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # privilege-separation directory sshd insists on

    port = _free_port()
    sshd_config = workdir / "sshd_config"
    sshd_config.write_text(
        f"ListenAddress 127.0.0.1\nPort {port}\nHostKey {host_key}\nPidFile {workdir / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {authorized}\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "PubkeyAuthentication yes\nPermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\n"
        "AllowTcpForwarding yes\nMaxSessions 50\nMaxStartups 50\nLogLevel ERROR\n"
        + (f"SetEnv {' '.join(f'{k}={v}' for k, v in session_env.items())}\n" if session_env else "")
    )
    known_hosts = workdir / "known_hosts"
    host_pub = Path(f"{host_key}.pub").read_text().split()
    known_hosts.write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
    user = os.environ.get("USER") or __import__("pwd").getpwuid(os.getuid()).pw_name
    common = (
        f"  HostName 127.0.0.1\n  Port {port}\n  User {user}\n  IdentityFile {client_key}\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {known_hosts}\n  StrictHostKeyChecking yes\n  LogLevel ERROR\n"
    )
    ssh_config = workdir / "ssh_config"
    ssh_config.write_text(
        f"Host {DIRECT_ALIAS}\n{common}\nHost {JUMP_ALIAS}\n{common}  ProxyJump {DIRECT_ALIAS}\n"
    )
    log = workdir / "sshd.log"
    process = subprocess.Popen([SSHD, "-D", "-e", "-f", str(sshd_config)], stderr=log.open("wb"))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"sshd exited: {log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return Sshd(port, ssh_config, process, log)
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError("sshd did not start listening within 10 s")
