"""The one preflight registry: findings, the rule decorator every rule module registers through, and the checks.

A rule is `fn(run, resolved) -> message | None` (or a list of messages: one finding each): it reads the derived
values (layout, stage split, padding) from config.resolve's `Resolved`, never derives them again, and never mutates
the run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from vlmtrain.config import world

if TYPE_CHECKING:
    from vlmtrain.config.resolve import Resolved
    from vlmtrain.config.schema import RunConfig


class Severity(StrEnum):
    error = "error"
    warning = "warning"
    info = "info"
    """Not a problem: what the run goes without and why (the `auto` defaults left off)."""


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: Severity
    message: str

    def __str__(self) -> str:
        return f"[{self.severity}] {self.rule}: {self.message}"


class PreflightError(ValueError):
    """Raised when a run has error findings; the message lists every one of them."""

    def __init__(self, findings: list[Finding]):
        self.findings = findings
        super().__init__("preflight failed:\n" + "\n".join(f"  {f}" for f in findings))


Rule = Callable[["RunConfig", "Resolved"], str | list[str] | None]
RULES: list[tuple[Severity, Rule]] = []
"""Every rule in registration order (the order of vlmtrain.check.preflight's rule modules, then of each module)."""


def rule(severity: Severity) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        RULES.append((severity, fn))
        return fn

    return register


def bridge(run: RunConfig, section: str, key: str) -> object:
    """The `+bridge.<section>.<key>` passthrough value, None when not given."""
    return world.bridge_section(run, section).get(key)


def check(run: RunConfig, res: Resolved) -> list[Finding]:
    """Every finding for this run (`res`: its config.resolve values); rules named in preflight.ignore are
    downgraded to warnings."""
    out = []
    for severity, fn in RULES:
        msgs = fn(run, res) or []
        sev = Severity.warning if severity == Severity.error and fn.__name__ in run.preflight.ignore else severity
        out += [Finding(fn.__name__, sev, msg) for msg in ([msgs] if isinstance(msgs, str) else msgs)]
    return out


def errors(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity == Severity.error]


def enforce(run: RunConfig, res: Resolved) -> list[Finding]:
    """Raise PreflightError on any error; return the warnings."""
    findings = check(run, res)
    if errors(findings):
        raise PreflightError(errors(findings))
    return findings
