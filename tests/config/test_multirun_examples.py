"""Every sweep in multirun_examples/ expands through the real vlmtrain sweeper (`python train.py -m ...`,
Hydra's own expansion and config loader) and every job either passes preflight or is skipped for a reason this
test names. `hydra.sweeper.preflight_only=true` stops before launching, so no job runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "multirun_examples"

# example -> (number of jobs in the expansion, {skipped job's overrides: preflight rule that rejects it})
EXPECTED: dict[str, tuple[int, dict[str, str]]] = {
    "mbs": (4, {}),  # frozen ViT + projector with full recompute: even MBS 8 fits one H200 node
    "fsdp_vs_3d": (2, {}),
    "recompute_graphs": (
        6,
        {
            "recompute=full cuda_graph=none": "deepstack_full_recompute",
            "recompute=full cuda_graph=moe_router_preprocess": "graphs_with_full_recompute,deepstack_full_recompute",
        },
    ),
    "vision": (3, {}),
    "mock_vs_real": (2, {}),
    "dispatcher": (3, {}),
    "kernels": (2, {}),
}
# (example, extra overrides, expected jobs, expected skips): the hardware-dependent answers.
VARIANTS: list[tuple[str, list[str], int, dict[str, str]]] = [
    (
        "dispatcher",
        ["hardware=gb200", "nodes=2"],
        3,
        {"dispatcher=deepep hardware=gb200 nodes=2": "deepep_not_on_gb200"},
    ),
    ("mbs", ["hardware=gb200", "nodes=2"], 4, {}),
    (
        "kernels",
        ["hardware=gb200", "nodes=2"],
        2,
        {"kernels=fast hardware=gb200 nodes=2": "cutlass_grouped_gemm_needs_sm90"},
    ),
]


def sweep_preflight(name: str, tmp_path: Path, *overrides: str) -> dict:
    """Run the example's sweep up to (not including) the launch; return its preflight.json."""
    cmd = [
        sys.executable,
        "train.py",
        "-m",
        "--config-dir",
        "multirun_examples",
        "--config-name",
        name,
        "hydra.sweeper.preflight_only=true",
        f"hydra.sweep.dir={tmp_path}",
        *overrides,
    ]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"{' '.join(cmd)}\n{out.stdout}\n{out.stderr}"
    assert "sweep preflight:" in out.stdout
    return json.loads((tmp_path / "preflight.json").read_text())


def skip_reasons(report: dict) -> dict[str, str]:
    return {
        s["job"]: ",".join(
            f.split(":", 1)[0].removeprefix("[error] ") for f in s["findings"] if f.startswith("[error]")
        )
        for s in report["skipped"]
    }


def test_every_example_is_listed_with_a_header() -> None:
    names = {p.stem for p in EXAMPLES.glob("*.yaml")}
    assert names == set(EXPECTED)
    for name in names:
        first, second = (EXAMPLES / f"{name}.yaml").read_text().splitlines()[:2]
        assert first.startswith(f"# python train.py -m --config-dir multirun_examples --config-name {name} "), first
        assert second.startswith("# Question: "), second


@pytest.mark.parametrize("launcher", ["basic", "slurm"])
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_expands_and_passes_preflight(name: str, launcher: str, tmp_path: Path) -> None:
    jobs, skips = EXPECTED[name]
    report = sweep_preflight(name, tmp_path, *(["hydra/launcher=slurm"] if launcher == "slurm" else []))
    assert report["preflight_only"] is True and report["launched"] == []  # nothing launched
    assert len(report["passed"]) + len(report["skipped"]) == jobs
    assert skip_reasons(report) == skips
    assert len(report["passed"]) == jobs - len(skips) > 0


@pytest.mark.parametrize(("name", "overrides", "jobs", "skips"), VARIANTS)
def test_example_on_other_hardware(
    name: str, overrides: list[str], jobs: int, skips: dict[str, str], tmp_path: Path
) -> None:
    report = sweep_preflight(name, tmp_path, *overrides)
    assert len(report["passed"]) + len(report["skipped"]) == jobs
    assert skip_reasons(report) == skips
