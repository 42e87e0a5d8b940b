"""StepCounters: the token and image counts of every micro-batch Bridge's step consumes (for metrics.jsonl).

Counting happens on the collated CPU batch (no GPU sync); the metrics callback sums the counters over the
data-parallel group once per logged step, so the numbers describe the whole global batch, not one rank's share.
The same wrapped iterator marks the data wait on the step timeline (`data_wait`: vlmtrain.observe.timing's), and
takes each micro-batch's sample ids (vlmtrain.data.sample_ids) off the batch: `sample_ids` holds this step's, in
order, for samples.jsonl and a failure record.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from vlmtrain.data.sample_ids import BATCH_KEY

if TYPE_CHECKING:
    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig

COUNTERS = ("padded_tokens", "nonpad_tokens", "image_tokens", "text_tokens", "loss_tokens", "images", "vit_patches",
            "samples")


class StepCounters:
    """Token/image counters of the micro-batches this rank consumed since the last reset. `data_wait()` is entered
    around each next() of the data iterator (the step timer's data mark). `res`: the run's config.resolve
    values."""

    def __init__(self, run: RunConfig, res: Resolved, data_wait: Callable[[], AbstractContextManager[Any]]):
        self.run = run
        self.pads = res.pads_to_seq_length
        self.data_wait = data_wait
        self.image_token_id: int | None = None
        self.samples: list[dict[str, Any]] = []  # per-sample (nonpad length, patches per image) for FLOPs
        self.sample_ids: list[list[int | None]] = []  # per micro-batch of this step: its samples' indices
        self.reset()

    def reset(self) -> None:
        self.totals = dict.fromkeys(COUNTERS, 0)
        self.samples = []
        self.sample_ids = []
        self.host_s = 0.0  # host time spent counting (part of vlmtrain_host_s)

    def padded_length(self, raw_len: int) -> int:
        """Sequence length the model actually runs for a collated [B, raw_len] batch (Resolved.pads_to_seq_length;
        a packed row's own padding is in the collated batch)."""
        return self.run.train.seq_length if self.pads else raw_len

    def rows(self, batch: dict[str, Any]) -> tuple[list[Any], int]:
        """(each sample's real token ids, tokens the model runs): a packed (THD) batch is one row whose samples
        start at cu_seqlens_q_padded (cu_seqlens_q when nothing was aligned) and are cu_seqlens_q apart."""
        ids = batch["input_ids"]
        cu = batch.get("cu_seqlens_q")
        if cu is not None:
            starts = batch.get("cu_seqlens_q_padded", cu)[:-1].tolist()
            lengths = (cu[1:] - cu[:-1]).tolist()
            return [ids[0, s : s + n] for s, n in zip(starts, lengths, strict=True)], ids.shape[1]
        mask = batch.get("attention_mask")
        lengths = (mask.sum(dim=1) if mask is not None else (ids != 0).sum(dim=1)).tolist()
        return [row[:n] for row, n in zip(ids, lengths, strict=True)], ids.shape[0] * self.padded_length(ids.shape[1])

    def count(self, batch: dict[str, Any]) -> None:
        rows, model_tokens = self.rows(batch)
        nonpad_rows = [len(r) for r in rows]
        vis = batch.get("visual_inputs")
        grid = getattr(vis, "image_grid_thw", None)
        patches = grid.prod(dim=-1).tolist() if grid is not None else []
        image_tokens_rows = [int((r == self.image_token_id).sum()) for r in rows]
        t = self.totals
        t["samples"] += len(rows)
        t["padded_tokens"] += model_tokens
        t["nonpad_tokens"] += sum(nonpad_rows)
        t["image_tokens"] += sum(image_tokens_rows)
        t["text_tokens"] += sum(nonpad_rows) - sum(image_tokens_rows)
        t["loss_tokens"] += int(batch["loss_mask"].sum().item())
        t["images"] += len(patches)
        t["vit_patches"] += int(sum(patches))
        # Patches per sample, in order: image_tokens = patches / 4 (2x2 merge) lets us split images by sample.
        it = iter(patches)
        for n_tok, n_img_tok in zip(nonpad_rows, image_tokens_rows, strict=True):
            imgs, acc = [], 0
            while acc < n_img_tok:
                p = next(it)
                imgs.append(p)
                acc += p // 4
            self.samples.append({"len": n_tok, "patches": imgs})

    def wrap(self, forward_step: Callable) -> Callable:
        """A forward step whose data iterator counts every micro-batch it hands to Bridge's step and marks the
        time spent in next() as data wait."""
        counters = self

        class _Counting:
            def __init__(self, it: Iterator):
                self.it = it

            def __iter__(self) -> _Counting:
                return self

            def __next__(self) -> dict[str, Any]:
                with counters.data_wait():
                    batch = next(self.it)
                t0 = time.perf_counter()
                counters.sample_ids.append(batch.pop(BATCH_KEY, None) or [])
                counters.count(batch)
                counters.host_s += time.perf_counter() - t0
                return batch

        def step(state: Any, data_iterator: Any, model: Any, return_schedule_plan: bool = False) -> Any:
            if counters.image_token_id is None:
                counters.image_token_id = state.cfg.model.image_token_id
            it = _Counting(data_iterator) if data_iterator is not None else None
            return forward_step(state, it, model, return_schedule_plan)

        return step
