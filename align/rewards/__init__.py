"""Verifiers and rewards: one registry that evaluation and RL both read.

    get_verifier("gsm8k").score(completion, reference)   -> Score(value, extracted, reference)
    WeightedReward({"gsm8k": 1.0, "format": 0.1}).score(completion, reference) -> Reward(total, parts)

Verifiers: gsm8k ("####" answer else the last number, exact after normalising), math (math-verify),
format (ends on a "#### <number>" line), exact_int (the last number equals an integer reference).
Your own functions (`reward.functions`, each weighted by its name; `reward.function`, weighted as `python`):
align/rewards/function.py.
"""

from align.rewards.combine import Reward, WeightedReward
from align.rewards.registry import VERIFIERS, accepted, get_verifier
from align.rewards.verifier import BadReference, Score, Verifier

__all__ = ["BadReference", "Reward", "Score", "VERIFIERS", "Verifier", "WeightedReward", "accepted", "get_verifier"]
