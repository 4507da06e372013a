"""Regenerate every paper figure: ``python paper_figures/run_all.py [--small] [--out DIR] [--workers N] [--docs]``.

Runs the claim scripts in order (claim (c) re-uses the runs of claim (b)); outputs land in ``paper_figures/out/``.
``--docs`` then copies each claim's headline figure to ``docs/figures/`` (full settings only; each must stay under
300 KB).  Full settings took 29 min 57 s wall on 2 CPU cores shared with other jobs (see README.md); ``--small``
takes seconds per claim (CI smoke test)."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import claim_a_three_arm_pitfall
import claim_b_prosperity_before_collapse
import claim_c_clip_fraction
import claim_d_m2po_tau
import claim_e_ac_mispo
import claim_f_p3o_vs_grpo_eps
import claim_g_mu_grpo
import claim_h_rec
import common

CLAIMS = {
    "a": claim_a_three_arm_pitfall,
    "b": claim_b_prosperity_before_collapse,
    "c": claim_c_clip_fraction,
    "d": claim_d_m2po_tau,
    "e": claim_e_ac_mispo,
    "f": claim_f_p3o_vs_grpo_eps,
    "g": claim_g_mu_grpo,
    "h": claim_h_rec,
}
#: (claim folder, figure) -> name under docs/figures/ (the images the top-level README embeds)
DOC_FIGURES = {
    ("a_three_arm_pitfall", "claim_a.png"): "claim_a_three_arm_pitfall.png",
    ("b_prosperity_before_collapse", "claim_b.png"): "claim_b_prosperity_before_collapse.png",
    ("c_clip_fraction", "claim_c_entropy.png"): "claim_c_entropy_vs_clipping.png",
    ("d_m2po_tau", "claim_d.png"): "claim_d_m2po_tau.png",
    ("e_ac_mispo", "claim_e_controller.png"): "claim_e_ac_mispo_controller.png",
    ("f_p3o_vs_grpo_eps", "claim_f.png"): "claim_f_p3o_vs_grpo_eps.png",
    ("g_mu_grpo", "claim_g.png"): "claim_g_mu_grpo.png",
    ("h_rec", "claim_h.png"): "claim_h_rec.png",
}
DOCS = common.ROOT.parent / "docs" / "figures"
MAX_DOC_BYTES = 300_000


def copy_doc_figures(out: Path, docs: Path = DOCS) -> list[Path]:
    """Copy the headline figures of a full run under ``out`` to ``docs``; a missing or oversized one raises
    ``ValueError`` naming it."""
    docs.mkdir(parents=True, exist_ok=True)
    copied = []
    for (claim, figure), name in DOC_FIGURES.items():
        source = out / claim / figure
        if not source.is_file():
            raise ValueError(f"{source} is missing; run the full settings (without --small) first")
        if source.stat().st_size >= MAX_DOC_BYTES:
            raise ValueError(f"{source} is {source.stat().st_size} bytes; valid: < {MAX_DOC_BYTES}")
        copied.append(Path(shutil.copyfile(source, docs / name)))
    return copied


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    docs = "--docs" in argv
    argv = [a for a in argv if a != "--docs"]
    args = common.parse_args(__doc__.split("\n")[0], argv)  # validates the shared options once
    if docs and args.small:
        raise ValueError("--docs copies full-setting figures; valid: --docs without --small")
    total = time.perf_counter()
    for name, module in CLAIMS.items():
        start = time.perf_counter()
        print(f"=== claim ({name}): {module.__doc__.splitlines()[0]}")
        module.main(argv)
        print(f"=== claim ({name}) done in {time.perf_counter() - start:.0f} s")
    print(f"=== all claims done in {time.perf_counter() - total:.0f} s")
    if docs:
        for path in copy_doc_figures(Path(args.out)):
            print(f"copied {path}")


if __name__ == "__main__":
    main()
