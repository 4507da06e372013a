"""Diagnostics: pure statistics of ratios, policies and runs (no training, no plotting)."""

from offpolicylab.diagnostics import stats  # noqa: F401
