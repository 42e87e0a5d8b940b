"""vlmtrain.lab.micro.collate_cpu's profile shares: each named part's cumulative time over the profile's total, found by
its function name in a real cProfile. The profile runs on a clock that moves only when the profiled code says it
worked, so the shares are exact whatever else the machine is doing."""

from __future__ import annotations

import cProfile

import pytest

from vlmtrain.lab.micro import collate_cpu


class Clock:
    """cProfile's timer: seconds pass only in `advance`."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def decode(clock: Clock) -> None:
    clock.advance(2.0)


def process_vision_info(clock: Clock) -> None:  # named as the part it stands for in the profile
    clock.advance(1.0)
    decode(clock)


def other_work(clock: Clock) -> None:
    clock.advance(1.0)


def test_shares_are_cumulative_time_over_the_total() -> None:
    clock = Clock()
    profile = cProfile.Profile(clock)
    profile.enable()
    process_vision_info(clock)
    other_work(clock)
    profile.disable()
    got = collate_cpu.shares(profile)
    assert set(got) == {f"share_{k}" for k in collate_cpu.PARTS}
    assert got["share_vision_inputs"] == pytest.approx(3 / 4)  # its own second and its callee's two, of four
    assert got["share_assistant_loss_mask"] == 0.0 and got["share_processor_calls"] == 0.0
