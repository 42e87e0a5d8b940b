"""`vlmtrain lab calibrate-speed`: the measured rows grouped and composed as they ran, the error table printed from
them, and the published comparison; replayed on recorded GPU rows (tests/fixtures/gpu_cases/*/case.json), never on
results/."""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import pytest

from vlmtrain.check import speed
from vlmtrain.lab.calibrate import speed_check, speed_published
from vlmtrain.lab.kit import experiments

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpu_cases"
CASES = ("tiny_3d_ep1_trainable_recompute-none_graph-none_1gpu",
         "tiny_fsdp_ep1_trainable_recompute-none_graph-none_1gpu")


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two recorded runs, one of them twice (a repeat on another machine run, step time 10 % longer)."""
    rows = [json.loads((FIXTURES / c / "case.json").read_text()) for c in CASES]
    again = {**rows[0], "metrics": {**rows[0]["metrics"], "step_s": rows[0]["metrics"]["step_s"] * 1.1}}
    path = tmp_path_factory.mktemp("measured") / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (*rows, again)))
    return path


def args(measured: Path, out: Path, cache: Path, **flags: bool) -> argparse.Namespace:
    return argparse.Namespace(**{"measured": [measured], "out": out, "cache_dir": cache, "fit": False, "table": False,
                                 "published": False, **flags})


def test_the_table_is_the_models_error_on_each_group(measured: Path, tmp_path: Path, cache: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert experiments.command(speed_check.__name__) == "vlmtrain lab calibrate-speed"
    out = tmp_path / "speed_estimates.jsonl"
    assert speed_check.run(args(measured, out, cache)) == 0
    printed = capsys.readouterr().out
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["metrics"]["runs"] for r in rows] == [2, 1]  # the repeat joins its command's group
    first = [json.loads((FIXTURES / CASES[0] / "case.json").read_text())["metrics"]["step_s"]] * 2
    assert rows[0]["metrics"]["measured_step_s"] == pytest.approx(statistics.median([first[0], first[1] * 1.1]),
                                                                   abs=1e-4)
    groups = speed_check.groups([measured])
    cases = speed_check.cases(groups, cache.absolute())
    for row, case in zip(rows, cases, strict=True):
        t = speed.predict(case.run, case.res, case.workload, speed.load())
        m = row["metrics"]
        assert m["predicted_step_s"] == pytest.approx(t.step_s, abs=1e-4)
        assert m["error_pct"] == pytest.approx(100 * (t.step_s - m["measured_step_s"]) / m["measured_step_s"], abs=0.1)
        assert row["split"] == ("held_out" if case.group.held_out else "fit")
        assert row["workload"] == "the measured row's tokens and FLOPs"  # the recorded rows carry flops_*
        assert f"| {row['name']} | {row['split']} | {m['runs']} |" in printed
    assert "median |error|" in printed
    assert speed_check.run(args(measured, out, cache, table=True)) == 0
    assert capsys.readouterr().out == speed_check.markdown_table(rows)


def test_commands_are_spelled_as_they_ran() -> None:
    """Steps only: dry_run, W&B and the iteration count go; a multi-value sweep is not one run; the first sweeps'
    in-batch packing is the packed row of MBS samples it was."""
    assert speed_check.overrides("NCCL_X=0 python train.py model=tiny train.iterations=8 dry_run=false "
                                 "wandb.enabled=false gpus_per_node=1") == ["model=tiny", "gpus_per_node=1"]
    assert speed_check.overrides("python train.py -m train.micro_batch_size=1,2") is None
    assert speed_check.overrides("python train.py train.micro_batch_size=8 data.packing=true") == [
        "train.micro_batch_size=8", "data.packing=32768"]
    assert not speed_check.usable({"name": "x", "command": "python train.py precision=fp8", "metrics": {"step_s": 1}})
    assert not speed_check.usable({"name": "x_summary", "command": "python train.py", "metrics": {"step_s": 1}})


def test_a_command_without_a_world_ran_on_its_machines_gpus(tmp_path: Path, cache: Path) -> None:
    """A one-GPU row whose command names no world is composed on one GPU, not on the hardware's node of 8 (which
    splits its global batch 8 ways and predicts an eighth of its micro-batches); a command's own world is kept."""
    assert speed_check.machine_world(["hardware=h100"], "1x NVIDIA H100 80GB HBM3") == ["gpus_per_node=1"]
    assert speed_check.machine_world(["gpus_per_node=2"], "2x NVIDIA H200") == []
    assert speed_check.machine_world(["nodes=2"], "1x NVIDIA H200") == []
    row = json.loads((FIXTURES / CASES[0] / "case.json").read_text())
    bare = [a for a in row["command"].split() if not a.startswith("gpus_per_node=")]
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({**row, "command": " ".join(bare), "machine": "1x NVIDIA H200"}) + "\n")
    (case,) = speed_check.cases(speed_check.groups([path]), cache.absolute())
    assert case.res.layout.world_size == 1


def test_published_figures_name_their_source_and_what_differs() -> None:
    """Each published figure is compared on its step time; the missing BF16 235B figure is said, not invented."""
    for f in speed_published.FIGURES:
        assert f.source.startswith(speed_published.BRIDGE) and f.differs
    assert "Not compared" in speed_published.NOT_FOUND
    first = speed_published.FIGURES[0]
    c = speed_published.compare(first, speed.load())
    assert c.tflops_per_gpu == pytest.approx(first.tflops_per_gpu * first.step_s / c.predicted.step_s)
    assert c.predicted.world_size == first.case.gpus
