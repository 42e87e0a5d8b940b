"""Kill -9 a GPU run mid-training, relaunch the same command, and compare its losses with an uninterrupted run; and
what the other checks that kill or preempt a real run share (vlmtrain.lab.checks.kill_checkpoint,
vlmtrain.lab.checks.slurm_preempt, vlmtrain.lab.checks.verification): the run's case, its launch in a run dir of its
own, the losses and the data position a killed, preempted or resumed run is compared by.

    vlmtrain lab resume --parallelism fsdp --gpu 0     # Megatron-FSDP, fsdp_dtensor checkpoints
    vlmtrain lab resume --parallelism 3d --gpu 1       # 3D, torch_dist checkpoints
    vlmtrain lab resume --parallelism fsdp --packed    # packed (data.packing=1024)

Run A trains 12 steps uninterrupted. Run B is the same command with its own checkpoint_dir: its whole process tree
is SIGKILLed (vlmtrain.lab.kit.runner.kill_tree) once it has checkpointed step 4 and logged step 6, then relaunched
unchanged; it must resume from the checkpoint and reproduce A's losses. Appends one row to results/resume.jsonl.

The data position too: every run writes samples.jsonl (the sample indices of each step's micro-batches, per
data-parallel rank). B's steps before its checkpoint (from the killed run) and from the checkpoint on (from the
resumed run) must be exactly A's: the same samples at every step, none twice and none skipped. With --packed
the row goes to results/reliability.jsonl (the reliability checks' data position).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from vlmtrain.lab.kit import experiments, runner, store
from vlmtrain.lab.kit.baselines import TINY
from vlmtrain.lab.kit.case import Case
from vlmtrain.observe import run_summary

TOLERANCE = 0.02  # max |loss difference|: BF16 + non-deterministic MoE/grouped-GEMM reductions
PACKING = 1024
"""--packed: rows of <= 1024 tokens; the default data's 16 samples (the longest 999 tokens) fill 8 bins of 1 to 3
samples, so the 12 steps of 8 rows (train.global_batch_size counts rows) take 96 items of 8 bins (item i is bin
i % 8): every bin many times, in the sampler's order, which the data-position check compares."""


def case(name: str, parallelism: str, ckpt: Path, packed: bool = False, iterations: int = 12,
         save_interval: int = 4, model: list[str] = TINY) -> Case:
    """A checkpointing one-GPU training run (the tiny model unless `model` says), its checkpoints in `ckpt`."""
    return Case(name, 1, [
        *([f"data.packing={PACKING}", "train.micro_batch_size=1"] if packed else []),
        *model,
        f"parallelism={parallelism}",
        f"train.iterations={iterations}",
        f"train.save_interval={save_interval}",
        "train.global_batch_size=8",
        f"train.checkpoint_dir={ckpt}",
    ], dry_run=False)


def launch(run: Case, run_dir: Path, gpu: int) -> runner.Run:
    """The run on GPU `gpu` in run_dir (vlmtrain.lab.kit.runner: a port of its own, its own process group)."""
    return runner.start(run, run_dir, gpus=[gpu])


def kill_after(run: runner.Run, ckpt: Path, run_dir: Path, logged: int, timeout_s: float = 400) -> int:
    """SIGKILL the run's whole tree once it has a checkpoint in `ckpt` and has logged step `logged` (or ended, or
    timeout_s passed); the last step it logged."""
    deadline = time.time() + timeout_s
    while time.time() < deadline and run.poll() is None:
        if tracker(ckpt) is not None and max(losses(run_dir), default=-1) >= logged:
            break
        time.sleep(0.5)
    killed_at = max(losses(run_dir), default=-1)
    run.kill()
    return killed_at


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


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--parallelism", choices=["fsdp", "3d"], required=True)
    ap.add_argument("--gpu", type=int, default=0)
    experiments.add_out(ap, "resume")
    ap.add_argument("--packed", action="store_true",
                    help=f"data.packing={PACKING} (MBS 1, GBS 8 rows); the row goes to reliability.jsonl")
    experiments.add_results(ap, None, "results/resume.jsonl, results/reliability.jsonl with --packed")


def run(a: argparse.Namespace) -> int:
    a.results = a.results or runner.ROOT / "results" / ("reliability.jsonl" if a.packed else "resume.jsonl")
    tag = f"{a.parallelism}_packed" if a.packed else a.parallelism
    out, name = a.out / tag, f"resume_{tag}_tiny_1gpu"
    run_a = launch(case(name, a.parallelism, out / "ckpt_a", a.packed), out / "a", a.gpu)
    b = case(name, a.parallelism, out / "ckpt_b", a.packed)
    killed_at = kill_after(launch(b, out / "b_killed", a.gpu), out / "ckpt_b", out / "b_killed", 5)
    resumed_from = tracker(out / "ckpt_b")
    rc_b = launch(b, out / "b_resumed", a.gpu).wait()
    rc_a = run_a.wait()
    la, lk, lr = losses(out / "a"), losses(out / "b_killed"), losses(out / "b_resumed")
    diff = max_loss_diff(la, lr)
    position = data_position(samples(out / "a"), samples(out / "b_killed"), samples(out / "b_resumed"), resumed_from)
    ok = rc_a == 0 and rc_b == 0 and resumed_from is not None and diff <= TOLERANCE and min(lr) > 0 \
        and not position["sample_steps_mismatched"] and position["same_samples_overall"]
    store.append(
        a.results,
        name,
        runner.recorded(b),
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
        runner=f"{experiments.command(__name__)} --parallelism {a.parallelism} --gpu {a.gpu}"
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
