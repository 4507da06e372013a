"""MIS-PO and AC-MIS-PO: masked importance sampling at token and trajectory level ("Acceptance-Controlled MIS-PO:
Adaptive Trajectory Filtering for Stable Off-Policy RLVR Training"; no arXiv id, see docs/design.md, "Sources").

Notation: x_t = r_t = exp(logp − behavior_logp); ρ(τ) = exp(mean_t log x_t) is the geometric-mean ratio of a
trajectory over its valid tokens; A = advantage.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from offpolicylab.diagnostics import stats
from offpolicylab.objectives.base import Objective, Param, register
from offpolicylab.objectives.batch import TokenBatch
from offpolicylab.objectives.policy_gradient import straight_through


def _log_or_minus_inf(value: float) -> float:
    return math.log(value) if value > 0 else -math.inf


def _check_ratio_bounds(name: str, bounds: tuple[float, float]) -> None:
    low, high = bounds
    if not (0.0 <= low <= high):
        raise ValueError(f"parameter {name}={bounds!r} is invalid; valid: two ratios 0 ≤ min ≤ max, e.g. '0.5,2'")


def mispo_loss(
    batch: TokenBatch, tok_bounds: tuple[float, float], log_traj_low: Tensor | float, log_traj_high: Tensor | float
) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """ℓ_t = −1_tok(t)·1_traj(τ)·x_t·A_t with 1_tok = [x_t ∈ tok_bounds] and 1_traj = [log ρ(τ) ∈ [log_low, log_high]].

    Returns (ℓ, kept tokens as 0/1, metrics ``tok_accept_rate`` (valid tokens) and ``accept_rate`` (trajectories
    with at least one valid token)).  Rejected tokens get ℓ = 0 and exactly zero gradient whatever their ratio.
    """
    delta = batch.delta()
    tok_ok = stats.indicator(torch.ge, delta, _log_or_minus_inf(tok_bounds[0])) * stats.indicator(
        torch.le, delta, _log_or_minus_inf(tok_bounds[1]))
    log_rho = batch.sequence_log_ratio()
    traj_ok = (log_rho >= log_traj_low) & (log_rho <= log_traj_high)
    keep = tok_ok * traj_ok.to(delta.dtype)[:, None] * batch.mask
    ratio = torch.exp(keep * delta)  # rejected tokens get e^0: an overflowing ratio there cannot leak nan
    negative = -batch.advantages
    per_token = straight_through(keep * (negative * ratio), batch.logp, negative, keep * ratio)
    has_tokens = (batch.mask.sum(dim=-1) > 0).to(batch.mask.dtype)
    metrics = {
        "tok_accept_rate": stats.fraction(tok_ok, batch.mask, batch.runs),
        "accept_rate": batch.total(traj_ok.to(has_tokens.dtype) * has_tokens) / batch.total(has_tokens).clamp_min(1.0),
    }
    return per_token, keep, metrics


@register("mispo")
class MISPO(Objective):
    """MIS-PO (the fixed-bounds baseline of "Acceptance-Controlled MIS-PO"): L = −mean(1_tok·1_traj·x_t·A), token accept x_t ∈ tok_bounds = [0.5, 2], trajectory accept
    ρ(τ) = exp(mean_t log x_t) ∈ traj_bounds = [0.996, 1.001] (the fixed-bounds baseline of AC-MIS-PO).  The mean is
    ``agg`` over all valid tokens (rejected ones count as 0).

    Metrics: ``tok_accept_rate`` (share of valid tokens inside tok_bounds), ``accept_rate`` (share of trajectories
    inside traj_bounds), ``traj_bound`` = log(max traj bound), ``traj_bound_low`` = log(min traj bound).
    """


    params = {
        "tok_bounds": Param((0.5, 2.0), list, length=2, doc="token ratio accept range 'min,max'"),
        "traj_bounds": Param((0.996, 1.001), list, length=2, doc="trajectory geometric-mean ratio accept range 'min,max'"),
    }
    rowwise = True

    def check_params(self) -> None:
        _check_ratio_bounds("tok_bounds", self.tok_bounds)
        _check_ratio_bounds("traj_bounds", self.traj_bounds)

    def token_loss(self, batch: TokenBatch) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        log_low, log_high = (_log_or_minus_inf(bound) for bound in self.traj_bounds)
        per_token, keep, metrics = mispo_loss(batch, self.tok_bounds, log_low, log_high)
        metrics["traj_bound"] = batch.logp.new_tensor(log_high).detach()
        metrics["traj_bound_low"] = batch.logp.new_tensor(log_low).detach()
        return per_token, keep, metrics


def target_acceptance(k: int, a_start: float, a_end: float, warmup: int) -> float:
    """A*_k = a_start + (a_end − a_start)·min(k/K, 1) for update k ≥ 1, K = ``warmup`` (the AC-MIS-PO paper's eq. 8:
    A*_K = a_end at update K; A*_0 = a_start would be the target before the first update; K = 0 means a_end at once)."""
    if warmup <= 0:
        return a_end
    progress = min(max(k, 0) / warmup, 1.0)
    return a_start + (a_end - a_start) * progress


def acceptance_quantile(z: Tensor, valid: Tensor, level: float) -> Tensor:
    """Inverse empirical CDF (Hyndman–Fan type 1) of z over ``valid`` entries: z_(⌈level·n⌉), the smallest b with
    F̂(b) = #{z ≤ b}/n ≥ level.  Since a trajectory is accepted iff z ≤ b, this b accepts ⌈level·n⌉ of the n
    trajectories (ties aside): the accepted share tracks ``level`` from above by less than 1/n.  0 if n = 0."""
    keyed = torch.where(valid, z, torch.full_like(z, math.inf))
    ordered = torch.sort(keyed).values
    n = valid.sum()
    if z.numel() == 0:
        return z.new_zeros(())
    # ⌈level·n⌉ with a 1e-9 slack so that e.g. 0.7·10 = 7.000000000000001 counts as 7
    index = (torch.ceil(level * n.to(torch.float64) - 1e-9).long() - 1).clamp(min=0, max=z.numel() - 1)
    return torch.where(n > 0, ordered[index], z.new_zeros(()))


@register("ac_mispo")
class ACMISPO(Objective):
    """AC-MIS-PO ("Acceptance-Controlled MIS-PO: Adaptive Trajectory Filtering for Stable Off-Policy RLVR
    Training"): MIS-PO whose trajectory bounds [e^−b_k, e^b_k] come from an acceptance controller:

        z_i = |log ρ(τ_i)|,  b_cand = Quantile_{A*_k}(z),  b_k = clip(β·b_{k−1} + (1 − β)·b_cand, b_min, b_max),

    A*_k linear from a_start = 0.4 to a_end = 0.2 over ``warmup`` = 200 updates, β = ``ema`` = 0.9,
    b_min = log 1.0002, b_max = log 1.01, b_0 = b_max.  Token bounds [0.5, 2] as in MIS-PO.

    Quantile convention: a trajectory is accepted iff z_i ≤ b, so the accepted share is the empirical CDF F̂(b);
    b_cand is the inverse empirical CDF at A*_k (type 1, :func:`acceptance_quantile`), which makes the share accepted
    by b_cand equal ⌈A*_k·n⌉/n — the acceptance rate tracks the target (lagging by the EMA on a moving target).

    Stateful: :meth:`update` is called once per optimizer update, before that update's loss, and advances k and b_k
    from that update's batch; ``__call__`` never changes state.  b_k is kept as a 0-dim tensor (no host sync);
    :meth:`state_dict` returns plain python ``{"k": int, "b": float}``.  Metrics as MIS-PO, ``traj_bound`` = b_k and
    ``accept_target`` = A*_k of the current update.
    """

    stateful = True
    params = {
        "a_start": Param(0.4, float, low=0.0, high=1.0, low_open=True, doc="target trajectory acceptance at start"),
        "a_end": Param(0.2, float, low=0.0, high=1.0, low_open=True, doc="target trajectory acceptance after warmup"),
        "warmup": Param(200, int, low=0, doc="updates over which the target moves from a_start to a_end"),
        "ema": Param(0.9, float, low=0.0, high=1.0, high_open=True, doc="EMA factor β of the bound"),
        "b_min": Param(math.log(1.0002), float, low=0.0, doc="smallest log trajectory bound"),
        "b_max": Param(math.log(1.01), float, low=0.0, doc="largest log trajectory bound (and b_0)"),
        "tok_bounds": Param((0.5, 2.0), list, length=2, doc="token ratio accept range 'min,max'"),
    }

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._k = 0
        self._bound = torch.tensor(self.b_max, dtype=torch.float64)

    def check_params(self) -> None:
        if self.b_min > self.b_max:
            raise ValueError(f"parameters b_min={self.b_min} > b_max={self.b_max}; valid: 0 ≤ b_min ≤ b_max")
        if math.isinf(self.b_max):
            raise ValueError("parameter b_max=inf is invalid; valid: a finite float ≥ b_min")
        _check_ratio_bounds("tok_bounds", self.tok_bounds)

    @property
    def step(self) -> int:
        """k: optimizer updates seen so far."""
        return self._k

    @property
    def bound(self) -> Tensor:
        """b_k, the current log trajectory bound (0-dim tensor)."""
        return self._bound

    def update(self, batch: TokenBatch) -> None:
        """k ← k + 1; b_k = clip(β·b_{k−1} + (1 − β)·Quantile_{A*_k}(|log ρ|), b_min, b_max) on this batch."""
        self._k += 1
        level = target_acceptance(self._k, self.a_start, self.a_end, self.warmup)
        z = batch.sequence_log_ratio().abs().to(torch.float64)
        valid = batch.mask.sum(dim=-1) > 0
        candidate = acceptance_quantile(z, valid, level)
        previous = self._bound.to(candidate.device)
        blended = self.ema * previous + (1.0 - self.ema) * candidate
        self._bound = torch.where(valid.any(), blended, previous).clamp(self.b_min, self.b_max)

    def token_loss(self, batch: TokenBatch) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        bound = self._bound.to(device=batch.logp.device)
        per_token, keep, metrics = mispo_loss(batch, self.tok_bounds, -bound, bound)
        metrics["traj_bound"] = bound.to(batch.logp.dtype)
        target = target_acceptance(max(self._k, 1), self.a_start, self.a_end, self.warmup)
        metrics["accept_target"] = batch.logp.new_tensor(target)
        return per_token, keep, metrics

    def state_dict(self) -> dict[str, Any]:
        return {"k": int(self._k), "b": float(self._bound)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) != {"k", "b"}:
            raise ValueError(f"ac_mispo state must have keys ['b', 'k'], got {sorted(state)}")
        k, b = state["k"], state["b"]
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"ac_mispo state k={k!r} is invalid; valid: an int ≥ 0")
        if not isinstance(b, (int, float)) or not (self.b_min <= float(b) <= self.b_max):
            raise ValueError(f"ac_mispo state b={b!r} is invalid; valid: a float in [{self.b_min}, {self.b_max}]")
        self._k = k
        self._bound = torch.tensor(float(b), dtype=torch.float64)
