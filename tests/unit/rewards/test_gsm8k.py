import pytest

from align.rewards import BadReference, get_verifier
from tests.unit.rewards.conftest import chance, derangement, plain_final, rate

V = get_verifier("gsm8k")

# (completion, reference, expected value, expected extracted answer)
EDGES = [
    ("so she makes 18 dollars.\n#### 18", "#### 18", 1.0, "18"),
    ("#### $1,000.00", "#### 1000", 1.0, "1000"),
    ("The answer is 5.00", "5", 1.0, "5"),
    ("The answer is 5.", "#### 5", 1.0, "5"),
    ("It drops by 3, so -3", "#### -3", 1.0, "-3"),
    ("#### 114,200", "He made ... 109,200+5,000=$<<109200+5000=114200>>114,200\n#### 114,200", 1.0, "114200"),
    ("#### 7\n\nQuestion: what is 3+4? Answer: 9", "#### 7", 1.0, "7"),  # kept generating after the answer
    ("#### seven\nso 7", "7", 1.0, "7"),  # an unreadable "####" line falls back to the last number
    ("I think 12 then 13", "12", 0.0, "13"),  # the last number, not any number
    ("10-3=7", "-3", 0.0, "7"),
    ("#### 0.5", "#### 5", 0.0, "0.5"),
    ("#### 50", "#### 5", 0.0, "50"),
    ("no idea", "#### 5", 0.0, None),
    ("", "#### 5", 0.0, None),
]


@pytest.mark.parametrize("completion, reference, value, extracted", EDGES)
def test_edges(completion, reference, value, extracted):
    s = V.score(completion, reference)
    assert (s.value, s.extracted) == (value, extracted)
    assert s.extraction_failed == (extracted is None)


def test_every_bundled_gold_scores_100_percent(gsm8k_all):
    # eval's oracle mode: the reference answer field itself is the completion.
    assert rate(V, gsm8k_all, gsm8k_all) == 1.0


def test_shuffled_golds_score_the_chance_rate(gsm8k_all):
    perm = derangement(len(gsm8k_all))
    refs = [gsm8k_all[j] for j in perm]
    expected = chance([plain_final(a) for a in gsm8k_all], perm)
    assert expected < 0.05  # else this test could not tell a verifier that cannot fail from one that works
    assert rate(V, gsm8k_all, refs) == pytest.approx(expected, abs=1e-12)


def test_reported_reference_is_normalised():
    assert V.score("x", "#### 1,200.00").reference == "1200"


@pytest.mark.parametrize("reference", ["#### 5 or 6", "#### five", "the answer is 5", "", "#### "])
def test_unreadable_reference_is_refused(reference):
    with pytest.raises(BadReference, match="gsm8k reference"):
        V.normalize_reference(reference)
    with pytest.raises(BadReference):
        V.score("5", reference)
