"""vlmtrain.lab.micro.collate_cpu's profile shares: each named part's cumulative time over the profile's total, found by
its function name in a real cProfile."""

from __future__ import annotations

import cProfile
import time

from vlmtrain.lab.micro import collate_cpu


def process_vision_info() -> None:  # named as the part it stands for in the profile
    time.sleep(0.05)


def other_work() -> None:
    time.sleep(0.05)


def test_shares_are_cumulative_time_over_the_total() -> None:
    profile = cProfile.Profile()
    profile.enable()
    process_vision_info()
    other_work()
    profile.disable()
    got = collate_cpu.shares(profile)
    assert set(got) == {f"share_{k}" for k in collate_cpu.PARTS}
    assert 0.35 < got["share_vision_inputs"] < 0.65
    assert got["share_assistant_loss_mask"] == 0.0
