"""Fixed-seed runs whose metrics.csv is recorded in ``tests/trainer/golden/`` (wall-clock ``time_*`` columns
dropped): the code under test must reproduce them within ``RTOL`` / ``ATOL`` (``|got - want| <= ATOL + RTOL·|want|``
per cell, the same header and the same empty cells).

Why tolerances and not bits: another x86-64 CPU (AVX-512 instead of AVX2) or another kernel set rounds the last
float digit differently.  Measured on the five runs: float noise from torch's default kernels instead of AVX2
(``ATEN_CPU_CAPABILITY=default``) or from another thread count uses at most 1.7 % of the tolerance, while a learning
rate changed by 0.1 % exceeds it 15 to 20 times (``tests/trainer/test_golden.py`` checks both).

What they are: **regression snapshots** of this package's own output — they catch a change, not an error that was
there when they were recorded (they were regenerated from the package's code whenever a change was meant to move
them, e.g. GRPO's Bessel-corrected std).  Two of them are also checked against independent references, every update
of the run (its rollouts fixed) re-derived from the papers in ``tests/trainer/test_golden_reference.py``:
``tabular_token_mdp_grpo`` in NumPy (GRPO's advantage, PPO's clipped loss and its gradient by hand, global-norm
clipping, Adam) and ``sequence_model_token_mdp_m2po_stale`` in plain torch (the GRU policy's forward pass, M2PO,
clipping, Adam).  The others (``bandit_rec_sync``, ``tabular_ac_mispo_mixture``, ``tabular_mu_grpo_stages``) are
snapshots only: no reference re-derives those objectives' whole updates (their per-token losses and gradients are
checked against NumPy in ``tests/objectives/``), and no golden covers the transformer policy.  The transformer
policy's whole update is re-derived instead on a tiny stale GRPO run (1 layer, d_model 8, 2 heads; its own rollouts
fixed) in ``tests/trainer/test_golden_reference_transformer.py``: a plain-torch pre-LN forward written from the papers,
GRPO's advantage, PPO's clipped token-mean loss, global-norm clipping and Adam, against the run's loss, gradient norm,
weights and log-probs after every update; the ``hf`` policy's likewise in
``tests/trainer/test_golden_reference_hf.py`` (a LoRA adapter on a tiny random Llama: RMSNorm, rotary positions,
grouped-query attention, SwiGLU and LoRA written in plain torch from the papers, the base weights read from the saved
``safetensors`` file).

Regenerate them only for a change meant to move them, and say so in the commit::

    PYTHONPATH=CHECKOUT python tests/trainer/golden_runs.py --out tests/trainer/golden

The script imports only ``offpolicylab.config.TrainConfig`` and ``offpolicylab.trainer.train``, so it runs on
any checkout.
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
import tempfile
from pathlib import Path
from typing import Any

GOLDEN_DIR = Path(__file__).parent / "golden"
RTOL = 1e-4
ATOL = 1e-6

_SMALL_MDP = {"vocab_size": 3, "length": 4, "num_prompts": 3}
GOLDEN_RUNS: dict[str, dict[str, Any]] = {
    "tabular_token_mdp_grpo": dict(
        world="token_mdp", world_params=_SMALL_MDP, policy="tabular", objective="grpo",
        updates=12, prompts_per_update=3, group_size=4, eval_every=4, sample_every=0, checkpoint_every=100, seed=3),
    "sequence_model_token_mdp_m2po_stale": dict(
        world="token_mdp", world_params={**_SMALL_MDP, "family": "forking"}, policy="sequence_model",
        policy_params={"hidden_size": 16, "embed_dim": 8}, objective="m2po", objective_params={"tau": 0.04},
        schedule="stale_k:3", updates=10, prompts_per_update=3, group_size=4, eval_every=3, sample_every=0,
        checkpoint_every=100, lr=0.01, seed=1),
    "bandit_rec_sync": dict(
        world="three_arm_pitfall", objective="rec", schedule="sync:3,1", updates=12, prompts_per_update=4,
        group_size=4, optimizer="sgd", lr=0.5, eval_every=4, sample_every=0, checkpoint_every=100, seed=2),
    "tabular_ac_mispo_mixture": dict(
        world="token_mdp", world_params={**_SMALL_MDP, "family": "arithmetic", "eos": True}, objective="ac_mispo",
        schedule="mixture:0.5", updates=10, prompts_per_update=2, group_size=4, advantage="std",
        policy_params={"sampler_noise_std": 0.1}, eval_every=5, sample_every=0, checkpoint_every=100, seed=4),
    "tabular_mu_grpo_stages": dict(
        world="token_mdp", world_params=_SMALL_MDP, objective="mu_grpo", schedule="stages:3", updates=9,
        prompts_per_update=2, group_size=4, eval_every=3, sample_every=0, checkpoint_every=100, seed=5),
}


def normalized_metrics(run_dir: str | Path) -> str:
    """metrics.csv of ``run_dir`` without its wall-clock ``time_*`` columns, as CSV text."""
    with open(Path(run_dir) / "metrics.csv", newline="") as fh:
        rows = list(csv.reader(fh))
    keep = [i for i, name in enumerate(rows[0]) if not name.startswith("time_")]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for row in rows:
        writer.writerow([row[i] for i in keep])
    return out.getvalue()


def metric_mismatches(got: str, want: str, rtol: float = RTOL, atol: float = ATOL) -> list[str]:
    """Cells of CSV text ``got`` outside ``|got - want| <= atol + rtol·|want|`` of ``want`` (one line each).

    Headers, row counts and empty cells must match exactly; every other cell is compared as a float.
    """
    got_rows = list(csv.reader(io.StringIO(got)))
    want_rows = list(csv.reader(io.StringIO(want)))
    if not want_rows or got_rows[:1] != want_rows[:1]:
        return [f"header {got_rows[:1]} != {want_rows[:1]}"]
    if len(got_rows) != len(want_rows):
        return [f"{len(got_rows) - 1} rows, expected {len(want_rows) - 1}"]
    header = want_rows[0]
    bad = []
    for line, (got_row, want_row) in enumerate(zip(got_rows[1:], want_rows[1:], strict=True), start=2):
        if len(got_row) != len(want_row):
            bad.append(f"line {line}: {len(got_row)} cells, expected {len(want_row)}")
            continue
        for column, x, y in zip(header, got_row, want_row, strict=True):
            if x == y:
                continue
            if x == "" or y == "" or abs(float(x) - float(y)) > atol + rtol * abs(float(y)):
                bad.append(f"line {line} {column}: {x!r} != {y!r}")
    return bad


def run_golden(name: str, workdir: str | Path) -> str:
    """Train golden run ``name`` into ``workdir/name``; its normalized metrics."""
    from offpolicylab.config import TrainConfig
    from offpolicylab.trainer import train

    out = Path(workdir) / name
    train(TrainConfig(**GOLDEN_RUNS[name]), out)
    return normalized_metrics(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(GOLDEN_DIR), help="folder for the <name>.csv files")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in GOLDEN_RUNS:
            (out / f"{name}.csv").write_text(run_golden(name, tmp))
            print(f"wrote {out / f'{name}.csv'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
