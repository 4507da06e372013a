"""Collapse warnings: each detector's onset worked out by hand from its definition, the fall label and the
benchmark's scoring on hand-made cases, and the trainer's detector reached through both code paths."""

from __future__ import annotations

import math

import numpy as np
import pytest

from offpolicylab.diagnostics.collapse import CollapseDetector
from offpolicylab.diagnostics.warning import (
    Alarm,
    EssGrad,
    KlSlope,
    RewardSpike,
    Score,
    VerlRanges,
    alarms,
    fall_update,
    make_detector,
    score_run,
    synthetic_history,
    value,
)

ALPHA = 2 / 21  # EMA with span 20


def test_a_value_that_is_missing_empty_or_not_finite_is_not_logged() -> None:
    row = {"a": 1.5, "b": "", "c": math.nan, "d": math.inf, "e": "2"}
    assert [value(row, k) for k in "abcdef"] == [1.5, None, None, None, 2.0, None]


def test_alarm_fires_after_patience_and_rearms_after_the_cooldown() -> None:
    alarm = Alarm(patience=2, cooldown=3)
    conditions = [1, 0, 1, 1, 1, 1, 0, 0, 0, 1, 1]
    assert [alarm.step(bool(c)) for c in conditions] == [0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1]


def test_kl_slope_fires_when_the_average_log_kl_is_a_decade_above_its_median() -> None:
    """KL 1e-3 for 100 updates, then 1e-1: EMA = −1 − 2(1 − α)^k after k high updates, ≥ −3 + 1 first at
    k = ⌈ln ½ / ln(1 − α)⌉ = 7, i.e. update 106 (the median of the history stays −3)."""
    k = math.ceil(math.log(0.5) / math.log(1 - ALPHA))
    rows = [(u, {"kl_k3": 1e-3 if u < 100 else 1e-1}) for u in range(140)]
    found = alarms(KlSlope(rise=1.0, patience=1), rows)
    assert [u for u, _ in found] == [100 + k - 1]
    assert "KL 0.1 is" in found[0][1]
    assert [u for u, _ in alarms(KlSlope(rise=1.0, patience=5), rows)] == [100 + k - 1 + 4]


def test_ess_grad_fires_on_a_falling_ess_and_on_a_gradient_surge() -> None:
    """ESS 0.9 → 0.2: EMA 0.2 + 0.7(1 − α)^k < 0.5 first at k = ⌊ln(3/7) / ln(1 − α)⌋ + 1 = 9."""
    k = math.floor(math.log(3 / 7) / math.log(1 - ALPHA)) + 1
    rows = [(u, {"ess": 0.9 if u < 50 else 0.2, "grad_norm": 1.0}) for u in range(80)]
    assert [u for u, _ in alarms(EssGrad(ess_min=0.5, factor=5.0, patience=1), rows)] == [50 + k - 1]
    # gradient norm 1 → 20: EMA 20 − 19(1 − α)^k > 5 · 1 first at k = ⌊ln(15/19) / ln(1 − α)⌋ + 1
    k = math.floor(math.log(15 / 19) / math.log(1 - ALPHA)) + 1
    rows = [(u, {"ess": 0.9, "grad_norm": 1.0 if u < 50 else 20.0}) for u in range(80)]
    found = alarms(EssGrad(ess_min=0.5, factor=5.0, patience=1), rows)
    assert [u for u, _ in found] == [50 + k - 1]
    assert "gradient norm" in found[0][1]


def test_verl_ranges_name_the_range_that_broke() -> None:
    rows = [(0, {"ratio_mean": 1.0, "ess": 0.9, "kl_k3": 0.01}), (1, {"ratio_mean": 2.5, "ess": 0.9, "kl_k3": 0.01}),
            (2, {"ratio_mean": 1.0, "ess": 0.2, "kl_k3": 0.3})]
    found = alarms(VerlRanges(patience=1), rows)
    assert found == [(1, "IS mean 2.5 outside [0.5, 2]")]
    assert alarms(VerlRanges(patience=2), rows) == [(2, "ESS 0.2 < 0.3; |KL| 0.3 > 0.1")]


def test_reward_spike_is_the_trainers_detector() -> None:
    """The same rows through RewardSpike and through CollapseDetector.observe flag the same update."""
    rows = [(u, {"reward_mean": 0.2 + 0.004 * u if u < 100 else 0.0, "kl_k3": 1e-3 if u != 98 else 1.0,
                 "grad_norm": 0.5}) for u in range(130)]
    direct = CollapseDetector()
    expected = next(u for u, r in rows if direct.observe(u, r["reward_mean"], r["kl_k3"], r["grad_norm"]))
    assert [u for u, _ in alarms(RewardSpike(), rows)] == [expected]


def test_unknown_detector_names_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="valid: reward_spike, verl_ranges, kl_slope, ess_grad, combined"):
        make_detector("magic")


@pytest.mark.parametrize("evaluations, expected", [
    ([(0, 0.2), (50, 0.6), (100, 0.35), (150, 0.3), (200, 0.3)], 100),  # line 0.6 − 0.2 = 0.4, sustained
    ([(0, 0.2), (50, 0.6), (100, 0.35), (150, 0.55), (200, 0.6)], None),  # recovers: not sustained
    ([(0, 0.5), (50, 0.38), (100, 0.39), (150, 0.3)], 50),  # no gain: the 0.1 floor alone
    ([(0, 0.2), (50, 0.6), (100, 0.45), (150, 0.45)], None),  # gave back 0.15 < half the gain
    ([(0, 0.2), (50, 0.6), (100, 0.65), (150, 0.3)], 150),  # the last evaluation: nothing after it to sustain
    ([], None),
])
def test_a_fall_is_a_sustained_loss_of_half_the_gain(evaluations: list, expected: int | None) -> None:
    assert fall_update(evaluations) == expected


def test_scoring_counts_detections_leads_and_false_alarms() -> None:
    score = Score()
    score_run([100, 900], list(range(1000)), None, score)  # no fall: 2 false alarms over 1000 updates
    score_run([50, 700], list(range(1000)), 800, score)  # 50 < 800 − 500: false; 700: detected, lead 100
    score_run([], list(range(1000)), 600, score)  # missed
    assert (score.falls, score.detected, score.false_alarms, score.leads) == (2, 1, 3, [100])
    assert score.scored_updates == 1000 + 300 + 100
    assert score.recall == 0.5
    assert score.false_per_1000 == pytest.approx(3000 / 1400)


def test_synthetic_histories_are_labelled_as_built_and_reproducible() -> None:
    for seed in range(12):
        history = synthetic_history(seed)
        assert (fall_update(history["evaluations"]) is not None) == history["falls"] == (seed % 2 == 1)
    assert synthetic_history(3)["rows"][:50] == synthetic_history(3)["rows"][:50]


def test_every_detector_has_its_chosen_parameters_and_they_build() -> None:
    from offpolicylab.diagnostics.warning import CHOSEN_PARAMS, DEFAULT_DETECTOR, DEFAULT_PARAMS, DETECTORS

    assert set(CHOSEN_PARAMS) == set(DETECTORS) and DEFAULT_PARAMS == CHOSEN_PARAMS[DEFAULT_DETECTOR]
    for name, params in CHOSEN_PARAMS.items():
        assert make_detector(name, **params).name == name


def test_kl_led_histories_are_labelled_as_built_and_show_no_ess() -> None:
    """The KL-led family: even seeds never fall; odd seeds decline, and the label rule finds the fall unless the
    slow decline runs past the end (1 of the 6 odd seeds here), with the KL at least 5× its base by then; no ESS or
    IS mean is logged (a verl log)."""
    from offpolicylab.diagnostics.warning import synthetic_kl_history

    labelled = []
    for seed in range(12):
        history = synthetic_kl_history(seed)
        fall = fall_update(history["evaluations"])
        assert history["falls"] == (seed % 2 == 1) and (fall is None or history["falls"]), seed
        assert all("ess" not in row and "ratio_mean" not in row for _, row in history["rows"])
        if fall is not None:
            labelled.append(seed)
            kl = np.array([row["kl_k3"] for _, row in history["rows"]])
            assert np.median(kl[fall - 10:fall]) >= 5 * np.median(kl[:50]), seed
    assert labelled == [1, 3, 5, 7, 9]
    assert synthetic_kl_history(3)["rows"][:50] == synthetic_kl_history(3)["rows"][:50]
