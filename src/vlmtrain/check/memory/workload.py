"""The workload the estimate assumes: tokens per sample, image tokens per sample, and whether Bridge pads."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vlmtrain.config import world
from vlmtrain.config.groups.data import Kind as DataKind
from vlmtrain.config.groups.data import capacity, pads_to_max_length, row_length
from vlmtrain.config.tokens import COLLATE_MAX_TOKENS, COLLATE_MIN_TOKENS, TOKEN_PX

if TYPE_CHECKING:
    from vlmtrain.config.schema import RunConfig


@dataclass(frozen=True)
class Workload:
    """One sample of the micro-batch the estimate assumes (the micro-batch holds train.micro_batch_size of them)."""

    seq_len: int
    """Tokens the decoder runs per sample (padded length when Bridge pads)."""
    image_tokens: int
    """LLM image tokens per sample; the ViT sees 4x as many patches."""
    padded: bool
    """True when Bridge pads every sample to train.seq_length (then seq_len is exact, not a bound)."""


def pads(run: RunConfig) -> bool:
    """Bridge pads every sample to seq_length with PP>1 or EP>1 (validate()) and where vlmtrain asks it to (CUDA
    graphs' static shapes or data.pad_to_max_length: config.groups.data.pads_to_max_length). A packed row keeps
    real tokens only unless it is static (padded to the capacity: Resolved.packing_static).
    train.step_counters.StepCounters counts padded tokens by this rule."""
    if capacity(run):
        from vlmtrain.config.resolve import resolve

        return resolve(run).packing_static
    lay = world.layout(run)
    return lay.pp > 1 or lay.ep > 1 or pads_to_max_length(run)


def _image_tokens(tokens_w: int, tokens_h: int) -> int:
    return min(max(tokens_w * tokens_h, COLLATE_MIN_TOKENS), COLLATE_MAX_TOKENS)


def image_token_bound(run: RunConfig) -> int:
    """Most image tokens one sample (a packed run: one row of many samples) can carry, from what the data group
    declares; the sequence (the capacity) when it declares nothing or a row may hold many samples (every token
    could be an image token)."""
    d, seq = run.data, row_length(run)
    if capacity(run):
        return seq
    if d.kind == DataKind.mock:
        w, h = d.mock_image_size
        return min(seq, d.mock_num_images * _image_tokens(math.ceil(w / TOKEN_PX), math.ceil(h / TOKEN_PX)))
    if d.kind == DataKind.realistic:
        per_image = min(d.payload.image_tokens_max, COLLATE_MAX_TOKENS)
        return min(seq, (len(d.payload.images_per_sample) - 1) * per_image)
    if d.kind == DataKind.sample:  # one photo per row, resized by the collate
        return min(seq, COLLATE_MAX_TOKENS)
    return seq


def default_workload(run: RunConfig) -> Workload:
    """The worst case the plan and preflight assume: seq_length tokens per sample (a packed run: the capacity per
    row, its one sample per micro-batch; exact when padded, an upper bound otherwise) carrying the most image tokens
    the data allows."""
    return Workload(seq_len=row_length(run), image_tokens=image_token_bound(run), padded=pads(run))
