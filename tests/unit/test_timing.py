"""vlmtrain.observe.timing on CPU: the pure arithmetic, and the hook wiring on real torch modules with real autograd.

CUDA events are the only GPU-only piece (timing.cuda_mark / cuda_elapsed_s); here the same Timeline runs on a host
clock that moves by a fixed tick per read and by what the stand-in data and optimizer say they took, so every
interval is exact and no test depends on how busy the machine is.
"""

from __future__ import annotations

import types
from itertools import count
from pathlib import Path

import pytest
import torch
from torch import nn

from vlmtrain.observe import run_summary, timing

RECORDED = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "perf_h200" / "rows.jsonl"


def test_attribute_gives_each_interval_to_the_mark_before_it() -> None:
    labels = ["other", "data", "other", "vision", "projector", "vision", "decoder", "other"]
    durations = [0.5, 1.0, 0.25, 2.0, 0.5, 1.5, 3.0]
    assert timing.attribute(labels, durations) == {"other": 0.75, "data": 1.0, "vision": 3.5, "projector": 0.5,
                                                   "decoder": 3.0}
    assert timing.attribute(["other"], []) == {}
    with pytest.raises(ValueError, match="3 marks need 2 intervals"):
        timing.attribute(["a", "b", "c"], [1.0])


def test_row_adds_up_to_step_time_and_reports_coverage() -> None:
    totals = {"vision": 1.0, "projector": 0.25, "decoder": 2.0, "optimizer": 0.5, "data": 0.25, "other": 9.0}
    row = timing.row(totals, step_s=5.0)
    assert set(row) == {*timing.KEYS, "time_other_s", "component_coverage"}
    assert row["time_other_s"] == pytest.approx(1.0)
    assert sum(row[k] for k in timing.KEYS) + row["time_other_s"] == pytest.approx(5.0)
    assert row["component_coverage"] == pytest.approx(0.8)


def test_row_never_reports_negative_other() -> None:
    row = timing.row({"decoder": 1.0000001}, step_s=1.0)  # event vs wall clock resolution
    assert row["time_other_s"] == 0.0
    assert row["component_coverage"] == pytest.approx(1.0)
    assert timing.row({}, step_s=0.0) == {**dict.fromkeys(timing.KEYS, 0.0), "time_other_s": 0.0,
                                          "component_coverage": 0.0}


def test_timeline_nests_forward_sections_and_records_only_inside_a_step() -> None:
    tl = timing.Timeline(clock=count().__next__)
    tl.enter("vision")  # before the step: no mark, but the stack stays balanced
    tl.exit()
    tl.begin()
    tl.enter("vision")
    tl.enter("projector")
    tl.exit()
    tl.exit()
    tl.switch("decoder")
    tl.end()
    assert tl.marks == [("other", 0), ("vision", 1), ("projector", 2), ("vision", 3), ("other", 4), ("decoder", 5),
                        ("other", 6)]
    tl.switch("decoder")
    assert len(tl.marks) == 7


def test_timeline_skips_marks_the_clock_refuses() -> None:
    """cuda_mark returns None while a CUDA graph is being captured; such marks are dropped."""
    tokens = iter([0, None, 2])
    tl = timing.Timeline(clock=lambda: next(tokens))
    tl.begin()
    tl.enter("decoder")
    tl.exit()
    assert tl.marks == [("other", 0), ("other", 2)]


TICK = 1e-6
"""What one read of the test clock costs: each mark and each hook's own host time is a whole number of ticks."""
WAIT = 0.002
"""What the stand-in data fetch and optimizer step take on the test clock."""


class Clock:
    """perf_counter for the timer: a read advances it by TICK; `advance` is work done between reads."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += TICK
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Optimizer:
    """A plain object with a step() method, as Megatron's optimizer has."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def step(self) -> tuple[bool, float, int]:
        self.clock.advance(WAIT)
        return True, 1.0, 0


def towers() -> tuple[nn.Sequential, nn.Linear]:
    """A ViT-like tower (blocks then a merger) and a decoder, as plain torch modules."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8)), nn.Linear(8, 8)


def timed_step(timer: timing.StepTimer, vision: nn.Module, decoder: nn.Module, opt: Optimizer) -> list[str]:
    timer.start()
    with timer.data():
        opt.clock.advance(WAIT)
    out = decoder(vision(torch.randn(4, 8)))
    out.sum().backward()
    opt.step()
    timer.stop()
    return [label for label, _ in timer.timeline.marks]


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """The timer's host clock: its marks and its own perf_counter reads (hooks' host time, data wait) alike."""
    clock = Clock()
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=clock))
    return clock


@pytest.fixture
def host_timer(clock: Clock) -> timing.StepTimer:
    return timing.StepTimer(clock=clock, elapsed=timing.host_elapsed_s)


def attach(timer: timing.StepTimer, vision: nn.Sequential, decoder: nn.Linear, opt: Optimizer) -> None:
    """As StepTimer.attach does for Qwen3VLModel: vision tower, its merger, the decoder, the optimizer."""
    timer.attach_module(vision, "vision", None)
    timer.attach_module(vision[1], "projector", "vision")
    timer.attach_module(decoder, "decoder", timing.OTHER, closes_backward=True)
    timer.attach_optimizer(opt)


def test_hooks_follow_forward_and_backward_through_the_towers(host_timer: timing.StepTimer, clock: Clock) -> None:
    vision, decoder = towers()
    opt = Optimizer(clock)
    attach(host_timer, vision, decoder, opt)
    labels = timed_step(host_timer, vision, decoder, opt)
    forward = ["other", "data", "other", "vision", "projector", "vision", "other", "decoder", "other"]
    # backward: decoder; its input's gradient ends it; the merger; the ViT blocks; autograd's final callback
    backward = ["decoder", "other", "projector", "vision", "other"]
    assert labels == [*forward, *backward, "optimizer", "other", "other"]
    totals = host_timer.totals()
    assert set(totals) == {*timing.COMPONENTS, "data_host_s"}
    for key in ("optimizer", "data", "data_host_s"):  # the wait, plus the few clock reads around it
        assert totals[key] == pytest.approx(WAIT, abs=10 * TICK)
    assert all(v >= TICK for v in totals.values())


def test_frozen_vision_has_no_vision_backward(host_timer: timing.StepTimer, clock: Clock) -> None:
    vision, decoder = towers()
    vision[0].requires_grad_(False)
    opt = Optimizer(clock)
    attach(host_timer, vision, decoder, opt)
    labels = timed_step(host_timer, vision, decoder, opt)
    backward = labels[labels.index("decoder", 8):labels.index("optimizer")]
    assert backward == ["decoder", "other", "projector", "other"]


def test_detach_removes_every_hook(host_timer: timing.StepTimer, clock: Clock) -> None:
    vision, decoder = towers()
    opt = Optimizer(clock)
    attach(host_timer, vision, decoder, opt)
    host_timer.detach()
    labels = timed_step(host_timer, vision, decoder, opt)
    assert labels == ["other", "data", "other", "other"]


def test_timer_counts_its_own_host_time_per_step(host_timer: timing.StepTimer, clock: Clock) -> None:
    """The hooks' and marks' host time (part of metrics.jsonl vlmtrain_host_s) is counted, is not the model's or
    the optimizer's or next()'s, and starts again at zero every step; without hooks only the step's own marks count."""
    vision, decoder = towers()
    opt = Optimizer(clock)
    attach(host_timer, vision, decoder, opt)
    t0 = clock.now
    timed_step(host_timer, vision, decoder, opt)
    hooked = host_timer.host_s
    assert 0 < hooked < WAIT  # whole ticks of the hooks' reads; neither wait is the timer's
    assert hooked < clock.now - t0 - 2 * WAIT
    host_timer.detach()
    timed_step(host_timer, vision, decoder, opt)
    assert host_timer.host_s == pytest.approx(4 * 2 * TICK)  # reset by start(); 4 marks left, 2 reads each


def recorded_h1_runs() -> dict[str, dict[str, float]]:
    """The H1 runs of four machine runs (tests/fixtures/perf_h200, rows of results/perf_h200.jsonl): rows of 8192
    tokens at 6.1-6.7 s steps (efb44c3c), of 12288 tokens at 3.8-4.9 s with 2 loader workers (2b3014ae, the one that
    waited), at ~2.9 s with grid-only mask renders (b64c7526) and at 2.0-3.5 s (0eb4da4d)."""
    rows = run_summary.read_jsonl(RECORDED)
    return {f"{r['machine_run']}_{r['name']}_{r['run']}": r["metrics"] for r in rows
            if r["name"].startswith("h1_") and "run" in r and "time_data_s" in r["metrics"]}


def test_data_bound_marks_the_recorded_runs_that_waited_on_the_loader() -> None:
    runs = recorded_h1_runs()
    shares = {k: timing.data_bound(m["time_data_s"], m["step_s"]) for k, m in runs.items()}
    assert {k for k, v in shares.items() if v is None} == {k for k in runs if not k.startswith("boot-2b3014ae")}
    assert {k.split("_")[0] for k in runs} >= {"boot-2b3014ae", "boot-efb44c3c", "boot-b64c7526", "boot-0eb4da4d"}
    waited = [v for k, v in shares.items() if k.startswith("boot-2b3014ae")]
    assert len(waited) == 6 and all(0.13 < v < 0.26 for v in waited)
    assert timing.data_bound(0.09, 1.0) is None and timing.data_bound(None, 1.0) is None
