"""OpenRLHF, slime, SkyRL and AReaL against values worked out by hand from each engine's source (file and function
named per test, read from the engines' main branches in 2026; slime's ``loss.py`` rechecked at THUDM/slime commit
2fc48831501c09bde6f6ba1b24576504746e7108), on one small batch whose token ratios r = π_train/π_sampler are round
numbers.  slime does not install without its GPU stack (its ``loss.py`` imports ``megatron.core``), so for slime
these are the only check; OpenRLHF, SkyRL and AReaL are also checked against their own installed code in ``.ci/run``'s engine environment (``tests/integrations/test_*_engine.py``).

    row A: r = 4, 0.25, 1.5, 6        (product 9, geometric mean 9^(1/4) ≈ 1.732)
    row B: r = 1, 0.4, 3, —           (product 1.2, geometric mean 1.2^(1/3) ≈ 1.063)
    row C: empty response
    row D: r = 8, 8, —, —             (product 64, geometric mean 8)
"""

from __future__ import annotations

import math

import pytest
import torch

from offpolicylab import corrections

RATIOS = [[4.0, 0.25, 1.5, 6.0], [1.0, 0.4, 3.0, 1.0], [1.0, 1.0, 1.0, 1.0], [8.0, 8.0, 1.0, 1.0]]
MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 0, 0]], dtype=torch.float64)
SAMPLER = -torch.linspace(0.5, 3.0, 16, dtype=torch.float64).reshape(4, 4)
LOGP = SAMPLER + torch.tensor(RATIOS, dtype=torch.float64).log()
ADV = torch.tensor([-1.0, -1.0, 1.0, 1.0])
GEO_A, GEO_B = 9 ** 0.25, 1.2 ** (1 / 3)


def check(engine: str, weights: list[list[float]], keep: list[list[float]], **params) -> None:
    got_w, got_k = corrections.apply(engine, LOGP, SAMPLER, MASK, advantages=params.pop("advantages", ADV), **params)
    torch.testing.assert_close(got_w, torch.tensor(weights, dtype=torch.float64), rtol=1e-6, atol=1e-7)  # SkyRL, AReaL: float32
    torch.testing.assert_close(got_k, torch.tensor(keep, dtype=torch.float64), rtol=0, atol=0)


ALL = [[1, 1, 1, 1], [1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 0, 0]]
NONE = [[0, 0, 0, 0]]


# ----------------------------------------------------------------------------- OpenRLHF: openrlhf/models/loss.py
def test_openrlhf_tis() -> None:
    """PolicyLoss.forward, "tis": exp(old − rollout).clamp(low, high), bounds [0.5, 5.0] (train_ppo_ray.py)."""
    check("openrlhf", [[4, 0.5, 1.5, 5], [1, 0.5, 3, 0], [0] * 4, [5, 5, 0, 0]], ALL)


def test_openrlhf_icepop() -> None:
    """"icepop": vllm_is · 1[low ≤ vllm_is ≤ high]."""
    check("openrlhf", [[4, 0, 1.5, 0], [1, 0, 3, 0], [0] * 4, [0, 0, 0, 0]],
          [[1, 0, 1, 0], [1, 0, 1, 0], [0] * 4, [0, 0, 0, 0]], vllm_is_correction_type="icepop")


def test_openrlhf_seq_mask_tis_does_not_clip() -> None:
    """"seq-mask-tis": seq_mask(geometric mean in [low, high]) · exp(old − rollout), unclipped (r = 6 stays 6)."""
    check("openrlhf", [[4, 0.25, 1.5, 6], [1, 0.4, 3, 0], [0] * 4, [0, 0, 0, 0]],
          [[1, 1, 1, 1], [1, 1, 1, 0], [0] * 4, [0, 0, 0, 0]], is_correction_type="seq-mask-tis")


def test_openrlhf_threshold_and_off() -> None:
    check("openrlhf", [[2, 0.25, 1.5, 2], [1, 0.4, 2, 0], [0] * 4, [2, 2, 0, 0]], ALL,
          vllm_is_truncated_threshold="0.25,2")
    check("openrlhf", ALL, ALL, enable_vllm_is_correction=False)


@pytest.mark.parametrize(("level", "mode", "kind"), [("token", "clip", "tis"), ("token", None, "icepop"),
                                                     ("token", "mask", "icepop"), ("seq", "mask", "seq-mask-tis")])
def test_openrlhf_0_11_spelling(level: str, mode: str | None, kind: str) -> None:
    """OpenRLHF 0.11.2's ``is_correction_level`` / ``is_correction_mode`` (mode defaults to mask there): the same
    factors as the earlier ``vllm_is_correction_type``; level off switches it off."""
    params = {"is_correction_level": level} | ({} if mode is None else {"is_correction_mode": mode})
    got = corrections.apply("openrlhf", LOGP, SAMPLER, MASK, **params)
    want = corrections.apply("openrlhf", LOGP, SAMPLER, MASK, vllm_is_correction_type=kind)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    check("openrlhf", ALL, ALL, is_correction_level="off")


# ------------------------------------------------------ slime: slime/backends/megatron_utils/loss.py, ppo_utils.py
def test_slime_tis() -> None:
    """vanilla_tis_function: clamp(exp(old − rollout), tis_clip_low = 0, tis_clip = 2)."""
    check("slime", [[2, 0.25, 1.5, 2], [1, 0.4, 2, 0], [0] * 4, [2, 2, 0, 0]], ALL, use_tis=True)
    check("slime", ALL, ALL)  # --use-tis is off by default


def test_slime_icepop_function() -> None:
    """icepop_function: where(tis_clip_low ≤ r ≤ tis_clip, r, 0)."""
    check("slime", [[0, 0.25, 1.5, 0], [1, 0.4, 0, 0], [0] * 4, [0, 0, 0, 0]],
          [[0, 1, 1, 0], [1, 1, 0, 0], [0] * 4, [0, 0, 0, 0]], use_tis=True,
          custom_tis_function_path="slime.backends.megatron_utils.loss.icepop_function")


def test_slime_opsm() -> None:
    """compute_opsm_mask: drop where A < 0 and Σ m(old − current)/max(Σ m, 1) > opsm_delta (1e-4): with the current
    policy 0.01 nat below the old one, rows A and B (A < 0) go, D (A > 0) stays."""
    current = LOGP - 0.01
    weights, keep = corrections.apply("slime", LOGP, SAMPLER, MASK, advantages=ADV, current_logp=current,
                                      use_opsm=True)
    assert keep.tolist() == [[0] * 4, [0] * 4, [0] * 4, [1, 1, 0, 0]]
    _, keep = corrections.apply("slime", LOGP, SAMPLER, MASK, advantages=ADV, use_opsm=True)
    assert keep.tolist() == ALL  # current = old: the KL is 0


# ----------------------------------------- SkyRL: skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py
def test_skyrl_token_and_sequence_tis() -> None:
    """compute_tis_ratio: token min(r, 2.0); sequence min(exp(Σ log r), 5.0) — products 9, 1.2, 1, 64."""
    check("skyrl", [[2, 0.25, 1.5, 2], [1, 0.4, 2, 0], [0] * 4, [2, 2, 0, 0]], ALL, tis_ratio_type="token")
    check("skyrl", [[5] * 4, [1.2, 1.2, 1.2, 0], [0] * 4, [5, 5, 0, 0]], ALL, tis_ratio_type="sequence")


def test_skyrl_sequence_masks() -> None:
    """compute_sequence_mask: geometric mean in [0.99, 1.01] (the default) keeps nothing here; [0.5, 1.5] keeps B;
    product in [0.5, 2.0] keeps B (1.2)."""
    check("skyrl", ALL, [[0] * 4] * 4, sequence_mask_metric="geometric")
    check("skyrl", ALL, [[0] * 4, [1, 1, 1, 0], [0] * 4, [0] * 4], sequence_mask_metric="geometric",
          geo_mask_low=0.5, geo_mask_high=1.5)
    check("skyrl", ALL, [[0] * 4, [1, 1, 1, 0], [0] * 4, [0] * 4], sequence_mask_metric="product")


def test_skyrl_outlier_then_token_mask_then_tis() -> None:
    """compute_off_policy_correction's order: the outlier mask (any r > 5 drops the row: A, D) and the token mask
    ([0.5, 2]) edit loss_mask before the sequence TIS sums over the surviving tokens (B: r = 1 only)."""
    check("skyrl", ALL, [[0] * 4, [1, 1, 1, 0], [0] * 4, [0] * 4], outlier_token_is_threshold_high=5.0)
    check("skyrl", [[1.5] * 4, [1, 1, 1, 0], [0] * 4, [1, 1, 0, 0]],
          [[0, 0, 1, 0], [1, 0, 0, 0], [0] * 4, [0, 0, 0, 0]], token_mask_is_threshold_low=0.5,
          token_mask_is_threshold_high=2.0, tis_ratio_type="sequence")


# ------------------------------------------------------------- AReaL: areal/utils/functional/functional.py
def test_areal_token_mask_and_clamp() -> None:
    """apply_rejection_sampling, level token: mask keeps r ≤ upper (5); clamp clips to [0, 5] (lower defaults to 0
    in RejectionSamplingConfig.__post_init__); the weight is zeroed where the mask drops."""
    check("areal", [[4, 0.25, 1.5, 0], [1, 0.4, 3, 0], [0] * 4, [0, 0, 0, 0]],
          [[1, 1, 1, 0], [1, 1, 1, 0], [0] * 4, [0, 0, 0, 0]])
    check("areal", [[4, 0.25, 1.5, 5], [1, 0.4, 3, 0], [0] * 4, [5, 5, 0, 0]], ALL, action="clamp")


def test_areal_sequence_ratio_uses_the_geometric_mean_as_the_weight() -> None:
    """level sequence, metric ratio: every token's weight is exp(mean log r); agg mean judges the geometric mean
    (D: 8 > 5 dropped), agg sum the product (A: 9 > 5 dropped too)."""
    check("areal", [[GEO_A] * 4, [GEO_B] * 3 + [0], [0] * 4, [0] * 4],
          [[1] * 4, [1, 1, 1, 0], [0] * 4, [0] * 4], level="sequence")
    check("areal", [[0] * 4, [GEO_B] * 3 + [0], [0] * 4, [0] * 4],
          [[0] * 4, [1, 1, 1, 0], [0] * 4, [0] * 4], level="sequence", agg="sum")


def test_areal_k1_and_k3_are_not_verls() -> None:
    """KLEstimator._compute_approx_kl(proximal, behave): k1 = log r (verl's token_k1 is −log r) and
    k3 = 1/r − 1 + log r (verl's is r − 1 − log r).  For r = 4: AReaL k3 = 0.636 passes an upper bound of 1,
    verl's 1.614 does not."""
    k1 = [[0, 1, 1, 0], [1, 1, 0, 0], [0] * 4, [0, 0, 0, 0]]  # log r ≤ 0.5: r ≤ 1.65
    check("areal", [[0, 0.25, 1.5, 0], [1, 0.4, 0, 0], [0] * 4, [0, 0, 0, 0]], k1, metric="kl_k1", upper=0.5)
    areal_k3 = [1 / r - 1 + math.log(r) for r in RATIOS[0]]
    verl_k3 = [r - 1 - math.log(r) for r in RATIOS[0]]
    assert areal_k3[0] < 1.0 < verl_k3[0]
    _, areal_keep = corrections.apply("areal", LOGP, SAMPLER, MASK, metric="kl_k3", upper=1.0)
    _, verl_keep = corrections.apply("verl", LOGP, SAMPLER, MASK, rollout_is=None, rollout_rs="token_k3",
                                     rollout_rs_threshold=1.0)
    assert areal_keep[0].tolist() == [float(v <= 1.0) for v in areal_k3]
    assert verl_keep[0].tolist() == [float(v <= 1.0) for v in verl_k3]
    assert areal_keep[0, 0] == 1 and verl_keep[0, 0] == 0


@pytest.mark.parametrize("params", [dict(metric="kl_k2", action="clamp"), dict(upper=0.9),
                                    dict(lower=3.0, upper=2.0)])
def test_areal_refuses_what_its_config_refuses(params) -> None:
    with pytest.raises(ValueError):
        corrections.apply("areal", LOGP, SAMPLER, MASK, **params)
