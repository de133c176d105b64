"""Training objectives: how records become batches and how a micro-batch becomes a loss.
The interface the loop relies on is `Objective` (align/objectives/base.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from align.objectives.base import Objective

if TYPE_CHECKING:
    import torch

    from align.config import TrainConfig


def build_objective(cfg: "TrainConfig", model: "torch.nn.Module") -> Objective:
    """The objective the config names, bound to the (parallelized) model it trains."""
    from align.config import ObjectiveKind
    from align.objectives.sft import SFT

    builders = {ObjectiveKind.sft: lambda: SFT(model, cfg.trainer.loss_chunk_tokens)}
    return builders[cfg.objective.kind]()


__all__ = ["Objective", "build_objective"]
