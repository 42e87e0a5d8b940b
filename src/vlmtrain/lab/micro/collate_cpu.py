"""What one packed row costs the data loader's CPU: the rows of the one-GPU Qwen3-VL-30B-A3B benchmark case
(conf/tune/perf_h200.yaml `h1`: its layer shapes at 4 decoder layers, data=realistic, rows of <= 12288 tokens) built by
the run's own dataset and collate (Bridge's dataset provider -> vlmtrain.data.bins_dataset -> Bridge's packed Qwen
collate), timed one row at a time in this process, as one loader worker builds them. Against a GPU step's rate of rows
this says how many loader workers keep up. A profile of the same rows gives the shares of the collate's parts: Bridge's
assistant loss mask (`build_assistant_loss_mask`, which renders each sample's chat template with its images again), the
vision preprocessing the row itself needs (`process_vision_info`) and the processor's calls overall.

    vlmtrain lab collate-cpu [--rows 8] [--capacity 12288] [overrides]   # any machine; CPU only
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import time
from pathlib import Path
from typing import Any

from vlmtrain.lab.kit import experiments, store
from vlmtrain.lab.micro.ceiling import H1_MODEL

H1 = [*H1_MODEL, "data=realistic", "train.global_batch_size=4", "dry_run=true"]
"""The benchmark case's model and data (conf/tune/perf_h200.yaml `h1`); dry_run: no GPU is asked for."""
PARTS = {"assistant_loss_mask": "build_assistant_loss_mask", "vision_inputs": "process_vision_info",
         "processor_calls": "processing_utils.py:643(__call__)"}
"""Profile entries (pstats' function labels, by substring) whose cumulative time is reported as a share."""


def dataset(capacity: int, out: Path, items: int, overrides: list[str]) -> Any:
    """Bridge's train dataset of the benchmark case (`items` long), through the data stage and provider lookup a rank
    uses, with the run's code replacements installed as a rank installs them before its loader forks the workers."""
    from megatron.bridge.data.utils import get_dataset_provider

    from vlmtrain.build import container, target
    from vlmtrain.data import prepare
    from vlmtrain.lab.kit.case import placed_resolved
    from vlmtrain.train import bridge_patches

    run, res = placed_resolved([*H1, f"data.packing={capacity}", *overrides], output_dir=str(out))
    prepare.prepare(run, res)
    cfg = container.build(run, res)
    target.finalize(run, res, cfg)
    bridge_patches.install(run)
    train, _, _ = get_dataset_provider(cfg.dataset)([items, 0, 0], cfg.dataset)
    return train


def cpu_name() -> str:
    """This machine's processor model and core count (the row's `cpu`)."""
    try:
        model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name"))
    except (OSError, StopIteration):
        model = "unknown CPU"
    return f"{model}, {os.cpu_count()} cores"


def shares(profile: cProfile.Profile) -> dict[str, float]:
    """Each PARTS entry's cumulative seconds over the profile's total."""
    stats = pstats.Stats(profile)
    total = stats.total_tt  # type: ignore[attr-defined]
    cum: dict[str, float] = {}
    for (file, line, fn), (_, _, _, ct, _) in stats.stats.items():  # type: ignore[attr-defined]
        label = f"{file}:{line}({fn})"
        for key, needle in PARTS.items():
            if needle in label or needle == fn:
                cum[key] = max(cum.get(key, 0.0), ct)
    return {f"share_{k}": cum.get(k, 0.0) / total for k in PARTS}


def measure(train: Any, rows: int) -> dict[str, Any]:
    """Seconds per row (row i = bin i + 1; bin 0 warms up), tokens and images per row; then the same rows again under
    cProfile for the shares (the timed pass runs without the profiler)."""
    train.collate_fn([train[0]])
    seconds, tokens, images = [], [], []
    for i in range(1, rows + 1):
        item = train[i]
        t0 = time.perf_counter()
        batch = train.collate_fn([item])
        seconds.append(time.perf_counter() - t0)
        tokens.append(int(batch["input_ids"].shape[1]))
        vis = batch.get("visual_inputs")
        grid = getattr(vis, "image_grid_thw", None)
        images.append(0 if grid is None else int(grid.shape[0]))
    profile = cProfile.Profile()
    profile.enable()
    for i in range(1, rows + 1):
        train.collate_fn([train[i]])
    profile.disable()
    med = statistics.median(seconds)
    return {"row_s": med, "row_s_min": min(seconds), "row_s_max": max(seconds), "rows": rows,
            "tokens_per_row": statistics.median(tokens), "images_per_row": statistics.median(images),
            "tokens_per_s_one_worker": statistics.median(tokens) / med, **shares(profile)}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--rows", type=experiments.at_least(3, "a median needs them"), default=8,
                    help="rows timed (median and min-max; at least 3)")
    ap.add_argument("--capacity", type=int, default=12288, help="tokens per packed row (data.packing)")
    experiments.add_results(ap, "collate_cpu.jsonl")
    experiments.add_out(ap, "collate_cpu")
    ap.add_argument("overrides", nargs="*", help="on top of the benchmark case, e.g. kernels.mask_grid_only=false")


def run(a: argparse.Namespace) -> int:
    metrics = measure(dataset(a.capacity, a.out, a.rows + 1, a.overrides), a.rows)
    cmd = " ".join([experiments.command(__name__), *([f"--rows {a.rows}"] if a.rows != 8 else []),
                    *([f"--capacity {a.capacity}"] if a.capacity != 12288 else []), *a.overrides])
    name = "_".join([f"collate-cpu_h1_packed{a.capacity}", *(o.replace("=", "-") for o in a.overrides)])
    row = store.append(a.results, name, cmd, metrics, cpu=cpu_name(), config=[*H1, *a.overrides])
    print(f"[collate_cpu] {row['metrics']}", flush=True)
    return 0
