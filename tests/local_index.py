"""A local PEP 503 package index (`python -m http.server` over a directory) holding a small `nvidia-modelopt` wheel
built here: what `install-modelopt` and `nox -s verl` install from in the tests."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import socket
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

VERSION = "0.0.1"


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(folder: Path) -> Path:
    """A valid pure-Python wheel named nvidia-modelopt that provides `modelopt`."""
    dist = f"nvidia_modelopt-{VERSION}.dist-info"
    files = {
        "modelopt/__init__.py": f'__version__ = "{VERSION}"\n'.encode(),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: nvidia-modelopt\nVersion: {VERSION}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: verl-bridge-e2e-tests\nRoot-Is-Purelib: true\n"
                         b"Tag: py3-none-any\n",
    }
    record = "".join(f"{name},{_record_hash(data)},{len(data)}\n" for name, data in files.items())
    files[f"{dist}/RECORD"] = (record + f"{dist}/RECORD,,\n").encode()
    wheel = folder / f"nvidia_modelopt-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return wheel


@contextlib.contextmanager
def package_index(root: Path) -> Iterator[str]:
    """Serve root/simple/ (lists the wheel) and root/empty/ (an index that has nothing); yields the base URL."""
    (root / "packages").mkdir(parents=True)
    wheel = build_wheel(root / "packages")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    project = root / "simple" / "nvidia-modelopt"
    project.mkdir(parents=True)
    (root / "simple" / "index.html").write_text('<a href="nvidia-modelopt/">nvidia-modelopt</a>\n')
    (project / "index.html").write_text(f'<a href="../../packages/{wheel.name}#sha256={digest}">{wheel.name}</a>\n')
    (root / "empty").mkdir()
    (root / "empty" / "index.html").write_text("")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                               "--directory", str(root)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(10)


def fresh_venv(path: Path, with_pip: bool = True) -> str:
    """A new venv (stands in for an image's own Python); returns its python."""
    argv = [sys.executable, "-m", "venv", str(path)] + ([] if with_pip else ["--without-pip"])
    subprocess.run(argv, check=True, capture_output=True)
    return str(path / "bin" / "python")
