"""experiments/synthetic_lm_lag_tails.py on a tiny recipe (seconds): its loop trains exactly as the trainer does
(the same clip fraction at every update, so the probes and the parameter-group scoring leave training untouched),
the first minibatch of each rollout batch is on-policy (log r = 0), and later lags move."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from offpolicylab.config import TrainConfig
from offpolicylab.contracts import Rollout
from offpolicylab.trainer import train

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("synthetic_lm_lag_tails",
                                              ROOT / "experiments" / "synthetic_lm_lag_tails.py")
lag_tails = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(lag_tails)

TINY = {"preset": "seed_scale", "vocab_size": 32, "response_len": 8, "num_keys": 4, "num_train_prompts": 16, "d_model": 16, "num_heads": 2,
        "num_layers": 1, "distill_steps": 20, "distill_batch": 16}


def trainer_clip_fractions(lr: float, updates: int, out: Path) -> np.ndarray:
    """The clip fraction per update of the trainer's own run of the lag-tail script's configuration."""
    config = TrainConfig(world="synthetic_lm", world_params=dict(TINY), objective="grpo",
                         objective_params={"eps_low": 0.2, "eps_high": 0.2}, schedule="stages:4", updates=updates,
                         lr=lr, seed=0, eval_every=updates, sample_every=0, checkpoint_every=updates)
    train(config, out)
    return pd.read_csv(out / "metrics.csv")["clip_frac"].to_numpy()


def test_lag_tails_trains_as_the_trainer_and_measures_the_lags(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OFFPOLICYLAB_CACHE", str(tmp_path / "cache"))
    lr, updates = 3e-2, 8  # a large step, so that ε = 0.2 clips something
    params = [x for k, v in TINY.items() for x in ("--world-param", f"{k}={v}")]
    out = tmp_path / "lag.json"
    assert lag_tails.main(["--lr", str(lr), "--updates", str(updates), "--probe-every", "4", "--probe-size", "16",
                           "--long-lags", "4", "--out", str(out), *params]) == 0
    result = json.loads(out.read_text())
    trainer_clip = trainer_clip_fractions(lr, updates, tmp_path / "run")
    assert trainer_clip.mean() > 0
    assert result["clip_frac_mean"] == pytest.approx(float(np.mean(trainer_clip)), abs=1e-12)
    # stages:4: the first minibatch is the behaviour policy's (up to float32: sampling's and scoring's forwards)
    assert result["in_run"]["0"]["all"]["max"] < 1e-5
    assert all(result["in_run"][k]["all"]["max"] > 0 for k in ("1", "2", "3"))
    assert set(result["probe"]) == {"1", "2", "3", "4"} and result["probe"]["3"]["all"]["max"] > 0
    bins = result["probe"]["1"]["bins"]
    assert sum(b["share"] for b in bins.values()) == pytest.approx(1.0)
    assert set(result["groups_lag3"]) == {"full", "head", "embed", "body"}
    for lag in ("1", "2", "3"):  # every probe token is either of a just-trained key or not
        split = sum(result["by_key"][name].get(lag, {"n": 0})["n"] for name in ("shared", "other"))
        assert split == result["probe"][lag]["all"]["n"]
    assert result["self"]["all"]["max"] > 0  # the trained tokens moved
    assert result["adam_step_over_lr"]["first"][0][1] == pytest.approx(1.0, abs=0.02)  # Adam's first step: ±lr


def test_adam_noise_drift_grows_as_the_square_root_of_the_lag() -> None:
    drift = lag_tails.adam_displacement(0.0, lags=(2, 256), params=500, burn=1500, steps=1500)
    assert 25 < drift[256] / drift[2] < 45  # pure noise: ballistic below ~10 updates (momentum), diffusive beyond
    coherent = lag_tails.adam_displacement(1.0, lags=(2, 256), params=200, burn=1500, steps=1500)
    assert coherent[256] / coherent[2] > 100


def test_measure_from_probes_and_summarises_only_the_late_updates(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """``--measure-from 4``: the same training (the whole run's clip fraction equals the trainer's), but the probes
    are born at update 4 and later only, and the clip fraction and in-run tails cover updates 4–7."""
    monkeypatch.setenv("OFFPOLICYLAB_CACHE", str(tmp_path / "cache"))
    lr, updates = 3e-2, 8
    params = [x for k, v in TINY.items() for x in ("--world-param", f"{k}={v}")]
    out = tmp_path / "late.json"
    assert lag_tails.main(["--lr", str(lr), "--updates", str(updates), "--probe-every", "4", "--probe-size", "16",
                           "--long-lags", "4", "--measure-from", "4", "--out", str(out), *params]) == 0
    result = json.loads(out.read_text())
    trainer_clip = trainer_clip_fractions(lr, updates, tmp_path / "run")
    assert result["clip_frac_run"] == pytest.approx(float(np.mean(trainer_clip)), abs=1e-12)
    assert result["clip_frac_mean"] == pytest.approx(float(np.mean(trainer_clip[4:])), abs=1e-12)
    assert [row["birth"] for row in result["per_birth"]] == [4]
    assert set(result["probe"]) == {"1", "2", "3", "4"}  # the update-4 probe, scored after updates 4–7
    # one rollout batch (updates 4–7) in the in-run tails: one minibatch at each staleness 0–3
    sizes = {k: result["in_run"][k]["all"]["n"] for k in ("0", "1", "2", "3")}
    assert min(sizes.values()) > 0
    with pytest.raises(SystemExit):
        lag_tails.main(["--updates", "8", "--measure-from", "8", *params])


def _rollout(response_ids: list[list[int]], mask: list[list[int]]) -> Rollout:
    ids, m = torch.tensor(response_ids), torch.tensor(mask, dtype=torch.float32)
    rows = ids.shape[0]
    return Rollout(prompt_ids=torch.zeros(rows, 1, dtype=torch.long), prompt_mask=torch.ones(rows, 1),
                   response_ids=ids, response_mask=m, behavior_logp=torch.zeros_like(m),
                   group_ids=torch.arange(rows), prompt_index=torch.arange(rows))


def test_per_response_counts_tokens_outside_and_truncation_by_hand() -> None:
    """Three responses of width 3, EOS = 9: one ends with EOS at its last position (not truncated), one ends early,
    one fills the width without EOS (truncated).  log r = 0.3 is outside [0.8, 1.2] (> log 1.2 = 0.182), −0.2 is not
    (> log 0.8 = −0.223), −0.3 is; the padded position's 5.0 is ignored."""
    rollout = _rollout([[1, 2, 9], [9, 0, 0], [1, 2, 3]], [[1, 1, 1], [1, 0, 0], [1, 1, 1]])
    log_r = torch.tensor([[0.3, -0.2, 0.0], [-0.3, 5.0, 5.0], [0.1, 0.1, 0.1]])
    rows = lag_tails.per_response(log_r, rollout, torch.tensor([9]))
    np.testing.assert_allclose(rows, [[3, 0.5, 1, 0], [1, 0.3, 1, 0], [3, 0.3, 0, 1]], rtol=1e-6)
    fixed = lag_tails.per_response(log_r, rollout, None)  # fixed-length responses: truncation is undefined
    assert np.isnan(fixed[:, 3]).all()


def test_concentration_by_hand() -> None:
    """200 responses: 196 of 10 tokens with one outside and mean |log r| 0.01, and 4 of 60 tokens with 49 outside
    (mean |log r| 0.5 and 0.4): 4 responses (2 %) hold 196 of the 392 outside tokens; two of the four are
    truncated."""
    rows = np.array([[10, 0.1, 1, 0]] * 196 + [[60, 30.0, 49, 1]] * 2 + [[60, 24.0, 49, 0]] * 2, dtype=float)
    out = lag_tails.concentration(rows)
    assert out["responses"] == 200 and out["tokens"] == 2200 and out["outside_tokens"] == 392
    assert out["half_in_share_of_responses"] == pytest.approx(4 / 200)  # 4 × 49 = 196 = half
    assert out["share_in_top1pct_mean"] == pytest.approx(98 / 392)  # the top 2 responses by mean |log r|
    assert out["share_in_top5pct_mean"] == pytest.approx((196 + 6) / 392)  # top 10: the 4 and 6 with one each
    assert out["share_in_truncated"] == pytest.approx(98 / 392)
    assert out["truncated_responses"] == pytest.approx(2 / 200)
    assert out["truncated_tokens"] == pytest.approx(120 / 2200)
    # by chance: 392 of 2200 tokens (17.8 %) on random tokens give the four long responses ≈ 10.7 each and the
    # short ones ≈ 1.8 each (Poisson-like); sorted, half is reached after the four and ≈ 44 short ones holding
    # 3 or more: ≈ 48 of 200 responses, 12 × the observed 2 %
    assert 0.18 < out["half_in_share_null"] < 0.30
    assert lag_tails.half_share(np.array([3.0, 0.0, 1.0, 0.0])) == 0.25  # 3 of 4 in one of four responses
    assert lag_tails.half_share(np.array([1.0, 1.0, 1.0, 1.0])) == 0.5  # exactly half in two
    assert "half_in_share_of_responses" not in lag_tails.concentration(np.array([[5, 0.1, 0, 0]]))


def test_probe_free_run_reports_where_the_stale_outside_tokens_sit(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """``--probe-size 0 --no-rescore`` (a real model's cheap mode): no probes and no rescoring, the same training, and
    the stale minibatches' responses: 3 of every 4 minibatches (staleness 1–3) of 2 prompts × 2 responses."""
    monkeypatch.setenv("OFFPOLICYLAB_CACHE", str(tmp_path / "cache"))
    params = [x for k, v in TINY.items() for x in ("--world-param", f"{k}={v}")]
    out = tmp_path / "free.json"
    assert lag_tails.main(["--lr", "3e-2", "--updates", "8", "--probe-size", "0", "--no-rescore",
                           "--prompts-per-update", "2", "--group-size", "2", "--out", str(out), *params]) == 0
    result = json.loads(out.read_text())
    assert result["probe"] == {} and result["self"] == {} and result["groups_lag3"] == {}
    assert result["responses"]["responses"] == 6 * 4  # updates 1–3 and 5–7, 4 responses each
    assert result["responses"]["tokens"] == sum(result["in_run"][k]["all"]["n"] for k in ("1", "2", "3"))
    assert np.isnan(result["responses"]["truncated_responses"])  # the v5 student's responses have a fixed length


@pytest.mark.llm
def test_a_language_model_world_gets_probes_truncation_and_no_student_groups(tmp_path: Path) -> None:
    """On the GSM8k world with a tiny random Llama (the ``hf`` policy, picked by the model path as the CLI does):
    probes at lags 1–4, stale responses with truncation defined (8 new tokens: a random model rarely ends), and no
    parameter-group table (its groups are the student's)."""
    from tests.tiny_llm import build_tokenizer, save_model_and_data

    rows = [{"question": f"What is {a} plus {b}?", "answer": f"#### {a + b}"} for a, b in ((1, 2), (3, 4))]
    files = save_model_and_data(tmp_path, build_tokenizer(), rows, ["train", "test"])
    out = tmp_path / "lm.json"
    assert lag_tails.main(["--world", "gsm8k", "--world-param", f"model={files['model']}", "--world-param",
                           f"data={files['data']}", "--world-param", "max_response_len=8", "--world-param", "n_eval=1",
                           "--policy-param", "lora_r=4", "--prompts-per-update", "2", "--group-size", "2",
                           "--lr", "1e-2", "--updates", "8", "--probe-every", "4", "--probe-size", "4",
                           "--long-lags", "4", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["probe"]) == {"1", "2", "3", "4"} and result["groups_lag3"] == {}
    assert result["in_run"]["0"]["all"]["max"] < 1e-4  # lag 0: the sampling and the training forwards agree
    assert result["responses"]["responses"] == 6 * 4
    assert 0.0 <= result["responses"]["truncated_responses"] <= 1.0  # defined: the tokenizer has an EOS
