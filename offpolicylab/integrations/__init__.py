"""Adapters that export offpolicylab objectives to existing RL engines (docs/scaling.md).

- :mod:`offpolicylab.integrations.verl`: ``register_with_verl()`` adds every objective to verl's policy-loss
  registry as ``offpolicylab_<name>`` (select it with ``actor_rollout_ref.actor.policy_loss.loss_mode``).
- :mod:`offpolicylab.integrations.trl`: ``OffPolicyLabGRPOTrainer``, a TRL ``GRPOTrainer`` whose loss is any
  offpolicylab objective.

Both engines are optional extras: importing this package never imports verl or trl.
"""
