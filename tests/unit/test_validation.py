"""Validation (data.validation, data.validation_fraction, train.eval_interval) on CPU: the held-out split on real
files (the shipped photos as `vlmtrain data export` writes them), the real finalized ConfigContainer, Bridge's own
dataset provider building the validation split, the metrics callback's evaluation path, and the report's column and
plot. The GPU path (Bridge's loop running the evaluation) is the acceptance suite's."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from report_jobs import CASES, PNG_SIGNATURE, add_job, case_overrides

from vlmtrain.build import container, target
from vlmtrain.check import preflight
from vlmtrain.config.resolve import resolve
from vlmtrain.data import validation
from vlmtrain.data.export import export
from vlmtrain.data.scan import BadSample

EVAL = ["train.eval_interval=5", "train.eval_iters=2"]
ONE_GPU = ["gpus_per_node=1", "train.global_batch_size=4"]  # one evaluation batch = 4 samples


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, cache: Path) -> dict[str, dict[str, Any]]:
    """The 16 sample photos in each format, written once for the module."""
    root = tmp_path_factory.mktemp("exports")
    return {fmt: export(fmt, root / fmt, cache=cache) for fmt in ("jsonl", "parquet", "hf", "energon")}


def _build(compose, cache: Path, out: Path, *overrides: str) -> tuple[Any, Any]:
    """(run, finalized ConfigContainer) as training builds them, after preflight passes."""
    run = compose(*overrides, f"data.cache_dir={cache}", "data.num_workers=0", output_dir=str(out))
    res = resolve(run)
    assert not preflight.errors(preflight.check(run, res)), preflight.check(run, res)
    cfg = container.build(run, res)
    target.finalize(run, res, cfg)
    return run, cfg


def _ids(source: Any) -> list[str]:
    """The ids of the rows a source config reads (the split Bridge's loader loads)."""
    from vlmtrain.data import hf

    return [str(i) for i in hf.load({"path_or_dataset": source.path_or_dataset, "split": source.split,
                                     "load_kwargs": source.load_kwargs})["id"]]


def test_held_out_positions_are_fixed_and_bounded() -> None:
    assert validation.held_out(16, 0.25) == validation.held_out(16, 0.25)
    assert len(validation.held_out(16, 0.25)) == 4 and len(validation.held_out(3, 0.01)) == 1
    assert len(validation.held_out(3, 0.99)) == 2 and validation.held_out(1, 0.5) == []
    assert set(validation.held_out(16, 0.25)) < set(range(16))


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_fraction_holds_out_the_same_samples_every_run(bridge, compose, tmp_path: Path, exported: dict,
                                                       fmt: str) -> None:
    """Two runs from separate caches (the split computed twice) hold out the same samples; train and validation
    are disjoint and together the whole file; Bridge's provider builds both splits and the held-out batch carries
    real image tokens."""
    overrides = [*exported[fmt]["overrides"], "data.validation_fraction=0.25", *EVAL, *ONE_GPU]
    _, cfg = _build(compose, tmp_path / "cache1", tmp_path / "a", *overrides)
    first, second = cfg.dataset, _build(compose, tmp_path / "cache2", tmp_path / "b", *overrides)[1].dataset
    train, held = _ids(first.source), _ids(first.validation_source)
    assert (train, held) == (_ids(second.source), _ids(second.validation_source))
    assert len(held) == 4 and not set(train) & set(held) and len(set(train) | set(held)) == 16
    assert first.do_validation

    from megatron.bridge.data.utils import get_dataset_provider

    _, valid, _ = get_dataset_provider(first)([8, 8, 0], first)
    batch = valid.collate_fn([valid[i] for i in range(2)])
    assert int((batch["input_ids"] == cfg.model.image_token_id).sum()) > 0 and (batch["loss_mask"].sum(-1) > 0).all()
    scan = json.loads((tmp_path / "a" / "data_scan.json").read_text())
    assert scan["validation"]["samples"] == 4 and scan["validation"]["fraction"] == 0.25


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "hf"])
def test_validation_path_is_bridge_s_validation_source(bridge, compose, cache: Path, tmp_path: Path, exported: dict,
                                                      fmt: str) -> None:
    """data.validation=<a second export of the same format>: Bridge's validation_source reads its rows."""
    held = export(fmt, tmp_path / "held", cache=cache)
    run, cfg = _build(compose, cache, tmp_path / "run", *exported[fmt]["overrides"],
                      f"data.validation={held['path']}", *EVAL, *ONE_GPU)
    assert cfg.dataset.do_validation and cfg.validation.eval_interval == 5 and cfg.validation.eval_iters == 2
    assert len(_ids(cfg.dataset.validation_source)) == 16
    assert held["path"] in json.dumps(cfg.dataset.validation_source.__dict__) or fmt == "jsonl"


def test_bad_held_out_image_fails_the_build_naming_it(bridge, compose, cache: Path, tmp_path: Path,
                                                      exported: dict) -> None:
    held = export("jsonl", tmp_path / "held", cache=cache, corrupt=1)
    (bad,) = held["corrupt"]
    with pytest.raises(BadSample, match="data.skip_bad_images=true") as failed:
        _build(compose, cache, tmp_path / "run", *exported["jsonl"]["overrides"], f"data.validation={held['path']}",
               *EVAL, *ONE_GPU)
    assert bad["image"] in str(failed.value)
    _build(compose, cache, tmp_path / "skipped", *exported["jsonl"]["overrides"], f"data.validation={held['path']}",
           "data.skip_bad_images=true", *EVAL, *ONE_GPU)
    scan = json.loads((tmp_path / "skipped" / "data_scan.json").read_text())
    assert scan["validation"]["skipped_samples"] == 1 and scan["validation"]["samples"] == 15
    assert scan["skipped_samples"] == 0  # the training file is whole


def test_held_out_set_smaller_than_an_eval_batch_is_refused(bridge, compose, cache: Path, tmp_path: Path,
                                                            exported: dict) -> None:
    """Preflight counts the held-out file's rows from its metadata; the data stage refuses the same set itself."""
    held = export("parquet", tmp_path / "held", cache=cache, num_samples=2)
    overrides = [*exported["parquet"]["overrides"], f"data.validation={held['path']}", *EVAL, *ONE_GPU]
    run = compose(*overrides, f"data.cache_dir={cache}", output_dir=str(tmp_path / "run"))
    found = {f.rule: f.message for f in preflight.check(run, resolve(run))}
    assert "holds 2 samples, fewer than one evaluation batch of 4" in found["validation_fills_eval_batch"]
    with pytest.raises(BadSample, match="holds 2 samples, fewer than one evaluation batch of 4"):
        container.build(run, resolve(run))


def test_energon_validates_on_its_val_split(bridge, compose, cache: Path, tmp_path: Path, exported: dict) -> None:
    """Energon's own `val` split part: refused while the dataset has none; once prepared (here over the exported
    shard itself: this checks the wiring, not disjointness), Bridge's Energon data module serves its batches."""
    from megatron.energon.flavors.webdataset.base_webdataset import BaseWebdatasetFactory

    root = Path(shutil.copytree(exported["energon"]["path"], tmp_path / "energon"))
    overrides = ["data=energon", f"data.path={root}", "data.validation=val", *EVAL, *ONE_GPU]
    run = compose(*overrides, output_dir=str(tmp_path / "refused"))
    assert "validation_path_exists" in {f.rule for f in preflight.check(run, resolve(run))}
    BaseWebdatasetFactory.prepare_dataset(root, ["train-shard-000000.tar"], shuffle_seed=None, workers=1,
                                          split_parts_patterns=[("train", r"train-shard-.*"),
                                                                ("val", r"train-shard-.*")])
    _, cfg = _build(compose, cache, tmp_path / "run", *overrides)
    assert cfg.dataset.do_validation and cfg.validation.eval_micro_batch_size == cfg.dataset.micro_batch_size

    from megatron.bridge.data.utils import get_dataset_provider

    _, valid, _ = get_dataset_provider(cfg.dataset)([8, 8, 0], cfg.dataset)
    assert int((next(valid)["input_ids"] == cfg.model.image_token_id).sum()) > 0


def test_packed_validation_has_its_own_bins(bridge, compose, cache: Path, tmp_path: Path) -> None:
    """data.packing: the held-out samples are binned like the training ones and served as Bridge's validation
    split, one bin per item."""
    _, cfg = _build(compose, cache, tmp_path, "data=sample", "data.validation_fraction=0.5", "data.packing=2048",
                    *EVAL, "gpus_per_node=1", "train.global_batch_size=2")
    ds = cfg.dataset
    assert Path(ds.validation_bins_file).is_file() and ds.validation_bins_file != ds.bins_file
    from megatron.bridge.data.utils import get_dataset_provider

    train, valid, _ = get_dataset_provider(ds)([4, 4, 0], ds)
    batch = valid.collate_fn([valid[0]])
    assert batch["input_ids"].shape[0] == 1 and batch["input_ids"].shape[1] <= 2048
    held = {i for b in json.loads(Path(ds.validation_bins_file).read_text())["bins"] for i in b}
    assert len(held) == 8 and len(valid.examples) == 8 and len(train.examples) == 8
    assert not {e["id"] for e in valid.examples} & {e["id"] for e in train.examples}
    # a packed evaluation batch counts rows: the 8 held-out photos make 5 rows of <= 1024 tokens, fewer than 8
    run = compose("data=sample", "data.validation_fraction=0.5", "data.packing=1024", *EVAL, "gpus_per_node=1",
                  f"data.cache_dir={cache}", output_dir=str(tmp_path / "few"))
    with pytest.raises(BadSample, match="holds 5 rows, fewer than one evaluation batch of 8"):
        container.build(run, resolve(run))


def test_eval_end_puts_the_loss_on_the_evaluated_step_s_row(bridge, compose, cache: Path, tmp_path: Path) -> None:
    """Bridge's CallbackContext after an evaluation: the held row of the step it followed is written with
    val_lm_loss, and the evaluation's batches leave the counters (the next step counts only its own)."""
    import torch
    from megatron.bridge.training.callbacks import CallbackContext
    from megatron.bridge.training.state import GlobalState

    from vlmtrain.observe.metrics_callback import MetricsCallback
    from vlmtrain.observe.run_summary import read_jsonl
    from vlmtrain.observe.timing import StepTimer
    from vlmtrain.train.step_counters import StepCounters

    run, cfg = _build(compose, cache, tmp_path, "data=sample", "data.validation_fraction=0.5", *EVAL,
                      "train.iterations=12")
    cfg.train.exit_signal_handler = False  # no SIGTERM handler in the test process
    state = GlobalState()
    state.cfg = cfg
    state.train_state.do_valid = True
    timer = StepTimer()
    counters = StepCounters(run, resolve(run), timer.data)
    callback = MetricsCallback(run, resolve(run), counters, timer)
    context = CallbackContext(state=state, model=[], user_state={})
    follows = {}
    for step in range(12):
        state.train_state.step = step
        follows[step] = callback._evaluation_follows(context)
    assert [s for s, f in follows.items() if f] == [4, 9, 11]  # after steps 5 and 10, and after the last (12)

    recorded = read_jsonl(CASES / "tiny_fsdp_ep1_trainable_recompute-none_graph-none_1gpu" / "metrics.jsonl")[4]
    callback.held = recorded
    counters.totals["samples"], counters.sample_ids = 8, [[0, 1]]  # what the evaluation's batches counted
    callback.on_eval_start(context)
    callback.on_eval_end(CallbackContext(state=state, model=[], user_state={},
                                         total_loss_dict={"lm loss": torch.tensor(2.5)}))
    (row,) = read_jsonl(tmp_path / "metrics.jsonl")
    assert row["step"] == recorded["step"] and row["val_lm_loss"] == 2.5 and row["val_s"] >= 0
    assert callback.held is None and counters.totals["samples"] == 0 and counters.sample_ids == []


def test_report_has_the_validation_column_and_plot(tmp_path: Path) -> None:
    """A recorded GPU run (tests/fixtures/gpu_cases) whose rows 4 and 9 carry the val_lm_loss an evaluation would
    add (the values are the test's: no recorded run evaluated yet): report.csv's val_loss is the last one,
    report.md has the validation table and the plot is drawn."""
    from vlmtrain import report
    from vlmtrain.observe.run_summary import read_jsonl

    case = "tiny_fsdp_ep1_trainable_recompute-none_graph-none_1gpu"
    job_dir = add_job(tmp_path / "sweep", 0, case_overrides()[case], CASES / case)
    rows = read_jsonl(job_dir / "metrics.jsonl")
    losses = {4: 3.25, 9: 2.75}
    (job_dir / "metrics.jsonl").write_text("".join(
        json.dumps({**r, **({"val_lm_loss": losses[r["step"]]} if r["step"] in losses else {})}) + "\n"
        for r in rows))
    add_job(tmp_path / "sweep", 1, case_overrides()[case], CASES / case)  # a job that did not validate
    written = report.write_report(tmp_path / "sweep")
    jobs = report.gather(tmp_path / "sweep")
    assert [j.validation for j in jobs if j.validation] == [[(4, 3.25), (9, 2.75)]]
    by_num = {r["num"]: r for r in csv.DictReader(written["csv"].open())}
    assert by_num["0"]["val_loss"] == "2.75" and by_num["1"]["val_loss"] == ""
    md = written["md"].read_text()
    assert "## Validation loss" in md and "| 2 | 4 | 3.2500 | 9 | 2.7500 |" in md
    assert f"![validation]({report.plots.VALIDATION_PLOT})" in md
    assert written["validation"].read_bytes()[:8] == PNG_SIGNATURE
    fig = report.plots.plot_validation_loss(jobs, report.baseline(jobs), tmp_path / "v.png")
    (line,) = fig.axes[0].get_lines()
    assert list(line.get_xdata()) == [4, 9] and list(line.get_ydata()) == [3.25, 2.75]


def test_dry_run_plans_the_validation(dry_run, cache: Path, tmp_path: Path) -> None:
    """train.py's dry run: the plan names the held-out source and schedule, and the Bridge config it writes evaluates
    the validation split; eval_interval without held-out samples stops at preflight (exit 2)."""
    status, printed = dry_run("data.validation_fraction=0.5", *EVAL, f"data.cache_dir={cache}", run_dir=tmp_path / "ok")
    assert status == 0, printed[-3000:]
    assert "validation: data.validation_fraction=0.5, every 5 steps x 2 batches" in printed
    bridge_yaml = (tmp_path / "ok" / "bridge_config.yaml").read_text()
    assert "eval_interval: 5" in bridge_yaml and "do_validation: true" in bridge_yaml
    status, printed = dry_run(*EVAL, run_dir=tmp_path / "refused")
    assert status == 2 and "eval_interval_needs_validation" in printed
