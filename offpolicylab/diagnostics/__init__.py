"""Diagnostics: pure statistics of ratios, policies and runs (no training, no plotting).

``offpolicylab.diagnostics.correlation`` (Pearson / Spearman with p-values) imports scipy, so it is not imported
here: objectives import this package and should stay light.
"""

from offpolicylab.diagnostics import ratios, stats  # noqa: F401
from offpolicylab.diagnostics.ratios import EntropyByDeviation, clip_fraction, entropy_by_ratio_deviation

__all__ = ["EntropyByDeviation", "clip_fraction", "entropy_by_ratio_deviation"]
