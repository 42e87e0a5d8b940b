"""What the resume checks share (benchmarks/resume_check.py: kill -9 and relaunch; slurm_preempt: Slurm's signal,
Bridge's save, submitit's requeue): a run's losses per step and how close a resumed run must stay to an
uninterrupted one."""

from __future__ import annotations

from pathlib import Path

from vlmtrain.observe import results

TOLERANCE = 0.02
"""Max |loss difference| per step: BF16 + non-deterministic MoE/grouped-GEMM reductions."""


def losses(run_dir: Path) -> dict[int, float]:
    """{step: lm_loss} from the run's metrics.jsonl (0-based steps, as Bridge's train_state.step before the step)."""
    return {r["step"]: r["lm_loss"] for r in results.read_jsonl(Path(run_dir) / "metrics.jsonl") if "lm_loss" in r}
