"""The schema of objective=distill (align/objectives/distill.py): on-policy distillation, the student
sampling completions of prompts and a frozen teacher scoring every sampled token."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Optional

from align.config.objective import GenerationDtype, ObjectiveConfig, require_rollout_keys
from align.config.rules import AUTO, _require
from align.generation.engine import Backend


class DistillLoss(StrEnum):
    reverse_kl = "reverse_kl"
    """KL(student || teacher) over the full vocabulary at each completion position (TRL's
    generalized_jsd_loss at beta=1)."""
    jsd = "jsd"
    """TRL's GKD generalised Jensen-Shannon divergence at `beta` (0: forward KL(teacher || student),
    1: reverse KL; align/objectives/distill_loss.py)."""


@dataclass
class DistillConfig(ObjectiveConfig):
    """objective=distill: the student samples completions, a frozen teacher scores each token
    (align/objectives/distill.py)."""

    kind: str = "distill"
    """distill: a per-token divergence between the student's and the teacher's next-token
    distributions over the student's own sampled completions, averaged over completion tokens."""
    samples_prompts = True
    teacher: Optional[str] = None
    """The frozen teacher: a local HF checkpoint dir (required), loaded with the composed family's
    class where its config.json is that family's, else AutoModelForCausalLM, in the student's
    parameter dtype. Its tokenizer must be the student's (same vocabulary and special tokens) and its
    vocabulary size the student's: preflight refuses another."""
    loss: DistillLoss = DistillLoss.reverse_kl
    """reverse_kl or jsd (definitions in align/objectives/distill_loss.py)."""
    beta: float = 0.5
    """loss=jsd only: TRL's interpolation coefficient in [0, 1] (0: forward KL, 1: reverse KL; TRL's
    GKDConfig default 0.5)."""
    group_size: int = 1
    """Completions sampled per prompt."""
    prompts_per_rollout: int = 16
    """Prompts per rollout on each rank (the rollout holds prompts_per_rollout * group_size completions)."""
    updates_per_rollout: int = 1
    """Optimizer steps per rollout: the rollout is cut into this many parts (1: on-policy)."""
    max_new_tokens: int = 4
    """Most tokens generated per completion (a stop token counts)."""
    temperature: float = 1.0
    """Sampling temperature (> 0); the loss divides both models' logits by it (TRL's temperature)."""
    top_p: float = 1.0
    """Nucleus sampling's kept probability mass, in (0, 1]."""
    generation_dtype: GenerationDtype = GenerationDtype.auto
    """As objective=grpo's: the weights the engine generates with (same, bf16 or fp32 copy; auto)."""
    generation_backend: Backend = Backend.auto
    """As objective=grpo's: the rollout engine (auto, align or hf)."""
    generation_batch_size: Any = AUTO
    """As objective=grpo's: rows per engine call, an int >= 1 or auto."""

    def __post_init__(self) -> None:
        super().__post_init__()
        require_rollout_keys(self, "must be a finite number > 0")
        _require(math.isfinite(self.beta) and 0 <= self.beta <= 1, "objective.beta", "must be in [0, 1]", self.beta)
        _require(self.teacher is None or bool(str(self.teacher).strip()), "objective.teacher",
                 "must be a local checkpoint dir", self.teacher)

    def ignored(self, key: str) -> dict[str, str]:
        """beta is read by loss=jsd only (see `check_ignored`)."""
        if self.loss == DistillLoss.jsd:
            return {}
        return {"beta": "is read by objective.loss=jsd only; objective.loss=reverse_kl has no interpolation"}
