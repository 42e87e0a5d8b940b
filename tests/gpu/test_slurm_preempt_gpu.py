"""Issue 25 item 1 on a GPU node with the local Slurm up (scripts/device/slurm_start.sh): a real training job
through hydra/launcher=slurm is preempted (USR2), saved by Bridge on the signal, requeued by submitit and resumed in
the same run dir, with its losses within resume.TOLERANCE of an uninterrupted run (vlmtrain.lab.checks.
slurm_preempt). `pytest -m "gpu and slurm" tests/gpu/test_slurm_preempt_gpu.py` runs the tiny model (~2 min);
VLMTRAIN_SLURM_CASE=30b the 30B-A3B shape (~8 min, ~52 GiB free disk under /tmp). The row in
results/reliability.jsonl: `vlmtrain lab slurm-preempt`."""

from __future__ import annotations

import os

import pytest

from vlmtrain.config.world import local_gpus
from vlmtrain.lab.checks import slurm_preempt as sp

pytestmark = [pytest.mark.gpu, pytest.mark.slurm]


def test_preempted_job_resumes_with_the_same_losses(tmp_path):
    if local_gpus() < 1:
        pytest.skip("needs a GPU")
    if problem := sp.slurm_problem():
        pytest.skip(problem)
    p = sp.CASES[os.environ.get("VLMTRAIN_SLURM_CASE", "tiny")]
    ckpt = tmp_path / "ckpt"
    sp.check_disk(p.case, ckpt)
    rc, ref = sp.run_reference(p.case, tmp_path, timeout_s=540)
    assert rc == 0, (ref / "console.txt").read_text()[-4000:]
    result = sp.run_preempted(p, tmp_path, ckpt, timeout_s=540)
    ok, metrics = sp.evaluate(p, ref, result, ckpt)
    assert ok, f"{metrics}\n{sp.diagnostics(result['sweep'], result['job_id'])}"
