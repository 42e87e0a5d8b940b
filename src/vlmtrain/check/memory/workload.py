"""The workload the estimate assumes: tokens per sample, image tokens per sample, and whether the row is padded
(the length and the padding come from config.resolve, which decides them for every consumer)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vlmtrain.config.groups.data import Kind as DataKind
from vlmtrain.config.tokens import COLLATE_MAX_TOKENS, COLLATE_MIN_TOKENS, TOKEN_PX

if TYPE_CHECKING:
    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig


@dataclass(frozen=True)
class Workload:
    """One sample of the micro-batch the estimate assumes (the micro-batch holds train.micro_batch_size of them)."""

    seq_len: int
    """Tokens the decoder runs per sample (padded length when Bridge pads)."""
    image_tokens: int
    """LLM image tokens per sample; the ViT sees 4x as many patches."""
    padded: bool
    """True when the row runs padded to its length (Resolved.padded: then seq_len is exact, not a bound)."""


def image_tokens_of(tokens_w: int, tokens_h: int) -> int:
    """LLM tokens of one image of tokens_w x tokens_h tokens after the collate clamps it to its bounds."""
    return min(max(tokens_w * tokens_h, COLLATE_MIN_TOKENS), COLLATE_MAX_TOKENS)


def image_token_bound(run: RunConfig, res: Resolved) -> int:
    """Most image tokens one sample (a packed run: one row of many samples) can carry, from what the data group
    declares; the sequence (the capacity) when it declares nothing or a row may hold many samples (every token
    could be an image token)."""
    d, seq = run.data, res.seq_length
    if res.packing_capacity:
        return seq
    if d.kind == DataKind.mock:
        w, h = d.mock_image_size
        return min(seq, d.mock_num_images * image_tokens_of(math.ceil(w / TOKEN_PX), math.ceil(h / TOKEN_PX)))
    if d.kind == DataKind.realistic:
        per_image = min(d.payload.image_tokens_max, COLLATE_MAX_TOKENS)
        return min(seq, (len(d.payload.images_per_sample) - 1) * per_image)
    if d.kind == DataKind.sample:  # one photo per row, resized by the collate
        return min(seq, COLLATE_MAX_TOKENS)
    return seq


def default_workload(run: RunConfig, res: Resolved) -> Workload:
    """The worst case the plan and preflight assume: seq_length tokens per sample (a packed run: the capacity per
    row, its one sample per micro-batch; exact when padded, an upper bound otherwise) carrying the most image tokens
    the data allows."""
    return Workload(seq_len=res.seq_length, image_tokens=image_token_bound(run, res), padded=res.padded)
