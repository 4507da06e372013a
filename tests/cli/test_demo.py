"""``offpolicylab demo``: both demo worlds run end to end (at a few updates) and draw their figure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from offpolicylab import cli, demo
from offpolicylab.run_dir import RunDir
from offpolicylab.sweep import run_sweep

SMALL_LM = json.loads((Path(__file__).resolve().parents[2] / "experiments" / "synthetic_lm_grid_small.json")
                      .read_text())["base"]["world_params"]


def test_token_mdp_demo_from_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "demo"
    assert cli.main(["demo", "--world", "token_mdp", "--out", str(out), "--updates", "4", "--workers", "1"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("completed") == 6 and "peak_exact_return" in printed
    assert (out / "demo.png").stat().st_size > 10_000


def test_synthetic_lm_demo_grid_and_figure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The synthetic-LM demo (a small recipe): ε-clipped grpo and m2po at stale_k:256 and on-policy grpo over
    seeds 0–2, the figure from the Monte-Carlo evaluation return (one line and seed band per configuration, the
    on-policy one dashed, labels with ε and τ), the table's eval-return columns from each summary."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    monkeypatch.setenv("OFFPOLICYLAB_CACHE", str(tmp_path / "cache"))
    grid = demo.demo_grid(4, world_params=SMALL_LM)
    grid["base"].update(eval_every=2, prompts_per_update=2, group_size=2)
    rows = run_sweep(grid, tmp_path / "demo", workers=1)
    assert [row["status"] for row in rows] == ["completed"] * 9
    configs = [json.loads((tmp_path / "demo" / row["cell"] / "config.json").read_text()) for row in rows]
    assert [c["schedule"] for c in configs] == ["stale_k:256"] * 6 + ["on_policy"] * 3
    assert [(c["objective"], c["seed"]) for c in configs] == [(o, s) for o in ("grpo", "m2po", "grpo")
                                                              for s in (0, 1, 2)]
    assert configs[0]["objective_params"]["eps_low"] == 0.2 and configs[3]["objective_params"]["tau"] == 0.04
    assert configs[6]["objective_params"]["eps_low"] == 0.2
    summary = RunDir(tmp_path / "demo" / rows[0]["cell"]).read_summary()
    for key in ("peak_eval_reward_sampled", "final_eval_reward_sampled", "final_reward", "peak_reward"):
        assert rows[0][key] == summary[key]  # sweep_results.csv and the demo's table name them as summary.json
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    figure = demo.demo_figure(tmp_path / "demo", tmp_path / "demo.png")
    assert figure.stat().st_size > 10_000
    ax = figures[0].axes[0]
    lines = {line.get_label(): line for line in ax.lines if not line.get_label().startswith("_")}
    assert set(lines) == {"grpo (ε = 0.2), stale_k:256", "m2po (τ = 0.04), stale_k:256", "grpo (ε = 0.2), on-policy"}
    assert lines["grpo (ε = 0.2), on-policy"].get_linestyle() == "--" and len(ax.collections) == 3  # one band each
    assert len(lines["m2po (τ = 0.04), stale_k:256"].get_xdata()) == 3  # updates 0, 2, 3 evaluated


def test_token_mdp_figure_has_one_line_per_configuration_and_bands_in_range(tmp_path: Path) -> None:
    """``demo --world token_mdp`` (small): six configurations (three objectives on-policy and at stale_k:32), each
    its own line, with evaluation points every 5 updates; a band is never wider than its seeds' range."""
    grid = demo.demo_grid(10, "token_mdp")
    grid["axes"]["seed"] = [0, 1]
    run_sweep(grid, tmp_path / "demo", workers=1)
    figures = drawn_figures(tmp_path / "demo", tmp_path / "demo.png")
    ax = figures[0].axes[0]
    labels = [line.get_label() for line in ax.lines if not line.get_label().startswith("_")]
    assert sorted(labels) == sorted(f"{name}, {schedule}" for name in ("grpo (ε = 0.2)",
                                                                        "grpo no trust region (ε = ∞)",
                                                                        "m2po (τ = 0.04)")
                                    for schedule in ("on-policy", "stale_k:32"))
    assert all(len(line.get_xdata()) == 3 for line in ax.lines if not line.get_label().startswith("_"))  # 0, 5, 9
    for band in ax.collections:
        top = max(path.vertices[:, 1].max() for path in band.get_paths())
        assert top <= 1.0 + 1e-9


def test_demo_figure_marks_the_detectors_flags(tmp_path: Path) -> None:
    """A collapse event in a run's events.jsonl is drawn as a marker on that run's line (the figure's axes hold one
    marker per flag, at the flagged update and the return interpolated there)."""
    grid = {"base": {"world": "bandit", "policy": "tabular", "updates": 6, "eval_every": 2, "lr": 0.1},
            "axes": {"objective": ["grpo"], "seed": [0, 1]}}
    rows = run_sweep(grid, tmp_path / "demo", workers=1)
    flagged = RunDir(tmp_path / "demo" / rows[1]["cell"])
    with open(flagged.path / "events.jsonl", "a") as fh:
        fh.write(json.dumps({"event": "collapse", "update": 3}) + "\n")
    figures = drawn_figures(tmp_path / "demo", tmp_path / "demo.png")
    markers = [line for line in figures[0].axes[0].lines if line.get_marker() == "X" and len(line.get_xdata())]
    assert len(markers) == 1 and list(markers[0].get_xdata()) == [3]


def test_unknown_demo_world_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["demo", "--world", "gsm8k"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'gsm8k'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="valid: token_mdp, synthetic_lm"):
        demo.demo_grid(world="gsm8k")


def drawn_figures(runs: Path, out: Path) -> list:
    """The matplotlib figures ``demo.demo_figure`` draws for ``runs`` (kept open: ``plt.close`` is intercepted)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures: list = []
    monkey = pytest.MonkeyPatch()
    monkey.setattr(plt, "close", figures.append)
    try:
        demo.demo_figure(runs, out)
    finally:
        monkey.undo()
    return figures
