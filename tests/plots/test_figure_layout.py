"""Figures a new user reads without guessing: the heatmap's colorbar labels clear of the next panel, the entropy
legend outside its bars, analyze's spike and collapse lines named in a legend, "update 100" for one update."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from offpolicylab import analyze, plots  # noqa: E402
from offpolicylab.replay import updates_text  # noqa: E402
from tests.analyze_curves import VERL_NAMES, history  # noqa: E402


def test_heatmap_colorbar_label_is_clear_of_the_next_panel(full_runs: list[Path]) -> None:
    fig = plots.return_heatmap(plots.load_runs(full_runs))
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    panels = [ax for ax in fig.axes if ax.get_title()]
    bars = [ax for ax in fig.axes if not ax.get_title()]
    assert len(panels) == 2 and len(bars) == 2
    label = bars[0].yaxis.label.get_window_extent(renderer)
    gap = panels[1].get_tightbbox(renderer).x0 - label.x1  # from the peak colorbar's label to the final panel
    assert gap >= 0.25 * fig.dpi  # a quarter inch (it was 0.04 inch: the label touched the next panel's)
    for ax in panels:
        assert all(t.get_rotation() == 0 for t in ax.get_yticklabels())
    plt.close(fig)


def test_entropy_legend_sits_outside_the_bars(full_runs: list[Path]) -> None:
    fig = plots.entropy_vs_clipping(plots.load_runs(full_runs))
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legend = fig.axes[0].get_legend().get_window_extent(renderer)
    assert legend.y1 <= fig.axes[0].get_window_extent(renderer).y0  # below the panel
    plt.close(fig)


def test_spike_figure_names_its_marker_lines(tmp_path: Path) -> None:
    log = tmp_path / "verl.jsonl"
    log.write_text("".join(json.dumps({"step": row["step"], "data": {name: row[ours] for ours, name in
                                                                       VERL_NAMES.items()}}) + "\n"
                           for row in history("collapsing")))
    analysis = analyze.analyze(log)
    figures = []
    original, plt.close = plt.close, figures.append
    try:
        analyze.draw(analysis, "spikes", tmp_path / "spikes.png")
    finally:
        plt.close = original
    for ax in figures[0].axes:
        labels = [text.get_text() for text in ax.get_legend().get_texts()]
        assert {"logged", "spike (detector)", "collapse (detector)"} <= set(labels)
    plt.close(figures[0])


def test_one_update_is_said_in_the_singular() -> None:
    assert updates_text([100]) == "update 100" and updates_text([100, 200, 300]) == "3 updates (100..300)"
