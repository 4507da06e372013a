"""The verl plug-in's objective parameters as verl config keys (``actor.policy_loss.offpolicylab.<param>``): the
adapter builds its objective with them, equal to the objective built directly; a value that contradicts the one
given at registration (``$OFFPOLICYLAB_VERL_PARAMS``) is refused.  The second test composes verl's own Hydra config
with the documented overrides (skipped without verl: it runs in .ci/run's verl environment)."""

from __future__ import annotations

import pytest
import torch

from offpolicylab.integrations import verl as verl_adapter
from offpolicylab.objectives import get_objective
from tests.integrations.test_verl import FakeActorConfig, our_loss, random_verl_inputs


class ActorWithParams(FakeActorConfig):
    def __init__(self, params: dict) -> None:
        super().__init__()
        self.policy_loss = {"offpolicylab": params}


def test_config_keys_set_the_objective_parameters() -> None:
    inputs = random_verl_inputs(seed=3, spread=0.6)
    adapter = verl_adapter.VerlPolicyLoss(get_objective("m2po"))
    loss, _ = adapter(**inputs, loss_agg_mode="token-mean", config=ActorWithParams({"tau": 0.01}))
    assert adapter.objective.tau == 0.01
    torch.testing.assert_close(loss, our_loss("m2po", inputs, "token-mean", tau=0.01))
    assert loss.item() != pytest.approx(our_loss("m2po", inputs, "token-mean").item())  # the default τ differs


def test_config_keys_may_not_contradict_the_registered_parameters() -> None:
    inputs = random_verl_inputs(seed=3)
    adapter = verl_adapter.VerlPolicyLoss(get_objective("m2po", tau=0.05), params={"tau": 0.05})
    adapter(**inputs, loss_agg_mode="token-mean", config=ActorWithParams({"tau": 0.05}))  # the same value: fine
    with pytest.raises(ValueError, match="objective parameter tau is 0.05 from register_with_verl"):
        adapter(**inputs, loss_agg_mode="token-mean", config=ActorWithParams({"tau": 0.2}))


def test_verl_hydra_config_carries_the_parameters() -> None:
    pytest.importorskip("verl.workers.config.actor")
    import os

    import verl
    from hydra import compose, initialize_config_dir
    from verl.utils.config import omega_conf_to_dataclass

    from offpolicylab.integrations import verl_plugin

    folder = os.path.join(verl.__path__[0], "trainer", "config")
    with initialize_config_dir(config_dir=folder, version_base=None):
        config = compose("ppo_trainer", overrides=[
            "actor_rollout_ref.actor.policy_loss._target_=offpolicylab.integrations.verl_plugin.PolicyLossConfig",
            "actor_rollout_ref.actor.policy_loss.loss_mode=offpolicylab_m2po",
            "+actor_rollout_ref.actor.policy_loss.offpolicylab.tau=0.01",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        ])
    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    assert isinstance(actor.policy_loss, verl_plugin.PolicyLossConfig)
    inputs = random_verl_inputs(seed=3, spread=0.6)
    adapter = verl_adapter.VerlPolicyLoss(get_objective("m2po"))
    loss, _ = adapter(**inputs, loss_agg_mode="token-mean", config=actor)
    torch.testing.assert_close(loss, our_loss("m2po", inputs, "token-mean", tau=0.01))
