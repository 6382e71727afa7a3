"""A level's run directory as a record: run.json written as the run goes, and the summary (deliverables, result,
sentence, evidence) rebuilt from run.json and the logs — at the end of a run, and again by `invoke report RUN_DIR`.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

from env import presets
from env.preflight.checklist import BLOCKED
from env.protocol import exits
from env.protocol.cli import EXIT_BY_RESULT
from env.settings import UsageError
from sessions.bridge_unit.records import not_requested
from sessions.judge.verdict import Verdict
from sessions.run import level_rules
from sessions.run.report import DELIVERABLES, Deliverable, overall_result, render_markdown, write_reports

RUN_FILE = "run.json"

def save_run(run_dir: Path, run: dict) -> None:
    tmp = run_dir / (RUN_FILE + ".tmp")
    tmp.write_text(json.dumps(run, indent=2, default=str))
    tmp.replace(run_dir / RUN_FILE)


def _judge_runs(run_dir: Path, record: dict) -> list[tuple[dict, Verdict]]:
    from sessions.judge.verdict import judge_log

    out = []
    for entry in record["runs"]:
        log = run_dir / entry["log"]
        if not log.is_file():
            continue
        steps = entry.get("wrapper_env", {}).get("TOTAL_TRAIN_STEPS")
        verdict = judge_log(log, level=record["level"], steps_expected=int(steps) if steps else None,
                            bridge_src=str(Path(record["bridge"]["path"]) / "src"),
                            exit_code=entry.get("exit_code"), termination=entry.get("termination"))
        out.append((entry, verdict))
    return out


def _import_deliverable(record: dict, judged: list[tuple[dict, Verdict]]) -> Deliverable:
    """Pass only on an import that ran (the heavy probe imported megatron.bridge in the run's Python, the Ray worker
    saw the same checkout); a location that find_spec found is a note, and the deliverable "Not shown"."""
    name = "Local Bridge import in verl"
    checks = {c["name"]: c for c in record["preflight"]}
    location = checks.get("megatron.bridge is the local checkout")
    imported = checks.get("megatron.bridge imports")
    worker = checks.get("Ray worker imports the local Bridge")
    for _, v in judged:
        if v.category in ("env-ray-import", "wrong-bridge"):
            return Deliverable(name, "Blocked", f"{v.first_error} ({v.hint})")
    if location is not None and location["status"] == BLOCKED:
        return Deliverable(name, "Blocked", f"{location['detail']} — wrong Bridge: no evidence for the local change")
    if imported is not None and imported["status"] == BLOCKED:
        return Deliverable(name, "Blocked", f"{imported['name']}: {imported['detail']}")
    if worker is not None and worker["status"] == BLOCKED:
        return Deliverable(name, "Blocked", f"{worker['name']}: {worker['detail']}")
    if imported is None or imported["status"] not in ("ok", "warn"):
        why = imported["detail"] if imported is not None else "the import probe did not run"
        note = (f"note: find_spec locates megatron.bridge at {location['detail']} (a location, not an import)"
                if location is not None and location["status"] != "skipped" else "no location probed either")
        ran = checks.get("driver imports") or checks.get("run's Python")
        if location is None and ran is not None and ran["status"] == BLOCKED:
            return Deliverable(name, "Blocked", f"{ran['name']}: {ran['detail']}")
        return Deliverable(name, "Not shown", f"no import ran ({why}); {note}")
    detail = f"{imported['detail']} (PYTHONPATH={record['pythonpath']})"
    worker_file = record.get("evidence", {}).get("worker_bridge_file")
    if worker_file:
        detail += f"; Ray worker: megatron.bridge from {worker_file}"
    elif worker is not None:
        detail += f"; Ray worker not shown ({worker['detail']})"
    return Deliverable(name, "Pass", detail)


def _restated_settings(record: dict, judged: list[tuple[dict, Verdict]]) -> set[str]:
    """Limitations the log shows for settings this tool applied itself: preflight already stated them, with the
    reason. Settings the user added after `--` are not ours, so the log's limitation for them stays."""
    user = set(record["options"].get("extra_overrides") or [])
    ours = [a for e in record["runs"] for a in e["argv"][2:] if a not in user]
    ours += [f"{k}={v}" for e in record["runs"] for k, v in (e.get("wrapper_env") or {}).items()]
    return {text for _, v in judged for needle, text in v.setting_limitations.items()
            if any(needle in arg for arg in ours)}


def summarize_run_dir(run_dir: Path) -> dict:
    """Deliverables, result and the summary fields, from run.json and the logs (also for `invoke report`)."""
    record = json.loads((run_dir / RUN_FILE).read_text())
    number = record["level"]
    level = presets.LEVELS[number]
    judged = _judge_runs(run_dir, record)
    record["run_dir"] = str(run_dir)  # where the rule finds the logs now (and writes level evidence)
    outcome = level_rules.combine(number, record, judged)
    bc = record.get("bridge_checks") or (
        asdict(not_requested()) if record["options"].get("skip_bridge_checks")
        else {"status": "Skipped", "detail": "preflight stopped first", "limitations": []})
    blocked = record.get("blocked")
    variant = f" --variant {record['variant']}" if record.get("variant") else ""
    if record["options"].get("feature") and not judged:  # judged: the level rule's coverage names it
        variant += f" --feature {record['options']['feature']}"
    what = f"LoRA + {'Megatron-FSDP' if level.env.get('USE_MEGATRON_FSDP') == 'True' else 'Megatron DDP'}"

    deliverables = [Deliverable("Bridge-side checks", bc["status"], bc["detail"]),
                    _import_deliverable(record, judged)]
    if blocked:
        fix = f"; fix: {blocked['fix']}" if blocked.get("fix") else ""
        run_d = Deliverable("verl Megatron backend run", "Blocked",
                            f"verl not started: preflight '{blocked['name']}': {blocked['detail']}{fix}")
    elif record.get("stopped_before_verl"):
        run_d = Deliverable("verl Megatron backend run", "Skipped", f"verl not started: {record['stopped_before_verl']}")
    elif not judged:
        run_d = Deliverable("verl Megatron backend run", "Fail", "no log was written")
    else:
        run_d = Deliverable("verl Megatron backend run", outcome.run_status, f"{what}: {outcome.run_detail}")
    deliverables.append(run_d)
    if level.variant_deliverable is None:
        deliverables.append(Deliverable("Requested variants", "Not requested", f"Level {number} requests no variant"))
    elif run_d.status in ("Skipped", "Blocked") and not judged:
        deliverables.append(Deliverable("Requested variants", "Skipped",
                                        f"{level.variant_deliverable}{variant}: verl not started"))
    else:
        deliverables.append(Deliverable("Requested variants", outcome.variant_status,
                                        f"{level.variant_deliverable}{variant}: {outcome.variant_detail}"))
    logs = [run_dir / e["log"] for e in record["runs"]]
    if not logs:
        deliverables.append(Deliverable("Log capture", "Skipped", f"verl not started; preflight in {run_dir / RUN_FILE}"))
    elif all(p.is_file() and p.stat().st_size > 0 for p in logs):
        cut = [e["name"] for e in record["runs"] if e.get("termination")]
        note = f" (complete up to the {', '.join(e['termination'] for e in record['runs'] if e.get('termination'))})" if cut else ""
        deliverables.append(Deliverable("Log capture", "Pass", ", ".join(map(str, logs)) + note))
    else:
        deliverables.append(Deliverable("Log capture", "Fail", f"missing or empty: {', '.join(map(str, logs))}"))
    assert [d.name for d in deliverables] == list(DELIVERABLES)

    result = overall_result(deliverables)
    title = f"Level {number} ({level.title}{variant})"
    if result == "Pass":
        sentence = f"{title} passed: {outcome.proves or level.proves}."
    elif result == "Fail":
        bad = next(d for d in deliverables if d.status == "Fail")
        sentence = f"{title} failed — {bad.name}: {bad.detail}"
    else:
        # name the blocker itself, not a deliverable that was merely skipped because of it
        bad = next((d for d in deliverables if d.status == "Blocked"), None) or \
            next(d for d in deliverables if d.status == "Skipped")
        sentence = (f"{title} blocked — {bad.name}: {bad.detail}. Not evidence against the Bridge provider.")

    restated = _restated_settings(record, judged)
    user_overrides = [f"user override after --: {o} (not part of the procedure's preset)"
                      for o in record["options"].get("extra_overrides") or []]
    limitations = list(record.get("limitations", [])) + list(bc.get("limitations") or []) + user_overrides + \
        [x for x in outcome.limitations if x not in restated and "not evidence against the Bridge" not in x]
    follow_ups = list(outcome.follow_ups)
    if blocked and blocked.get("fix"):
        follow_ups.insert(0, f"fix the environment: {blocked['fix']}, then rerun")
    if bc["status"] in ("Fail", "Blocked"):
        follow_ups.append(f"Bridge-side checks {bc['status']}: {bc['detail']}")
    elif bc["status"] == "Skipped" and not blocked:
        follow_ups.append("run the Bridge-side checks: nox -s bridge_unit")
    image = record.get("evidence", {}).get("container_image")
    image = f" in container image {image}" if image else ""  # the procedure: keep the exact tag in the report
    commands = [e["command"] for e in record["runs"]] or ["verl not started (see command.sh for the planned command)"]
    model = record["model"]
    mp = record["settings"].get("model_path")
    summary = {
        "suite": f"verl-e2e.level{number}",
        "result": result,
        # what the level process returned: an interrupted run is 130 whatever its Result word says
        "exit_code": exits.INTERRUPTED if interrupted(record) else EXIT_BY_RESULT[result],
        "interrupted": interrupted(record),
        "sentence": sentence,
        "coverage": title + (" with enforce_eager" if record["options"].get("enforce_eager") else "")
        + (" (dummy model)" if record["options"].get("dummy_config") else "")
        + (f", {outcome.coverage}" if outcome.coverage else ""),
        "model": model + (f" (MODEL_PATH={mp})" if mp else ""),
        "deliverables": [asdict(d) for d in deliverables],
        "evidence": {
            "bridge_repo": f"{record['bridge']['path']} @ " + _describe(record["bridge"]),
            "verl_repo": f"{record['verl']['path']} @ " + _describe(record["verl"]),
            "command": " ; ".join(commands) + f" (replay: {run_dir / 'command.sh'})" + image,
            "key_lines": " | ".join(outcome.key_lines) or "none (verl not started)",
        },
        "limitations": list(dict.fromkeys(limitations)),
        "follow_ups": list(dict.fromkeys(follow_ups)),
        "category": outcome.category if judged else (blocked or {}).get("category") or
        ("success" if result == "Pass" else "unknown"),
        "verdicts": {e["name"]: v.to_json() for e, v in judged},
        "run_dir": str(run_dir),
        "notes": record.get("notes", []),
        "level_facts": outcome.facts,
    }
    return summary


def interrupted(record: dict) -> bool:
    """Ctrl-C / SIGTERM stopped the run (its wrapper, or the Bridge-side checks before it)."""
    return (any(e.get("termination") == "interrupted" for e in record["runs"])
            or str(record.get("stopped_before_verl") or "").startswith("interrupted"))


def _describe(state: dict) -> str:
    from env.repos import RepoState

    subs = {k: RepoState(**{**v, "submodules": {}}) for k, v in state.get("submodules", {}).items()}
    return RepoState(**{**state, "submodules": subs}).describe()


def report_command(run_dir: str) -> int:
    """`invoke report RUN_DIR`: rebuild the summary from run.json and the logs, print it, exit with its code."""
    path = Path(run_dir)
    if not (path / "run.json").is_file():
        raise UsageError(f"{path} is not a run directory (no run.json)")
    try:
        summary = summarize_run_dir(path)
    except (ValueError, KeyError, TypeError, AttributeError) as e:  # json.JSONDecodeError is a ValueError
        raise UsageError(f"{path / RUN_FILE} cannot be read back (truncated or not written by this tool?): "
                         f"{type(e).__name__}: {' '.join(str(e).split())[:200]}") from None
    write_reports(path, summary)
    sys.stdout.write(render_markdown(summary))
    return summary["exit_code"]
