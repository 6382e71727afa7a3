"""The task here, in a child `invoke` of this project: the simplest launcher (base.py's interface, nothing to sync,
mount or allocate). Attached only; the child's run directory is found by base.run_dirs_in like every backend's."""

from __future__ import annotations

import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from env.launchers.base import Launcher, LaunchPlan, TaskLine, run_dirs_in
from env.settings import PROJECT_ROOT


@dataclass
class LocalPlan(LaunchPlan):
    line: TaskLine
    argv: list[str]
    cwd: Path
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    run_dirs: list[str] = field(default_factory=list)  # filled by run_attached

    def describe(self) -> str:
        return f"# here, in {self.cwd}:\n{shlex.join(self.argv)}\n"


class LocalLauncher(Launcher):
    name = "local"

    def __init__(self, task_line: TaskLine, python: str = sys.executable, cwd: Path = PROJECT_ROOT):
        self.task_line, self.python, self.cwd = task_line, python, cwd

    def plan(self) -> LocalPlan:
        return LocalPlan(self.task_line, [self.python, "-m", "invoke", *self.task_line.tokens], self.cwd)

    def run_attached(self, plan: LocalPlan) -> int:  # type: ignore[override]
        proc = subprocess.Popen(plan.argv, cwd=plan.cwd, stdout=subprocess.PIPE)
        out = sys.stdout.buffer
        try:
            for line in proc.stdout:
                out.write(line)
                out.flush()
                plan.run_dirs += run_dirs_in(line)
            return proc.wait()
        except KeyboardInterrupt:  # the child got the Ctrl-C too: let it write its report
            proc.wait()
            raise
