import signal
import threading
from importlib.metadata import version

import pytest

from align.rewards import BadReference, get_verifier
from tests.unit.rewards.conftest import chance, derangement, plain_final, rate

V = get_verifier("math")

EDGES = [
    ("The answer is $\\boxed{\\frac{1}{2}}$", "0.5", 1.0),
    ("so x = 3/4", "\\frac34", 1.0),
    ("$\\boxed{\\sqrt{2}}$", "\\sqrt 2", 1.0),
    ("$\\boxed{2\\pi}$", "2\\pi", 1.0),
    ("The final answer is $\\boxed{x^2+2x+1}$", "(x+1)^2", 1.0),
    ("$\\boxed{\\{1, 2, 3\\}}$", "\\{3, 2, 1\\}", 1.0),
    ("#### 114,200", "114200", 1.0),
    ("$\\boxed{\\frac{1}{3}}$", "0.5", 0.0),
    ("$\\boxed{\\sqrt{3}}$", "\\sqrt 2", 0.0),
    ("The final answer is $\\boxed{x^2+1}$", "(x+1)^2", 0.0),
    ("I do not know", "5", 0.0),
]


@pytest.mark.parametrize("completion, reference, value", EDGES)
def test_edges(completion, reference, value):
    assert V.score(completion, reference).value == value


def test_gsm8k_golds_100_percent_and_shuffled_at_chance(gsm8k_test):
    # Read from the "####" line: math-verify alone reads a worked solution's last expression
    # ("33.333...%, which rounds down to 33%" then "#### 33" reads as 33.333).
    golds = gsm8k_test[:500]  # symbolic comparison is the slow part: a few hundred keep the test short
    assert rate(V, golds, golds) == 1.0
    perm = derangement(len(golds))
    expected = chance([plain_final(a) for a in golds], perm)
    assert expected < 0.05
    assert rate(V, golds, [golds[j] for j in perm]) == pytest.approx(expected, abs=1e-12)


def test_no_expression_is_an_extraction_failure():
    s = V.score("I do not know", "5")
    assert s.extraction_failed and s.reference == "5"


def test_unreadable_reference_is_refused():
    with pytest.raises(BadReference, match="math reference"):
        V.normalize_reference("")


def test_scores_off_the_main_thread():
    # math-verify arms SIGALRM for its timeouts, which raises ValueError off the main thread.
    out: dict = {}

    def work():
        try:
            out["value"] = V.score("$\\boxed{\\frac{1}{2}}$", "0.5").value
        except Exception as e:  # noqa: BLE001 (reported by the assert below)
            out["error"] = repr(e)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert out == {"value": 1.0}


def test_leaves_a_pending_alarm_alone():
    # math-verify's timeout wrapper ends with alarm(0), which would cancel a timer the process set.
    old = signal.signal(signal.SIGALRM, lambda *_: None)
    signal.setitimer(signal.ITIMER_REAL, 300)
    try:
        assert V.score("$\\boxed{2}$", "2").value == 1.0
        assert signal.getitimer(signal.ITIMER_REAL)[0] > 0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_identity_names_the_library_release():
    assert V.identity() == {"name": "math", "version": V.VERSION, "math_verify": version("math-verify")}
