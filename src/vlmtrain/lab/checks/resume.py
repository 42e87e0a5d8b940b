"""Kill a real `python train.py` run and relaunch it (vlmtrain.lab.checks.resume_check, the kill-mid-checkpoint check of
vlmtrain.lab.checks.kill_checkpoint): the run's overrides, its launch in a run dir of its own, SIGKILL of its
whole process tree, and what a killed, preempted (vlmtrain.lab.checks.slurm_preempt) or resumed run is compared
by (losses, the data position)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import zlib
from pathlib import Path

import psutil

from vlmtrain.lab.runner import ROOT
from vlmtrain.observe import run_summary

TOLERANCE = 0.02  # max |loss difference|: BF16 + non-deterministic MoE/grouped-GEMM reductions
PACKING = 1024
"""--packed: rows of <= 1024 tokens; the default data's 16 samples (the longest 999 tokens) fill 8 bins of 1 to 3
samples, so the 12 steps of 8 rows (train.global_batch_size counts rows) take 96 items of 8 bins (item i is bin
i % 8): every bin many times, in the sampler's order, which the data-position check compares."""


def overrides(parallelism: str, ckpt: Path, packed: bool = False, iterations: int = 12,
              save_interval: int = 4) -> list[str]:
    return [
        *([f"data.packing={PACKING}", "train.micro_batch_size=1"] if packed else []),
        "model=tiny",
        f"parallelism={parallelism}",
        f"train.iterations={iterations}",
        f"train.save_interval={save_interval}",
        "train.global_batch_size=8",
        "gpus_per_node=1",
        "dry_run=false",
        "wandb.enabled=false",
        f"train.checkpoint_dir={ckpt}",
    ]


def command(args: list[str]) -> str:
    """The run's command as a results row records it."""
    return "python train.py " + " ".join(args)


def launch(args: list[str], run_dir: Path, gpu: int) -> subprocess.Popen:
    run_dir.mkdir(parents=True, exist_ok=True)
    # A port of its own per run directory: several checks may share a node (two did collide on one port).
    port = 20000 + zlib.crc32(str(run_dir).encode()) % 20000
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(gpu), MASTER_PORT=str(port), PYTHONUNBUFFERED="1")
    log = (run_dir / "train.log").open("w")
    return subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), *args, f"hydra.run.dir={run_dir}"],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )


def losses(run_dir: Path) -> dict[int, float]:
    """{step: lm_loss} from the run's metrics.jsonl (0-based steps, as Bridge's train_state.step before the step)."""
    return {r["step"]: r["lm_loss"] for r in run_summary.read_jsonl(Path(run_dir) / "metrics.jsonl") if "lm_loss" in r}


def max_loss_diff(ref: dict[int, float], got: dict[int, float], steps: list[int] | None = None) -> float:
    """max |ref - got| over `steps` (default: every step of `got`) that both runs logged; inf when they share none,
    so a run that logged nothing comparable never passes a tolerance."""
    shared = [s for s in (got if steps is None else steps) if s in ref and s in got]
    return max((abs(ref[s] - got[s]) for s in shared), default=float("inf"))


def tracker(ckpt: Path) -> int | None:
    """The iteration Bridge's tracker file in `ckpt` names (None before the first checkpoint, or while Bridge
    rewrites it)."""
    from megatron.bridge.training.utils.checkpoint_utils import get_checkpoint_tracker_filename

    try:
        return int(Path(get_checkpoint_tracker_filename(str(ckpt))).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def samples(run_dir: Path) -> dict[tuple[int, int], list[list[int]]]:
    """{(step, dp rank): that step's micro-batches' sample indices} from samples.jsonl."""
    return {(r["step"], r["dp_rank"]): r["micro_batches"] for r in run_summary.read_jsonl(run_dir / "samples.jsonl")}


def data_position(a: dict, killed: dict, resumed: dict, checkpoint_step: int | None) -> dict[str, object]:
    """B's samples (killed run before the checkpoint, resumed run from it) against A's, step by step."""
    cut = checkpoint_step if checkpoint_step is not None else -1
    b = {k: v for k, v in killed.items() if k[0] < cut} | {k: v for k, v in resumed.items() if k[0] >= cut}
    mismatched = sorted(k[0] for k in set(a) | set(b) if a.get(k) != b.get(k))
    ids = lambda rows: sorted(i for k in sorted(rows) for mb in rows[k] for i in mb)  # noqa: E731
    return {"sample_steps_compared": len(a), "sample_steps_mismatched": mismatched,
            "same_samples_overall": ids(a) == ids(b) and bool(a)}


def kill_tree(proc: subprocess.Popen) -> int:
    """SIGKILL the launcher, torchrun, every rank and their helpers (an async checkpoint writer included): what a
    node failure or `kill -9` does. The tree is frozen first (SIGSTOP, until a fresh look finds no new process:
    a stopped process cannot fork, and a killed parent's children would move to init), then killed at once.
    Returns how many processes were killed."""
    tree: dict[int, psutil.Process] = {}
    with contextlib.suppress(psutil.NoSuchProcess):  # it may have died on its own: the check then fails later
        root = psutil.Process(proc.pid)
        while new := {p.pid: p for p in [root, *root.children(recursive=True)] if p.pid not in tree}:
            for p in new.values():
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.send_signal(signal.SIGSTOP)
            tree |= new
    for p in tree.values():
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(signal.SIGKILL)
    psutil.wait_procs([p for p in tree.values() if p.pid != proc.pid], timeout=30)
    proc.wait()  # Popen reaps its own child: psutil reaping it would leave returncode 0 instead of -9
    return len(tree)
