"""The ViT's attention at benchmark H1's shapes, alone: TE's fused (cuDNN) attention, PyTorch's varlen FlashAttention-2
and per-image SDPA, forward + backward, median of >= 3 timed repeats with min-max -> results/vit_attention_h200.jsonl.

    python benchmarks/vit_attention.py            # GPU (the TE variant needs the staged stack; the others only torch)
    python benchmarks/vit_attention.py --list     # CPU: the shapes only

The code is vlmtrain.observe.bench.vit_attention (its docstring, or --help, says the rest).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from vlmtrain.observe.bench.vit_attention import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
