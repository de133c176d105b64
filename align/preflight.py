"""Checks that need no tokenizer, encode or model load: they run first and fail in well under 2 s."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from align.config import Source, TrainConfig
from align.errors import ConfigError


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""


def accepted_names(fn: Callable) -> set[str] | None:
    """Parameter names `fn` accepts, or None when it takes **kwargs (checked elsewhere)."""
    params = inspect.signature(fn).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return None
    return {n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def check_kwargs(fn: Callable, kwargs: dict[str, Any], what: str) -> None:
    """Fail by NAME when `fn`, as installed, does not accept a key of `kwargs` (playbook 4.2)."""
    accepted = accepted_names(fn)
    if accepted is None:
        return
    unknown = sorted(set(kwargs) - accepted)
    if unknown:
        raise ConfigError(what, f"{getattr(fn, '__qualname__', fn)} does not accept {unknown}; it accepts: {', '.join(sorted(accepted))}")


def check_files(cfg: TrainConfig) -> Iterable[Check]:
    if cfg.data.source == Source.jsonl:
        p = Path(cfg.data.path or "")
        if not p.is_file():
            raise ConfigError("data.path", f"no such file: {p}")
        yield Check("data file exists", True, str(p))
    if cfg.model.pretrained:
        d = Path(cfg.model.pretrained)
        if not d.is_dir() or not (d / "config.json").is_file():
            raise ConfigError("model.pretrained", f"not a readable HF checkpoint dir (needs config.json): {d}")
        yield Check("checkpoint dir readable", True, str(d))


def run_preflight(cfg: TrainConfig) -> list[Check]:
    return list(check_files(cfg))
