"""`vlmtrain tune` end to end on CPU (vlmtrain.lab.tune.search, with its outputs and the `tune` command's CLI): the
real spec, real candidate generation, real preflight pruning (memory estimate included), the real search with its
state, early stopping, ladder, finalists and outputs; only the GPU runs are a test double: each trial replays a real
recorded 2 x H200 run (tests/fixtures/perf_h200x2/perf_h200x2.jsonl, the rows of results/perf_h200x2.jsonl) of the
configuration it composes to, step by step into its run dir's metrics.jsonl. The packed rows were recorded as
MBS-sample packing; each stands for the capacity case pack-budget mapped its name to. The stops, the budget's words
and the close calls also resume the real state of the H1 search on one H200 (tests/fixtures/tune/h1_state.json),
whose new trials replay the same configuration's other recorded runs."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from vlmtrain.config.compose import compose
from vlmtrain.config.resolve import resolve
from vlmtrain.lab.kit import spec
from vlmtrain.lab.kit.case import Case
from vlmtrain.lab.tune import command, ledger, outputs, search, trials
from vlmtrain.observe import run_summary

ROOT = Path(__file__).resolve().parents[2]
RECORDED = ROOT / "tests" / "fixtures" / "perf_h200x2" / "perf_h200x2.jsonl"
SPEC = ROOT / "tests" / "fixtures" / "tune" / "replay_2xh200.yaml"
H1_STATE = ROOT / "tests" / "fixtures" / "tune" / "h1_state.json"
H1_SPEC = ROOT / "tests" / "fixtures" / "tune" / "h1_1xh200.yaml"
H1_VERSUS = "experiment=perf_h200x2_best gpus_per_node=1 parallelism.ep=1 model.num_layers=4 train.global_batch_size=4"
W2, W8 = (f"3d-ep1_pack12288_mbs1_rc-none_cg-none_auto_kernels-default_bf16_workers{w}" for w in (2, 8))
FAST = "3d-ep1_pack12288_mbs1_rc-none_cg-none_auto_kernels-fast_bf16_workers2"
NOT_CONFIG = ("output_dir", "name", "choices", "dry_run", "wandb", "preflight")


def config_key(overrides: list[str]) -> str:
    """What a run trains (its composed RunConfig), without its length, paths, W&B and preflight settings."""
    run = compose([o for o in overrides if not o.startswith(("train.iterations=", "wandb."))])
    tree = OmegaConf.to_container(OmegaConf.structured(run))
    for k in NOT_CONFIG:
        tree.pop(k, None)
    tree["train"].pop("iterations")
    tree["train"].pop("checkpoint_dir", None)
    return json.dumps(tree, sort_keys=True, default=str)


def as_capacity(config: list[str]) -> list[str]:
    """A row's overrides in today's form: recorded before the auto defaults, with Bridge's kernels and no packing
    named (the spec's base and knob now name them); a packed row (data.packing=true at MBS m, GBS g, recorded before
    packing by token budget) as its case now runs, by the benchmark spec's mbs_as_capacity
    (conf/tune/perf_h200x2.yaml)."""
    config = [*config, "kernels=default", *([] if "data.packing=true" in config else ["data.packing=false"])]
    if "data.packing=true" not in config:
        return config
    rule = spec.load("perf_h200x2").knobs["data.packing"].mbs_as_capacity
    return spec.mbs_as_capacity([o for o in config if not o.startswith("preflight.ignore=")], "data.packing", **rule)


@pytest.fixture(scope="module")
def recordings() -> dict[str, list[dict[str, Any]]]:
    """The recorded runs of every 2 x H200 benchmark configuration, in file order (two machine runs: two rows)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for row in run_summary.read_jsonl(RECORDED):
        if row["name"].startswith("30b-l8_") and "config" in row and not {"superseded", "resummarized"} & row.keys():
            out.setdefault(config_key(as_capacity(row["config"])), []).append(row)
    return out


class ReplayHandle:
    """A trial that writes a recorded run's steps one per poll: its metrics (step_s, useful tokens/s/GPU, MFU,
    peak) per step, then the recorded exit status (a failed row: its steps, then the error line in train.log)."""

    def __init__(self, run_dir: Path, row: dict[str, Any] | None, iterations: int):
        self.run_dir, self.row, self.i, self.stopped = run_dir, row, 0, False
        run_dir.mkdir(parents=True)
        m = row["metrics"] if row else {}
        self.rc = 1 if row is None or row.get("rc") else 0
        n = iterations if not self.rc else m.get("steps_completed", 0)
        keys = ("step_s", "useful_tokens_per_s_per_gpu", "mfu", "peak_mem_gib")
        self.rows = [{"step": s, **{k: m[k] for k in keys if k in m}} for s in range(n)]
        self.wall = row.get("wall_s", 100.0) if row else 20.0
        if self.rc:
            (run_dir / "train.log").write_text(row.get("error", "") + "\n" if row else "no recorded run\n")

    def poll(self) -> int | None:
        if self.stopped:
            return -15
        if self.i < len(self.rows):
            run_summary.append_jsonl(self.run_dir / "metrics.jsonl", self.rows[self.i])
            self.i += 1
            return None
        return self.rc

    def stop(self) -> None:
        self.stopped = True

    def wall_s(self) -> float:
        return self.wall * max(self.i, 1) / max(len(self.rows), 1)


class Replay:
    """The launch of a search: the r-th trial of a configuration replays its r-th recorded run (cyclically)."""

    def __init__(self, recordings: dict[str, list[dict[str, Any]]], crash_after: int | None = None):
        self.recordings, self.crash_after, self.launched, self.count = recordings, crash_after, [], {}

    def __call__(self, trial_dir: Path, case: Case) -> ReplayHandle:
        overrides = case.command_line()
        if self.crash_after is not None and len(self.launched) == self.crash_after:
            raise KeyboardInterrupt("the tune process was killed")
        key = config_key(overrides)
        rows = self.recordings.get(key, [])
        self.count[key] = self.count.get(key, 0) + 1
        self.launched.append(trial_dir.name)
        it = int(next(o for o in overrides if o.startswith("train.iterations=")).split("=")[1])
        return ReplayHandle(trial_dir / trials.RUN_SUBDIR, rows[(self.count[key] - 1) % len(rows)] if rows else None,
                            it)


def new_search(tmp: Path, launch: Replay, **kw: Any) -> search.Search:
    return search.Search(spec.load(SPEC), tmp, "replay", launch, node_gpus=0, gpus=2, poll_s=0.0, **kw)


@pytest.fixture(scope="module")
def searched(recordings: dict[str, list[dict[str, Any]]], tmp_path_factory: pytest.TempPathFactory
             ) -> tuple[dict[str, Any], Replay, Path]:
    tmp = tmp_path_factory.mktemp("tune")
    launch = Replay(recordings)
    return new_search(tmp, launch).run(), launch, tmp


def test_stages_run_in_order_and_prune_with_preflight(searched: tuple[dict[str, Any], Replay, Path]) -> None:
    state, launch, _ = searched
    assert [s["name"] for s in state["stages"]] == [s.name for s in spec.load(SPEC).stages]
    pruned = {s["name"]: {p["name"]: p["findings"] for p in s["pruned"]} for s in state["stages"]}
    rules = {stage: {n: {f.split(":")[0].removeprefix("[error] ") for f in why if f.startswith("[error]")}
                     for n, why in p.items()} for stage, p in pruned.items()}
    # the memory estimate reads the capacity: rows of 8192 tokens fit where MBS 8 x seq_length would not, 16384 not
    batch = rules["batch"]
    assert batch["fsdp-ep2_pack16384_mbs1_rc-none_cg-none"] == {"memory_fits"}
    assert all(batch[f"fsdp-ep2_unpacked_mbs{m}_rc-none_cg-none"] == {"memory_fits"} for m in (4, 8))
    assert batch["fsdp-ep2_unpacked_mbs12_rc-none_cg-none"] == {"memory_fits", "global_batch_divisible"}
    assert len(batch) == 4
    graphs = rules["recompute_graphs"]
    assert graphs["fsdp-ep2_pack8192_mbs1_rc-none_cg-attn_moe_router_preprocess"] == {"packing_with_graphs",
                                                                                       "qwen3_vl_no_attn_graph"}
    assert "deepstack_full_recompute" in graphs["fsdp-ep2_pack8192_mbs1_rc-full_cg-none"]
    # nothing pruned was launched, and the stage order is the order trials ran in
    ran = [t["stage"] for t in state["trials"].values()]
    assert ran == sorted(ran, key=["layout", "batch", "3d", "kernels", "finalists"].index)
    assert not {n for p in pruned.values() for n in p} & {t["name"] for t in state["trials"].values()}
    layout = state["stages"][0]
    assert layout["ran"] == ["fsdp-ep1_unpacked_mbs1_rc-none_cg-none", "fsdp-ep2_unpacked_mbs1_rc-none_cg-none"]
    assert layout["survivors"] == ["fsdp-ep2_unpacked_mbs1_rc-none_cg-none"]  # EP1 has no recorded run: it failed
    assert state["stages"][2]["skipped"].startswith("one candidate")


def test_packed_candidates_count_gbs_in_rows(searched: tuple[dict[str, Any], Replay, Path]) -> None:
    """A capacity runs at MBS 1 with the base's 16 samples as rows of ~1024-token samples (DP 2): 4096 -> 4 rows,
    8192 -> 2, the configurations the recorded packed MBS 4 and MBS 8 runs are now; unpacked MBS keeps GBS 16."""
    state, _, _ = searched
    ran = {t["name"]: compose([*spec.load(SPEC).base, *t["overrides"]]) for t in state["trials"].values()
           if t["stage"] in ("batch", "3d")}
    batch = {n: (r.data.packing, r.train.micro_batch_size, r.train.global_batch_size) for n, r in ran.items()}
    assert batch["fsdp-ep2_pack4096_mbs1_rc-none_cg-none"] == (4096, 1, 4)
    assert batch["fsdp-ep2_pack8192_mbs1_rc-none_cg-none"] == (8192, 1, 2)
    assert batch["3d-ep2_pack8192_mbs1_rc-none_cg-none"] == (8192, 1, 2)
    assert batch["fsdp-ep2_unpacked_mbs2_rc-none_cg-none"] == (False, 2, 16)
    # each replayed its recorded run (none failed for want of one)
    assert all(t["outcome"]["status"] != "failed" for t in state["trials"].values()
               if t["stage"] in ("batch", "3d"))


def test_early_stop_and_ladder(searched: tuple[dict[str, Any], Replay, Path]) -> None:
    state, _, _ = searched
    by_name = {t["name"]: t["outcome"] for t in state["trials"].values() if t["stage"] == "batch"}
    # the capacities climb while they get faster (16384 pruned), then unpacked MBS: MBS 1 is the layout stage's
    # trial again, MBS 2 is judged after its first measured step and stopped, which ends that ladder
    assert state["stages"][1]["ran"] == [f"fsdp-ep2_pack{c}_mbs1_rc-none_cg-none" for c in (4096, 8192)] \
        + [f"fsdp-ep2_unpacked_mbs{m}_rc-none_cg-none" for m in (1, 2)]
    stopped = by_name["fsdp-ep2_unpacked_mbs2_rc-none_cg-none"]
    assert stopped["status"] == "stopped" and stopped["metrics"]["steps"] == run_summary.SKIP + 1
    assert stopped["metrics"]["useful_tokens_per_s_per_gpu"] < 0.8 * state["stages"][1]["best_useful"]
    assert by_name["fsdp-ep2_pack8192_mbs1_rc-none_cg-none"]["status"] == "ok"
    assert state["stages"][1]["best"] == "fsdp-ep2_pack8192_mbs1_rc-none_cg-none"


def test_ranking_by_median_of_finalist_repeats(searched: tuple[dict[str, Any], Replay, Path]) -> None:
    state, _, tmp = searched
    fin = state["finalists"]
    assert [f["name"] for f in fin] == ["3d-ep2_pack8192_mbs1_rc-none_cg-none_cutlass",
                                        "3d-ep2_pack8192_mbs1_rc-none_cg-none_cutlass_fused"]
    assert all(len(f["repeats"]) == 2 and f["median"] == pytest.approx(sum(f["repeats"]) / 2) for f in fin)
    assert state["winner"]["name"] == fin[0]["name"] and fin[0]["median"] > fin[1]["median"]
    gains = {s["name"]: (s.get("before_useful"), s.get("best_useful")) for s in state["stages"]}
    assert gains["3d"][1] > gains["3d"][0] and gains["kernels"][1] > gains["kernels"][0]
    assert state["gpu_min"] == pytest.approx(sum(t["outcome"]["wall_s"] * 2 for t in state["trials"].values()) / 60)
    paths = outputs.write(state, tmp, "vlmtrain tune (replay)", None)
    md = paths["md"].read_text()
    assert "## Stage by stage" in md and "memory_fits" in md and fin[0]["name"] in md and "stopped" in md
    assert "| batch | data.packing, train.micro_batch_size |" in md
    # the kernels stage's two best are 3.6 % apart, within the 4 % assumed before any configuration ran twice: each
    # ran again (its one recorded run, replayed) and the call is decided on the medians; the identical replays then
    # measure no spread, so the medians are no longer within it
    [call] = state["close"]
    assert call["stage"] == "kernels" and call["names"] == [f["name"] for f in fin] and call["measured_from"] == 0
    assert call["spread"] == ledger.SPREAD_PRIOR and call["decided"] == fin[0]["name"]
    assert call["spread_after"] == 0.0 and not call["still_close"]
    assert [len(r) for r in call["runs"]] == [2, 2] and f"{fin[0]['name']} (close call) |" in md
    assert state["spread"] == {"value": 0.0, "configs": 4}  # identical replays: the four names run twice
    assert all(paths[k].stat().st_size > 1000 for k in ("stages", "memory", "throughput"))
    assert len(paths["csv"].read_text().splitlines()) == len(state["trials"]) + 1


def test_resume_runs_no_finished_trial_again(recordings: dict[str, list[dict[str, Any]]],
                                            searched: tuple[dict[str, Any], Replay, Path], tmp_path: Path) -> None:
    state, full, _ = searched
    crashed = Replay(recordings, crash_after=4)
    with pytest.raises(KeyboardInterrupt):
        new_search(tmp_path, crashed).run()
    resumed = Replay(recordings)
    again = new_search(tmp_path, resumed).run()
    assert resumed.launched == full.launched[4:] and not set(resumed.launched) & set(crashed.launched)
    assert again["winner"]["name"] == state["winner"]["name"] and again["trials"].keys() == state["trials"].keys()
    nothing = Replay(recordings)
    assert new_search(tmp_path, nothing).run()["winner"] == again["winner"] and nothing.launched == []
    with pytest.raises(ValueError, match="other overrides"):
        s = spec.load(SPEC)
        s.base.append("train.seq_length=2048")
        search.Search(s, tmp_path, "replay", nothing, 0, 2)


def test_budget_ends_the_stages_and_keeps_room_for_the_finalists(recordings: dict[str, list[dict[str, Any]]],
                                                                 searched: tuple[dict[str, Any], Replay, Path],
                                                                 tmp_path: Path) -> None:
    """At 25 GPU-min (the whole search takes more) the stages end where the next trial would eat into the finalists'
    repeats; the finalists still run both repeats, the winner is their median, and the search stays in the budget.
    The same command again runs nothing, even where the finalists took less than the room held for them (as on the
    GPU, where later trials start faster): their repeats count as spent, so the stages the budget ended stay ended."""
    full, _, _ = searched
    state = new_search(tmp_path, Replay(recordings), budget_gpu_s=25 * 60).run()
    saved = json.loads((tmp_path / ledger.STATE).read_text())
    for t in saved["trials"].values():
        t["outcome"]["wall_s"] *= 0.5 if t["stage"] == "finalists" else 1
    (tmp_path / ledger.STATE).write_text(json.dumps(saved))
    again = Replay(recordings)
    assert new_search(tmp_path, again, budget_gpu_s=25 * 60).run()["trials"].keys() == state["trials"].keys()
    assert again.launched == []
    assert full["search_gpu_min"] > 25 and not state.get("stopped")
    assert [b["stage"] for b in state["budget"]] == ["batch"] and "held for the finalists" in state["budget"][0]["why"]
    assert state["search_gpu_min"] <= 25 and len(state["trials"]) < len(full["trials"])
    assert [len(f["repeats"]) for f in state["finalists"]] == [2, 2]
    stage_best = max(t["outcome"]["metrics"].get("useful_tokens_per_s_per_gpu", 0) for t in state["trials"].values()
                     if t["stage"] not in ("finalists", "compare"))
    assert state["winner"]["screen"] == stage_best and state["winner"]["median"] is not None
    md = outputs.render(state, "vlmtrain tune (replay)", None)
    assert "The budget ended the batch stage" in md
    assert outputs.winner_figure(state) == (state["winner"]["median"], "median of 2 finalist repeat(s)")


def test_preset_composes_and_passes_the_dry_run(searched: tuple[dict[str, Any], Replay, Path], tmp_path: Path,
                                               bridge: object) -> None:
    from vlmtrain.build import plan

    state, _, _ = searched
    base = spec.load(SPEC).base
    path = outputs.write_preset(tmp_path / "experiment" / "tuned.yaml", [*base, *state["winner"]["overrides"]],
                                ["found by the replayed search"])
    text = path.read_text()
    assert text.startswith("# @package _global_\n# python train.py experiment=tuned\n")
    run = compose([f"hydra.searchpath=[file://{tmp_path}]", "experiment=tuned"], output_dir=str(tmp_path / "run"))
    assert config_key([f"hydra.searchpath=[file://{tmp_path}]", "experiment=tuned"]) == config_key(
        [*base, *state["winner"]["overrides"]])
    assert run.parallelism.kind == "3d" and run.data.packing == 8192 and run.train.micro_batch_size == 1
    assert run.train.global_batch_size == 2 and not run.preflight.ignore
    assert run.hardware.env["NVTE_USE_CUTLASS_GROUPED_GEMM"] in (1, "1")
    assert plan.dry_run(run, resolve(run)) == 0


def test_cli_surface() -> None:
    from vlmtrain import cli

    commands = next(a for a in cli.parser()._actions if a.dest == "command").choices
    assert set(commands) == {"report", "profile", "data", "tune", "sweep", "overhead", "export", "wandb", "lab"}
    args = cli.parser().parse_args(["tune", "model=tiny", "--budget-gpu-min", "15", "--versus", "a=1 b=2"])
    assert args.overrides == ["model=tiny"] and args.budget_gpu_min == 15 and args.func is command.run
    assert cli.parser().parse_args(["lab", "tune", "model=tiny"]).func is command.run


def test_first_stage_and_finalists_budget_floor(searched: tuple[dict[str, Any], Replay, Path], tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Before any trial: the layout stage's 2 candidates and the finalists' 2 x 2 repeats, each at least 60 s x 2
    GPUs, need 12 GPU-min; the same command with 8 runs nothing, says so and exits 4, and again the same."""
    from vlmtrain import cli

    state, _, _ = searched
    assert state["least_budget"] == {"stage": "layout", "trials": 2, "candidates": 2, "finalist_trials": 4,
                                     "trial_gpu_s": 120.0, "gpu_s": 720.0}
    argv = ["tune", "hydra/launcher=slurm", "--spec", str(SPEC), "--dir", str(tmp_path), "--preset-dir",
            str(tmp_path / "preset"), "--budget-gpu-min", "8"]
    for _ in range(2):
        assert cli.main(argv) == 4
        out = capsys.readouterr().out
        assert "[tune] nothing ran: --budget-gpu-min 8 cannot hold the first stage and the finalists: the layout " \
               "stage runs at least 2 of its 2 candidates, the finalists 4 repeats" in out
        assert "[tune] next: the same command runs nothing again: give --budget-gpu-min 12 or more" in out
    saved = json.loads((tmp_path / ledger.STATE).read_text())
    assert saved["trials"] == {} and saved["end"]["reason"] == "too_small" and not (tmp_path / "trials").exists()
    assert "**Next**: the same command runs nothing again: give --budget-gpu-min 12 or more." in \
        (tmp_path / "report.md").read_text()


class RecordedRuns:
    """The launch of a search resumed from the real H1 state: a configuration's k-th new trial replays, cyclically,
    its recorded runs after its first (the screening run the state holds): its finalist repeats and comparison runs
    (`final_` and `tune_` name the same configuration); one with no other recorded run fails."""

    def __init__(self, recorded: dict[str, Any]):
        self.runs: dict[str, list[dict[str, Any]]] = {}
        for t in recorded["trials"].values():
            self.runs.setdefault(self.config(t["name"]), []).append(t["outcome"])
        self.launched: list[str] = []
        self.count: dict[str, int] = {}

    @staticmethod
    def config(name: str) -> str:
        return name.removeprefix("final_").removeprefix("tune_")

    def __call__(self, trial_dir: Path, case: Case) -> ReplayHandle:
        overrides = case.command_line()
        name = self.config(trial_dir.name.rsplit("-it", 1)[0])
        k = self.count[name] = self.count.get(name, 0) + 1
        later = self.runs.get(name, [])[1:]
        o = later[(k - 1) % len(later)] if later else None
        self.launched.append(trial_dir.name)
        it = int(next(o for o in overrides if o.startswith("train.iterations=")).split("=")[1])
        return ReplayHandle(trial_dir / trials.RUN_SUBDIR, {"metrics": o["metrics"], "wall_s": o["wall_s"]} if o
                            else None, it)


def h1_dir(tmp: Path) -> tuple[Path, dict[str, Any]]:
    """The recorded H1 state in a tune dir, its base with the defaults it ran under named (as H1_SPEC's base)."""
    recorded = json.loads(H1_STATE.read_text())
    recorded["base"] = spec.load(H1_SPEC).base
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / ledger.STATE).write_text(json.dumps(recorded))
    return tmp, recorded


def test_recorded_search_at_its_budget_has_nothing_left_to_do(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """The real H1 search's command again (28 GPU-min, 25.3 spent): its runs measured a spread of 6.8 % (the median
    over its finalists' and comparison sides' runs), so 8 loader workers, 4.9 % behind 2 on one run each, are a
    close call whose repeats the budget cannot hold, nor a finalist repeat of the kernels winner: nothing runs, the
    words say so, name the budgets that would go on, and it exits 0 with the winner's preset."""
    from vlmtrain import cli

    out_dir, recorded = h1_dir(tmp_path / "tune")
    argv = ["tune", "hydra/launcher=slurm", "--spec", str(H1_SPEC), "--name", "tune_h1", "--dir", str(out_dir),
            "--preset-dir", str(tmp_path / "preset"), "--budget-gpu-min", "28", "--versus", H1_VERSUS]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    state = json.loads((out_dir / ledger.STATE).read_text())
    assert state["trials"].keys() == recorded["trials"].keys()
    assert f"[tune] The budget ended the input stage after 3 of its trial(s): budget: 25.3 of 28 GPU-min spent, the " \
           f"next trial ({W2}) needs ~3.5 and ~6.0 are held for the finalists' repeats; at least 34.9 GPU-min would " \
           "have run it" in out
    assert "[tune] nothing left to do (no trial ran now): done within the budget, which ended the input stage and " \
           "the finalists' repeats\n" in out
    assert "[tune] next: nothing left to do: the same command runs no trial and exits 0; --budget-gpu-min 28.9 or " \
           "more resumes the finalists' repeats, 34.9 or more resumes the input stage" in out
    assert state["spread"] == {"value": pytest.approx(0.0682, abs=1e-4), "configs": 4}
    [call] = state["close"]
    assert call["stage"] == "input" and call["names"] == [W2, W8] and "25.3 of 28 GPU-min spent" in call["cut"]
    assert call["runs"] == [[pytest.approx(11695.4, abs=0.1)], [pytest.approx(11125.5, abs=0.1)]]
    assert state["winner"]["name"] == FAST and state["winner"]["median"] is None
    assert outputs.winner_figure(state)[1].startswith("median of its 3 comparison runs")
    assert (tmp_path / "preset" / "tune_h1.yaml").is_file()
    md = (out_dir / "report.md").read_text()
    assert "**Next**: nothing left to do" in md and "The budget ended the input stage after 3 of its trial(s)" in md
    assert "| input | data.num_workers | 3 | 0 | 3 | " + W2 + " (close call) |" in md


def test_wall_limit_shorter_than_a_trial_exits_4_every_time(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """No budget, --max-wall-min 3: the next trial (the close call's repeat) would take the longest trial's 3.5 min,
    so the same command can never run it: it says so and names 4.5 (the trial and a minute of composing), not a
    silent exit 3 that resumes nothing, each time."""
    from vlmtrain import cli

    out_dir, recorded = h1_dir(tmp_path)
    argv = ["tune", "hydra/launcher=slurm", "--spec", str(H1_SPEC), "--dir", str(out_dir), "--preset-dir",
            str(tmp_path / "preset"), "--max-wall-min", "3"]
    for _ in range(2):
        assert cli.main(argv) == 4
        out = capsys.readouterr().out
        assert f"[tune] stopped: the next trial ({W2}) takes ~3.5 min (the longest so far), longer than " \
               "--max-wall-min 3 itself" in out
        assert "[tune] next: the same command would run nothing: give --max-wall-min 4.5 or more (or leave it out) " \
               "to run the input stage" in out
    assert json.loads((out_dir / ledger.STATE).read_text())["trials"].keys() == recorded["trials"].keys()
    assert not (tmp_path / "preset").exists()


def test_close_call_decided_on_repeats_pause_resume_and_nothing_left(tmp_path: Path) -> None:
    """The H1 search with room: paused at --max-wall-min it names where the same command resumes; resumed at 40
    GPU-min, the input stage's close call runs each side again (their recorded finalist runs) and decides on the
    medians, the kernels winner gets its finalist repeats; the report shows each one's min-max and the call; run
    again, nothing is left, and the call is still reported."""
    out_dir, recorded = h1_dir(tmp_path)
    h1 = spec.load(H1_SPEC)
    paused = RecordedRuns(recorded)
    state = search.Search(h1, out_dir, "tune_h1", paused, 0, 1, max_wall_s=300, versus=H1_VERSUS.split(),
                          poll_s=0.0, started=time.monotonic() - 1e6).run()  # as if the 5 minutes were gone
    assert paused.launched == [] and state["end"]["reason"] == "wall"
    assert state["end"]["next"] == f"the same command resumes at the input stage ({W2})"

    launch = RecordedRuns(recorded)
    state = search.Search(spec.load(H1_SPEC), out_dir, "tune_h1", launch, 0, 1, budget_gpu_s=40 * 60,
                          versus=H1_VERSUS.split(), poll_s=0.0).run()
    assert launch.launched == [f"{W2}-it6-r1", f"{W8}-it6-r1", f"final_{FAST}-it8-r0", f"final_{FAST}-it8-r1"]
    [call] = state["close"]
    first = {n: [o["metrics"]["useful_tokens_per_s_per_gpu"] for o in launch.runs[n][:2]] for n in (W2, W8)}
    assert call["names"] == [W2, W8] and "cut" not in call
    assert call["runs"] == [pytest.approx(first[n]) for n in (W2, W8)]
    assert call["medians"] == [pytest.approx(sum(first[n]) / 2) for n in (W2, W8)] and call["decided"] == W2
    assert call["spread"] == pytest.approx(0.0682, abs=1e-4) and not call["still_close"]
    assert state["stages"][2]["best"] == W2 and state["stages"][2]["best_useful"] == call["medians"][0]
    assert [f["name"] for f in state["finalists"]] == [FAST, W2] and state["winner"]["name"] == FAST
    assert len(state["finalists"][0]["repeats"]) == 2 and state["finalists"][1]["screen"] == call["medians"][0]
    assert state["end"] == {"reason": "done", "why": "done: every stage ran, then the finalists' repeats",
                            "next": "nothing left to do: the same command runs no trial and exits 0", "ran_now": 4}
    md = outputs.render(state, "vlmtrain tune (H1 resumed)", None)
    lo, hi = sorted(first[W2])
    assert f"{W2} {call['medians'][0]:.0f} ({lo:.0f}-{hi:.0f} (2))" in md and "6.8% -> " in md
    assert f"| {W2}-it6-r1 | input | ok | {first[W2][1]:.0f} | {lo:.0f}-{hi:.0f} (2) |" in md

    again = RecordedRuns(recorded)
    state = search.Search(spec.load(H1_SPEC), out_dir, "tune_h1", again, 0, 1, budget_gpu_s=40 * 60,
                          versus=H1_VERSUS.split(), poll_s=0.0).run()
    assert again.launched == [] and state["end"]["why"].startswith("nothing left to do (no trial ran now): done")
    assert [c["names"] for c in state["close"]] == [[W2, W8]] and state["stages"][2]["close"]


def test_ladder_rung_slower_within_the_spread_is_settled_on_repeats(recordings: dict[str, list[dict[str, Any]]],
                                                                   searched: tuple[dict[str, Any], Replay, Path],
                                                                   tmp_path: Path) -> None:
    """The replayed search's screening runs alone (no repeat yet: the 4 % prior), its kernels stage as a ladder
    cutlass -> cutlass+fused -> none: cutlass+fused is 3.6 % slower, within the spread, so both run again before the
    ladder decides; their medians keep cutlass ahead and the ladder stops there (the last rung is not measured)."""
    state, _, _ = searched
    screening = {k: t for k, t in state["trials"].items() if t["repeat"] == 0 and t["stage"] != ledger.FINAL}
    (tmp_path / ledger.STATE).write_text(json.dumps({**state, "trials": screening, "close": []}))
    sp = spec.load(SPEC)
    sp.stages[-1] = dataclasses.replace(sp.stages[-1], grids=[{"kernels": ["cutlass", "cutlass+fused", None]}],
                                        ladder=("kernels",))
    launch = Replay(recordings)
    again = search.Search(sp, tmp_path, "replay", launch, node_gpus=0, gpus=2, poll_s=0.0).run()
    cutlass, fused = (f"3d-ep2_pack8192_mbs1_rc-none_cg-none_{k}" for k in ("cutlass", "cutlass_fused"))
    assert launch.launched[:2] == [f"{cutlass}-it8-r1", f"{fused}-it8-r1"]
    assert again["stages"][-1]["ran"] == [cutlass, fused] and again["stages"][-1]["best"] == cutlass
    [call] = again["close"]
    assert call["stage"] == "kernels" and call["names"] == [cutlass, fused] and call["spread"] == ledger.SPREAD_PRIOR
    assert [len(r) for r in call["runs"]] == [2, 2] and call["decided"] == cutlass
