"""The bundled GSM8K answers as gold completions, and shuffles that pair each with another question's
reference: the two ways every verifier is tested (gold must score 100%, shuffled must score chance)."""

from __future__ import annotations

import json
import random

import pytest

from align.data.sources import bundled_gsm8k


def gsm8k_answers(split: str) -> list[str]:
    with bundled_gsm8k(split).open() as f:
        return [json.loads(line)["answer"] for line in f]


def plain_final(answer: str) -> str:
    """The reference number read without align's code (the chance rate must not trust what it tests)."""
    return answer.rsplit("####", 1)[1].strip().replace(",", "")


def derangement(n: int, seed: int = 0) -> list[int]:
    """A permutation with no fixed point: every completion meets another question's reference."""
    rng = random.Random(seed)
    while True:
        p = list(range(n))
        rng.shuffle(p)
        if all(i != j for i, j in enumerate(p)):
            return p


def chance(refs: list[str], perm: list[int]) -> float:
    """The rate at which a shuffled pair's references are equal anyway: what a perfect verifier scores."""
    return sum(refs[i] == refs[j] for i, j in enumerate(perm)) / len(refs)


def rate(verifier, completions: list[str], references: list[str]) -> float:
    return sum(verifier.score(c, r).value for c, r in zip(completions, references)) / len(completions)


@pytest.fixture(scope="session")
def gsm8k_test() -> list[str]:
    return gsm8k_answers("test")


@pytest.fixture(scope="session")
def gsm8k_all() -> list[str]:
    return gsm8k_answers("train") + gsm8k_answers("test")
