"""The Slurm preemption check's CPU side (vlmtrain.lab.checks.slurm_preempt): the training it submits builds
the Bridge config it relies on (checkpoints only on the exit signal), the disk check refuses a 30B-A3B checkpoint
that cannot fit, and the verdict reads the files a real requeued run leaves (rank records written by
launch/slurm.py itself) and fails on each way a resume can go wrong.
The GPU run: tests/gpu/test_slurm_preempt_gpu.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vlmtrain.config.resolve import resolve
from vlmtrain.lab.checks import slurm_preempt as sp
from vlmtrain.launch import slurm

CASE = sp.CASES["tiny"]
REF = {s: 10.0 - 0.1 * s for s in range(sp.iterations(CASE.case))}


def test_submitted_training_saves_only_on_the_exit_signal(compose, bridge, tmp_path):
    from vlmtrain.build import container

    ckpt = tmp_path / "ckpt"
    run = compose(*sp.saving(sp.CASES["30b"].case, ckpt).command_line())
    assert (run.model.name, run.model.num_layers, run.data.kind) == ("qwen3_vl_30b_a3b", 4, "realistic")
    cfg = container.build(run, resolve(run))
    assert cfg.checkpoint.save == cfg.checkpoint.load == str(ckpt)
    assert cfg.checkpoint.save_interval == 0  # Bridge: no interval save, no final save; the signal's save stays
    assert cfg.train.exit_signal_handler is True
    assert (cfg.train.micro_batch_size, cfg.train.global_batch_size, cfg.train.train_iters) == (1, 2, 8)
    # the reference run is the same training without checkpoints
    plain = compose(*sp.CASES["30b"].case.command_line())
    ref = container.build(plain, resolve(plain))
    assert ref.checkpoint.save is None and ref.train.train_iters == 8


def test_disk_check_sizes_the_30b_checkpoint(tmp_path):
    need = sp.checkpoint_gib(sp.CASES["30b"].case)
    assert 40 < need < 60  # 4 layers of 128 experts + the 27-layer ViT: BF16 weights + 12 B/param of Adam state
    assert sp.checkpoint_gib(CASE.case) < 2  # tiny: mostly its 151k-token embedding and output layer
    big = sp.CASES["30b"].case
    assert sp.disk_problem(big, tmp_path, need, need + sp.DISK_MARGIN_GIB) is None
    problem = sp.disk_problem(big, tmp_path, need, need)
    assert problem is not None and "--ckpt" in problem and "--layers" in problem and str(tmp_path) in problem
    # the fallback for a smaller disk: fewer decoder layers of the same shape, a smaller checkpoint
    smaller = sp.with_layers(sp.CASES["30b"], 2)
    two = smaller.case
    assert two.name == "qwen3_vl_30b_a3b_l2" and two.setting("model.num_layers") == "2"
    assert len(two.overrides) == len(big.overrides) and smaller.signal_after == sp.CASES["30b"].signal_after
    assert sp.checkpoint_gib(two) < need - 10


def _record(job: str, restart: str | None) -> dict:
    return {"rank": 0, "local_rank": 0, "world_size": 1, "local_world_size": 1,
            "slurm": {"job_id": job, "restart_count": restart}}


def requeued_run(tmp_path: Path, saved: int = 4, logged_before: int = 4, off: float = 0.0) -> dict:
    """The files of a run preempted after `logged_before` steps and resumed from iteration `saved`."""
    sweep, ckpt = tmp_path / "slurm", tmp_path / "ckpt"
    run_dir = sweep / "0_model=tiny"
    first = _record("17", None)
    slurm.write_rank_record(str(run_dir), first)
    slurm.write_rank_record(str(run_dir), {**first, "signal": {"name": "SIGUSR2", "forwarded": "SIGTERM"}})
    slurm.write_rank_record(str(run_dir), _record("17", "1"))
    steps = [*range(logged_before), *range(saved, sp.iterations(CASE.case))]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "lm_loss": REF[s] + off}) + "\n"
                                                   for s in steps))
    (ckpt / f"iter_{saved:07d}").mkdir(parents=True)
    (ckpt / "latest_checkpointed_iteration.txt").write_text(f"{saved}\n")
    log = sweep / ".submitit" / "17" / "17_0_log.out"
    log.parent.mkdir(parents=True)
    log.write_text("exiting program after receiving SIGTERM.\nRequeued job 17 (3 remaining timeouts)\n"
                   f"  successfully loaded checkpoint from {ckpt} [ t 0/1, p 0/1 ] at iteration {saved}\n")
    ref = tmp_path / "reference"
    ref.mkdir()
    (ref / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "lm_loss": v}) + "\n" for s, v in REF.items()))
    return {"rc": 0, "job_id": "17", "sent": {"after_steps_logged": 4}, "sweep": sweep,
            "job": {"JobId": "17", "JobState": "COMPLETED", "Restarts": "1"}}


def test_verdict_passes_a_clean_resume(tmp_path):
    ok, m = sp.evaluate(CASE, tmp_path / "reference", requeued_run(tmp_path), tmp_path / "ckpt")
    assert ok, m
    assert m["checkpoint_step"] == m["first_step_after_resume"] == 4 and m["same_job_id"]
    assert m["signal_recorded"]["name"] == "SIGUSR2" and m["max_abs_loss_diff_after_resume"] == 0.0


@pytest.mark.parametrize("broken", ["steps_redone", "loss_off", "interval_checkpoint", "not_requeued", "old_ckpt"])
def test_verdict_fails_each_broken_resume(tmp_path, broken):
    slurm_result = requeued_run(tmp_path, logged_before=6 if broken == "steps_redone" else 4,
                                off=0.05 if broken == "loss_off" else 0.0)
    ckpt = tmp_path / "ckpt"
    if broken == "interval_checkpoint":
        (ckpt / "iter_0000002").mkdir()
    if broken == "not_requeued":
        slurm_result["job"]["Restarts"] = "0"
    if broken == "old_ckpt":  # the resumed attempt loaded something else than the signal's checkpoint
        log = next((tmp_path / "slurm" / ".submitit").glob("*/*_log.out"))
        log.write_text(log.read_text().replace("at iteration 4", "at iteration 2"))
    ok, m = sp.evaluate(CASE, tmp_path / "reference", slurm_result, ckpt)
    assert not ok, m
    if broken == "steps_redone":
        assert m["steps_logged_twice"] == [4, 5]
