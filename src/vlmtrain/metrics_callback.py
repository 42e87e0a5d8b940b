"""The Bridge Callback that turns each step into one honest row of `<run dir>/metrics.jsonl`.

Per step: step time (CUDA-synchronised wall clock on each rank), peak memory (max over ranks), losses, the
token/image counters and vlmtrain's FLOPs summed over the data-parallel group, useful tokens/s/GPU and MFU.
The last rank (it holds the loss on the last pipeline stage) writes the file.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from megatron.bridge.training.callbacks import Callback

from vlmtrain import metrics, world
from vlmtrain.callbacks import COUNTERS, append_jsonl

if TYPE_CHECKING:
    from vlmtrain.callbacks import StepCounters
    from vlmtrain.schema import RunConfig


class MetricsCallback(Callback):
    def __init__(self, run: RunConfig, counters: StepCounters):
        self.run, self.counters = run, counters
        self.path = Path(run.output_dir) / "metrics.jsonl"
        self.t0 = 0.0

    def _is_writer(self) -> bool:
        import torch.distributed as dist

        return dist.get_rank() == dist.get_world_size() - 1

    def on_train_start(self, context: Any) -> None:
        from vlmtrain import checks

        self.report = checks.after_model_build(self.run, context)
        self.frozen_before = checks.frozen_checksums(context.model)
        self.max_graphed = 0
        self._write_checks()

    def on_train_end(self, context: Any) -> None:
        from vlmtrain import checks

        self.report.update(checks.after_training(self.run, context, self.frozen_before, self.max_graphed))
        self._write_checks()

    def _write_checks(self) -> None:
        if self._is_writer():
            (Path(self.run.output_dir) / "checks.json").write_text(json.dumps(self.report, indent=1))
            print("[vlmtrain] checks: " + json.dumps(self.report), flush=True)

    def on_train_step_start(self, context: Any) -> None:
        import torch

        torch.cuda.synchronize()
        self.t0 = time.perf_counter()

    def on_train_step_end(self, context: Any) -> None:
        import torch
        import torch.distributed as dist
        from megatron.core import parallel_state

        from vlmtrain import checks

        torch.cuda.synchronize()
        step_s = time.perf_counter() - self.t0
        if self.run.cuda_graph.modules:
            self.max_graphed = max(self.max_graphed, checks.graphed_layers(context.model))
        fl = metrics.step_flops(self.run, self.counters.samples)
        local = [float(self.counters.totals[k]) for k in COUNTERS] + [fl.vit, fl.projector, fl.decoder]
        vec = torch.tensor(local, dtype=torch.float64, device="cuda")
        dist.all_reduce(vec, group=parallel_state.get_data_parallel_group())
        peak = torch.tensor([torch.cuda.max_memory_allocated() / 2**30], device="cuda")
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        self.counters.reset()
        if not self._is_writer():
            return
        vals = vec.tolist()
        row: dict[str, Any] = {"step": context.state.train_state.step, "step_s": step_s,
                               "peak_mem_gib": peak.item(), "data_kind": str(self.run.data.kind)}
        row.update({k: int(v) for k, v in zip(COUNTERS, vals[: len(COUNTERS)], strict=True)})
        flops_vit, flops_proj, flops_dec = vals[len(COUNTERS):]
        total = flops_vit + flops_proj + flops_dec
        gpus = world.layout(self.run).world_size
        row.update(flops_vit=flops_vit, flops_projector=flops_proj, flops_decoder=flops_dec, flops=total,
                   useful_tokens_per_s_per_gpu=row["nonpad_tokens"] / step_s / gpus,
                   padded_tokens_per_s_per_gpu=row["padded_tokens"] / step_s / gpus,
                   tflops_per_s_per_gpu=total / step_s / gpus / 1e12,
                   mfu=metrics.mfu(total, step_s, gpus, self.run.hardware.peak_bf16_tflops))
        for k, v in (context.loss_dict or {}).items():
            row[k.replace(" ", "_")] = float(v.item() if hasattr(v, "item") else v)
        if context.grad_norm is not None:
            row["grad_norm"] = float(context.grad_norm)
        append_jsonl(self.path, row)
