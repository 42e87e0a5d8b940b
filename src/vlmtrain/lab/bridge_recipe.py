"""The issue-23 peer: Megatron Bridge's own full-training recipe for Qwen3-VL-30B-A3B
(`megatron.bridge.recipes.qwen_vl.h100.qwen3_vl.qwen3_vl_30b_a3b_sft_8gpu_h100_bf16_config`: every tower trainable,
MBS 2, GBS 32, alltoall, in-batch packing deferred to its step), run through Bridge's own pretrain() and the recipe's
own forward step (`qwen3_vl_step`, the step that does that deferred packing): what a Bridge user runs without
vlmtrain, changed only where one GPU, benchmark H1 and this offline machine force it. Every change is in CHANGES and
in each row's `changes`.

Useful tokens are counted as vlmtrain counts them (vlmtrain.train.step_counters: the non-pad tokens of every
micro-batch the step consumed, read off the collated batch by a wrapper around the step's data iterator that hands
each batch on unchanged), and a read-only Bridge callback times each step (CUDA-synchronised wall clock, as
vlmtrain.observe.metrics_callback) and writes vlmtrain's metrics.jsonl row keys, FLOPs from vlmtrain.observe.flops
on the same samples. No per-tower timing: its module hooks would change what runs, so the peer's rows have no
mfu_vit / mfu_projector / mfu_decoder.
"""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from megatron.bridge.training.callbacks import Callback

from vlmtrain.config.resolve import resolve
from vlmtrain.lab import repeats, runner, store
from vlmtrain.lab.runner import ROOT
from vlmtrain.observe import run_summary

if TYPE_CHECKING:
    from collections.abc import Iterator

    from megatron.bridge.training.config import ConfigContainer

    from vlmtrain.config.schema import RunConfig
    from vlmtrain.train.step_counters import StepCounters

RECIPE = "megatron.bridge.recipes.qwen_vl.h100.qwen3_vl.qwen3_vl_30b_a3b_sft_8gpu_h100_bf16_config"
NAME = repeats.BRIDGE_RECIPE
ITERATIONS = 8
"""run_summary.SKIP warm-up steps + 5 counted, as the vlmtrain H1 cases (conf/tune/perf_h200.yaml)."""
LAYERS = 4
H1 = ["model=qwen3_vl_30b_a3b", f"model.num_layers={LAYERS}", "data=realistic", "hardware=h200",
      "train.seq_length=4096", "gpus_per_node=1", "parallelism=3d", "parallelism.ep=1", "train.micro_batch_size=2",
      "train.global_batch_size=32", "dispatcher=alltoall", "vision=trainable", "wandb.enabled=false"]
"""vlmtrain's description of the same model, data and batch: the published HF config the recipe would download, the
realistic data files and offline processor, the FLOP count and the H200's peak. The recipe's container is not built
from it."""
CHANGES = {
    "model.expert_model_parallel_size": "8 -> 1 (one GPU)",
    "model.num_layers": f"48 -> {LAYERS} (benchmark H1; every layer's shape kept)",
    "train.train_iters": f"50 -> {ITERATIONS} (benchmark length: run_summary.SKIP warm-up steps + 5 counted)",
    "model (provider)": "AutoBridge.from_hf_pretrained('Qwen/Qwen3-VL-30B-A3B-Instruct') -> AutoBridge.from_hf_config("
                        "the same published config, built offline by vlmtrain.config.groups.model.hf_config): no hub "
                        "on the GPU machine; load_weights=False as in the recipe, no pretrained checkpoint",
    "dataset.source": "cord_v2 from the hub -> vlmtrain's data=realistic JSONL (the checked copy), same "
                      "DirectHFSFTDatasetConfig, preprocessing and collate",
    "dataset.hf_processor_path": "Qwen/Qwen3-VL-30B-A3B-Instruct -> vlmtrain's offline Qwen3-VL processor (real Qwen3 "
                                 "tokenizer, Qwen3-VL image settings)",
    "dataset.do_validation/do_test": "true -> false (the realistic files have one split; eval_interval 500 never "
                                     "comes in 8 iterations)",
    "checkpoint.save/load": "nemo_experiments/default/checkpoints -> none (no checkpoint written or resumed: a "
                            "benchmark, and a later run must not resume an earlier one)",
    "logger.tensorboard_dir": "nemo_experiments/default/tb_logs -> <run dir>/tb_logs",
    "model.gradient_accumulation_fusion": "true -> false (forced by this stack: without APEX the ViT merger's "
                                          "non-TE ColumnParallelLinear fails; STACK.md)",
}
"""Every field changed from the recipe, and why (kept: everything else, e.g. MBS 2, GBS 32, alltoall, freeze flags,
optimizer, DDP, dataset packing flags)."""
RANK_FLAG = "--rank"
MODULE = "vlmtrain.lab.bridge_recipe"
ENTRY = f"python -m {MODULE}"
"""What each run's row names as its command."""


def h1_run(run_dir: Path) -> RunConfig:
    from vlmtrain.config.compose import compose

    return compose(H1, output_dir=str(run_dir))


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


def shipped(run: RunConfig) -> ConfigContainer:
    """The recipe's ConfigContainer as Bridge ships it (its provider from the published config, offline)."""
    from megatron.bridge.recipes.qwen_vl.h100 import qwen3_vl as recipes

    from vlmtrain.build import target
    from vlmtrain.config.compose import compose
    from vlmtrain.config.groups import model
    from vlmtrain.data import prepare
    from vlmtrain.data.processor import vision_token_ids

    published = compose([o for o in H1 if not o.startswith("model.num_layers=")]).model  # 48 layers, as on the hub
    hf = model.hf_config(published, vision_token_ids(prepare.processor_dir(run)))
    # the recipe reads GPU 0's properties (apply_flex_dispatcher_backend): a dry run presents the declared H200's
    with offline_hub(recipes, hf), target.declared_target(run, resolve(run)):
        return getattr(recipes, RECIPE.rsplit(".", 1)[1])()


def recipe_config(run: RunConfig) -> ConfigContainer:
    """The recipe's ConfigContainer with CHANGES applied, before Bridge's finalization."""
    from megatron.bridge.data.sources.hf import HFDatasetSourceConfig

    from vlmtrain.data import prepare

    cfg = shipped(run)
    cfg.model.expert_model_parallel_size = 1
    cfg.model.num_layers = LAYERS
    cfg.train.train_iters = ITERATIONS
    cfg.dataset.source = HFDatasetSourceConfig(**prepare.prepare(run, resolve(run)).hf_source)
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
            "pretrained_checkpoint": cfg.checkpoint.pretrained_checkpoint}


def dry_run(run_dir: Path) -> dict[str, Any]:
    """Build the recipe's container and validate it by Bridge's runtime_config_update for one H200, on any machine."""
    from vlmtrain.build import target

    run = h1_run(run_dir)
    cfg = recipe_config(run)
    target.finalize(run, resolve(run), cfg)
    out = facts(cfg)
    print(f"[bridge-recipe] {RECIPE}: built and validated by Bridge for 1 x H200\n" + json.dumps(out, indent=1)
          + "\n[bridge-recipe] changed from the recipe:\n" + "\n".join(f"  {k}: {v}" for k, v in CHANGES.items()),
          flush=True)
    return out


class PeerMetrics(Callback):
    """One metrics.jsonl row per step, vlmtrain's keys: it reads the counters and the clock, and changes nothing."""

    def __init__(self, run: RunConfig, counters: StepCounters):
        self.run, self.counters, self.t0 = run, counters, 0.0
        self.path = Path(run.output_dir) / "metrics.jsonl"

    def on_train_step_start(self, context: Any) -> None:
        import torch

        torch.cuda.synchronize()
        self.t0 = time.perf_counter()

    def on_train_step_end(self, context: Any) -> None:
        import torch

        from vlmtrain.observe import flops
        from vlmtrain.observe.metrics_callback import loss_values, step_rates

        torch.cuda.synchronize()
        step_s = time.perf_counter() - self.t0
        fl = flops.step_flops(self.run, self.counters.samples)
        row: dict[str, Any] = {"step": context.state.train_state.step, "step_s": step_s,
                               "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30, **self.counters.totals,
                               **step_rates(self.run, self.counters.totals, fl, step_s, 1),
                               **loss_values(context.loss_dict)}
        self.counters.reset()
        store.append_jsonl(self.path, row)


def rank_main(run_dir: Path) -> int:
    """The one torchrun rank: the recipe's container through Bridge's pretrain() and the recipe's forward step."""
    from megatron.bridge.models.qwen_vl.qwen3_vl_step import forward_step
    from megatron.bridge.training.pretrain import pretrain

    from vlmtrain.train import trainer
    from vlmtrain.train.step_counters import StepCounters

    run = h1_run(run_dir)
    cfg = recipe_config(run)
    trainer.use_prebuilt_dataset_helpers()  # the core wheel ships the helpers built but no Makefile (STACK.md)
    counters = StepCounters(run, resolve(run), nullcontext)
    pretrain(cfg, counters.wrap(forward_step), callbacks=[PeerMetrics(run, counters)])
    return 0


def command(run_dir: Path, port: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=1", "--nnodes=1", "--master-port",
            str(port), "-m", MODULE, RANK_FLAG, str(run_dir)]


def run_once(i: int, machine_run: str, out: Path, results_path: Path) -> dict[str, Any] | None:
    """Run i of this machine run in its own process and directory, its row appended (None when it failed)."""
    run_dir = out / machine_run / f"run{i}"
    run_dir.mkdir(parents=True, exist_ok=True)
    from vlmtrain.data import prepare

    h1 = h1_run(run_dir)
    prepare.prepare(h1, resolve(h1))  # compose and the data scan on CPU before the rank starts, as vlmtrain.flow does
    print(f"[bridge-recipe] run {i + 1} ({machine_run}) in {run_dir}", flush=True)
    port = int(os.environ.get("MASTER_PORT") or runner.free_port())
    run = runner.spawn(command(run_dir, port), run_dir, port=port)
    rc = run.wait()
    wall = round(run.wall_s(), 1)
    summary = run_summary.summarize(run_dir, keys=run_summary.SUMMARY_KEYS)
    print(f"[bridge-recipe] run {i + 1}: rc {rc} in {wall} s {json.dumps(summary)}", flush=True)
    if rc != 0 or "useful_tokens_per_s_per_gpu" not in summary:
        print((run_dir / "train.log").read_text()[-4000:], flush=True)
        return None
    return store.append(results_path, NAME, ENTRY, summary, machine_run=machine_run, run=i,
                          wall_s=wall, recipe=RECIPE, changes=CHANGES, config=H1)


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3, help="runs on this machine run (recorded ones are skipped)")
    ap.add_argument("--dry-run", action="store_true", help="CPU: build the recipe's container and validate it")
    ap.add_argument("--results", type=Path, default=ROOT / "results" / "perf_h200.jsonl")
    ap.add_argument("--out", type=Path, default=ROOT / "outputs" / "bridge_recipe")
    ap.add_argument("--budget-s", type=float, default=None, help="start no run that would end after this many s")
    ap.add_argument(RANK_FLAG, type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.rank:
        return rank_main(args.rank)
    if args.dry_run:
        dry_run(args.out / "dry-run")
        return 0
    machine_run = store.machine_run()
    have = repeats.done(args.results, NAME, machine_run)
    print(f"[bridge-recipe] {have} of {args.repeats} runs recorded on {machine_run}", flush=True)
    t0, walls = time.monotonic(), []
    for i in range(have, args.repeats):
        if args.budget_s is not None and walls and time.monotonic() - t0 + max(walls) > args.budget_s:
            print(f"[bridge-recipe] budget: {args.budget_s:.0f} s would be exceeded; runs {i + 1}.. not started")
            return 0
        started = time.monotonic()
        if run_once(i, machine_run, args.out, args.results) is None:
            return 1
        walls.append(time.monotonic() - started)
    if have < args.repeats:
        repeats.append_summary(args.results, NAME, machine_run, f"{ENTRY} --repeats {args.repeats}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
