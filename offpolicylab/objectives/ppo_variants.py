"""Two changes to PPO's clip: GPPO keeps the gradient of clipped tokens, decoupled PPO clips against a proximal policy.

Shared notation: r = exp(logp − behavior_logp), A = advantage, sg = stop-gradient, ℓ = per-token loss aggregated by
``agg``; π_prox = exp(prox_logp), the proximal policy of decoupled PPO (supplied by the training loop, see
:func:`offpolicylab.proximal.proximal_logp`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from offpolicylab.diagnostics import stats
from offpolicylab.objectives.base import Objective, Param, register
from offpolicylab.objectives.batch import TokenBatch
from offpolicylab.objectives.policy_gradient import (
    clipped_surrogate,
    dual_clip_cap,
    ppo_clip_loss,
    straight_through,
)


@register("gppo")
class GPPO(Objective):
    """ℓ = max(−A·r, −A·clip(r, (1−ε_low)·r/sg(r), (1+ε_high)·r/sg(r)))
    (Gradient-Preserving clipping Policy Optimization, Su et al. 2025, "Klear-Reasoner", arXiv:2508.07629).

    The value is PPO's clipped loss max(−A·r, −A·clip(r, 1−ε_low, 1+ε_high)); only the gradient differs.  Where the
    clip sets the value the bound is (1±ε)·r/sg(r), whose derivative w.r.t. log π_θ is the bound 1±ε itself, so

        ∂ℓ/∂log π_θ = −A·r            where the unclipped term −A·r is the larger,
                      −A·(1+ε_high)    where A > 0 and r > 1+ε_high   (PPO: 0),
                      −A·(1−ε_low)     where A < 0 and r < 1−ε_low    (PPO: 0).

    Every token keeps a gradient (no token is masked); a clipped token's is bounded by its clip bound, which is why
    the paper calls it gentle.  Defaults ε_low = 0.2, ε_high = 0.28: the paper's (DAPO's clip-higher) and the bounds
    at which "Prosperity before Collapse" (Zheng et al. 2025, arXiv:2510.01161) runs GPPO as a baseline.  The paper's
    general form scales the two bounds' gradients by β₁, β₂; it trains with β₁ = β₂ = 1, the form implemented here.
    The authors' code adds verl's dual clip (c = 3, ℓ = min(ℓ, −A·c) for A < 0); the paper's objective has none, so
    ``dual_clip`` is off unless given.  Reports ``clip_frac``: share of valid tokens whose value a bound set.
    """


    params = {
        "eps_low": Param(0.2, float, low=0.0, doc="lower clip ε_low (ratio ≥ 1 − ε_low); inf = no lower bound"),
        "eps_high": Param(0.28, float, low=0.0, doc="upper clip ε_high (ratio ≤ 1 + ε_high); inf = no upper bound"),
        "dual_clip": Param(None, float, low=1.0, low_open=True, optional=True,
                           doc="dual-clip constant c > 1 (the authors' code: 3; the paper: none)"),
    }

    def token_loss(self, batch: TokenBatch) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        ratio = batch.ratio()
        negative = -batch.advantages.detach()
        unclipped, bounded, _, value = clipped_surrogate(ratio, negative, self.eps_low, self.eps_high)
        kept = stats.indicator(torch.eq, value, unclipped)  # the unclipped term set the value
        slope = torch.where(kept > 0, ratio, bounded)  # ∂(value / −A)/∂log π: r, or the bound that was hit
        if self.dual_clip is not None:  # −A·c caps the A < 0 branch; a capped token's value is a constant
            cap = dual_clip_cap(batch.advantages, self.dual_clip)
            capped = stats.indicator(torch.lt, cap, value)
            value = torch.minimum(value, cap)
            slope = torch.where(capped > 0, 0.0, slope)
        loss = straight_through(value, batch.logp, negative, slope)
        return loss, torch.ones_like(batch.mask), {"clip_frac": stats.fraction(1.0 - kept, batch.mask)}


@register("decoupled_ppo")
class DecoupledPPO(Objective):
    """ℓ = −w·min(u·A, clip(u, 1−ε_low, 1+ε_high)·A), u = π_θ/π_prox, w = sg(π_prox/π_behavior)
    (decoupled PPO, AReaL: Fu et al. 2025, "AReaL: A Large-Scale Asynchronous Reinforcement Learning System for
    Language Reasoning", arXiv:2505.24298).

    The trust region is centred on a recent proximal policy π_prox instead of the stale behaviour policy that
    sampled the tokens; the importance weight w = π_prox/π_behavior (a constant: both are detached) corrects the
    staleness.  π_prox is the policy before this rollout batch's first update, the log-probs recomputed with the
    current parameters (no grad) when the batch is first consumed
    (:func:`offpolicylab.proximal.proximal_logp`; the trainer supplies them because ``needs_prox`` is set).  With
    one update per rollout batch π_prox is the current policy: u = 1, nothing is clipped and the gradient is
    −w·A·∇log π_θ, importance sampling without a trust region.  ``prox_period`` = P updates share one π_prox (the
    policy at the first of them), as AReaL's and verl's P mini-batch updates per rollout batch do; the M2PO paper
    runs AReaL with 4 ("Prosperity before Collapse", Zheng et al. 2025, arXiv:2510.01161, s = 0 = 4 updates per
    rollout batch), hence the default 4.

    ``behavior_cap`` (AReaL's ``behav_imp_weight_cap``, off by default): tokens with w > cap get weight 0 — they
    leave the gradient and are counted in ``mask_frac``, as AReaL masks them; they stay in the aggregation's
    denominator.  Without ``prox_logp`` in the batch the objective refuses (a decoupled loss without π_prox would
    silently be GRPO).  Reports ``clip_frac``: share of valid tokens where the clip set the value.
    """

    needs_prox = True

    params = {
        "eps_low": Param(0.2, float, low=0.0, doc="lower clip ε_low on π_θ/π_prox; inf = no lower bound"),
        "eps_high": Param(0.2, float, low=0.0, doc="upper clip ε_high on π_θ/π_prox; inf = no upper bound"),
        "behavior_cap": Param(None, float, low=1.0, low_open=True, optional=True,
                              doc="drop tokens with π_prox/π_behavior above this cap (AReaL's behav_imp_weight_cap)"),
        "prox_period": Param(4, int, low=1,
                             doc="updates that share one π_prox, the policy at the first of them (AReaL's "
                                 "mini-batches per rollout batch)"),
    }

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        #: log π_prox of the rollout batches this run has started on, by batch key (kept and released through
        #: :meth:`keep_proximal` / :meth:`release_proximal`, as :func:`offpolicylab.proximal.proximal_logp` decides);
        #: checkpointed with the objective so a resume goes on exactly.
        self._proximal: dict[int, Tensor] = {}

    def kept_proximal(self, key: int) -> Tensor | None:
        """log π_prox of the rollout batch ``key``, if kept."""
        return self._proximal.get(key)

    def keep_proximal(self, key: int, logp: Tensor) -> None:
        """Keep ``logp`` (detached) as log π_prox of the rollout batch ``key`` until it is released."""
        self._proximal[key] = logp.detach()

    def release_proximal(self, keys: Any) -> None:
        """Drop log π_prox of the rollout batches ``keys`` (the schedule released them)."""
        for key in keys:
            self._proximal.pop(key, None)

    def state_dict(self) -> dict[str, Any]:
        return {"proximal": dict(self._proximal)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) != {"proximal"} or not all(isinstance(k, int) and isinstance(v, Tensor)
                                                 for k, v in state["proximal"].items()):
            raise ValueError("objective 'decoupled_ppo' state must be {'proximal': {batch key: log π_prox tensor}}")
        self._proximal = dict(state["proximal"])

    def token_loss(self, batch: TokenBatch) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        if batch.prox_logp is None:
            raise ValueError("objective 'decoupled_ppo' needs TokenBatch.prox_logp (log π_prox); valid: a batch from "
                             "the trainer, which supplies it, or prox_logp given explicitly")
        proximal_ratio = torch.exp(batch.logp.detach() - batch.prox_logp)
        loss, kept = ppo_clip_loss(batch.logp, proximal_ratio, batch.advantages, self.eps_low, self.eps_high)
        behavior_weight = torch.exp(batch.prox_logp - batch.behavior_logp)
        token_mask = torch.ones_like(batch.mask)
        if self.behavior_cap is not None:
            token_mask = stats.indicator(torch.le, behavior_weight, self.behavior_cap)
            behavior_weight = torch.where(token_mask > 0, behavior_weight, 0.0)
        return loss * behavior_weight, token_mask, {"clip_frac": stats.fraction(1.0 - kept, batch.mask)}
