"""vlmtrain.report on a sweep built from real GPU run files, a real preflight skip and a real W&B offline run."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from report_jobs import CASES, CRASH, INVALID, PNG_SIGNATURE, add_job, annotations, case_overrides, results_rows

from vlmtrain import cli, report
from vlmtrain.check import preflight
from vlmtrain.config.compose import compose
from vlmtrain.config.resolve import resolve
from vlmtrain.observe import run_summary
from vlmtrain.report import labels, plots

CRASH_LINE = ("vlmtrain.checks.SettingNotApplied: cuda_graph=moe_router_preprocess requested but no layer holds a "
              "captured CUDA graph.")  # a real run's log, before checks.py became train/after_build.py
WANDB_CASE = "tiny_3d_ep2_trainable_recompute-none_graph-none_2gpu"
WANDB_ROWS = 6
WANDB_NAME = "wandb-" + WANDB_CASE
KILLED = ["model=tiny", "train.iterations=8", "train.micro_batch_size=2", "gpus_per_node=1"]
NEVER_STARTED = ["model=tiny", "train.iterations=8", "train.micro_batch_size=4", "gpus_per_node=1"]


def write_preflight(sweep: Path, launched: list[list[str]]) -> list[str]:
    """preflight.json as vlmtrain's sweeper writes it (skipped: label, overrides, findings; launched: overrides by
    job number), from really checking an invalid composed config."""
    run = compose(INVALID)
    findings = [str(f) for f in preflight.check(run, resolve(run))]
    data = {"skipped": [{"job": " ".join(INVALID), "overrides": INVALID, "findings": findings}], "launched": launched}
    (sweep / "preflight.json").write_text(json.dumps(data, indent=2) + "\n")
    return findings


def wandb_overrides(overrides: list[str]) -> list[str]:
    """The W&B run logs WANDB_ROWS steps: its config says so (else the report rightly calls it incomplete)."""
    return [o for o in overrides if not o.startswith("train.iterations=")] + [f"train.iterations={WANDB_ROWS}"]


def log_wandb_run(wandb_dir: Path, overrides: list[str], rows: list[dict]) -> None:
    """A real W&B offline run (wandb 0.29) shaped like vlmtrain.observe.wandb_run's: config {"vlmtrain": run config},
    each metrics row at W&B step row["step"] + 1."""
    import wandb

    config = {"vlmtrain": OmegaConf.to_container(OmegaConf.structured(compose(overrides)), enum_to_str=True)}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "offline")
        mp.setenv("WANDB_SILENT", "true")
        run = wandb.init(dir=str(wandb_dir), project="vlmtrain", group="report-test", name=WANDB_NAME,
                         config=config)
        for row in rows:
            run.log(row, step=row["step"] + 1)
        run.finish()
        wandb.teardown()


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """14 real GPU run dirs (one a real crash), a run killed before its first step, a preflight skip, a W&B run."""
    sweep = tmp_path_factory.mktemp("multirun")
    overrides = case_overrides()
    for num, name in enumerate(sorted(overrides)):
        add_job(sweep, num, overrides[name], CASES / name)
    killed = add_job(sweep, len(overrides), KILLED)
    head = (CASES / "tiny_fsdp_ep1_trainable_recompute-none_graph-none_1gpu" / "train.log").read_text()
    (killed / "train.log").write_text("\n".join(head.splitlines()[:20]) + "\n")
    launched = [OmegaConf.to_container(OmegaConf.load(d / ".hydra" / "overrides.yaml"))
                for d in sorted(sweep.iterdir(), key=lambda d: int(d.name.split("_")[0]))]
    write_preflight(sweep, [*launched, NEVER_STARTED])
    rows = run_summary.read_jsonl(CASES / WANDB_CASE / "metrics.jsonl")[:WANDB_ROWS]
    log_wandb_run(sweep, wandb_overrides(overrides[WANDB_CASE]), rows)
    return sweep


@pytest.fixture(scope="module")
def written(sweep: Path) -> dict[str, Path]:
    return report.write_report(sweep)


@pytest.fixture(scope="module")
def jobs(sweep: Path) -> dict[str, report.Job]:
    return {j.name.split("_", 1)[-1] if j.source == "files" else j.name: j for j in report.gather(sweep)}


def by_case(jobs: dict[str, report.Job], case: str) -> report.Job:
    overrides = ",".join(sorted(case_overrides()[case]))
    return jobs[overrides]


def expected_wandb_useful(tmp_path: Path) -> float:
    """What vlmtrain.observe.run_summary.summarize says about the rows logged to W&B."""
    rows = run_summary.read_jsonl(CASES / WANDB_CASE / "metrics.jsonl")[:WANDB_ROWS]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_summary.summarize(tmp_path)["useful_tokens_per_s_per_gpu"]


def case_name(job: report.Job) -> str:
    names = {",".join(sorted(o)): name for name, o in case_overrides().items()}
    return names.get(job.name.split("_", 1)[-1], job.name)


def test_ranking_follows_useful_tokens_per_gpu(jobs: dict[str, report.Job], tmp_path: Path) -> None:
    useful = {name: row["metrics"]["useful_tokens_per_s_per_gpu"] for name, row in results_rows().items()
              if "frozen" not in name}
    useful[WANDB_NAME] = expected_wandb_useful(tmp_path)
    ranked = sorted((j for j in jobs.values() if j.section == "main" and j.rank), key=lambda j: j.rank)
    assert [case_name(j) for j in ranked] == sorted(useful, key=useful.get, reverse=True)
    assert [j.rank for j in ranked] == list(range(1, len(useful) + 1))


def test_metrics_match_results_summarize(jobs: dict[str, report.Job]) -> None:
    for name in results_rows():
        job, summary = by_case(jobs, name), run_summary.summarize(CASES / name)
        for key in ("steps", "step_s", "peak_mem_gib", "useful_tokens_per_s_per_gpu", "tflops_per_s_per_gpu", "mfu",
                    "nonpad_fraction", "last_loss"):
            assert job.metrics[key] == pytest.approx(summary[key]), (name, key)
        assert job.layout["gpus"] == int(name[-4]), name


def test_crash_reports_its_exception_line(jobs: dict[str, report.Job]) -> None:
    job = by_case(jobs, CRASH)
    assert (job.status, job.reason) == ("crash", CRASH_LINE)
    assert CRASH_LINE in (CASES / CRASH / "train.log").read_text()
    assert job.rank is None


def test_preflight_skip_names_its_rule(sweep: Path, jobs: dict[str, report.Job], written: dict[str, Path]) -> None:
    job = jobs[" ".join(INVALID)]
    assert (job.source, job.status) == ("preflight", "skipped")
    assert job.reason.startswith("fsdp_needs_pp1: parallelism=fsdp with parallelism.pp=2")
    md = written["md"].read_text()
    assert "| (not launched) | skipped by preflight | fsdp_needs_pp1: " in md


def test_killed_before_first_step_is_incomplete(jobs: dict[str, report.Job]) -> None:
    job = jobs[",".join(sorted(KILLED))]
    assert (job.status, job.reason) == ("incomplete", "no metrics and no error in the logs")


def test_launched_job_without_a_directory_is_incomplete(jobs: dict[str, report.Job]) -> None:
    job = jobs[" ".join(NEVER_STARTED)]
    assert (job.status, job.num, job.source) == ("incomplete", len(case_overrides()) + 1, "preflight-launched")
    assert job.reason.startswith("launched, but no job directory")


def test_wandb_offline_run_is_read(jobs: dict[str, report.Job], tmp_path: Path) -> None:
    job = jobs[WANDB_NAME]
    assert (job.source, job.status, job.data_kind) == ("wandb-offline", "ok", "sample")
    assert job.choices["parallelism"] == "3d" and job.layout["gpus"] == 2
    assert job.metrics["steps"] == WANDB_ROWS
    assert job.metrics["useful_tokens_per_s_per_gpu"] == pytest.approx(expected_wandb_useful(tmp_path))


def test_frozen_runs_are_marked_and_ranked_apart(jobs: dict[str, report.Job], written: dict[str, Path]) -> None:
    expected = sum("_frozen" in name for name in case_overrides())  # tiny, tiny + projector, 30B shapes
    frozen = [j for j in jobs.values() if j.frozen]
    assert expected == 3 and len(frozen) == expected and all(j.section == "frozen" and j.rank for j in frozen)
    md = written["md"].read_text()
    main, frozen_part = md.split("## " + report.SECTIONS["frozen"])
    assert "frozen-vision" not in main.split("## " + report.SECTIONS["main"])[1]
    assert frozen_part.split("\n## ")[0].count("frozen-vision") == expected
    rows = list(csv.DictReader(written["csv"].open()))
    assert [r["frozen_vision"] for r in rows if r["section"] == "frozen"] == ["True"] * expected


def test_csv_columns(written: dict[str, Path], jobs: dict[str, report.Job]) -> None:
    with written["csv"].open() as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert reader.fieldnames == report.CSV_COLUMNS
    for col in ("rank", "status", "reason", "model", "parallelism", "gpus", "mbs", "useful_tokens_per_s_per_gpu",
                "mfu", "step_s", "peak_mem_gib", "memory_gib", "headroom_gib", "flops_vit", "flops_projector",
                "flops_decoder", "time_vision_s", "frozen_vision", "mock_data"):
        assert col in reader.fieldnames
    assert len(rows) == len(jobs)
    first = rows[0]
    assert first["section"] == "main" and first["rank"] == "1"
    assert float(first["headroom_gib"]) == pytest.approx(141.0 - float(first["peak_mem_gib"]))


def test_pngs_are_written(written: dict[str, Path]) -> None:
    for key in report.PLOTS:
        data = written[key].read_bytes()
        assert data[:8] == PNG_SIGNATURE and len(data) > 1024, key


def test_mbs_column_is_filled(jobs: dict[str, report.Job], written: dict[str, Path]) -> None:
    """Every job with a config or an MBS override has its MBS in report.csv and report.md (the fixture runs ran at
    the schema default, the killed and never-started jobs override it)."""
    rows = {r["job"]: r for r in csv.DictReader(written["csv"].open())}
    assert {rows[j.name]["mbs"] for j in jobs.values() if j.source == "files" and j.metrics} == {"1"}
    assert rows[jobs[",".join(sorted(KILLED))].name]["mbs"] == "2"
    assert rows[jobs[" ".join(NEVER_STARTED)].name]["mbs"] == "4"
    ranked = written["md"].read_text().split("## " + report.SECTIONS["main"])[1].split("\n## ")[0]
    header, _, *lines = [ln.split(" | ") for ln in ranked.strip().splitlines()]
    column = header.index("MBS")
    assert len(lines) == sum(j.section == "main" for j in jobs.values() if j.rank) > 10
    assert {ln[column] for ln in lines} == {"1"}


def test_throughput_plot_puts_every_job_at_its_mbs(jobs: dict[str, report.Job], tmp_path: Path) -> None:
    """No job is drawn at MBS 0: every fixture run sits in the "MBS 1" column (its series spread a little around
    it), and each series is labelled once, with a label no other series has."""
    ranked = [j for j in jobs.values() if j.rank]
    fig = plots.plot_throughput_vs_mbs(ranked, report.baseline(ranked), tmp_path / "t.png")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["MBS 1"]
    xs = [x for line in ax.get_lines() for x in line.get_xdata()]
    assert len(xs) == len(ranked) and all(abs(x) <= plots.DODGE / 2 for x in xs)
    texts = annotations(ax)
    assert len(texts) == len(plots.mbs_series(ranked, report.baseline(ranked))) == len(set(texts)) == len(ranked)


def test_models_are_separate_series(jobs: dict[str, report.Job]) -> None:
    """One line never joins two models (the tiny model and the 30B shapes) or two layouts."""
    ranked = [j for j in jobs.values() if j.rank]
    series = plots.mbs_series(ranked, report.baseline(ranked))
    assert all(len({(j.choices["model"], labels.layout_text(j), j.layout["gpus"]) for j in s}) == 1
               for s in series)
    assert {s[0].choices["model"] for s in series} == {"tiny", "qwen3_vl_30b_a3b"}


def test_labels_tell_jobs_apart(jobs: dict[str, report.Job], written: dict[str, Path], tmp_path: Path) -> None:
    """Plot labels are the parts of the config that differ between jobs, unique per job, never a cut prefix."""
    ranked = [j for j in jobs.values() if j.rank]
    base = report.baseline(ranked)
    texts = labels.distinct_labels(ranked, base)
    assert len(set(texts)) == len(ranked) and not any("…" in t for t in texts)
    by_case = dict(zip((case_name(j) for j in ranked), texts, strict=True))
    assert by_case["tiny_fsdp_ep1_trainable_recompute-selective_graph-none_1gpu"] == "tiny auto ep1 1 GPU " \
        "recompute=selective train.iterations=12"  # the 1-GPU cases run 12 iterations since 2026-12-01, others 8
    assert by_case["30b-shape-l4_fsdp_ep2_trainable_recompute-none_graph-none_2gpu"] == "qwen3_vl_30b_a3b auto ep2 " \
        "2 GPUs data=realistic"
    ticks = [t.get_text() for t in plots.plot_component_split(ranked, base, "flops", tmp_path / "s.png")
             .axes[0].get_yticklabels()]
    assert sorted(ticks) == sorted(t + (f"  (#{j.num})" if j.num is not None else "")
                                   for t, j in zip(texts, ranked, strict=True))
    points = annotations(plots.plot_memory_vs_throughput(ranked, base, tmp_path / "m.png").axes[0])
    assert len(points) == len(set(points)) == len(ranked)


def test_callback_writes_the_report_and_never_raises(sweep: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    copy = shutil.copytree(sweep, tmp_path / "sweep")
    report.ReportCallback().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(copy)}}}))
    assert (copy / "report.md").exists() and (copy / "report.csv").exists()
    report.ReportCallback().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "none")}}}))
    assert "WARNING: sweep report failed" in capsys.readouterr().err


def test_cli_report(sweep: Path, tmp_path: Path) -> None:
    assert cli.main(["report", str(sweep), "--out", str(tmp_path / "out")]) == 0
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"report.md", "report.csv", *report.PLOTS.values()}


def test_a_missing_source_is_one_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["report", str(tmp_path / "nowhere")]) == 2
    assert f"vlmtrain report: {tmp_path / 'nowhere'}: not a directory" in capsys.readouterr().err


def test_refused_and_skipped_jobs_keep_their_reasons_and_their_knobs(tmp_path: Path) -> None:
    """A job refused before any GPU work (its data scan) is reported with the message it was refused with, not as
    incomplete; a job preflight skipped counts for "Same in every job" by its overrides."""
    from vlmtrain.check import refusal

    ok = add_job(tmp_path, 0, ["train.micro_batch_size=1"])
    refused = add_job(tmp_path, 1, ["train.micro_batch_size=1", "train.iterations=4"])
    refusal.refuse(refused, "data=jsonl x.jsonl: 16 samples, 16 images, 1 bad", printed=True)
    skipped = {"job": "train.micro_batch_size=3", "overrides": ["train.micro_batch_size=3"],
               "findings": ["[error] global_batch_divisible: train.global_batch_size=8 is not a multiple"]}
    (tmp_path / "preflight.json").write_text(json.dumps({"skipped": [skipped], "launched": [
        ["train.micro_batch_size=1"], ["train.micro_batch_size=1", "train.iterations=4"]]}))
    jobs = {j.name: j for j in report.gather(tmp_path)}
    assert (jobs[refused.name].status, jobs[refused.name].reason) == (
        "refused", "data=jsonl x.jsonl: 16 samples, 16 images, 1 bad")
    assert jobs[ok.name].status == "incomplete"
    md = report.render(list(jobs.values()), str(tmp_path), tmp_path)
    assert "| refused before any GPU work | data=jsonl x.jsonl: 16 samples, 16 images, 1 bad |" in md
    same = next(line for line in md.splitlines() if line.startswith("Same in every job"))
    assert "train.micro_batch_size" not in same and "model=tiny" in same


def test_a_preflight_only_sweep_lists_its_jobs_as_passed(tmp_path: Path) -> None:
    (tmp_path / "preflight.json").write_text(json.dumps({"skipped": [], "launched": [], "preflight_only": True,
                                                         "passed": [["train.micro_batch_size=1"]]}))
    (job,) = report.gather(tmp_path)
    assert (job.status, job.reason) == ("preflight_only", "hydra.sweeper.preflight_only=true: not launched")
