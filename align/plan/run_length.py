"""The run's length in optimizer steps: `trainer.max_steps`, or under `trainer.epochs` what the sampler
plans for that many passes over the data (known only once the data is encoded and planned)."""

from __future__ import annotations

import dataclasses
from typing import Any


def plan_run_length(cfg: Any, stream: Any) -> tuple[Any, dict[str, Any]]:
    """`cfg` with `trainer.max_steps` resolved (and `trainer.epochs` cleared: from here max_steps decides)
    and the manifest's `run_length` record. The micro-batches of each epoch are this rank's share of the
    sampler's plan (`rank_batches`: the same count on every rank), which can differ epoch to epoch (a
    budget sampler's cut, a mixture's fractional weight); a window of `grad_accum` that the last epoch
    cannot fill is left out rather than spilling into an epoch not asked for."""
    t = cfg.trainer
    if t.epochs is None:
        return cfg, {"decided_by": "trainer.max_steps", "max_steps": t.max_steps, "epochs": None}
    per_epoch = [len(stream.sampler.rank_batches(e)) for e in range(t.epochs)]
    steps = sum(per_epoch) // t.grad_accum
    if steps < 1:
        from align.errors import ConfigError

        raise ConfigError("trainer.epochs", f"plans {sum(per_epoch)} micro-batches per rank, fewer than one "
                          f"optimizer step of trainer.grad_accum={t.grad_accum}: more data or a smaller grad_accum",
                          t.epochs)
    record = {"decided_by": "trainer.epochs", "max_steps": steps, "epochs": t.epochs,
              "micro_batches_per_epoch": per_epoch, "grad_accum": t.grad_accum,
              "micro_batches_left_out": sum(per_epoch) - steps * t.grad_accum}
    trainer = dataclasses.replace(t, max_steps=steps, epochs=None)
    return dataclasses.replace(cfg, trainer=trainer), record
