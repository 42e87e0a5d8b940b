"""The benchmarks Megatron Bridge's own recipes run at as vlmtrain's peer (vlmtrain.lab.bridge_recipe), as data: per
benchmark, the recipe function, vlmtrain's description of the same model, data and batch, and every field changed
from the recipe with why. Changes every benchmark shares are in COMMON_CHANGES (applied by bridge_recipe)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from vlmtrain.lab.kit.case import Case

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

ITERATIONS = 8
"""run_summary.SKIP warm-up steps + 5 counted, as the vlmtrain cases (conf/tune/perf_h200.yaml)."""
LAYERS = 4


@dataclass(frozen=True)
class Benchmark:
    """One benchmark's peer: `recipe` (Bridge's recipe function, dotted), `run` (the peer's case: its name in the
    results file, under its benchmark's prefix; its overrides, vlmtrain's description of the benchmark: the published
    HF config the recipe would download, the realistic data and offline processor, FLOPs and peak, from which the
    recipe's container is not built; the rank it runs), `hub_layers` (the published decoder depth), `ep` (the
    recipe's expert parallel size), `changes` (this benchmark's own changed fields, beside COMMON_CHANGES)."""

    name: str
    recipe: str
    run: Case
    hub_layers: int
    ep: int
    changes: tuple[tuple[str, str], ...]

    def all_changes(self) -> dict[str, str]:
        """Every field changed from the recipe, and why (kept: everything else)."""
        return {"model.expert_model_parallel_size": f"{self.ep} -> 1 (one GPU)",
                "model.num_layers": f"{self.hub_layers} -> {LAYERS} (benchmark {self.name.upper()}; every layer's "
                                    "shape kept)",
                **dict(self.changes), **COMMON_CHANGES}

    def apply(self, cfg: ConfigContainer) -> None:
        """This benchmark's own changes (the ones in `changes`) on the recipe's container."""
        if "model.mtp_num_layers" in dict(self.changes):
            cfg.model.mtp_num_layers = None


COMMON_CHANGES = {
    "train.train_iters": f"-> {ITERATIONS} (benchmark length: run_summary.SKIP warm-up steps + 5 counted)",
    "model (provider)": "AutoBridge.from_hf_pretrained(<hub id>) -> AutoBridge.from_hf_config(the same published "
                        "config, built offline by vlmtrain.config.groups.model.hf_config): no hub access; "
                        "load_weights=False as in the recipe, no pretrained checkpoint",
    "dataset.source": "cord_v2 from the hub -> vlmtrain's data=realistic JSONL (the checked copy), same "
                      "DirectHFSFTDatasetConfig, preprocessing and collate",
    "dataset.hf_processor_path": "<hub id> -> vlmtrain's offline processor for the model (real Qwen tokenizer, the "
                                 "model's image settings)",
    "dataset.do_validation/do_test": "true -> false (the realistic files have one split; eval_interval 500 never "
                                     "comes in 8 iterations)",
    "checkpoint.save/load": "nemo_experiments/default/checkpoints -> none (no checkpoint written or resumed: a "
                            "benchmark, and a later run must not resume an earlier one)",
    "logger.tensorboard_dir": "nemo_experiments/default/tb_logs -> <run dir>/tb_logs",
    "model.gradient_accumulation_fusion": "true -> false (forced by this stack: without APEX the ViT merger's "
                                          "non-TE ColumnParallelLinear fails)",
}

RANK = "vlmtrain.lab.bridge_recipe_rank"
"""The peer's one torchrun rank: the recipe through Bridge's pretrain()."""


def peer(name: str, overrides: list[str]) -> Case:
    """A benchmark's peer run: one GPU (its command line adds gpus_per_node=1), its rank RANK."""
    return Case(f"{name}_bridge-recipe", 1, overrides, module=RANK)


H1 = Benchmark(
    "h1", "megatron.bridge.recipes.qwen_vl.h100.qwen3_vl.qwen3_vl_30b_a3b_sft_8gpu_h100_bf16_config",
    peer("h1", ["model=qwen3_vl_30b_a3b", f"model.num_layers={LAYERS}", "data=realistic", "hardware=h200",
                "train.seq_length=4096", "parallelism=3d", "parallelism.ep=1", "train.micro_batch_size=2",
                "train.global_batch_size=32", "dispatcher=alltoall", "vision=trainable"]),
    hub_layers=48, ep=8, changes=())
"""H1's peer: Qwen3-VL-30B-A3B's recipe (every tower trainable, MBS 2, GBS 32, alltoall, in-batch packing deferred to
its step)."""

H2 = Benchmark(
    "h2", "megatron.bridge.recipes.qwen_vl.h100.qwen35_vl.qwen35_vl_35b_a3b_sft_2gpu_h100_bf16_fsdp_config",
    peer("h2", ["model=qwen35_vl_35b_a3b", f"model.num_layers={LAYERS}", "data=realistic", "hardware=h200",
                "train.seq_length=4096", "parallelism=fsdp", "parallelism.ep=1", "train.micro_batch_size=4",
                "train.global_batch_size=32", "dispatcher=alltoall", "vision=trainable"]),
    hub_layers=40, ep=2,
    changes=(("model.mtp_num_layers", "1 -> none (benchmark H2 is the 4 decoder layers: vlmtrain's model and FLOP "
                                      "count have no MTP layer, so both sides do the same work)"),))
"""H2's peer: Qwen3.5-VL-35B-A3B's Megatron-FSDP recipe (every tower trainable, MBS 4, GBS 32, alltoall, full
recompute, in-batch packing deferred to its step); 4 layers keep the published 3 Gated DeltaNet + 1 full attention
(the provider's linear_attention_freq 4)."""

BENCHMARKS = {b.name: b for b in (H1, H2)}
