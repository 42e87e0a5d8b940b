"""The recorded GPU run dirs of tests/fixtures/gpu_cases as `vlmtrain report` finds them in a sweep: each case's
overrides from its own results row (case.json), and job dirs laid out as Hydra's multirun writes them. Shared by
test_report.py (a whole sweep) and test_report_runs.py (single jobs and run dirs)."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.text import Annotation
from omegaconf import OmegaConf

from vlmtrain.config.compose import compose

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "fixtures" / "gpu_cases"
CRASH = "tiny_3d_ep1_trainable_recompute-none_graph-moe_router_preprocess_1gpu"
INVALID = ["parallelism=fsdp", "parallelism.pp=2"]
"""A config preflight refuses (fsdp_needs_pp1)."""
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def command_overrides(command: str) -> list[str]:
    """The Hydra overrides of a results row's `python train.py ...` command (dry_run is excluded from job dirs)."""
    args = shlex.split(command)
    return [a for a in args[args.index("train.py") + 1:] if not a.startswith("dry_run=")]


def results_rows() -> dict[str, dict]:
    """Each fixture run's own results row (its case.json); the graph case's fixture is its first (crashed) attempt,
    which has no row (results/gpu_training.jsonl holds its later successful re-run)."""
    return {d.name: json.loads((d / "case.json").read_text()) for d in sorted(CASES.iterdir())
            if (d / "case.json").exists()}


def case_overrides() -> dict[str, list[str]]:
    """Every fixture case's overrides; the crash has no results row (only successful runs are appended), so it is
    the tiny 3d 1-GPU command plus its graph scope, as in vlmtrain.lab.cases, at the 8 iterations its log
    shows (`iteration 7/ 8`; the case runs 12 since)."""
    out = {name: command_overrides(row["command"]) for name, row in results_rows().items()}
    tiny_3d = out["tiny_3d_ep1_trainable_recompute-none_graph-none_1gpu"]
    out[CRASH] = [*(o for o in tiny_3d if not o.startswith("train.iterations=")), "train.iterations=8",
                  "cuda_graph=moe_router_preprocess"]
    return out


def add_job(sweep: Path, num: int, overrides: list[str], source: Path | None = None) -> Path:
    """A job dir as Hydra names it (<num>_<override_dirname>) with .hydra/overrides.yaml and the composed config."""
    job = sweep / f"{num}_{','.join(sorted(overrides))}"
    if source:
        shutil.copytree(source, job)
    (job / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(overrides), job / ".hydra" / "overrides.yaml")
    OmegaConf.save(OmegaConf.structured(compose(overrides, output_dir=str(job))), job / "run_config.yaml")
    return job


def annotations(ax: Axes) -> list[str]:
    """The point labels drawn on a plot (annotations, not the axes' other texts)."""
    return [t.get_text().strip() for t in ax.texts if isinstance(t, Annotation)]
