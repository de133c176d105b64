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


def check_sources(state: dict[str, Any], mine: dict[str, Any]) -> None:
    """A resume must score and act with the code the checkpoint's rollouts did: each reward function's and
    each tool's source file hash (`reward_functions_sha256`, `tools_sha256` of GRPO's state) as recorded, or
    ConfigError naming the key. A checkpoint that records none while this run has some cannot be vouched for."""
    from align.rewards.function import function_key

    for key, what, name_key in (("reward_functions_sha256", "reward function", function_key),
                                ("tools_sha256", "tool", lambda n: "objective.tools")):
        now = mine[key]
        was = state.get(key, {} if not now else None)
        if was is None:
            raise ConfigError(name_key(next(iter(now))), f"the checkpoint records no {what} source hashes (written "
                              f"before they were kept): it cannot show its rollouts used this run's {what}s")
        for n in sorted(set(was) | set(now)):
            if was.get(n) != now.get(n):
                raise ConfigError(name_key(n), f"the checkpoint's rollouts used {what} {n!r} of source sha256 "
                                  f"{was.get(n)}, this run's is {now.get(n)}: resume with the code it trained with")
