"""Recipe v6 calibration targets read from runs to the horizon (``experiments/synthetic_lm_v6_calibration.md``):

    python experiments/synthetic_lm_v6_horizon.py ON_POLICY_RUN STALE_RUN [--horizon 2000] [--json OUT]

* (c) from STALE_RUN's ``metrics.csv``: mean ``clip_frac`` over the last quarter of the horizon (updates
  ``[0.75·H, H)``) against updates 257–500.
* (e₂) from ON_POLICY_RUN's evaluation reward (``eval_reward_sampled``): gain = peak − first, u₉₀ = the first
  evaluated update at or above first + 0.9 · gain.
* (f) at the end: response lengths of the checkpointed policy, one temperature-1 sample per training prompt (the
  same function as (f) at the start, :func:`synthetic_lm_v6_calibration.lengths`).
* (d) the per-position share of KL(π‖π₀): responses sampled from π (temperature 1); at every sampled position the
  exact KL over the vocabulary between π(·|prefix) and π₀(·|prefix).  The sequence KL decomposes as
  KL(π‖π₀) = E_{y∼π}[Σ_t 1[t < |y|] KL_t(y_<t)], so position t holds mean over responses of the masked KL_t (a
  response that has ended contributes 0); its share is that over the sum.

A run short of the horizon is read at its last metrics row / checkpoint and labelled partial.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if str(ROOT / "experiments") not in sys.path:
    sys.path.insert(0, str(ROOT / "experiments"))

from synthetic_lm_v6_calibration import lengths  # noqa: E402

from offpolicylab.build import build  # noqa: E402
from offpolicylab.config import TrainConfig  # noqa: E402
from offpolicylab.run_dir import RunDir  # noqa: E402
from offpolicylab.worlds.synthetic_lm_v6 import ANS, EOS, FIRST_TEXT, STEP  # noqa: E402

EVAL_COLUMN = "eval_reward_sampled"
STALE_WINDOW = (257, 500)  # inclusive


# ================================================================================================ metrics.csv
def read_metrics(run_dir: Path) -> pd.DataFrame:
    return pd.read_csv(run_dir / "metrics.csv")


def clip_rise(metrics: pd.DataFrame, horizon: int) -> dict[str, Any]:
    """(c): mean clip_frac over the last quarter of the horizon (or of the updates reached) vs updates 257–500."""
    reached = int(metrics["update"].max()) + 1
    end = min(reached, horizon)
    start = int(math.ceil(0.75 * end))
    clip = metrics.set_index("update")["clip_frac"]
    early = clip.loc[STALE_WINDOW[0]: STALE_WINDOW[1]]
    late = clip.loc[start: end - 1]
    return {"reached": reached, "partial": reached < horizon, "late_window": [start, end - 1],
            "late_mean": float(late.mean()), "late_n": int(late.count()),
            "early_window": list(STALE_WINDOW), "early_mean": float(early.mean()), "early_n": int(early.count()),
            "holds": bool(late.mean() >= early.mean()) if early.count() else None}


def gain_update(metrics: pd.DataFrame, horizon: int, fraction: float = 0.9) -> dict[str, Any]:
    """(e₂): first, peak and u₉₀ of the evaluation reward; the target is 500 ≤ u₉₀ ≤ horizon."""
    rows = metrics[["update", EVAL_COLUMN]].dropna()
    rows = rows.sort_values("update")
    updates, values = rows["update"].to_numpy(), rows[EVAL_COLUMN].to_numpy()
    first, peak = float(values[0]), float(values.max())
    gain = peak - first
    level = first + fraction * gain
    u90 = int(updates[(values >= level).argmax()]) if gain > 0 else None
    reached = int(metrics["update"].max()) + 1
    return {"reached": reached, "partial": reached < horizon, "first": first, "peak": peak,
            "peak_update": int(updates[values.argmax()]), "gain": gain, "level": level, "u90": u90,
            "evaluations": [[int(u), float(v)] for u, v in zip(updates, values, strict=True)],
            "holds": bool(u90 is not None and 500 <= u90 <= horizon)}


# ================================================================================================ checkpoint
def load_run(run_dir: Path) -> tuple[Any, Any, int]:
    """(the run built from its config.json with the checkpoint's policy loaded, π₀, the checkpoint's next update)."""
    directory = RunDir(run_dir)
    run = build(TrainConfig.from_dict(directory.read_config()))
    reference = run.initial if run.initial is not None else run.world.pretrained_policy()
    state = directory.load_checkpoint()  # tensors only (weights_only=True): never unpickles
    run.policy.load_state_dict(state["policy"])
    return run, reference, int(state["next_update"])


def token_kl(policy: Any, reference: Any, rollout: Any) -> torch.Tensor:
    """Exact KL(π(·|y_<t) ‖ π₀(·|y_<t)) over the vocabulary at every position, masked by the response mask: [B, T]."""
    with torch.no_grad():
        args = (rollout.prompt_ids, rollout.prompt_mask, rollout.prompt_index, rollout.response_ids)
        logp = torch.log_softmax(policy.response_logits(*args).double(), dim=-1)
        logq = torch.log_softmax(reference.response_logits(*args).double(), dim=-1)
        kl = (logp.exp() * (logp - logq)).sum(-1)
    return kl * rollout.response_mask.double()


def position_shares(kl: torch.Tensor) -> dict[str, Any]:
    """Per-position contribution to the sequence KL (mean over responses of the masked token KL) and its share."""
    per_position = kl.mean(0)
    total = float(per_position.sum())
    share = per_position / total if total > 0 else torch.zeros_like(per_position)
    top = int(share.argmax())
    return {"sequence_kl": total, "per_position": per_position.tolist(), "share": share.tolist(),
            "max_share": float(share[top]), "max_position": top}


def from_end_shares(kl: torch.Tensor, mask: torch.Tensor, last: int = 6) -> list[float]:
    """Share of the sequence KL at the k-th valid position from each response's end (k = 1 … last): the positions
    of the answer and EOS, which move with the response length."""
    total = float(kl.sum())
    n_valid = mask.sum(1).long()
    out = []
    for k in range(1, last + 1):
        rows = torch.nonzero(n_valid >= k).squeeze(1)
        value = kl[rows, n_valid[rows] - k].sum() if len(rows) else torch.tensor(0.0)
        out.append(float(value) / total if total > 0 else 0.0)
    return out


def role_shares(kl: torch.Tensor, response: torch.Tensor, max_step: int = 8) -> dict[str, float]:
    """Share of the sequence KL by the role of the token sampled at the position (the decision the KL is about):
    the digit of step k (after the k-th ``=``), the answer digit (after ANS), ``=``, ANS, EOS, other text."""
    prev = torch.cat([torch.full_like(response[:, :1], FIRST_TEXT), response[:, :-1]], dim=1)
    step_index = (prev == STEP).long().cumsum(1)  # the k of a digit right after the k-th "="
    total = float(kl.sum())
    roles: dict[str, torch.Tensor] = {}
    for k in range(1, max_step + 1):
        roles[f"step {k} digit"] = (prev == STEP) & (step_index == k)
    roles[f"step > {max_step} digit"] = (prev == STEP) & (step_index > max_step)
    roles["answer digit"] = prev == ANS
    roles["'='"] = (response == STEP) & (prev != STEP) & (prev != ANS)
    roles["ANS"] = (response == ANS) & (prev != STEP) & (prev != ANS)
    roles["EOS"] = (response == EOS) & (prev != STEP) & (prev != ANS)
    taken = torch.zeros_like(response, dtype=torch.bool)
    for where in roles.values():
        taken |= where
    roles["text"] = ~taken
    return {name: float(kl[where].sum()) / total if total > 0 else 0.0 for name, where in roles.items()}


def kl_shares(world: Any, policy: Any, reference: Any, prompts: int = 512, seed: int = 0,
              chunk: int = 128) -> dict[str, Any]:
    """(d): ``prompts`` training prompts (cycled), one temperature-1 response each from π, the per-position shares."""
    index = torch.arange(prompts) % world.num_prompts
    generator = torch.Generator().manual_seed(seed)
    kls, masks, responses = [], [], []
    for start in range(0, prompts, chunk):
        rollout = policy.sample(world._prompts(index[start: start + chunk]), 1, 1.0, generator)
        kls.append(token_kl(policy, reference, rollout))
        masks.append(rollout.response_mask)
        responses.append(rollout.response_ids)
    kl, mask = torch.cat(kls), torch.cat(masks)
    result = position_shares(kl)
    result["from_end"] = from_end_shares(kl, mask)
    result["by_role"] = role_shares(kl, torch.cat(responses))
    result["responses"] = prompts
    return result


# ================================================================================================ main
def measure(on_policy: Path, stale: Path | None, horizon: int, prompts: int = 512) -> dict[str, Any]:
    out: dict[str, Any] = {"horizon": horizon}
    if stale is not None:
        out["c"] = clip_rise(read_metrics(stale), horizon)
    out["e2"] = gain_update(read_metrics(on_policy), horizon)
    run, reference, next_update = load_run(on_policy)
    out["checkpoint_update"] = next_update
    out["checkpoint_partial"] = next_update < horizon
    torch.manual_seed(0)
    out["f_end"] = lengths(run.world, run.policy)
    out["f_start"] = lengths(run.world, reference)
    out["d"] = kl_shares(run.world, run.policy, reference, prompts)
    return out


def report(out: dict[str, Any]) -> str:
    h = out["horizon"]
    lines = []
    if "c" in out:
        c = out["c"]
        lines.append(f"(c) stale: reached {c['reached']}/{h}{' PARTIAL' if c['partial'] else ''}; clip_frac "
                     f"{c['late_window']} {c['late_mean']:.3%} (n={c['late_n']}) vs {c['early_window']} "
                     f"{c['early_mean']:.3%} (n={c['early_n']}): holds={c['holds']}")
    e = out["e2"]
    lines.append(f"(e2) on-policy: reached {e['reached']}/{h}{' PARTIAL' if e['partial'] else ''}; first "
                 f"{e['first']:.4f}, peak {e['peak']:.4f} at {e['peak_update']}, gain {e['gain']:.4f}, u90 {e['u90']} "
                 f"(level {e['level']:.4f}): in [500, {h}]={e['holds']}")
    lines.append("    evaluations: " + ", ".join(f"{u}:{v:.3f}" for u, v in e["evaluations"]))
    d = out["d"]
    part = " PARTIAL" if out["checkpoint_partial"] else ""
    lines.append(f"(d) checkpoint at update {out['checkpoint_update']}{part}: KL(π‖π₀) per response "
                 f"{d['sequence_kl']:.4f} nat; max share {d['max_share']:.1%} at position {d['max_position']} "
                 f"(≤ 25 %: {d['max_share'] <= 0.25})")
    top = sorted(enumerate(d["share"]), key=lambda x: -x[1])[:5]
    lines.append("    top positions: " + ", ".join(f"{t}:{s:.1%}" for t, s in top))
    lines.append("    from the end (1 = last valid token, EOS when ended): "
                 + ", ".join(f"{k + 1}:{s:.1%}" for k, s in enumerate(d["from_end"])))
    lines.append("    by the role of the sampled token: "
                 + ", ".join(f"{k}:{v:.1%}" for k, v in d["by_role"].items() if v >= 0.001))
    for name in ("f_start", "f_end"):
        f = out[name]
        lines.append(f"({name}) length mean {f['mean']:.1f}, p90 {f['p90']:.0f}, truncated {f['truncated']:.1%}, "
                     f"steps {f['steps']:.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("on_policy", type=Path)
    parser.add_argument("stale", type=Path, nargs="?")
    parser.add_argument("--horizon", type=int, default=2000)
    parser.add_argument("--prompts", type=int, default=512)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    out = measure(args.on_policy, args.stale, args.horizon, args.prompts)
    print(report(out), flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
