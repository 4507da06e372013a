"""The paper-figure scripts run end to end in their --small mode and write their PNG, CSV and result.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

PAPER = Path(__file__).resolve().parents[2] / "paper_figures"


@pytest.mark.slow
def test_run_all_small(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(PAPER))
    for name in [m for m in sys.modules if m.startswith("claim_") or m in ("common", "run_all")]:
        monkeypatch.delitem(sys.modules, name)
    import run_all

    run_all.main(["--small", "--out", str(tmp_path)])
    for claim, figure in [("a_three_arm_pitfall", "claim_a.png"), ("b_prosperity_before_collapse", "claim_b.png"),
                          ("c_clip_fraction", "claim_c.png"), ("e_ac_mispo", "claim_e_controller.png")]:
        folder = tmp_path / f"{claim}_small"
        assert (folder / figure).stat().st_size > 5_000
        result = json.loads((folder / "result.json").read_text())
        assert result, claim
    pitfall = json.loads((tmp_path / "a_three_arm_pitfall_small" / "result.json").read_text())
    assert set(pitfall) == {"reinforce", "grpo_eps0.2", "grpo_eps_inf"}
    assert all(0.0 <= value <= 1.0 for value in pitfall.values())  # exact returns of r ∈ [0, 1]
