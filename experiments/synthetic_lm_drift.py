"""The synthetic-LM world's drift calibration: ε = 0.2 GRPO's clip fraction at the papers' s = 0 (``stages:4``) and
s = 256 (``stale_k:256``) for each learning rate, beside the M2PO paper's numbers, and the learning rate the rule
fixed before any stale run chooses (:mod:`offpolicylab.synthetic_lm_calibration`: ``drift_grid``,
``clip_fractions``, ``choose_lr``).

    python experiments/synthetic_lm_drift.py --lrs 3e-5,6e-5,1.2e-4,2.5e-4,5e-4,1e-3 --out runs/drift --workers 12
    python experiments/synthetic_lm_drift.py --lrs 1.5e-5 --out runs/drift_extension       # the rule's extension
    python experiments/synthetic_lm_drift.py --table runs/drift runs/drift_extension       # one table of both

Only the runs' clip fractions are read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python experiments/synthetic_lm_drift.py` from a checkout
    sys.path.insert(0, str(ROOT))

from offpolicylab.config import parse_assignments  # noqa: E402
from offpolicylab.sweep import run_sweep  # noqa: E402
from offpolicylab.synthetic_lm_calibration import choose_lr, clip_fractions, drift_grid, drift_table  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lrs", default="", help="comma-separated learning rates to run")
    parser.add_argument("--updates", type=int, default=300, help="updates per run (default 300)")
    parser.add_argument("--out", type=Path, default=Path("runs/drift"), help="sweep folder (default runs/drift)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--world-param", action="append", default=[], metavar="K=V")
    parser.add_argument("--table", nargs="*", type=Path, default=None,
                        help="only print the table (and the chosen rate) of these finished sweep folders")
    args = parser.parse_args(argv)
    folders = args.table
    if folders is None:
        lrs = [float(x) for x in args.lrs.split(",") if x]
        if not lrs:
            parser.error("--lrs needs at least one learning rate (or use --table FOLDER ...)")
        grid = drift_grid(lrs, args.updates, parse_assignments(args.world_param, "--world-param"))
        run_sweep(grid, args.out, workers=args.workers)
        folders = [args.out]
    rows = sorted((row for folder in folders for row in clip_fractions(folder)), key=lambda row: row["lr"])
    print(drift_table(rows, args.updates))
    lr, why = choose_lr(rows)
    print(f"chosen lr: {lr:g} ({why})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
