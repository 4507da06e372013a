"""Deprecated import path: the shared types live in :mod:`offpolicylab.contracts` (kept for one release)."""

import warnings

from offpolicylab.contracts import Policy, Prompts, Rollout

warnings.warn("offpolicylab.policies.base is deprecated; import from offpolicylab.contracts",
              DeprecationWarning, stacklevel=2)

__all__ = ["Policy", "Prompts", "Rollout"]
