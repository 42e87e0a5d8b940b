"""vlmtrain.lab.micro.vit_attention's CPU side: the shapes it times are one H1 micro-batch's images as data=realistic
draws them, and the FLOPs it divides by are the attention's."""

from __future__ import annotations

from vlmtrain import cli
from vlmtrain.lab.micro import vit_attention as va


def test_shapes_are_one_micro_batch_of_realistic_images() -> None:
    lengths = va.seqlens()
    assert lengths == va.seqlens()  # seeded: every machine run times the same shapes
    assert all(196 * 4 <= s <= 980 * 4 and s % 4 == 0 for s in lengths)
    assert 10_500 <= sum(lengths) // 4 < 10_500 + 980  # drawn until the row's image tokens are reached
    assert va.seqlens(seed=1) != lengths


def test_flops_are_forward_and_twice_it_backward() -> None:
    # one 1000-patch image: QK^T and PV are 2 s^2 d each per head -> 4 s^2 h d forward, x3 with the backward
    assert va.flops([1000], heads=2, dim=8) == 3 * 4 * 1000 * 1000 * 2 * 8
    assert va.flops([10, 20]) == va.flops([10]) + va.flops([20])


def test_list_runs_without_a_gpu(capsys) -> None:
    assert cli.main(["lab", "vit-attention", "--list"]) == 0
    assert "'head_dim': 72" in capsys.readouterr().out
