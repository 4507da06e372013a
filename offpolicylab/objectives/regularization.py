"""The KL-to-reference penalty and the entropy bonus that every objective takes (``kl_coef``, ``kl_estimator``,
``entropy_coef``), as verl adds them to the policy loss (``use_kl_loss`` / ``kl_loss_type`` / ``entropy_coeff``):

    L = L_objective + β · agg(k(log π_θ, log π_ref)) − c_H · agg(H(π_θ(·|s_t)))

with ``agg`` the objective's own aggregation and k one of Schulman's per-token estimators of KL(π_θ‖π_ref) on tokens
sampled from π_θ (J. Schulman, "Approximating KL divergence", 2020, joschu.net/blog/kl-approx.html), with
δ = log π_ref(y_t) − log π_θ(y_t):

    k1 = −δ                 unbiased, high variance, can be negative       (verl: ``k1`` / ``kl``)
    k2 = ½ δ²               biased, low variance, its gradient is KL's      (verl: ``k2`` / ``mse``)
    k3 = e^δ − 1 − δ ≥ 0    unbiased, low variance                          (verl: ``k3`` / ``low_var_kl``)

The reference π_ref is the frozen initial policy π₀ (the trainer scores each batch with it when β > 0;
``TokenBatch.ref_logp``).  k3 is :func:`offpolicylab.formulas.k3` with its one clamp (the exponent capped at 80, no
value float32 can hold changed); verl clamps δ to [−20, 20] and k3 to [−10, 10], which changes the penalty and
removes its gradient on the tokens furthest from π_ref, so we do not.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from offpolicylab.formulas import k3

#: Estimator names, verl's spellings included: k1 = kl, k2 = mse, k3 = low_var_kl.
KL_ESTIMATORS = ("k1", "k2", "k3", "kl", "mse", "low_var_kl")
_CANONICAL = {"kl": "k1", "mse": "k2", "low_var_kl": "k3"}


def kl_penalty(logp: Tensor, ref_logp: Tensor, estimator: str = "k3") -> Tensor:
    """Per-token estimate of KL(π_θ‖π_ref) from the log-probs of tokens sampled by π_θ (see the module docstring:
    k1 = −δ, k2 = ½δ², k3 = e^δ − 1 − δ with δ = ref_logp − logp); gradient through ``logp``."""
    kind = _CANONICAL.get(estimator, estimator)
    delta = ref_logp - logp
    if kind == "k1":
        return -delta
    if kind == "k2":
        return 0.5 * delta.square()
    if kind == "k3":
        return k3(delta)
    raise ValueError(f"unknown kl_estimator {estimator!r}; valid: {', '.join(KL_ESTIMATORS)}")


def check_entropy_gradient(objective: Any, policy: Any) -> None:
    """Refuse ``entropy_coef`` > 0 with a policy whose ``score`` returns the entropy without gradient (class
    attribute ``entropy_gradient = False``), before anything is written."""
    if getattr(objective, "entropy_coef", 0.0) > 0 and not getattr(policy, "entropy_gradient", True):
        raise ValueError(f"entropy_coef={objective.entropy_coef:g} needs the policy's entropy with gradient, which "
                         f"policy {type(policy).__name__} does not compute; valid: entropy_coef=0 with this policy")
