"""Token-statistics profile against entropies and shares worked out by hand on tiny distributions."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from offpolicylab.diagnostics.profile import (
    ENTROPY_BIN_EDGES,
    SHARE_KEYS,
    compare_profiles,
    format_comparison,
    load_profile,
    profiles_match,
    token_entropy,
    token_profile,
    token_profile_from_logits,
)

LN2 = math.log(2.0)
# (distribution, its entropy in nats worked out by hand)
HAND = [
    ([1.0, 0.0, 0.0, 0.0], 0.0),
    ([0.5, 0.25, 0.25, 0.0], 1.5 * LN2),  # ½ ln 2 + 2 · ¼ ln 4
    ([0.25, 0.25, 0.25, 0.25], 2 * LN2),  # ln 4
    ([0.9, 0.1, 0.0, 0.0], -(0.9 * math.log(0.9) + 0.1 * math.log(0.1))),  # 0.3251
    ([0.99, 0.01, 0.0, 0.0], -(0.99 * math.log(0.99) + 0.01 * math.log(0.01))),  # 0.0560
]


def test_token_entropy_matches_hand_values_including_zero_probabilities():
    with np.errstate(divide="ignore"):
        logp = torch.tensor(np.log([p for p, _ in HAND]))
    assert token_entropy(logp).tolist() == pytest.approx([h for _, h in HAND], abs=1e-12)
    assert token_entropy(logp)[0].item() == 0.0  # the 0 · log 0 terms add 0, not nan


def test_token_profile_counts_bins_shares_median_and_tail_by_hand():
    # 7 counted tokens (the last column of row 1 is padding with a huge entropy that must be ignored).
    entropy = torch.tensor([[0.0, 0.05, 0.5, 2.5], [1.0, 0.0005, 7.0, 99.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    probs = torch.tensor([[0.9, 5e-4, 0.5, 2e-3], [0.999e-3, 0.005, 1.0, 1e-9]])
    profile = token_profile(entropy, probs.log(), mask)
    counted = [0.0, 0.05, 0.5, 2.5, 1.0, 0.0005, 7.0]
    assert profile["n_tokens"] == 7
    # bins [0,.001) [.001,.01) [.01,.03) [.03,.1) [.1,.2) [.2,.5) [.5,1) [1,1.5) [1.5,2) [2,3) [3,4) [4,6) [6,inf)
    assert profile["entropy_histogram"] == pytest.approx(np.array([2, 0, 0, 1, 0, 0, 1, 1, 0, 1, 0, 0, 1]) / 7)
    assert profile["share_entropy_below_0.1"] == pytest.approx(3 / 7)  # 0, 0.05, 0.0005
    assert profile["share_entropy_at_least_1"] == pytest.approx(3 / 7)  # 1.0 (edge counts as ≥ 1), 2.5, 7
    assert profile["median_entropy"] == 0.5  # sorted: 0, .0005, .05, .5, 1, 2.5, 7
    assert profile["mean_entropy"] == pytest.approx(sum(counted) / 7)
    assert profile["share_sampled_prob_below_1e-3"] == pytest.approx(2 / 7)  # 5e-4 and 0.999e-3 (1e-9 is padding)
    assert profile["share_sampled_prob_below_1e-2"] == pytest.approx(4 / 7)  # + 2e-3, 5e-3
    neg = -np.log([0.9, 5e-4, 0.5, 2e-3, 0.999e-3, 0.005, 1.0])
    assert profile["mean_neg_logp"] == pytest.approx(neg.mean())
    assert profile["neg_logp_percentiles"]["p50"] == pytest.approx(-math.log(0.005))  # 4th of 7 sorted: 0, .11, .69, 5.30, ...
    assert profile["entropy_bin_edges"][-1] is None and profile["entropy_bin_edges"][:-1] == list(
        ENTROPY_BIN_EDGES[:-1])


def test_headline_shares_are_sums_of_histogram_bins():
    rng = np.random.default_rng(0)
    entropy = rng.exponential(0.8, size=(8, 50))
    entropy[entropy < 0.3] = 0.0  # many exact zeros, as for near-deterministic tokens in float32
    mask = (rng.random((8, 50)) < 0.8).astype(float)
    profile = token_profile(entropy, -rng.exponential(2.0, size=(8, 50)), mask)
    edges, hist = profile["entropy_bin_edges"], np.array(profile["entropy_histogram"])
    assert hist.sum() == pytest.approx(1.0)
    assert hist[: edges.index(0.1)].sum() == pytest.approx(profile["share_entropy_below_0.1"])
    assert hist[edges.index(1.0):].sum() == pytest.approx(profile["share_entropy_at_least_1"])
    assert profile["median_entropy"] == pytest.approx(np.median(entropy[mask > 0]))


def test_profile_from_logits_uses_the_sampling_temperature():
    p = np.array([[[0.5, 0.25, 0.25], [0.9, 0.05, 0.05]]])
    ids = torch.tensor([[1, 2]])
    mask = torch.ones(1, 2)
    at_one = token_profile_from_logits(torch.tensor(np.log(p)), ids, mask, temperature=1.0)
    assert at_one["mean_entropy"] == pytest.approx((1.5 * LN2 + -(0.9 * np.log(0.9) + 0.1 * np.log(0.05))) / 2)
    assert at_one["mean_neg_logp"] == pytest.approx(-(np.log(0.25) + np.log(0.05)) / 2)
    # softmax(log p / 2) ∝ √p
    q = np.sqrt(p) / np.sqrt(p).sum(-1, keepdims=True)
    at_two = token_profile_from_logits(torch.tensor(np.log(p)), ids, mask, temperature=2.0)
    assert at_two["mean_entropy"] == pytest.approx(float(-(q * np.log(q)).sum(-1).mean()))
    assert at_two["mean_neg_logp"] == pytest.approx(-(np.log(q[0, 0, 1]) + np.log(q[0, 1, 2])) / 2)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="no tokens"):
        token_profile(torch.ones(2, 3), torch.zeros(2, 3), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="finite and >= 0"):
        token_profile(torch.tensor([[-1.0]]), torch.zeros(1, 1), torch.ones(1, 1))
    with pytest.raises(ValueError, match="temperature"):
        token_profile_from_logits(torch.zeros(1, 1, 3), torch.zeros(1, 1), torch.ones(1, 1), temperature=0.0)


def _profile(low: float, high: float, rare: float) -> dict:
    """A hand-made profile with the given headline shares (histogram irrelevant to the check)."""
    hist = [0.0] * (len(ENTROPY_BIN_EDGES) - 1)
    hist[0], hist[-1], hist[6] = low, high, 1.0 - low - high
    return {"entropy_bin_edges": [None if math.isinf(e) else e for e in ENTROPY_BIN_EDGES],
            "entropy_histogram": hist, "share_entropy_below_0.1": low, "share_entropy_at_least_1": high,
            "share_sampled_prob_below_1e-3": rare, "median_entropy": 0.2}


def test_compare_profiles_checks_each_share_within_five_points():
    reference = _profile(0.60, 0.20, 0.010)
    rows = compare_profiles(reference, _profile(0.64, 0.16, 0.050))  # Δ = +4, −4, +4 points
    assert [r.name for r in rows[:3]] == list(SHARE_KEYS)
    assert [r.within for r in rows[:3]] == [True, True, True] and profiles_match(rows)
    assert rows[0].difference == pytest.approx(0.04)
    assert all(r.within is None for r in rows[3:])  # median and bins are shown, not checked
    assert len(rows) == 3 + 1 + len(ENTROPY_BIN_EDGES) - 1
    rows = compare_profiles(reference, _profile(0.60, 0.26, 0.010))  # Δ = 6 points on the high share
    assert [r.within for r in rows[:3]] == [True, False, True] and not profiles_match(rows)
    table = format_comparison(rows, ("SmolLM2", "synthetic"))
    assert "| share_entropy_at_least_1 | 0.2000 | 0.2600 | +0.0600 | **no** |" in table
    assert table.splitlines()[0].startswith("| statistic | SmolLM2 | synthetic |")


def test_compare_profiles_refuses_different_bin_edges():
    other = _profile(0.6, 0.2, 0.01)
    other["entropy_bin_edges"] = other["entropy_bin_edges"][1:]
    with pytest.raises(ValueError, match="bin edges"):
        compare_profiles(_profile(0.6, 0.2, 0.01), other)


def test_committed_smollm2_profile_is_packaged_complete_and_self_consistent():
    doc = load_profile("smollm2_135m_instruct_gsm8k")
    profile, sampling = doc["profile"], doc["sampling"]
    assert len(doc["data"]["prompt_indices"]) >= 64 and sampling["temperature"] == 1.0
    for flag in (f"--n-prompts {len(doc['data']['prompt_indices'])}", f"--max-new-tokens {sampling['max_new_tokens']}",
                 f"--seed {sampling['seed']}", "--temperature 1 "):
        assert flag in doc["command"]
    edges, hist = profile["entropy_bin_edges"], np.array(profile["entropy_histogram"])
    assert edges[:-1] == list(ENTROPY_BIN_EDGES[:-1]) and hist.sum() == pytest.approx(1.0)
    assert hist[: edges.index(0.1)].sum() == pytest.approx(profile["share_entropy_below_0.1"])
    assert hist[edges.index(1.0):].sum() == pytest.approx(profile["share_entropy_at_least_1"])
    assert all(0.0 <= profile[k] <= 1.0 for k in SHARE_KEYS)
    assert profile["n_tokens"] == round(doc["responses"]["mean_length"] * doc["responses"]["n_responses"])
    assert doc["checks"]["max_abs_logp_sampling_vs_scoring"] < 1e-3
    assert profiles_match(compare_profiles(doc, doc))  # a whole calibration file is accepted as a profile


def test_load_profile_reads_a_path_and_names_the_packaged_ones_on_a_bad_name(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(_profile(0.5, 0.2, 0.01)))
    assert load_profile(path)["share_entropy_at_least_1"] == 0.2
    with pytest.raises(ValueError, match="smollm2_135m_instruct_gsm8k"):
        load_profile("no_such_profile")
