"""The Bridge-side tests a change proposes: its own changed or added test files, else the nearest existing test of
each changed source module (`tests/**/test_<module>.py`), found in the Bridge checkout at the commit.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from sessions.plan import rules as plan_rules
from sessions.plan.change import Change


def _is_test(path: str) -> bool:
    p = PurePosixPath(path)
    return path.startswith("tests/") and p.suffix == ".py" and p.name.startswith("test_")


def own_tests(change: Change, sources: list[str] | None = None) -> list[str]:
    """The change's own test files (changed or added, still there), then for the changed source modules
    (`sources`, default: every changed Bridge source file) that none of them names, the nearest existing test."""
    root = Path(change.repo)
    own = [f.path for f in change.files if _is_test(f.path) and f.status != "D" and (root / f.path).is_file()]
    srcs = sources if sources is not None else [f.path for f in change.files
                                                if f.path.startswith(plan_rules.SRC) and f.path.endswith(".py")]
    out = list(own)
    tests_dir = root / "tests"
    for src in srcs:
        stem = PurePosixPath(src).stem
        if stem == "__init__" or any(stem in PurePosixPath(t).stem for t in own):
            continue
        found = sorted(p.relative_to(root).as_posix() for p in tests_dir.rglob(f"test_{stem}.py")) \
            if tests_dir.is_dir() else []
        unit = [t for t in found if "/unit_tests/" in t] or found
        for t in unit[:1]:
            if t not in out:
                out.append(t)
    return out


def hint(tests: list[str]) -> str:
    if not tests:
        return "no Bridge test of its own was found for it: add one (nox -s bridge_unit -- <its test file>)"
    return "Bridge's own tests cover it: nox -s bridge_unit -- " + " ".join(tests)
