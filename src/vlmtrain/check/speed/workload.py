"""What one step trains, over every rank: samples, real and run tokens, images and the useful FLOPs they cost.

The plan's workload comes from the data stage's exact sample lengths where it can count them (vlmtrain.data.prepare)
and from what the data group declares about images (data=realistic's payload, data=mock's images); where the data
declares nothing, an assumed image share is used and the plan says so. A calibration builds it from a measured
row instead (its tokens and FLOPs per step), so the fit sees the workload the run had.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from vlmtrain.check.memory.workload import image_tokens_of
from vlmtrain.config import architecture as arch
from vlmtrain.config import flops
from vlmtrain.config.groups.data import Kind as DataKind
from vlmtrain.config.groups.data import TokenSampling
from vlmtrain.config.tokens import COLLATE_MAX_TOKENS, TOKEN_PX

if TYPE_CHECKING:
    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig

COLLATE_PAD_MULTIPLE = 128
"""Bridge's qwen2_5_collate_fn pads an unpacked micro-batch to a multiple of 128 tokens (pad_to_multiple_of)."""
UNDECLARED_IMAGE_SHARE = 0.9
"""Assumed: the share of a sample's tokens that are image tokens, one image per sample, where the data declares no
payload (sample, jsonl, parquet, hf, energon). data=realistic's declared payload gives 0.78 (1.4 images of 588
tokens in a mean sample of ~1050 tokens); caption data such as the shipped photos carry more."""


@dataclass(frozen=True)
class Workload:
    """One step's work over every rank (global, per step)."""

    samples: float
    """Samples per step."""
    useful_tokens: float
    """Real (non-pad) tokens per step: the useful-token rate's numerator."""
    decoder_tokens: float
    """Tokens the decoder runs per step, padding included (= useful_tokens for packed dynamic rows)."""
    images: float
    """Images per step."""
    patches: float
    """ViT patches per step (4 per image token)."""
    flops: flops.Flops
    """Useful FLOPs per step (config.flops: real lengths, every image, freeze-aware backward): MFU's numerator."""
    source: str
    """Where the figures come from, for the plan: the data's lengths, the worst case, a measured row."""
    vision: bool = True
    """The model runs a ViT; False for a decoder without one (a text recipe): no ViT compute, no ViT parameters."""

    def text_only(self) -> Workload:
        """The same decoder work without a ViT (no image tokens are vision, none run a ViT)."""
        return replace(self, images=0.0, patches=0.0, flops=flops.Flops(0.0, 0.0, self.flops.decoder), vision=False)


def declared_images(run: RunConfig) -> tuple[float, float, str]:
    """(images per sample, LLM tokens per image, where it comes from) of the run's data: data=realistic's payload
    expectation, data=mock's declared images, else one image of UNDECLARED_IMAGE_SHARE of the sample (tokens 0:
    the caller fills it from the sample length)."""
    d = run.data
    if d.kind == DataKind.realistic:
        p = d.payload
        weights = p.images_per_sample
        per_sample = sum(k * w for k, w in enumerate(weights)) / sum(weights)
        lo, hi = p.effective_token_range
        if p.token_sampling == TokenSampling.log_uniform and hi > lo:
            per_image = (hi - lo) / math.log(hi / lo)
        else:
            per_image = (lo + hi) / 2
        return per_sample, per_image, "data=realistic's declared payload"
    if d.kind == DataKind.mock:
        w, h = d.mock_image_size
        return float(d.mock_num_images), float(image_tokens_of(math.ceil(w / TOKEN_PX), math.ceil(h / TOKEN_PX))), \
            "data=mock's declared images"
    return 1.0, 0.0, f"assumed: 1 image per sample, {UNDECLARED_IMAGE_SHARE:.0%} of its tokens"


def from_samples(run: RunConfig, res: Resolved, samples: float, tokens: float, images: float, per_image: float,
                 per_row: float, source: str) -> Workload:
    """A step of `samples` samples of `tokens` real tokens each, `images` images per sample of `per_image` LLM
    tokens, `per_row` samples in each packed row (1 unpacked; a packed micro-batch is one row): the tokens the
    decoder runs follow the padding that
    config.resolve decided (padded to seq_length or the capacity, a packed row's real tokens, or an unpadded
    micro-batch rounded up to the collate's multiple of 128)."""
    rows = run.train.global_batch_size / run.train.micro_batch_size if res.packing_capacity else samples
    if res.padded:
        row = float(res.seq_length)
    elif res.packing_capacity:
        row = per_row * tokens
    else:
        row = min(float(res.seq_length), math.ceil(tokens / COLLATE_PAD_MULTIPLE) * COLLATE_PAD_MULTIPLE)
    patches = [round(per_image * arch.PATCHES_PER_TOKEN)] if images and per_image else []
    one = flops.step_flops(run, [{"len": max(round(tokens), 1), "patches": patches}])
    per_step = flops.Flops(vit=one.vit * images * samples, projector=one.projector * images * samples,
                           decoder=one.decoder * samples)
    return Workload(samples=samples, useful_tokens=samples * tokens, decoder_tokens=rows * row,
                    images=images * samples, patches=images * samples * round(per_image * arch.PATCHES_PER_TOKEN),
                    flops=per_step, source=source)


def planned(run: RunConfig, res: Resolved) -> Workload:
    """The workload the plan predicts for: the data's exact lengths (mean sample, samples per packed row) where
    the data stage counts them, else the worst case (every sample seq_length tokens, one per row); images as the
    data declares them."""
    from vlmtrain.data import prepare

    images, per_image, said = declared_images(run)
    lengths = prepare.lengths(run)
    cap = res.packing_capacity
    if lengths is not None and lengths.train and (not cap or lengths.longest <= cap):
        tokens = statistics.fmean(lengths.train)
        per_row = len(lengths.train) / lengths.rows(cap, res.pack_align)[0] if cap else 1.0
        source = f"the data's {len(lengths.train)} sample lengths (mean {tokens:.0f} tokens)"
    else:
        tokens, per_row = float(res.seq_length), 1.0
        source = f"worst case: {res.seq_length} tokens per sample (the data's lengths are not known here)"
    if not per_image:
        per_image = min(UNDECLARED_IMAGE_SHARE * tokens, COLLATE_MAX_TOKENS)
    per_image = min(per_image, tokens / images) if images else 0.0
    samples = run.train.global_batch_size * (per_row if cap else 1.0)
    return from_samples(run, res, samples, tokens, images, per_image, per_row, f"{source}; images: {said}")
