import pytest

from align.rewards import get_verifier
from tests.unit.rewards.conftest import derangement, rate

V = get_verifier("format")

EDGES = [
    ("work\n#### 18", 1.0, "18"),
    ("work\n#### $1,000.00\n\n", 1.0, "1000"),
    ("####18", 1.0, "18"),
    ("#### 18.", 1.0, "18"),
    ("#### 18\nDone.", 0.0, None),  # the answer line must be the last line
    ("#### eighteen", 0.0, None),
    ("#### 18 eggs", 0.0, None),
    ("The answer is 18", 0.0, None),
    ("", 0.0, None),
]


@pytest.mark.parametrize("completion, value, extracted", EDGES)
def test_edges(completion, value, extracted):
    s = V.score(completion, "ignored")
    assert (s.value, s.extracted) == (value, extracted)


def test_every_bundled_gold_has_the_format(gsm8k_all):
    assert rate(V, gsm8k_all, gsm8k_all) == 1.0


def test_golds_without_their_answer_line_fail(gsm8k_all):
    # The format check never reads the reference, so shuffling references cannot test it: removing
    # what it checks for can. Each gold minus its "####" line ends on a reasoning line.
    stripped = [a.rsplit("####", 1)[0] for a in gsm8k_all]
    assert rate(V, stripped, gsm8k_all) == 0.0


def test_reference_plays_no_part(gsm8k_test):
    perm = derangement(len(gsm8k_test))
    assert rate(V, gsm8k_test, [gsm8k_test[j] for j in perm]) == 1.0
