"""Your own GRPO rewards, in TRL's reward-function signature (docs/rewards.md shows this file):

    python -m align.train objective=grpo reward=python reward.function=examples/rewards.py:concise_answer

or several, each weighted by its name beside a verifier:

    python -m align.train objective=grpo reward=exact_int reward.weights.exact_int=0.5 \
        +reward.functions.answer=examples/rewards.py:concise_answer +reward.weights.answer=1.0 \
        +reward.functions.brevity=examples/rewards.py:brevity +reward.weights.brevity=0.2

align calls each once per prompt, by keyword: `prompts` (the prompt as rendered for the model, one per
completion), `completions` (the decoded completions), `completion_ids` (their token ids), and one list per
field of the prompt's record: the bundled addition task (data=add) has `question` and `answer`.
"""

from __future__ import annotations

import re

WORD_PENALTY = 0.1
"""Subtracted for each word of a completion past its first."""


def concise_answer(prompts: list[str], completions: list[str], answer: list[str], **kwargs) -> list[float]:
    """1 when the completion's last integer is the record's `answer`, less WORD_PENALTY per extra word."""
    rewards = []
    for completion, reference in zip(completions, answer):
        numbers = re.findall(r"-?\d+", completion)
        right = 1.0 if numbers and numbers[-1] == reference.strip() else 0.0
        rewards.append(right - WORD_PENALTY * max(len(completion.split()) - 1, 0))
    return rewards


def brevity(prompts: list[str], completions: list[str], completion_ids: list[list[int]], **kwargs) -> list[float]:
    """Minus the completion's length in tokens over 100: weighted small, it prefers the shorter of equal answers."""
    return [-len(ids) / 100 for ids in completion_ids]
