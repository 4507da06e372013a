"""``metrics_every``: the objective's metrics every N updates (and at the last), the run otherwise unchanged."""

from __future__ import annotations

from pathlib import Path

from offpolicylab import trainer
from offpolicylab.diagnostics.collapse import CollapseDetector
from offpolicylab.diagnostics.stats import RATIO_METRICS
from tests.small_runs import mdp_config, read_rows

OBJECTIVE_METRICS = {*RATIO_METRICS, "mask_frac", "entropy", "clip_frac"}


def test_metrics_every_skips_only_the_objective_metrics(tmp_path: Path) -> None:
    """Same seed, metrics every update vs every 3rd: identical losses, gradient norms, rewards and evaluations
    (the metrics switch changes neither loss nor gradient, so the trajectories are the same), metric columns
    filled at updates 0, 3, 6 and the last (7), blank elsewhere."""
    trainer.train(mdp_config(schedule="stale_k:2"), tmp_path / "every")
    trainer.train(mdp_config(schedule="stale_k:2", metrics_every=3), tmp_path / "third")
    every, third = read_rows(tmp_path / "every"), read_rows(tmp_path / "third")
    assert list(every[0]) == list(third[0]) and OBJECTIVE_METRICS <= set(every[0])
    for update, (full, sparse) in enumerate(zip(every, third, strict=True)):
        due = update % 3 == 0 or update == len(every) - 1
        for key, value in full.items():
            if key.startswith("time_"):
                continue
            if key in OBJECTIVE_METRICS and not due:
                assert sparse[key] == "", (update, key)
            else:
                assert sparse[key] == value, (update, key)


def test_an_absent_kl_is_held_and_never_spikes() -> None:
    """kl None (metrics skipped): the KL mean is unchanged and no spike is recorded, even with spike < 1."""
    detector = CollapseDetector(spike=0.5, warmup=1, alpha=1.0)
    detector.observe(0, 0.5, 0.2, 0.0)
    detector.observe(1, 0.5, None, 0.0)
    assert detector.kl_mean == 0.2 and detector.last_spike < 0
    detector.observe(2, 0.5, 0.3, 0.0)
    assert detector.last_spike == 2  # 0.3 > 0.5 · 0.2: a measured KL still spikes
