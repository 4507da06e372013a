"""experiments/precision_screen.py: its statistics on hand-made values, the sign step, and the whole screen on a tiny
random Llama saved locally (seconds; no download)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.tiny_llm import build_tokenizer, save_model_and_data

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("precision_screen", ROOT / "experiments" / "precision_screen.py")
screen = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(screen)


def test_summary_by_hand() -> None:
    delta = np.array([0.0, 0.1, 0.2, 0.3])
    old = np.log(np.array([0.5, 0.05, 0.0005, 0.95]))
    out = screen.summary(delta, old)
    assert out["tokens"] == 4 and out["max"] == pytest.approx(0.3)
    assert out["beyond_clip"] == 0.5 and out["beyond_half"] == 0.75  # 0.2, 0.3 > 0.18; 0.1, 0.2, 0.3 > 0.09
    bins = out["by_pi_old"]
    assert bins["[0, 0.001)"]["tokens"] == 1 and bins["[0, 0.001)"]["beyond_clip"] == 1.0  # π 0.0005, Δ 0.2
    assert bins["[0.01, 0.1)"]["beyond_clip"] == 0.0 and bins["[0.01, 0.1)"]["beyond_half"] == 1.0  # π 0.05, Δ 0.1
    assert bins["[0.9, 1)"]["beyond_clip"] == 1.0 and bins["[0.5, 0.9)"]["beyond_clip"] == 0.0
    assert bins["[0.001, 0.01)"] == {"tokens": 0, "share": 0.0}
    assert math.isclose(sum(b["share"] for b in bins.values()), 1.0)


def test_sign_step_moves_every_weight_by_lr() -> None:
    net = torch.nn.Linear(4, 3)
    moved = screen.stepped(net, 1e-3, seed=0)
    for before, after in zip(net.parameters(), moved.parameters(), strict=True):
        np.testing.assert_allclose((after - before).abs().detach().numpy(), 1e-3, rtol=1e-3)


def test_the_screen_on_a_tiny_llama(tmp_path: Path) -> None:
    rows = [{"question": f"What is {a} plus {b}?", "answer": f"#### {a + b}"} for a, b in [(1, 2), (3, 4), (5, 6)]]
    paths = save_model_and_data(tmp_path, build_tokenizer(), rows, ["train", "test"])
    out_path = tmp_path / "screen.json"
    assert screen.main(["--model", str(paths["model"]), "--data", str(paths["data"]), "--prompts", "2", "--group",
                        "2", "--max-new", "6", "--lr", "1e-3", "--json", str(out_path)]) == 0
    out = json.loads(out_path.read_text())
    assert out["responses"] == 4 and 4 <= out["tokens"] <= 24
    assert out["batching:float32"]["max"] < 1e-4  # one float32 computation, two batchings
    assert out["rounding:bfloat16"]["max"] > 0 and out["step:float32 drift"]["max"] > 0
    for key in ("batching:bfloat16", "rounding:float16", "step:bfloat16", "step:float16"):
        assert 0 <= out[key]["beyond_clip"] <= out[key]["beyond_half"] <= 1
