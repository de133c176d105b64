"""DataLoader kwargs, built as data so preflight can check their names (docs/pitfalls.md#7). No torch
import here: preflight builds them before deciding whether torch is needed at all."""

from __future__ import annotations

from typing import Any

NUM_WORKERS = 0
"""BatchStream's collate workers (the trainer keeps the default)."""


def _identity(x: Any) -> Any:
    return x


def loader_kwargs(num_workers: int, pin_memory: bool) -> dict[str, Any]:
    # generator: BatchStream gives each epoch's loader its own; None here only names the key for preflight.
    kw: dict[str, Any] = {"batch_size": None, "shuffle": False, "collate_fn": _identity,
                          "num_workers": num_workers, "pin_memory": pin_memory, "generator": None}
    if num_workers > 0:
        kw.update(prefetch_factor=4, persistent_workers=False)
    return kw
