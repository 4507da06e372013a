"""The collapse experiment's tables and criteria (experiments/collapse_experiment.py): per-run statistics and the
mechanical verdicts on hand-made learning curves whose answers are worked out by hand."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from offpolicylab import plots

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "experiments" / "collapse_experiment.py"
SMALL_GRID = ROOT / "experiments" / "synthetic_lm_grid_small.json"
PAPER = ROOT / "paper_figures"
SPEC = importlib.util.spec_from_file_location("collapse_experiment", SCRIPT)
experiment = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(experiment)

UPDATES = [0, 10, 20, 30, 40]


def fake_run(label: str, staleness: int, seed: int, curve: list[float], se: float = 0.02,
             collapse: int = -1) -> plots.RunRecord:
    """A loaded run with evaluated J at UPDATES (every update has training metrics)."""
    updates = np.arange(41)
    j = pd.Series(curve, index=UPDATES).reindex(updates)
    metrics = pd.DataFrame({
        "update": updates, "eval_reward_sampled": j, "eval_reward_se": j.notna() * se,
        "ratio_max": 1.0 + updates, "ratio_p999": 1.0 + updates / 2, "grad_norm": np.where(updates == 25, 9.0, 0.5),
        "entropy": np.linspace(1.0, 0.2, len(updates)), "eval_kl_init_k3": j * 0.1,
    })
    metrics.loc[metrics["eval_reward_sampled"].isna(), "eval_kl_init_k3"] = np.nan
    schedule = "on_policy" if staleness == 0 else f"stale_k:{staleness}"
    name = f"objective={label}__schedule={schedule.replace(':', '-')}__seed={seed}"
    summary = {"status": "collapsed" if collapse >= 0 else "completed", "collapse_update": collapse}
    return plots.RunRecord(Path("/nowhere") / name, {"objective": "grpo", "schedule": schedule, "seed": seed}, metrics,
                     summary=summary, labels={"objective": label}, label=label)


def test_run_stats_reads_peak_final_and_mechanism() -> None:
    stats = experiment.run_stats(fake_run("grpo_no_tr", 8, 1, [0.2, 0.5, 0.8, 0.4, 0.3], collapse=27))
    assert stats["label"] == "grpo_no_tr" and stats["staleness"] == 8 and stats["seed"] == 1
    assert (stats["J0"], stats["peak"], stats["peak_update"], stats["final"]) == (0.2, 0.8, 20, 0.3)
    assert stats["gain"] == pytest.approx(0.6) and stats["peak_se"] == 0.02 and stats["collapse_update"] == 27
    assert stats["ratio_max"] == 41.0 and stats["ratio_p999"] == 21.0
    assert stats["grad_norm_max"] == 9.0 and stats["grad_norm_median"] == 0.5
    # entropy linear from 1.0 to 0.2 over 41 updates; 10 % edges = 5 updates each
    assert stats["entropy_start"] == pytest.approx(np.linspace(1.0, 0.2, 41)[:5].mean())
    assert stats["entropy_end"] == pytest.approx(np.linspace(1.0, 0.2, 41)[-5:].mean())
    assert stats["kl_init_final"] == pytest.approx(0.03) and stats["kl_init_max"] == pytest.approx(0.08)


def world(no_tr_flags: tuple[int, int, int], m2po_final: float, clipped_final: float = 0.35) -> list[plots.RunRecord]:
    """On-policy grpo ends at 0.65; at staleness 8 no-TR rises to 0.8 by u = 20 (ε-clip is at 0.4 there) and falls
    to 0.3 (J₀ 0.2: gain 0.6, half-gain line 0.5)."""
    runs = []
    for seed in range(3):
        runs += [fake_run("grpo", 0, seed, [0.2, 0.4, 0.5, 0.6, 0.65]),
                 fake_run("grpo", 8, seed, [0.2, 0.3, 0.4, 0.4, clipped_final]),
                 fake_run("grpo_no_tr", 8, seed, [0.2, 0.6, 0.8, 0.5, 0.3], collapse=no_tr_flags[seed]),
                 fake_run("m2po", 8, seed, [0.2, 0.3, 0.5, 0.6, m2po_final])]
    return runs


def verdict(runs: list[plots.RunRecord]) -> dict:
    table = pd.DataFrame([experiment.run_stats(r) for r in runs])
    curves = {(r.label, experiment.staleness_of(r), r.seed): experiment.j_curve(r) for r in runs}
    return experiment.criteria(table, curves)


def test_criteria_hold_when_two_of_three_seeds_collapse() -> None:
    got = verdict(world((25, 30, -1), m2po_final=0.62))
    a1 = got["a1"]
    assert got["s_high"] == 8 and a1["needed"] == 2
    # lead at u* = 20: 0.8 − 0.4 = 0.4 > 2·√(0.02² + 0.02²) = 0.0566 in every seed
    assert [s["lead_over_clipped"] for s in a1["seeds"]] == pytest.approx([0.4] * 3)
    assert a1["seeds"][0]["lead_margin"] == pytest.approx(2 * math.hypot(0.02, 0.02))
    assert (a1["prospered"], a1["collapsed"], a1["holds"]) == (3, 2, True)
    assert got["a2"]["ratio"] == pytest.approx(0.62 / 0.65) and got["a2"]["holds"]  # 0.954 ≥ 0.95
    assert got["a3"]["holds"] and got["a"] is True


def test_criteria_fail_on_one_flag_or_a_far_m2po_or_a_better_clip() -> None:
    one_flag = verdict(world((25, -1, -1), m2po_final=0.62))
    assert one_flag["a1"]["collapsed"] == 1 and not one_flag["a1"]["holds"] and one_flag["a"] is False
    far = verdict(world((25, 30, 35), m2po_final=0.61))  # 0.61 / 0.65 = 0.938 < 0.95
    assert not far["a2"]["holds"] and far["a1"]["holds"] and far["a"] is False
    clip_better = verdict(world((25, 30, 35), m2po_final=0.62, clipped_final=0.63))
    assert not clip_better["a3"]["holds"] and clip_better["a"] is False


def test_no_collapse_without_a_half_gain_fall() -> None:
    """A flagged run that only dips (final 0.55 > 0.5 = peak − ½ gain) has not collapsed."""
    runs = world((25, 30, 35), m2po_final=0.62)
    runs = [fake_run("grpo_no_tr", 8, r.seed, [0.2, 0.6, 0.8, 0.5, 0.55], collapse=25)
            if r.label == "grpo_no_tr" else r for r in runs]
    a1 = verdict(runs)["a1"]
    assert a1["collapsed"] == 0 and not any(s["fell_half_gain"] for s in a1["seeds"])


def test_on_policy_reference_may_carry_its_own_label() -> None:
    """A grid whose base schedule is stale names its on-policy grpo cell ``grpo_on_policy``: (a2) reads it the same."""
    runs = [fake_run("grpo_on_policy", 0, r.seed, [0.2, 0.4, 0.5, 0.6, 0.65]) if r.label == "grpo" and
            experiment.staleness_of(r) == 0 else r for r in world((25, 30, 35), m2po_final=0.61)]
    assert {r.label for r in runs} == {"grpo_on_policy", "grpo", "grpo_no_tr", "m2po"}
    a2 = verdict(runs)["a2"]
    assert a2["on_policy_grpo_final"] == pytest.approx(0.65) and a2["ratio"] == pytest.approx(0.61 / 0.65)


def test_missing_cells_give_no_verdict() -> None:
    runs = [r for r in world((25, 30, 35), m2po_final=0.62) if r.label != "m2po"]
    got = verdict(runs)
    assert got["a2"] is None and got["a3"] is None and got["a"] is None and got["a1"]["holds"]


def test_cell_table_mean_and_sd_over_seeds() -> None:
    runs = [fake_run("grpo", 0, s, [0.2, 0.4, 0.5, 0.6, f]) for s, f in enumerate((0.6, 0.7, 0.8))]
    cells = experiment.cell_table(pd.DataFrame([experiment.run_stats(r) for r in runs]))
    row = cells.iloc[0]
    assert row["final_mean"] == pytest.approx(0.7) and row["final_sd"] == pytest.approx(np.std([.6, .7, .8], ddof=1))
    assert row["peak_mean"] == pytest.approx(0.7) and row["collapsed"] == 0 and row["seeds"] == 3
    text = experiment.results_markdown(cells)
    assert "| grpo | 0 | 3 | 0.200 | 0.700 ± 0.100 | 0.700 ± 0.100 | 0.020 | 0/3 |" in text


@pytest.fixture(scope="module")
def small_experiment(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The CI variant of the synthetic-LM experiment, run once in-process (π₀ cached in a temporary folder)."""
    tmp = tmp_path_factory.mktemp("synthetic_lm")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OFFPOLICYLAB_CACHE", str(tmp / "cache"))
        assert experiment.main([str(SMALL_GRID), "--out", str(tmp / "out"), "--workers", "1"]) == 0
    return tmp


def test_small_grid_end_to_end(small_experiment: Path) -> None:
    """Every cell runs, and the table, per-run CSV and verdict are written with values in range (rewards in [0, 1],
    on-policy ratios ≡ 1, p99.9 ≤ max)."""
    out = small_experiment / "out"
    runs = pd.read_csv(out / "runs.csv")
    axes = json.loads(SMALL_GRID.read_text())["axes"]
    cells = len(axes["objective"]) * len(axes["schedule"]) * len(axes["seed"])
    assert len(runs) == cells and set(runs["status"]) <= {"completed", "collapsed"}
    for column in ("J0", "peak", "final"):
        assert runs[column].between(0.0, 1.0).all(), column
    assert (runs["peak"] >= runs["final"]).all() and (runs["final_se"] >= 0).all()
    assert (runs["ratio_p999"] <= runs["ratio_max"] + 1e-6).all()
    for run in plots.load_runs([out]):  # s = 0 is stages:4: a fresh rollout batch every 4 updates, where r ≡ 1
        if experiment.staleness_of(run) == 0:
            fresh = run.metrics[run.metrics["update"] % 4 == 0]
            assert run.config["schedule"] == "stages:4" and np.allclose(fresh["ratio_max"], 1.0, atol=1e-5)
    assert (runs[runs["staleness"] > 0]["ratio_max"] > 1.0).all()
    table = (out / "table.md").read_text()
    assert table.count("| grpo_no_tr |") == 2 * len(axes["schedule"])  # results and mechanism tables
    verdict = json.loads((out / "criteria.json").read_text())
    assert verdict["s_high"] == 6 and set(verdict) == {"s_high", "a1", "a2", "a3", "a"}
    assert f"sweep: {cells} cells, 0 failed" in (out / "wall_times.txt").read_text()


def test_claim_script_small_reuses_the_experiment(small_experiment: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """paper_figures/claim_synthetic_lm.py --small: claims (b), (d), (g) write their figure and result.json, the
    cells shared with the experiment are copied, not re-run, and the copies' J equals the experiment's."""
    monkeypatch.setenv("OFFPOLICYLAB_CACHE", str(small_experiment / "cache"))
    monkeypatch.syspath_prepend(str(PAPER))
    for name in [m for m in sys.modules if m in ("common", "claim_synthetic_lm")]:
        monkeypatch.delitem(sys.modules, name)
    import claim_synthetic_lm

    out = small_experiment / "figures"
    claim_synthetic_lm.main(["--small", "--out", str(out), "--reuse", str(small_experiment / "out")])
    printed = capsys.readouterr().out
    assert "reused 8 finished cells" in printed and "reused 2 finished cells" in printed
    for claim in ("b", "d", "g"):
        folder = out / f"synthetic_lm_{claim}_small"
        assert (folder / f"claim_{claim}_synthetic_lm.png").stat().st_size > 10_000
        result = json.loads((folder / "result.json").read_text())
        assert result and all(0.0 <= cell["final"] <= 1.0 for cell in result.values())
    runs = pd.read_csv(small_experiment / "out" / "runs.csv").set_index(["label", "staleness", "seed"])
    claimed = pd.read_csv(out / "synthetic_lm_b_small" / "claim_b_runs.csv")
    for _, row in claimed.iterrows():
        staleness = experiment._schedule_staleness(row["staleness"])
        assert row["final"] == runs.loc[(row["label"], staleness, row["seed"]), "final"]


def test_unfinished_runs_are_counted_but_left_out_of_the_aggregates() -> None:
    runs = [fake_run("grpo", 0, s, [0.2, 0.4, 0.5, 0.6, f]) for s, f in enumerate((0.6, 0.8))]
    partial = fake_run("grpo", 0, 2, [0.2, 0.3, 0.3, 0.3, 0.3])
    partial.summary = None  # killed before it finished
    lonely = fake_run("m2po", 8, 0, [0.2, 0.2, 0.2, 0.2, 0.2])
    lonely.summary = None
    cells = experiment.cell_table(pd.DataFrame([experiment.run_stats(r) for r in [*runs, partial, lonely]]))
    grpo, m2po = cells.iloc[0], cells.iloc[1]
    assert (grpo["seeds"], grpo["unfinished"], grpo["final_mean"]) == (2, 1, pytest.approx(0.7))
    assert (m2po["seeds"], m2po["unfinished"]) == (0, 1) and math.isnan(m2po["final_mean"])
    assert "| grpo | 0 | 2 (+1 unfinished) |" in experiment.results_markdown(cells)


def test_cells_the_criteria_read_run_first() -> None:
    grid = json.loads((ROOT / "experiments" / "synthetic_lm_grid.json").read_text())
    cells = experiment.expand_grid(grid, "/nowhere")
    ranks = [experiment.priority(c, 256) for c in cells]
    first = {(c.labels["objective"], c.config["schedule"]) for c, r in zip(cells, ranks, strict=True) if r == 0}
    assert first == {("grpo", "stages:4"), ("grpo", "stale_k:256"), ("grpo_no_tr", "stale_k:256"),
                     ("m2po", "stale_k:256")}
    assert sum(r == 1 for r in ranks) == 9 * 3  # the other nine objectives at s = 256, three seeds
    assert sum(r == 2 for r in ranks) == 0  # no other stale schedule
    assert sum(r == 3 for r in ranks) == 11 * 3  # the other objectives at s = 0


def test_the_small_grid_is_the_full_grid_shrunk() -> None:
    """experiments/synthetic_lm_grid_small.json (what CI runs) is ``--small`` of the full grid: same objectives and
    schedule forms, the tiny world, 12 updates, stale_k:6, seeds 0 and 1."""
    full = json.loads((ROOT / "experiments" / "synthetic_lm_grid.json").read_text())
    small = experiment.small_grid(full)
    assert small == json.loads(SMALL_GRID.read_text())
    assert small["axes"]["objective"] == full["axes"]["objective"]
    assert small["axes"]["schedule"] == ["stages:4", "stale_k:6"] and small["axes"]["seed"] == [0, 1]
    assert small["base"]["updates"] == 12 and small["base"]["world_params"]["vocab_size"] == 32


@pytest.mark.parametrize(("schedule", "nominal"), [("on_policy", 0), ("stages:4", 0), ("sync:4,0", 0),
                                                   ("stale_k:256", 256)])
def test_nominal_staleness_of_a_schedule(schedule: str, nominal: int) -> None:
    assert experiment._schedule_staleness(schedule) == nominal


def test_nominal_staleness_refuses_a_schedule_without_one() -> None:
    with pytest.raises(ValueError, match="no nominal staleness"):
        experiment._schedule_staleness("sync:4,2")


def test_the_committed_grid_results_hold_one_finished_row_per_cell() -> None:
    """experiments/results/synthetic_lm_grid.csv is the full grid of experiments/synthetic_lm_grid.json: the
    columns asked for, one row per (objective label, nominal staleness, seed) cell and nothing else, every value in
    its range (J is a mean reward in [0, 1]; the peak is the largest evaluated J, so ≥ J₀ and ≥ the final J; a
    fraction is blank where the objective does not report it)."""
    grid = json.loads((ROOT / "experiments" / "synthetic_lm_grid.json").read_text())
    rows = pd.read_csv(ROOT / "experiments" / "results" / "synthetic_lm_grid.csv")
    assert list(rows.columns) == ["objective", "staleness", "seed", "J0", "peak_J", "peak_update", "final_J",
                                  "final_se", "collapsed", "clip_frac_mean", "mask_frac_mean"]
    cells = {(o["label"], experiment._schedule_staleness(s), seed) for o in grid["axes"]["objective"]
             for s in grid["axes"]["schedule"] for seed in grid["axes"]["seed"]}
    got = list(zip(rows["objective"], rows["staleness"], rows["seed"], strict=True))
    assert len(got) == len(set(got)) and set(got) == cells
    for column in ("J0", "peak_J", "final_J"):
        assert rows[column].between(0, 1).all(), column
    for column in ("clip_frac_mean", "mask_frac_mean"):  # blank where the objective does not report it (m2po: mask)
        assert rows[column].dropna().between(0, 1).all() and rows[column].notna().any(), column
    assert (rows["peak_J"] >= rows[["J0", "final_J"]].max(axis=1)).all()
    assert rows["peak_update"].between(0, grid["base"]["updates"] - 1).all()
    varied = rows["final_J"].between(0, 1, inclusive="neither")  # a run whose every sample scored alike has SE 0
    assert (rows["final_se"] >= 0).all() and (rows.loc[varied, "final_se"] > 0).all()
    assert rows["collapsed"].isin([True, False]).all()
