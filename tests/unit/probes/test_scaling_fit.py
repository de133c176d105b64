"""The scaling fit's mechanics on synthetic curves: recovery, regimes, refusal, the E[w^2] prediction."""

from __future__ import annotations

import numpy as np
import pytest

from align.config import ScalingProbeConfig
from align.data.stats import length_moments
from align.errors import ConfigError
from align.probes.scaling import FitRefused, analyze, batch_moments, fit, predict

# An attention-heavy long-context step: A = 6.87e-4 s/token, B = 8.85e-8 s/token^2.
A, B = 6.87e-4, 8.85e-8
WS = np.array([2048.0, 4096.0, 8192.0, 16384.0])


@pytest.mark.parametrize("idx", [[0, 1, 3], [0, 1, 2, 3]], ids=["3 points", "4 points"])
@pytest.mark.parametrize("noise", [[1.0, 1.0, 1.0, 1.0], [1.001, 0.999, 1.0005, 0.999]], ids=["exact", "0.1% noise"])
def test_fit_recovers_known_A_and_B_within_1_percent(idx, noise):
    w = WS[idx]
    t = (A * w + B * w * w) * np.array(noise)[idx]
    f = fit(w, t)
    assert abs(f.A / A - 1) < 0.01, f.A
    assert abs(f.B / B - 1) < 0.01, f.B
    assert f.C == 0.0 and not f.with_constant
    assert f.max_abs_rel_residual < 0.01
    # its quadratic shares B*w / (A + B*w): 20.9% at 2,048 and 67.8% at 16,384
    assert f.shares(2048)["quadratic"] == pytest.approx(0.209, abs=0.005)
    assert f.shares(16384)["quadratic"] == pytest.approx(0.678, abs=0.005)


def test_fit_with_constant_recovers_all_three_terms():
    w = np.array([512.0, 1024.0, 2048.0, 4096.0, 8192.0])
    t = 2e-5 * w + 3e-9 * w * w + 0.04
    f = fit(w, t, constant=True)
    assert (f.A, f.B, f.C) == pytest.approx((2e-5, 3e-9, 0.04), rel=1e-6)


CURVES = {
    # (A, B, C): per-token work, attention, a fixed per-batch cost
    "linear": (1e-5, 1e-10, 0.0),
    "quadratic": (1e-6, 1e-8, 0.0),
    "launch-bound": (1e-7, 1e-12, 0.05),
}


@pytest.mark.parametrize("regime", list(CURVES))
def test_three_regimes_are_classified_on_synthetic_curves(regime):
    a, b, c = CURVES[regime]
    w = np.array([512.0, 1024.0, 2048.0, 4096.0])
    r = analyze(w, a * w + b * w * w + c)
    assert r.regime == regime
    assert r.confirmed
    assert r.lever.split(":")[0] in {"per-token work dominates", "attention dominates",
                                     "a fixed per-batch cost dominates"}
    # a two-term fit closes exactly when there is no constant: that is what refutes launch-bound
    assert r.closes == (c == 0.0)
    assert r.used == ("three_term" if c else "two_term")
    expected_growth = {"linear": 1.0, "quadratic": 2.0, "launch-bound": 0.0}[regime]
    assert abs(r.growth_exponent - expected_growth) < 0.1


def test_regime_is_named_at_the_shape_you_run_not_the_longest_benchmarked():
    # docs/triage.md#3: attention is 67.8% at w=16,384 but 20.9% at 2,048. If the data runs at ~2k the
    # regime is linear even though the longest benchmark point is attention-dominated.
    t = A * WS + B * WS * WS
    assert analyze(WS, t).regime == "quadratic"  # default reference: the longest measured width
    assert analyze(WS, t, reference={"E_w": 2048.0, "E_w2": 2048.0**2}).regime == "linear"


@pytest.mark.parametrize("ws", [[1024, 2048], [1024, 1024, 2048], [4096]])
def test_fewer_than_three_distinct_lengths_are_refused(ws):
    t = [A * w + B * w * w for w in ws]
    with pytest.raises(FitRefused, match="undetermined"):
        fit(ws, t)
    with pytest.raises(FitRefused):
        analyze(ws, t)


def test_two_lengths_are_refused_by_the_config_before_any_work():
    with pytest.raises(ConfigError) as e:
        ScalingProbeConfig(lengths=[1024, 2048])
    assert e.value.key == "probe.scaling.lengths"
    ScalingProbeConfig(lengths=[1024, 2048, 4096])  # three is accepted


def test_two_lengths_on_the_command_line_exit_2_with_one_line(capsys):
    from align.run.cli import validate_command_line

    with pytest.raises(SystemExit) as e:
        validate_command_line(["probe=scaling", "probe.scaling.lengths=[1024,2048]"], config_name="probe")
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "probe.scaling.lengths" in err[0] and "3 distinct" in err[0]


def test_three_points_that_do_not_close_ask_for_a_fourth():
    w = np.array([512.0, 1024.0, 2048.0])
    r = analyze(w, 1e-6 * w + 1e-9 * w * w + 0.01)  # a real constant term
    assert not r.closes
    assert r.need_more_points and not r.confirmed
    assert any("4th" in m for m in r.messages)
    assert "TENTATIVE" in " ".join(r.messages)


def test_four_points_that_close_with_a_constant_say_it_earns_its_place():
    w = np.array([512.0, 1024.0, 2048.0, 4096.0])
    r = analyze(w, 1e-5 * w + 1e-9 * w * w + 0.002)
    assert not r.closes and r.confirmed and r.used == "three_term"
    assert "earns its place" in r.constant_check


def test_a_two_term_fit_that_closes_refutes_the_constant():
    w = np.array([512.0, 1024.0, 2048.0])
    r = analyze(w, 1e-5 * w + 1e-9 * w * w)
    assert r.closes and r.confirmed and not r.need_more_points
    assert "launch-bound is refuted" in r.constant_check


def test_noise_that_no_model_explains_is_not_concluded():
    w = np.array([512.0, 1024.0, 2048.0, 4096.0])
    r = analyze(w, (1e-5 * w) * np.array([1.0, 1.3, 0.8, 1.2]))
    assert not r.confirmed and r.need_more_points
    assert any("UNRESOLVED" in m for m in r.messages)


def test_prediction_weights_by_E_w2_never_E_w_squared():
    # bimodal lengths: many short records, a few long ones (docs/triage.md#3)
    lengths = np.array([512] * 90 + [8192] * 10)
    f = fit(WS, A * WS + B * WS * WS)
    m = length_moments(lengths)
    assert m["E_w"] == pytest.approx(lengths.mean())
    assert m["E_w2"] == pytest.approx((lengths.astype(float) ** 2).mean())
    assert m["w2_ratio"] > 2.0
    direct = np.mean([A * w + B * w * w for w in lengths])  # the mean of the per-record times
    assert predict(f, m["E_w"], m["E_w2"]) == pytest.approx(direct, rel=1e-6)
    shortcut = A * m["E_w"] + B * m["E_w"] ** 2
    assert abs(shortcut / direct - 1) > 0.15  # the E[w]^2 shortcut is badly wrong here


def test_batch_moments_weight_a_short_last_batch_by_its_rows():
    m = batch_moments([[(8, 100)], [(8, 200)], [(4, 300)]], batch_rows=8)
    assert m["E_w"] == pytest.approx((100 + 200 + 0.5 * 300) / 3)
    assert m["E_w2"] == pytest.approx((100**2 + 200**2 + 0.5 * 300**2) / 3)
    assert m["mean_rows"] == pytest.approx(20 / 3)


def test_a_packed_batch_is_predicted_per_document_not_as_one_long_row():
    f = fit(WS, A * WS + B * WS * WS)
    docs = [(1, 2048), (1, 2048), (1, 4096)]  # one packed micro-batch of three documents
    m = batch_moments([docs], batch_rows=2)
    per_doc = sum(A * w + B * w * w for _, w in docs) / 2  # a row of the 2-row fit costs half of t(w)
    assert predict(f, m["E_w"], m["E_w2"]) == pytest.approx(per_doc, rel=1e-6)
    assert predict(f, m["E_w"], m["E_w2"]) < (A * 8192 + B * 8192**2) / 2  # not one 8,192-token row
