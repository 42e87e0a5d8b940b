"""after_build.microbatches: Megatron's own micro-batch calculator (megatron.core.num_microbatches_calculator, set up
as Bridge's initialize sets it up from the built config) against the resolved grad_accum, on CPU. A `+bridge.train.*`
batch override reaches Megatron but not config.resolve, so its count differs and the run must fail."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from vlmtrain.config.resolve import resolve
from vlmtrain.train import after_build


@contextmanager
def megatron_calculator(global_batch_size: int, micro_batch_size: int, data_parallel_size: int) -> Iterator[None]:
    """Megatron's global calculator with Bridge's arguments (no rampup, no batch decrease), removed afterwards."""
    from megatron.core import num_microbatches_calculator as calc

    calc.init_num_microbatches_calculator(rank=0, rampup_batch_size=None, global_batch_size=global_batch_size,
                                          micro_batch_size=micro_batch_size, data_parallel_size=data_parallel_size,
                                          decrease_batch_size_if_needed=False)
    try:
        yield
    finally:
        calc.destroy_num_microbatches_calculator()


def test_the_resolved_count_passes(compose):
    run = compose("gpus_per_node=2", "train.global_batch_size=8", "train.micro_batch_size=2")
    res = resolve(run)
    assert (res.layout.dp, res.grad_accum) == (2, 2)
    with megatron_calculator(run.train.global_batch_size, run.train.micro_batch_size, res.layout.dp):
        assert after_build.microbatches(run, res) == 2


def test_a_count_megatron_computes_differently_fails_the_run(compose):
    """Megatron gets GBS 16 from a +bridge.train override; resolve (and with it the plan, the memory estimate and
    the metrics) planned GBS 8: 4 micro-batches against 2."""
    run = compose("gpus_per_node=2", "train.global_batch_size=8", "train.micro_batch_size=2",
                  "+bridge.train.global_batch_size=16")
    res = resolve(run)
    with megatron_calculator(16, run.train.micro_batch_size, res.layout.dp), \
            pytest.raises(after_build.SettingNotApplied) as err:
        after_build.microbatches(run, res)
    assert "Megatron runs 4 micro-batches" in str(err.value) and "grad_accum=2" in str(err.value)
