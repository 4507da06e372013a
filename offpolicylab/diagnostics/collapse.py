"""Collapse detection: "reward falls from its running peak together with a KL or gradient-norm spike".

With a smoothed reward R̄_u = (1 − α)·R̄_{u−1} + α·R_u and its running peak P_u = max_{s≤u} R̄_s, update ``u`` is a
collapse when

    P_u − R̄_u ≥ margin   and   some update s ∈ [u − window, u] had a spike:  x_s > factor · x̄_{s−1}

for x = KL estimate (k3 between π_θ and the behaviour policy) or the pre-clip gradient norm, x̄ being their running
means (spikes only count after ``warmup`` updates, once the means have settled).  A non-finite loss or gradient is a
collapse by itself.  The pattern is the "prosperity before collapse" of M2PO: stale no-trust-region training first
improves, then a burst of extreme ratios produces a gradient spike and the reward never recovers.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass


@dataclass
class CollapseDetector:
    margin: float = 0.2
    factor: float = 5.0
    window: int = 20
    alpha: float = 0.1
    warmup: int = 10
    # state
    count: int = 0
    reward_ema: float = math.nan
    peak: float = -math.inf
    kl_mean: float = 0.0
    grad_mean: float = 0.0
    last_spike: int = -(10**9)
    collapsed_at: int = -1

    def observe(self, update: int, reward: float, kl: float, grad_norm: float) -> str | None:
        """Feed the metrics of one update; returns a reason string when this update is (the first) collapse."""
        if not (math.isfinite(reward) and math.isfinite(kl) and math.isfinite(grad_norm)):
            return self._flag(update, "non-finite metrics")
        self.reward_ema = reward if self.count == 0 else (1 - self.alpha) * self.reward_ema + self.alpha * reward
        self.peak = max(self.peak, self.reward_ema)
        if self.count >= self.warmup and (kl > self.factor * self.kl_mean or grad_norm > self.factor * self.grad_mean):
            self.last_spike = update
        n = self.count + 1
        self.kl_mean += (kl - self.kl_mean) / n
        self.grad_mean += (grad_norm - self.grad_mean) / n
        self.count = n
        dropped = self.peak - self.reward_ema >= self.margin
        if dropped and update - self.last_spike <= self.window and self.collapsed_at < 0:
            return self._flag(update, f"smoothed reward {self.reward_ema:.4g} fell from peak {self.peak:.4g} "
                                      f"after a spike at update {self.last_spike}")
        return None

    def non_finite(self, update: int) -> str | None:
        """Record a non-finite loss / gradient at ``update`` (always a collapse)."""
        return self._flag(update, "non-finite loss or gradient")

    def _flag(self, update: int, reason: str) -> str | None:
        if self.collapsed_at >= 0:
            return None
        self.collapsed_at = update
        return reason

    def state_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in asdict(self).items()}

    def load_state_dict(self, state: dict[str, float]) -> None:
        for key, value in state.items():
            current = getattr(self, key)
            setattr(self, key, int(value) if isinstance(current, int) else float(value))
