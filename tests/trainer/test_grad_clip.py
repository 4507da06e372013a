"""The optimizer step's gradient clipping, end to end: one SGD update (lr 1, no momentum) of a run whose gradient
norm exceeds ``grad_clip`` moves the parameters by exactly −g · min(1, c / (‖g‖ + 1e-6)), the scaling
``torch.nn.utils.clip_grad_norm_`` applies, on a single run and on each member of a stack of seeds (each clipped by
its own norm).  The unclipped gradient g is read from two unclipped runs: θ(lr 1) − θ(lr 2) = g, and
θ_0 = 2 θ(lr 1) − θ(lr 2)."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from offpolicylab import batched, trainer
from offpolicylab.run_dir import RunDir
from tests.small_runs import column, mdp_config

NO_CLIP = 1e9


def one_update(out: Path, lr: float, grad_clip: float, seed: int = 0):  # noqa: ANN201 - a config
    return mdp_config(optimizer="sgd", lr=lr, grad_clip=grad_clip, updates=1, eval_every=1, sample_every=0,
                      checkpoint_every=1, seed=seed)


def weights(run: Path) -> torch.Tensor:
    return RunDir(run).load_checkpoint()["policy"]["logits"].double()


def unclipped(tmp_path: Path, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(θ_0, g) of seed ``seed``'s first update, from two unclipped SGD runs."""
    trainer.train(one_update(tmp_path, 1.0, NO_CLIP, seed), tmp_path / f"lr1_{seed}")
    trainer.train(one_update(tmp_path, 2.0, NO_CLIP, seed), tmp_path / f"lr2_{seed}")
    one, two = weights(tmp_path / f"lr1_{seed}"), weights(tmp_path / f"lr2_{seed}")
    return 2 * one - two, one - two


def clipped_step(theta0: torch.Tensor, gradient: torch.Tensor, bound: float) -> torch.Tensor:
    """θ_0 − g after ``torch.nn.utils.clip_grad_norm_(·, bound)``."""
    param = torch.nn.Parameter(theta0.clone())
    param.grad = gradient.clone()
    torch.nn.utils.clip_grad_norm_([param], bound)
    return theta0 - param.grad


def test_single_run_clips_a_step_above_the_bound(tmp_path: Path) -> None:
    theta0, gradient = unclipped(tmp_path, 0)
    norm = float(gradient.norm())
    bound = norm / 4
    trainer.train(one_update(tmp_path, 1.0, bound), tmp_path / "clipped")
    got = weights(tmp_path / "clipped")
    assert math.isclose(column(tmp_path / "clipped", "grad_norm")[0], norm, rel_tol=1e-5)  # the pre-clip norm
    torch.testing.assert_close(got, clipped_step(theta0, gradient, bound), rtol=0, atol=1e-6)
    assert math.isclose(float((got - theta0).norm()), bound, rel_tol=1e-4)  # the step's norm is the bound
    torch.testing.assert_close(weights(tmp_path / "lr1_0"), theta0 - gradient, rtol=0, atol=1e-6)


def test_stack_clips_each_member_by_its_own_norm(tmp_path: Path) -> None:
    """Two seeds trained as one stack with a bound between their gradient norms: the larger is clipped to the
    bound, the smaller passes unchanged."""
    seeds = [0, 1]
    start = {seed: unclipped(tmp_path, seed) for seed in seeds}
    norms = {seed: float(g.norm()) for seed, (_, g) in start.items()}
    assert abs(math.log(norms[0] / norms[1])) > 0.05, norms  # distinct enough to put a bound between them
    bound = math.sqrt(norms[0] * norms[1])
    config = one_update(tmp_path, 1.0, bound)
    summaries = batched.train_seeds(config, seeds, tmp_path / "stack")
    assert [s["status"] for s in summaries] == ["completed", "completed"]
    for seed in seeds:
        run = tmp_path / "stack" / f"seed={seed}"
        theta0, gradient = start[seed]
        assert math.isclose(column(run, "grad_norm")[0], norms[seed], rel_tol=1e-5)
        torch.testing.assert_close(weights(run), clipped_step(theta0, gradient, bound), rtol=0, atol=1e-6)
