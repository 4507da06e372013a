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
    captured = capsys.readouterr()
    assert captured.out.count("completed") == 4 and "peak_exact_return" in captured.out
    assert (out / "demo.png").stat().st_size > 10_000
    assert "the stale runs (stale_k:1) train on π₀'s data for their first 2 updates, then 2 on data of their own " \
           "policy 1 updates old" in captured.err


@pytest.mark.parametrize(("updates", "lag"), [(1, 1), (4, 1), (20, 5), (127, 31), (128, 32), (1000, 32)])
def test_the_toy_demos_stale_runs_train_on_their_own_stale_data(updates: int, lag: int) -> None:
    """At K = 32, or a quarter of a shorter run, the updates after the first K consume batches that the run's own
    policy generated K updates before (version u − K > 0), not π₀'s alone (version 0); from 8 updates on, at least
    half of them."""
    from offpolicylab.staleness import parse_schedule

    grid = demo.demo_grid(updates, "token_mdp")
    assert grid["base"]["schedule"] == f"stale_k:{lag}"
    schedule = parse_schedule(grid["base"]["schedule"])
    own = [u for u in range(updates) if schedule.version(u) > 0]
    assert updates < 8 or len(own) >= updates / 2
    assert own == list(range(lag + 1, updates))  # version u − K: π₀'s batches up to u = K, own ones after


def test_the_demo_draws_only_the_runs_it_wrote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """An unrelated run in ``--out`` (another world, objective and schedule) stays out of demo.png: the figure's lines
    are the demo's four configurations."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = tmp_path / "demo"
    other = {"base": {"world": "bandit", "policy": "tabular", "updates": 6, "eval_every": 2, "lr": 0.1,
                      "objective": "reinforce"}, "axes": {"seed": [7]}}
    run_sweep(other, tmp_path / "other", workers=1)
    (tmp_path / "other" / "seed=7").rename(out.mkdir() or out / "someone_elses_run")
    figures: list = []
    monkeypatch.setattr(plt, "close", figures.append)
    assert cli.main(["demo", "--world", "token_mdp", "--out", str(out), "--updates", "4", "--workers", "1"]) == 0
    capsys.readouterr()
    labels = {line.get_label() for line in figures[0].axes[0].lines if not line.get_label().startswith("_")}
    assert labels == {"grpo (ε = 0.2), stale_k:1", "grpo no trust region (ε = ∞), stale_k:1",
                      "m2po (τ = 0.04), stale_k:1", "grpo (ε = 0.2), on-policy"}
    assert (out / "someone_elses_run" / "metrics.csv").is_file()  # left as it was


def test_synthetic_lm_demo_grid_and_figure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The synthetic-LM demo (a small recipe): ε-clipped grpo and m2po at stale_k:256 and on-policy grpo over
    seeds 0–2, the figure from the Monte-Carlo evaluation return (one line and seed band per configuration, the
    on-policy one dashed, labels with ε and τ), the table's eval-return columns from each summary."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    monkeypatch.setenv("OFFPOLICYLAB_CACHE", str(tmp_path / "cache"))
    grid = demo.demo_grid(4, world_params=SMALL_LM)
    assert grid["base"]["eval_every"] == 25 and grid["base"]["policy_params"] == {"token_draw": "inverse_cdf"}
    assert "collapse_tail" not in grid["base"]  # the detector watches the drained tail too (the default)
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
    figure = demo.demo_figure([tmp_path / "demo" / row["cell"] for row in rows], tmp_path / "demo.png")
    assert figure.stat().st_size > 10_000
    ax = figures[0].axes[0]
    lines = {line.get_label(): line for line in ax.lines if not line.get_label().startswith("_")}
    assert set(lines) == {"grpo (ε = 0.2), stale_k:256", "m2po (τ = 0.04), stale_k:256", "grpo (ε = 0.2), on-policy"}
    assert lines["grpo (ε = 0.2), on-policy"].get_linestyle() == "--" and len(ax.collections) == 3  # one band each
    assert len(lines["m2po (τ = 0.04), stale_k:256"].get_xdata()) == 3  # updates 0, 2, 3 evaluated


def test_token_mdp_figure_has_one_line_per_configuration_and_bands_in_range(tmp_path: Path) -> None:
    """``demo --world token_mdp`` (small): three objectives at stale_k:2 (a quarter of 10 updates) and one on-policy
    reference, each its own line (one dashed), with evaluation points every 5 updates; a band is never wider than
    its seeds' range."""
    grid = demo.demo_grid(10, "token_mdp")
    grid["axes"]["seed"] = [0, 1]
    rows = run_sweep(grid, tmp_path / "demo", workers=1)
    figures = drawn_figures([tmp_path / "demo" / row["cell"] for row in rows], tmp_path / "demo.png")
    ax = figures[0].axes[0]
    labels = [line.get_label() for line in ax.lines if not line.get_label().startswith("_")]
    assert sorted(labels) == sorted([*(f"{name}, stale_k:2" for name in ("grpo (ε = 0.2)",
                                                                         "grpo no trust region (ε = ∞)",
                                                                         "m2po (τ = 0.04)")),
                                     "grpo (ε = 0.2), on-policy"])
    dashed = [line.get_label() for line in ax.lines if line.get_linestyle() == "--"]
    assert dashed == ["grpo (ε = 0.2), on-policy"]
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
    figures = drawn_figures([tmp_path / "demo" / row["cell"] for row in rows], tmp_path / "demo.png")
    markers = [line for line in figures[0].axes[0].lines if line.get_marker() == "X" and len(line.get_xdata())]
    assert len(markers) == 1 and list(markers[0].get_xdata()) == [3]


def test_unknown_demo_world_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["demo", "--world", "gsm8k"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'gsm8k'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="valid: token_mdp, synthetic_lm"):
        demo.demo_grid(world="gsm8k")


def drawn_figures(runs: list[Path], out: Path) -> list:
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
