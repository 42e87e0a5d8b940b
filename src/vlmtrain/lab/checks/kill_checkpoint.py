"""Kill -9 while a checkpoint is being written, on one GPU with the tiny model.

Bridge makes a checkpoint "the latest" only after its data is complete: save_checkpoint writes iter_N/train_state.pt,
then latest_train_state.pt and latest_checkpointed_iteration.txt, after the barrier that ends a sync save, or as a
finalize step of an async save, after Megatron's own finalize (the .metadata and metadata.json). A relaunch's
loader resolves the iteration from that tracker only (docs/running.md "Killed while saving").

The check: run A trains uninterrupted; run B, the same command with its own checkpoint dir, is watched until a
checkpoint N is the tracker's and the next one's iter dir holds data bytes but no train_state.pt (being written),
then its whole process tree is SIGKILLed. Then the tracker must still name N, Bridge's loader must pick iter_N (its
own `_load_base_checkpoint`, rank 0's read), and the relaunched command must resume from N (its first step is N)
with A's losses (vlmtrain.lab.checks.resume's tolerance) and samples. A missed window (the save finished before the
kill landed, or run B trained to its end without a write seen) is tried again with a fresh run, ATTEMPTS in all; a
run B that fails or times out ends the check with its rc. The row says whether the kill landed, and partial_bytes
against complete_bytes (run A's same checkpoint) whether it landed during the data write or after it, before
finalize.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from vlmtrain.lab.checks.resume import TOLERANCE, case, data_position, launch, losses, max_loss_diff, samples, tracker
from vlmtrain.lab.kit import runner
from vlmtrain.lab.kit.case import Case

ITERATIONS, SAVE_INTERVAL = 8, 2
"""Checkpoints at steps 2, 4, 6, 8: the first one complete, the kill lands in the write of the next."""
ATTEMPTS = 2
TIMEOUT_S = 180
"""A run's limit (startup ~30-40 s, 8 tiny steps, 4 checkpoints of an estimated ~1 GiB each: the 151936-token vocab's
embedding and output layer with their fp32 copies and Adam states)."""
MODES: dict[str, tuple[str, list[str]]] = {  # mode -> (parallelism, overrides it adds)
    "3d": ("3d", []),  # torch_dist, sync save
    "3d_async": ("3d", ["+bridge.checkpoint.async_save=true"]),  # torch_dist through the persistent async writer
    "fsdp": ("fsdp", []),  # fsdp_dtensor, sync save
}
DONE = "train_state.pt"
"""Bridge writes iter_N/train_state.pt first in the step that makes N the latest (train_state_finalize_fn)."""


def iter_dirs(ckpt: Path) -> dict[int, Path]:
    return {int(p.name[5:]): p for p in ckpt.glob("iter_*") if p.name[5:].isdigit()}


def data_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file())


def watch(proc: runner.Run, ckpt: Path, deadline: float) -> dict[str, int] | None:
    """Poll (2 ms) until the iter dir of a checkpoint newer than the tracker's holds data but no train_state.pt;
    what was seen then, or None when the run ended or the deadline passed first."""
    while time.time() < deadline and proc.poll() is None:
        done = tracker(ckpt)
        for step, d in sorted(iter_dirs(ckpt).items()):
            if done is not None and step > done and not (d / DONE).exists() and (b := data_bytes(d)):
                return {"target_step": step, "tracker_at_kill": done, "partial_bytes_at_kill": b}
        time.sleep(0.002)
    return None


def partial_state(d: Path) -> dict[str, Any]:
    """What the kill left in the partial iter dir."""
    files = sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file())
    return {"partial_files": files, "partial_bytes": data_bytes(d), "partial_has_train_state": DONE in files,
            "partial_has_metadata": "metadata.json" in files or ".metadata" in files}


def bridge_pick(ckpt: Path, ckpt_format: str) -> dict[str, Any]:
    """The checkpoint Bridge's loader takes from ckpt: `_load_base_checkpoint` as load_checkpoint calls it, rank 0's
    read (torch_dist: the common state of the iter dir it picked, whose `iteration` it reports)."""
    from megatron.bridge.training.checkpointing import _load_base_checkpoint
    from megatron.bridge.training.config import CheckpointConfig
    from megatron.bridge.training.utils.checkpoint_utils import read_train_state

    read_train_state.cache_clear()  # Bridge caches the tracker's read per process; a relaunch reads it afresh
    cfg = CheckpointConfig(save=str(ckpt), load=str(ckpt), ckpt_format=ckpt_format)
    state, name, _, _ = _load_base_checkpoint(str(ckpt), cfg, rank0=True, pg_collection=None)
    return {"bridge_loads": Path(name).name if name else None,
            "bridge_common_iteration": (state or {}).get("iteration")}


def kill_mid_checkpoint(out: Path, mode: str, gpu: int = 0) -> tuple[bool, dict[str, Any], str]:
    """The check for one mode (MODES); (passed, the row's metrics, the command)."""
    parallelism, extra = MODES[mode]
    out = out / f"kill_ckpt_{mode}"
    say = lambda msg: print(f"[kill_ckpt {mode}] {msg}", flush=True)  # noqa: E731
    def run(ckpt: Path) -> Case:
        return case(f"kill_ckpt_{mode}", parallelism, ckpt, iterations=ITERATIONS, save_interval=SAVE_INTERVAL
                    ).plus(*extra)

    metrics: dict[str, Any] = {"mode": mode, "iterations": ITERATIONS, "save_interval": SAVE_INTERVAL}
    b, procs = run(out / "ckpt_b1"), []
    try:
        run_a = launch(run(out / "ckpt_a"), out / "a", gpu)
        procs.append(run_a)
        import megatron.bridge.training.checkpointing  # noqa: F401 - for bridge_pick: now, not between kill and relaunch
        seen, landed = None, False
        for attempt in range(1, ATTEMPTS + 1):
            ckpt, killed_dir = out / f"ckpt_b{attempt}", out / f"b_killed{attempt}"
            b = run(ckpt)
            run_b = launch(b, killed_dir, gpu)
            procs.append(run_b)
            say(f"attempt {attempt}: run B started, watching {ckpt}")
            seen = watch(run_b, ckpt, time.time() + TIMEOUT_S)
            ended = run_b.poll()  # None: still running (watched it to the deadline)
            metrics |= {"attempts": attempt, "processes_killed": run_b.kill(), "rc_killed_run": ended}
            if seen is None:
                say(f"attempt {attempt}: no checkpoint write seen in progress (run B rc {ended})")
                if ended != 0:  # it failed, or did not get through its checkpoints in time: a retry would too
                    metrics["reason"] = (f"run B {'failed' if ended else 'timed out'} (rc {ended}) before a "
                                         f"checkpoint write was seen: {killed_dir / 'train.log'}")
                    return False, metrics, runner.recorded(b)
                continue
            metrics |= seen | partial_state(iter_dirs(ckpt)[seen["target_step"]])
            landed = tracker(ckpt) == seen["tracker_at_kill"] and not metrics["partial_has_train_state"]
            say(f"attempt {attempt}: killed during iter {seen['target_step']} ({metrics['partial_bytes']} bytes "
                f"written, tracker {tracker(ckpt)}): {'mid-write' if landed else 'missed, the save had finished'}")
            if landed:
                break
        metrics["kill_landed_mid_write"] = landed
        if not landed:
            metrics["reason"] = f"no kill landed mid-write in {ATTEMPTS} attempts"
            return False, metrics, runner.recorded(b)
        n = seen["tracker_at_kill"]
        metrics["tracker_after_kill"] = tracker(ckpt)
        metrics |= bridge_pick(ckpt, "fsdp_dtensor" if parallelism == "fsdp" else "torch_dist")
        say(f"Bridge's loader picks {metrics['bridge_loads']}; relaunching")
        resumed_dir = out / "b_resumed"
        run_r = launch(b, resumed_dir, gpu)
        procs.append(run_r)
        metrics["rc_resumed"] = run_r.wait(TIMEOUT_S)
        metrics["rc_uninterrupted"] = run_a.wait(TIMEOUT_S)
        la, lr = losses(out / "a"), losses(resumed_dir)
        whole = iter_dirs(out / "ckpt_a").get(seen["target_step"])  # the same checkpoint, complete, in run A
        metrics["complete_bytes"] = data_bytes(whole) if whole else None  # partial_bytes < it: killed mid-data
        metrics |= {
            "first_step_after_resume": min(lr, default=None),
            "max_abs_loss_diff": max_loss_diff(la, lr),
            "tolerance": TOLERANCE,
            "tracker_at_end": tracker(ckpt),
            "partial_dir_rewritten": (iter_dirs(ckpt)[seen["target_step"]] / DONE).exists(),
            **data_position(samples(out / "a"), samples(killed_dir), samples(resumed_dir), n),
        }
        metrics["losses"] = {"uninterrupted": la, "before_kill": losses(killed_dir), "after_resume": lr}
        ok = (metrics["tracker_after_kill"] == n and metrics["bridge_loads"] == f"iter_{n:07d}"
              and metrics["bridge_common_iteration"] in (n, None) and metrics["rc_resumed"] == 0
              and metrics["rc_uninterrupted"] == 0 and metrics["first_step_after_resume"] == n
              and metrics["max_abs_loss_diff"] <= TOLERANCE
              and metrics["tracker_at_end"] == ITERATIONS and metrics["partial_dir_rewritten"]
              and not metrics["sample_steps_mismatched"] and bool(metrics["same_samples_overall"]))
        if not ok:
            metrics["reason"] = "see the metrics: a resume condition failed (logs under " + str(out) + ")"
        say(f"resumed from step {metrics['first_step_after_resume']}, max loss diff {metrics['max_abs_loss_diff']}"
            f": {'passed' if ok else 'FAILED'}")
        if ok:  # ~1 GiB (estimated) per checkpoint, 4 per run: a passed mode's go, a failed one's stay to be looked at
            for d in out.glob("ckpt_*"):
                shutil.rmtree(d)
        return ok, metrics, runner.recorded(b)
    except Exception as e:  # noqa: BLE001 - any failure is the row's reason, never a crash without a row
        metrics["reason"] = f"{type(e).__name__}: {e}"
        return False, metrics, runner.recorded(b)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()

