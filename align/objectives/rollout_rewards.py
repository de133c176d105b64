"""A generation round's completions scored by the reward (align/rewards): one group per prompt, so that each
python reward (`reward.function`, `reward.functions`) is called once per prompt with that prompt's
completions and a failure names the function and the prompt. A reward model (`reward.path`) scores the
round's completions of all its prompts together, in its own batches.

A python reward can fail on one rank's prompts only, and the other ranks would then wait at the next
collective for a rank that has stopped: every rank learns whether any rank's reward failed, and all of
them stop with a one-line error (exit 2).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from align.errors import ConfigError


def score_rollout(reward: Any, prompts: Any, rows: np.ndarray, completions: Sequence[Any],
                  decode: Callable[[list[int]], str],
                  any_rank: Callable[[bool], bool]) -> tuple[np.ndarray, dict[str, float]]:
    """(the reward of each completion, each part's value summed over the completions). `prompts` is the
    PromptSet, `rows[c.prompt_index]` the row of completion c's prompt."""
    by_prompt: dict[int, list[int]] = {}
    for j, c in enumerate(completions):
        by_prompt.setdefault(c.prompt_index, []).append(j)
    totals = np.zeros(len(completions), dtype=np.float64)
    parts: dict[str, float] = {}
    failed = None
    try:
        groups = []
        for i, js in by_prompt.items():
            ids = [list(completions[j].token_ids) for j in js]
            groups.append(prompts.group(int(rows[i]), [decode(t) for t in ids], ids))
        for js, scored in zip(by_prompt.values(), reward.score_groups(groups)):
            for j, r in zip(js, scored):
                totals[j] = r.total
                for name, s in r.parts.items():
                    parts[name] = parts.get(name, 0.0) + s.value
    except ConfigError as e:
        failed = e
    functions = getattr(reward, "functions", None)
    if functions and any_rank(failed is not None) and failed is None:
        key = next(iter(functions.values())).key if len(functions) == 1 else "reward.functions"
        raise ConfigError(key, "another rank's reward function failed on its prompts (that rank's own error line "
                          "names the function and the prompt)")
    if failed is not None:
        raise failed
    return totals, parts
