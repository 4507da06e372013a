"""The paper-figure scripts: the shared helpers of ``paper_figures/common.py`` on hand-made curves, and every claim
end to end in its --small mode (PNG, CSV and result.json written, numbers in range)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pandas as pd
import pytest

PAPER = Path(__file__).resolve().parents[2] / "paper_figures"


@pytest.fixture
def paper(monkeypatch: pytest.MonkeyPatch):
    """Import the paper_figures scripts fresh (they are plain scripts beside each other, not a package)."""
    monkeypatch.syspath_prepend(str(PAPER))
    for name in [m for m in sys.modules if m.startswith("claim_") or m in ("common", "run_all")]:
        monkeypatch.delitem(sys.modules, name)
    import common
    import run_all

    return common, run_all


def fake_run(common, values: dict[int, float], label: str = "x", seed: int = 0):
    metrics = pd.DataFrame({"update": list(values), "exact_return": list(values.values())})
    return common.plots.RunRecord(Path(f"/nowhere/{label}{seed}"), {"objective": "grpo", "seed": seed}, metrics,
                            label=label)


def test_curve_stats_reads_middle_peak_final_and_first_crossing(paper) -> None:
    common, _ = paper
    run = fake_run(common, {0: 0.1, 10: 0.5, 20: 0.95, 30: 0.8, 40: 0.92})
    stats = common.curve_stats(run, threshold=0.9)
    # middle = last evaluation at update <= 40 / 2 = 20 -> 0.95; first update with J >= 0.9 is 20
    assert stats == {"return_at_half": 0.95, "peak": 0.95, "final": 0.92, "updates_to_threshold": 20.0}
    assert math.isnan(common.curve_stats(run, threshold=0.99)["updates_to_threshold"])


def test_seed_mean_keeps_never_reached_as_nan(paper) -> None:
    common, _ = paper
    runs = [fake_run(common, {0: 0.2, 10: 0.95}, "a", 0), fake_run(common, {0: 0.4, 10: 0.85}, "a", 1),
            fake_run(common, {0: 0.2, 10: 0.95}, "b", 0), fake_run(common, {0: 0.5, 10: 0.91}, "b", 1)]
    mean = common.seed_mean(common.run_table(runs)).set_index("label")
    assert mean.loc["a", "final"] == pytest.approx((0.95 + 0.85) / 2)
    assert mean.loc["a", "return_at_half"] == pytest.approx((0.2 + 0.4) / 2)
    assert math.isnan(mean.loc["a", "updates_to_threshold"])  # seed 1 of "a" never reached 0.9
    assert mean.loc["b", "updates_to_threshold"] == 10.0
    assert common.rounded(mean.loc["a"], ("final", "updates_to_threshold", "absent")) == {"final": 0.9}


def test_no_trust_region_is_infinite_eps(paper) -> None:
    common, _ = paper
    assert common.NO_TRUST_REGION == {"eps_low": math.inf, "eps_high": math.inf}


def test_copy_doc_figures_refuses_missing_figures(paper, tmp_path: Path) -> None:
    _, run_all = paper
    with pytest.raises(ValueError, match="missing"):
        run_all.copy_doc_figures(tmp_path / "out", tmp_path / "docs")


@pytest.mark.slow
def test_run_all_small(paper, tmp_path: Path) -> None:
    _, run_all = paper
    run_all.main(["--small", "--out", str(tmp_path)])
    figures = {"a_three_arm_pitfall": "claim_a.png", "b_prosperity_before_collapse": "claim_b.png",
               "c_clip_fraction": "claim_c.png", "d_m2po_tau": "claim_d.png", "e_ac_mispo": "claim_e_controller.png",
               "f_p3o_vs_grpo_eps": "claim_f.png", "g_mu_grpo": "claim_g.png", "h_rec": "claim_h.png"}
    for claim, figure in figures.items():
        folder = tmp_path / f"{claim}_small"
        assert (folder / figure).stat().st_size > 5_000
        assert json.loads((folder / "result.json").read_text()), claim
        assert list(folder.glob("*.csv")), claim
    pitfall = json.loads((tmp_path / "a_three_arm_pitfall_small" / "result.json").read_text())
    assert set(pitfall) == {"advantage", "expected_gradient", "sampled_sgd", "sampled_adam"}
    labels = {"reinforce", "grpo_eps0.2", "grpo_eps_inf"}
    assert pitfall["advantage"] == {"reinforce": "mean", "grpo_eps0.2": "std", "grpo_eps_inf": "std"}
    for returns in (pitfall["sampled_sgd"], pitfall["sampled_adam"], *pitfall["expected_gradient"].values()):
        assert set(returns) == labels
        assert all(0.0 <= value <= 1.0 for value in returns.values())  # exact returns of r ∈ [0, 1]
    tau = json.loads((tmp_path / "d_m2po_tau_small" / "result.json").read_text())
    assert {"m2po_tau0.01", "m2po_tau0.16", "m2po_spread_over_tau"} <= set(tau)
    assert all(0.0 <= tau[k]["final"] <= 1.0 for k in ("m2po_tau0.01", "m2po_tau0.16"))
    p3o = json.loads((tmp_path / "f_p3o_vs_grpo_eps_small" / "result.json").read_text())
    assert {"p3o @ stale_k:4", "grpo_eps0.2 @ epochs:2", "spread @ stale_k:4"} <= set(p3o)
    veto = json.loads((tmp_path / "g_mu_grpo_small" / "result.json").read_text())
    assert 0.0 <= veto["mu_grpo_0_5_veto_suffix @ stages:4"]["nav_frac"] <= 1.0
    rec = json.loads((tmp_path / "h_rec_small" / "result.json").read_text())
    assert {"rec_oneside_nois @ sync:4,2", "rec_oneside_is @ sync:4,2", "contrasts @ sync:4,2"} <= set(rec)
