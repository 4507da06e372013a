"""verl's ``seq-mean-token-sum-norm`` and TRL's loss types as ``agg``: values worked by hand on the aggregation
fixture of test_core (golden tests against TRL's and verl's own code: tests/integrations/test_trl_loss_types.py,
tests/integrations/test_verl_agg.py)."""

from __future__ import annotations

import pytest
import torch

from offpolicylab.objectives import AGG_CHOICES, TokenBatch, aggregate, get_objective
from offpolicylab.objectives.aggregation import canonical_agg
from tests.objectives.test_core import AGG_LOSS, AGG_MASK

# rows: (1, 2, 3) full, (4, 5) of 3, the third empty (its inf / nan are padding); B = 3 rows, T = 3
HAND = {
    "seq-mean-token-sum-norm": (1 + 2 + 3 + 4 + 5) / (3 * 3),  # C = T = 3
    "dr_grpo": (1 + 2 + 3 + 4 + 5) / (3 * 3),
    "bnpo": (1 + 2 + 3 + 4 + 5) / 5,
    "dapo": (1 + 2 + 3 + 4 + 5) / 5,
}


@pytest.mark.parametrize("mode", sorted(HAND))
def test_new_modes_by_hand(mode: str) -> None:
    assert mode in AGG_CHOICES
    assert float(aggregate(AGG_LOSS, AGG_MASK, mode)) == pytest.approx(HAND[mode], rel=1e-15)
    assert float(aggregate(AGG_LOSS, AGG_MASK, mode, finite_padding=False)) == pytest.approx(HAND[mode], rel=1e-15)


@pytest.mark.parametrize("mode", AGG_CHOICES)
def test_a_given_token_count_is_the_one_summed(mode: str) -> None:
    """``tokens`` = Σ m (the batch's count, shared with the metrics) gives the loss bit for bit; token-mean reads it
    (a count of 4 instead of 5 → 15 / 4; so do its aliases bnpo and dapo), the other modes do not use it."""
    loss = AGG_LOSS.nan_to_num(0.0, 0.0, 0.0) * AGG_MASK
    assert torch.equal(aggregate(loss, AGG_MASK, mode, finite_padding=True, tokens=AGG_MASK.sum()),
                       aggregate(loss, AGG_MASK, mode, finite_padding=True))
    wrong = aggregate(loss, AGG_MASK, mode, finite_padding=True, tokens=torch.tensor(4.0, dtype=AGG_MASK.dtype))
    reads = canonical_agg(mode) == "token-mean"
    assert float(wrong) == pytest.approx(15 / 4 if reads else float(aggregate(loss, AGG_MASK, mode)), rel=1e-15)


@pytest.mark.parametrize("mode", ["seq-mean-token-sum-norm", "dr_grpo"])
def test_norm_constant_replaces_padded_length(mode: str) -> None:
    """C = agg_norm (TRL max_completion_length, verl loss_scale_factor): 15 / (3 · 10)."""
    assert float(aggregate(AGG_LOSS, AGG_MASK, mode, norm=10.0)) == pytest.approx(15 / 30, rel=1e-15)


def test_objective_agg_norm_and_its_checks() -> None:
    """reinforce: ℓ = −A·logp; with dr_grpo and agg_norm = 4 the loss is Σ m·ℓ / (B·4), the gradient −A·m / (B·4)."""
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.25, 0.0]], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
    adv = torch.tensor([[1.0] * 3, [-2.0] * 3], dtype=torch.float64)
    batch = TokenBatch(logp=logp, behavior_logp=logp.detach(), advantages=adv, mask=mask)
    loss = get_objective("reinforce", agg="dr_grpo", agg_norm=4)(batch).loss
    assert loss.item() == pytest.approx((6.0 + 2 * -0.75) / 8, rel=1e-15)
    (grad,) = torch.autograd.grad(loss, logp)
    torch.testing.assert_close(grad, -adv * mask / 8)
    with pytest.raises(ValueError, match="agg_norm"):
        get_objective("reinforce", agg="token-mean", agg_norm=4)
    with pytest.raises(ValueError, match="agg_norm"):
        get_objective("reinforce", agg="dr_grpo", agg_norm=0)
    with pytest.raises(ValueError, match="dr_grpo, bnpo, dapo"):
        get_objective("reinforce", agg="drgrpo")


def test_response_limit_is_the_constant_when_agg_norm_is_none() -> None:
    """A training loop sets response_limit (the world's max_response_len): C = 5 → 15 / (3 · 5); agg_norm wins."""
    batch = TokenBatch(logp=torch.zeros(3, 3, dtype=torch.float64), behavior_logp=torch.zeros(3, 3, dtype=torch.float64),
                       advantages=torch.zeros(3, dtype=torch.float64), mask=AGG_MASK)
    objective = get_objective("reinforce", agg="dr_grpo")
    objective.token_loss = lambda b: (torch.nan_to_num(AGG_LOSS, posinf=0.0, nan=0.0), b.mask, {})
    assert float(objective(batch).loss) == pytest.approx(15 / 9, rel=1e-15)
    objective.response_limit = 5
    assert float(objective(batch).loss) == pytest.approx(15 / 15, rel=1e-15)
    objective.agg_norm = 10.0
    assert float(objective(batch).loss) == pytest.approx(15 / 30, rel=1e-15)


def test_training_run_uses_the_world_length(tmp_path) -> None:
    from offpolicylab.build import build
    from tests.small_runs import mdp_config

    run = build(mdp_config(objective_params={"agg": "dr_grpo"}))
    assert run.objective.response_limit == 3 and run.objective.norm_constant == 3
