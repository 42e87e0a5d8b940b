"""Validate vlmtrain.check.memory against the peaks measured on the H200: one row per run into
results/memory_estimates.jsonl.

    vlmtrain lab memory-check [--measured results/gpu_training.jsonl]
        [--out results/memory_estimates.jsonl]
    vlmtrain lab memory-check --table     # the markdown table of the written jsonl

For every measured run it composes the run's own overrides (the `command` after `python train.py`, without
`dry_run=...`) and estimates twice:
- at the workload the run had (what is compared, `estimated_gib`): seq_length when Bridge pads, else the longest
  sample of the data the run read, rounded up to the collate's multiple of 128; the most image tokens any sample
  of that data carries. Both come from running the run's own processor over its data files, as Bridge's Qwen-VL
  collate does. (For data=realistic the run read 64-80 of the 256 rows in an order not reproduced here, so the
  dataset maximum is an upper bound of what it ran.)
- at the default worst case the plan and preflight use (`worst_case_gib`): seq_length tokens per sample.
The compared quantity is the allocator peak (`MemoryBreakdown.allocated`), the same thing `peak_mem_gib`
(torch.cuda.max_memory_allocated, max over ranks) measures; CUDA context and NCCL buffers are outside both.
Runs on the CPU machine (no Bridge import); the data pass takes about a minute. This module is the
command-line entry point; tests/unit/test_memory.py replays the recorded runs of tests/fixtures through this module.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
from pathlib import Path
from typing import Any

from vlmtrain.check import memory
from vlmtrain.config.compose import compose
from vlmtrain.config.resolve import Resolved, resolve
from vlmtrain.config.schema import RunConfig
from vlmtrain.lab.kit import experiments, store
from vlmtrain.lab.kit.runner import ROOT

TARGET_PCT = 15.0
COLLATE_PAD_MULTIPLE = 128
"""Bridge's qwen2_5_collate_fn pads every micro-batch to a multiple of 128 tokens (pad_to_multiple_of)."""
BENCHMARK_COMMAND = experiments.command(__name__)


def overrides(command: str) -> list[str]:
    """The train.py overrides of a recorded command: everything after `python train.py`, minus `dry_run=...`."""
    args = shlex.split(command)
    return [a for a in args[args.index("train.py") + 1:] if not a.startswith("dry_run=")]


def sample_lengths(run: RunConfig, res: Resolved) -> list[tuple[int, int]]:
    """(tokens, image tokens) of every row of the run's data, through its processor with the collate's pixel
    limits (min_pixels=200704, max_pixels=1003520)."""
    from PIL import Image
    from transformers import AutoProcessor

    from vlmtrain.data import prepare

    rows_file = prepare.prepare(run, res).jsonl
    if rows_file is None:
        raise ValueError(f"data={run.data.kind}: no local rows to measure")
    processor = AutoProcessor.from_pretrained(str(prepare.processor_dir(run)))
    image_id = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    out = []
    for line in rows_file.read_text().splitlines():
        conversation = json.loads(line)["conversation"]
        images = [Image.open(part["image"]).convert("RGB") for turn in conversation for part in turn["content"]
                  if part.get("type") == "image"]
        text = processor.apply_chat_template(conversation, tokenize=False)
        ids = processor(text=[text], images=images or None, min_pixels=200704, max_pixels=1003520,
                        return_tensors="pt")["input_ids"]
        out.append((int(ids.shape[1]), int((ids == image_id).sum())))
    return out


def measured_workload(run: RunConfig, res: Resolved, lengths: list[tuple[int, int]]) -> memory.Workload:
    """The micro-batch the run actually ran at its largest: padded runs run seq_length; unpadded runs the longest
    sample rounded up to the collate's multiple of 128."""
    longest = max(n for n, _ in lengths)
    padded = res.padded
    seq = run.train.seq_length if padded else min(run.train.seq_length,
                                                  math.ceil(longest / COLLATE_PAD_MULTIPLE) * COLLATE_PAD_MULTIPLE)
    return memory.Workload(seq_len=seq, image_tokens=max(i for _, i in lengths), padded=padded)


def error_pct(estimated: float, measured: float) -> float:
    return round(100.0 * (estimated - measured) / measured, 1)


def rebuildable(record: dict[str, Any]) -> bool:
    """A finished single run whose data this machine regenerates (shipped photos; not mock, not a user's files)."""
    cmd, m = record["command"], record["metrics"]
    trained = m.get("rc", 0) == 0 or m.get("steps", 0) > 0  # a run stopped by a time limit still measured a peak
    return (trained and bool(m.get("peak_mem_gib")) and cmd.startswith("python train.py ")
            and " -m " not in cmd and "<inputs>" not in cmd and "data=mock" not in cmd)


def row(record: dict[str, Any], lengths_cache: dict[str, list[tuple[int, int]]], cache_dir: Path,
        output_dir: str = "outputs/compose") -> dict[str, Any]:
    """The estimate row of one measured run (`record`: a results row: name, command, machine, metrics.peak_mem_gib);
    its data's sample lengths are measured once per dataset into `lengths_cache`, its files materialized under
    `cache_dir`; `output_dir` is where the composed run records its data scan."""
    ov = overrides(record["command"])
    run = compose([*ov, f"data.cache_dir={cache_dir}"], output_dir=output_dir)
    # not placed: the recorded runs predate the auto defaults, and unplaced they read as those runs ran (FSDP,
    # Bridge's kernels, no packing, Adam's FP32 state)
    res = resolve(run)
    key = json.dumps([str(run.data.kind), str(run.data.path), repr(run.data.payload)])
    if key not in lengths_cache:
        lengths_cache[key] = sample_lengths(run, res)
    w = measured_workload(run, res, lengths_cache[key])
    b, worst = memory.estimate(run, res, w), memory.estimate(run, res)
    measured = float(record["metrics"]["peak_mem_gib"])
    err = error_pct(b.allocated, measured)
    metrics = {"estimated_gib": round(b.allocated, 3), "measured_gib": round(measured, 3), "error_pct": err,
               "worst_case_gib": round(worst.allocated, 3),
               "worst_case_error_pct": error_pct(worst.allocated, measured),
               "total_with_context_gib": round(b.total, 3)}
    # the measured run's machine: the estimate describes that run, whatever machine computes it
    return store.row(record["name"], {"benchmark": BENCHMARK_COMMAND, "gpu": record["command"]}, metrics,
                     machine=record["machine"], machine_run=record.get("machine_run"), measured_date=record.get("date"),
                     within_target=abs(err) <= TARGET_PCT,
                     workload={"seq_len": w.seq_len, "image_tokens_per_sample": w.image_tokens, "padded": w.padded,
                               "micro_batch_size": run.train.micro_batch_size},
                     breakdown=b.to_dict())


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The results table of results/memory_estimates.md, generated from the jsonl rows (so the two agree)."""
    out = ["| case | measured GiB | estimated GiB | error % | worst case GiB (error %) | workload: seq, image tokens |",
           "|---|---:|---:|---:|---:|---|"]
    for r in rows:
        m, w = r["metrics"], r["workload"]
        mark = "" if r["within_target"] else " **(> 15 %)**"
        out.append(f"| {r['name']} | {m['measured_gib']:.2f} | {m['estimated_gib']:.2f} | {m['error_pct']:+.1f}{mark} "
                   f"| {m['worst_case_gib']:.2f} ({m['worst_case_error_pct']:+.1f}) "
                   f"| {w['seq_len']}{' padded' if w['padded'] else ''}, {w['image_tokens_per_sample']} |")
    return "\n".join(out) + "\n"


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--measured", type=Path, nargs="+",
                    default=[ROOT / "results" / f"{name}.jsonl"
                             for name in ("gpu_training", "gpu_acceptance", "precision_h200")])
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "memory_estimates.jsonl")
    ap.add_argument("--cache-dir", type=Path, default=ROOT / "outputs" / "memory_check_cache",
                    help="where the runs' datasets and processor are materialized (kept out of ~/.cache)")
    ap.add_argument("--table", action="store_true", help="print the markdown table of --out and exit")


def run(args: argparse.Namespace) -> int:
    if args.table:
        print(markdown_table(store.read(args.out)), end="")
        return 0
    records = [r for path in args.measured for r in store.latest(store.read(path)) if rebuildable(r)]
    lengths_cache: dict[str, list[tuple[int, int]]] = {}
    rows = [row(r, lengths_cache, args.cache_dir.absolute()) for r in records]
    store.rewrite(args.out, rows)
    for r in rows:
        m = r["metrics"]
        print(f"{r['name']:<66} measured {m['measured_gib']:6.2f}  estimated {m['estimated_gib']:6.2f} "
              f"({m['error_pct']:+5.1f} %)  worst case {m['worst_case_gib']:6.2f} "
              f"({m['worst_case_error_pct']:+6.1f} %)")
    misses = [r["name"] for r in rows if not r["within_target"]]
    print(f"{len(rows) - len(misses)}/{len(rows)} within {TARGET_PCT:.0f} %"
          + (f"; misses: {misses}" if misses else ""))
    return 0
