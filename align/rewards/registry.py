"""The one table of verifiers, by the name a config gives (eval's verifier, RL's reward weights)."""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

from align.errors import ConfigError
from align.rewards.answer_format import AnswerFormat
from align.rewards.exact_int import ExactInt
from align.rewards.gsm8k import Gsm8k
from align.rewards.math_answer import MathAnswer
from align.rewards.verifier import Verifier

VERIFIERS: Mapping[str, Verifier] = MappingProxyType(
    {v.name: v for v in (Gsm8k(), MathAnswer(), AnswerFormat(), ExactInt())}
)


def accepted() -> str:
    return ", ".join(sorted(VERIFIERS))


def get_verifier(name: str, key: str = "verifier") -> Verifier:
    """The verifier registered as `name`; ConfigError naming `key` and the accepted names otherwise."""
    try:
        return VERIFIERS[name]
    except (KeyError, TypeError):
        raise ConfigError(key, f"unknown verifier; accepted: {accepted()}", name) from None
