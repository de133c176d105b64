import math

import pytest
from omegaconf import OmegaConf

from align.errors import EXIT_CONFIG, ConfigError
from align.rewards import VERIFIERS, BadReference, WeightedReward, accepted, get_verifier


def test_weighted_sum_of_parts():
    r = WeightedReward({"gsm8k": 1.0, "format": 0.1})
    right_form, wrong_form = r.score("so 5\n#### 5", "#### 5"), r.score("it is 5, I think", "#### 5")
    wrong_value = r.score("so 4\n#### 4", "#### 5")
    assert right_form.total == pytest.approx(1.1) and wrong_form.total == pytest.approx(1.0)
    assert wrong_value.total == pytest.approx(0.1)
    assert {n: s.value for n, s in wrong_form.parts.items()} == {"gsm8k": 1.0, "format": 0.0}


def test_negative_weight_is_a_penalty_and_zero_is_recorded_only():
    r = WeightedReward({"exact_int": 1, "format": -0.5, "gsm8k": 0})
    s = r.score("3 + 4 = 7", "7")
    assert s.total == pytest.approx(1.0) and set(s.parts) == {"exact_int", "format", "gsm8k"}
    assert r.score("#### 8", "7").total == pytest.approx(-0.5)


def test_weights_from_a_composed_config():
    cfg = OmegaConf.create({"weights": {"gsm8k": 1.0, "format": 0.1}})
    assert WeightedReward(cfg.weights).identity() == {
        "weights": {"gsm8k": 1.0, "format": 0.1},
        "verifiers": {"gsm8k": {"name": "gsm8k", "version": 1}, "format": {"name": "format", "version": 1}},
    }


def test_unknown_name_is_one_line_listing_the_accepted():
    with pytest.raises(ConfigError) as e:
        WeightedReward({"gsm8k": 1.0, "gsmk8": 0.5}, key="rl.reward")
    msg = str(e.value)
    assert msg == f"rl.reward.gsmk8: unknown verifier or function; accepted: {accepted()}, a name of " \
                  "reward.functions, python with reward.function, or model with reward.path (got 'gsmk8')"
    assert "\n" not in msg and e.value.exit_code == EXIT_CONFIG
    assert accepted() == "exact_int, format, gsm8k, math" and set(VERIFIERS) == {"exact_int", "format", "gsm8k", "math"}


@pytest.mark.parametrize("w", [math.nan, math.inf, -math.inf, "1.0", None, True])
def test_weight_must_be_a_finite_number(w):
    with pytest.raises(ConfigError, match=r"^reward.weights.gsm8k: weight must be a finite number"):
        WeightedReward({"gsm8k": w})


@pytest.mark.parametrize("weights", [{}, None, ["gsm8k"]])
def test_weights_must_be_a_non_empty_mapping(weights):
    with pytest.raises(ConfigError, match="^reward.weights: must map verifier names to weights"):
        WeightedReward(weights)


def test_get_verifier_unknown_names_the_key():
    with pytest.raises(ConfigError, match=r"^eval.verifier: unknown verifier; accepted: exact_int, format"):
        get_verifier("nope", key="eval.verifier")
    assert get_verifier("gsm8k").name == "gsm8k"


def test_check_reference_asks_every_weighted_verifier():
    r = WeightedReward({"format": 1.0, "exact_int": 1.0})
    r.check_reference("7")
    with pytest.raises(BadReference, match="exact_int"):
        r.check_reference("#### 7")


def test_every_verifier_scores_only_the_values_it_declares(gsm8k_test):
    """`Verifier.VALUES` is what the config's no-signal rule reads (a verifier of one value makes a
    constant reward): each verifier's scores of gold and mismatched completions stay within it, and
    cover both of a two-valued verifier's values."""
    refs = {"gsm8k": gsm8k_test[:20], "format": gsm8k_test[:20], "math": ["#### 7", "#### 8"],
            "exact_int": ["7", "8"]}
    for name, v in VERIFIERS.items():
        seen = {v.score(c, r).value for c in [*refs[name], "no answer here"] for r in refs[name]}
        assert seen == set(v.VALUES), (name, seen, v.VALUES)


def test_constant_is_the_reward_weights_fix_whatever_a_completion_says(monkeypatch):
    assert WeightedReward({"gsm8k": 1.0, "format": 0.1}).constant() is None
    assert WeightedReward({"gsm8k": 0.0, "format": 0}).constant() == 0.0
    monkeypatch.setattr(type(get_verifier("format")), "VALUES", (1.0,))  # a verifier that can give one value
    assert WeightedReward({"format": 0.5, "gsm8k": 0.0}).constant() == 0.5
    assert WeightedReward({"format": 0.5, "gsm8k": 1.0}).constant() is None


@pytest.mark.parametrize("weight, constant", [(0.0, 0.5), (0.2, None), (-1.0, None)])
def test_a_function_weighted_other_than_0_can_vary_and_one_weighted_0_is_constant(weight, constant):
    """Each function counts as able to vary, whatever verifiers beside it fix (it is not imported to tell)."""
    from align.rewards.combine import constant_reward

    weights = {"format": 0.0, "exact_int": 0.0, "length": weight, "python": 0.0}
    assert constant_reward(weights, ("length", "python")) == (None if weight else 0.0)
    fixed = {"format": 0.5, "length": weight}
    with pytest.MonkeyPatch.context() as m:
        m.setattr(type(get_verifier("format")), "VALUES", (1.0,))  # a verifier that can give one value
        assert constant_reward(fixed, ("length",)) == constant
