"""A stopping run's record on CPU: the worker's handler (vlmtrain.worker.stop_with_record) on the errors a training
rank dies of, the record it writes, the paragraph it prints, its exit status, and the report reading it back.

- Non-finite: the metrics callback's own check raises on a real metrics row with a NaN loss. Megatron's checks
  (validate_result) ask for a CUDA device before they raise, so their message is matched on the text Megatron
  formats; the GPU test (tests/gpu/test_reliability.py) makes Megatron raise it for real.
- Out of memory: torch raises OutOfMemoryError only for CUDA; here a real CPU allocation failure (torch.empty of
  2**60 bytes) takes the same path. The GPU test makes a real CUDA OOM.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vlmtrain import worker
from vlmtrain.config.compose import compose
from vlmtrain.config.resolve import resolve
from vlmtrain.observe import failure
from vlmtrain.observe.metrics_callback import MetricsCallback
from vlmtrain.observe.timing import StepTimer
from vlmtrain.report.sources import job_from_dir
from vlmtrain.train.step_counters import StepCounters

MICRO_BATCHES = [[3, 5], [1, 0]]


def callback_at(run: Any, step: int, component: str) -> MetricsCallback:
    """A metrics callback as the rank holds it mid-step: Bridge's GlobalState at `step`, this step's sample ids
    taken off two micro-batches, the step timer inside `component`."""
    from megatron.bridge.training.state import GlobalState

    timer = StepTimer(clock=lambda: None)
    res = resolve(run)
    counters = StepCounters(run, res, timer.data)
    cb = MetricsCallback(run, res, counters, timer)
    cb.state = GlobalState()
    cb.state.train_state.step = step
    counters.sample_ids = [list(mb) for mb in MICRO_BATCHES]
    timer.timeline.enter(component)
    return cb


def stop(run: Any, error: BaseException, cb: MetricsCallback, capsys: Any) -> tuple[int, dict[str, Any], str]:
    with pytest.raises(SystemExit) as exit_info:
        worker.stop_with_record(run, error, cb)
    (rec,) = failure.read(run.output_dir)
    return int(exit_info.value.code), rec, capsys.readouterr().err


def save_tracker(save_dir: Path, iteration: int) -> None:
    """What Bridge's save_checkpoint leaves once a checkpoint is complete: the tracker file with its iteration."""
    from megatron.bridge.training.utils.checkpoint_utils import get_checkpoint_tracker_filename

    save_dir.mkdir(parents=True)
    Path(get_checkpoint_tracker_filename(str(save_dir))).write_text(str(iteration))


def test_nonfinite_loss_stops_with_step_samples_and_last_checkpoint(tmp_path: Path, capsys: Any) -> None:
    run = compose(["train.save_interval=4", f"train.checkpoint_dir={tmp_path / 'ckpt'}"], output_dir=str(tmp_path))
    save_tracker(tmp_path / "ckpt", 4)
    cb = callback_at(run, 6, "decoder")
    row = {"step": 6, "lm_loss": float("nan"), "grad_norm": 1.5}
    with pytest.raises(failure.NonFiniteStep) as raised:
        cb._stop_if_nonfinite(row)
    code, rec, err = stop(run, raised.value, cb, capsys)
    assert code == failure.EXIT["nonfinite"] == 4
    assert rec["kind"] == "nonfinite" and rec["step"] == 6 and rec["micro_batches"] == MICRO_BATCHES
    assert rec["last_checkpoint"] == str(tmp_path / "ckpt" / "iter_0000004")
    assert "STOPPED: non-finite" in err and "[[3, 5], [1, 0]]" in err and "iter_0000004" in err
    assert "at step 6 (Bridge's log: iteration 7) on rank 0" in err
    assert json.loads((tmp_path / "metrics.jsonl").read_text())["step"] == 6  # the bad row is kept
    status, reason = job_from_dir(tmp_path).status, job_from_dir(tmp_path).reason
    assert status == "nonfinite" and "samples [[3, 5], [1, 0]]" in reason and "iter_0000004" in reason


def test_stop_at_step_end_stops_every_rank_on_the_grad_norm(tmp_path: Path, capsys: Any) -> None:
    """train.on_nonfinite=stop_at_step_end leaves the check to the callback: a rank that writes no row (no loss
    there) stops on the step's grad norm, the same on every rank, and its record says any micro-batch may hold it."""
    run = compose(["train.on_nonfinite=stop_at_step_end"], output_dir=str(tmp_path))
    cb = callback_at(run, 3, "decoder")
    with pytest.raises(failure.NonFiniteStep) as raised:
        cb._stop_if_nonfinite({"step": 3, "grad_norm": float("nan")})
    code, rec, err = stop(run, raised.value, cb, capsys)
    assert code == failure.EXIT["nonfinite"] and rec["step"] == 3 and rec["micro_batches"] == MICRO_BATCHES
    assert rec["on_nonfinite"] == "stop_at_step_end" and "grad_norm=nan" in rec["error"]
    assert "any of them: the step's loss and grad norm were checked at its end" in err
    callback_at(run, 4, "other")._stop_if_nonfinite({"step": 4, "grad_norm": 2.0})  # finite: no raise


def test_skip_mode_lets_a_nonfinite_step_pass(tmp_path: Path) -> None:
    run = compose(["train.on_nonfinite=skip"], output_dir=str(tmp_path))
    callback_at(run, 2, "other")._stop_if_nonfinite({"step": 2, "lm_loss": float("inf")})  # no raise


def test_no_checkpoint_yet_is_named_none(tmp_path: Path, capsys: Any) -> None:
    run = compose([], output_dir=str(tmp_path))
    _, rec, err = stop(run, failure.NonFiniteStep("grad_norm=nan"), callback_at(run, 0, "optimizer"), capsys)
    assert rec["last_checkpoint"] == "none" and "Last good checkpoint: none" in err


def test_megatron_nonfinite_messages_are_recognised() -> None:
    # the texts rerun_state_machine.validate_result (rerun disabled) and Megatron-FSDP's grad check raise
    loss = ("Rank 0, node n1, device 0, iteration 7: Unexpected result nan (message='found NaN in local forward "
            "loss calculation')")
    grad = ("Rank 1, node n1, device 1, iteration 3: Unexpected result tensor(inf, device='cuda:1') (message='found "
            "Inf in local grad norm for bucket #0 in backward pass before data-parallel communication collective')")
    fsdp = "[Megatron-FSDP](check_for_nan_in_grad=True) Detected NaN or Inf in wgrad: tensor(nan)"
    assert [failure.kind(RuntimeError(m)) for m in (loss, grad, fsdp)] == ["nonfinite"] * 3
    assert failure.kind(RuntimeError("Unexpected result 3.2 (message='spiky loss')")) is None
    assert failure.kind(ValueError("anything else")) is None


def test_oom_names_the_component_and_the_estimates_overrides(tmp_path: Path, capsys: Any) -> None:
    import torch

    run = compose(["train.micro_batch_size=4"], output_dir=str(tmp_path))
    try:
        torch.empty(2**60, dtype=torch.uint8)  # a real allocation failure (CPU allocator)
    except RuntimeError as e:
        error = e
    code, rec, err = stop(run, error, callback_at(run, 3, "vision"), capsys)
    assert code == failure.EXIT["oom"] == 5
    assert rec["kind"] == "oom" and rec["component"] == "vision" and rec["step"] == 3
    assert "train.micro_batch_size=4" in rec["advice"] and "smaller train.micro_batch_size" in rec["advice"]
    assert "in the vision component" in err
    job = job_from_dir(tmp_path)
    assert job.status == "oom" and "vision" in job.reason and "recompute=" in job.reason


def test_other_errors_are_left_to_the_caller(tmp_path: Path) -> None:
    run = compose([], output_dir=str(tmp_path))
    assert worker.stop_with_record(run, ValueError("a bug"), callback_at(run, 1, "other")) is None
    assert failure.read(tmp_path) == []


def test_train_py_exits_with_the_status_of_a_record_written_by_this_launch(tmp_path: Path, capsys: Any) -> None:
    """torchrun exits 1 for any failed rank (seen on an H200: the NaN run's train.py exited 1); the record of this
    launch gives the status, a record left by an earlier attempt in the same run dir does not."""
    import os
    import time

    run = compose([], output_dir=str(tmp_path))
    stop(run, failure.NonFiniteStep("lm_loss=nan"), callback_at(run, 2, "decoder"), capsys)
    since = time.time()
    assert failure.exit_status(1, tmp_path, since=since - 60) == 4
    assert failure.exit_status(0, tmp_path, since=since - 60) == 0
    (record,) = tmp_path.glob(failure.RECORD_GLOB)
    os.utime(record, (since - 3600, since - 3600))  # an earlier attempt's record: this launch's crash is its own
    assert failure.exit_status(1, tmp_path, since=since) == 1
    assert failure.read(tmp_path, since=since) == [] and len(failure.read(tmp_path)) == 1


def test_a_data_bound_step_after_warm_up_is_said_once(tmp_path: Path, capsys: Any) -> None:
    """The console hint: not for the warm-up steps (their batches were prefetched), once for the first later step
    that waited on the loader (the recorded H1 run's step 4 waited 0.954 of 3.97 s)."""
    from vlmtrain.observe.run_summary import SKIP

    run = compose(["data=realistic"], output_dir=str(tmp_path))
    cb = callback_at(run, 0, "data")
    for step in range(SKIP + 2):
        cb._hint_if_data_bound({"step": step, "step_s": 3.97, "time_data_s": 0.954 if step else 3.2})
    out = capsys.readouterr().out
    assert out.count("data-bound") == 1
    assert f"step {SKIP} waited 0.95 s (24%)" in out and "data.num_workers (now 2)" in out
