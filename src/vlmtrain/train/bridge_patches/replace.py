"""Each replacement is installed once per process through `replace`, which keeps the original for `uninstall()`
(tests undo them; two replacements may wrap one attribute, so they unwind latest first).
"""

from __future__ import annotations

from typing import Any

_installed: dict[str, tuple[Any, str, Any]] = {}


def replace(name: str, owner: Any, attr: str, new: Any) -> None:
    """Set owner.attr = new once per process, keeping the original for uninstall()."""
    if name not in _installed:
        _installed[name] = (owner, attr, owner.__dict__.get(attr))
        setattr(owner, attr, new)


def uninstall() -> None:
    """Restore every replaced attribute (tests), the latest first: two replacements may wrap one attribute."""
    for owner, attr, original in reversed(_installed.values()):
        if original is None:
            delattr(owner, attr)
        else:
            setattr(owner, attr, original)
    _installed.clear()


def installed() -> list[str]:
    return sorted(_installed)
