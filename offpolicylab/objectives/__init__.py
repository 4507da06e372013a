"""One objective layer: every off-policy loss of the field on one token-level contract (DESIGN §2.2).

>>> from offpolicylab.objectives import get_objective, list_objectives
>>> obj = get_objective("grpo", eps_low=0.2, eps_high=0.28)
"""

from offpolicylab.objectives import policy_gradient  # noqa: F401  (registers reinforce, grpo)
from offpolicylab.objectives.aggregation import AGG_MODES, aggregate
from offpolicylab.objectives.base import (
    Objective,
    Param,
    get_objective,
    list_objectives,
    objective_params,
    register,
)
from offpolicylab.objectives.batch import LossOutput, TokenBatch

__all__ = [
    "AGG_MODES",
    "LossOutput",
    "Objective",
    "Param",
    "TokenBatch",
    "aggregate",
    "get_objective",
    "list_objectives",
    "objective_params",
    "register",
]
