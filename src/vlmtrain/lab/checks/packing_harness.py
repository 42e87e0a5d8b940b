"""The in-rank half of vlmtrain.lab.checks.packing_equivalence (its docstring says what is compared and why): one
torchrun rank, launched by vlmtrain.launch.local with `module=` and the saved run config's path as its only argument,
builds the run's model through Bridge's setup(), compares packed rows with each sample alone, trains until the
negative controls are strong, and writes RESULT into the run dir for the driver's row.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vlmtrain.lab.checks.packing_gdn_control import gdn_layers, gdn_whole_row
from vlmtrain.lab.checks.packing_verdict import (
    CE_MEAN_TOL_NATS,
    CE_P99_TOL_NATS,
    CHECKS,
    CONTROL_MARGIN,
    CONTROLS,
    GDN_CONTROLS,
    GRAD_COSINE_MIN,
    ROUNDING_MARGIN,
    measured_controls,
    verdict,
)

TRAIN_STEPS = 40
"""Packed training steps per round when the controls are too weak at random init."""
DEADLINE_ENV = "VLMTRAIN_EQUIVALENCE_DEADLINE"
"""The driver's deadline for this case (Unix time): a round after the first starts only if one as long as the last
would still end before it (the driver kills the rank at the deadline; RESULT keeps every state measured)."""
TRAIN_LR = 3e-4
ROW_BOUND = 12288
"""The collate's sequence length for the compared rows: longer than every one of them (nothing is cut)."""
STATIC_SLACK = 256
"""The static row (data.packing_static) is the longest compared row plus at least this many padding tokens, rounded
up to a multiple of it: padded like a static row, and no longer (at H2's shapes on 80 GB, a fixed 12288-token row's
logits alone did not fit beside the model and optimizer)."""
PACKINGS = {"": (1, False), "_pad64": (64, False), "_static": (1, True)}
"""Metric suffix -> (per-sample alignment, static row): one GPU's own packing, a CP/FP8-like multiple, a static row."""
RESULT = "equivalence.json"

ROWS_OF_IMAGES = ((0, 1, 2), (1, 3, 0, 1), (2, 2), (0, 0, 1))
"""The micro-batches compared: the image count of each sample in a packed row (0, 1 and 2+ images)."""


def image_count(example: dict[str, Any]) -> int:
    from vlmtrain.data.jsonl import image_parts

    return len(image_parts(example["conversation"]))


def pick_rows(examples: list[dict[str, Any]], rows: tuple[tuple[int, ...], ...] = ROWS_OF_IMAGES) -> list[list[int]]:
    """Dataset indices for each row of ROWS_OF_IMAGES: the first unused sample with each wanted image count."""
    used: set[int] = set()
    picked = []
    for wanted in rows:
        row = []
        for n in wanted:
            i = next((i for i, ex in enumerate(examples) if i not in used and image_count(ex) == n), None)
            if i is None:
                raise ValueError(f"the dataset has no unused sample with {n} image(s); raise data.payload.num_samples")
            used.add(i)
            row.append(i)
        picked.append(row)
    return picked


def segments(batch: dict[str, Any]) -> list[tuple[int, int]]:
    """(physical start, real length) of each sample in a packed row: Bridge's THD builder puts sample i at
    cu_seqlens_q_padded[i] (cu_seqlens_q without alignment padding) with cu_seqlens_q[i+1] - cu_seqlens_q[i] tokens."""
    cu = batch["cu_seqlens_q"].tolist()
    starts = batch.get("cu_seqlens_q_padded", batch["cu_seqlens_q"]).tolist()
    return [(starts[i], cu[i + 1] - cu[i]) for i in range(len(cu) - 1)]


def control_batch(batch: dict[str, Any], kind: str, rope: Callable[..., Any]) -> dict[str, Any]:
    """The packed batch with one thing packing must keep broken. `rope(input_ids, grid, packed)` is Bridge's
    get_rope_index bound to the model's token ids: explicit [3, 1, T] MRoPE positions go to the model as they are."""
    import torch
    from megatron.bridge.training.utils.packed_seq_utils import get_packed_seq_params

    grid = getattr(batch["visual_inputs"], "image_grid_thw", None)
    packed = {k: batch[k] for k in ("cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded",
                                    "max_seqlen_q", "max_seqlen_kv") if k in batch}
    per_sample = rope(batch["input_ids"], grid, get_packed_seq_params(packed))
    out = dict(batch)
    if kind == "whole_row_positions":  # the row's positions as one sequence; attention still per sample
        out["position_ids"] = rope(batch["input_ids"], grid, None)
    elif kind == "positions":  # each sample's positions permuted; attention still per sample
        shuffled, gen = per_sample.clone(), torch.Generator().manual_seed(0)
        for start, n in segments(batch):
            shuffled[:, :, start:start + n] = per_sample[:, :, start + torch.randperm(n, generator=gen)]
        out["position_ids"] = shuffled
    elif kind == "boundaries":  # per-sample positions; attention over the whole row
        out["position_ids"] = per_sample
        total = batch["input_ids"].shape[1]
        for k in ("cu_seqlens_q_padded", "cu_seqlens_kv_padded"):
            out.pop(k, None)
        whole = batch["cu_seqlens_q"].new_tensor([0, total])
        longest = batch["max_seqlen_q"].new_tensor(total)
        out.update(cu_seqlens_q=whole, cu_seqlens_kv=whole.clone(), max_seqlen_q=longest, max_seqlen_kv=longest.clone())
    else:
        raise ValueError(kind)
    return out


def part(name: str) -> str:
    """The part of the model a parameter belongs to, for the per-part gradient cosine: the ViT, the embedding and
    output layer, and in each decoder layer its mixer (attention or Gated DeltaNet), norms, router, experts and
    shared experts."""
    import re

    if "vision" in name:
        return "vision"
    m = re.search(r"decoder\.layers\.(\d+)\.(\w+)(?:\.(experts|router|shared_experts))?", name)
    if m:
        return ".".join(x for x in (f"layer{m[1]}", m[2], m[3]) if x)
    return "embedding" if "embedding" in name else "output_layer" if "output_layer" in name else "other"


def abs_diffs(a: list[Any], b: list[Any]) -> list[float]:
    import torch

    return torch.cat([(x.double() - y.double()).abs() for x, y in zip(a, b, strict=True)]).tolist()


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def datasets(dataset_cfg: Any, rows: tuple[tuple[int, ...], ...] = ROWS_OF_IMAGES) -> tuple[Any, dict[str, Any]]:
    """The run's samples collated alone (Bridge's DirectSFTDataset, padded, as unpacked training collates them) and
    packed: for each of PACKINGS, a BinDataset whose collate packs the samples it is given as one bin (the static
    one at a capacity fitted to the compared rows, STATIC_SLACK)."""
    from megatron.bridge.data.builders.direct_hf_sft import build_direct_hf_sft_split, load_direct_hf_sft_processor

    from vlmtrain.data.bins_dataset import BinDataset

    processor = load_direct_hf_sft_processor(dataset_cfg, None)
    alone = build_direct_hf_sft_split(dataclasses.replace(dataset_cfg, enable_in_batch_packing=False),
                                      dataset_cfg.source, 1, processor)  # the length only bounds indexing
    examples = alone._base_examples
    longest = max(BinDataset(examples, [], 1, processor, ROW_BOUND, False, 1).collate_fn([[examples[i] for i in r]])
                  ["input_ids"].shape[1] for r in pick_rows(examples, rows))
    static = -(-(longest + STATIC_SLACK) // STATIC_SLACK) * STATIC_SLACK
    packed = {k: BinDataset(examples, [], 1, processor, static if is_static else ROW_BOUND, is_static, align)
              for k, (align, is_static) in PACKINGS.items()}
    return alone, packed


class Harness:
    """The built model and Bridge's two forward steps, driven one micro-batch at a time (no training loop)."""

    def __init__(self, run_config: str):
        from megatron.bridge.data.utils import get_dataset_provider
        from megatron.bridge.training.config import runtime_config_update
        from megatron.bridge.training.setup import setup
        from megatron.bridge.training.state import GlobalState

        from vlmtrain.launch import local
        from vlmtrain.train import trainer
        from vlmtrain.train.unwrap import unwrap

        self.run, res = local.loaded(run_config)
        cfg, self.patched = trainer.build(self.run, res)
        runtime_config_update(cfg)
        self.state = GlobalState()
        self.state.cfg = cfg
        out = setup(self.state, get_dataset_provider(cfg.dataset))
        self.state, self.model, self.optimizer = out.state, out.model[0], out.optimizer
        self.core = unwrap(self.model)
        tc = self.core.config
        assert not tc.hidden_dropout and not tc.attention_dropout, "dropout would make the two passes differ"
        self.alone, self.packed = datasets(cfg.dataset)
        self.examples = self.alone._base_examples
        self.model.train()

    def rope(self, input_ids: Any, grid: Any, packed: Any) -> Any:
        from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.rope import get_rope_index

        c = self.core
        return get_rope_index(c.config.spatial_merge_size, c.image_token_id, c.video_token_id, c.vision_start_token_id,
                              input_ids, image_grid_thw=grid, packed_seq_params=packed)[0]

    def forward(self, batch: dict[str, Any], packed: bool) -> Any:
        """Per-token loss [1, T] of one collated micro-batch through the step vlmtrain trains it with."""
        if packed:
            from megatron.bridge.training.vlm_step import forward_step
        else:
            from megatron.bridge.models.qwen_vl.qwen3_vl_step import forward_step
        out, _ = forward_step(self.state, iter([batch]), self.model)
        return out[0] if isinstance(out, tuple) else out

    def loss_tokens(self, indices: list[int], packing: str | None, backward: bool,
                    batch_of: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> list[Any]:
        """Per-sample CE on its loss tokens: alone (packing None) or packed as PACKINGS[packing]; with
        `backward`, the summed loss is backpropagated into main_grad (no grad sync: one rank)."""
        import torch

        exs = [self.examples[i] for i in indices]
        out = []
        with torch.set_grad_enabled(backward), self.model.no_sync():
            if packing is None:
                for ex in exs:
                    batch = self.alone.collate_fn([ex])
                    mask = batch["loss_mask"][0].bool()
                    loss = self.forward(batch, packed=False)[0]
                    if backward:
                        (loss[: mask.numel()] * mask.cuda()).sum().backward()
                    out.append(loss[: mask.numel()][mask.cuda()].detach().float().cpu())
            else:
                batch = self.packed[packing].collate_fn([exs])
                segs, mask = segments(batch), batch["loss_mask"][0].bool()
                if batch_of is not None:
                    batch = batch_of(batch)
                loss = self.forward(batch, packed=True)[0]
                if backward:
                    (loss * mask.cuda()).sum().backward()
                out = [loss[s:s + n][mask[s:s + n].cuda()].detach().float().cpu() for s, n in segs]
        return out

    def grads(self) -> list[Any]:
        return [g for _, g in self.named_grads()]

    def named_grads(self) -> list[tuple[str, Any]]:
        return [(n, p.main_grad) for n, p in self.model.named_parameters()
                if p.requires_grad and getattr(p, "main_grad", None) is not None]

    def stash_grads(self) -> list[Any]:
        """A bf16 copy of every main_grad (a fp32 copy would not fit next to the optimizer at the 30B shapes)."""
        import torch

        return [g.detach().to(dtype=torch.bfloat16) for g in self.grads()]

    def grad_cosine(self, stash: list[Any]) -> tuple[float, dict[str, dict[str, float]]]:
        """The cosine of the whole gradient with the stashed one, and per part of the model (part()): its cosine
        and the stashed gradient's norm, so a disagreement names where it is and how much of the whole it weighs."""
        sums: dict[str, list[float]] = {}
        for (name, g), s in zip(self.named_grads(), stash, strict=True):
            g, s = g.detach().float(), s.float()
            acc = sums.setdefault(part(name), [0.0, 0.0, 0.0])
            acc[0] += (g * s).sum().item()
            acc[1] += (s * s).sum().item()
            acc[2] += (g * g).sum().item()
        cos = lambda d, a, b: d / max((a * b) ** 0.5, 1e-30)  # noqa: E731
        dot, a2, b2 = (sum(v[i] for v in sums.values()) for i in range(3))
        return cos(dot, a2, b2), {k: {"cosine": cos(*v), "norm": v[1] ** 0.5} for k, v in sums.items()}

    def zero(self) -> None:
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()

    def train(self, steps: int, rows: list[list[int]]) -> None:
        """Packed training steps with the real optimizer on rows of the dataset other than the compared ones."""
        import torch

        for g in self.optimizer.param_groups:
            g["lr"] = TRAIN_LR
        compared = {i for r in rows for i in r}
        pool = [i for i in range(len(self.examples)) if i not in compared]
        for step in range(steps):
            self.zero()
            idx = [pool[(step * 3 + k) % len(pool)] for k in range(3)]
            batch = self.packed[""].collate_fn([[self.examples[i] for i in idx]])
            mask = batch["loss_mask"][0].cuda()
            loss = (self.forward(batch, packed=True)[0] * mask).sum() / mask.sum()
            loss.backward()
            self.model.finish_grad_sync()
            self.optimizer.step()
            if step % 10 == 0:
                print(f"[equivalence] train step {step}: loss {loss.item():.3f}", flush=True)
        torch.cuda.synchronize()


def compare(h: Harness, rows: list[list[int]]) -> dict[str, Any]:
    """The metrics of one model state: packed (each of PACKINGS) vs alone, gradients, and the controls."""
    metrics: dict[str, Any] = {}
    for suffix in PACKINGS:
        diffs, cos, by_part = [], [], {}
        try:
            for i, row in enumerate(rows):
                h.zero()
                alone = h.loss_tokens(row, None, backward=True)
                stash = h.stash_grads()
                h.zero()
                packed = h.loss_tokens(row, suffix, backward=True)
                whole, parts = h.grad_cosine(stash)
                cos.append(whole)
                by_part[f"row{i}"] = parts
                del stash
                diffs += abs_diffs(packed, alone)
        except Exception as e:  # a packing variant this TE build refuses: recorded, the others still measured
            if not suffix:
                raise
            metrics[f"error{suffix}"] = repr(e)[:500]
            continue
        metrics.update({f"ce_mean_abs_diff_nats{suffix}": statistics.fmean(diffs),
                        f"ce_p99_abs_diff_nats{suffix}": p99(diffs), f"ce_max_abs_diff_nats{suffix}": max(diffs),
                        f"grad_cosine{suffix}": min(cos), f"loss_tokens{suffix}": len(diffs)})
        if not suffix:
            metrics["grad_by_part"] = by_part
    h.zero()
    gdn = GDN_CONTROLS if gdn_layers(h.core) else ()
    later: dict[str, list[float]] = {"packed": [], **{k: [] for k in (*CONTROLS, *gdn, *CHECKS)}}
    for row in rows:
        alone = h.loss_tokens(row, None, backward=False)[1:]
        base = h.loss_tokens(row, "", backward=False)[1:]
        later["packed"] += abs_diffs(base, alone)
        for kind in (*CONTROLS, *CHECKS):
            broken = h.loss_tokens(row, "", backward=False, batch_of=lambda b, k=kind: control_batch(b, k, h.rope))
            later[kind] += abs_diffs(broken[1:], base)
        for kind in gdn:  # the row's own batch; only the GDN layers drop its boundaries
            with gdn_whole_row(h.core):
                later[kind] += abs_diffs(h.loss_tokens(row, "", backward=False)[1:], base)
    metrics["ce_mean_abs_diff_nats_later_samples"] = statistics.fmean(later.pop("packed"))
    metrics |= {f"control_ce_mean_abs_diff_nats_{k}": statistics.fmean(later[k]) for k in (*CONTROLS, *gdn)}
    metrics |= {f"check_ce_mean_abs_diff_nats_{k}": statistics.fmean(later[k]) for k in CHECKS}
    return metrics


def main(run_config: str) -> int:
    """One rank: build, compare at random init, train in rounds until each control was strong or the driver's
    deadline leaves no room for another round, write RESULT after each state."""
    h = Harness(run_config)
    rows = pick_rows(h.examples)
    history = [{"trained_steps": 0, **compare(h, rows)}]
    write(h, rows, history)
    round_s = 0.0  # unknown before the first (the first compare's time is mostly kernel compilation)
    deadline = float(os.environ.get(DEADLINE_ENV, "inf"))
    controls = measured_controls(history[0])
    while not all(verdict(history)[f"control_{k}_ok"] for k in controls):
        if time.time() + round_s > deadline:
            print(f"[equivalence] stopped at {history[-1]['trained_steps']} trained steps: another round "
                  f"(~{round_s:.0f} s) would pass the deadline", flush=True)
            return 0
        t0 = time.time()
        h.train(TRAIN_STEPS, rows)
        history.append({"trained_steps": history[-1]["trained_steps"] + TRAIN_STEPS, **compare(h, rows)})
        write(h, rows, history)
        round_s = time.time() - t0
    return 0


def write(h: Harness, rows: list[list[int]], history: list[dict[str, Any]]) -> None:
    """RESULT after every measured state (a run stopped by a time limit keeps what it measured)."""
    print(f"[equivalence] {json.dumps(history[-1])}", flush=True)
    worst = {k: (min if k.startswith("grad_cosine") else max)(m[k] for m in history if k in m) for k in history[0]
             if k.startswith(("ce_", "grad_cosine", "check_"))}
    out = {"metrics": {**worst, "trained_steps": history[-1]["trained_steps"], **verdict(history)}, "history": history,
           "rows": rows, "images_per_row": [[image_count(h.examples[i]) for i in r] for r in rows],
           "bridge_patches": h.patched,
           "tolerances": {"ce_mean_abs_diff_nats": CE_MEAN_TOL_NATS, "ce_p99_abs_diff_nats": CE_P99_TOL_NATS,
                          "grad_cosine_min": GRAD_COSINE_MIN, "rounding_margin": ROUNDING_MARGIN,
                          "control_margin": CONTROL_MARGIN}}
    (Path(h.run.output_dir) / RESULT).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
