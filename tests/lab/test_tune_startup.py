"""What a tune trial's GPU time goes to, and what the tune command does about it, on CPU: the startup spans
(vlmtrain.observe.startup) against the measured steps, from the recorded H1 search (tests/fixtures/tune/h1_state.json,
the state.json of `results/tune_h200/`) and a recorded run's metrics.jsonl; the search's results row; the hand side
of its comparison; the one cache dir every trial shares."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from vlmtrain.config.groups import model
from vlmtrain.config.groups.kernels import cache_root
from vlmtrain.lab.kit import spec
from vlmtrain.lab.kit.case import Case
from vlmtrain.lab.tune import command, outputs, space, trials
from vlmtrain.observe import run_summary

ROOT = Path(__file__).resolve().parents[2]
STATE = ROOT / "tests" / "fixtures" / "tune" / "h1_state.json"
RUN = ROOT / "tests" / "fixtures" / "precision_h200" / "bf16-0" / "metrics.jsonl"
H1 = ["model=qwen3_vl_30b_a3b", "model.num_layers=4", "hardware=h200", "data=realistic", "train.seq_length=4096",
      "gpus_per_node=1", "train.global_batch_size=48", "vision=trainable", "precision=bf16"]


@pytest.fixture(scope="module")
def state() -> dict[str, Any]:
    return json.loads(STATE.read_text())


def test_steps_split_of_a_recorded_run() -> None:
    """The first step is in the startup spans; then the warm-up steps the summary leaves out, then the measured
    ones: together every step of the run."""
    rows = run_summary.read_jsonl(RUN)
    split = trials.steps_split(rows)
    steps = [r["step_s"] for r in rows]
    assert split["warmup_steps_s"] == pytest.approx(sum(steps[1:run_summary.SKIP]), abs=0.01)
    assert split["measured_steps_s"] == pytest.approx(sum(steps[run_summary.SKIP:]), abs=0.01)
    assert split["warmup_steps_s"] > 2 * statistics.median(steps[run_summary.SKIP:])  # step 2 is not steady yet


def test_spend_of_the_recorded_h1_search(state: dict[str, Any]) -> None:
    """Startup (launcher + rank setup + first step) was most of the recorded H1 search's GPU time; the parts add up
    to the trials' GPU time, and the report says so, per trial and in the median trial."""
    outcomes = [t["outcome"] for t in state["trials"].values()]
    sp = trials.spend(outcomes)
    parts = sum(sp[f"{k.removesuffix('_s')}_gpu_min"] for k in (*trials.PARTS, "other_s"))
    assert parts == pytest.approx(sum(o["wall_s"] * o["gpus"] for o in outcomes) / 60)
    assert sp["startup_share"] > 0.5 and sp["startup_gpu_min"] > sp["measured_steps_gpu_min"]
    starts = [trials.startup_s(o["metrics"]) for o in outcomes]
    assert sp["startup_s_median"] == statistics.median(starts) and min(starts) > 30
    md = outputs.render(state, "vlmtrain tune (recorded)", None)
    assert "## Where the GPU time went" in md and f"{sp['startup_s_median']:.0f} s in the median trial" in md
    assert "| startup s | measured s |" in md


def test_results_row_names_base_versus_and_spend(state: dict[str, Any]) -> None:
    """The row carries tune_vs_hand, versus, gpu_min, trials, where the GPU time went and the base the search
    started from, which holds no preset."""
    versus = ["experiment=perf_h200_best"]
    row = command.result_row(state, state["base"], versus)
    m = row["metrics"]
    assert m["tune_vs_hand"] == pytest.approx(state["versus"]["tune_vs_hand"]) and m["trials"] == 19
    assert m["gpu_min"] == state["search_gpu_min"] and m["startup_gpu_min"] > 0
    assert row["versus"] == versus and row["base"] == state["base"]
    assert not any(o.startswith("experiment=") for o in row["base"])
    assert row["config"][: len(state["base"])] == state["base"]
    assert command.result_row({**state, "versus": None}, state["base"], None)["metrics"]["tune_vs_hand"] is None


def test_hand_side_is_the_shipped_preset() -> None:
    """Without --versus the comparison's hand side is the shipped preset of the base's model, data, hardware and
    world (perf_h200_best for H1; never tune_h1, which a search wrote); a search's own preset is refused."""
    assert space.problem(["experiment=tune_h1"], 1) == space.problem(H1, 1)  # same problem, written by a search
    assert command.hand_side(None, H1, "tune_h1", 1) == ["experiment=perf_h200_best"]
    assert command.hand_side(None, ["model=tiny"], "t", 1) is None
    assert command.hand_side("none", H1, "tune_h1", 1) is None
    assert command.hand_side("experiment=perf_h200x2_best gpus_per_node=1", H1, "t", 1) == [
        "experiment=perf_h200x2_best", "gpus_per_node=1"]
    with pytest.raises(ValueError, match="its own winner"):
        command.hand_side("experiment=tune_h1", H1, "tune_h1", 1)


def test_trials_share_one_cache_dir(tmp_path: Path) -> None:
    """Every trial's data scan, processor, bins and compiled kernels (Megatron's torch.compile'd helpers: every
    model) go to the search's cache dir; a base data.cache_dir wins."""
    extra = command.cache_overrides(H1, tmp_path / "cache")
    run = space.placed([*H1, *extra], 1)
    assert cache_root(run) == tmp_path / "cache" / "kernels"
    env = model.env(run)
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "cache" / "kernels" / "inductor")
    assert env["TRITON_CACHE_DIR"] == str(tmp_path / "cache" / "kernels" / "triton")
    assert command.cache_overrides([*H1, "data.cache_dir=/x"], tmp_path) == []


class Recorded:
    """A trial whose run writes a recorded GPU run's rows into its metrics.jsonl, one per poll (the GPU run's
    stand-in)."""

    def __init__(self, run_dir: Path, rows: list[dict[str, Any]]):
        self.run_dir, self.rows, self.i = run_dir, rows, 0
        run_dir.mkdir(parents=True)

    def poll(self) -> int | None:
        if self.i == len(self.rows):
            return 0
        with (self.run_dir / "metrics.jsonl").open("a") as f:
            f.write(json.dumps(self.rows[self.i]) + "\n")
        self.i += 1
        return None

    def stop(self) -> None:
        raise AssertionError("no early stop without a best")

    def wall_s(self) -> float:
        return 60.0


def test_screening_trials_measure_after_a_shorter_warmup(tmp_path: Path) -> None:
    """The default spec's screening trials run 5 steps and leave 2 out (3 measured, one step less than with the
    finalists' 3 warm-up steps); a trial without the rule (finalists, comparison) leaves 3 out."""
    s = spec.load("default")
    rule = trials.EarlyStop(**s.get("early_stop"))
    assert rule.warmup == 2 and all(st.iterations - rule.warmup == 3 for st in s.stages)
    rows = run_summary.read_jsonl(RUN)[:5]
    case = Case("screen", None, multirun=True)
    screen = trials.run(lambda d, c: Recorded(d / trials.RUN_SUBDIR, rows), tmp_path / "a", case, 1, None, rule, 0.0)
    final = trials.run(lambda d, c: Recorded(d / trials.RUN_SUBDIR, rows), tmp_path / "b", case, 1, None, None, 0.0)
    assert screen.status == final.status == "ok"
    assert screen.useful == run_summary.summarize_rows(rows, 2)["useful_tokens_per_s_per_gpu"]
    assert final.useful == run_summary.summarize_rows(rows, 3)["useful_tokens_per_s_per_gpu"]
    assert screen.metrics["measured_steps_s"] == pytest.approx(sum(r["step_s"] for r in rows[2:]), abs=0.01)
    assert final.metrics["warmup_steps_s"] == pytest.approx(rows[1]["step_s"] + rows[2]["step_s"], abs=0.01)


def test_a_results_row_never_starts_from_a_preset(tmp_path: Path) -> None:
    """With --results the base is the problem alone: a preset among its overrides is refused before any search."""
    from vlmtrain import cli

    args = cli.parser().parse_args(["tune", "experiment=perf_h200_best", "--plan", "--dir", str(tmp_path / "t"),
                                    "--results", str(tmp_path / "rows.jsonl")])
    assert args.func(args) == 2
    assert not (tmp_path / "t").exists() and not (tmp_path / "rows.jsonl").exists()
