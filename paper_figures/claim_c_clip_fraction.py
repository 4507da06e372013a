"""Claim (c), M2PO: the clipped-token fraction of ε-clipped GRPO is far larger at staleness 256 than at 0; M2PO masks
no more tokens than GRPO clips at staleness 0; token entropy rises with |r − 1| (high-entropy tokens are the ones
clipping removes).

Toy analogue: the runs of claim (b) (same grid, re-used when present).  Measured: mean ``clip_frac`` of GRPO ε = 0.2
per schedule, mean ``mask_frac`` of M2PO, mean entropy of kept vs clipped tokens and mean entropy per |r − 1| bin
from the token samples, with Spearman's ρ between bin and entropy.

    python paper_figures/claim_c_clip_fraction.py [--small]
"""

from __future__ import annotations

import claim_b_prosperity_before_collapse as claim_b
import common
from scipy import stats

from offpolicylab import plots


def main(argv: list[str] | None = None) -> None:
    args = common.parse_args(__doc__.split("\n")[0], argv)
    runs, _ = claim_b.runs_for(args)
    out = common.claim_dir(args, "c_clip_fraction")
    frame = plots.metrics_frame(runs, ["clip_frac", "mask_frac"])
    means = frame.groupby(["label", "staleness"], as_index=False)[["clip_frac", "mask_frac"]].mean()
    result: dict = {f"{r['label']} @ {r['staleness']}": {"clip_frac": round(float(r["clip_frac"]), 4),
                                                         "mask_frac": round(float(r["mask_frac"]), 4)}
                    for _, r in means.iterrows()}
    grpo = [r for r in runs if r.label == "grpo_eps0.2"]
    samples = plots.sample_frame(grpo)
    by_bin = plots.entropy_by_ratio_bin(samples.assign(label="grpo_eps0.2"))
    rho = stats.spearmanr(by_bin["bin"], by_bin["entropy"])
    result["entropy_by_ratio_bin_spearman"] = {"rho": float(rho[0]), "p": float(rho[1])}
    kept = samples.groupby(samples["kept"] > 0.5)["entropy"].mean()
    result["grpo_entropy_kept_vs_clipped"] = {"kept": float(kept.get(True, float("nan"))),
                                              "clipped": float(kept.get(False, float("nan")))}
    by_bin.to_csv(out / "claim_c_entropy_by_bin.csv", index=False)
    common.save_figure(plots.clip_fraction(runs), out / "claim_c.png")
    common.save_figure(plots.entropy_vs_clipping(grpo), out / "claim_c_entropy.png")
    common.save_figure(plots.ratio_histograms(grpo), out / "claim_c_ratio_hist.png")
    common.write_result(out, result, means)


if __name__ == "__main__":
    main()
