"""Diagnostics: pure statistics of ratios, policies and runs (no training, no plotting).

``offpolicylab.diagnostics.correlation`` (Pearson / Spearman with p-values) imports scipy, so it is not imported
here: objectives import this package and should stay light.
"""

from offpolicylab.diagnostics import ratios, stats  # noqa: F401
from offpolicylab.diagnostics.ratios import (
    EntropyByDeviation,
    SignedRatioHistogram,
    clip_fraction,
    entropy_by_ratio_deviation,
    mask_fraction,
    sequence_geometric_mean_ratio,
    signed_ratio_histogram,
    symmetric_log_edges,
    trust_region_second_moment,
)

__all__ = [
    "EntropyByDeviation",
    "SignedRatioHistogram",
    "clip_fraction",
    "entropy_by_ratio_deviation",
    "mask_fraction",
    "sequence_geometric_mean_ratio",
    "signed_ratio_histogram",
    "symmetric_log_edges",
    "trust_region_second_moment",
]
