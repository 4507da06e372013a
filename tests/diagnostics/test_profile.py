"""Token-statistics profile against entropies and shares worked out by hand on tiny distributions."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from offpolicylab import profile_files as profile_module
from offpolicylab.diagnostics.profile import (
    ENTROPY_BIN_EDGES,
    SHARE_KEYS,
    STATISTICS,
    compare_profiles,
    format_comparison,
    profiles_match,
    quantile_interval,
    side_by_side,
    token_entropy,
    token_profile,
    token_profile_from_logits,
)
from offpolicylab.profile_files import load_profile, validate_profile

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
    assert profile["share_entropy_below_0.01"] == pytest.approx(2 / 7)  # 0, 0.0005
    assert profile["share_entropy_below_0.1"] == pytest.approx(3 / 7)  # 0, 0.05, 0.0005
    assert profile["share_entropy_at_least_1"] == pytest.approx(3 / 7)  # 1.0 (edge counts as ≥ 1), 2.5, 7
    assert profile["median_entropy"] == 0.5  # sorted: 0, .0005, .05, .5, 1, 2.5, 7
    assert profile["entropy_p80"] == pytest.approx(2.2)  # position 0.8 · 6 = 4.8: 1 + 0.8 · (2.5 − 1)
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
    assert hist[: edges.index(0.01)].sum() == pytest.approx(profile["share_entropy_below_0.01"])
    assert hist[: edges.index(0.1)].sum() == pytest.approx(profile["share_entropy_below_0.1"])
    assert hist[edges.index(1.0):].sum() == pytest.approx(profile["share_entropy_at_least_1"])
    assert profile["median_entropy"] == pytest.approx(np.median(entropy[mask > 0]))
    assert profile["entropy_p80"] == pytest.approx(np.quantile(entropy[mask > 0], 0.8))
    assert {stat.key for stat in STATISTICS} <= set(profile)


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
    assert all(r.within is None for r in rows[3:])  # the other statistics and the bins are shown, not checked
    shown = [stat.key for stat in STATISTICS if stat.key not in SHARE_KEYS and stat.key != "n_tokens"]
    assert [r.name for r in rows[3:3 + len(shown)]] == shown  # share < 0.01 nat, quantiles 0.5 and 0.8, ...
    assert len(rows) == 3 + len(shown) + len(ENTROPY_BIN_EDGES) - 1
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
    assert doc["source"] == "measured" and doc["profile_version"] == 2  # read from version 1
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
    path.write_text(json.dumps(published({"share_entropy_at_least_1": 0.2})))
    assert load_profile(path)["profile"]["share_entropy_at_least_1"] == 0.2
    with pytest.raises(ValueError, match="smollm2_135m_instruct_gsm8k"):
        load_profile("no_such_profile")


# ------------------------------------------------------------------------------------ profiles as data (schema)
def published(stats: dict | None = None, **top: object) -> dict:
    """A valid published profile document: every statistic null except ``stats``."""
    profile = {stat.key: None for stat in STATISTICS}
    profile.update(entropy_bin_edges=None, entropy_histogram=None, neg_logp_percentiles=None)
    profile.update(stats or {})
    doc = {"profile_version": 2, "source": "published", "model": "Some-LM",
           "citation": {"authors": "A. Author, B. Author", "year": 2025, "title": "A paper", "arxiv": "2501.00001",
                        "where": "§3"},
           "profile": profile}
    doc.update(top)
    return doc


def measured(seed: int = 0) -> dict:
    """A valid measured profile document computed by token_profile on random tokens."""
    rng = np.random.default_rng(seed)
    stats = token_profile(rng.exponential(0.5, size=(4, 30)), -rng.exponential(2.0, size=(4, 30)), np.ones((4, 30)))
    return {"profile_version": 2, "source": "measured", "model": "tiny", "sampling": {"temperature": 1.0},
            "profile": stats}


def test_the_qwen3_profile_transcribes_the_papers_two_numbers_and_nothing_else():
    doc = load_profile("qwen3_8b_cot")
    stats = doc["profile"]
    assert doc["source"] == "published" and doc["citation"]["arxiv"] == "2506.01939" and doc["citation"]["year"] == 2025
    assert doc["sampling"]["temperature"] == 1.0
    assert stats["share_entropy_below_0.01"] == 0.5064  # "approximately 50.64%" of tokens below 10^-2
    assert stats["entropy_p80"] == 0.672  # "the 80th percentile among the sampled 10^6 tokens"
    given = {key for key, value in stats.items() if value is not None}
    assert given == {"share_entropy_below_0.01", "entropy_p80"}
    assert "50.64%" in doc["quotes"]["share_entropy_below_0.01"] and "0.672" in doc["quotes"]["entropy_p80"]
    assert 0.45 <= stats["share_entropy_below_0.01"] <= 0.60 and 0.5 <= stats["entropy_p80"] <= 0.85


def test_a_version_1_file_reads_as_measured_with_the_share_below_001_from_its_histogram():
    raw = json.loads((Path(profile_module.__file__).parent / "data" / "profiles" /
                      "smollm2_135m_instruct_gsm8k.json").read_text())
    assert raw["profile_version"] == 1 and "share_entropy_below_0.01" not in raw["profile"]
    doc = load_profile("smollm2")  # a prefix naming one packaged profile
    hist = raw["profile"]["entropy_histogram"]
    assert doc["profile"]["share_entropy_below_0.01"] == pytest.approx(hist[0] + hist[1], abs=0)  # [0, .001), [.001, .01)
    assert doc["profile"]["entropy_p80"] is None and doc["not_recorded"] == ["entropy_p80"]
    # cumulative shares from the file: 0.578 up to 3 nat, 0.778 up to 4, 0.979 up to 6: the 0.8 quantile is in [4, 6)
    assert quantile_interval(doc, 0.8) == (4.0, 6.0) and quantile_interval(doc, 0.5) == (2.0, 3.0)
    assert 2.0 <= doc["profile"]["median_entropy"] < 3.0


def test_a_measured_profile_from_token_profile_validates_and_a_published_reference_checks_nothing():
    doc = validate_profile(measured())
    assert doc["profile"]["entropy_p80"] >= doc["profile"]["median_entropy"]
    rows = compare_profiles(load_profile("qwen3_8b_cot"), doc)
    assert all(row.within is None for row in rows) and not profiles_match(rows)  # the paper gives no headline share
    low = next(row for row in rows if row.name == "share_entropy_below_0.01")
    assert low.reference == 0.5064 and low.candidate == doc["profile"]["share_entropy_below_0.01"]
    assert "| share_entropy_below_0.1 | — |" in format_comparison(rows)


def test_side_by_side_prints_every_statistic_of_each_profile_in_its_column():
    table = side_by_side({"smollm2": load_profile("smollm2"), "qwen3": load_profile("qwen3_8b_cot"),
                          "mine": measured()})
    lines = table.splitlines()
    assert lines[0] == "| statistic | smollm2 | qwen3 | mine |"
    assert len(lines) == 2 + 3 + len(STATISTICS) + 1  # header, source / model / temperature, statistics, citation
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    row = {first: rest for first, *rest in cells}
    mine = measured()["profile"]["share_entropy_below_0.01"]
    assert row["share of tokens with entropy < 0.01 nat"] == ["0.8 %", "50.6 %", f"{100 * mine:.1f} %"]
    assert row["entropy, quantile 0.8, nats"][:2] == ["— (in [4, 6) by its histogram)", "0.672"]
    assert row["share of tokens with entropy ≥ 1 nat"][:2] == ["83.1 %", "—"]
    assert row["source"] == ["measured", "published", "measured"]
    assert row["citation"][1] == "Wang et al. 2025, arXiv:2506.01939"


BAD_DOCS = [  # (document, what the one-line message names)
    ([1, 2], "holds a JSON list; valid: a JSON object"),
    ({"profile_version": 3}, "profile_version=3; valid: 1 or 2"),
    (published(source="guessed"), "source='guessed'; valid: one of ['measured', 'published']"),
    (published(model=""), "model=''; valid: a non-empty string"),
    (published(citation=None), "a published profile needs a citation object"),
    (published(citation={"authors": "X", "year": 2025, "title": "T", "where": "§1"}), "neither arxiv nor url"),
    (published(citation={"authors": "X", "year": "2025", "title": "T", "where": "§1", "arxiv": "1"}),
     "citation.year='2025'; valid: an integer year"),
    (published({"share_entropy_below_0.01": 1.5}), "share_entropy_below_0.01=1.5; valid: a number in [0, 1]"),
    (published({"entropy_p80": -0.1}), "entropy_p80=-0.1; valid: a number >= 0 (nats)"),
    (published({"share_entropy_below_0.01": True}), "share_entropy_below_0.01=True"),
    (published({"n_tokens": 10.5}), "n_tokens=10.5; valid: an integer >= 1 or null"),
    (published({"median_entropy": 1.0, "entropy_p80": 0.5}), "median_entropy=1.0 exceeds entropy_p80=0.5"),
    (published({"mystery": 0.3}), "unknown statistic 'mystery'"),
    (published(quotes={"mystery": "words"}), "quotes must map statistic names"),
    (published({"entropy_bin_edges": [0.0, 1.0, None], "entropy_histogram": [0.5, 0.5]}), "entropy_bin_edges="),
]


@pytest.mark.parametrize(("doc", "message"), BAD_DOCS, ids=[m.split(";")[0][:40] for _, m in BAD_DOCS])
def test_malformed_profiles_are_refused_with_one_line(doc, message):
    with pytest.raises(ValueError) as info:
        validate_profile(doc, "X")
    text = str(info.value)
    assert message in text and text.startswith("profile X: ") and "\n" not in text


def test_malformed_measured_profiles_are_refused():
    missing = measured()
    del missing["profile"]["entropy_p80"]
    null = measured()
    null["profile"]["mean_entropy"] = None
    listed = dict(null, not_recorded=["mean_entropy"])
    wrong_share = measured()
    wrong_share["profile"]["share_entropy_below_0.1"] += 0.01
    no_histogram = measured()
    no_histogram["profile"]["entropy_histogram"] = None
    no_histogram["profile"]["entropy_bin_edges"] = None
    for doc, message in ((missing, "statistic 'entropy_p80' is missing"),
                         (null, "mean_entropy is null in a measured profile"),
                         (wrong_share, "but its histogram bins sum to"),
                         (no_histogram, "a measured profile needs entropy_bin_edges")):
        with pytest.raises(ValueError, match=message):
            validate_profile(doc)
    assert validate_profile(listed)["profile"]["mean_entropy"] is None  # null with its reason on record


def test_load_profile_refuses_bad_json_and_ambiguous_prefixes(tmp_path, monkeypatch):
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_profile(path)
    monkeypatch.setattr(profile_module, "list_profiles", lambda: ["abc_1", "abc_2"])
    with pytest.raises(ValueError, match="names more than one"):
        load_profile("abc")
