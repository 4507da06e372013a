"""``offpolicylab replay --corrections``: the per-correction table against NumPy worked out from the formulas
(TRL token masking keeps the denominator, verl's rejection shrinks it), and the raw log-ratio histograms."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from offpolicylab import cli
from offpolicylab.integrations.record import Recorder
from offpolicylab.objectives import TokenBatch, get_objective
from offpolicylab.run_records import load_samples


def mismatched_batch(seed: int, rows: int = 4, length: int = 7) -> TokenBatch:
    gen = torch.Generator().manual_seed(seed)
    delta = 0.2 * torch.randn(rows, length, generator=gen, dtype=torch.float64)
    lengths = torch.randint(2, length + 1, (rows,), generator=gen)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).double()
    sampler_gap = torch.randn(rows, length, generator=gen, dtype=torch.float64)  # log π_b − log π_sampler
    return TokenBatch(logp=delta, behavior_logp=torch.zeros_like(delta), advantages=torch.randn(rows, generator=gen,
                      dtype=torch.float64), mask=mask, sampler_logp=-sampler_gap * mask,
                      entropy=3.0 * torch.rand(rows, length, generator=gen, dtype=torch.float64))


def recorded(path: Path, seeds: list[int]) -> Path:
    recorder = Recorder(path, {"engine": "test", "objective": "grpo", "objective_params": {}}, 1)
    scorer = get_objective("grpo")
    for seed in seeds:
        batch = mismatched_batch(seed)
        recorder.add(batch, scorer(batch), staleness=2)
        recorder.end_step(reward_mean=0.5)
    recorder.close()
    return path


def by_hand(path: Path, after_rejection: bool) -> dict[str, float]:
    """Token-mask at [0.5, 2] on log r = batch_sampler_log_ratio: factor e^s·1[in]; REINFORCE token-mean gradient
    A·factor/n with n the valid tokens (TRL) or the kept ones (verl)."""
    factors, dropped, seq_all, g_sq, g0_sq = [], [], [], 0.0, 0.0
    for file in sorted((path / "samples").glob("*.npz")):
        arrays = load_samples(file)
        mask = arrays["batch_mask"].astype(np.float64) > 0
        s = arrays["batch_sampler_log_ratio"].astype(np.float64)
        adv = np.broadcast_to(arrays["batch_advantage"].astype(np.float64).reshape(mask.shape[0], -1), mask.shape)
        inside = (np.exp(s) >= 0.5) & (np.exp(s) <= 2.0) & mask
        factor = np.where(inside, np.exp(s), 0.0)
        n, kept = mask.sum(), inside.sum()
        g0_sq += np.sum((adv * mask / n) ** 2)
        g_sq += np.sum((adv * factor / (kept if after_rejection else n)) ** 2)
        factors.append(factor[mask])
        dropped.append(~inside[mask])
        seq_all.append((~inside | ~mask).all(axis=1))
    factor = np.concatenate(factors)
    return {"tokens_dropped": np.concatenate(dropped).mean(), "seqs_dropped": np.concatenate(seq_all).mean(),
            "weight_mean": factor.mean(), "weight_max": factor.max(), "grad_norm_ratio": np.sqrt(g_sq / g0_sq)}


def test_replay_corrections_table_by_hand(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = recorded(tmp_path / "rec", [1, 2, 3])
    trl = ("trl:vllm_importance_sampling_mode=token_mask:vllm_importance_sampling_clip_min=0.5:"
           "vllm_importance_sampling_clip_max=2")
    verl = "verl:rollout_is=token:rollout_is_threshold=2:rollout_rs=token_k1:rollout_rs_threshold=0.5_2.0"
    out = tmp_path / "out"
    assert cli.main(["replay", str(path), "--objectives", "grpo", "--corrections", f"{trl},{verl},areal",
                     "--out", str(out)]) == 0
    assert "replay_corrections.csv" in capsys.readouterr().out
    assert (out / "replay_corrections.png").stat().st_size > 0
    rows = json.loads((out / "replay.json").read_text())["corrections"]
    assert [row["correction"] for row in rows] == [trl, verl, "areal"]
    for row, edits in zip(rows[:2], (False, True), strict=True):
        want = by_hand(path, edits)
        for key, value in want.items():
            assert row[key] == pytest.approx(value, rel=1e-6), (row["correction"], key)
    assert rows[0]["tokens_dropped"] == rows[1]["tokens_dropped"] > 0
    assert rows[0]["grad_norm_ratio"] != rows[1]["grad_norm_ratio"]

    import pandas as pd

    raw = pd.read_csv(out / "replay_raw_log_ratios.csv")
    assert set(raw["ratio"]) == {"sampler", "staleness"} and set(raw["lag"]) == {2.0}
    assert set(raw["entropy_tercile"]) == {1, 2, 3}
    tokens = rows[0]["tokens"]
    assert raw[raw["ratio"] == "sampler"]["count"].sum() == tokens == raw[raw["ratio"] == "staleness"]["count"].sum()


def test_replay_corrections_refuses_what_it_cannot_do(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from tests.diagnostics.test_replay import random_batch, record

    without = record(tmp_path / "plain", "grpo", {}, [[random_batch(1)]])
    with_sampler = recorded(tmp_path / "rec", [1])
    cases = {"no sampler log-probs": (without, "trl", "needs batches recorded with the sampler"),
             "unknown engine": (with_sampler, "vllm", "unknown correction engine 'vllm'"),
             "bad parameter": (with_sampler, "trl:cap=3", "no parameter cap"),
             "repeated": (with_sampler, "trl,trl", "distinct")}
    for case, (path, spec, message) in cases.items():
        out = tmp_path / f"out-{abs(hash(case))}"
        with pytest.raises(SystemExit) as stop:
            cli.main(["replay", str(path), "--objectives", "grpo", "--corrections", spec, "--out", str(out)])
        err = capsys.readouterr().err
        assert stop.value.code == 2 and err.count("\n") == 1 and message in err, (case, err)
        assert not out.exists(), case
