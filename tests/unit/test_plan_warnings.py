"""The dry-run plan keeps import-time noise out, never a warning Megatron or Bridge raises while validating the
run's container: the default run on an H200 (kernels=auto settles TE's cross entropy on SM90) shows Megatron Core's
"known stability issues" warning with vlmtrain's reason, next to preflight's info finding with the measurements."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_plan_shows_megatrons_warnings_with_the_reason(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "train.py", "dry_run=true", "hardware=h200", f"hydra.run.dir={tmp_path}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    plan = " ".join(out.stdout.split())  # the plan wraps long lines
    assert "[info] te_cross_entropy_fusion: kernels.cross_entropy=te: Megatron Core's warning" in plan
    assert "TE 2.20.2 computes it in FP32" in plan and "results/perf_h200x2.jsonl" in plan
    section = plan.split("library warnings while Bridge finalized the container:")[1].split("Bridge validation:")[0]
    assert ("megatron/core/transformer/transformer_config.py" in section
            and "Transformer Engine cross entropy loss fusion has known stability issues." in section)
    assert "(vlmtrain: kernels.cross_entropy=te: preflight's te_cross_entropy_fusion finding says" in section
    assert "overlap_param_gather settings were not in sync" in section  # Bridge's, explained too
    assert section.count("(vlmtrain: ") == 2
