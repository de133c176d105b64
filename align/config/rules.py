"""Helpers every schema module shares: refusals that name the key, and the rules of `ignored()`."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Iterable, Optional

from align.errors import ConfigError


def _choices(enum: type[StrEnum]) -> str:
    return ", ".join(e.value for e in enum)


def _require(cond: bool, key: str, msg: str, value: Any = None) -> None:
    if not cond:
        raise ConfigError(key, msg, value)


def _opt(label: str, value: Any) -> str:
    return f"{label}={_plain(value)}"


def _only(label: str, current: Any, readers: Iterable[Any]) -> Optional[str]:
    """None when the choice `current` reads the field, else why it is ignored. `label` is a group
    (its options are named after their choice: tests/config/test_compose.py holds them to it) or a key."""
    readers = list(readers)
    if current in readers:
        return None
    if "." in label:
        values = " or ".join(str(_plain(r)) for r in readers)
        return f"ignored by {_opt(label, current)}; it is read when {label} is {values}"
    return f"ignored by {_opt(label, current)}; it is read by {', '.join(_opt(label, r) for r in readers)}"


def _plain(value: Any) -> Any:
    """An enum as the string the user typed (also inside lists), for messages."""
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return getattr(value, "value", value)


def _read(rules: dict[str, Optional[str]]) -> dict[str, str]:
    return {k: why for k, why in rules.items() if why}


AUTO = "auto"


def require_auto_resolved(key: str, value: Any, where: str, resolver: str) -> None:
    """An `auto` the trainer resolves once the device is known (`resolver`) must not reach `where`,
    which reads a number: an error there, never a guess."""
    if value == AUTO:
        raise ValueError(f"{key}={value!r} reached {where} unresolved ({resolver})")


def _switch(key: str, value: Any) -> Any:
    """A true/false/auto switch: bools as given, "auto" kept for the trainer to resolve where the
    device is known (align.plan.compile_auto.resolve_compile)."""
    if isinstance(value, bool) or value == AUTO:
        return value
    raise ConfigError(key, "must be true, false or auto", value)
