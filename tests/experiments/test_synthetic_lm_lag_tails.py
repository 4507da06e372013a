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

from offpolicylab.config import TrainConfig
from offpolicylab.trainer import train

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("synthetic_lm_lag_tails",
                                              ROOT / "experiments" / "synthetic_lm_lag_tails.py")
lag_tails = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(lag_tails)

TINY = {"vocab_size": 32, "response_len": 8, "num_keys": 4, "num_train_prompts": 16, "d_model": 16, "num_heads": 2,
        "num_layers": 1, "distill_steps": 20, "distill_batch": 16}


def test_lag_tails_trains_as_the_trainer_and_measures_the_lags(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OFFPOLICYLAB_CACHE", str(tmp_path / "cache"))
    lr, updates = 3e-2, 8  # a large step, so that ε = 0.2 clips something
    params = [x for k, v in TINY.items() for x in ("--world-param", f"{k}={v}")]
    out = tmp_path / "lag.json"
    assert lag_tails.main(["--lr", str(lr), "--updates", str(updates), "--probe-every", "4", "--probe-size", "16",
                           "--long-lags", "4", "--out", str(out), *params]) == 0
    result = json.loads(out.read_text())
    config = TrainConfig(world="synthetic_lm", world_params=dict(TINY), objective="grpo",
                         objective_params={"eps_low": 0.2, "eps_high": 0.2}, schedule="stages:4", updates=updates,
                         lr=lr, seed=0, eval_every=updates, sample_every=0, checkpoint_every=updates)
    train(config, tmp_path / "run")
    trainer_clip = pd.read_csv(tmp_path / "run" / "metrics.csv")["clip_frac"].to_numpy()
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
    config = TrainConfig(world="synthetic_lm", world_params=dict(TINY), objective="grpo",
                         objective_params={"eps_low": 0.2, "eps_high": 0.2}, schedule="stages:4", updates=updates,
                         lr=lr, seed=0, eval_every=updates, sample_every=0, checkpoint_every=updates)
    train(config, tmp_path / "run")
    trainer_clip = pd.read_csv(tmp_path / "run" / "metrics.csv")["clip_frac"].to_numpy()
    assert result["clip_frac_run"] == pytest.approx(float(np.mean(trainer_clip)), abs=1e-12)
    assert result["clip_frac_mean"] == pytest.approx(float(np.mean(trainer_clip[4:])), abs=1e-12)
    assert [row["birth"] for row in result["per_birth"]] == [4]
    assert set(result["probe"]) == {"1", "2", "3", "4"}  # the update-4 probe, scored after updates 4–7
    # one rollout batch (updates 4–7) in the in-run tails: one minibatch at each staleness 0–3
    sizes = {k: result["in_run"][k]["all"]["n"] for k in ("0", "1", "2", "3")}
    assert min(sizes.values()) > 0
    with pytest.raises(SystemExit):
        lag_tails.main(["--updates", "8", "--measure-from", "8", *params])
