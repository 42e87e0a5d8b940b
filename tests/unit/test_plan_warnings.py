"""The dry-run plan keeps import-time noise out, never a warning Megatron or Bridge raises while validating the
run's container: the default run on an H200 (kernels=auto settles TE's cross entropy on SM90) shows Megatron Core's
"known stability issues" warning with vlmtrain's reason, next to preflight's info finding with the measurements."""

from __future__ import annotations

from pathlib import Path


def test_the_plan_shows_megatrons_warnings_with_the_reason(dry_run, tmp_path: Path) -> None:
    status, printed = dry_run("hardware=h200", run_dir=tmp_path)
    assert status == 0, printed[-3000:]
    plan = " ".join(printed.split())  # the plan wraps long lines
    assert "[info] te_cross_entropy_fusion: kernels.cross_entropy=te: Megatron Core's warning" in plan
    assert "TE 2.20.2 computes it in FP32" in plan and "results/perf_h200x2.jsonl" in plan
    section = plan.split("library warnings while Bridge finalized the container:")[1].split("Bridge validation:")[0]
    assert ("megatron/core/transformer/transformer_config.py" in section
            and "Transformer Engine cross entropy loss fusion has known stability issues." in section)
    assert "(vlmtrain: kernels.cross_entropy=te: preflight's te_cross_entropy_fusion finding says" in section
    assert "overlap_param_gather settings were not in sync" in section  # Bridge's, explained too
    assert section.count("(vlmtrain: ") == 2
