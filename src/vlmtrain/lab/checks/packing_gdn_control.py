"""The Gated DeltaNet boundaries control of vlmtrain.lab.checks.packing_equivalence (Qwen3.5): every GatedDeltaNet
layer of the model runs the packed row as one sequence (no packed_seq_params, so no cu_seqlens into FLA's causal
conv1d and chunked delta rule: the conv window and the recurrent state flow from one sample into the next), while
the full-attention layers keep their per-sample boundaries and each sample keeps its own MRoPE positions."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


def gdn_layers(model: Any) -> list[Any]:
    """The model's Megatron Core GatedDeltaNet mixers (none in Qwen3-VL)."""
    from megatron.core.ssm.gated_delta_net.gdn import GatedDeltaNet

    return [m for m in model.modules() if isinstance(m, GatedDeltaNet)]


def without_packing(forward: Callable[..., Any]) -> Callable[..., Any]:
    """`forward` called with packed_seq_params=None whatever its caller passes: GDN then takes its [T, 1, H] input
    as one sequence of T tokens (its non-THD branch: cu_seqlens None in conv1d and the delta rule)."""

    def one_sequence(*args: Any, **kwargs: Any) -> Any:
        kwargs["packed_seq_params"] = None
        return forward(*args, **kwargs)

    return one_sequence


@contextmanager
def gdn_whole_row(model: Any) -> Iterator[int]:
    """Within the block, every GDN layer ignores the row's sample boundaries; yields how many layers it changed."""
    layers = gdn_layers(model)
    if not layers:
        raise ValueError("gdn_boundaries control on a model without GatedDeltaNet layers would change nothing")
    for m in layers:
        m.forward = without_packing(m.forward)
    try:
        yield len(layers)
    finally:
        for m in layers:
            del m.forward  # the class's forward again
