"""The one code path of every level: resolve settings → preflight → Bridge checks → launch with log tee → judge →
run directory → exit code. Levels differ only by their preset row (env/presets.py) and their pass rule
(sessions/run/level_rules.py).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from env import presets
from env.preflight.checklist import (
    HEAVY_NAMES,
    Check,
    HeavyChecks,
    RunContext,
    first_blocked,
    run_checks,
    start_checks,
    status_table,
    timings_text,
)
from env.preflight.pythonpath import compose
from env.protocol import exits, lines
from env.protocol.cli import task_remainder
from env.protocol.flags import validate
from env.repos import RepoError, bridge_state, verl_state
from env.settings import TOOL_PREFIX, Resolved, UsageError, config_section, require_writable_dir, resolve
from sessions.bridge_unit.records import BridgeChecks
from sessions.run import level_rules, progress
from sessions.run.launch import leftover_checks, redact_env, run_logged, secret_values
from sessions.run.level_task import LEVEL_FLAGS, flags_for, level_table, make_level_task  # noqa: F401 - re-exported
from sessions.run.record import interrupted, save_run, summarize_run_dir
from sessions.run.report import write_reports
from sessions.run.rundir import new_run_dir, next_run_dir

# Hydra keys a level sets per run of its series (level 1: A saves at 1, B resumes to 2): an override after `--`
# would apply to both runs and defeat the series. Level 5's step count is --steps.
OWNED_KEYS: dict[int, dict[str, str]] = {
    1: {k: "level 1's series sets it per run (A: save at step 1; B: resume to step 2)"
        for k in ("trainer.total_training_steps", "trainer.save_freq", "trainer.resume_mode",
                  "trainer.resume_from_path", "trainer.default_local_dir")},
    5: {"trainer.total_training_steps": "use --steps N (the learning-signal checks count on it)"},
}


@dataclass
class LevelOptions:
    number: int
    variant: str | None = None
    dry_run: bool = False
    enforce_eager: bool = False
    no_reward_model: bool = False
    dummy_config: Path | None = None
    download: bool = False
    fresh_probe: bool = False
    probe_first: bool = False
    skip_bridge_checks: bool = False
    bridge_tests: list[str] = field(default_factory=list)
    allow_missing: bool = False
    keep_going: bool = False
    keep_checkpoints: bool = False
    script: str | None = None
    feature: str | None = None
    steps: int | None = None
    baseline: str | None = None
    threshold: str | None = None
    extra_overrides: list[str] = field(default_factory=list)


# what Hydra takes after the script: key=value, +key=value, ++key=value, ~key[=value]; a key is never empty
HYDRA_OVERRIDE = re.compile(r"(?:\+\+?)?[^\s=~+-][^\s=]*=.*|~[^\s=~+][^\s=]*(?:=.*)?", re.DOTALL)


def parse_options(number: int, flags: dict[str, Any], remainder: str = "") -> tuple[LevelOptions, dict[str, Any]]:
    """Split task flags into level options and settings-table flags; validate values (UsageError → exit 2)."""
    flags = validate(level_table(number), flags)  # types, ranges, choices, conflicts: the table's
    setting_names = {f.name for f in LEVEL_FLAGS if f.setting}
    setting_flags = {k: v for k, v in flags.items() if k in setting_names}
    setting_flags["model_id"] = flags.get("model")
    opts = LevelOptions(number)
    for key, value in flags.items():
        if key in setting_names or key in ("model", "verbose") or value is None:
            continue
        setattr(opts, key, value)
    level = presets.LEVELS[number]
    if level.variants:
        opts.variant = opts.variant or level.default_variant
        if opts.variant not in level.variants:
            raise UsageError(f"--variant must be one of {', '.join(level.variants)}, got {opts.variant!r}")
    if isinstance(flags.get("bridge_tests"), str):
        opts.bridge_tests = [p.strip() for p in flags["bridge_tests"].split(",") if p.strip()]
        if not opts.bridge_tests:
            raise UsageError(f"--bridge-tests names no path: {flags['bridge_tests']!r}")
    if flags.get("dummy_config"):
        opts.dummy_config = Path(flags["dummy_config"]).expanduser().absolute()
    try:
        opts.extra_overrides = shlex.split(remainder or "")
    except ValueError as e:
        raise UsageError(f"cannot parse the overrides after --: {e}") from None
    _validate_level_options(opts)
    return opts, setting_flags


def _validate_level_options(opts: LevelOptions) -> None:
    """Level-specific flag values (bad ones are a usage error, exit 2, before anything runs)."""
    from sessions.judge import metrics

    if opts.feature is not None and opts.feature not in level_rules.FEATURES:
        raise UsageError(f"--feature must be one of {', '.join(level_rules.FEATURES)}, got {opts.feature!r}")
    if opts.threshold is not None:
        metrics.parse_threshold(opts.threshold)
    if opts.baseline is not None:
        base = Path(opts.baseline).expanduser().absolute()
        if not ((base / metrics.METRICS_CSV).is_file() or (base / "verl.log").is_file()):
            raise UsageError(f"--baseline {opts.baseline} is not a level run directory (no {metrics.METRICS_CSV} "
                             f"or verl.log)")
        opts.baseline = str(base)
    for override in opts.extra_overrides:
        if not HYDRA_OVERRIDE.fullmatch(override):
            raise UsageError(f"{override!r} after -- is not a Hydra override (KEY=VALUE, +KEY=VALUE, ~KEY)")
    if presets.LEVELS[opts.number].owns_checkpoints:
        owned = [o for o in opts.extra_overrides if o.lstrip("+").startswith("trainer.default_local_dir=")]
        if owned:
            raise UsageError(f"level {opts.number} owns trainer.default_local_dir (a new directory per series, never a "
                             f"stale one): drop {owned[0]}")
    for override in opts.extra_overrides:
        why = OWNED_KEYS.get(opts.number, {}).get(presets.override_key(override))
        if why:
            raise UsageError(f"level {opts.number} sets {presets.override_key(override)} itself: {why}; drop {override}")


def _validate_script(opts: LevelOptions, verl_repo: str) -> None:
    """--script is a verl example script, relative to VERL_REPO (the run's cwd) or absolute; it must exist."""
    if opts.script is None:
        return
    path = Path(opts.script).expanduser()
    full = path if path.is_absolute() else Path(verl_repo) / path
    if not full.is_file():
        raise UsageError(f"--script {opts.script}: no such file under VERL_REPO ({verl_repo})")


@dataclass
class PlannedRun:
    name: str
    env: dict[str, str]  # the full environment of the wrapper
    wrapper_env: dict[str, str]  # the preset variables (what the level sets)
    argv: list[str]
    log_name: str


def settings_env(settings: Resolved) -> dict[str, str]:
    """Settings the wrapper reads from its environment."""
    out = {"MODEL_ID": settings.model_id,
           "MODEL_PATH": str(settings.model_path or Path.home() / "models" / settings.model_id),
           "TRAIN_FILES": str(settings.train_files), "VAL_FILES": str(settings.val_files),
           "RM_MODEL_PATH": str(settings.rm_model_path)}
    if settings.hf_home:
        out["HF_HOME"] = str(settings.hf_home)
    if settings.ray_address:
        out["RAY_ADDRESS"] = settings.ray_address
    return out


def plan_runs(opts: LevelOptions, settings: Resolved, ctx: RunContext, run_dir: Path) -> list[PlannedRun]:
    level = presets.LEVELS[opts.number]
    runs = []
    for spec in level.runs:
        wrapper_env = presets.level_env(level, opts.variant, spec)
        if opts.steps is not None:
            wrapper_env["TOTAL_TRAIN_STEPS"] = str(opts.steps)
        wrapper_env.update(ctx.env)
        if opts.dummy_config is not None:
            wrapper_env.update(USE_DUMMY_MODEL="True", DUMMY_MODEL_CONFIG_PATH=str(opts.dummy_config))
        env = {k: v for k, v in ctx.environ.items() if k not in ctx.drop_env}
        env.update(settings_env(settings))
        env.update(wrapper_env)
        env["PYTHONPATH"] = ctx.pythonpath
        args = [presets.RUNTIME_ENV_PYTHONPATH.format(ctx.pythonpath), *level.overrides,
                *(o for o in ctx.overrides if o not in level.overrides)]  # level 3 + no Apex: once each
        if any(o in presets.GRAD_ACCUM_FUSION_OFF for o in args):
            args += [o for o in presets.ref_fusion_override(ctx.verl.path) if o not in args]
        if opts.enforce_eager:
            args.append(presets.ENFORCE_EAGER)
        if level.owns_checkpoints:
            args.append(f"trainer.default_local_dir={run_dir / 'checkpoints'}")
        args += opts.extra_overrides  # last: later wins in Hydra
        script = opts.script or presets.WRAPPER
        log_name = "verl.log" if len(level.runs) == 1 else f"verl-{spec.name}.log"
        runs.append(PlannedRun(spec.name, env, wrapper_env, ["bash", script, *args], log_name))
    return runs


def replay_command(verl_repo: str, run: PlannedRun, drop_env: list[str]) -> str:
    """A shell line that replays the run from anywhere (preset vars inline; the rest in env.json)."""
    unset = "".join(f"-u {k} " for k in drop_env)
    assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in run.wrapper_env.items())
    keep = ("MODEL_ID", "MODEL_PATH", "TRAIN_FILES", "VAL_FILES", "RM_MODEL_PATH", "PYTHONPATH", "HF_HOME",
            "RAY_ADDRESS")
    assigns += " " + " ".join(f"{k}={shlex.quote(run.env[k])}" for k in keep if k in run.env)
    return f"cd {shlex.quote(verl_repo)} && env {unset}{assigns} {shlex.join(run.argv)}"


def command_sh(ctx: RunContext, settings: Resolved, planned: list[PlannedRun]) -> str:
    """The run directory's command.sh: what the run starts, byte for byte what its --dry-run prints (Blocked runs
    too: every cheap check has shaped the runs, whatever stopped them)."""
    return ("#!/usr/bin/env bash\n# replay of this run (secrets not included; export them yourself)\nset -euo pipefail\n"
            + "".join(("" if settings.ray_address else f"(cd {shlex.quote(ctx.verl.path)} && ray stop --force || true)\n")
                      + replay_command(ctx.verl.path, run, ctx.drop_env) + "\n" for run in planned))


def bridge_checks_step(settings: Resolved, ctx: RunContext, opts: LevelOptions) -> str:
    """What the level does for the Bridge-side checks before verl, without doing it (for --dry-run)."""
    from sessions.bridge_unit.records import find_record
    from sessions.bridge_unit.session import ALLOW_MISSING, NOXFILE, _covers, requested_paths

    if opts.skip_bridge_checks:
        return "# Bridge-side checks: not requested (--skip-bridge-checks; a Limitation)"
    paths = requested_paths(opts.bridge_tests)
    record = find_record(Path(settings.log_dir), ctx.bridge)
    if record is not None and _covers(record, paths, opts.allow_missing):
        return (f"# Bridge-side checks: reuse the bridge_unit record of Bridge {ctx.bridge.head} in this state "
                f"({record.get('status', '?')}): {record.get('path', '')}")
    argv = ["nox", "-f", str(NOXFILE), "-s", "bridge_unit", "--", *opts.bridge_tests]
    if opts.allow_missing:
        argv.append(ALLOW_MISSING)
    stop = "" if opts.keep_going else "; verl starts only if they pass (--keep-going to start anyway)"
    return (f"# Bridge-side checks first (no bridge_unit record of Bridge {ctx.bridge.head} in this state), in "
            f"{ctx.bridge.path}: uv sync --locked --group test, then pytest on {len(paths)} path(s){stop}\n"
            f"BRIDGE_REPO={shlex.quote(ctx.bridge.path)} {shlex.join(argv)}")


def _say(msg: str) -> None:
    print(f"{TOOL_PREFIX} {msg}", flush=True)


def build_context(opts: LevelOptions, settings: Resolved, probe: bool, dry_run: bool = False) -> RunContext:
    if settings.bridge_repo is None:
        raise UsageError("BRIDGE_REPO is not set (--bridge-repo or BRIDGE_REPO)")
    if settings.verl_repo is None:
        sibling = Path(settings.bridge_repo).parent / "verl"
        raise UsageError(f"VERL_REPO is not set; clone verl next to the Bridge checkout: "
                         f"git clone https://github.com/verl-project/verl.git {sibling}")
    try:
        bridge, verl = bridge_state(settings.bridge_repo), verl_state(settings.verl_repo)
    except RepoError as e:
        raise UsageError(str(e)) from None
    level = presets.LEVELS[opts.number]
    wrapper_env = presets.level_env(level, opts.variant, level.runs[-1])
    environ = dict(os.environ)
    return RunContext(
        settings=settings, bridge=bridge, verl=verl,
        pythonpath=compose(Path(bridge.path), Path(verl.path), environ.get("PYTHONPATH")),
        wrapper_env=wrapper_env, python=str(settings.python or "python3"), probe=probe,
        no_reward_model=opts.no_reward_model, image_python=environ.get("VERL_E2E_IMAGE_PYTHON") == "1",
        dummy_config=opts.dummy_config, download=opts.download, environ=environ, dry_run=dry_run,
        user_overrides=list(opts.extra_overrides), base_overrides=list(level.overrides), fresh_probe=opts.fresh_probe,
        level=opts.number, feature=opts.feature, script=opts.script,
        run_envs=[presets.level_env(level, opts.variant, spec) for spec in level.runs],
        taken=presets.level_paths(opts.number, opts.variant, opts.feature, opts.extra_overrides),
    )


def prepare_runs(opts: LevelOptions, settings: Resolved, ctx: RunContext, run_dir: Path,
                 stop_at_blocked: bool = True, before_heavy: Any = None,
                 ) -> tuple[list[Check], list[PlannedRun], HeavyChecks | None]:
    """Preflight, then the runs it shapes (env, dropped variables, appended overrides such as the Apex, nsys and
    reward-model ones): the one computation behind both a level run and its --dry-run, so that the dry-run prints
    exactly the command the run starts. The heavy probes are started, not waited for: no heavy check shapes the
    run, so the caller decides whether verl starts before their answers (see _heavy_alongside)."""
    checks = leftover_checks(Path(settings.log_dir))
    cheap, heavy = start_checks(ctx, stop_at_blocked=stop_at_blocked, before_heavy=before_heavy, prior=checks)
    checks += cheap
    if not stop_at_blocked or first_blocked(checks) is None:
        checks += level_rules.level_checks(opts.number, ctx)
    return checks, plan_runs(opts, settings, ctx, run_dir), heavy


def _heavy_alongside(opts: LevelOptions, heavy: HeavyChecks | None) -> bool:
    """Whether verl starts while the heavy probes still run. On a cold host they take 30-40 s (importing the whole
    stack in the run's Python; measured on an H200 host), most of a Level 0's overhead; verl's own start takes
    minutes and needs the same imports, so the probes run alongside it and a Blocked answer stops verl within a
    tick. Not when the answers are cached or already in (nothing to gain), or with --probe-first."""
    return heavy is not None and not opts.probe_first and not heavy.cached() and not heavy.answered()


def _print_dry_run(ctx: RunContext, settings: Resolved, run_dir: Path, checks: list[Check],
                   planned: list[PlannedRun], opts: LevelOptions, alongside: bool = False) -> None:
    print(f"# run directory, named when the run starts: {run_dir}")
    for run in planned:
        print(f"# run {run.name}: environment = this shell's, with:")
        shown = redact_env({k: v for k, v in run.env.items() if ctx.environ.get(k) != v})
        for k in sorted(shown):
            print(f"export {k}={shlex.quote(shown[k])}")
        for k in ctx.drop_env:
            print(f"unset {k}")
        if not settings.ray_address:
            print(f"# then, in {ctx.verl.path}: ray stop --force")
        print(f"# command (cwd {ctx.verl.path}):")
        print(shlex.join(run.argv))
    print(bridge_checks_step(settings, ctx, opts))
    print("# command.sh (the run directory's replayable command: what the run starts)")
    sys.stdout.write(command_sh(ctx, settings, planned))
    if ctx.level == 4:
        from sessions.run.level_rules import feature_limitations

        print(f"# Level 4: feature {opts.feature or 'unspecified'} via {opts.script or presets.WRAPPER}")
        for lim in feature_limitations(opts.feature, opts.script, None, list(opts.extra_overrides)):
            print(f"#   limitation: {lim}")
    print("# preflight (the run's own checks; nothing downloaded or installed)")
    if alongside:
        print(f"# the run starts verl once the cheap checks pass; {', '.join(HEAVY_NAMES)} run alongside verl's "
              "start (not cached: cold they take 30-40 s), and a Blocked answer stops verl and Blocks the run "
              "(--probe-first waits for them)")
    print(status_table(checks))
    blocked = first_blocked(checks)
    if blocked is not None:
        print(f"# the run would stop at '{blocked.name}' and start nothing")


def run_level(c: Any, number: int, flags: dict[str, Any]) -> int:
    verbose = flags.pop("verbose", False)  # how the run is shown, not what it is: not in run.json's options
    opts, setting_flags = parse_options(number, flags, task_remainder(c))
    settings = resolve(setting_flags, os.environ, config_section(getattr(c, "config", None)))
    require_writable_dir(settings, "log_dir")
    if settings.verl_repo is not None:
        _validate_script(opts, str(settings.verl_repo))  # before the checkouts are read
    ctx = build_context(opts, settings, probe=True, dry_run=opts.dry_run)
    _validate_script(opts, ctx.verl.path)
    level = presets.LEVELS[number]
    if opts.enforce_eager:
        ctx.limitations.append("enforce_eager=True: vLLM CUDA-graph capture not exercised")
    if verbose or settings.verbose:  # also for the processes this level starts (nox -s bridge_unit)
        os.environ[progress.VERBOSE_ENV] = "1"
    variant = f"-{opts.variant}" if opts.variant else (f"-{opts.feature}" if opts.feature else "")
    label = f"level{number}{variant}"

    if opts.dry_run:
        run_dir = next_run_dir(Path(settings.log_dir), label, settings.model_id)
        checks, planned, heavy = prepare_runs(opts, settings, ctx, run_dir, stop_at_blocked=False)
        alongside = _heavy_alongside(opts, heavy)  # decided before the answers are in, as the run decides it
        checks += heavy.finish() if heavy is not None else []
        _print_dry_run(ctx, settings, run_dir, checks, planned, opts, alongside)
        return 0

    run_dir = new_run_dir(Path(settings.log_dir), label, settings.model_id)
    lines.say_run_dir(run_dir)
    ray_stopped: list[str] = []  # `ray stop --force` before the Ray probe starts its cluster, not after
    preflight_started = time.time()
    checks, planned, heavy = prepare_runs(opts, settings, ctx, run_dir,
                                          before_heavy=lambda: ray_stopped.extend(_ray_stop(ctx, settings)))
    if heavy is not None and not _heavy_alongside(opts, heavy):
        checks += heavy.finish()
        heavy = None
    print(status_table(checks), flush=True)
    if heavy is not None:
        _say(f"preflight: {', '.join(HEAVY_NAMES)}: running alongside verl's start; a Blocked answer stops verl "
             "(--probe-first: wait for them)")
    blocked = first_blocked(checks)
    record: dict[str, Any] = {
        "level": number, "title": level.title, "variant": opts.variant, "options": asdict(opts),
        "settings": {k: (None if v is None else str(v)) for k, v in settings.values.items()},
        "setting_sources": settings.sources, "model": settings.model_id,
        "bridge": ctx.bridge.to_json(), "verl": ctx.verl.to_json(), "pythonpath": ctx.pythonpath,
        "preflight": [ch.to_json() for ch in checks], "blocked": blocked.to_json() if blocked else None,
        "evidence": ctx.evidence, "limitations": ctx.limitations, "notes": ctx.notes,
        "overrides": ctx.overrides, "drop_env": ctx.drop_env, "runs": [], "bridge_checks": None,
        "started": time.time(), "finished": None, "stopped_before_verl": None,
        "preflight_started": preflight_started, "heavy_alongside": heavy is not None,
        # level 1: the series' own checkpoint directory (new with the run directory: never a stale one)
        "checkpoint_dir": str(run_dir / "checkpoints") if level.owns_checkpoints else None,
    }
    (run_dir / "env.json").write_text(json.dumps(redact_env(planned[0].env), indent=2, sort_keys=True))
    (run_dir / "command.sh").write_text(command_sh(ctx, settings, planned))
    save_run(run_dir, record)

    if blocked is None:
        try:
            checks_result = ensure_bridge_checks(settings, ctx, opts, run_dir)
        except KeyboardInterrupt:  # Ctrl-C while the unit tests ran: still leave a summary behind
            checks_result = BridgeChecks("Blocked", "interrupted (Ctrl-C) while the Bridge-side checks ran")
            record["stopped_before_verl"] = "interrupted while the Bridge-side checks ran"
        record["bridge_checks"] = checks_result.to_json()
        if (not record["stopped_before_verl"] and checks_result.status not in ("Pass", "Not requested")
                and not opts.keep_going):
            record["stopped_before_verl"] = f"Bridge-side checks {checks_result.status} (--keep-going to run anyway)"
        if heavy is not None and heavy.answered():  # in while the Bridge-side checks ran: before verl, then
            _heavy_answer(heavy, record, run_dir)
            heavy = None
        if not record["stopped_before_verl"] and not record["blocked"]:
            _launch_all(ctx, settings, planned, run_dir, record, heavy, ray_stopped)
    if heavy is not None and not heavy.recorded:  # verl ended (or was stopped) before the probes answered
        if interrupted(record):
            record["preflight"] += [ch.to_json() for ch in heavy.abandon("the run was interrupted first")]
            heavy.recorded = True
        else:
            _heavy_answer(heavy, record, run_dir)
    record["finished"] = time.time()
    save_run(run_dir, record)

    summary = summarize_run_dir(run_dir)
    write_reports(run_dir, summary)
    print(progress.outcome(summary, run_dir, [(e["name"], run_dir / e["log"]) for e in record["runs"]]), flush=True)
    lines.say_run_dir(run_dir)
    if level.owns_checkpoints and not opts.keep_checkpoints:
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    return summary["exit_code"]  # 130 when Ctrl-C / SIGTERM stopped it: the summary is written first


def ensure_bridge_checks(settings: Resolved, ctx: RunContext, opts: LevelOptions, run_dir: Path) -> BridgeChecks:
    # the matching bridge_unit record, else run `nox -s bridge_unit` now (its log goes into the run directory)
    from sessions.bridge_unit.session import ensure_for_level

    return ensure_for_level(Path(settings.log_dir), ctx.bridge, opts.skip_bridge_checks, opts.bridge_tests,
                            opts.allow_missing, run_dir, ctx.environ,
                            settings.stall_timeout * 60 if settings.stall_timeout else None)


def _heavy_answer(heavy: HeavyChecks, record: dict, run_dir: Path) -> Check | None:
    """Wait for the heavy probes, add their results to the record; their first Blocked one blocks the level."""
    checks = heavy.finish()
    if heavy.recorded:
        return first_blocked(checks)
    heavy.recorded = True
    record["preflight"] += [ch.to_json() for ch in checks]
    blocked = first_blocked(checks)
    if record["runs"]:  # verl had started alongside the probes: say when each happened
        began = record["preflight_started"]
        answered = record["evidence"].get("preflight_timings", {}).get("total_s")
        record["notes"].append(
            f"preflight's heavy probes ran alongside verl's start: verl started "
            f"{record['runs'][0]['started'] - began:.1f} s after preflight began"
            + (f", the probes answered {answered:.1f} s after it" if answered is not None else ""))
    if blocked is not None and not record["blocked"]:
        record["blocked"] = blocked.to_json()
        if record["runs"]:
            record["blocked"]["while_verl_ran"] = True
    save_run(run_dir, record)
    return blocked


def _ray_stop(ctx: RunContext, settings: Resolved, env: dict[str, str] | None = None) -> list[str]:
    """`ray stop --force` on this host, never when attaching to someone's cluster (--ray-address); the log line."""
    env = env if env is not None else ctx.environ
    if settings.ray_address or not shutil.which("ray", path=env.get("PATH")):
        return []
    stop = subprocess.run(["ray", "stop", "--force"], cwd=ctx.verl.path, env=env, capture_output=True, timeout=120)
    return [f"{TOOL_PREFIX} ray stop --force: exit {stop.returncode}\n"]


def _launch_all(ctx: RunContext, settings: Resolved, planned: list[PlannedRun], run_dir: Path, record: dict,
                heavy: HeavyChecks | None = None, ray_stopped: list[str] | None = None) -> None:
    """Each planned run in turn, its log teed into the run directory. `heavy`: preflight probes still running
    (the first run starts alongside them); polled while a run goes, a Blocked answer stops it."""
    secrets = secret_values(ctx.environ)

    def probes_blocked() -> str | None:
        nonlocal heavy
        if heavy is None or not heavy.answered():
            return None
        blocked, heavy = _heavy_answer(heavy, record, run_dir), None
        return None if blocked is None else f"preflight '{blocked.name}' Blocked"

    stall = settings.stall_timeout * 60 if settings.stall_timeout else None
    for i, run in enumerate(planned):
        log_path = run_dir / run.log_name
        entry = {"name": run.name, "log": run.log_name, "argv": run.argv, "wrapper_env": run.wrapper_env,
                 "command": replay_command(ctx.verl.path, run, ctx.drop_env), "started": time.time()}
        record["runs"].append(entry)
        save_run(run_dir, record)
        with open(log_path, "ab") as log:
            header = f"{TOOL_PREFIX} level {record['level']} run {run.name}: {entry['command']}\n"
            log.write(header.encode())
            # the first run's stop ran before the heavy probes (whose Ray cluster it would kill)
            stopped = ray_stopped if i == 0 and ray_stopped else _ray_stop(ctx, settings, run.env)
            log.write("".join(stopped).encode())
            log.flush()
            steps = run.wrapper_env.get("TOTAL_TRAIN_STEPS")
            display = progress.verl_display("verl" if len(planned) == 1 else f"verl run {run.name}", run_dir,
                                            level=record["level"], steps=int(steps) if steps else None)
            result = run_logged(run.argv, cwd=Path(ctx.verl.path), env=run.env, log=log, log_path=log_path,
                                stall_timeout=stall, secrets=secrets, display=display, watch=probes_blocked)
            log.write(f"\n{lines.wrapper_exit_footer(result.exit_code, result.termination, result.duration_s)}\n"
                      .encode())
            if result.termination:
                # Ray's daemons run in sessions of their own: stopping the wrapper's group does not reach them
                log.write("".join(_ray_stop(ctx, settings, run.env)).encode())
                log.flush()
        entry.update(exit_code=result.exit_code, termination=result.termination, duration_s=result.duration_s,
                     signal=result.signal_name)
        if record.get("checkpoint_dir"):  # what this run left in the series' directory (kept after cleanup)
            entry["checkpoints"] = level_rules.checkpoint_state(Path(record["checkpoint_dir"]))
        save_run(run_dir, record)
        if result.termination or result.exit_code != 0:
            break  # a later run of the series (level 1 B) means nothing after this one failed
        if heavy is not None:  # never start a second run before the probes answered
            _heavy_answer(heavy, record, run_dir)
            heavy = None
            if record["blocked"]:
                break


def doctor_command(c: Any, flags: dict[str, Any], level: int = 0, as_json: bool = False, timings: bool = False,
                   fresh_probe: bool = False) -> int:
    """Every preflight check as a ✔/✘ table; exit 3 when one is Blocked."""
    if level not in presets.LEVELS:
        raise UsageError(f"--level must be 0..5, got {level}")
    settings = resolve(flags, os.environ, config_section(getattr(c, "config", None)))
    opts = LevelOptions(level, variant=presets.LEVELS[level].default_variant, fresh_probe=fresh_probe)
    ctx = build_context(opts, settings, probe=True)
    checks = run_checks(ctx, stop_at_blocked=False)
    if as_json:
        json.dump([ch.to_json() for ch in checks], sys.stdout, indent=2)
        print()
    else:
        print(status_table(checks, timings=timings))
        if timings:
            print(timings_text(ctx.evidence))
    return exits.BLOCKED if first_blocked(checks) else exits.PASS
