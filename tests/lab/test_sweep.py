"""The 2 x H200 benchmarks on CPU: every case of the declarative spec conf/tune/perf_h200x2.yaml expands and passes
preflight as train.py would compose it, rows are assembled from real GPU run files, and the report is produced from
the results file alone (the overhead measurement: test_overhead.py). Named for vlmtrain.lab.sweep; it also tests
lab.kit.spec, lab.kit.case, lab.kit.store and lab.sweep_report on that spec."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vlmtrain.check import preflight
from vlmtrain.config import world
from vlmtrain.config.compose import compose
from vlmtrain.config.resolve import resolve
from vlmtrain.lab import sweep, sweep_report
from vlmtrain.lab.kit import spec, store
from vlmtrain.lab.kit.case import Case

ROOT = Path(__file__).resolve().parents[2]

GPU_CASES = ROOT / "tests" / "fixtures" / "gpu_cases"
FSDP_EP2 = GPU_CASES / "30b-shape-l4_fsdp_ep2_trainable_recompute-none_graph-none_2gpu"
THREE_D_EP2 = GPU_CASES / "30b-shape-l4_3d_ep2_trainable_recompute-none_graph-none_2gpu"
PERF = spec.load("perf_h200x2")
GPUS, ITERATIONS = PERF.get("gpus"), PERF.get("iterations")
GBS = PERF.defaults["train.global_batch_size"]
B, BEST = PERF.case({}), PERF.case(PERF.get("best"))
BEST_VALUES = PERF.values(PERF.get("best"))
ALL = list({PERF.name_of(e): (PERF.case(e, ITERATIONS).plus(dry_run=False), PERF.values(e))
            for name in PERF.get("sweeps") for e in PERF.entries(name)}.values())
"""(case as the sweep runs it, the knob values it was made from), every case once."""
MEASURED = ROOT / "tests" / "fixtures" / "perf_h200x2" / "perf_h200x2.jsonl"
"""results/perf_h200x2.jsonl as of the last sweep, copied (tests/fixtures/README.md): the rows the claims rest on."""
BENCHMARK = ["model=qwen3_vl_30b_a3b", "model.num_layers=8", "train.seq_length=4096", "hardware=h200"]
ENTRY = "vlmtrain sweep perf_h200x2"


def perf_main(*argv: str) -> int:
    """vlmtrain sweep perf_h200x2's command line (`vlmtrain sweep perf_h200x2 ...`)."""
    from vlmtrain import cli

    return cli.main(["sweep", "perf_h200x2", *argv])


def expand(sweeps: list[str], only: list[str] | None = None) -> list[Case]:
    return [c.plus(dry_run=False) for c in PERF.expand(sweeps, only, ITERATIONS)]


def composed(case: Case) -> object:
    return compose(case.plus(dry_run=True).command_line())


def test_sweeps_expand_to_unique_benchmark_cases() -> None:
    assert {c.name for c in PERF.expand(["mbs"])} <= {c.name for c, _ in ALL}
    assert [c.name for c in PERF.expand(["all"])] == [c.name for c, _ in ALL]
    assert len({c.name for c, _ in ALL}) == len(ALL) == 32
    for name in PERF.get("sweeps"):
        assert len(PERF.expand([name])) == len(PERF.entries(name)) >= 2, name
    for case, k in ALL:
        assert case.gpus == 2 and all(o in case.overrides for o in BENCHMARK), case.name
        assert ("frozen" in case.name) == (k["vision"] == "frozen"), case.name
        gbs, mbs, packed = (k[key] for key in ("train.global_batch_size", "train.micro_batch_size",
                                                       "data.packing"))
        assert (f"_gbs{gbs}" in case.name) == (gbs != GBS) and (f"_mbs{mbs}_" in case.name), case.name
        # a packed case of MBS m runs one row of max(m x 1024, 4096) tokens per micro-batch, MBS 1, GBS / m rows
        runs = (f"data.packing={max(mbs * 1024, 4096)}", 1, gbs // mbs) if packed else ("data.packing=false", mbs, gbs)
        assert [o for o in case.overrides if o.startswith("data.packing")] == [runs[0]], case.name
        assert {f"train.micro_batch_size={runs[1]}", f"train.global_batch_size={runs[2]}"} <= set(case.overrides)
        assert not any(o.startswith("preflight.ignore") for o in case.overrides), case.name  # the estimate fits
    assert [c.name for c in expand(["all"], ["mock"])] == [PERF.case({"data": "mock"}).name]


def legacy_as_run(config: list[str]) -> list[str]:
    """A row recorded before packing by token budget (m samples packed per micro-batch: data.packing=true, from
    MBS 4 on with preflight.ignore=[memory_fits]) as the capacity form its case now runs as; and recorded before the
    auto defaults, when Bridge's kernels and no packing needed no override (the spec now names them)."""
    config = [*config, "kernels=default", *([] if "data.packing=true" in config else ["data.packing=false"])]
    if "data.packing=true" not in config:
        return config
    kept = [o for o in config if o != "preflight.ignore=[memory_fits]"]
    return spec.mbs_as_capacity(kept, "data.packing", **PERF.knobs["data.packing"].mbs_as_capacity)


def test_cases_are_the_recorded_rows_configs() -> None:
    """Every case that ran on 2 x H200 composes from exactly the overrides its latest row records; a packed row
    recorded MBS-sample packing, and its case runs that row's MBS as a capacity under the same name."""
    rows = sweep_report.latest_rows(MEASURED)
    matched, packed = 0, 0
    for case, _ in ALL:
        row = rows.get(case.name)
        if row and "config" in row:
            assert sorted(case.command_line()) == sorted(legacy_as_run(row["config"])), case.name
            matched += 1
            packed += "data.packing=true" in row["config"]
    assert matched >= 25 and packed >= 10
    # the smallest packed case (MBS 2: the 4096-token floor) and the preset's case (perf_h200x2_best.yaml)
    forms = {c.name: {o for o in c.overrides if o.startswith(("data.packing", "train.micro", "train.global"))}
             for c, _ in ALL}
    assert forms[PERF.case({"train.micro_batch_size": 2, "data.packing": True}).name] == {
        "data.packing=4096", "train.micro_batch_size=1", "train.global_batch_size=8"}
    assert forms[BEST.name] == {"data.packing=12288", "train.micro_batch_size=1", "train.global_batch_size=8"}


@pytest.mark.parametrize(("case", "knobs"), ALL, ids=[c.name for c, _ in ALL])
def test_every_case_passes_preflight(case: Case, knobs: dict) -> None:
    """Packed cases run as capacities that the memory estimate reads: beyond the preset's 12288 tokens (MBS 16,
    which ran out of memory on the GPU as MBS-sample packing) it refuses them."""
    run = composed(case)
    refused = [f.rule for f in preflight.errors(preflight.check(run, resolve(run)))]
    too_big = knobs["data.packing"] and run.data.packing > 12288
    assert refused == (["memory_fits"] if too_big else [])
    assert world.layout(run).world_size == 2 and run.train.seq_length == 4096 and run.model.num_layers == 8


def test_mbs_sweep_changes_only_grad_accum() -> None:
    runs = [composed(c) for c in expand(["mbs"])]
    assert [(r.parallelism.kind, r.train.micro_batch_size) for r in runs] == [("fsdp", 1), ("fsdp", 2), ("3d", 1),
                                                                                 ("3d", 2)]
    assert {r.train.global_batch_size for r in runs} == {GBS}
    assert [r.train.global_batch_size // (r.train.micro_batch_size * world.layout(r).dp) for r in runs] == [8, 4] * 2
    assert {r.recompute.granularity for r in runs} == {"none"} and not any(r.vision.freeze_vision_model for r in runs)


def test_best_case_ships_as_the_preset(bridge: object, tmp_path: Path) -> None:
    """conf/experiment/perf_h200x2_best.yaml trains what the fastest measured case trained: the same Bridge
    ConfigContainer and rank environment (the case spells kernels=fast as the raw overrides it ran with), and the
    same vlmtrain settings Bridge never sees (data payload, preflight)."""
    from omegaconf import OmegaConf

    from vlmtrain.build import container
    from vlmtrain.config import redact
    from vlmtrain.train import bridge_patches

    case = PERF.case(PERF.get("best"), ITERATIONS)
    preset = compose(["experiment=perf_h200x2_best", f"train.iterations={ITERATIONS}", "dry_run=true",
                      "wandb.enabled=false"], output_dir=str(tmp_path))
    ran = compose(case.plus(dry_run=True).command_line(), output_dir=str(tmp_path))
    assert preset.choices.pop("experiment") == "perf_h200x2_best" and preset.choices.pop("kernels") == "fast"
    assert ran.choices.pop("kernels") == "default"
    assert resolve(preset).env_vars == resolve(ran).env_vars
    # Bridge's own serialization of both containers. transformers fills model_type / transformers_version of the HF
    # sub-configs on first use in a process, so only the second build has them: they are not settings
    texts = []
    for name, run in (("preset", preset), ("ran", ran)):
        redact.write_bridge_yaml(container.build(run, resolve(run)), tmp_path / f"{name}.yaml")
        texts.append([line for line in (tmp_path / f"{name}.yaml").read_text().splitlines()
                      if not line.lstrip().startswith(("model_type:", "transformers_version:"))])
    assert texts[0] == texts[1] and len(texts[0]) > 500

    def elsewhere(run: object) -> dict:
        return {k: v for k, v in OmegaConf.to_container(OmegaConf.structured(run)).items()
                if k not in ("kernels", "hardware", "bridge")}

    assert elsewhere(preset) == elsewhere(ran)
    # the fast paths are no Bridge fields: bridge_patches.install() puts them in place in the training process
    installed = ("rope", "vit_positions", "pin_visual_inputs")
    assert [getattr(preset.kernels, f) for f in installed] == [getattr(ran.kernels, f) for f in installed]
    try:  # kernels=fast gained a loader-only replacement after the case ran: the same batches, less loader CPU
        shipped = bridge_patches.install(preset)
        assert [n for n in shipped if n not in bridge_patches.SAME_BATCHES] == bridge_patches.install(ran) != []
        assert "mask_grid_only" in shipped
    finally:
        bridge_patches.uninstall()
    assert preset.hardware.env == {k: v for k, v in ran.hardware.env.items() if k != "NVTE_USE_CUTLASS_GROUPED_GEMM"}
    rows = sweep_report.latest_rows(MEASURED)
    full = {n: r["metrics"]["useful_tokens_per_s_per_gpu"] for n, r in rows.items()
            if n.startswith("30b-l8_") and "_trainable_" in n and "_realistic" in n
            and "useful_tokens_per_s_per_gpu" in r["metrics"]}
    # the fastest row, or within TIE of it: then every faster case is BEST at a larger GBS
    best = full[BEST.name]
    assert best >= (1 - PERF.get("tie")) * max(full.values())
    faster = [k for c, k in ALL if full.get(c.name, 0.0) > best]
    bgbs = BEST_VALUES["train.global_batch_size"]
    assert all({**k, "train.global_batch_size": bgbs} == BEST_VALUES and k["train.global_batch_size"] > bgbs
               for k in faster)


def test_parallelism_cases_do_equal_useful_work() -> None:
    runs = [composed(c) for c in expand(["parallelism"])]
    assert [(world.layout(r).tp, world.layout(r).ep) for r in runs] == [(1, 2), (1, 2), (2, 2), (1, 1)]
    assert [r.parallelism.kind for r in runs] == ["fsdp", "3d", "3d", "fsdp"]
    same = {(r.data.kind, r.data.payload.seed, r.train.global_batch_size, r.train.seq_length, r.train.iterations,
             r.train.micro_batch_size, r.vision.freeze_vision_model) for r in runs}
    assert len(same) == 1


def test_cli_lists_and_rejects_unknown_sweeps(capsys: pytest.CaptureFixture[str]) -> None:
    assert perf_main("--sweep", "frozen", "mock", "--list") == 0
    out = capsys.readouterr().out
    assert PERF.name_of({"vision": "frozen"}) in out and "EP2 DP2" in out
    assert perf_main("--sweep", "nope", "--list") == 2  # one message naming the sweeps there are, no traceback
    assert "vlmtrain sweep: perf_h200x2: no sweep 'nope' (sweeps: " in capsys.readouterr().err
    assert perf_main("--list") == 2 and "--sweep is required" in capsys.readouterr().err


def test_row_from_real_run_files(tmp_path: Path) -> None:
    case, _ = ALL[0]
    path = tmp_path / "perf.jsonl"
    row = store.record(case, 0, FSDP_EP2, 120.0, path, config=case.command_line())
    assert row is not None and json.loads(path.read_text()) == row
    assert {"useful_tokens_per_s_per_gpu", "mfu", "step_s", "peak_mem_gib"} <= set(row["metrics"])
    # with vlmtrain.observe.timing's component times in the run files, the split rides along (the report shows it)
    timed = store.record(case, 0, ROOT / "tests" / "fixtures" / "gpu_runs" / "tiny_fsdp_ep1_wandb_timing", 60.0,
                         tmp_path / "timed.jsonl")
    assert 0 < timed["metrics"]["time_vision_s"] + timed["metrics"]["time_decoder_s"] < timed["metrics"]["step_s"]
    assert "time_vision_s" not in row["metrics"]  # these older run files predate the timers
    assert row["config"] == case.command_line() and "dry_run=false" in row["config"]
    assert row["command"] == "python train.py " + " ".join(row["config"])
    assert store.record(case, 1, FSDP_EP2, 1.0, path) is None and len(path.read_text().splitlines()) == 1


def test_real_vs_mock_row_and_skip_done(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Rows of an earlier session count: the ratio row pairs them with this session's, --skip-done leaves them out."""
    real, mock = expand(["mock"])
    cmd = f"{ENTRY} --sweep mock"
    path = tmp_path / "perf.jsonl"
    store.record(real, 0, THREE_D_EP2, 80.0, path, config=real.command_line())
    assert sweep.mock_ratio_row(PERF, {mock.name}, path, cmd) is None  # no mock row yet
    store.record(mock, 0, FSDP_EP2, 120.0, path, config=mock.command_line())
    assert sweep.mock_ratio_row(PERF, set(), path, cmd) is None  # neither side ran in this invocation
    row = sweep.mock_ratio_row(PERF, {mock.name}, path, cmd)
    assert row is not None and row["config"] == {"real": real.command_line(), "mock": mock.command_line()}
    assert row["metrics"]["real_over_mock_step_s"] < 1  # the 3D run files stand in for "real": faster steps
    capsys.readouterr()
    assert perf_main("--sweep", "mock", "frozen", "--skip-done", "--list", "--results", str(path)) == 0
    out = capsys.readouterr().out
    assert "5 case(s)" in out and "frozen" in out and mock.name not in out  # the frozen sweep has 6, 1 done

    # A failed row or a superseded one does not count as done: the case runs again.

    frozen = expand(["frozen"], ["frozen"])[0]
    store.append(path, mock.name, "python train.py ...", {}, rc=1)
    store.append(path, frozen.name, "python train.py ...", {"step_s": 1.0}, superseded="measured something else")
    assert set(sweep_report.latest_rows(path)) == {real.name, mock.name, row["name"]}
    assert perf_main("--sweep", "mock", "frozen", "--skip-done", "--list", "--results", str(path)) == 0
    out = capsys.readouterr().out
    assert "6 case(s)" in out and mock.name in out and frozen.name in out


def test_report_states_every_claim_from_the_results_file(tmp_path: Path) -> None:
    """Each claim is a ratio of two measured rows, or says which row is missing; failed runs are listed."""
    md = sweep_report.report(PERF, MEASURED, f"{ENTRY} --report")
    # the report the recorded rows shipped with (results/perf_h200x2.md, copied) is produced again, byte for byte
    assert md == (MEASURED.parent / "report.md").read_text()
    assert len(sweep_report.claims(PERF)) == 26
    for what, _, _ in sweep_report.claims(PERF):
        line = next(x for x in md.splitlines() if x.startswith(f"| {what}"))
        assert "not measured" not in line, line  # every claim was measured on 2 x H200
    # a claim whose row kept medians of per-step rates (its run files are lost) says so
    assert "| frozen vision gain, 3D EP2 MBS 4 packed (one side's rates are medians of per-step rates) |" in md
    assert "- failed: 30b-l8_3d-ep2_mbs4_trainable_rc-full" in md and "overhead_ratio" in md
    # a profiled overhead pair states both sides' traced step; a row's note travels with its line
    traced = next(x for x in md.splitlines() if x.startswith("- overhead_ratio") and "+train.profile_step=" in x)
    assert "traced step, vlmtrain / direct: window" in traced
    noted = [r for n, r in sweep_report.latest_rows(MEASURED).items() if n.startswith("overhead_") and r.get("note")]
    assert noted and all(f"({r['note']})" in md for r in noted)
    # frozen-vision rows stand in their own table, never ranked among full-training rows
    full, frozen = md.split("## Frozen vision")[0], md.split("## Frozen vision")[1].split("## The spec")[0]
    assert "_frozen_" not in full and "_trainable_" not in frozen
    assert frozen.count("_frozen_") == sum("_frozen_" in n for n in sweep_report.latest_rows(MEASURED)) > 0
    rows = [r for r in sweep_report.latest_rows(MEASURED).values() if r["name"] != B.name]
    path = tmp_path / "perf.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    line = next(x for x in sweep_report.report(PERF, path, ENTRY).splitlines()
                if x.startswith("| 3D vs FSDP, EP2 MBS 1 |"))
    assert f"not measured: {B.name}" in line
