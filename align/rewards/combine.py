"""Rewards from verifiers combined with weights: {"gsm8k": 1.0, "format": 0.1} scores a completion as
1.0 * gsm8k + 0.1 * format. A plain weighted sum, not normalised: a negative weight is a penalty, and
a zero weight keeps a verifier in the record without letting it move the reward."""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real
from typing import Any, Mapping, Optional

from align.errors import ConfigError
from align.rewards.base import Score, Verifier
from align.rewards.registry import get_verifier


@dataclass(frozen=True)
class Reward:
    total: float
    """The weighted sum of the parts' values."""
    parts: Mapping[str, Score]
    """Each verifier's own score, by name."""


class WeightedReward:
    """Weighted verifiers, validated when built (before any generation), scored together."""

    def __init__(self, weights: Mapping[str, float], key: str = "reward.weights") -> None:
        if not isinstance(weights, Mapping) or not weights:
            raise ConfigError(key, "must map verifier names to weights, e.g. {gsm8k: 1.0, format: 0.1}", weights)
        self.weights: dict[str, float] = {}
        self.verifiers: dict[str, Verifier] = {}
        for name, w in weights.items():
            self.verifiers[name] = get_verifier(name, key=f"{key}.{name}")
            if isinstance(w, bool) or not isinstance(w, Real) or not math.isfinite(w):
                raise ConfigError(f"{key}.{name}", "weight must be a finite number", w)
            self.weights[name] = float(w)

    def identity(self) -> dict[str, Any]:
        return {"weights": dict(self.weights), "verifiers": {n: v.identity() for n, v in self.verifiers.items()}}

    def constant(self) -> Optional[float]:
        """The reward every completion gets whatever it says, where the weights fix it (each verifier
        weighted 0 or able to give one value only, `Verifier.VALUES`); None where it can vary."""
        if any(w != 0 and len(set(self.verifiers[n].VALUES)) > 1 for n, w in self.weights.items()):
            return None
        return sum(w * self.verifiers[n].VALUES[0] for n, w in self.weights.items())

    def check_reference(self, reference: str) -> None:
        """BadReference when any weighted verifier cannot read `reference`."""
        for v in self.verifiers.values():
            v.normalize_reference(reference)

    def score(self, completion: str, reference: str) -> Reward:
        parts = {n: v.score(completion, reference) for n, v in self.verifiers.items()}
        return Reward(total=sum(self.weights[n] * s.value for n, s in parts.items()), parts=parts)
