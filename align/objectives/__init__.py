"""Training objectives: how records become batches and how a micro-batch becomes a loss.
The interface the loop relies on is `Objective` (align/objectives/interface.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from align.objectives.interface import Objective, View

if TYPE_CHECKING:
    from align.config import TrainConfig


def objective_class(cfg: "TrainConfig") -> type:
    """The class of the objective the config names (its static `view` needs no built objective)."""
    from align.config import ObjectiveKind
    from align.objectives.dpo import DPO
    from align.objectives.grpo import GRPO
    from align.objectives.sft import SFT

    return {ObjectiveKind.sft: SFT, ObjectiveKind.dpo: DPO, ObjectiveKind.grpo: GRPO}[cfg.objective.kind]


def build_objective(cfg: "TrainConfig") -> Objective:
    """The objective the config names; `bind(model)` attaches it to the model once parallelized."""
    from align.config.trainer_config import require_chunk_resolved

    require_chunk_resolved(cfg.trainer.loss_chunk_tokens, "the objective")
    return objective_class(cfg)(cfg)


__all__ = ["Objective", "View", "build_objective", "objective_class"]
