"""Kill -9 a GPU run mid-training, relaunch the same command, and compare its losses with an uninterrupted run.

    python benchmarks/resume_check.py --parallelism fsdp --gpu 0     # Megatron-FSDP, fsdp_dtensor checkpoints
    python benchmarks/resume_check.py --parallelism 3d --gpu 1       # 3D, torch_dist checkpoints

Run A trains 12 steps uninterrupted. Run B is the same command with its own checkpoint_dir: it is killed with
SIGKILL (whole process tree) once it has checkpointed step 4 and logged step 6, then relaunched unchanged; it
must resume from the checkpoint and reproduce A's losses. Appends one row to results/resume.jsonl.
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

TOLERANCE = 0.02  # max |loss difference|: BF16 + non-deterministic MoE/grouped-GEMM reductions


def overrides(parallelism: str, ckpt: Path) -> list[str]:
    return [
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


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["lm_loss"] for r in results.read_jsonl(run_dir / "metrics.jsonl") if "lm_loss" in r}


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
    ap.add_argument("--results", type=Path, default=ROOT / "results" / "resume.jsonl")
    a = ap.parse_args()
    out = a.out / a.parallelism
    run_a = launch(overrides(a.parallelism, out / "ckpt_a"), out / "a", a.gpu)
    b_args = overrides(a.parallelism, out / "ckpt_b")
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
    ok = rc_a == 0 and rc_b == 0 and resumed_from is not None and common and min(lr) > 0 and diff <= TOLERANCE
    cmd = "python train.py " + " ".join(b_args)
    results.append(
        a.results,
        f"resume_{a.parallelism}_tiny_1gpu",
        cmd,
        {
            "killed_after_step": killed_at,
            "checkpoint_step": resumed_from,
            "first_step_after_resume": min(lr, default=None),
            "max_abs_loss_diff": diff,
            "tolerance": TOLERANCE,
            "passed": bool(ok),
        },
        losses_uninterrupted=la,
        losses_before_kill=lk,
        losses_after_resume=lr,
        runner=f"python benchmarks/resume_check.py --parallelism {a.parallelism} --gpu {a.gpu}",
    )
    print(
        json.dumps(
            {
                "parallelism": a.parallelism,
                "ok": bool(ok),
                "diff": diff,
                "resumed_from": resumed_from,
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
