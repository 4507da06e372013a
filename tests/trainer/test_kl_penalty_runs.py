"""The KL penalty and the entropy bonus in training runs on an enumerable token MDP: with β > 0 the exact
KL(π‖π_0) at the end is lower than with β = 0 (same seed, everything else equal); batched seeds give each seed's own
run; a policy whose entropy carries no gradient refuses the entropy bonus before anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from offpolicylab.batched import train_seeds
from offpolicylab.trainer import train
from tests.small_runs import column, mdp_config, read_rows


def final_exact_kl(path: Path) -> float:
    return [float(row["exact_kl_init"]) for row in read_rows(path) if row["exact_kl_init"]][-1]


def test_kl_penalty_keeps_the_policy_closer_to_pi0(tmp_path: Path) -> None:
    settings = dict(updates=30, eval_every=10, checkpoint_every=30, sample_every=0, lr=0.1)
    train(mdp_config(**settings), tmp_path / "free")
    train(mdp_config(**settings, objective_params={"kl_coef": 1.0, "kl_estimator": "k3"}), tmp_path / "penalized")
    free, penalized = final_exact_kl(tmp_path / "free"), final_exact_kl(tmp_path / "penalized")
    assert free > 0.05  # the run moved away from π_0 ...
    assert penalized < 0.8 * free  # ... and the penalty held it closer
    kl_ref = column(tmp_path / "penalized", "kl_ref")  # the per-update estimate of the term is recorded
    assert len(kl_ref) == 30 and kl_ref[0] == pytest.approx(0.0, abs=1e-6)  # π = π_0 at update 0
    assert "kl_ref" not in read_rows(tmp_path / "free")[0]  # π_0 scores batches only for the penalty


@pytest.mark.parametrize("params", [{"kl_coef": 0.5, "kl_estimator": "k2"}, {"entropy_coef": 0.05}])
def test_batched_seeds_equal_separate_runs(tmp_path: Path, params: dict) -> None:
    config = mdp_config(updates=6, objective_params=params, sample_every=0)
    train_seeds(config, [0, 1], tmp_path / "together")
    for seed in (0, 1):
        train(mdp_config(updates=6, objective_params=params, sample_every=0, seed=seed), tmp_path / f"alone{seed}")
        together, alone = read_rows(tmp_path / "together" / f"seed={seed}"), read_rows(tmp_path / f"alone{seed}")
        for row_t, row_a in zip(together, alone, strict=True):  # the tabular policy: identical numbers
            assert {k: v for k, v in row_t.items() if not k.startswith("time_")} == \
                {k: v for k, v in row_a.items() if not k.startswith("time_")}


def test_entropy_bonus_changes_training(tmp_path: Path) -> None:
    train(mdp_config(updates=10, sample_every=0), tmp_path / "plain")
    train(mdp_config(updates=10, sample_every=0, objective_params={"entropy_coef": 0.5}), tmp_path / "bonus")
    assert column(tmp_path / "plain", "loss")[0] != column(tmp_path / "bonus", "loss")[0]
    assert column(tmp_path / "bonus", "entropy")[-1] > column(tmp_path / "plain", "entropy")[-1]
