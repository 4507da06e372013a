"""Token-statistics profile of sampled responses: how peaked a language model's next-token distributions are.

For every sampled response token t (``mask`` = 1) with next-token distribution p_t = softmax(z_t / T) at the
sampling temperature T and sampled token y_t:

    H_t = −Σ_v p_t(v) log p_t(v)          (entropy in nats)
    ℓ_t = log p_t(y_t)                    (log-probability of the sampled token)

The profile is the histogram of H_t over fixed edges (:data:`ENTROPY_BIN_EDGES`), the shares of tokens with
H_t < 0.1 nat ("near-deterministic") and H_t ≥ 1 nat ("forks"), the median H_t, and the share of sampled tokens
with p_t(y_t) < 1e-3 (the tail whose importance ratios explode when the policy moves, "Prosperity before Collapse",
Zheng et al. 2025, arXiv:2510.01161), plus percentiles of −ℓ_t.  The same pure functions compute it for a real LM
(``offpolicylab calibrate``) and for a synthetic world, so the two are compared with identical code
(:func:`compare_profiles`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
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

PACKAGED_PROFILES = "data/profiles"
"""Where the committed profiles live inside the ``offpolicylab`` package (written by ``offpolicylab calibrate``)."""

SHARE_KEYS: tuple[str, ...] = ("share_entropy_below_0.1", "share_entropy_at_least_1", "share_sampled_prob_below_1e-3")
"""The headline shares a synthetic world must match (each within ± ``tolerance``, see :func:`compare_profiles`)."""


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
    ``entropy_histogram`` (share of tokens per bin, sums to 1), the :data:`SHARE_KEYS`, ``median_entropy``,
    ``mean_entropy``, ``share_sampled_prob_below_1e-2``, ``mean_neg_logp`` and ``neg_logp_percentiles``.
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
        "share_entropy_below_0.1": float((h < LOW_ENTROPY).mean()),
        "share_entropy_at_least_1": float((h >= HIGH_ENTROPY).mean()),
        "share_sampled_prob_below_1e-3": float((neg_logp > -math.log(RARE_PROB)).mean()),
        "share_sampled_prob_below_1e-2": float((neg_logp > -math.log(1e-2)).mean()),
        "median_entropy": float(np.median(h)),
        "mean_entropy": float(h.mean()),
        "mean_neg_logp": float(neg_logp.mean()),
        "neg_logp_percentiles": {f"p{q:g}": float(np.percentile(neg_logp, q)) for q in NEG_LOGP_PERCENTILES},
    }


@dataclass(frozen=True)
class ProfileRow:
    """One statistic of two profiles side by side; ``within`` is None for statistics without a tolerance."""

    name: str
    reference: float
    candidate: float
    within: bool | None

    @property
    def difference(self) -> float:
        return self.candidate - self.reference


def compare_profiles(reference: Mapping[str, Any], candidate: Mapping[str, Any],
                     tolerance: float = 0.05) -> list[ProfileRow]:
    """Rows (reference vs candidate): each of :data:`SHARE_KEYS` checked |Δ| ≤ ``tolerance`` (0.05 = 5 points),
    then the median entropy and every histogram bin, shown without a check.  Profiles must share the bin edges;
    either may be a whole calibration file (its ``"profile"`` entry is used)."""
    reference, candidate = _statistics(reference), _statistics(candidate)
    if list(reference["entropy_bin_edges"]) != list(candidate["entropy_bin_edges"]):
        raise ValueError("the two profiles use different entropy bin edges; recompute one with token_profile")
    rows = [ProfileRow(k, float(reference[k]), float(candidate[k]),
                       abs(float(candidate[k]) - float(reference[k])) <= tolerance + 1e-12) for k in SHARE_KEYS]
    rows.append(ProfileRow("median_entropy", float(reference["median_entropy"]),
                           float(candidate["median_entropy"]), None))
    edges = reference["entropy_bin_edges"]
    for i, (a, b) in enumerate(zip(reference["entropy_histogram"], candidate["entropy_histogram"], strict=True)):
        upper = "inf" if edges[i + 1] is None else f"{edges[i + 1]:g}"
        rows.append(ProfileRow(f"entropy in [{edges[i]:g}, {upper})", float(a), float(b), None))
    return rows


def profiles_match(rows: Sequence[ProfileRow]) -> bool:
    """True when every checked row of :func:`compare_profiles` is within its tolerance."""
    return all(row.within is not False for row in rows)


def format_comparison(rows: Sequence[ProfileRow], names: tuple[str, str] = ("profile", "world")) -> str:
    """A Markdown table of :func:`compare_profiles` rows (statistic | reference | candidate | Δ | within)."""
    lines = [f"| statistic | {names[0]} | {names[1]} | Δ | within ±tol |", "|---|---:|---:|---:|:---:|"]
    for row in rows:
        verdict = "" if row.within is None else ("yes" if row.within else "**no**")
        lines.append(f"| {row.name} | {row.reference:.4f} | {row.candidate:.4f} | {row.difference:+.4f} | {verdict} |")
    return "\n".join(lines)


def load_profile(name_or_path: str | Path) -> dict[str, Any]:
    """A profile written by ``offpolicylab calibrate``: a packaged one by name (e.g.
    ``"smollm2_135m_instruct_gsm8k"``, see :data:`PACKAGED_PROFILES`) or a JSON file path."""
    path = Path(name_or_path)
    if path.suffix == ".json" and path.is_file():
        return json.loads(path.read_text(encoding="utf-8"))
    packaged = resources.files("offpolicylab").joinpath(PACKAGED_PROFILES, f"{name_or_path}.json")
    if not packaged.is_file():
        names = sorted(p.name.removesuffix(".json") for p in resources.files("offpolicylab").joinpath(
            PACKAGED_PROFILES).iterdir() if p.name.endswith(".json"))
        raise ValueError(f"no profile {str(name_or_path)!r}; valid: a profile JSON file or one of {names}")
    return json.loads(packaged.read_text(encoding="utf-8"))


def _statistics(profile: Mapping[str, Any]) -> Mapping[str, Any]:
    return profile["profile"] if "profile" in profile else profile


def _to_numpy(x: Tensor | np.ndarray) -> np.ndarray:
    if isinstance(x, Tensor):
        return x.detach().to("cpu", torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)
