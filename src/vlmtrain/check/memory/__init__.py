"""Per-GPU peak memory estimate of a composed run: does it fit before it queues?

Pure arithmetic on the RunConfig and its resolved values (config.resolve: the layout, the stage split, the
grad-accum and the padding; no Bridge, no torch import), so preflight and the dry-run plan can call it.
The estimate is for the worst rank: every pipeline stage is estimated and the largest one is reported.

What one rank holds (P = parameters it holds, T = its trainable share; dense parts shard over DP, routed
experts over expert-DP; TP/PP/EP/ETP have already split the model before that):

| layout            | BF16 params      | FP32 main grads  | optimizer (FP32 master + Adam m, v) | FSDP buckets      |
|-------------------|------------------|------------------|-------------------------------------|-------------------|
| parallelism=3d    | 2 P              | 4 T              | 12 T / DP (experts: / expert-DP)     | -                 |
| parallelism=fsdp  | 2 P / DP         | 4 T / DP         | 12 T / DP (experts: / expert-DP)     | 2 T (step end)    |

Activations (decoder, ViT, logits, dispatcher, FSDP unit gathers) live during forward-backward; the FSDP
step-end buckets live after backward. The peak is the persistent state plus the larger of the two phases.
`allocated` is what torch.cuda.max_memory_allocated() reports (it is validated against measured H200 runs in
vlmtrain.lab.calibrate.memory_check); `total` adds what the caching allocator does not see (CUDA context, NCCL buffers,
allocator slack) and is compared with the hardware group's `memory_gib`.

Modules: `params` (parameters per tower and stage), `workload` (what one sample carries, padding),
`activations` (bytes alive during forward-backward), `estimate` (the breakdown, the worst stage, the plan lines).
Architecture facts (shapes, the Qwen3.5 layer pattern) come from vlmtrain.config.architecture.
"""

from vlmtrain.check.memory.activations import GIB
from vlmtrain.check.memory.estimate import (
    CONTEXT_OVERHEAD_GIB,
    GRAD_BYTES,
    OPTIMIZER_BYTES,
    TIGHT,
    MemoryBreakdown,
    estimate,
    keeps_remainders,
    model_state_bytes,
    optimizer_bytes,
    render,
)
from vlmtrain.check.memory.params import StageParams, layer_params, model_param_count, param_counts, stage_params
from vlmtrain.check.memory.workload import Workload, default_workload, image_token_bound

__all__ = [
    "CONTEXT_OVERHEAD_GIB", "GIB", "GRAD_BYTES", "OPTIMIZER_BYTES", "TIGHT", "MemoryBreakdown", "StageParams",
    "Workload", "default_workload", "estimate", "image_token_bound", "keeps_remainders", "layer_params",
    "model_param_count", "model_state_bytes", "optimizer_bytes", "param_counts", "render", "stage_params",
]
