"""Preflight rules: a `model.hf_path` checkpoint must be one of the supported families and agree with the model
group (the provider is built from the dir, the rest of the run, memory estimate and data included, from the group)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vlmtrain.check.preflight.registry import Severity, rule
from vlmtrain.config import hf_checkpoint

if TYPE_CHECKING:
    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig


@rule(Severity.error)
def hf_path_matches_model(run: RunConfig, res: Resolved) -> str | None:
    path = run.model.hf_path
    if not path:
        return None
    try:
        cfg = hf_checkpoint.read(path)
    except hf_checkpoint.CheckpointError as e:
        return str(e)
    diff = hf_checkpoint.mismatches(run.model, cfg)
    if not diff:
        return None
    return (f"model.hf_path={path} differs from model={run.model.name}: " + "; ".join(diff) + ". Choose the model "
            "option of that checkpoint's family and set the listed model.* fields to the checkpoint's values.")
