"""A local PEP 503 package index (`python -m http.server` over a directory) holding a small `nvidia-modelopt` wheel
built here (what `install-modelopt` and `nox -s verl` install from in the tests), or wheels of packages installed on
this machine (what a remote first-use venv installs from, offline)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import importlib.metadata
import re
import shutil
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


def build_wheel(folder: Path, name: str = "nvidia-modelopt", version: str = VERSION,
                files: dict[str, str] | None = None, requires: tuple[str, ...] = ()) -> Path:
    """A valid pure-Python wheel (default: nvidia-modelopt providing `modelopt`), declaring `requires`."""
    dist_name = name.replace("-", "_")
    dist = f"{dist_name}-{version}.dist-info"
    payload = {k: v.encode() for k, v in (files or {"modelopt/__init__.py": f'__version__ = "{version}"\n'}).items()}
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires)
    payload[f"{dist}/METADATA"] = metadata.encode()
    payload[f"{dist}/WHEEL"] = (b"Wheel-Version: 1.0\nGenerator: verl-bridge-e2e-tests\nRoot-Is-Purelib: true\n"
                                b"Tag: py3-none-any\n")
    record = "".join(f"{n},{_record_hash(data)},{len(data)}\n" for n, data in payload.items())
    payload[f"{dist}/RECORD"] = (record + f"{dist}/RECORD,,\n").encode()
    wheel = folder / f"{dist_name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for n, data in payload.items():
            z.writestr(n, data)
    return wheel


def wheel_of_installed(name: str, folder: Path) -> Path:
    """A wheel of an installed pure-Python distribution, rebuilt from its installed files (no network needed)."""
    dist = importlib.metadata.distribution(name)
    base = re.sub(r"[-_.]+", "_", dist.metadata["Name"]).lower()
    wheel = folder / f"{base}-{dist.version}-py3-none-any.whl"
    entries = {}
    for file in dist.files or []:
        parts = file.parts
        if parts[0] == ".." or "__pycache__" in parts or file.suffix == ".pyc":
            continue  # scripts (pip writes its own) and bytecode
        if parts[0].endswith(".dist-info") and parts[-1] in ("RECORD", "INSTALLER", "REQUESTED", "direct_url.json"):
            continue
        entries[file.as_posix()] = Path(dist.locate_file(file)).read_bytes()
    dist_info = next(k.split("/")[0] for k in entries if k.split("/")[0].endswith(".dist-info"))
    record = "".join(f"{n},{_record_hash(d)},{len(d)}\n" for n, d in entries.items()) + f"{dist_info}/RECORD,,\n"
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel, "w") as z:
        for n, d in entries.items():
            z.writestr(n, d)
        z.writestr(f"{dist_info}/RECORD", record)
    return wheel


@contextlib.contextmanager
def package_index(root: Path, wheels: dict[str, Path] | None = None) -> Iterator[str]:
    """Serve root/simple/ (lists the wheels: by default the nvidia-modelopt one) and root/empty/ (an index that has
    nothing); yields the base URL. `wheels`: project name -> a wheel built with build_wheel in another folder."""
    (root / "packages").mkdir(parents=True)
    wheels = wheels or {"nvidia-modelopt": build_wheel(root / "packages")}
    links = []
    for project, built in wheels.items():
        wheel = root / "packages" / built.name
        if built != wheel:
            shutil.copy(built, wheel)
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        (root / "simple" / project).mkdir(parents=True)
        (root / "simple" / project / "index.html").write_text(
            f'<a href="../../packages/{wheel.name}#sha256={digest}">{wheel.name}</a>\n')
        links.append(f'<a href="{project}/">{project}</a>\n')
    (root / "simple" / "index.html").write_text("".join(links))
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
