"""The schema of objective=reward_model (align/objectives/reward_model.py): a Bradley-Terry reward model
trained on preference pairs, the causal LM's backbone under a scalar head."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from align.config.objective import ObjectiveConfig
from align.config.rules import _require


@dataclass
class RewardModelConfig(ObjectiveConfig):
    """objective=reward_model: a scalar reward per sequence, trained so that a pair's chosen side scores
    above its rejected side (align/objectives/reward_model.py)."""

    kind: str = "reward_model"
    """reward_model: the model is the family's AutoModelForSequenceClassification class with num_labels=1
    (align/models/scalar_head.py); per pair -logsigmoid(r_chosen - r_rejected), TRL's RewardTrainer loss."""
    reads_pairs = True
    reads_margin = True
    scalar_head = True
    center_rewards_coefficient: Optional[float] = None
    """TRL's center_rewards_coefficient: adds coefficient x mean((r_chosen + r_rejected)^2), which keeps
    the rewards centred on 0; null: no such term."""
    eval_pairs: int = 0
    """The first this many pairs of the data are held out of training: the share of them whose chosen side
    scores above its rejected side is `heldout/accuracy` in the history every `eval_every` steps; 0: none."""
    eval_every: Optional[int] = None
    """eval_pairs > 0: steps between held-out accuracies, and one at `trainer.max_steps` where the run names
    it (under `trainer.epochs` the length is known only after the objective is built); null: 10."""
    gate_tolerance: Optional[float] = None
    """The step-0 gate's bound on |batched - alone| rewards; null: 1e-4 in fp32, 5e-2 under bf16 autocast."""

    def __post_init__(self) -> None:
        super().__post_init__()
        c = self.center_rewards_coefficient
        if c is not None:
            _require(math.isfinite(c) and c >= 0, "objective.center_rewards_coefficient",
                     "must be a finite number >= 0, or null", c)
        _require(self.eval_pairs >= 0, "objective.eval_pairs", "must be >= 0", self.eval_pairs)
        if self.eval_every is not None:
            _require(self.eval_pairs > 0, "objective.eval_every", "is read only when objective.eval_pairs > 0 "
                     "(the held-out pairs it scores)", self.eval_every)
            _require(self.eval_every >= 1, "objective.eval_every", "must be >= 1", self.eval_every)
        if self.gate_tolerance is not None:
            _require(math.isfinite(self.gate_tolerance) and self.gate_tolerance > 0, "objective.gate_tolerance",
                     "must be a finite number > 0", self.gate_tolerance)

    def heldout_every(self) -> int:
        """Steps between held-out accuracies (eval_every, or its default)."""
        return self.eval_every or 10
