import random

import pytest

from align.rewards import BadReference, get_verifier
from tests.unit.rewards.conftest import chance, derangement, plain_final, rate

V = get_verifier("exact_int")


def additions(n: int = 500, seed: int = 0) -> tuple[list[str], list[str]]:
    """The embedded RL task: add two small numbers; completions as a model that gets them right writes them."""
    rng = random.Random(seed)
    pairs = [(rng.randint(0, 99), rng.randint(0, 99)) for _ in range(n)]
    return [f"{a} + {b} = {a + b}" for a, b in pairs], [str(a + b) for a, b in pairs]


EDGES = [
    ("3 + 4 = 7", "7", 1.0, "7"),
    ("The sum is 12.", "12", 1.0, "12"),
    ("12.0", "12", 1.0, "12"),
    ("-3", "-3", 1.0, "-3"),
    (" 1,000 ", "1000", 1.0, "1000"),
    ("7.5", "7", 0.0, "7.5"),
    ("7 and then 8", "7", 0.0, "8"),
    ("#### 7\nso 8", "7", 0.0, "8"),  # no "####" convention: the last number counts
    ("seven", "7", 0.0, None),
]


@pytest.mark.parametrize("completion, reference, value, extracted", EDGES)
def test_edges(completion, reference, value, extracted):
    s = V.score(completion, reference)
    assert (s.value, s.extracted) == (value, extracted)


def test_additions_gold_100_percent_and_shuffled_at_chance():
    completions, refs = additions()
    assert rate(V, completions, refs) == 1.0
    assert rate(V, refs, refs) == 1.0  # eval's oracle: the reference is the completion
    perm = derangement(len(refs))
    expected = chance(refs, perm)
    assert expected < 0.05
    assert rate(V, completions, [refs[j] for j in perm]) == pytest.approx(expected, abs=1e-12)


def test_gsm8k_golds_against_their_integer_answers(gsm8k_test):
    refs = [plain_final(a) for a in gsm8k_test]
    assert rate(V, gsm8k_test, refs) == 1.0  # a GSM8K answer field ends on its number
    perm = derangement(len(refs))
    expected = chance(refs, perm)
    assert expected < 0.05
    assert rate(V, gsm8k_test, [refs[j] for j in perm]) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("reference", ["7.5", "#### 7", "seven", "", "1,000"])
def test_non_integer_reference_is_refused(reference):
    with pytest.raises(BadReference, match="exact_int reference is not an integer"):
        V.score("7", reference)
