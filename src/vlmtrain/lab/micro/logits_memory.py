"""The cross-entropy phase's memory per logit, by kernels.cross_entropy: what the memory estimate's LOGITS_BYTES
assumes (vlmtrain.check.memory.activations), measured. One H1 micro-batch's logits (a row of 12288 tokens,
Qwen3-VL's vocab of 151936) come out of an output-layer GEMM and go through Megatron's own loss call for each
implementation (`native`: megatron.core.fusions.fused_cross_entropy.fused_vocab_parallel_cross_entropy; `te`:
megatron.core.extensions.transformer_engine.te_parallel_cross_entropy, as language_module.compute_language_model_loss
calls them), then backward. The figure is the allocator's peak over forward + backward above what was allocated
before (the hidden states and the output weight, which takes no gradient here so that its wgrad does not count),
divided by tokens x vocab. Allocation is deterministic, so the repeats agree; they are run and reported anyway
(median, min-max), as every figure here is.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

from vlmtrain.lab.kit import experiments, store

TOKENS, VOCAB, HIDDEN = 12288, 151936, 2048
"""One H1 row through Qwen3-VL-30B-A3B's output layer (vocab 151936, hidden 2048)."""


def _loss(impl: str, logits: Any, labels: Any, group: Any) -> Any:
    """compute_language_model_loss's call for `impl`: labels [b, s] -> [s, b] (te: its strides as Megatron sets)."""
    labels = labels.transpose(0, 1).contiguous()
    if impl == "te":
        import torch
        from megatron.core.extensions.transformer_engine import te_parallel_cross_entropy

        labels = torch.as_strided(labels, labels.size(), (labels.size()[1], 1))
        return te_parallel_cross_entropy(logits, labels, group, False)
    from megatron.core.fusions.fused_cross_entropy import fused_vocab_parallel_cross_entropy

    return fused_vocab_parallel_cross_entropy(logits, labels, group)


def bytes_per_logit(impl: str, tokens: int = TOKENS, vocab: int = VOCAB, hidden: int = HIDDEN) -> float:
    """Peak bytes above the inputs during one forward + backward of the logits and their loss, per logit."""
    import torch
    import torch.distributed as dist

    g = torch.Generator(device="cuda").manual_seed(0)
    hidden_states = torch.randn(tokens, 1, hidden, device="cuda", dtype=torch.bfloat16, generator=g,
                                requires_grad=True)
    weight = torch.randn(vocab, hidden, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    labels = torch.randint(0, vocab, (1, tokens), device="cuda", generator=g)  # [b, s], as Megatron passes them
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    logits = torch.matmul(hidden_states, weight.t())  # [s, b, vocab]
    loss = _loss(impl, logits, labels, dist.group.WORLD)
    del logits
    loss.sum().backward()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / (tokens * vocab)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--repeats", type=experiments.at_least(3, "a median needs them"), default=3)
    experiments.add_results(ap, "logits_memory_h200.jsonl")


def run(a: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():
        print("logits_memory: needs a GPU", file=sys.stderr)
        return 2
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29531", rank=0, world_size=1)
    try:
        for impl in ("native", "te"):
            got = [bytes_per_logit(impl) for _ in range(a.repeats)]
            metrics = {"bytes_per_logit": statistics.median(got), "bytes_per_logit_min": min(got),
                       "bytes_per_logit_max": max(got), "tokens": TOKENS, "vocab": VOCAB, "repeats": a.repeats}
            store.append(a.results, f"logits-memory_{impl}", experiments.command(__name__), metrics,
                           device=torch.cuda.get_device_name(0), torch=torch.__version__)
            print(f"[logits_memory] {impl}: {metrics}", flush=True)
    finally:
        dist.destroy_process_group()
    return 0
