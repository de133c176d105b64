"""The preflight checklist's results: each check yields `Check`s under a checklist item; a `Report`
renders them. Every item listed here has a check that fails on some input (tests/unit/run/)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Optional, Sequence

from align.errors import ConfigError


class Status(StrEnum):
    passed = "PASS"
    failed = "FAIL"
    warned = "WARN"
    na = "N/A"
    """This config does not make the call or use the file the check is about."""


# The pre-launch checklist (docs/provenance.md): (item id, text, how it is checked here). Only items
# a program can check for this config are here; each has checks that fail on bad input.
CHECKLIST: list[tuple[str, str, str]] = [
    ("tree", "working tree committed", "git diff --quiet && git diff --cached --quiet"),
    ("config", "config validated", "values, files, checkpoint files, attention, device: before any heavy work"),
    ("cache", "cache key covers the change", "content hashes of data and aux files, encode cache key"),
    ("kwargs", "kwargs checked by NAME", "against the installed library signature"),
]
_ITEMS = {i for i, _, _ in CHECKLIST}



@dataclass
class Check:
    item: str
    """Checklist item id (CHECKLIST)."""
    name: str
    status: Status
    detail: str = ""
    key: Optional[str] = None
    """Config key to name when it fails."""

    @property
    def ok(self) -> bool:
        return self.status != Status.failed

    def error(self) -> ConfigError:
        return ConfigError(self.key or f"preflight[{self.name}]", self.detail)

    def as_dict(self) -> dict[str, Any]:
        return {"item": self.item, "name": self.name, "status": self.status.value, "detail": self.detail}


def _item_status(checks: Sequence[Check]) -> Status:
    for s in (Status.failed, Status.warned, Status.passed):
        if any(c.status == s for c in checks):
            return s
    return Status.na


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)
    seconds: float = 0.0
    plan: Any = None
    """The job's plan (align/plan/planner.py), made by the model's checks: the manifest's serving line
    and Trainer.build read it (align/train.py). None where the checks stopped before it."""

    def __iter__(self):
        return iter(self.checks)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def item(self, item: str) -> Status:
        return _item_status([c for c in self.checks if c.item == item])

    def as_list(self) -> list[dict[str, Any]]:
        return [c.as_dict() for c in self.checks]

    def render(self) -> str:
        lines = []
        for item, text, how in CHECKLIST:
            checks = [c for c in self.checks if c.item == item]
            st = _item_status(checks)
            box = {"PASS": "[x]", "FAIL": "[!]", "WARN": "[~]", "N/A": "[-]"}[st.value]
            lines.append(f"{box} {text:<30} {st.value:<4}  ({how})")
            for c in checks:
                detail = f": {c.detail}" if c.detail else ""
                lines.append(f"      {c.status.value:<4} {c.name}{detail}")
        n = {s: sum(1 for c in self.checks if c.status == s) for s in Status}
        verdict = "PASS" if self.ok else "FAIL"
        lines.append(f"preflight {verdict}: {n[Status.passed]} passed, {n[Status.failed]} failed, "
                     f"{n[Status.warned]} warnings, {n[Status.na]} not checkable here ({self.seconds:.2f} s)")
        return "\n".join(lines)


class _Stop(Exception):
    def __init__(self, check: Check) -> None:
        self.check = check


@dataclass
class Context:
    """What checks share: where the code lives (its git tree is the one that must be clean)."""

    root: Path
    stop_on_fail: bool
    checks: list[Check] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    """What a cheap check learnt that a later one reads (`top_token`: the largest id of pre-tokenized
    rows and its file:line, for the model's vocabulary check)."""
    plan: Any = None
    """The job's plan, once the model's checks have made it (align/run/model_checks.py)."""

    def add(self, check: Check) -> None:
        assert check.item in _ITEMS, check.item
        self.checks.append(check)
        if self.stop_on_fail and check.status == Status.failed:
            raise _Stop(check)
