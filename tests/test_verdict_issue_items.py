"""Issue items of session 4: the phase label never goes back nor past what the log shows; a level's limitation only
with `--level`; an `attention_backend=fused` override is a Limitation; a binary file is no log (usage error)."""

from __future__ import annotations

import os

import pytest

from sessions.judge.verdict import judge_command, judge_lines, judge_log
from tests.conftest import real_logs

VAL0 = ("(TaskRunner pid=7) step:0 - val-core/openai/gsm8k/reward/mean@1:0.12 - "
        "val-aux/openai/gsm8k/score/mean@1:0.12")
DIED = [
    "(raylet) A worker died or was killed while executing a task by an unexpected system error.",
    "Error executing job with overrides: []",
    "Traceback (most recent call last):",
    '  File "/verl/verl/trainer/main_ppo.py", line 42, in main',
    "    run_ppo(config)",
    "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.",
    "\tclass_name: TaskRunner",
]


def test_an_actor_death_after_the_step0_validation_is_not_read_as_ray_up():
    """Validation before training generates with the rollout: the models were built and the rollout was up."""
    verdict = judge_lines([VAL0, *DIED])
    assert (verdict.result, verdict.category) == ("Fail", "actor-died")
    assert verdict.phase == "rollout-up", verdict.phase


def test_a_real_taskrunner_death_after_step0_validation_is_past_ray_up():
    verdict = judge_log(real_logs() / "05_fail_megatron_taskrunner_actordied_k8s_mem.log")
    assert verdict.category == "actor-died" and verdict.phase == "rollout-up", verdict.phase


RESUMED = [
    "(TaskRunner pid=7) Training Progress:   0%|          | 0/1 [00:00<?, ?it/s]",
    "(WorkerDict pid=8) Loaded HF model checkpoint from /ckpt/global_step_1/actor/huggingface with bridge",
    "(WorkerDict pid=8) Loaded optimizer checkpoint from /ckpt/global_step_1/actor",
]


def test_an_interrupted_run_that_only_loaded_its_checkpoint_is_not_past_its_steps():
    """A resume loads before the first step: the phase of a run interrupted there is no later than training."""
    verdict = judge_lines(RESUMED, termination="interrupted")
    assert verdict.result == "Blocked" and verdict.category == "interrupted"
    assert verdict.steps_completed == 0 and verdict.phase == "model-built", verdict.phase


def test_a_failure_while_loading_the_checkpoint_still_reads_checkpoint():
    verdict = judge_lines([*RESUMED, "Traceback (most recent call last):",
                           "megatron.core.dist_checkpointing.core.CheckpointingException: Object shard missing"])
    assert verdict.category == "checkpoint" and verdict.phase == "checkpoint", (verdict.category, verdict.phase)


def test_a_rollout_failure_after_training_steps_reads_training():
    """The rollout of step 2 failing after step 1 trained: the phase stays training, it does not go back."""
    lines = ["+ TOTAL_TRAIN_STEPS=3", "(TaskRunner pid=7) step:1 - training/global_step:1 - actor/pg_loss:0.1",
             "Error executing job with overrides: []",
             "ray.exceptions.RayTaskError(EngineDeadError): ray::AgentLoopWorker.generate_sequences() (pid=9)",
             "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue."]
    verdict = judge_lines(lines)
    assert verdict.category == "rollout" and verdict.phase == "training", verdict.phase


SIXTY = ["+ TOTAL_TRAIN_STEPS=60"] + [
    f"(TaskRunner pid=7) step:{n} - training/global_step:{n} - actor/pg_loss:0.1" for n in range(1, 61)]


def test_a_level_limitation_is_listed_only_with_level(tmp_path, capsys):
    path = tmp_path / "run.log"
    path.write_text("\n".join(SIXTY) + "\n")
    assert judge_command(str(path)) == 0
    assert "Level 0 smoke" not in capsys.readouterr().out
    assert not any("Level 0" in item for item in judge_log(path).limitations)
    judge_command(str(path), level=0)
    assert "Level 0 smoke" in capsys.readouterr().out


def test_an_attention_backend_fused_override_is_a_limitation():
    command = ("+ python3 -m verl.trainer.main_ppo trainer.total_training_steps=1 "
               "actor_rollout_ref.actor.megatron.override_transformer_config.attention_backend=fused")
    verdict = judge_lines([command, "(TaskRunner pid=7) step:1 - training/global_step:1 - actor/pg_loss:0.1"])
    assert verdict.result == "Pass"
    assert any("flash-attn path not exercised" in item for item in verdict.limitations), verdict.limitations


@pytest.mark.parametrize("content", [os.urandom(4096), b"\x7fELF\x02\x01\x01" + bytes(300) + b"RuntimeError: x"])
def test_judge_refuses_a_binary_file_as_bad_usage(tmp_path, capsys, content):
    path = tmp_path / "a.out"
    path.write_bytes(content)
    assert judge_command(str(path)) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("error: ") and "not a text log" in out[0], out


@pytest.mark.parametrize("content", [b"", b"\n \n"])
def test_judge_of_an_empty_log_is_a_fail_that_says_so_in_one_line(tmp_path, capsys, content):
    """An empty log is what a run that died before printing leaves: the run's answer (Fail), not a usage error."""
    path = tmp_path / "run.log"
    path.write_bytes(content)
    assert judge_command(str(path)) == 1
    assert "the file is not a text log (empty)" in capsys.readouterr().out
    verdict = judge_log(path)
    assert (verdict.result, verdict.category) == ("Fail", "unknown")
    assert verdict.first_error.count("not a text log") == 1
    assert not any("not a text log" in item for item in verdict.limitations)  # said once, not twice


def test_a_real_log_with_a_few_nul_bytes_is_a_text_log(tmp_path, capsys):
    """68 holds two NUL bytes a worker printed: judged, not refused, and no 'not a text log' note."""
    path = real_logs() / "68_pass_fsdp_ppo_benign_worker_traceback_then_steps0_18.log"
    assert b"\x00" in path.read_bytes()
    verdict = judge_log(path)
    # read as text: its 18 steps are there (it ends below verl's planned total, 29 x 15: not a Pass, not binary)
    assert verdict.steps_completed == 18 and not any("not a text log" in item for item in verdict.limitations)
    assert judge_command(str(path)) == 1  # judged (Fail: it ends after step 18 of 29 x 15), not refused (2)
    assert not capsys.readouterr().out.startswith("error:")


@pytest.mark.parametrize("magic", [b"\x7fELF", b"\xcf\xfa\xed\xfe", b"MZ", b"PK\x03\x04", b"\x1f\x8b"])
def test_an_executable_or_archive_is_refused_whatever_text_it_holds(tmp_path, magic):
    path = tmp_path / "a.bin"
    path.write_bytes(magic + b"\x00\x01" + b"RuntimeError: boom\n" * 50)
    assert judge_command(str(path)) == 2


def _epoch_log(last_step: int, first_step: int = 1, extra: tuple[str, ...] = ()) -> list[str]:
    """An old-style log: verl prints its dataloader size; the epochs are on the command line (no total printed)."""
    lines = ["+ python3 -m verl.trainer.main_ppo trainer.total_epochs=15 trainer.n_gpus_per_node=2", *extra,
             "(main_task pid=7) Size of train dataloader: 14", "(main_task pid=7) Size of val dataloader: 1"]
    lines += [f"(main_task pid=7) step:{s} - critic/score/mean:0.5 - actor/pg_loss:0.1"
              for s in range(first_step, last_step + 1)]
    return lines


def test_verl_s_own_planned_total_is_dataloader_size_times_epochs():
    """verl (RayPPOTrainer._create_dataloader): total_training_steps = len(train_dataloader) * total_epochs unless
    trainer.total_training_steps is set. A log ending at step 105 of that 210 with no error is not a Pass."""
    cut = judge_lines(_epoch_log(105))
    assert (cut.result, cut.steps_expected) == ("Fail", 210)
    assert cut.first_error.startswith("no exception line in the log; it ends after step 105 of 210")
    assert judge_lines(_epoch_log(210)).result == "Pass"
    assert judge_lines(_epoch_log(209, first_step=0)).result == "Pass"  # releases that count steps from 0
    explicit = judge_lines(_epoch_log(5, extra=("+ python3 -m verl.trainer.main_ppo trainer.total_training_steps=5",)))
    assert (explicit.result, explicit.steps_expected) == ("Pass", 5)  # verl's override wins over the formula


def _sft_log(last: int, per_epoch: int = 62, epochs: int = 6) -> list[str]:
    """verl's SFT trainer as a terminal shows it: its tqdm bar (total=steps_per_epoch, desc `Epoch E/N`) redrawn
    before each metrics line, the bars of later steps cut at the terminal's width before their counts."""
    lines = []
    for step in range(1, last + 1):
        epoch, done = (step - 1) // per_epoch + 1, (step - 1) % per_epoch + 1
        bar = f"Epoch {epoch}/{epochs}:  {100 * done // per_epoch}%|{'█' * (done % 40)}"
        lines.append(bar + (f"| {done}/{per_epoch} [00:22<07:00,  7.12s/it]" if step <= 3 else ""))
        lines.append(f"step:{step} - train/loss:0.19 - train/lr(1e-3):0.0083 - train/time(s):6.06")
    return lines


def test_verl_s_sft_bar_shows_the_planned_total_its_epochs_times_steps_per_epoch():
    """sft_trainer.py: tqdm(total=self.steps_per_epoch, desc=f"Epoch {epoch + 1}/{total_epochs}"): a log ending in
    epoch 3 of 6 with no error is not a Pass; the total is the latest bar's (a paste of two runs ends in the last)."""
    cut = judge_lines(_sft_log(152))
    assert (cut.result, cut.steps_expected) == ("Fail", 372), cut.summary
    assert cut.first_error.startswith("no exception line in the log; it ends after step 152 of 372")
    assert judge_lines(_sft_log(12, per_epoch=4, epochs=3)).result == "Pass"
    explicit = judge_lines(["Total training steps: 152", *_sft_log(152)])
    assert (explicit.result, explicit.steps_expected) == ("Pass", 152)  # a printed total wins over the bar's


STEPPED = ["+ TOTAL_TRAIN_STEPS=100",
           "(TaskRunner pid=7) step:1 - training/global_step:1 - actor/pg_loss:0.1",
           "(TaskRunner pid=7) step:2 - training/global_step:2 - actor/pg_loss:0.1"]
KEYBOARD = ["Traceback (most recent call last):", '  File "/verl/verl/trainer/main_ppo.py", line 42, in main',
            "KeyboardInterrupt"]


@pytest.mark.parametrize("lines, termination", [([*STEPPED, *KEYBOARD], None), (STEPPED, "interrupted")])
def test_an_interruption_after_training_steps_fails_the_run(lines, termination):
    """SPEC's Blocked is "stopped before the provider was exercised": two steps exercised it (issue 25.3)."""
    verdict = judge_lines(lines, termination=termination)
    assert (verdict.result, verdict.category) == ("Fail", "interrupted"), verdict.first_error


@pytest.mark.parametrize("termination", [None, "interrupted"])
def test_an_interruption_before_any_step_stays_blocked(termination):
    verdict = judge_lines(["+ TOTAL_TRAIN_STEPS=100", *(KEYBOARD if termination is None else [])],
                          termination=termination)
    assert (verdict.result, verdict.category) == ("Blocked", "interrupted"), verdict.first_error
