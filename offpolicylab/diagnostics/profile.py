"""Token-statistics profile of sampled responses: how peaked a language model's next-token distributions are.

For every sampled response token t (``mask`` = 1) with next-token distribution p_t = softmax(z_t / T) at the
sampling temperature T and sampled token y_t:

    H_t = −Σ_v p_t(v) log p_t(v)          (entropy in nats)
    ℓ_t = log p_t(y_t)                    (log-probability of the sampled token)

The profile is the histogram of H_t over fixed edges (:data:`ENTROPY_BIN_EDGES`), the shares of tokens with
H_t < 0.01 nat and < 0.1 nat ("near-deterministic") and H_t ≥ 1 nat ("forks"), the 0.5 and 0.8 quantiles of H_t,
and the share of sampled tokens with p_t(y_t) < 1e-3 (the tail whose importance ratios explode when the policy
moves, "Prosperity before Collapse", Zheng et al. 2025, arXiv:2510.01161), plus percentiles of −ℓ_t.  The same pure
functions compute it for a real LM (``offpolicylab calibrate``) and for a synthetic world, so the two are compared
with identical code (:func:`compare_profiles`).

Profiles are data (docs/calibration.md, "The profile file"): a JSON document whose ``source`` is ``measured``
(written by ``offpolicylab calibrate``) or ``published`` (transcribed from a paper, with its ``citation``; a
statistic the paper does not give is null, never guessed); reading, listing and validating the files is
:mod:`offpolicylab.profile_files`.  :func:`side_by_side` prints any few profiles as one table.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

ENTROPY_BIN_EDGES: tuple[float, ...] = (0.0, 0.001, 0.01, 0.03, 0.1, 0.2, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, math.inf)
"""Entropy histogram edges in nats; bins are [a, b).  0.1 and 1 are edges, so the headline shares are sums of bins."""

LOW_ENTROPY = 0.1
HIGH_ENTROPY = 1.0
RARE_PROB = 1e-3
NEG_LOGP_PERCENTILES: tuple[float, ...] = (50.0, 90.0, 99.0, 99.9)

SHARE_KEYS: tuple[str, ...] = ("share_entropy_below_0.1", "share_entropy_at_least_1", "share_sampled_prob_below_1e-3")
"""The headline shares a synthetic world must match (each within ± ``tolerance``, see :func:`compare_profiles`)."""

VERY_LOW_ENTROPY = 0.01
ENTROPY_QUANTILE_KEYS: dict[str, float] = {"median_entropy": 0.5, "entropy_p80": 0.8}
"""The entropy quantiles a profile records, by key (median_entropy is the 0.5 quantile)."""



@dataclass(frozen=True)
class Statistic:
    """One scalar statistic of a profile: its key in the file, a label, and how it is checked and printed."""

    key: str
    label: str
    kind: str  # "share" (in [0, 1], printed in %), "nats" (≥ 0) or "count" (an integer ≥ 1)


STATISTICS: tuple[Statistic, ...] = (
    Statistic("n_tokens", "sampled tokens", "count"),
    Statistic("share_entropy_below_0.01", "share of tokens with entropy < 0.01 nat", "share"),
    Statistic("share_entropy_below_0.1", "share of tokens with entropy < 0.1 nat", "share"),
    Statistic("share_entropy_at_least_1", "share of tokens with entropy ≥ 1 nat", "share"),
    Statistic("median_entropy", "entropy, quantile 0.5 (median), nats", "nats"),
    Statistic("entropy_p80", "entropy, quantile 0.8, nats", "nats"),
    Statistic("mean_entropy", "entropy, mean, nats", "nats"),
    Statistic("share_sampled_prob_below_1e-3", "share of sampled tokens with π(y) < 1e-3", "share"),
    Statistic("share_sampled_prob_below_1e-2", "share of sampled tokens with π(y) < 1e-2", "share"),
    Statistic("mean_neg_logp", "−log π(y), mean, nats", "nats"),
)
"""Every scalar statistic of a profile, in the order tables print them.  A profile also holds
``entropy_bin_edges`` / ``entropy_histogram`` and ``neg_logp_percentiles`` (each may be null in a published one)."""

HISTOGRAM_SHARES = {"share_entropy_below_0.01": (None, VERY_LOW_ENTROPY), "share_entropy_below_0.1": (None, LOW_ENTROPY),
                     "share_entropy_at_least_1": (HIGH_ENTROPY, None)}
"""Shares that are sums of histogram bins (their thresholds are bin edges): (lower edge, upper edge)."""


def token_entropy(logp_full: Tensor) -> Tensor:
    """H = −Σ_v p_v log p_v over the last axis of log-probabilities ``logp_full`` [..., V] (p_v = 0 adds 0)."""
    logp = torch.as_tensor(logp_full).detach().double()
    p = logp.exp()
    return -(p * torch.where(p > 0, logp, torch.zeros_like(logp))).sum(-1)


def token_profile_from_logits(logits: Tensor, sampled_ids: Tensor, mask: Tensor,
                              temperature: float = 1.0) -> dict[str, Any]:
    """:func:`token_profile` of p = softmax(``logits`` / T) [B, T, V] at the sampled ids [B, T]."""
    if not temperature > 0:
        raise ValueError(f"temperature={temperature} is invalid; valid: a float > 0")
    logp_full = torch.log_softmax(torch.as_tensor(logits).detach().double() / temperature, dim=-1)
    sampled = logp_full.gather(-1, torch.as_tensor(sampled_ids).long()[..., None]).squeeze(-1)
    return token_profile(token_entropy(logp_full), sampled, mask)


def token_profile(entropy: Tensor | np.ndarray, sampled_logp: Tensor | np.ndarray,
                  mask: Tensor | np.ndarray) -> dict[str, Any]:
    """The profile of the tokens where ``mask`` > 0, from per-token entropies H_t and sampled log-probs ℓ_t [B, T].

    Returns a JSON-ready dict: ``n_tokens``, ``entropy_bin_edges`` (inf written as null),
    ``entropy_histogram`` (share of tokens per bin, sums to 1), ``share_entropy_below_0.01``, the
    :data:`SHARE_KEYS`, ``median_entropy`` and ``entropy_p80`` (the 0.5 and 0.8 quantiles of H_t, NumPy's default
    linear interpolation), ``mean_entropy``, ``share_sampled_prob_below_1e-2``, ``mean_neg_logp`` and
    ``neg_logp_percentiles``: every statistic of :data:`STATISTICS`.
    """
    keep = _to_numpy(mask) > 0
    h = _to_numpy(entropy)[keep]
    neg_logp = -_to_numpy(sampled_logp)[keep]
    if h.size == 0:
        raise ValueError("the mask selects no tokens; a profile needs at least one sampled token")
    if not (np.isfinite(h).all() and (h >= -1e-9).all()):
        raise ValueError("entropies must be finite and >= 0")
    counts, _ = np.histogram(np.clip(h, 0.0, None), bins=np.array(ENTROPY_BIN_EDGES))
    n = int(h.size)
    return {
        "n_tokens": n,
        "entropy_bin_edges": [None if math.isinf(e) else e for e in ENTROPY_BIN_EDGES],
        "entropy_histogram": [float(c) / n for c in counts],
        "share_entropy_below_0.01": float((h < VERY_LOW_ENTROPY).mean()),
        "share_entropy_below_0.1": float((h < LOW_ENTROPY).mean()),
        "share_entropy_at_least_1": float((h >= HIGH_ENTROPY).mean()),
        "share_sampled_prob_below_1e-3": float((neg_logp > -math.log(RARE_PROB)).mean()),
        "share_sampled_prob_below_1e-2": float((neg_logp > -math.log(1e-2)).mean()),
        "median_entropy": float(np.median(h)),
        "entropy_p80": float(np.quantile(h, 0.8)),
        "mean_entropy": float(h.mean()),
        "mean_neg_logp": float(neg_logp.mean()),
        "neg_logp_percentiles": {f"p{q:g}": float(np.percentile(neg_logp, q)) for q in NEG_LOGP_PERCENTILES},
    }


@dataclass(frozen=True)
class ProfileRow:
    """One statistic of two profiles side by side; ``within`` is None for statistics without a tolerance (or where
    either profile lacks the statistic: null in a published profile)."""

    name: str
    reference: float | None
    candidate: float | None
    within: bool | None

    @property
    def difference(self) -> float | None:
        if self.reference is None or self.candidate is None:
            return None
        return self.candidate - self.reference


def compare_profiles(reference: Mapping[str, Any], candidate: Mapping[str, Any],
                     tolerance: float = 0.05) -> list[ProfileRow]:
    """Rows (reference vs candidate): each of :data:`SHARE_KEYS` checked |Δ| ≤ ``tolerance`` (0.05 = 5 points)
    where both profiles give it, then the other statistics of :data:`STATISTICS` (share below 0.01 nat, the entropy
    quantiles 0.5 and 0.8, ...) and every histogram bin, shown without a check.  Histograms must share the bin edges;
    either profile may be a whole profile document (its ``"profile"`` entry is used) or bare statistics."""
    reference, candidate = _statistics(reference), _statistics(candidate)
    edges = reference.get("entropy_bin_edges")
    other = candidate.get("entropy_bin_edges")
    if edges is not None and other is not None and list(edges) != list(other):
        raise ValueError("the two profiles use different entropy bin edges; recompute one with token_profile")
    rows = []
    for key in SHARE_KEYS:
        a, b = _number(reference.get(key)), _number(candidate.get(key))
        within = None if a is None or b is None else abs(b - a) <= tolerance + 1e-12
        rows.append(ProfileRow(key, a, b, within))
    for stat in STATISTICS:
        if stat.key not in SHARE_KEYS and stat.kind != "count":
            rows.append(ProfileRow(stat.key, _number(reference.get(stat.key)), _number(candidate.get(stat.key)), None))
    ref_hist, cand_hist = reference.get("entropy_histogram"), candidate.get("entropy_histogram")
    edges = edges if edges is not None else other
    if edges is not None:
        for i in range(len(edges) - 1):
            upper = "inf" if edges[i + 1] is None else f"{edges[i + 1]:g}"
            rows.append(ProfileRow(f"entropy in [{edges[i]:g}, {upper})", _bin(ref_hist, i), _bin(cand_hist, i), None))
    return rows


def profiles_match(rows: Sequence[ProfileRow]) -> bool:
    """True when every checked row of :func:`compare_profiles` is within its tolerance and at least one was checked
    (a reference without the checked statistics, e.g. a published profile that gives none of them, matches
    nothing)."""
    checked = [row.within for row in rows if row.within is not None]
    return bool(checked) and all(checked)


def format_comparison(rows: Sequence[ProfileRow], names: tuple[str, str] = ("profile", "world")) -> str:
    """A Markdown table of :func:`compare_profiles` rows (statistic | reference | candidate | Δ | within); a
    statistic a profile does not give is "—"."""
    lines = [f"| statistic | {names[0]} | {names[1]} | Δ | within ±tol |", "|---|---:|---:|---:|:---:|"]
    for row in rows:
        verdict = "" if row.within is None else ("yes" if row.within else "**no**")
        difference = "—" if row.difference is None else f"{row.difference:+.4f}"
        lines.append(f"| {row.name} | {_fixed(row.reference)} | {_fixed(row.candidate)} | {difference} | {verdict} |")
    return "\n".join(lines)


def quantile_interval(profile: Mapping[str, Any], quantile: float) -> tuple[float, float] | None:
    """The histogram bin [a, b) that holds the ``quantile`` of H_t (the first bin where the cumulative share reaches
    it), or None without a histogram: what a profile's histogram says about a quantile it did not record."""
    stats = _statistics(profile)
    edges, hist = stats.get("entropy_bin_edges"), stats.get("entropy_histogram")
    if edges is None or hist is None:
        return None
    cumulative = np.cumsum(np.asarray(hist, dtype=np.float64))
    index = min(int(np.searchsorted(cumulative, quantile - 1e-12)), len(hist) - 1)
    upper = math.inf if edges[index + 1] is None else float(edges[index + 1])
    return float(edges[index]), upper


def side_by_side(profiles: Mapping[str, Mapping[str, Any]]) -> str:
    """A Markdown table of every statistic of :data:`STATISTICS` for each profile (one column per name, in order),
    with each profile's source, model, sampling temperature and, for a published one, its citation.  A statistic a
    profile does not give is "—"; for an entropy quantile its histogram bounds, when it has one, are shown."""
    names = list(profiles)
    docs = [profiles[name] for name in names]
    lines = ["| statistic | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]

    def row(label: str, cells: list[str]) -> None:
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    row("source", [str(doc.get("source", "—")) for doc in docs])
    row("model", [Path(str(doc.get("model", "—"))).name for doc in docs])
    row("sampling temperature", [_fixed((doc.get("sampling") or {}).get("temperature"), "g") for doc in docs])
    for stat in STATISTICS:
        row(stat.label, [_cell(doc, stat) for doc in docs])
    row("citation", [_citation(doc.get("citation")) for doc in docs])
    return "\n".join(lines)


def histogram_share(stats: Mapping[str, Any], low: float | None, high: float | None) -> float:
    """Σ of the histogram's bins in [low, high) (both bin edges; None = open end)."""
    edges = stats["entropy_bin_edges"]
    start = 0 if low is None else edges.index(low)
    stop = len(edges) - 1 if high is None else edges.index(high)
    return float(sum(stats["entropy_histogram"][start:stop]))


def _number(value: Any) -> float | None:
    return None if value is None else float(value)


def _bin(hist: Sequence[float] | None, index: int) -> float | None:
    return None if hist is None else float(hist[index])


def _fixed(value: Any, spec: str = ".4f") -> str:
    return "—" if value is None else format(value, spec)


def _cell(doc: Mapping[str, Any], stat: Statistic) -> str:
    value = _statistics(doc).get(stat.key)
    if value is None:
        interval = quantile_interval(doc, ENTROPY_QUANTILE_KEYS[stat.key]) if stat.key in ENTROPY_QUANTILE_KEYS \
            else None
        return "—" if interval is None else f"— (in [{interval[0]:g}, {interval[1]:g}) by its histogram)"
    if stat.kind == "share":
        return f"{100 * value:.1f} %"
    if stat.kind == "count":
        return f"{value:,}"
    return f"{value:.3f}"


def _citation(citation: Any) -> str:
    if not isinstance(citation, Mapping):
        return "—"
    first = (str(citation.get("authors", "")).split(",")[0].split() or [""])[-1]  # the first author's surname
    ref = f"arXiv:{citation['arxiv']}" if citation.get("arxiv") else str(citation.get("url", ""))
    return f"{first} et al. {citation.get('year', '')}, {ref}"


def _statistics(profile: Mapping[str, Any]) -> Mapping[str, Any]:
    return profile["profile"] if "profile" in profile else profile


def _to_numpy(x: Tensor | np.ndarray) -> np.ndarray:
    if isinstance(x, Tensor):
        return x.detach().to("cpu", torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)
