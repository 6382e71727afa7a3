"""`invoke install-modelopt`: nvidia-modelopt in the Python that runs verl (verl's checkpoint paths need it).

`pip show nvidia-modelopt` first; when absent, `pip install nvidia-modelopt --extra-index-url <index>` (NVIDIA's
index by default, MODELOPT_INDEX_URL to change it), with its dependencies — or, offline, `--find-links DIR`: pip
`--no-index --find-links DIR`, a folder of wheels (nvidia-modelopt and pulp). Where each package really came from is
read from pip's own `--report` (the wheel's URL: a file in DIR, or the index), never assumed from the flags. When present but installed without them
(the real H200 image: `No module named 'pulp'` at the first LoRA save), only the missing ones are installed: those
`pip check` names as not installed, then any module the LoRA save path's modelopt import still misses — never a
reinstall that could move torch. What happened is written as a container-setup record under
$LOG_DIR/container_setup/ — evidence about the environment, never a change to either checkout — and a level's
preflight quotes the newest record for its Python (`check_container_setup`).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

from env.preflight.checks import OK, WARN, Check
from env.preflight.pythonpath import bridge_modelopt_imports, package_of
from env.settings import Resolved

if TYPE_CHECKING:
    from env.preflight.checks import RunContext

PACKAGE = "nvidia-modelopt"
SAVE_PATH_DEFAULT = ["modelopt.torch.opt.plugins"]  # what Bridge's training/checkpointing.py imports (r0.6, main)
# the image's stack (and modelopt itself): missing from the save path's chain, they are not ours to install
NEVER_INSTALLED = {"modelopt", "torch", "triton", "transformer_engine", "megatron", "vllm", "flash_attn", "apex",
                   "tensorrt", "tensorrt_llm", "transformers"}
SETUP_DIR = "container_setup"


def setup_dir(log_dir: Path) -> Path:
    return Path(log_dir) / SETUP_DIR


def pip_show(python: str) -> str | None:
    """The installed version, or None when pip does not know the package."""
    try:
        proc = subprocess.run([python, "-m", "pip", "show", PACKAGE], capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        raise RuntimeError(f"Python {python!r} not found (set VERL_PYTHON / --python)") from None
    if proc.returncode != 0:
        if "No module named pip" in proc.stderr:
            raise RuntimeError(f"{python} has no pip: install nvidia-modelopt with the image's own tooling")
        return None
    for line in proc.stdout.splitlines():
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def install_argv(python: str, index_url: str, packages: list[str] | None = None,
                 find_links: str | None = None) -> list[str]:
    """pip's command: from the extra index, or (find_links) from a wheel folder with no index at all."""
    where = ["--no-index", "--find-links", str(find_links)] if find_links else ["--extra-index-url", index_url]
    return [python, "-m", "pip", "install", *where, *(packages or [PACKAGE])]


def undeclared_missing(python: str) -> list[str]:
    """Dependencies nvidia-modelopt declares that are not installed (`pip check`: "... requires X, which is not
    installed.")."""
    proc = subprocess.run([python, "-m", "pip", "check"], capture_output=True, text=True, timeout=300)
    found = re.findall(rf"^{re.escape(PACKAGE)} \S+ requires (\S+), which is not installed", proc.stdout,
                       re.MULTILINE | re.IGNORECASE)
    return sorted(set(found))


# Runs in the target Python: argv[1] = the answer file, argv[2:] = modules. Writes one JSON object there; whatever
# the imports print (vLLM logs `WARNING ...` lines on stdout when imported) never reaches the answer.
_SAVE_PATH_PROBE = r"""
import importlib, json, sys
answer = {"missing": None, "error": None}
for m in sys.argv[2:]:
    try:
        importlib.import_module(m)
    except ModuleNotFoundError as e:
        answer = {"missing": e.name, "error": f"{type(e).__name__}: {e}".splitlines()[0], "module": m}
        break
    except BaseException as e:
        answer = {"missing": None, "error": f"{type(e).__name__}: {e}".splitlines()[0], "module": m}
        break
with open(sys.argv[1], "w") as f:
    json.dump(answer, f)
"""


def save_path_probe(python: str, modules: list[str], pythonpath: str | None = None) -> dict:
    """{"missing": module name or None, "error": ..., "module": which import failed}: the machine-readable answer
    of one import of `modules` in `python` (a file the probe writes), never a line of its stdout."""
    env = dict(os.environ) if pythonpath is None else dict(os.environ, PYTHONPATH=pythonpath)
    with tempfile.TemporaryDirectory(prefix="verl-e2e-modelopt-") as tmp:
        answer = Path(tmp) / "answer.json"
        proc = subprocess.run([python, "-c", _SAVE_PATH_PROBE, str(answer), *modules], capture_output=True,
                              text=True, timeout=600, env=env)
        try:
            return json.loads(answer.read_text())
        except (OSError, ValueError):
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            return {"missing": None, "error": f"the import probe wrote no answer (exit {proc.returncode}): {tail}"}


def save_path_missing(python: str, modules: list[str], pythonpath: str | None = None) -> str | None:
    """The module an import of `modules` misses (ModuleNotFoundError.name), None when they import."""
    return save_path_probe(python, modules, pythonpath).get("missing")


def _pip_install(argv: list[str]) -> list[dict]:
    """Run pip with `--report` (pip >= 22.2); returns what it installed: name, version and the URL it came from."""
    with tempfile.TemporaryDirectory(prefix="verl-e2e-pip-") as tmp:
        report = Path(tmp) / "report.json"
        proc = subprocess.run([*argv, "--report", str(report)], capture_output=True, text=True)
        if proc.returncode != 0 and "--report" in proc.stderr and "no such option" in proc.stderr:
            proc = subprocess.run(argv, capture_output=True, text=True)  # an old pip: no report, origin unknown
        sys.stderr.write(proc.stdout[-4000:])
        if proc.returncode != 0:
            lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
            err = next((ln for ln in reversed(lines) if ln.startswith("ERROR")), lines[-1] if lines else "no output")
            raise InstallError(f"{shlex.join(argv[3:])} failed (exit {proc.returncode}): {err}")
        try:
            data = json.loads(report.read_text())
        except (OSError, ValueError):
            return [{"name": "?", "version": None, "url": None, "source": "unknown (this pip writes no --report)"}]
    out = []
    for item in data.get("install", []):
        meta = item.get("metadata") or {}
        url = (item.get("download_info") or {}).get("url")
        out.append({"name": meta.get("name"), "version": meta.get("version"), "url": url, "source": source_of(url)})
    return out


class InstallError(RuntimeError):
    pass


def source_of(url: str | None) -> str:
    """Where a wheel came from, for the record: `local wheel folder DIR` or `index HOST`."""
    if not url:
        return "unknown"
    parsed = urlparse(url)
    if parsed.scheme == "file":
        return f"local wheel folder {Path(unquote(parsed.path)).parent}"
    return f"index {parsed.scheme}://{parsed.netloc}"


def pip_config(environ: dict[str, str] | None = None) -> dict[str, str]:
    """pip's own settings from the environment (PIP_NO_INDEX, PIP_FIND_LINKS, PIP_INDEX_URL, ...): they change where
    packages come from, so the record keeps them."""
    env = os.environ if environ is None else environ
    return {k: v for k, v in env.items() if k in ("PIP_NO_INDEX", "PIP_FIND_LINKS", "PIP_INDEX_URL",
                                                   "PIP_EXTRA_INDEX_URL", "PIP_NO_DEPS")}


@lru_cache(maxsize=8)
def index_reachable(index_url: str, timeout: float = 1.5) -> bool:
    """A TCP connection to the index's host opens within `timeout` (name lookup included; never longer)."""
    parsed = urlparse(index_url)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path)).exists()
    host, port = parsed.hostname, parsed.port or (443 if parsed.scheme == "https" else 80)
    if not host:
        return False
    ok: list[bool] = []

    def connect() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                ok.append(True)
        except OSError:
            pass

    t = threading.Thread(target=connect, daemon=True)
    t.start()
    t.join(timeout + 0.5)
    return bool(ok)


def modelopt_install_hint(environ: dict[str, str], index_url: str, why: str | None = None) -> str:
    """The fix for a missing/incomplete modelopt: the offline form first when no index is reachable."""
    tail = f" ({why})" if why else ""
    links = environ.get("PIP_FIND_LINKS")
    if links:
        return f"invoke install-modelopt --find-links {links.split()[0]}{tail}"
    offline = "invoke install-modelopt --find-links DIR (DIR: a folder with the nvidia-modelopt and pulp wheels)"
    if environ.get("PIP_NO_INDEX", "").lower() in ("1", "true", "yes", "on") or not index_reachable(index_url):
        return f"no package index reachable ({urlparse(index_url).netloc or index_url}): {offline}{tail}"
    return f"invoke install-modelopt (from {index_url}; offline: {offline}){tail}"


def write_setup_record(log_dir: Path, record: dict) -> Path:
    folder = setup_dir(log_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-modelopt-{time.time_ns() % 10**6}.json"
    path.write_text(json.dumps(record, indent=2))
    return path


def ensure_modelopt(python: str, index_url: str, log_dir: Path, echo=print,
                    save_path: list[str] | None = None, pythonpath: str | None = None,
                    find_links: str | None = None) -> tuple[dict, Path]:
    """Show, install or repair; returns (record, record path). Raises InstallError with pip's last error line —
    after writing the record of the failure (every outcome leaves one).

    save_path: the modelopt modules the LoRA save path imports (Bridge's checkpointing), checked after pip.
    find_links: a wheel folder: pip runs with --no-index --find-links (offline)."""
    started = time.time()
    record: dict = {"package": PACKAGE, "python": python, "index_url": None if find_links else index_url,
                    "find_links": str(find_links) if find_links else None, "pip_config": pip_config(),
                    "started": started, "installed": [], "commands": []}
    commands: list[str] = record["commands"]
    installed_pkgs: list[dict] = record["installed"]
    fresh = False
    try:
        version = pip_show(python)
        fresh = version is None
        if version is None:
            argv = install_argv(python, index_url, find_links=find_links)
            echo(f"{PACKAGE} missing in {python}: {shlex.join(argv)}")
            commands.append(shlex.join(argv))
            installed_pkgs += _pip_install(argv)
            version = pip_show(python)
            if version is None:
                raise InstallError(f"pip reported success but `pip show {PACKAGE}` still finds nothing in {python}")
            echo(f"installed {PACKAGE} {version} into {python}")
        installed: list[str] = []
        missing = undeclared_missing(python)
        for _ in range(8):  # each install may uncover the next module the import chain needs
            if not missing:
                answer = save_path_probe(python, save_path or SAVE_PATH_DEFAULT, pythonpath)
                module = answer.get("missing")
                if module is None or module.split(".")[0] in NEVER_INSTALLED:
                    if answer.get("error"):
                        record["save_path_error"] = answer["error"]
                    break  # imports, or the stack itself / modelopt is incomplete: not a dependency to add here
                missing = [package_of(module)]
            if set(missing) <= set(installed):
                raise InstallError(f"{', '.join(missing)} still missing after installing it into {python}")
            argv = install_argv(python, index_url, missing, find_links=find_links)
            echo(f"{PACKAGE} {version} is installed without its dependencies {', '.join(missing)}: "
                 f"{shlex.join(argv)}")
            commands.append(shlex.join(argv))
            installed_pkgs += _pip_install(argv)
            installed += missing
            missing = undeclared_missing(python)
        record["version"] = version
        if not commands:
            record.update(action="present", command=shlex.join([python, "-m", "pip", "show", PACKAGE]),
                          source="already installed (pip keeps no origin for it)")
            echo(f"{PACKAGE} {version} already installed in {python} with its dependencies: nothing to do")
        else:
            record.update(action="installed" if fresh else "repaired", command=" && ".join(commands),
                          dependencies_installed=installed, source=_sources(installed_pkgs))
            if installed:
                echo(f"installed {', '.join(installed)} into {python}: {PACKAGE} {version} is complete")
            echo(f"packages came from: {record['source']}")
    except (InstallError, RuntimeError, subprocess.SubprocessError, OSError) as e:
        record.update(action="failed", error=str(e), command=" && ".join(commands) or None,
                      source=_sources(installed_pkgs) if installed_pkgs else "nothing installed")
        record["finished"] = time.time()
        path = write_setup_record(log_dir, record)
        raise InstallError(f"{e} (container-setup record: {path})") from None
    record["finished"] = time.time()
    return record, write_setup_record(log_dir, record)


def _sources(installed: list[dict]) -> str:
    """`nvidia-modelopt 0.47.0, pulp 3.3.2 from local wheel folder /w/modelopt` (grouped by origin)."""
    by: dict[str, list[str]] = {}
    for item in installed:
        by.setdefault(item.get("source") or "unknown", []).append(f"{item.get('name')} {item.get('version')}")
    return "; ".join(f"{', '.join(names)} from {where}" for where, names in by.items()) or "nothing installed"


def install_command(settings: Resolved, dry_run: bool = False, find_links: str | None = None) -> int:
    """Body of `invoke install-modelopt`."""
    python = str(settings.python or "python3")
    index_url = settings.modelopt_index_url

    def say(msg: str) -> None:
        print(f"[install-modelopt] {msg}", flush=True)

    if find_links is not None:
        folder = Path(find_links).expanduser()
        if not folder.is_dir():
            print(f"error: --find-links {find_links} is not a folder (give the folder holding the {PACKAGE} and "
                  "pulp wheels)", file=sys.stderr)
            return 2
        find_links = str(folder.absolute())
    if dry_run:
        say(f"dry-run: {python} -m pip show {PACKAGE}; if absent: "
            f"{shlex.join(install_argv(python, index_url, find_links=find_links))}")
        return 0
    try:
        save_path = bridge_modelopt_imports(Path(settings.bridge_repo)) if settings.bridge_repo else None
        _, path = ensure_modelopt(python, index_url, Path(settings.log_dir), say, save_path=save_path or None,
                                  find_links=find_links)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    say(f"container-setup record: {path}")
    return 0


def latest_setup(log_dir: Path, python: str) -> dict | None:
    """Newest modelopt setup record made for this Python."""
    best = None
    for path in setup_dir(log_dir).glob("*-modelopt-*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if data.get("python") == python and (best is None or data.get("finished", 0) > best.get("finished", 0)):
            best = dict(data, path=str(path))
    return best


def check_container_setup(ctx: RunContext) -> Iterable[Check]:
    """Quote the container-setup record (install-modelopt) of the run's Python in the run's evidence."""
    record = latest_setup(Path(ctx.settings.log_dir), ctx.python)
    if record is None:
        return
    ctx.evidence["container_setup"] = [record]
    action = record.get("action")
    what = {"installed": "installed", "repaired": "repaired (dependencies added)", "present": "found",
            "failed": "install failed"}.get(action, action)
    source = record.get("source") or (f"index {record.get('index_url')}" if record.get("index_url") else "unknown")
    ctx.notes.append(f"container setup: {PACKAGE} {record.get('version') or ''} {what} in {record['python']} "
                     f"({source}; record {record['path']}) — environment, not a repo change")
    if action == "failed":
        yield Check("container setup", WARN, f"the last install-modelopt failed: {record.get('error')} "
                    f"({record['path']})")
        return
    yield Check("container setup", OK, f"{PACKAGE} {record.get('version')} {what} by install-modelopt: {source} "
                f"({record['path']})")
