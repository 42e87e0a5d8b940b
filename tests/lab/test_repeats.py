"""One H200 (benchmark H1, the packing cases): the perf_h200 spec composes to the configurations it
names, `vlmtrain sweep --repeats` runs each case until the machine run has N runs and writes the median row,
per-tower MFU is derived from real run files, vs_bridge_recipe pairs summaries of one machine run, the matmul ceiling
reads the model's shapes. The GPU runs are the only test double: a trial copies a real recorded 1 x H200 run dir of the
30B-A3B shapes at 4 decoder layers (tests/fixtures/precision_h200, from vlmtrain.lab.checks.precision_parity) into its
run dir. Named for vlmtrain.lab.kit.schedule; it also tests lab.sweep_report and lab.micro.ceiling on the perf_h200
spec."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path
from typing import Any

import pytest

from vlmtrain import cli
from vlmtrain.config.compose import compose
from vlmtrain.lab import cases as suites
from vlmtrain.lab import sweep_report, vs_bridge
from vlmtrain.lab.kit import schedule, spec, store
from vlmtrain.lab.kit.case import Case
from vlmtrain.lab.micro import ceiling
from vlmtrain.lab.tune import trials
from vlmtrain.observe import run_summary

ROOT = Path(__file__).resolve().parents[2]
RUNS = sorted((ROOT / "tests" / "fixtures" / "precision_h200").iterdir())
"""Three real 1 x H200 runs (metrics.jsonl with per-component times and FLOPs)."""
RECORDED = ROOT / "tests" / "fixtures" / "perf_h200" / "rows.jsonl"
"""The rows of results/perf_h200.jsonl of the one-H200 machine runs these tests replay (tests/fixtures/README.md)."""
PERF = spec.load("perf_h200")
ENTRY = "vlmtrain sweep perf_h200"
H1_START = ["experiment=perf_h200x2_best", "gpus_per_node=1", "parallelism.ep=1", "model.num_layers=4"]
"""The starting point users tried, but for its GBS (see conf/tune/perf_h200.yaml's `h1`)."""


def composed(overrides: list[str]) -> dict[str, Any]:
    """What a run trains: its composed config, EP as resolved for its world (auto on one GPU is EP 1)."""
    from omegaconf import OmegaConf

    from vlmtrain.config import world

    run = compose(overrides)
    tree = OmegaConf.to_container(OmegaConf.structured(run))
    tree["parallelism"]["ep"] = world.layout(run).ep
    for k in ("output_dir", "name", "choices", "dry_run", "wandb"):
        tree.pop(k, None)
    tree["train"].pop("checkpoint_dir", None)
    return tree


def case_overrides(case: Case) -> list[str]:
    """The command line `vlmtrain sweep perf_h200` runs the case with."""
    return case.plus(f"train.iterations={PERF.get('iterations')}", dry_run=False).command_line()


def test_h1_case_is_the_shipped_best_on_one_gpu() -> None:
    (h1,) = PERF.expand(["h1"])
    assert h1.name.startswith(vs_bridge.H1_PREFIX)
    want = composed([*H1_START, "train.global_batch_size=4", "train.iterations=8", "wandb.enabled=false"])
    got = composed(case_overrides(h1))
    assert got == want
    assert got["data"]["packing"] == 12288 and got["kernels"]["rope"] == "te" and got["vision"]["freeze_vision_model"] \
        is False and got["model"]["num_layers"] == 4 and got["train"]["seq_length"] == 4096


def test_packing_cases_are_issue_22s_suite() -> None:
    """The cases run_cases' perf_h200 suite held (its overrides as of its last commit), now with the spec's length."""
    shape = ["model=qwen3_vl_30b_a3b", "model.num_layers=4", "data=realistic", "train.global_batch_size=8"]
    packed = [*shape, "parallelism=3d", "data.packing=8192", "kernels=default"]
    suite = [["model=tiny", "train.global_batch_size=8", "data=realistic", "data.packing=4096", "kernels=default",
              "parallelism=fsdp"],
             [*packed, "cuda_graph=none"], [*packed, "data.packing_static=true", "cuda_graph=none"],
             [*packed, "data.packing_static=true", "cuda_graph=moe_router_preprocess"]]
    cases = PERF.expand(["packing"])
    assert len(cases) == len(suite)
    for case, old in zip(cases, suite, strict=True):
        assert composed(case_overrides(case)) == composed([*old, "gpus_per_node=1", "train.iterations=8",
                                                           "dry_run=false", "wandb.enabled=false"]), case.name
    assert "perf_h200" not in suites.SUITES  # one mechanism: the spec


class Copied:
    """A trial handle whose run already ended: a recorded run's files copied into its run dir."""

    def __init__(self, run_dir: Path, source: Path | None):
        self.run_dir = run_dir
        if source is not None:
            shutil.copytree(source, run_dir)
        else:
            run_dir.mkdir(parents=True)
            (run_dir / "train.log").write_text("torch.OutOfMemoryError: CUDA out of memory\n")
        self.rc = 0 if source is not None else 1

    def poll(self) -> int:
        return self.rc

    def stop(self) -> None:
        raise AssertionError("no early stopping in a sweep")

    def wall_s(self) -> float:
        return 60.0


class Gpu:
    """The GPU stand-in: the k-th trial copies RUNS[k % 3] into its run dir, or fails if k is in `fail`."""

    def __init__(self) -> None:
        self.launched: list[Path] = []
        self.fail: set[int] = set()

    def __call__(self, trial_dir: Path, case: Case) -> Copied:
        k = len(self.launched)
        self.launched.append(trial_dir)
        return Copied(trial_dir / trials.RUN_SUBDIR, None if k in self.fail else RUNS[k % len(RUNS)])


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> Gpu:
    from vlmtrain.config import world

    launch = Gpu()
    monkeypatch.setattr(trials, "sweep_process", launch)
    monkeypatch.setattr(world, "local_gpus", lambda: 1)
    return launch


def run_sweep(path: Path, out: Path, *argv: str) -> int:
    return cli.main(["sweep", "perf_h200", "--results", str(path), "--out", str(out), *argv])


def test_repeats_summary_and_resume(gpu: Gpu, tmp_path: Path) -> None:
    path, machine_run = tmp_path / "perf_h200.jsonl", store.machine_run()
    (h1,) = PERF.expand(["h1"])
    assert run_sweep(path, tmp_path / "a", "--sweep", "h1") == 0
    assert [p.name for p in gpu.launched] == ["run0", "run1", "run2"]
    assert all(p.parent.name == h1.name for p in gpu.launched)
    rows = store.read(path)
    runs = [r for r in rows if r["name"] == h1.name]
    assert [(r["run"], r["machine_run"]) for r in runs] == [(0, machine_run), (1, machine_run), (2, machine_run)]
    for r, src in zip(runs, RUNS, strict=True):  # each run row is its own run files' summary
        assert r["metrics"] == run_summary.summarize(src, keys=run_summary.SUMMARY_KEYS)
    (summary,) = [r for r in rows if r["name"] == h1.name + schedule.SUMMARY_SUFFIX]
    m = summary["metrics"]
    assert m["runs"] == 3 and summary["machine_run"] == machine_run and summary["case"] == h1.name
    for key in schedule.KEYS:
        values = [r["metrics"][key] for r in runs]
        assert (m[key], m[f"{key}_min"], m[f"{key}_max"]) == (statistics.median(values), min(values), max(values))
    assert len({r["metrics"]["useful_tokens_per_s_per_gpu"] for r in runs}) == 3  # a median of distinct runs

    # the same machine run again: nothing to run, nothing written; run dirs of the first call are still there
    assert run_sweep(path, tmp_path / "b", "--sweep", "h1") == 0
    assert len(gpu.launched) == 3 and len(store.read(path)) == len(rows)
    assert all((p / trials.RUN_SUBDIR / "metrics.jsonl").exists() for p in gpu.launched)
    # one more run per case asked for: only the missing one runs, then a 4-run summary
    assert run_sweep(path, tmp_path / "c", "--sweep", "h1", "--repeats", "4") == 0
    assert [p.name for p in gpu.launched[3:]] == ["run3"]
    four = store.read(path)[-1]["metrics"]
    assert four["runs"] == 4
    # the report, from the results file alone: the latest summary of the machine run, median (min-max)
    assert run_sweep(path, tmp_path / "d", "--report") == 0
    md = path.with_suffix(".md").read_text()
    u = schedule.USEFUL
    assert f"| {h1.name} | {machine_run} | 4 | {four[u]:.0f} ({four[u + '_min']:.0f}-{four[u + '_max']:.0f}) |" in md
    assert f"| {h1.name} | {machine_run} | 3 |" not in md  # the 4-run summary replaced the 3-run one
    (single,) = [line for line in md.splitlines() if line.startswith(f"| {h1.name} | ") and machine_run not in line]
    assert single.endswith(f"| {sweep_report.REPEATED_NOTE} |")  # a lone run's figures say they are one run


def test_a_failed_run_is_not_counted_nor_repeated(gpu: Gpu, tmp_path: Path) -> None:
    path = tmp_path / "perf_h200.jsonl"
    gpu.fail.add(1)
    assert run_sweep(path, tmp_path / "a", "--sweep", "h1") == 1
    assert len(gpu.launched) == 2  # run 1 failed: run 2 of that case did not start in this call
    (h1,) = PERF.expand(["h1"])
    assert schedule.done(path, h1.name, store.machine_run()) == 1
    assert not any(r["name"].endswith(schedule.SUMMARY_SUFFIX) for r in store.read(path))
    assert run_sweep(path, tmp_path / "b", "--sweep", "h1") == 0  # resumes: runs 1 and 2, then the summary
    assert [p.name for p in gpu.launched[2:]] == ["run1", "run2"]
    assert store.read(path)[-1]["metrics"]["runs"] == 3


def test_runs_alternate_between_cases_and_resume_where_each_stopped(gpu: Gpu, tmp_path: Path) -> None:
    path, names = tmp_path / "perf_h200.jsonl", [c.name for c in PERF.expand(["packing"], ["static"])]
    assert len(names) == 2
    assert run_sweep(path, tmp_path / "a", "--sweep", "packing", "--only", "static", "--repeats", "2") == 0
    assert [(p.parent.name, p.name) for p in gpu.launched] == [
        (names[0], "run0"), (names[1], "run0"), (names[0], "run1"), (names[1], "run1")]
    assert run_sweep(path, tmp_path / "b", "--sweep", "packing", "--only", names[1], "--repeats", "3") == 0
    assert run_sweep(path, tmp_path / "c", "--sweep", "packing", "--only", "static", "--repeats", "3") == 0
    # names[1] already has 3 runs: only names[0]'s third run is left
    assert [(p.parent.name, p.name) for p in gpu.launched[4:]] == [(names[1], "run2"), (names[0], "run2")]


def test_tower_mfu_from_real_run_files() -> None:
    """mfu_<tower> = the tower's FLOPs over its timed seconds at the H200's peak (1 GPU), over the steady steps."""
    peak = compose(["hardware=h200"]).hardware.peak_bf16_tflops * 1e12
    for run_dir in RUNS:
        steady = run_summary.steady(run_summary.read_jsonl(run_dir / "metrics.jsonl"))
        s = run_summary.summarize(run_dir)
        for tower, span in run_summary.TOWERS.items():
            want = sum(r[f"flops_{tower}"] for r in steady) / sum(r[span] for r in steady) / peak
            assert s[f"mfu_{tower}"] == pytest.approx(want, rel=1e-9), (run_dir.name, tower)
        assert 0 < s["mfu_vit"] < 1 and 0 < s["mfu_decoder"] < 1
    assert run_summary.tower_mfu([{"step_s": 1.0, "mfu": 0.1, "flops": 1e12}]) == {}  # no tower times: none derived


def summarize(path: Path, name: str, machine_run: str) -> dict[str, Any] | None:
    """The summary row a schedule writes after a case's last run, with the peer ratio after it."""
    return schedule.summary(path, name, machine_run, "cmd", vs_bridge.after_summary(path, machine_run, "cmd"))


def test_vs_bridge_recipe_pairs_one_machine_run(tmp_path: Path) -> None:
    """Run rows from real run files for both sides; the ratio of their medians appears once both summaries exist."""
    path, machine_run, other = tmp_path / "perf_h200.jsonl", "boot-aaaa", "boot-bbbb"
    h1 = PERF.expand(["h1"])[0].name
    for i, run_dir in enumerate(RUNS):
        store.append(path, vs_bridge.BRIDGE_RECIPE, "python -m vlmtrain.lab.bridge_recipe",
                       run_summary.summarize(run_dir, keys=run_summary.SUMMARY_KEYS), machine_run=machine_run, run=i)
    store.append(path, h1, "python train.py ...", run_summary.summarize(RUNS[0], keys=run_summary.SUMMARY_KEYS),
                   machine_run=other, run=0)
    assert summarize(path, vs_bridge.BRIDGE_RECIPE, machine_run) is not None
    assert summarize(path, h1, other) is not None
    # the vlmtrain side ran on another machine run
    assert vs_bridge.vs_bridge(store.read(path), machine_run) is None
    assert not any(r["name"].startswith("vs-bridge-recipe_") for r in store.read(path))
    store.append(path, h1, "python train.py ...", run_summary.summarize(RUNS[1], keys=run_summary.SUMMARY_KEYS),
                   machine_run=machine_run, run=0)
    summarize(path, h1, machine_run)
    row = store.read(path)[-1]
    assert row["name"] == f"vs-bridge-recipe_{machine_run}" and row["machine_run"] == machine_run
    ours = run_summary.summarize(RUNS[1])["useful_tokens_per_s_per_gpu"]
    theirs = statistics.median(run_summary.summarize(d)["useful_tokens_per_s_per_gpu"] for d in RUNS)
    assert row["metrics"]["vs_bridge_recipe"] == pytest.approx(ours / theirs)
    assert row["metrics"]["vlmtrain_case"] == h1 and row["metrics"]["bridge_recipe_runs"] == 3
    assert schedule.done(path, h1, machine_run) == 1 and schedule.done(path, h1, "boot-cccc") == 0
    # a frozen-vision case, faster than h1 here, is reported apart: the peer trains every tower
    (frozen,) = PERF.expand(["h1_frozen"])
    faster = run_summary.summarize(RUNS[0], keys=run_summary.SUMMARY_KEYS)
    assert faster["useful_tokens_per_s_per_gpu"] > ours and "vision=frozen" in case_overrides(frozen)
    store.append(path, frozen.name, "python train.py ...", faster, machine_run=machine_run, run=0,
                 config=case_overrides(frozen))
    summarize(path, frozen.name, machine_run)
    assert store.read(path)[-1]["metrics"]["vlmtrain_case"] == h1


def test_ceiling_shapes_come_from_the_model_config(capsys: pytest.CaptureFixture[str]) -> None:
    gemms, source = ceiling.h1_shapes()
    m = compose(["model=qwen3_vl_30b_a3b"]).model
    by = {g.name: g for g in gemms}
    t = source["tokens_per_micro_batch"]
    assert t == compose([*H1_START, "train.global_batch_size=4"]).data.packing == 12288
    assert (by["vit_fc1"].k, by["vit_fc1"].n, by["vit_fc2"].k) == (m.vit.hidden_size, m.vit.intermediate_size,
                                                                    m.vit.intermediate_size) == (1152, 4304, 4304)
    assert by["decoder_qkv"].n == (m.num_attention_heads + 2 * m.num_query_groups) * m.head_dim
    assert by["experts_fc1_batched"].batch == m.num_experts and by["expert_fc1"].m == t * m.moe_topk // m.num_experts
    assert by["square_8192"].flops == 2 * 8192**3 and source["peak_bf16_tflops"] == 989.0
    assert {g.tower for g in gemms} == {None, "vit", "projector", "decoder"}
    assert cli.main(["lab", "ceiling", "--list"]) == 0 and "experts_fc2_batched" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="2"):  # fewer than 3 repeats: refused at parse time
        cli.main(["lab", "ceiling", "--repeats", "2", "--list"])


def test_towers_vs_ceiling_describes_the_best_full_training_case() -> None:
    """Replayed from the rows one H200 machine run recorded (ceiling rows, H1 summaries with and without frozen
    vision): each tower's rate is its MFU x peak over its own GEMMs' measured rate, for the fastest case that trains
    every tower."""
    rows, machine_run, peak = store.read(RECORDED), "boot-0eb4da4d", 989.0
    cases = schedule.summaries(rows, machine_run)
    frozen = [n for n, r in cases.items() if not vs_bridge.trains_every_tower(r)]
    best, summary = vs_bridge.best_h1(rows, machine_run)
    assert frozen and all(cases[n]["metrics"][schedule.USEFUL] > summary["metrics"][schedule.USEFUL] for n in frozen)
    m = ceiling.towers_vs_ceiling(rows, machine_run, peak)
    assert m is not None and m["case"] == best not in frozen
    for tower, ceil in ceiling.tower_ceilings(rows, machine_run).items():
        assert m[f"{tower}_tflops_per_s"] == pytest.approx(summary["metrics"][f"mfu_{tower}"] * peak)
        assert m[f"{tower}_fraction_of_gemm_ceiling"] == pytest.approx(m[f"{tower}_tflops_per_s"] / ceil)
        assert 0 < m[f"{tower}_fraction_of_gemm_ceiling"] < 1
    assert ceiling.towers_vs_ceiling(rows, "boot-none", peak) is None


def test_report_pairs_claims_and_ranks_cases_within_one_machine_run(tmp_path: Path) -> None:
    """From the recorded one-H200 rows: a claim is the ratio of its two cases' medians on the latest machine run both
    ran on (h1 also ran alone on other machine runs, whose figures differ by more than the claims do); frozen-vision
    summaries stand in their own table; a claim whose sides never shared a machine run says so."""
    path = RECORDED
    rows = store.read(path)
    md = sweep_report.report(PERF, path, f"{ENTRY} --report")
    h1, both, timing0 = (PERF.case(c).name for c in (
        {"experiment": "perf_h200x2_best", "layout": "3d-ep1", "data.packing": 12288, "train.global_batch_size": 4},
        {"experiment": "perf_h200x2_best", "layout": "3d-ep1", "data.packing": 12288, "train.global_batch_size": 4,
         "syncs": "host-grid+timing0"},
        {"experiment": "perf_h200x2_best", "layout": "3d-ep1", "data.packing": 12288, "train.global_batch_size": 4,
         "syncs": "timing0"}))

    def median(name: str, machine_run: str) -> float:
        return statistics.median(r["metrics"][schedule.USEFUL] for r in schedule.runs(rows, name, machine_run))

    for what, a, machine_run in (("ViT grid on the host and timing level 0", both, "boot-2b3014ae"),
                                 ("timing level 0", timing0, "boot-0eb4da4d")):
        line = next(x for x in md.splitlines() if x.startswith(f"| {what} |"))
        assert line.split(" | ")[1] == f"{median(a, machine_run) / median(h1, machine_run):.2f}", line
    assert median(h1, "boot-b64c7526") / median(h1, "boot-0eb4da4d") > 1.1  # what a pair across machine runs carries
    full, frozen = md.split("## Repeated cases, frozen vision")
    assert "vision-frozen" not in full.split("## Repeated cases, full training")[1]
    assert "vision-frozen" in frozen.split("\n\n- ")[0]
    apart = (h1, h1 + schedule.SUMMARY_SUFFIX)  # h1 left only on machine runs the host-grid + timing0 case skipped
    moved = [r for r in rows if not (r["name"] in apart and r.get("machine_run") == "boot-2b3014ae")]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in moved))
    line = next(x for x in sweep_report.report(PERF, tmp_path / "p.jsonl", ENTRY).splitlines()
                if x.startswith("| ViT grid on the host and timing level 0 |"))
    assert "not measured on one machine run" in line
