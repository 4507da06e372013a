"""Import hook for verl workers: importing this module registers every offpolicylab objective with verl, and
:class:`PolicyLossConfig`, verl's policy-loss config with the objective's parameters as config keys.

Use ``VERL_USE_EXTERNAL_MODULES=offpolicylab.integrations.verl_plugin`` (verl imports the listed modules in every
process that imports verl, Ray workers included) and give parameters as verl config keys::

    actor_rollout_ref.actor.policy_loss._target_=offpolicylab.integrations.verl_plugin.PolicyLossConfig
    actor_rollout_ref.actor.policy_loss.loss_mode=offpolicylab_m2po
    +actor_rollout_ref.actor.policy_loss.offpolicylab.tau=0.04

(or, as before, ``OFFPOLICYLAB_VERL_PARAMS`` as JSON, e.g. ``{"m2po": {"tau": 0.04}}``); see
:mod:`offpolicylab.integrations.verl`.
"""

from dataclasses import dataclass, field
from typing import Any

from offpolicylab.integrations.verl import register_with_verl

REGISTERED = register_with_verl()  # raises ImportError naming the extra when verl is missing

try:  # verl >= 0.6 declares its policy-loss config as a dataclass
    from verl.workers.config.actor import PolicyLossConfig as VerlPolicyLossConfig
except ImportError:  # older verl: its actor config is a plain mapping, policy_loss.offpolicylab needs no class
    VerlPolicyLossConfig = None

if VerlPolicyLossConfig is not None:
    @dataclass
    class PolicyLossConfig(VerlPolicyLossConfig):
        """verl's ``PolicyLossConfig`` (a strict dataclass) with one more field, ``offpolicylab``: the parameters of
        the offpolicylab objective that ``loss_mode=offpolicylab_<name>`` selects, ``{"tau": 0.04}``."""

        offpolicylab: dict[str, Any] = field(default_factory=dict)
