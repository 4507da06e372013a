"""``offpolicylab plot RUN`` on a run that recorded its batches (``sample_every`` > 0): the raw, pre-truncation
log-ratio figure and the CSV tables behind it hold the numbers of the run's own sample files, recomputed here with
NumPy alone (bin counts, verl's health numbers)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from offpolicylab import plots
from offpolicylab.config import TrainConfig
from offpolicylab.trainer import train

#: The bin edges the figure promises (nats), written out here rather than read from the code.
EDGES = [-np.inf, -2.0, -1.0, -0.5, -0.2, -0.1, -0.05, -0.02, -0.01, -0.001, 0.001, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5,
         1.0, 2.0, np.inf]


@pytest.fixture(scope="module")
def recorded_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small stale run whose sampler computes differently from the trainer (logit noise), recording every
    update's batch."""
    out = tmp_path_factory.mktemp("raw") / "run"
    config = TrainConfig(world="token_mdp", world_params={"length": 3}, objective="grpo", schedule="stale_k:2",
                         policy_params={"sampler_noise_std": 0.3}, updates=5, eval_every=5, sample_every=1,
                         checkpoint_every=100, seed=3)
    train(config, out)
    return out


def recorded_tokens(run: Path) -> dict[str, np.ndarray]:
    """The valid tokens of every sample file: log r (trainer vs sampler), Δ (current vs behaviour), advantage,
    version lag."""
    out: dict[str, list[np.ndarray]] = {"sampler": [], "delta": [], "adv": [], "lag": []}
    for path in sorted((run / "samples").glob("*.npz")):
        data = np.load(path)
        valid = data["batch_mask"] > 0
        out["sampler"].append(data["batch_sampler_log_ratio"][valid].astype(np.float64))
        out["delta"].append(data["batch_log_ratio"][valid].astype(np.float64))
        adv = data["batch_advantage"]
        out["adv"].append((adv if adv.ndim == 2 else np.broadcast_to(adv[:, None], valid.shape))[valid])
        out["lag"].append(np.broadcast_to(data["staleness"][:, None], valid.shape)[valid].astype(np.float64))
    return {key: np.concatenate(value) for key, value in out.items()}


def test_plot_writes_the_raw_log_ratio_figure_and_tables(recorded_run: Path, tmp_path: Path) -> None:
    messages: list[str] = []
    written = plots.plot_runs([recorded_run], tmp_path / "figs", figures=["raw_log_ratios"], log=messages.append)
    assert set(written) == {"raw_log_ratios"}
    assert written["raw_log_ratios"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    counts = pd.read_csv(tmp_path / "figs" / "raw_log_ratios.csv")
    health = pd.read_csv(tmp_path / "figs" / "raw_log_ratio_health.csv")
    tokens = recorded_tokens(recorded_run)
    assert tokens["sampler"].size > 100 and np.abs(tokens["sampler"]).max() > 0.05  # a real mismatch was recorded
    assert set(tokens["lag"]) == {0.0, 1.0, 2.0}  # stale_k:2 starts at lags 0, 1, then 2

    for ratio, key in (("sampler", "sampler"), ("staleness", "delta")):
        mine = counts[counts["ratio"] == ratio]
        pooled = mine.groupby("bin_low", sort=True)["count"].sum()
        want, _ = np.histogram(tokens[key], bins=EDGES)
        np.testing.assert_array_equal(pooled.to_numpy(), want)
        for lag in (0.0, 2.0):  # one split: the lag × advantage-sign cells, terciles pooled
            for sign in (-1, 1):
                pick = (tokens["lag"] == lag) & (np.sign(tokens["adv"]) == sign)
                cell = mine[(mine["lag"] == lag) & (mine["advantage_sign"] == sign)]
                got = cell.groupby("bin_low", sort=True)["count"].sum().reindex(EDGES[:-1], fill_value=0)
                np.testing.assert_array_equal(got.to_numpy(), np.histogram(tokens[key][pick], bins=EDGES)[0])

        row = health[health["ratio"] == ratio].iloc[0]
        rho = np.exp(tokens[key])
        assert row["tokens"] == rho.size
        assert row["is_mean"] == pytest.approx(rho.mean(), rel=1e-9)
        assert row["ess"] == pytest.approx(rho.sum() ** 2 / (rho.size * (rho * rho).sum()), rel=1e-9)
        assert row["chi2"] == pytest.approx((rho * rho).mean() - 1.0, rel=1e-9, abs=1e-12)
        assert row["share_outside_0.5_2"] == pytest.approx(np.mean((rho < 0.5) | (rho > 2.0)))
        inside = 0.5 <= rho.mean() <= 2.0 and row["ess"] >= 0.3 and row["chi2"] <= 1.0
        assert (row["verl_health"] == "ok") == inside


def test_the_figure_marks_the_engine_bounds_and_writes_the_health_numbers(recorded_run: Path) -> None:
    fig = plots.raw_log_ratios(plots.load_runs([recorded_run]))
    ax = fig.axes[0]
    marks = sorted(t.get_text() for t in ax.texts if t.get_text().startswith("r="))
    assert marks == ["r=0.5", "r=2", "r=3", "r=5"]
    health = fig.offpolicylab_tables[plots.RAW_HEALTH_CSV]
    box = next(line for line in ax.get_title().splitlines() if line.startswith("sampler:"))
    mean = float(health[health["ratio"] == "sampler"]["is_mean"].iloc[0])
    assert f"IS mean {mean:.3g}" in box
    assert math.isfinite(mean)


def test_runs_without_recorded_batches_skip_the_figure(tmp_path: Path) -> None:
    from tests.plots.conftest import write_run

    run = write_run(tmp_path, "bare", {"objective": "grpo", "seed": 0}, {"update": [0, 1], "reward_mean": [0.1, 0.2]})
    with pytest.raises(plots.FigureSkipped, match="sample_every"):
        plots.raw_log_ratios(plots.load_runs([run]))


def test_a_negative_chi2_is_not_read_as_healthy() -> None:
    from offpolicylab import recorded

    # every token at log r = -0.1: ρ = e^-0.1 = 0.904837, χ²_token = ρ² − 1 = e^-0.2 − 1 = -0.181269
    row = recorded.raw_health(np.full(8, -0.1))
    assert row["chi2"] == pytest.approx(np.exp(-0.2) - 1.0)
    flags = recorded.health_flags(row)
    assert flags != "ok" and "chi2 -0.181 < 0" in flags
    assert recorded.health_flags(recorded.raw_health(np.array([0.1, -0.1]))) == "ok"  # χ² = cosh(0.2) − 1 > 0
