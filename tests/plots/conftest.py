"""Hand-written run directories in the format of docs/design.md, "Run directories", for the plot tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest


def write_run(root: Path, name: str, config: dict[str, Any], metrics: dict[str, list[float]],
              events: list[dict[str, Any]] | None = None, samples: dict[int, dict[str, np.ndarray]] | None = None,
              summary: dict[str, Any] | None = None) -> Path:
    """Write one run directory by hand: config.json, metrics.csv, events.jsonl, samples/, summary.json."""
    run = root / name
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(config))
    pd.DataFrame(metrics).to_csv(run / "metrics.csv", index=False)
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events or []))
    if samples:
        (run / "samples").mkdir()
        for update, arrays in samples.items():
            np.savez(run / "samples" / f"update_{update:06d}.npz", **arrays)
    if summary is not None:
        (run / "summary.json").write_text(json.dumps(summary))
    return run


def token_samples(seed: int, n: int = 64, scale: float = 0.1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    log_ratio = rng.normal(0.0, scale, n)
    advantage, entropy = rng.choice([-1.0, 1.0], n), rng.uniform(0.1, 1.5, n)
    rows = 8
    return {"log_ratio": log_ratio, "advantage": advantage, "entropy": entropy,
            "kept": np.abs(log_ratio) < scale, "seq_log_ratio": rng.normal(0.0, scale, rows),
            "staleness": np.full(rows, 2),
            # the whole batch, as a run with sample_every > 0 records it (rows × n/rows tokens)
            "batch_log_ratio": log_ratio.reshape(rows, -1), "batch_advantage": advantage.reshape(rows, -1),
            "batch_mask": np.ones((rows, n // rows)), "batch_entropy": entropy.reshape(rows, -1),
            "batch_sampler_log_ratio": rng.normal(0.0, 0.05, (rows, n // rows)),
            "micro_batch": np.zeros(rows, dtype=np.int64)}


@pytest.fixture()
def full_runs(tmp_path: Path) -> list[Path]:
    """Four runs covering every figure: GRPO at two staleness levels, AC-MIS-PO, Mu-GRPO."""
    updates = list(range(6))
    base = {"update": updates, "reward_mean": [0.1, 0.3, 0.5, 0.6, 0.4, 0.2],
            "exact_return": [0.1, None, 0.5, None, 0.45, 0.25], "clip_frac": [0.0, 0.1, 0.2, 0.2, 0.3, 0.3],
            "mask_frac": [0.0] * 6, "ess": [1.0, 0.9, 0.8, 0.8, 0.7, 0.6], "kl_k1": [0.0, 0.01, 0.02, 0.02, 0.03, 0.04],
            "kl_k3": [0.0, 0.01, 0.02, 0.03, 0.03, 0.05], "m2": [0.0, 0.01, 0.03, 0.02, 0.05, 0.04]}
    samples = {0: token_samples(0), 5: token_samples(1, scale=0.3)}
    runs = [
        write_run(tmp_path, "grpo_s0", {"world": "token_mdp", "objective": "grpo", "schedule": "on_policy", "seed": 0},
                  base, samples=samples, summary={"status": "completed"}),
        write_run(tmp_path, "grpo_s4",
                  {"world": "token_mdp", "objective": "grpo", "schedule": "stale_k:4", "seed": 0,
                   "objective_params": {"eps_high": float("inf")}},
                  base, events=[{"event": "collapse", "update": 4}], samples=samples,
                  summary={"status": "collapsed"}),
        write_run(tmp_path, "ac", {"world": "token_mdp", "objective": "ac_mispo", "schedule": "stale_k:4", "seed": 0,
                                   "objective_params": {"a_start": 0.4, "a_end": 0.2, "warmup": 4}},
                  {**base, "accept_rate": [0.5, 0.42, 0.33, 0.3, 0.22, 0.2],
                   "traj_bound": [0.01, 0.008, 0.006, 0.005, 0.005, 0.005]}),
        write_run(tmp_path, "mu", {"world": "token_mdp", "objective": "mu_grpo", "schedule": "stages:4", "seed": 1},
                  {**base, "nav_frac": [0.0, 0.05, 0.1, 0.1, 0.2, 0.1]}),
    ]
    return runs
