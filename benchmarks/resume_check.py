"""Kill -9 a GPU run mid-training, relaunch the same command, and compare its losses with an uninterrupted run.

    python benchmarks/resume_check.py --parallelism fsdp --gpu 0     # Megatron-FSDP, fsdp_dtensor checkpoints
    python benchmarks/resume_check.py --parallelism 3d --gpu 1       # 3D, torch_dist checkpoints
    python benchmarks/resume_check.py --parallelism fsdp --packed    # packed (data.packing=1024), its data position

Run A trains 12 steps uninterrupted. Run B is the same command with its own checkpoint_dir: it is killed with
SIGKILL (whole process tree) once it has checkpointed step 4 and logged step 6, then relaunched unchanged; it
must resume from the checkpoint and reproduce A's losses. Appends one row to results/resume.jsonl.

The data position too: every run writes samples.jsonl (the sample indices of each step's micro-batches, per
data-parallel rank). B's steps before its checkpoint (from the killed run) and from the checkpoint on (from the
resumed run) must be exactly A's: the same samples at every step, none twice and none skipped. With --packed
the row goes to results/reliability.jsonl (issue 25's data-position check).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from vlmtrain.observe import results  # noqa: E402
from vlmtrain.observe.bench.resume import TOLERANCE, losses  # noqa: E402

PACKING = 1024
"""--packed: rows of <= 1024 tokens; the default data's 16 samples (the longest 999 tokens) fill 8 bins of 1 to 3
samples, so the 12 steps of 8 rows (train.global_batch_size counts rows) take 96 items of 8 bins (item i is bin
i % 8): every bin many times, in the sampler's order, which the data-position check compares."""


def overrides(parallelism: str, ckpt: Path, packed: bool = False) -> list[str]:
    return [
        *([f"data.packing={PACKING}", "train.micro_batch_size=1"] if packed else []),
        "model=tiny",
        f"parallelism={parallelism}",
        "train.iterations=12",
        "train.save_interval=4",
        "train.global_batch_size=8",
        "gpus_per_node=1",
        "dry_run=false",
        "wandb.enabled=false",
        f"train.checkpoint_dir={ckpt}",
    ]


def launch(args: list[str], run_dir: Path, gpu: int) -> subprocess.Popen:
    run_dir.mkdir(parents=True, exist_ok=True)
    # A port of its own per run directory: several checks may share a node (two did collide on one port).
    port = 20000 + zlib.crc32(str(run_dir).encode()) % 20000
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(gpu), MASTER_PORT=str(port))
    log = (run_dir / "train.log").open("w")
    return subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), *args, f"hydra.run.dir={run_dir}"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )


def samples(run_dir: Path) -> dict[tuple[int, int], list[list[int]]]:
    """{(step, dp rank): that step's micro-batches' sample indices} from samples.jsonl."""
    return {(r["step"], r["dp_rank"]): r["micro_batches"] for r in results.read_jsonl(run_dir / "samples.jsonl")}


def data_position(a: dict, killed: dict, resumed: dict, checkpoint_step: int | None) -> dict[str, object]:
    """B's samples (killed run before the checkpoint, resumed run from it) against A's, step by step."""
    cut = checkpoint_step if checkpoint_step is not None else -1
    b = {k: v for k, v in killed.items() if k[0] < cut} | {k: v for k, v in resumed.items() if k[0] >= cut}
    mismatched = sorted(k[0] for k in set(a) | set(b) if a.get(k) != b.get(k))
    ids = lambda rows: sorted(i for k in sorted(rows) for mb in rows[k] for i in mb)  # noqa: E731
    return {"sample_steps_compared": len(a), "sample_steps_mismatched": mismatched,
            "same_samples_overall": ids(a) == ids(b) and bool(a)}


def kill_tree(proc: subprocess.Popen, run_dir: Path) -> None:
    """SIGKILL the launcher, torchrun and every rank: what a node failure or `kill -9` does."""
    with contextlib.suppress(ProcessLookupError):  # it may have died on its own: the check then fails below
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    subprocess.run(["pkill", "-9", "-f", str(run_dir)], check=False)  # ranks started in their own sessions


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parallelism", choices=["fsdp", "3d"], required=True)
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "outputs" / "resume")
    ap.add_argument("--packed", action="store_true",
                    help=f"data.packing={PACKING} (MBS 1, GBS 8 rows); the row goes to reliability.jsonl")
    ap.add_argument("--results", type=Path, default=None, help="default: results/resume.jsonl "
                    "(results/reliability.jsonl with --packed)")
    a = ap.parse_args()
    a.results = a.results or ROOT / "results" / ("reliability.jsonl" if a.packed else "resume.jsonl")
    tag = f"{a.parallelism}_packed" if a.packed else a.parallelism
    out = a.out / tag
    run_a = launch(overrides(a.parallelism, out / "ckpt_a", a.packed), out / "a", a.gpu)
    b_args = overrides(a.parallelism, out / "ckpt_b", a.packed)
    run_b = launch(b_args, out / "b_killed", a.gpu)
    marker = out / "ckpt_b" / "latest_checkpointed_iteration.txt"
    deadline = time.time() + 400
    while time.time() < deadline and run_b.poll() is None:
        if marker.exists() and max(losses(out / "b_killed"), default=-1) >= 5:
            break
        time.sleep(0.5)
    killed_at = max(losses(out / "b_killed"), default=-1)
    kill_tree(run_b, out / "b_killed")
    resumed_from = int(marker.read_text().strip()) if marker.exists() else None
    rc_b = launch(b_args, out / "b_resumed", a.gpu).wait()
    rc_a = run_a.wait()
    la, lk, lr = losses(out / "a"), losses(out / "b_killed"), losses(out / "b_resumed")
    common = sorted(set(la) & set(lr))
    diff = max((abs(la[s] - lr[s]) for s in common), default=float("inf"))
    position = data_position(samples(out / "a"), samples(out / "b_killed"), samples(out / "b_resumed"), resumed_from)
    ok = rc_a == 0 and rc_b == 0 and resumed_from is not None and common and min(lr) > 0 and diff <= TOLERANCE \
        and not position["sample_steps_mismatched"] and position["same_samples_overall"]
    cmd = "python train.py " + " ".join(b_args)
    results.append(
        a.results,
        f"resume_{tag}_tiny_1gpu",
        cmd,
        {
            "killed_after_step": killed_at,
            "checkpoint_step": resumed_from,
            "first_step_after_resume": min(lr, default=None),
            "max_abs_loss_diff": diff,
            "tolerance": TOLERANCE,
            **position,
            "passed": bool(ok),
        },
        losses_uninterrupted=la,
        losses_before_kill=lk,
        losses_after_resume=lr,
        runner=f"python benchmarks/resume_check.py --parallelism {a.parallelism} --gpu {a.gpu}"
        + (" --packed" if a.packed else ""),
    )
    print(
        json.dumps(
            {
                "parallelism": a.parallelism,
                "ok": bool(ok),
                "diff": diff,
                "resumed_from": resumed_from,
                **position,
                "killed_at": killed_at,
                "a": la,
                "resumed": lr,
            }
        ),
        flush=True,
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
