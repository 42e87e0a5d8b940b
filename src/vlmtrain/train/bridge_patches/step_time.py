"""quiet_step_time: Bridge's training_log prints `Step Time : ...s GPU utilization: ...MODEL_TFLOP/s/GPU` every
iteration, ungated by any logger setting. That figure counts padding, a frozen ViT's backward and one image per sample
(it read 1034.6 TFLOP/s on an H200, above its 989 peak); vlmtrain prints its own line instead
(observe.step_line). Here train_utils' print_rank_0 drops that one message and passes every other through.
"""

from __future__ import annotations

from typing import Any

from vlmtrain.train.bridge_patches.replace import replace

STEP_TIME_PREFIX = "Step Time : "
"""How Bridge's ungated per-iteration TFLOP/s message starts (train_utils.training_log)."""


def install_quiet_step_time() -> None:
    """train_utils.print_rank_0 (the name training_log calls) without Bridge's Step Time / MODEL_TFLOP/s message."""
    from megatron.bridge.training.utils import train_utils

    print_rank_0 = train_utils.print_rank_0

    def quiet_print_rank_0(message: Any, *args: Any, **kwargs: Any) -> None:
        if not (isinstance(message, str) and message.startswith(STEP_TIME_PREFIX)):
            print_rank_0(message, *args, **kwargs)

    replace("quiet_step_time", train_utils, "print_rank_0", quiet_print_rank_0)
