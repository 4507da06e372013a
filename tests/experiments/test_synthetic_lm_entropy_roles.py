"""experiments/synthetic_lm_entropy_roles.py: each response token gets its role in the chain grammar (spelled by
hand here), and the table's per-role means and shares put back together give the overall mean entropy of the same
tokens, computed here from the policy's own scores."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from offpolicylab.config import TrainConfig
from offpolicylab.rollouts import sample
from offpolicylab.trainer import train
from offpolicylab.worlds.synthetic_lm_v6 import ANS, EOS, STEP

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("synthetic_lm_entropy_roles",
                                              ROOT / "experiments" / "synthetic_lm_entropy_roles.py")
roles_script = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(roles_script)

TEXT = 40
TINY = {"preset": "seed_scale_v6", "vocab_size": 32, "response_len": 16, "num_keys": 4, "num_train_prompts": 8,
        "d_model": 16, "num_heads": 2, "num_layers": 1, "distill_steps": 2, "distill_batch": 4}


def test_roles_of_a_spelled_response() -> None:
    response = torch.tensor([[TEXT, STEP, 3, TEXT, STEP, 7, 3, ANS, 5, EOS, EOS]])
    # a digit counts only right after '=' or ANS; the stray 3 (position 6) is text-position
    assert roles_script.roles(response).tolist() == [[0, 1, 3, 0, 1, 3, 0, 2, 3, 4, 4]]


def test_the_table_reassembles_the_mean_entropy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OFFPOLICYLAB_CACHE", str(tmp_path / "cache"))
    config = TrainConfig(world="synthetic_lm", world_params=dict(TINY), objective="grpo", policy="transformer",
                         updates=2, prompts_per_update=2, group_size=2, eval_every=2, sample_every=0,
                         checkpoint_every=2, lr=1e-2)
    train(config, tmp_path / "run")
    out = tmp_path / "roles.json"
    assert roles_script.main([str(tmp_path / "run"), "--batches", "2", "--prompts", "4", "--json", str(out)]) == 0
    table = json.loads(out.read_text())
    for label in ("pi0", str(tmp_path / "run")):
        row = table[label]
        shares = [row[name]["token_share"] for name in roles_script.ROLES]
        assert sum(shares) == pytest.approx(1.0)
        assert sum(row[name]["entropy_share"] for name in roles_script.ROLES) == pytest.approx(1.0)
        rebuilt = sum(row[name]["entropy"] * row[name]["token_share"] for name in roles_script.ROLES
                      if row[name]["entropy"] is not None)
        assert rebuilt == pytest.approx(row["entropy"], rel=1e-9)
    # the final policy's row is its own samples' entropy: the same draws, scored here
    run = roles_script.load_run(tmp_path / "run", final=True)
    generator = torch.Generator().manual_seed(123)
    entropies = []
    with torch.no_grad():
        for _ in range(2):
            rollout = sample(run.policy, run.world.sample_prompts(4, generator), run.config, generator)
            entropies.append(run.policy.score(rollout)[1][rollout.response_mask.bool()])
    assert table[str(tmp_path / "run")]["entropy"] == pytest.approx(float(torch.cat(entropies).double().mean()))
    assert table[str(tmp_path / "run")]["tokens"] == sum(e.numel() for e in entropies)
    assert table[str(tmp_path / "run")]["entropy"] != table["pi0"]["entropy"]  # the checkpoint was loaded
