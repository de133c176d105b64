"""Reward functions for the python-reward tests (`reward.function=tests.python_rewards:<name>`): one per
way a user's function can go wrong, and one that records what it was called with."""

from __future__ import annotations

import math

CALLS: list[dict] = []
"""What `recorded` was called with, in order (cleared by the tests that read it)."""


def recorded(prompts, completions, **kwargs):
    CALLS.append({"prompts": prompts, "completions": completions, **kwargs})
    return [float(len(c) % 3) for c in completions]


def raises(prompts, completions, **kwargs):
    raise ValueError("no score for this one\nsecond line of the message")


def one_short(prompts, completions, **kwargs):
    return [0.0] * (len(completions) - 1)


def not_finite(prompts, completions, **kwargs):
    return [math.nan] + [0.0] * (len(completions) - 1)


def not_a_number(prompts, completions, **kwargs):
    return ["1.0"] * len(completions)


def none_value(prompts, completions, **kwargs):
    return [None] * len(completions)


def not_a_list(prompts, completions, **kwargs):
    return 1.0


def no_kwargs(prompts, completions):
    return [0.0] * len(completions)


def positional_only(prompts, completions, /, **kwargs):
    return [0.0] * len(completions)


def needs_a_field(prompts, completions, judge, **kwargs):
    return [0.0] * len(completions)


async def asynchronous(prompts, completions, **kwargs):
    return [0.0] * len(completions)


NOT_CALLABLE = 3
