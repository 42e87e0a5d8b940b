"""The peer of benchmarks H1 and H2 (vlmtrain.lab.kit.baselines defines them): Megatron Bridge's own full-training
recipe for the benchmark's model (vlmtrain.lab.bridge_benchmarks: the recipe, vlmtrain's description, the changes), run
through Bridge's own pretrain() and Bridge's Qwen-VL forward step (`qwen3_vl_step`, the step that does the recipes'
deferred in-batch packing): what a Bridge user runs without vlmtrain, changed only where one GPU, the benchmark and this
offline machine force it. Every change is in the benchmark's `all_changes()` and in each row's `changes`.

Useful tokens are counted as vlmtrain counts them (vlmtrain.train.step_counters: the non-pad tokens of every
micro-batch the step consumed, read off the collated batch by a wrapper around the step's data iterator that hands
each batch on unchanged), and a read-only Bridge callback times each step (CUDA-synchronised wall clock, as
vlmtrain.observe.metrics_callback) and writes vlmtrain's metrics.jsonl row keys, FLOPs from vlmtrain.config.flops
on the same samples: both in the run's one torchrun rank, vlmtrain.lab.bridge_recipe_rank. No per-tower timing:
its module hooks would change what runs, so the peer's rows have no mfu_vit / mfu_projector / mfu_decoder.
"""

from __future__ import annotations

import argparse
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vlmtrain.lab import vs_bridge
from vlmtrain.lab.bridge_benchmarks import BENCHMARKS, ITERATIONS, LAYERS, Benchmark
from vlmtrain.lab.kit import experiments, runner, schedule, store
from vlmtrain.lab.kit.case import placed_resolved
from vlmtrain.observe import run_summary

if TYPE_CHECKING:
    from collections.abc import Iterator

    from megatron.bridge.training.config import ConfigContainer

    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig

BENCH_FLAG = "--benchmark"
ENTRY = experiments.command(__name__)
"""What each run's row names as its command."""


def bench_run(bench: Benchmark, run_dir: Path) -> tuple[RunConfig, Resolved]:
    """vlmtrain's description of the benchmark (its data, processor, FLOPs and peak), in `run_dir`, placed and
    resolved as train.py would (the one Resolved each of this process's steps reads)."""
    return placed_resolved(bench.run, output_dir=str(run_dir))


@contextmanager
def offline_hub(module: Any, hf_config: Any) -> Iterator[None]:
    """The recipe module's AutoBridge answers from_hf_pretrained with from_hf_config(hf_config) for the block."""
    bridge = module.AutoBridge

    class Offline(bridge):
        @classmethod
        def from_hf_pretrained(cls, path: Any, **kwargs: Any) -> Any:
            return bridge.from_hf_config(hf_config)

    module.AutoBridge = Offline
    try:
        yield
    finally:
        module.AutoBridge = bridge


def shipped(bench: Benchmark, run: RunConfig, res: Resolved) -> ConfigContainer:
    """The recipe's ConfigContainer as Bridge ships it (its provider from the published config, offline)."""
    import importlib

    from vlmtrain.build import target
    from vlmtrain.config.compose import compose
    from vlmtrain.config.groups import model
    from vlmtrain.data import prepare
    from vlmtrain.data.processor import vision_token_ids

    module_name, function = bench.recipe.rsplit(".", 1)
    recipes = importlib.import_module(module_name)
    # the model as on the hub: its published depth
    published = compose([o for o in bench.run.command_line() if not o.startswith("model.num_layers=")]).model
    hf = model.hf_config(published, vision_token_ids(prepare.processor_dir(run)))
    # the recipe reads GPU 0's properties (apply_flex_dispatcher_backend): a dry run presents the declared H200's
    with offline_hub(recipes, hf), target.declared_target(run, res):
        return getattr(recipes, function)()


def recipe_config(bench: Benchmark, run: RunConfig, res: Resolved) -> ConfigContainer:
    """The recipe's ConfigContainer with the benchmark's changes applied, before Bridge's finalization."""
    from megatron.bridge.data.sources.hf import HFDatasetSourceConfig

    from vlmtrain.data import prepare

    cfg = shipped(bench, run, res)
    bench.apply(cfg)
    cfg.model.expert_model_parallel_size = 1
    cfg.model.num_layers = LAYERS
    cfg.train.train_iters = ITERATIONS
    cfg.dataset.source = HFDatasetSourceConfig(**prepare.prepare(run, res).hf_source)
    cfg.dataset.hf_processor_path = str(prepare.processor_dir(run))
    cfg.dataset.do_validation = cfg.dataset.do_test = False
    cfg.checkpoint.save = cfg.checkpoint.load = None
    cfg.logger.tensorboard_dir = str(Path(run.output_dir) / "tb_logs")
    cfg.model.gradient_accumulation_fusion = False
    return cfg


def facts(cfg: ConfigContainer) -> dict[str, Any]:
    """The fields the comparison rests on, as the finalized container holds them (the dry run prints them)."""
    m, d = cfg.model, cfg.dataset
    return {"micro_batch_size": cfg.train.micro_batch_size, "global_batch_size": cfg.train.global_batch_size,
            "train_iters": cfg.train.train_iters, "moe_token_dispatcher_type": m.moe_token_dispatcher_type,
            "expert_model_parallel_size": m.expert_model_parallel_size, "num_layers": m.num_layers,
            "tensor_model_parallel_size": m.tensor_model_parallel_size, "seq_length": m.seq_length,
            "freeze_language_model": m.freeze_language_model, "freeze_vision_model": m.freeze_vision_model,
            "freeze_vision_projection": m.freeze_vision_projection,
            "enable_in_batch_packing": d.enable_in_batch_packing,
            "defer_in_batch_packing_to_step": d.defer_in_batch_packing_to_step, "dataset": type(d).__name__,
            "source": d.source.path_or_dataset, "data_files": d.source.load_kwargs.get("data_files"),
            "mixed_precision": str(cfg.mixed_precision), "checkpoint_save": cfg.checkpoint.save,
            "pretrained_checkpoint": cfg.checkpoint.pretrained_checkpoint,
            "use_megatron_fsdp": cfg.ddp.use_megatron_fsdp, "recompute_granularity": m.recompute_granularity,
            "mtp_num_layers": getattr(m, "mtp_num_layers", None),
            "linear_attention_freq": getattr(m, "linear_attention_freq", None)}


def dry_run(bench: Benchmark, run_dir: Path) -> dict[str, Any]:
    """Build the recipe's container and validate it by Bridge's runtime_config_update for one H200, on any machine."""
    from vlmtrain.build import target

    run, res = bench_run(bench, run_dir)
    cfg = recipe_config(bench, run, res)
    target.finalize(run, res, cfg)
    out = facts(cfg)
    changes = bench.all_changes()
    print(f"[bridge-recipe] {bench.recipe}: built and validated by Bridge for 1 x H200\n" + json.dumps(out, indent=1)
          + "\n[bridge-recipe] changed from the recipe:\n" + "\n".join(f"  {k}: {v}" for k, v in changes.items()),
          flush=True)
    return out


def command(bench: Benchmark, run_dir: Path, port: int) -> list[str]:
    """The peer's rank (vlmtrain.lab.bridge_recipe_rank) through torchrun, as a training run's ranks start."""
    from vlmtrain.launch import local

    return local.torchrun(bench.run.module, [bench.name, str(run_dir)], bench.run.gpus, 1, port)


def run_once(bench: Benchmark, i: int, machine_run: str, out: Path, results_path: Path) -> dict[str, Any] | None:
    """Run i of this machine run in its own process and directory, its row appended (None when it failed)."""
    run_dir = out / machine_run / f"run{i}"
    run_dir.mkdir(parents=True, exist_ok=True)
    from vlmtrain.data import prepare

    prepare.prepare(*bench_run(bench, run_dir))  # the data scan on CPU before the rank starts, as vlmtrain.flow does
    print(f"[bridge-recipe] run {i + 1} in {run_dir}", flush=True)
    port = int(os.environ.get("MASTER_PORT") or runner.free_port())
    spawned = runner.spawn(command(bench, run_dir, port), run_dir, port=port)
    rc = spawned.wait()
    wall = round(spawned.wall_s(), 1)
    summary = run_summary.summarize(run_dir, keys=run_summary.SUMMARY_KEYS)
    print(f"[bridge-recipe] run {i + 1}: rc {rc} in {wall} s {json.dumps(summary)}", flush=True)
    if rc != 0 or "useful_tokens_per_s_per_gpu" not in summary:
        print((run_dir / "train.log").read_text()[-4000:], flush=True)
        return None
    return store.append(results_path, bench.run.name, ENTRY, summary, machine_run=machine_run, run=i, wall_s=wall,
                        recipe=bench.recipe, changes=bench.all_changes(), config=bench.run.command_line())


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(BENCH_FLAG, choices=sorted(BENCHMARKS), default="h1", help="which benchmark's recipe")
    schedule.add_flags(ap, 3)
    ap.add_argument("--dry-run", action="store_true", help="CPU: build the recipe's container and validate it")
    experiments.add_results(ap, "perf_h200.jsonl")
    experiments.add_out(ap, "bridge_recipe")


def run(args: argparse.Namespace) -> int:
    bench = BENCHMARKS[args.benchmark]
    if args.dry_run:
        dry_run(bench, args.out / f"dry-run-{bench.name}")
        return 0
    machine_run = store.machine_run(args.machine_run, store.machine_runs(args.results))
    command = f"{ENTRY} {BENCH_FLAG} {bench.name} --repeats {args.repeats}"
    todo = schedule.pending([bench.run], args.repeats, lambda c: schedule.done(args.results, c.name, machine_run),
                            "bridge-recipe", machine_run)
    failed = schedule.run(
        todo, lambda _, i: run_once(bench, i, machine_run, args.out / bench.name, args.results) is not None,
        repeats=args.repeats, tag="bridge-recipe", machine_run=machine_run, budget_s=args.budget_s,
        after_last=lambda c: schedule.summary(args.results, c.name, machine_run, command,
                                              vs_bridge.after_summary(args.results, machine_run, command)))
    return 1 if failed else 0
