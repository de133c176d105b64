"""The preference losses' names and hyper-parameter rules, in plain Python: the config layer checks
them before any heavy work (no torch import). The math is in align/objectives/preference_losses.py."""

from __future__ import annotations

import math
from enum import StrEnum


class PreferenceLoss(StrEnum):
    sigmoid = "sigmoid"
    """DPO (Rafailov et al. 2023)."""
    ipo = "ipo"
    """IPO (Azar et al. 2023), log-ratios averaged over response tokens."""
    hinge = "hinge"
    """SLiC's hinge on the DPO log-ratio difference (Zhao et al. 2023)."""
    robust = "robust"
    """Robust DPO (Chowdhury et al. 2024): unbiased under labels flipped with probability label_smoothing."""
    conservative = "conservative"
    """Conservative DPO: sigmoid with label smoothing (Mitchell 2023)."""
    simpo = "simpo"
    """SimPO (Meng et al. 2024): reference-free, length-normalised, target margin simpo_gamma."""
    orpo = "orpo"
    """ORPO (Hong et al. 2024): reference-free, odds-ratio term weighted by beta plus the chosen NLL."""


REFERENCE_FREE = frozenset({PreferenceLoss.simpo, PreferenceLoss.orpo})
SMOOTHED = frozenset({PreferenceLoss.robust, PreferenceLoss.conservative})


def needs_reference(loss: PreferenceLoss | str) -> bool:
    """Whether the loss reads a reference model's log-probs (so the objective must provide one)."""
    return as_loss(loss) not in REFERENCE_FREE


def as_loss(loss: PreferenceLoss | str) -> PreferenceLoss:
    try:
        return PreferenceLoss(loss)
    except ValueError:
        choices = ", ".join(m.value for m in PreferenceLoss)
        raise ValueError(f"loss: {loss!r} is not one of {choices}") from None


def _finite_number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name}: must be a finite number (got {value!r})")
    return float(value)


def check_hyperparameters(loss: PreferenceLoss | str, *, beta: float, label_smoothing: float = 0.0,
                          simpo_gamma: float = 0.0) -> PreferenceLoss:
    """Refuse values the loss cannot use, with a one-line ValueError naming the parameter; cheap (plain
    Python), so the config layer can call it before any heavy work. Returns the loss as the enum."""
    kind = as_loss(loss)
    if _finite_number("beta", beta) <= 0:
        raise ValueError(f"beta: must be > 0 (got {beta!r})")
    eps = _finite_number("label_smoothing", label_smoothing)
    if not 0.0 <= eps < 0.5:
        raise ValueError(f"label_smoothing: must lie in [0, 0.5) (got {label_smoothing!r})")
    if eps and kind not in SMOOTHED:
        raise ValueError(f"label_smoothing: used by robust and conservative only; loss={kind.value} would ignore it "
                         f"(got {label_smoothing!r})")
    gamma = _finite_number("simpo_gamma", simpo_gamma)
    if gamma < 0:
        raise ValueError(f"simpo_gamma: must be >= 0 (got {simpo_gamma!r})")
    if gamma and kind is not PreferenceLoss.simpo:
        raise ValueError(f"simpo_gamma: used by simpo only; loss={kind.value} would ignore it (got {simpo_gamma!r})")
    return kind


__all__ = ["REFERENCE_FREE", "SMOOTHED", "PreferenceLoss", "as_loss", "check_hyperparameters", "needs_reference"]
