"""vlmtrain.report on single jobs and run dirs (a crash without its log, run dirs without a config, component times,
log classes, the data-bound flag, rates over the steady window) and the report a real `train.py -m` writes."""

from __future__ import annotations

import csv
import json
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from report_jobs import CASES, CRASH, INVALID, PNG_SIGNATURE, ROOT, add_job, annotations, case_overrides

from vlmtrain import report
from vlmtrain.config.compose import compose
from vlmtrain.observe import run_summary
from vlmtrain.report import plots


def test_crash_without_its_log_is_still_not_ok(tmp_path: Path) -> None:
    """Local sweeps keep torchrun's output out of the job dir: checks.json alone shows the run never ended."""
    job_dir = add_job(tmp_path / "sweep", 0, case_overrides()[CRASH], CASES / CRASH)
    (job_dir / "train.log").unlink()
    job = report.job_from_dir(job_dir)
    assert job.status == "incomplete" and job.reason.startswith("checks.json has no end-of-training checks")


@pytest.mark.parametrize(("overrides", "section", "flag"), [
    (["data=mock"], "mock", "mock-data"),
    (["data=mock", "vision=frozen"], "mock", "frozen-vision, mock-data"),
    (["vision=frozen_with_projector"], "frozen", "frozen-vision"),
])
def test_mock_and_frozen_configs_get_their_own_section(overrides: list[str], section: str, flag: str) -> None:
    config = OmegaConf.to_container(OmegaConf.structured(compose(overrides)), enum_to_str=True)
    job = report.Job(name="x", source="files", config=config)
    assert (job.section, report.flags(job)) == (section, flag)


def test_a_run_that_waited_on_its_loader_is_flagged_with_the_knob() -> None:
    """Medians of a recorded H1 run of machine run boot-2b3014ae (tests/fixtures/perf_h200/rows.jsonl): 0.555 s of a
    3.938 s step waiting on the loader at data.num_workers=2."""
    config = OmegaConf.to_container(OmegaConf.structured(compose(["data=realistic"])), enum_to_str=True)
    job = report.Job(name="x", source="files", config=config,
                     metrics={"time_data_s": 0.555, "step_s": 3.938, "skipped_samples": 0})
    assert report.flags(job) == "data-bound: 14% of the step waits on the loader (data.num_workers=2)"
    job.metrics["time_data_s"] = 0.001  # a loader that keeps up
    assert report.flags(job) == ""


def test_run_dirs_without_a_config(tmp_path: Path) -> None:
    """The bare fixture dirs (metrics.jsonl, checks.json, train.log; no run_config.yaml or .hydra/): MBS is
    unknown, so the plot says so instead of drawing 0; labels are the words of the run names that differ; frozen
    vision comes from checks.json's parameter counts."""
    bare = shutil.copytree(CASES, tmp_path / "bare")
    for config in bare.glob("*/run_config.yaml"):  # the regenerated fixtures carry one: take it away
        config.unlink()
    jobs = report.gather(bare)
    ranked = [j for j in jobs if j.rank]
    assert len(ranked) == 14 and all(j.mbs is None for j in jobs)
    assert sorted(j.name for j in ranked if j.section == "frozen") == [
        "30b-shape-l4_fsdp_ep1_frozen_recompute-none_graph-none_1gpu",
        "tiny_fsdp_ep1_frozen-projector_recompute-full_graph-none_1gpu",
        "tiny_fsdp_ep1_frozen_recompute-none_graph-none_1gpu"]
    base = report.baseline(jobs)
    ax = plots.plot_throughput_vs_mbs(jobs, base, tmp_path / "t.png").axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["MBS unknown"]
    texts = annotations(ax)
    assert len(texts) == len(set(texts)) == 14
    assert "tiny fsdp ep1 trainable recompute-selective 1gpu" in texts  # graph-none: in every ranked run's name
    rows = list(csv.DictReader((report.write_report(bare, tmp_path / "out")["csv"]).open()))
    assert {r["mbs"] for r in rows} == {""} and len(rows) == 15


def test_component_times_replace_the_flop_split(tmp_path: Path) -> None:
    """With per-component times (another engineer adds them), the split is seconds, not FLOPs. The times here are
    derived from a real run: its step time divided in proportion to its FLOP split."""
    name = "tiny_fsdp_ep1_trainable_recompute-none_graph-none_1gpu"
    job = add_job(tmp_path / "sweep", 0, case_overrides()[name], CASES / name)
    rows = run_summary.read_jsonl(job / "metrics.jsonl")
    for r in rows:
        r.update(time_vision_s=r["step_s"] * r["flops_vit"] / r["flops"],
                 time_projector_s=r["step_s"] * r["flops_projector"] / r["flops"],
                 time_decoder_s=r["step_s"] * r["flops_decoder"] / r["flops"], time_optimizer_s=0.0, time_data_s=0.0)
    (job / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    paths = report.write_report(tmp_path / "sweep")
    md = paths["md"].read_text()
    assert "vision / projector / decoder time" in md and "of FLOPs" not in md and "FLOP** split" not in md
    seconds = r"\d\.\d{3}"
    assert re.search(rf"\| ViT {seconds} / projector {seconds} / decoder {seconds} / optimizer 0\.000 / data 0\.000"
                     rf"(?: / other {seconds})? s \|",
                     md)
    row = next(csv.DictReader(paths["csv"].open()))
    assert float(row["time_decoder_s"]) > float(row["time_vision_s"]) > 0


@pytest.mark.parametrize(("log", "status", "reason"), [
    ("[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
     "139.81 GiB of which 1.06 GiB is free.", "oom", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
     "2.00 GiB. GPU 0 has a total capacity of 139.81 GiB of which 1.06 GiB is free."),
    ("[rank1]:[E1129 22:21:43.123456 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective operation timeout: "
     "WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600006 milliseconds "
     "before timing out.", "nccl_timeout", "Watchdog caught collective operation timeout"),
])
def test_log_classification(log: str, status: str, reason: str) -> None:
    got = report.classify(log, steps=3)
    assert got[0] == status and reason in got[1]


def test_plain_multirun_writes_the_report(tmp_path: Path) -> None:
    """A plain `train.py -m` dry-run sweep (no hydra.callbacks override: conf/train.yaml registers the report):
    vlmtrain's preflight sweeper skips the FSDP+PP job into preflight.json, the other job dry-runs, and the report
    written into the sweep dir at the end shows both, with its CSV and plots."""
    sweep = tmp_path / "multirun"
    cmd = [sys.executable, str(ROOT / "train.py"), "-m", "model=tiny", "parallelism=fsdp", "parallelism.pp=1,2",
           "dry_run=true", f"hydra.sweep.dir={sweep}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"[vlmtrain] sweep report: {sweep / 'report.md'}" in proc.stdout
    md = (sweep / "report.md").read_text()
    assert "| #0 | dry run (planned, not trained) | bridge_config.yaml only |" in md
    assert "| (not launched) | skipped by preflight | fsdp_needs_pp1: " in md
    rows = {r["overrides"]: r for r in csv.DictReader((sweep / "report.csv").open())}
    assert rows["model=tiny parallelism=fsdp parallelism.pp=2 dry_run=True"]["status"] == "skipped"
    assert rows["model=tiny parallelism=fsdp parallelism.pp=1 dry_run=True"]["status"] == "dry_run"
    for name in report.PLOTS.values():
        assert (sweep / name).read_bytes()[:8] == PNG_SIGNATURE, name


def test_single_run_writes_no_report(tmp_path: Path) -> None:
    """conf/train.yaml's report callback is instantiated for a single run too, and leaves it alone: a single run
    that preflight refuses (exit 2, before Bridge is imported) ends without a report or a callback message."""
    run_dir = tmp_path / "run"
    cmd = [sys.executable, str(ROOT / "train.py"), *INVALID, "dry_run=true", f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "fsdp_needs_pp1" in proc.stdout
    assert "sweep report" not in proc.stdout + proc.stderr
    assert (run_dir / ".hydra").is_dir() and not (run_dir / "report.md").exists()


def test_rates_are_total_work_over_total_time() -> None:
    """A run's tokens/s and MFU are its steady window's totals over its time, not a median of per-step rates (the
    median overstates them when steps carry unequal work, as packed real images do)."""
    run_dir = CASES / "30b-shape-l4_fsdp_ep2_trainable_recompute-none_graph-none_2gpu"
    steps = run_summary.steady(run_summary.read_jsonl(run_dir / "metrics.jsonl"))
    summary = run_summary.summarize(run_dir)
    seconds = sum(r["step_s"] for r in steps)
    assert summary["useful_tokens_per_s_per_gpu"] == pytest.approx(sum(r["nonpad_tokens"] for r in steps) / seconds / 2)
    assert summary["mfu"] == pytest.approx(sum(r["mfu"] * r["step_s"] for r in steps) / seconds)
    assert summary["step_s"] == statistics.median(r["step_s"] for r in steps)
    per_step = [r["useful_tokens_per_s_per_gpu"] for r in steps]
    assert summary["useful_tokens_per_s_per_gpu"] != pytest.approx(statistics.median(per_step), rel=1e-3)
