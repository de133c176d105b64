"""Rewards from verifiers combined with weights: {"gsm8k": 1.0, "format": 0.1} scores a completion as
1.0 * gsm8k + 0.1 * format. A plain weighted sum, not normalised: a negative weight is a penalty, and
a zero weight keeps a verifier in the record without letting it move the reward. The name `python` weighs
your own function (`reward.function`, align/rewards/function.py) the same way, beside the verifiers."""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real
from typing import Any, Mapping, Optional

from align.errors import ConfigError
from align.rewards.function import NAME, Group, PythonReward, load_function, split_spec
from align.rewards.registry import VERIFIERS, accepted, get_verifier
from align.rewards.verifier import Score, Verifier


@dataclass(frozen=True)
class Reward:
    total: float
    """The weighted sum of the parts' values."""
    parts: Mapping[str, Score]
    """Each verifier's own score, by name."""


def check_weights(weights: Any, key: str = "reward.weights", function: Optional[str] = None) -> None:
    """The checks of WeightedReward that import nothing (config time): names, weights, and `python`
    exactly when `function` is set. ConfigError naming the key otherwise."""
    if not isinstance(weights, Mapping) or not weights:
        raise ConfigError(key, "must map verifier names to weights, e.g. {gsm8k: 1.0, format: 0.1}", weights)
    for name, w in weights.items():
        if name == NAME and function is None:
            raise ConfigError("reward.function", f"{key} weighs {NAME}: name your function, e.g. "
                              "reward.function=mypkg.rewards:score (docs/rewards.md)")
        if name != NAME and name not in VERIFIERS:
            raise ConfigError(f"{key}.{name}", f"unknown verifier; accepted: {accepted()}, or {NAME} with "
                              "reward.function", name)
        if isinstance(w, bool) or not isinstance(w, Real) or not math.isfinite(w):
            raise ConfigError(f"{key}.{name}", "weight must be a finite number", w)
    if function is not None:
        split_spec(function)
    if function is not None and NAME not in weights:
        raise ConfigError("reward.function", f"is read only when {key} weighs {NAME} (reward=python sets "
                          f"{key}.{NAME}: 1.0)", function)


def constant_reward(weights: Mapping[str, float]) -> Optional[float]:
    """The reward every completion gets whatever it says, where the weights fix it (each verifier weighted
    0 or able to give one value only, `Verifier.VALUES`; your function weighted 0); None where it can vary.
    Reads the verifiers' declared values only: your function is not imported."""
    if any(w != 0 and (n == NAME or len(set(get_verifier(n).VALUES)) > 1) for n, w in weights.items()):
        return None
    return sum(w * get_verifier(n).VALUES[0] for n, w in weights.items() if n != NAME)


class WeightedReward:
    """Weighted verifiers and, under the name `python`, your own function: validated when built (before
    any generation), scored together."""

    def __init__(self, weights: Mapping[str, float], key: str = "reward.weights",
                 function: Optional[str] = None) -> None:
        check_weights(weights, key, function)
        self.weights: dict[str, float] = {n: float(w) for n, w in weights.items()}
        self.verifiers: dict[str, Verifier] = {n: get_verifier(n, key=f"{key}.{n}") for n in weights if n != NAME}
        self.function: Optional[PythonReward] = None if function is None else load_function(function)

    def identity(self) -> dict[str, Any]:
        out = {"weights": dict(self.weights), "verifiers": {n: v.identity() for n, v in self.verifiers.items()}}
        return out if self.function is None else {**out, NAME: self.function.identity()}

    def constant(self) -> Optional[float]:
        """The reward every completion gets whatever it says, where the weights fix it (`constant_reward`)."""
        return constant_reward(self.weights)

    def check_reference(self, reference: str) -> None:
        """BadReference when any weighted verifier cannot read `reference`."""
        for v in self.verifiers.values():
            v.normalize_reference(reference)

    def score(self, completion: str, reference: str) -> Reward:
        """The verifiers' weighted sum for one completion (the function scores whole groups: `score_group`)."""
        parts = {n: v.score(completion, reference) for n, v in self.verifiers.items()}
        return Reward(total=sum(self.weights[n] * s.value for n, s in parts.items()), parts=parts)

    def score_group(self, group: Group) -> list[Reward]:
        """Every completion of one prompt: the verifiers one by one, the function once for the group."""
        rewards = [self.score(c, group.reference) for c in group.completions]
        if self.function is None:
            return rewards
        w = self.weights[NAME]
        return [Reward(total=r.total + w * v, parts={**r.parts, NAME: Score(value=v, extracted=None, reference="")})
                for r, v in zip(rewards, self.function(group))]
