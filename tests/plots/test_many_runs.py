"""Every figure of ``plot`` on a sweep of 36 runs (3 objectives × 2 learning rates × 3 schedules × 2 seeds): every
run is drawn (no figure keeps the first few), one legend entry per configuration (objective and learning rate;
seeds are a band, schedules are columns), schedules in numeric order, and the collapse marker's words only where
a collapse was detected."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from offpolicylab import plots
from offpolicylab.sweep import run_sweep

OBJECTIVES = ("grpo", "m2po", "reinforce")
LRS = (0.05, 0.1)
SCHEDULES = ("on_policy", "stale_k:4", "stale_k:32")  # as text, stale_k:32 sorts before stale_k:4
SEEDS = (0, 1)
CONFIGS = {f"{objective}, lr={lr}" for objective in OBJECTIVES for lr in LRS}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("many") / "sweep"
    grid = {"base": {"world": "three_arm_pitfall", "updates": 4, "eval_every": 2, "sample_every": 2,
                     "prompts_per_update": 2, "group_size": 4},
            "axes": {"objective": list(OBJECTIVES), "lr": list(LRS), "schedule": list(SCHEDULES),
                     "seed": list(SEEDS)}}
    rows = run_sweep(grid, out)
    assert len(rows) == 36 and all(row["status"] == "completed" for row in rows)
    return out


@pytest.fixture(scope="module")
def runs(sweep: Path) -> list:
    return plots.load_runs([sweep])


def legend_labels(fig: plt.Figure) -> list[str]:
    return [text.get_text() for legend in fig.legends for text in legend.get_texts()]


def test_labels_tell_every_configuration_apart(runs: list) -> None:
    assert len(runs) == 36
    assert {run.label for run in runs} == CONFIGS


@pytest.mark.parametrize("name", ["training_curves", "ess_kl", "clip_fraction"])
def test_line_figures_have_one_entry_per_configuration_and_numeric_columns(runs: list, name: str) -> None:
    fig = plots.FIGURES[name](runs)
    labels = legend_labels(fig)
    assert sorted(labels) == sorted(CONFIGS)  # no "collapse detected": nothing collapsed
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles == [f"staleness: {schedule}" for schedule in SCHEDULES]
    for ax in fig.axes:  # a line per configuration that reports the panel's metric (clip_frac: grpo alone)
        shown = {line.get_label() for line in ax.get_lines()}
        assert shown == CONFIGS if name != "clip_fraction" else shown <= CONFIGS
    columns = len(SCHEDULES)
    for column in range(columns):  # every configuration is in every schedule's column
        assert {line.get_label() for ax in fig.axes[column::columns] for line in ax.get_lines()} == CONFIGS
    assert "collapse" not in fig._suptitle.get_text()
    plt.close(fig)


def test_heatmap_rows_and_columns(runs: list) -> None:
    fig = plots.return_heatmap(runs)
    ax = fig.axes[0]
    assert sorted(t.get_text() for t in ax.get_yticklabels()) == sorted(CONFIGS)
    assert [t.get_text() for t in ax.get_xticklabels()] == list(SCHEDULES)
    plt.close(fig)


def test_entropy_figure_has_every_configuration(runs: list) -> None:
    fig = plots.entropy_vs_clipping(runs)
    assert {line.get_label() for line in fig.axes[1].get_lines()} == CONFIGS
    plt.close(fig)


def row_titles(fig: plt.Figure) -> list[str]:
    """The first line of each row's first panel title (its run)."""
    return [ax.get_title().split("\n")[0] for ax in fig.axes if ax.get_visible() and ax.get_title()
            and ax.get_subplotspec().colspan.start == 0]


def test_per_run_figures_draw_every_run_in_order(runs: list) -> None:
    fig = plots.ratio_histograms(runs)
    titles = row_titles(fig)
    expected = [f"{config} | {schedule} | seed {seed}" for config in sorted(CONFIGS) for schedule in SCHEDULES
                for seed in SEEDS]
    assert titles == expected
    assert sorted(legend_labels(fig)) == ["A < 0", "A > 0"] or sorted(legend_labels(fig)) == \
        ["A < 0", "A = 0", "A > 0"]
    assert fig.offpolicylab_notes == []
    plt.close(fig)
    raw = plots.raw_log_ratios(runs)
    assert len([ax for ax in raw.axes if ax.get_visible()]) == 36
    assert raw.offpolicylab_notes == []
    plt.close(raw)


def test_a_run_limit_names_what_it_leaves_out(sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) \
        -> None:
    assert plots.main([str(sweep), "--out", str(tmp_path / "figs"), "--figures", "ratio_histograms",
                       "--max-runs", "30"]) == 0
    out = capsys.readouterr().out
    (note,) = [line for line in out.splitlines() if line.startswith("ratio_histograms: showing")]
    assert note.startswith("ratio_histograms: showing 30 of 36 runs (--max-runs 30); left out: ")
    left = note.split("left out: ")[1].split(" (omit")[0].split(", ")
    assert len(left) == 6 and all(name.startswith("objective=reinforce__lr=0.1__") for name in left)
    assert "omit --max-runs to show every run" in note
    assert plots.main([str(sweep), "--out", str(tmp_path / "bad"), "--max-runs", "0"]) == 2
