"""pass@k against the definition (enumerate every k-subset), maj@k on hand-made votes."""

from __future__ import annotations

import itertools
import math

import pytest

from align.evaluation.metrics import accuracy_metrics, ks_for, majority_correct, pass_at_k


def brute_pass_at_k(n: int, c: int, k: int) -> float:
    draws = list(itertools.combinations([True] * c + [False] * (n - c), k))
    return sum(any(d) for d in draws) / len(draws)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_pass_at_k_is_the_probability_that_k_draws_hold_a_correct_one(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert math.isclose(pass_at_k(n, c, k), brute_pass_at_k(n, c, k), rel_tol=1e-12, abs_tol=1e-12), (n, c, k)


def test_pass_at_k_large_n_does_not_overflow_and_pass_at_1_is_the_rate():
    assert math.isclose(pass_at_k(1000, 250, 1), 0.25)
    assert 0.99 < pass_at_k(1000, 250, 100) <= 1.0


def test_pass_at_k_refuses_impossible_counts():
    for n, c, k in ((4, 5, 1), (4, 1, 0), (4, 1, 5)):
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)


@pytest.mark.parametrize("extracted,correct,want", [
    (["7", "7", "3"], [True, True, False], True),          # clear majority, right
    (["3", "7", "3"], [False, True, False], False),        # majority wrong though one sample is right
    (["3", "7"], [False, True], False),                     # a tie goes to the answer seen first
    (["7", "3"], [True, False], True),
    ([None, None, "7"], [False, False, True], True),        # no answer does not vote
    ([None, None], [False, False], False),                  # nobody voted: wrong
    (["5", None, "5", "7", "7", "7"], [True, False, True, False, False, False], False),
])
def test_majority_vote(extracted, correct, want):
    assert majority_correct(extracted, correct) is want


def test_ks_and_the_metrics_of_a_table():
    assert ks_for(1) == [1] and ks_for(8) == [1, 2, 4, 8] and ks_for(6) == [1, 2, 4, 6]
    extracted = [["1", "1", "2", "1"], ["5", "6", "6", None]]
    correct = [[True, True, False, True], [True, False, False, False]]
    m = accuracy_metrics(extracted, correct)
    assert set(m) == {"pass@1", "pass@2", "pass@4", "maj@2", "maj@4", "accuracy", "extraction_failed"}
    assert math.isclose(m["pass@1"], (3 / 4 + 1 / 4) / 2)
    assert math.isclose(m["pass@4"], 1.0)
    assert m["maj@4"] == 0.5          # prompt 0: "1" wins (right); prompt 1: "6" wins (wrong)
    assert m["maj@2"] == 1.0          # prompt 0: "1" (right); prompt 1: a 5/6 tie goes to "5", seen first (right)
    assert m["extraction_failed"] == 1 / 8
