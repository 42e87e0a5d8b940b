"""vlmtrain's overhead over Bridge's pretrain() alone on CPU (vlmtrain.lab.overhead, vlmtrain.lab.overhead_ab): Bridge's
own step times read from real Bridge logs match vlmtrain's metrics, the ratios and intervals over pairs, the profiled
iterations left out, pooled rows, side (b)'s own run dir and its torchrun command."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest

from vlmtrain.lab import overhead, overhead_ab
from vlmtrain.lab.kit import spec, store
from vlmtrain.observe import run_summary

ROOT = Path(__file__).resolve().parents[2]
GPU_CASES = ROOT / "tests" / "fixtures" / "gpu_cases"
FIXTURES = sorted(d for d in GPU_CASES.iterdir() if (d / "train.log").exists())
FSDP_EP2 = GPU_CASES / "30b-shape-l4_fsdp_ep2_trainable_recompute-none_graph-none_2gpu"
THREE_D_EP2 = GPU_CASES / "30b-shape-l4_3d_ep2_trainable_recompute-none_graph-none_2gpu"
PERF = spec.load("perf_h200x2")
B, BEST = PERF.case({}), PERF.case(PERF.get("best"))


@pytest.mark.parametrize("run_dir", FIXTURES, ids=[d.name for d in FIXTURES])
def test_bridge_step_times_match_vlmtrain_metrics(run_dir: Path) -> None:
    """Bridge's "elapsed time per iteration" of iteration s+1 is vlmtrain's step s (same step, two clocks; Bridge's
    first interval also holds the set-up before the first step)."""
    ms = overhead.bridge_step_ms((run_dir / "train.log").read_text())
    rows = {r["step"] + 1: r["step_s"] * 1000 for r in map(json.loads, (run_dir / "metrics.jsonl").open())}
    assert len(ms) >= 4 and set(ms) <= set(rows)
    # A profiled run (train.profile_step=N): Bridge's intervals before and after N also hold the profiler's start
    # and the writing of the trace, which vlmtrain's step window leaves out.
    step = re.search(r"profile-step(\d+)", run_dir.name)
    profiled = overhead.profiled_iterations([f"train.profile_step={step[1]}"] if step else [])
    for it, t in ms.items():
        if step and it in profiled - {int(step[1])}:
            assert t > rows[it] * 1.05, it
        else:
            # 5 %: the 1-GPU fixtures of 2026-12-01 shared the GPU with another job (up to 3.3 %; fixtures README)
            assert t == pytest.approx(rows[it], rel=0.05) or (it == 1 and t > rows[it]), it
    assert overhead.steady(ms) == [ms[i] for i in sorted(ms) if i > overhead.SKIP]
    left = overhead.steady(ms, left_out=profiled)
    assert left == [ms[i] for i in sorted(ms) if i > overhead.SKIP and i not in profiled]
    assert not step or max(left) < 1.5 * min(left)  # without the trace writing, steps are alike again


def test_overhead_ratio_from_real_logs() -> None:
    pair = overhead.pair_record(FSDP_EP2, THREE_D_EP2, 120.3, 78.5)
    assert len(pair["direct_log_ms"]) == 5 and len(pair["vlmtrain_metrics_ms"]) == 5
    m = overhead.overhead_metrics([pair, pair])
    assert m["overhead_ratio"] == pytest.approx(
        statistics.median(pair["vlmtrain_log_ms"]) / statistics.median(pair["direct_log_ms"]))
    assert m["overhead_ratio"] > 1.2  # FSDP's 4-layer step is slower than 3D's in these runs
    a, b = pair["vlmtrain_log_ms"], pair["direct_log_ms"]
    assert m["overhead_ratio_total"] == pytest.approx(sum(a) / sum(b))
    lo, hi = m["overhead_ratio_total_ci95"]
    assert min(x / y for x, y in zip(a, b, strict=True)) <= lo <= m["overhead_ratio_total"] <= hi
    assert m["overhead_ratio_total_ci95"] == overhead.overhead_metrics([pair, pair])["overhead_ratio_total_ci95"]
    assert m["overhead_ratio_metrics"] == pytest.approx(m["overhead_ratio"], rel=0.02)
    assert m["pair_ratios"] == [m["overhead_ratio"]] * 2 and m["pairs"] == 2
    # per-iteration pairing: (a) and (b) of one iteration trained the same samples
    a_ms, b_ms = (overhead.bridge_step_ms((d / "train.log").read_text()) for d in (FSDP_EP2, THREE_D_EP2))
    its = [it for it in sorted(a_ms.keys() & b_ms.keys()) if it > overhead.SKIP]
    assert len(its) == 5 and m["overhead_ratio_paired"] == pytest.approx(
        statistics.median([a_ms[it] / b_ms[it] for it in its]))
    assert m["vlmtrain_host_ms"] is None  # these run files predate the vlmtrain_host_s metric
    same = overhead.overhead_metrics([overhead.pair_record(FSDP_EP2, FSDP_EP2, 1.0, 1.0)])
    assert same["overhead_ratio"] == 1.0 and same["overhead_ratio_paired"] == 1.0


def test_pair_interval_and_order() -> None:
    """The interval over pairs is Student's t on log ratios (the table checked against scipy), symmetric for a
    ratio and its inverse, and wider than the spread of steps when pairs disagree."""
    from scipy import stats

    for df, t in overhead.T975.items():
        assert t == pytest.approx(stats.t.ppf(0.975, df), abs=1e-3), df
    lo, hi = overhead.pairs_ci95([0.96, 1.04])
    assert lo < statistics.geometric_mean([0.96, 1.04]) < hi and lo < 0.75 and hi > 1.3  # two pairs: t = 12.7
    assert overhead.pairs_ci95([1 / 0.96, 1 / 1.04]) == pytest.approx([1 / hi, 1 / lo])
    assert overhead.pairs_ci95([1.0]) is None
    ab = overhead.pair_record(FSDP_EP2, THREE_D_EP2, 1.0, 1.0)
    ba = overhead.pair_record(FSDP_EP2, THREE_D_EP2, 1.0, 1.0, order="direct,vlmtrain")
    m = overhead.overhead_metrics([ab, ba])
    assert m["pair_orders"] == ["vlmtrain,direct", "direct,vlmtrain"]
    assert m["pair_total_ratios"] == [m["overhead_ratio_total"]] * 2 == [m["overhead_ratio_pairs"]] * 2
    assert m["overhead_ratio_pairs_ci95"] == pytest.approx([m["overhead_ratio_pairs"]] * 2)  # identical pairs


def test_profiled_pair_leaves_the_profiler_iterations_out() -> None:
    """With train.profile_step=4 (a real profiled H200 run on both sides here), iterations 3-5 hold profiler work
    (12.5 s of trace writing in 5's interval) and leave the ratios; the steps after them remain."""
    run = GPU_CASES / "tiny_3d_ep1_trainable_recompute-none_graph-none_profile-step4_1gpu"
    left_out = overhead.profiled_iterations(["model=tiny", "train.profile_step=4"])
    pair = overhead.pair_record(run, run, 1.0, 1.0, left_out=left_out)
    assert pair["left_out_iterations"] == [3, 4, 5] and overhead.profiled_iterations(["model=tiny"]) == frozenset()
    assert len(pair["vlmtrain_log_ms"]) == len(pair["vlmtrain_metrics_ms"]) == len(pair["step_ratios"]) == 3
    assert max(pair["direct_log_ms"]) < 1000 and pair["step_ratios"] == [1.0] * 3
    assert max(overhead.pair_record(run, run, 1.0, 1.0)["direct_log_ms"]) > 10_000  # kept in, it would dominate
    # each side's traced step comes from the summarizer the entry point passes (report.profile's), trimmed
    traced = overhead.pair_record(run, run, 1.0, 1.0, profile_summary=lambda d: {"window_ms": 1.0, "other": 2})
    assert traced["profile"] == {"vlmtrain": {"window_ms": 1.0}, "direct": {"window_ms": 1.0}}


def test_pool_joins_one_sessions_rows(tmp_path: Path) -> None:
    """--pool K: the pairs of the last K rows of a case become one row; rows of another date, or an earlier pooled
    row, are not pooled again."""

    case = overhead_ab.pick(PERF, BEST.name, 20)
    name, path = f"overhead_{case.name}", tmp_path / "perf.jsonl"
    pairs = [overhead.pair_record(FSDP_EP2, THREE_D_EP2, 1.0, 1.0),
             overhead.pair_record(THREE_D_EP2, FSDP_EP2, 1.0, 1.0, order="direct,vlmtrain")]
    for pair in pairs:
        store.append(path, name, "cmd", overhead.overhead_metrics([pair]), config=["a"], pairs_detail=[pair])
    row = overhead_ab.pool(name, 2, path, "pool cmd")
    assert row["pairs_detail"] == pairs and row["metrics"] == overhead.overhead_metrics(pairs)
    assert row["metrics"]["pairs"] == 2 and row["pooled"] == ["cmd", "cmd"] and row["command"] == "pool cmd"
    lo, hi = row["metrics"]["overhead_ratio_pairs_ci95"]
    assert lo < 1 < hi  # one pair each way round: the interval holds both
    assert overhead_ab.pool(name, 2, path, "again")["pairs_detail"] == pairs  # a pooled row is not pooled again
    with pytest.raises(SystemExit, match="need 3 rows"):
        overhead_ab.pool(name, 3, path, "cmd")
    first = json.loads(path.read_text().splitlines()[0])
    for other in ({"date": "2026-01-01"}, {"config": ["b"]}):
        run_summary.append_jsonl(path, first | other)
        with pytest.raises(SystemExit, match="one date, machine and config"):
            overhead_ab.pool(name, 2, path, "cmd")


def test_direct_side_gets_its_own_run_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--extra reaches both sides and names the row apart; (b)'s run config is (a)'s with only output_dir changed,
    so a profiled pair writes two traces (Bridge builds and validates (b)'s ConfigContainer on CPU here)."""
    from megatron.bridge.training.config import ProfilingConfig
    from omegaconf import OmegaConf

    from vlmtrain import cli
    from vlmtrain.build import container
    from vlmtrain.config.compose import load_run
    from vlmtrain.config.resolve import resolve

    assert cli.main(["overhead", "perf_h200x2", "--case", BEST.name, "--extra", "train.profile_step=6", "--dry-run",
                     "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"{BEST.name}+train.profile_step=6" in out and "validated by Bridge" in out
    a, b = (OmegaConf.to_container(OmegaConf.load(tmp_path / d / "run_config.yaml")) for d in ("vlmtrain", "direct"))
    assert a.pop("output_dir") == str(tmp_path / "vlmtrain") and b.pop("output_dir") == str(tmp_path / "direct")
    assert a == b and a["train"]["profile_step"] == 6
    runs = [load_run(tmp_path / d / "run_config.yaml") for d in ("vlmtrain", "direct")]
    cfgs = [container.build(r, resolve(r)) for r in runs]
    assert [c.logger.tensorboard_dir for c in cfgs] == [f"{tmp_path}/{d}/tensorboard" for d in ("vlmtrain", "direct")]
    assert isinstance(cfgs[1].profiling, ProfilingConfig) and cfgs[0].profiling == cfgs[1].profiling


def test_overhead_picks_perf_cases_and_launches_like_vlmtrain() -> None:
    case = overhead_ab.pick(PERF, B.name, 10)
    assert case.name == B.name and "train.iterations=10" in case.overrides
    assert overhead_ab.pick(PERF, "3d-tp2", 10).name.startswith("30b-l8_3d-tp2-ep2_")
    cmd = overhead.direct_command(Path("r/run_config.yaml"), 2, "29500")
    assert cmd[1:6] == ["-m", "torch.distributed.run", "--nproc-per-node=2", "--nnodes=1", "--master-port"]
    assert cmd[-3:] == ["-m", "vlmtrain.lab.bridge_alone", "r/run_config.yaml"]  # torchrun runs Bridge alone
