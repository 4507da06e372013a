"""The collapse detector: a reward drop from the running peak counts only together with a KL / grad-norm spike."""

from __future__ import annotations

import math

from offpolicylab.diagnostics.collapse import CollapseDetector


def feed(detector: CollapseDetector, rewards: list[float], kls: list[float], grads: list[float]) -> list[int]:
    return [u for u, (r, k, g) in enumerate(zip(rewards, kls, grads, strict=True))
            if detector.observe(u, r, k, g) is not None]


def test_drop_with_grad_spike_is_a_collapse_at_the_first_low_point() -> None:
    # alpha = 1: the smoothed reward is the reward itself.  Peak 0.9, spike at update 12, drop ≥ 0.2 at 13.
    rewards = [0.1 * min(u, 9) for u in range(12)] + [0.85, 0.6, 0.5]
    grads = [1.0] * 12 + [50.0, 1.0, 1.0]
    detector = CollapseDetector(margin=0.2, gain_fraction=0.0, spike=5.0, window=5, alpha=1.0, warmup=3)
    assert feed(detector, rewards, [0.01] * 15, grads) == [13]
    assert detector.collapsed_at == 13


def test_drop_without_spike_or_spike_without_drop_is_not_a_collapse() -> None:
    rewards = [0.1 * min(u, 9) for u in range(12)] + [0.5, 0.4, 0.3]
    no_spike = CollapseDetector(alpha=1.0, warmup=3)
    assert feed(no_spike, rewards, [0.01] * 15, [1.0] * 15) == []
    steady = [0.5] * 15
    spike_only = CollapseDetector(alpha=1.0, warmup=3)
    assert feed(spike_only, steady, [0.01] * 12 + [5.0, 0.01, 0.01], [1.0] * 15) == []


def test_kl_spike_counts_and_old_spikes_expire() -> None:
    rewards = [0.9] * 10 + [0.9] * 10 + [0.5]
    kls = [0.01] * 10 + [1.0] + [0.01] * 10  # spike at update 10, drop at update 20
    assert feed(CollapseDetector(alpha=1.0, warmup=3, window=20), rewards, kls, [1.0] * 21) == [20]
    assert feed(CollapseDetector(alpha=1.0, warmup=3, window=5), rewards, kls, [1.0] * 21) == []


def test_the_drop_must_give_back_half_the_gain_or_the_floor_whichever_is_larger() -> None:
    """Defaults margin 0.1, gain_fraction ½.  Rise 0.2 → 0.8 (gain 0.6): a fall to 0.6 (drop 0.2 < 0.3) is not a
    collapse, a fall to 0.45 (drop 0.35 ≥ 0.3) is.  A run that never gains (0.18 → 0.0) collapses by the floor."""
    rise = [0.2 + 0.1 * min(u, 6) for u in range(12)]  # 0.2 … 0.8, peak 0.8 from update 6
    grads = [1.0] * 12 + [50.0, 1.0, 1.0]
    partial = CollapseDetector(alpha=1.0, warmup=3, window=5)
    assert feed(partial, rise + [0.7, 0.6, 0.6], [0.01] * 15, grads) == []
    full = CollapseDetector(alpha=1.0, warmup=3, window=5)
    assert feed(full, rise + [0.7, 0.6, 0.45], [0.01] * 15, grads) == [14]
    fall = [0.18] * 12 + [0.15, 0.09, 0.0]  # drop 0.09 at u = 13 is under the floor, 0.18 at u = 14 is not
    never_gained = CollapseDetector(alpha=1.0, warmup=3, window=5)
    assert feed(never_gained, fall, [0.01] * 15, grads) == [14]
    absolute = CollapseDetector(margin=0.2, gain_fraction=0.0, alpha=1.0, warmup=3, window=5)
    assert feed(absolute, fall, [0.01] * 15, grads) == []  # the old absolute test missed this fall


def test_non_finite_and_state_round_trip() -> None:
    detector = CollapseDetector()
    assert detector.observe(0, math.nan, 0.0, 1.0) is not None
    assert detector.observe(1, math.nan, 0.0, 1.0) is None  # only the first collapse is reported
    clone = CollapseDetector()
    clone.load_state_dict(detector.state_dict())
    assert clone == detector and isinstance(clone.count, int)


def test_absent_reward_holds_the_smoothed_reward() -> None:
    """reward None (the current policy generated nothing this update) leaves the smoothed reward and the peak
    unchanged while spikes are still tracked: the drop is judged on the last reward seen."""
    detector = CollapseDetector(margin=0.2, spike=5.0, window=5, alpha=1.0, warmup=3)
    rewards = [0.5, 0.6, 0.7, None, None, 0.3, None]
    grads = [1.0, 1.0, 1.0, 1.0, 50.0, 1.0, 1.0]
    flagged = feed(detector, rewards, [0.0] * 7, grads)
    assert flagged == [5]  # 0.7 → 0.3 at u = 5, within 5 updates of the spike at u = 4
    assert detector.reward_ema == 0.3 and detector.peak == 0.7


def test_a_checkpointed_detector_of_an_earlier_version_restores_its_spike_factor() -> None:
    """Checkpoints written before the field was named as the config names it (``collapse_spike``) hold ``factor``."""
    old = {**CollapseDetector(spike=3.0).state_dict()}
    old["factor"] = old.pop("spike")
    restored = CollapseDetector()
    restored.load_state_dict(old)
    assert restored.spike == 3.0 and restored.state_dict() == CollapseDetector(spike=3.0).state_dict()
