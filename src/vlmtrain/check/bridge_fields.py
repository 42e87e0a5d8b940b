"""The `+bridge.<section>.<field>` passthrough checked before anything is built: every path must name a field of
Megatron Bridge's own config classes, the ground truth its override parser applies them to (the ConfigContainer's
sections, and for `model` the provider the run's model group builds). Bridge's parser would refuse a typo only when
the container is built (on a GPU node, after the ranks start) with Hydra's hint for its own command line; this
names the closest field instead. Bridge is imported only for a run with such overrides (the rest of preflight stays
free of torch and Bridge), so the dry-run plan, the launcher and the -m sweeper call it beside preflight.check.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from vlmtrain.check.preflight import Finding, Severity

if TYPE_CHECKING:
    from vlmtrain.config.schema import RunConfig

RULE = "bridge_field_exists"
PLACEHOLDER_IDS = {"bos_token_id": 1, "eos_token_id": 2, "image_token_id": 3, "video_token_id": 4,
                   "vision_start_token_id": 5, "vision_end_token_id": 6}
"""Token ids for building the provider only to read its fields (the real ones need the tokenizer; no field
depends on them)."""


def paths(tree: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    """The dotted path of every leaf of the passthrough tree ({"model": {"x": 1}} -> "model.x")."""
    for key, value in tree.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            yield from paths(value, path)
        else:
            yield path


def _fields(cls: type) -> dict[str, Any]:
    """A dataclass's field names -> their types (the annotation text where a forward reference does not resolve)."""
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - a library annotation that does not resolve here: the names still count
        hints = {}
    return {f.name: hints.get(f.name, f.type) for f in dataclasses.fields(cls)}


def _section(tp: Any) -> type | None:
    """The one dataclass a field holds (`X`, `X | None`); None where it holds none or several (Bridge's dataset
    configs): its fields are then Bridge's parser's to check when the container is built."""
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return tp
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        found = [a for a in typing.get_args(tp) if isinstance(a, type) and dataclasses.is_dataclass(a)]
        return found[0] if len(found) == 1 else None
    return None


def unknown(path: str, root: type, model: type) -> str | None:
    """Why `+bridge.<path>` names no field of Bridge's config (the closest field named), None where it does."""
    parts, cls = path.split("."), root
    for i, part in enumerate(parts):
        fields = _fields(cls)
        if part not in fields:
            where = (f"Bridge's {root.__name__} has no section {part!r}" if i == 0 else
                     f"+bridge.{'.'.join(parts[:i])} (Bridge's {cls.__name__}) has no field {part!r}")
            near = difflib.get_close_matches(part, fields, n=1)
            closest = f"+bridge.{'.'.join([*parts[:i], (near or difflib.get_close_matches(part, fields, 1, 0))[0]])}"
            hint = f"Did you mean {closest}?" if near else \
                f"The closest is {closest} (every field: {cls.__module__}.{cls.__name__})."
            return f"+bridge.{path}: {where}. {hint}"
        inner = model if i == 0 and part == "model" else _section(fields[part])
        if inner is None:
            return None
        cls = inner
    return None


def findings(run: RunConfig) -> list[Finding]:
    """One error finding per `+bridge.*` path Bridge's config lacks ([] without the passthrough: nothing imported)."""
    tree = run.bridge if isinstance(run.bridge, Mapping) else {}
    wanted = list(paths(tree))
    if not wanted:
        return []
    from megatron.bridge.training.config import ConfigContainer

    from vlmtrain.config.groups import model

    provider = type(model.build_provider(run, PLACEHOLDER_IDS))
    return [Finding(RULE, Severity.error, msg) for p in wanted if (msg := unknown(p, ConfigContainer, provider))]
