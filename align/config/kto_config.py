"""The schema of objective=kto (align/objectives/kto.py): Kahneman-Tversky optimisation on unpaired
examples, each a prompt, a completion and whether it is desirable."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Optional

from align.config.objective import ObjectiveConfig, ReferenceDtype, ReferenceKind
from align.config.rules import _require


class KTOLoss(StrEnum):
    kto = "kto"
    """TRL's loss_type kto: each completion's log-ratio against the KL reference point z estimated from the
    KL sequences (align/objectives/kto_loss.py)."""
    apo_zero_unpaired = "apo_zero_unpaired"
    """TRL's loss_type apo_zero_unpaired (APO-zero, unpaired): kto's loss with the reference point fixed
    at 0, desirable log-ratios pushed above 0 and undesirable ones below; the KL sequences are not read
    by the loss."""


@dataclass
class KTOConfig(ObjectiveConfig):
    """objective=kto: a loss on unpaired desirable and undesirable completions (align/objectives/kto.py)."""

    kind: str = "kto"
    """kto: each completion's log-ratio to the reference pushed up (desirable) or down (undesirable)
    against a KL reference point estimated from mismatched prompt/completion pairs (TRL's KTOTrainer, its
    loss_type as `loss`; definitions in align/objectives/kto_loss.py)."""
    reads_pairs = True
    reads_unpaired = True
    loss: KTOLoss = KTOLoss.kto
    """kto or apo_zero_unpaired: TRL's KTOConfig.loss_type (definitions in align/objectives/kto_loss.py)."""
    beta: float = 0.1
    """The loss's beta: the scale of the log-ratios inside the sigmoid."""
    desirable_weight: float = 1.0
    """The weight of a desirable example's loss (TRL's desirable_weight)."""
    undesirable_weight: float = 1.0
    """The weight of an undesirable example's loss (TRL's undesirable_weight); the KTO paper keeps
    desirable_weight x desirables / (undesirable_weight x undesirables) in [1, 4/3]."""
    reference: ReferenceKind = ReferenceKind.auto
    """What the log-ratios are measured against, as for objective=dpo: model, adapters_off or
    precomputed (every example's and its KL sequence's log-probs, cached); auto: adapters_off with LoRA,
    else precomputed where the run reads at least one epoch of the examples and model where it reads less."""
    reference_dtype: ReferenceDtype = ReferenceDtype.same
    """reference=model: the frozen copy's parameter dtype (bf16 halves its memory)."""
    gate_tolerance: Optional[float] = None
    """The step-0 gate's bound per target token (nats), as for objective=dpo; null: 1e-4 in fp32, 5e-2
    under bf16 autocast or for a bf16 frozen copy."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for key in ("beta", "desirable_weight", "undesirable_weight"):
            value = getattr(self, key)
            _require(math.isfinite(value) and value > 0, f"objective.{key}", "must be a finite number > 0", value)
        _require(self.reference != ReferenceKind.none, "objective.reference",
                 "kto needs a reference: auto, model, adapters_off or precomputed", "none")
        if self.gate_tolerance is not None:
            _require(math.isfinite(self.gate_tolerance) and self.gate_tolerance > 0, "objective.gate_tolerance",
                     "must be a finite number > 0", self.gate_tolerance)

    def reference_free(self) -> bool:
        """KTO always reads the reference."""
        return False
