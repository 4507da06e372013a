"""Figures from hand-written run directories: every figure is produced, missing data skips cleanly, and the data
behind a figure equals what the run directories hold (checked with independent NumPy computations)."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.colors as mcolors
import numpy as np
import pytest

from offpolicylab import plots
from tests.plots.conftest import token_samples, write_run


def test_plot_runs_writes_every_figure(full_runs: list[Path], tmp_path: Path) -> None:
    messages: list[str] = []
    written = plots.plot_runs(full_runs, tmp_path / "figs", log=messages.append)
    assert set(written) == set(plots.FIGURES), messages
    for path in written.values():
        assert path.stat().st_size > 5_000
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_folder_of_runs_is_expanded(full_runs: list[Path]) -> None:
    runs = plots.load_runs([full_runs[0].parent])
    assert sorted(r.path.name for r in runs) == ["ac", "grpo_s0", "grpo_s4", "mu"]


def test_missing_columns_skip_with_a_message(tmp_path: Path) -> None:
    run = write_run(tmp_path, "bare", {"objective": "reinforce", "seed": 0},
                    {"update": [0, 1, 2], "reward_mean": [0.2, 0.4, 0.3]})
    messages: list[str] = []
    written = plots.plot_runs([run], tmp_path / "figs", log=messages.append)
    assert set(written) == {"training_curves", "return_heatmap"}
    skipped = [m for m in messages if m.startswith("skipped")]
    assert len(skipped) == len(plots.FIGURES) - 2
    assert any("accept_rate" in m for m in skipped) and any("samples" in m for m in skipped)


def test_return_table_equals_run_values(full_runs: list[Path], tmp_path: Path) -> None:
    extra = write_run(tmp_path, "grpo_s0_seed1", {"objective": "grpo", "schedule": "on_policy", "seed": 1},
                      {"update": [0, 1, 2], "exact_return": [0.2, 0.9, 0.7], "reward_mean": [0.0, 0.0, 0.0]})
    runs = plots.load_runs([*full_runs, extra])
    table = plots.return_table(runs).set_index(["label", "staleness"])
    # exact_return of the base runs: peak 0.5, last recorded 0.25; seed 1: peak 0.9, final 0.7.
    on_policy = table.loc[("grpo", "on_policy")]
    assert on_policy["peak"] == pytest.approx((0.5 + 0.9) / 2)
    assert on_policy["final"] == pytest.approx((0.25 + 0.7) / 2)
    assert on_policy["seeds"] == 2
    assert table.loc[("grpo(eps_high=inf)", "stale_k:4")]["final"] == pytest.approx(0.25)
    assert plots.return_column(runs) == "exact_return"
    fig = plots.return_heatmap(runs)
    annotations = sorted(float(t.get_text()) for t in fig.axes[0].texts)
    assert annotations == pytest.approx(sorted(table["peak"]))  # the heatmap draws exactly the peak values


def test_acceptance_m2_correlation_matches_numpy(full_runs: list[Path]) -> None:
    runs = plots.load_runs(full_runs)
    result = plots.acceptance_m2_correlation(runs)
    accept = np.array([0.5, 0.42, 0.33, 0.3, 0.22, 0.2])
    m2 = np.array([0.0, 0.01, 0.03, 0.02, 0.05, 0.04])
    assert result["n"] == 6
    assert result["pearson_r"] == pytest.approx(np.corrcoef(accept, m2)[0, 1])
    ranks = lambda x: np.argsort(np.argsort(x)).astype(float)  # noqa: E731  (no ties here)
    assert result["spearman_r"] == pytest.approx(np.corrcoef(ranks(accept), ranks(m2))[0, 1])
    assert 0.0 <= result["pearson_p"] <= 1.0


def test_entropy_by_ratio_bin_by_hand() -> None:
    import pandas as pd

    # |r - 1| = 0.005, 0.015, 0.3 (log r chosen so), entropies 1, 3, 5 -> bins 0, 1, 5.
    log_ratio = np.log([1.005, 0.985, 1.3])
    frame = pd.DataFrame({"log_ratio": log_ratio, "entropy": [1.0, 3.0, 5.0], "label": "x"})
    table = plots.entropy_by_ratio_bin(frame)
    assert table["bin"].tolist() == [0, 1, 5]
    assert table["entropy"].tolist() == [1.0, 3.0, 5.0]
    assert table["bin_low"].tolist() == [0.0, 0.01, 0.2]


def test_sample_frame_holds_the_npz_tokens(full_runs: list[Path]) -> None:
    frame = plots.sample_frame(plots.load_runs(full_runs[:1]))
    expected = np.concatenate([token_samples(0)["log_ratio"], token_samples(1, scale=0.3)["log_ratio"]])
    np.testing.assert_allclose(frame["log_ratio"].to_numpy(), expected)
    assert frame["update"].tolist() == [0] * 64 + [5] * 64


def test_one_colour_per_objective_across_figures(full_runs: list[Path]) -> None:
    runs = plots.load_runs(full_runs)

    def line_colours(fig) -> dict[str, str]:
        out = {}
        for ax in fig.axes:
            for line in ax.get_lines():
                if not line.get_label().startswith("_") and "target" not in line.get_label():
                    out[line.get_label()] = mcolors.to_hex(line.get_color())
        return out

    curves, kl = line_colours(plots.training_curves(runs)), line_colours(plots.ess_and_kl(runs))
    assert curves == kl
    assert curves["grpo"] == curves["grpo(eps_high=inf)"] == plots.objective_color("grpo").lower()
    assert curves["ac_mispo(warmup=4)"] == plots.objective_color("ac_mispo").lower()
    assert len(set(plots.COLORBLIND_COLORS)) == len(plots.OBJECTIVE_ORDER)


def test_collapse_marker_at_event_update(full_runs: list[Path]) -> None:
    runs = plots.load_runs(full_runs)
    fig = plots.training_curves(runs)
    offsets = [c.get_offsets() for ax in fig.axes for c in ax.collections if c.get_label() == "collapse detected"]
    points = {tuple(np.asarray(o)[0]) for o in offsets}
    assert (4.0, 0.4) in points and (4.0, 0.45) in points  # reward_mean and exact_return at update 4


def test_acceptance_target_schedule() -> None:
    # 0-based update u has taken k = u + 1 controller steps; eq. 8: 0.4 − 0.2·min(k/200, 1)
    np.testing.assert_allclose(plots.acceptance_target(np.array([0, 99, 199, 400]), 0.4, 0.2, 200),
                               [0.399, 0.3, 0.2, 0.2])


def test_labels_and_staleness_order() -> None:
    assert plots.run_label({"objective": "rec", "objective_params": {"importance_sampling": True}}) == \
        "rec(importance_sampling=True)"
    assert plots.run_label({"objective": "grpo", "objective_params": {"eps_high": math.inf}}) == "grpo(eps_high=inf)"
    # parameters equal to the registered defaults are left out of the label
    assert plots.run_label({"objective": "grpo", "objective_params": {"eps_low": 0.2, "eps_high": 0.28}}) == \
        "grpo(eps_high=0.28)"
    order = sorted(["stale_k:256", "stale_k:16", "on_policy"], key=plots.staleness_sort_key)
    assert order == ["on_policy", "stale_k:16", "stale_k:256"]


def test_pickled_samples_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "update_000001.npz"
    np.savez(path, log_ratio=np.array([{"a": 1}], dtype=object))
    with pytest.raises(ValueError):
        plots.load_samples(path)


def test_cli_main(full_runs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert plots.main([str(full_runs[0]), "--out", str(tmp_path / "f"), "--figures", "training_curves"]) == 0
    assert (tmp_path / "f" / "training_curves.png").is_file()
    assert plots.main([str(tmp_path / "missing"), "--out", str(tmp_path / "g")]) == 2
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(ValueError, match="valid: training_curves"):
        plots.plot_runs(full_runs, tmp_path / "h", figures=["nope"])


def test_sweep_cell_labels_come_from_the_grid_file(tmp_path: Path) -> None:
    from offpolicylab.grid import expand_grid
    from offpolicylab.run_dir import write_grid

    grid = {"base": {"world": "token_mdp"}, "axes": {
        "objective": [{"label": "grpo_no_tr", "objective": "grpo", "objective_params": {"eps_high": "inf"}}],
        "schedule": ["stale_k:16"]}}
    write_grid(tmp_path, grid)
    (cell,) = expand_grid(grid, tmp_path)
    run = write_run(tmp_path, cell.name, {"objective": "grpo", "objective_params": {"eps_high": math.inf}},
                    {"update": [0]})
    loaded = plots.load_run(run)
    assert loaded.labels == {"objective": "grpo_no_tr", "schedule": "stale_k-16"}
    assert loaded.label == "grpo_no_tr"
    assert plots.load_runs([tmp_path])[0].label == "grpo_no_tr"
    other = write_run(tmp_path / "elsewhere", cell.name, {"objective": "grpo"}, {"update": [0]})
    assert plots.load_run(other).label == "grpo"  # no grid file: the label comes from the config
