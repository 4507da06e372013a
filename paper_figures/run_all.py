"""Regenerate every paper figure: ``python paper_figures/run_all.py [--small] [--out DIR] [--workers N]``.

Runs the claim scripts in order (claim (c) re-uses the runs of claim (b)); outputs land in ``paper_figures/out/``.
Full settings take about 15–25 minutes of CPU on 2 cores; ``--small`` takes seconds per claim (CI smoke test)."""

from __future__ import annotations

import sys
import time

import claim_a_three_arm_pitfall
import claim_b_prosperity_before_collapse
import claim_c_clip_fraction
import claim_e_ac_mispo

CLAIMS = {
    "a": claim_a_three_arm_pitfall,
    "b": claim_b_prosperity_before_collapse,
    "c": claim_c_clip_fraction,
    "e": claim_e_ac_mispo,
}


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    for name, module in CLAIMS.items():
        start = time.perf_counter()
        print(f"=== claim ({name}): {module.__doc__.splitlines()[0]}")
        module.main(argv)
        print(f"=== claim ({name}) done in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
