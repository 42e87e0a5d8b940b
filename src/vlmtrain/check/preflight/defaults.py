"""Preflight info: the `auto` defaults a run goes without, and why (check.defaults settled them)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vlmtrain.check.preflight.registry import Severity, rule

if TYPE_CHECKING:
    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig


@rule(Severity.info)
def auto_left_off(run: RunConfig, res: Resolved) -> list[str]:
    """Not a refusal: a user who named no option learns which proven replacement this run lacks and why."""
    return [f"{a.option.removeprefix('data.')} off: {a.why}" for a in res.left_off]
