"""Stand-in rewards for GRPO tests: they fire on random completions (the tiny random-init model almost
never scores under a real verifier, so every advantage would be 0 and nothing would move)."""

from __future__ import annotations

from align.rewards import Reward, Score, WeightedReward


class LengthParity(WeightedReward):
    """1 when the decoded completion's length is odd: about half of random completions. A WeightedReward
    whose one part is this rule (`score_group` scores each completion with `score`)."""

    weights = {"length_parity": 1.0}
    verifiers: dict = {}
    functions: dict = {}

    def __init__(self) -> None:
        pass

    def score(self, completion: str, reference: str) -> Reward:
        v = float(len(completion) % 2)
        return Reward(total=v, parts={"length_parity": Score(value=v, extracted=None, reference=reference)})


class FlatOn(LengthParity):
    """LengthParity, except that every completion of a prompt whose reference is `flat` scores 0: its
    groups never carry signal."""

    def __init__(self, flat: str) -> None:
        self.flat = flat

    def score(self, completion: str, reference: str) -> Reward:
        if reference == self.flat:
            return Reward(total=0.0, parts={"length_parity": Score(value=0.0, extracted=None, reference=reference)})
        return super().score(completion, reference)
