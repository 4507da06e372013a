"""One objective layer: every off-policy loss of the field on one token-level contract (docs/design.md,
"The objective contract").

>>> from offpolicylab.objectives import get_objective, list_objectives
>>> obj = get_objective("grpo", eps_low=0.2, eps_high=0.28)
"""

# Importing a family module registers its objectives; the order here is the order of list_objectives().
# isort: off
from offpolicylab.objectives import (  # noqa: F401
    policy_gradient,  # reinforce, grpo
    rec,  # rec
    sequence_level,  # gspo, rec_gspo
    reward_weighted,  # opmd, asymre, red_drop, red_weight
    cispo_topr,  # cispo, topr
    m2po,  # m2po
    mispo,  # mispo, ac_mispo
    p3o,  # p3o
    mu_grpo,  # mu_grpo
    ppo_variants,  # gppo, decoupled_ppo
)
# isort: on
from offpolicylab.objectives.aggregation import AGG_CHOICES, AGG_MODES, TRL_LOSS_TYPES, aggregate
from offpolicylab.objectives.base import (
    OBJECTIVES,
    Objective,
    Param,
    get_objective,
    list_objectives,
    objective_params,
    register,
    unregister,
)
from offpolicylab.objectives.batch import LossOutput, TokenBatch

__all__ = [
    "AGG_CHOICES",
    "AGG_MODES",
    "OBJECTIVES",
    "LossOutput",
    "Objective",
    "Param",
    "TRL_LOSS_TYPES",
    "TokenBatch",
    "aggregate",
    "get_objective",
    "list_objectives",
    "objective_params",
    "register",
    "unregister",
]
