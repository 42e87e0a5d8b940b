"""after_build.frozen_checksums compares whole towers, whether a rank holds a parameter sharded (as Megatron-FSDP's
DTensors before training) or whole (its unsharded buffers after backward): two real gloo ranks on CPU."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


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

    from vlmtrain.train import after_build

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
