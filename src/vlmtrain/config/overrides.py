"""Typo'd command-line keys: name the valid keys (and the closest one) before Hydra composes.

Hydra already lists the options of a config group (`parallelism=fsd` -> "Available options: 3d, fsdp"), but a
misspelt key only gets "Key 'micro_batch' not in 'TrainConfig'" and a misleading hint to add `+`. The schema
dataclasses know every valid key, so this check answers with them.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any

from vlmtrain.config.groups import CHOSEN
from vlmtrain.config.schema import RunConfig


def _dataclass_of(tp: Any) -> type | None:
    """The dataclass inside `X`, `X | None` or `Optional[X]`, if any."""
    if dataclasses.is_dataclass(tp):
        return tp  # type: ignore[return-value]
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        for arg in typing.get_args(tp):
            if dataclasses.is_dataclass(arg):
                return arg
    return None


def unknown_key(key: str) -> str | None:
    """A message if `key` (dotted) is not a field of the run schema; None if valid or free-form."""
    cls: type = RunConfig
    walked: list[str] = []
    for part in key.split("."):
        hints = typing.get_type_hints(cls)
        if part not in hints:
            where = ".".join(walked) or "the top level"
            close = difflib.get_close_matches(part, hints, n=1)
            hint = f" Did you mean {'.'.join([*walked, close[0]])}?" if close else ""
            return f"Unknown key '{key}': {where} has {', '.join(sorted(hints))}.{hint}"
        walked.append(part)
        inner = _dataclass_of(hints[part])
        if inner is None:
            return None  # a leaf, a list or a free-form dict (bridge, hardware.env): Hydra checks the value
        cls = inner
    return None


def check_args(args: list[str]) -> str | None:
    """First problem among plain `key=value` overrides (group choices, +/~ and hydra.* are Hydra's to check)."""
    for arg in args:
        if "=" not in arg or arg.startswith(("+", "~", "-", "hydra.", "hydra/")):
            continue
        key = arg.split("=", 1)[0]
        if key in (*CHOSEN, "experiment") or "/" in key:
            continue
        msg = unknown_key(key)
        if msg:
            return msg
    return None
