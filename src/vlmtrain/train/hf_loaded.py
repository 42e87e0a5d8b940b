"""Did `model.hf_path`'s weights really load? The built model's word embedding against the checkpoint's tensor,
read when the model is built (after Bridge's pretrained_checkpoint load, before step 1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

EMBEDDING = "language_model.embedding.word_embeddings.weight"
HF_EMBEDDING = "model.language_model.embed_tokens.weight"
"""Megatron's name and the HF name of the same tensor (Bridge's Qwen3-VL / Qwen3.5 mapping)."""


def hf_tensor(hf_path: str, name: str) -> Any:
    """One tensor of the checkpoint, from its single file or through the shard index."""
    import json

    from safetensors import safe_open

    path = Path(hf_path)
    index = path / "model.safetensors.index.json"
    file = path / (json.loads(index.read_text())["weight_map"][name] if index.is_file() else "model.safetensors")
    with safe_open(str(file), "pt") as f:
        return f.get_tensor(name)


def embedding_max_diff(hf_path: str, model_chunks: list[Any]) -> float | None:
    """Largest |Megatron - HF| over this rank's rows of the word embedding (its TP slice; a Megatron-FSDP shard is
    gathered first, collectively, as after_build.frozen_checksums does); None on a stage without the embedding."""
    from megatron.core import parallel_state
    from megatron.core.distributed.fsdp.src.megatron_fsdp.uneven_dtensor import uneven_dtensor_to_full_tensor
    from torch.distributed.tensor import DTensor

    from vlmtrain.train.unwrap import unwrap

    for chunk in model_chunks:
        for name, p in unwrap(chunk).named_parameters():
            if name != EMBEDDING:
                continue
            mine = (uneven_dtensor_to_full_tensor(p) if isinstance(p, DTensor) else p).detach().cpu()
            start = parallel_state.get_tensor_model_parallel_rank() * mine.shape[0]
            return max_diff(mine, hf_tensor(hf_path, HF_EMBEDDING)[start:start + mine.shape[0]])
    return None


def max_diff(mine: Any, theirs: Any) -> float:
    """Largest |mine - theirs| over theirs' rows (mine's rows past HF's vocab are padding), the checkpoint's value
    cast to the model's dtype first: the load casts it so (an FP32 checkpoint in a BF16 model loads rounded), so a
    loaded weight is exactly equal after the same cast, and one that did not load is not."""
    return float((mine[: theirs.shape[0]].float() - theirs.to(mine.dtype).float()).abs().max())
