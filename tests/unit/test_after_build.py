"""vlmtrain.train.after_build on CPU: frozen_checksums compares whole towers, whether a rank holds a parameter
sharded (as Megatron-FSDP's DTensors before training) or whole (its unsharded buffers after backward), on two real
gloo ranks; microbatches checks Megatron's own micro-batch calculator (megatron.core.num_microbatches_calculator, set
up as Bridge's initialize sets it up from the built config) against the resolved grad_accum. A `+bridge.train.*`
batch override reaches Megatron but not config.resolve, so its count differs and the run must fail."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from vlmtrain.config.resolve import resolve
from vlmtrain.train import after_build


def _model(weight: torch.Tensor) -> torch.nn.Module:
    model = torch.nn.Module()
    model.vision_model = torch.nn.Linear(4, 6)
    model.vision_model.weight = torch.nn.Parameter(weight, requires_grad=False)
    model.vision_model.bias = torch.nn.Parameter(torch.linspace(-1, 1, 6), requires_grad=False)
    model.language_model = torch.nn.Linear(4, 4)  # trainable: not checksummed
    return model


def _rank(rank: int, port: int, out: dict) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    whole = torch.randn(6, 4)  # even shards: gloo's all_gather (unlike NCCL's) refuses the uneven ones
    mesh = init_device_mesh("cpu", (2,))
    sharded = after_build.frozen_checksums([_model(distribute_tensor(whole, mesh, [Shard(0)]))])
    unsharded = after_build.frozen_checksums([_model(whole.clone())])
    moved = whole.clone()
    moved[5, 3] += 1e-3
    out[rank] = (sharded, unsharded, after_build.frozen_checksums([_model(moved)]))
    dist.destroy_process_group()


def test_sharded_and_whole_frozen_weights_checksum_alike() -> None:
    pytest.importorskip("megatron.core")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.Manager().dict()
    mp.spawn(_rank, args=(port, out), nprocs=2)
    for rank in (0, 1):
        sharded, unsharded, moved = out[rank]
        assert set(sharded) == {"vision_model"}  # frozen towers only
        assert sharded == unsharded == out[1 - rank][0]  # every rank sees the whole tower at both ends
        assert moved != unsharded  # and a moved weight shows


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
