"""experiments/synthetic_lm_v6_horizon.py: the per-position KL share against a case computed by hand, (c) and (e₂)
on a hand-made metrics table, and the whole script on a tiny v6 run (seconds)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from offpolicylab.config import TrainConfig
from offpolicylab.trainer import train

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("synthetic_lm_v6_horizon",
                                              ROOT / "experiments" / "synthetic_lm_v6_horizon.py")
horizon = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(horizon)

V, T = 4, 5


class Fixed:
    """A policy whose logits are a fixed [T, V] table, the same for every prompt and prefix."""

    def __init__(self, table: torch.Tensor) -> None:
        self.table = table

    def response_logits(self, prompt_ids, prompt_mask, prompt_index, response_ids):  # noqa: ANN001, ANN201
        return self.table.expand(response_ids.shape[0], T, V).clone()


def kl_to_uniform(p: list[float]) -> float:
    return sum(x * math.log(x * len(p)) for x in p if x > 0)


def rollout(mask: torch.Tensor) -> SimpleNamespace:
    b = mask.shape[0]
    return SimpleNamespace(prompt_ids=torch.zeros(b, 1, dtype=torch.long), prompt_mask=torch.ones(b, 1),
                           prompt_index=torch.arange(b), response_ids=torch.zeros(b, T, dtype=torch.long),
                           response_mask=mask)


def test_one_position_that_differs_holds_the_whole_kl() -> None:
    reference = torch.zeros(T, V)
    table = reference.clone()
    table[2] = torch.tensor([1.0, -1.0, 0.5, 0.0])
    kl = horizon.token_kl(Fixed(table), Fixed(reference), rollout(torch.ones(3, T)))
    shares = horizon.position_shares(kl)
    assert shares["max_share"] == pytest.approx(1.0) and shares["max_position"] == 2
    p = torch.softmax(table[2].double(), 0).tolist()
    assert shares["sequence_kl"] == pytest.approx(kl_to_uniform(p), rel=1e-12)


def test_shares_weight_positions_as_the_sequence_kl_decomposes() -> None:
    # π₀ uniform; π = (1/2, 1/6, 1/6, 1/6) at position 0, (0.7, 0.1, 0.1, 0.1) at position 3; one of the
    # two responses ends after position 1, so position 3 counts for half the responses
    reference = torch.zeros(T, V)
    table = reference.clone()
    p0, p3 = [0.5, 1 / 6, 1 / 6, 1 / 6], [0.7, 0.1, 0.1, 0.1]
    table[0], table[3] = torch.tensor(p0).log(), torch.tensor(p3).log()
    mask = torch.tensor([[1.0, 1, 1, 1, 1], [1.0, 1, 0, 0, 0]])
    kl = horizon.token_kl(Fixed(table), Fixed(reference), rollout(mask))
    shares = horizon.position_shares(kl)
    k0, k3 = kl_to_uniform(p0), kl_to_uniform(p3) / 2
    assert shares["per_position"][0] == pytest.approx(k0, rel=1e-6)
    assert shares["per_position"][3] == pytest.approx(k3, rel=1e-6)
    assert shares["share"][0] == pytest.approx(k0 / (k0 + k3), rel=1e-6)
    assert shares["share"][3] == pytest.approx(k3 / (k0 + k3), rel=1e-6)
    assert sum(shares["share"]) == pytest.approx(1.0)
    # from the end: the last valid token is position 4 (row 0) and 1 (row 1): no KL at either; the one before is
    # position 3 (row 0) and 0 (row 1); the total over the two responses is 2 (k0 + k3)
    ends = horizon.from_end_shares(kl, mask)
    assert ends[0] == pytest.approx(0.0)
    assert ends[1] == pytest.approx((kl_to_uniform(p3) + k0) / (2 * (k0 + k3)), rel=1e-6)


def test_role_shares_follow_the_grammar() -> None:
    from offpolicylab.worlds.synthetic_lm_v6 import ANS, EOS, STEP
    text = 40
    response = torch.tensor([[text, STEP, 3, text, STEP, 5, ANS, 7, EOS, EOS]])
    kl = torch.tensor([[1.0, 2, 4, 0, 0, 8, 0, 16, 32, 0]])
    roles = horizon.role_shares(kl, response)
    total = 63.0
    assert roles["step 1 digit"] == pytest.approx(4 / total) and roles["step 2 digit"] == pytest.approx(8 / total)
    assert roles["answer digit"] == pytest.approx(16 / total) and roles["'='"] == pytest.approx(2 / total)
    assert roles["EOS"] == pytest.approx(32 / total) and roles["text"] == pytest.approx(1 / total)
    assert sum(roles.values()) == pytest.approx(1.0)


def test_clip_rise_and_gain_update_on_a_hand_made_table() -> None:
    updates = list(range(1000))
    clip = [0.01 if 257 <= u <= 500 else (0.02 if u >= 750 else 0.0) for u in updates]
    evals = {0: 0.2, 100: 0.3, 200: 0.5, 300: 0.65, 400: 0.7, 500: 0.68}  # gain 0.5, level 0.65
    metrics = pd.DataFrame({"update": updates, "clip_frac": clip,
                            "eval_reward_sampled": [evals.get(u, float("nan")) for u in updates]})
    c = horizon.clip_rise(metrics, 2000)
    assert c["partial"] and c["late_window"] == [750, 999]
    assert c["late_mean"] == pytest.approx(0.02) and c["early_mean"] == pytest.approx(0.01) and c["holds"]
    e = horizon.gain_update(metrics, 1000)
    assert not e["partial"] and e["gain"] == pytest.approx(0.5) and e["u90"] == 300 and not e["holds"]


def test_the_script_reads_a_tiny_v6_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OFFPOLICYLAB_CACHE", str(tmp_path / "cache"))
    world = {"preset": "seed_scale_v6", "num_train_prompts": 16, "distill_steps": 1, "distill_batch": 4}
    for schedule, name in (("stages:4", "on"), ("stale_k:2", "stale")):
        config = TrainConfig(world="synthetic_lm", world_params=world, objective="grpo",
                             objective_params={"eps_low": 0.2, "eps_high": 0.2}, schedule=schedule, updates=6,
                             lr=1e-2, seed=0, eval_every=2, eval_samples=1, sample_every=0, checkpoint_every=4)
        train(config, tmp_path / name)
    out = horizon.measure(tmp_path / "on", tmp_path / "stale", horizon=8, prompts=24)
    assert out["checkpoint_update"] == 6 and out["checkpoint_partial"]  # the final checkpoint, short of 8
    assert out["c"]["partial"] and out["e2"]["partial"]
    assert [u for u, _ in out["e2"]["evaluations"]][:3] == [0, 2, 4]
    d = out["d"]
    assert d["sequence_kl"] > 0 and sum(d["share"]) == pytest.approx(1.0) and 0 < d["max_share"] <= 1
    assert sum(d["by_role"].values()) == pytest.approx(1.0)
    assert 0 < out["f_end"]["mean"] <= 64 and 0 <= out["f_end"]["truncated"] <= 1
    assert "(d) checkpoint at update 6 PARTIAL" in horizon.report(out)
