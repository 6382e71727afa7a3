"""The connection to a GPU host: Fabric for commands, the matching `ssh` command line for rsync.

Kept apart from `env/launchers/remote.py` (the task) and `env/launchers/sync.py` (the file transfer) so both can use it without
importing each other.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import select
import shlex
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from env.launchers import remote_helper
from env.settings import UsageError


class RemoteUnavailable(Exception):
    """The host could not be reached or a remote step failed for reasons outside the task (exit 3, Blocked)."""


@dataclass(frozen=True)
class HostSpec:
    text: str
    host: str  # a host name, an address or an ssh config alias
    user: str | None
    port: int | None


HOST_RE = re.compile(r"(?:ssh://)?(?:(?P<user>[^@\s/:]+)@)?(?P<host>\[[0-9a-fA-F:.]+\]|[^@\s/:\[\]]+)"
                     r"(?::(?P<port>\d{1,5}))?/?")


def parse_host(text: str) -> HostSpec:
    """`host`, `alias`, `user@host`, `user@host:port` or `ssh://user@host:port`, as ssh and Fabric take them."""
    match = HOST_RE.fullmatch(text.strip()) if text else None
    if not match or match["host"].startswith("-"):
        raise UsageError(f"--host {text!r}: expected [user@]host[:port] or an ssh config alias")
    port = int(match["port"]) if match["port"] else None
    if port is not None and not 0 < port < 65536:
        raise UsageError(f"--host {text!r}: port out of range")
    return HostSpec(text, match["host"].strip("[]"), match["user"], port)


def _helper_bootstrap() -> str:
    # Ship the helper compressed: on a one-file change it would otherwise be most of the bytes we send.
    packed = base64.b64encode(zlib.compress(Path(remote_helper.__file__).read_bytes(), 9)).decode()
    return f"import base64,zlib;exec(zlib.decompress(base64.b64decode('{packed}')))"


class RemoteHost:
    """A Fabric connection plus the matching ssh command for rsync; counts the payload bytes we send."""

    def __init__(self, host: str, ssh_config: Path | None = None, remote_python: str | None = None,
                 connect_timeout: int = 20) -> None:
        import fabric

        self.spec = parse_host(host)
        self.ssh_config = ssh_config
        if ssh_config is not None and not ssh_config.is_file():
            raise UsageError(f"--ssh-config {ssh_config}: no such file")
        config = fabric.Config(runtime_ssh_path=str(ssh_config)) if ssh_config else fabric.Config()
        self.conn = fabric.Connection(self.spec.host, user=self.spec.user, port=self.spec.port, config=config,
                                      connect_timeout=connect_timeout)
        self._load_known_hosts()
        self.python = remote_python or "python3"
        self.bytes_sent = 0
        self._helper_source = _helper_bootstrap()

    def _load_known_hosts(self) -> None:
        """Fabric auto-adds unknown host keys; with ssh's known_hosts loaded, a *changed* key is still refused."""
        client = self.conn.client
        with contextlib.suppress(OSError):
            client.load_system_host_keys()
        for path in str(self.conn.ssh_config.get("userknownhostsfile", "")).split():
            with contextlib.suppress(OSError):
                client.load_system_host_keys(os.path.expanduser(path))

    @property
    def display(self) -> str:
        return self.spec.text

    def open(self) -> None:
        try:
            self.conn.open()
        except Exception as e:  # DNS, refused, auth, host key, proxy: all one line for the user
            raise RemoteUnavailable(f"cannot connect to {self.display}: {type(e).__name__}: {e}".strip()) from None

    def close(self) -> None:
        self.conn.close()

    def rsync_ssh_command(self) -> str:
        parts = ["ssh"]
        if self.ssh_config:
            parts += ["-F", str(self.ssh_config)]
        if self.spec.port:
            parts += ["-p", str(self.spec.port)]
        return " ".join(shlex.quote(p) for p in parts)

    def rsync_target(self, path: str) -> str:
        host = f"[{self.spec.host}]" if ":" in self.spec.host else self.spec.host
        return f"{self.spec.user + '@' if self.spec.user else ''}{host}:{path}"

    def _open_channel(self, command: str):
        if not self.conn.is_connected:
            self.open()
        try:
            channel = self.conn.client.get_transport().open_session()
            channel.exec_command(command)
        except Exception as e:
            raise RemoteUnavailable(f"{self.display}: cannot start a remote command: {e}") from None
        self.bytes_sent += len(command.encode())
        return channel

    def exec_with_input(self, command: str, data: bytes = b"", what: str = "remote command",
                        timeout_s: float | None = None) -> bytes:
        """Run `command` with `data` on its stdin; returns stdout; a non-zero exit, or no answer within timeout_s,
        raises RemoteUnavailable."""
        channel = self._open_channel(command)

        def feed() -> None:
            with contextlib.suppress(OSError, EOFError):
                for start in range(0, len(data), 1 << 16):
                    channel.sendall(data[start:start + (1 << 16)])
                channel.shutdown_write()

        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        out, err = bytearray(), bytearray()
        try:
            pump(channel, out.extend, err.extend,
                 deadline=None if timeout_s is None else time.monotonic() + timeout_s)
        except TimeoutError:
            channel.close()
            raise RemoteUnavailable(f"{self.display}: {what} gave no answer within {timeout_s:.0f}s") from None
        feeder.join(timeout=10)
        self.bytes_sent += len(data)
        status = channel.recv_exit_status()
        if status != 0:
            tail = err.decode(errors="replace").strip().splitlines()[-3:]
            raise RemoteUnavailable(f"{self.display}: {what} failed (exit {status}): {' | '.join(tail)}")
        return bytes(out)

    def helper(self, command: str, request: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
        inner = f"{shlex.quote(self.python)} -c {shlex.quote(self._helper_source)} {shlex.quote(command)}"
        raw = self.exec_with_input(f"bash -lc {shlex.quote(inner)}", json.dumps(request).encode(),
                                   what=f"sync helper '{command}'", timeout_s=timeout_s)
        _, marker, payload = raw.decode(errors="replace").rpartition(remote_helper.MARKER)
        if not marker:
            raise RemoteUnavailable(f"{self.display}: sync helper '{command}' gave no answer")
        answer = json.loads(payload)
        if "error" in answer:
            raise RemoteUnavailable(f"{self.display}: sync helper '{command}': {answer['error']}")
        return answer

    def stream(self, command: str, out: BinaryIO, err: BinaryIO, on_line=None,
               stop_wait_s: float = 120) -> tuple[int | None, bool]:
        """Run with live output; Ctrl-C once = stop the remote task (EOF to its watcher), twice = drop the link.
        A remote side that has not finished `stop_wait_s` after the first Ctrl-C is dropped too (its session's
        hangup stops what is left): Ctrl-C never leaves this process waiting without bound.

        Returns (exit status or None when the connection went away, whether we were interrupted).
        """
        channel = self._open_channel(command)
        interrupted = 0
        deadline = None
        pending = {1: b"", 2: b""}

        def emit(stream: BinaryIO, key: int):
            def write(data: bytes) -> None:
                stream.write(data)
                stream.flush()
                if on_line is not None:
                    lines = (pending[key] + data).split(b"\n")
                    pending[key] = lines.pop()
                    for line in lines:
                        on_line(line)
            return write

        while True:
            try:
                pump(channel, emit(out, 1), emit(err, 2), deadline=deadline)
                break
            except TimeoutError:
                err.write(f"[verl-e2e] the remote task did not stop within {stop_wait_s:.0f}s of Ctrl-C: "
                          f"disconnecting\n".encode())
                err.flush()
                channel.close()
                break
            except KeyboardInterrupt:
                interrupted += 1
                if interrupted == 1:
                    deadline = time.monotonic() + stop_wait_s
                    err.write(b"\n[verl-e2e] Ctrl-C: stopping the remote task (Ctrl-C again to disconnect)\n")
                    err.flush()
                    with contextlib.suppress(OSError, EOFError):
                        channel.shutdown_write()
                else:
                    channel.close()
                    break
        for key in pending:
            if pending[key] and on_line is not None:
                on_line(pending[key])
        if channel.closed and not channel.exit_status_ready():
            return None, bool(interrupted)
        status = channel.recv_exit_status()
        return (None if status == -1 else status), bool(interrupted)


def pump(channel, on_stdout, on_stderr, deadline: float | None = None) -> None:
    """Move a channel's stdout/stderr to callbacks until the remote side has sent everything (TimeoutError once
    `deadline`, a time.monotonic() value, has passed)."""
    while True:
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError
        if channel.recv_ready():
            on_stdout(channel.recv(1 << 16))
        elif channel.recv_stderr_ready():
            on_stderr(channel.recv_stderr(1 << 16))
        elif channel.closed or (channel.eof_received and channel.exit_status_ready()):
            while channel.recv_stderr_ready():
                on_stderr(channel.recv_stderr(1 << 16))
            return
        else:
            select.select([channel], [], [], 0.2)
