"""Your own GRPO reward, in TRL's reward-function signature (docs/rewards.md shows this file):

    python -m align.train objective=grpo reward=python reward.function=examples/rewards.py:concise_answer

align calls it once per prompt, by keyword: `prompts` (the prompt as rendered for the model, one per
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
