"""The tail of the per-token log-ratio log π_θ(y | c) − log π_old(y | c) after k updates, binned by π_old(y | c):
why ε = 0.2 GRPO clips almost nothing at the M2PO paper's s = 0 (``stages:4``: 4 optimizer updates per rollout
batch, so a minibatch is 0–3 updates stale) in the synthetic-LM world.

ε-clipping (PPO; Schulman et al. 2017, arXiv:1707.06347) removes a token when r = π_θ / π_old leaves [1 − ε, 1 + ε]
on the side its advantage pushes, i.e. |log r| > log 1.2 = 0.182 (or > −log 0.8 = 0.223).  The M2PO paper (Zheng,
Zhao, Chen 2025, arXiv:2510.01161, Fig. 6d) reports 0.05–0.07 % of the tokens clipped at s = 0.

Runs ε = 0.2 GRPO at ``stages:4`` with the trainer itself, observed at every update by a hook (:class:`LagTails`),
and measures, besides the run's own ``clip_frac``:

- **in-run**: the log-ratio of every consumed minibatch's tokens against its behaviour policy, by staleness 0–3;
- **probes**: every ``--probe-every`` updates (a rollout boundary), ``--probe-size`` fresh responses of the current
  policy π_old (one per training prompt drawn, its own random generator, never trained on — as a minibatch is
  before it is consumed), scored again after k = 1, 2, 3 updates and at the ``--long-lags`` (up to 256: the
  s = 256 drift of on-policy training);
- the size of each Adam step relative to the learning rate (median and 99th percentile of |Δθ| / lr);
- per probe, the lag-1–3 tails (the first rollout batch, where Adam's steps are ±lr, against later ones);
- by shared key: at lags 1–3, the probe tokens of prompts whose key (the world's ``prompt_keys``) was in a minibatch
  trained since the probe was drawn, against the others — whether the tail sits where the update's own "features"
  recur; and the consumed minibatch's own tokens rescored right after the update that trained on them (``self``);
- at lag 3, the log-ratio with only one parameter group's change applied (the unembedding ``head``, the token and
  position ``embed``-dings, the transformer ``body``), the rest at π_old's values: which parameters carry the tail.

Quantiles are of |log r| over response tokens; bins are π_old(y | c) of the sampled token (temperature 1).

Any world runs (``--world``; a model path picks the ``hf`` policy): there the parameter groups are skipped (they are
the student's), and the stale minibatches' responses report where their tokens outside [0.8, 1.2] sit — in how few
responses, in truncated ones — beside a chance placement (:func:`concentration`).  ``--measure-from`` reads only the
late updates; ``--probe-size 0 --no-rescore`` skips the forwards a real model cannot spare.

    OMP_NUM_THREADS=1 python experiments/synthetic_lm_lag_tails.py --world-param preset=seed_scale --lr 3e-5 \
        --out runs/lag_tails_v5.json
    OMP_NUM_THREADS=1 python experiments/synthetic_lm_lag_tails.py --world-param preset=seed_scale_v6 --lr 1.5e-5 \\
        --out runs/lag_tails_v6.json
    python experiments/synthetic_lm_lag_tails.py --table runs/lag_tails_v5.json runs/lag_tails_v6.json
    python experiments/synthetic_lm_lag_tails.py --adam-floor      # Adam's lag-256 / lag-2 drift, any gradient
    OMP_NUM_THREADS=2 python experiments/synthetic_lm_lag_tails.py --world gsm8k \\
        --world-param model=models/smollm2-135m-instruct --world-param data=../shared/data/gsm8k \\
        --world-param max_response_len=128 --prompts-per-update 2 --group-size 4 --lr 2e-4 --updates 32 \\
        --probe-size 0 --no-rescore --out runs/lag_tails_smollm2_lora.json  # SmolLM2 (docs/llm.md), LoRA
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python experiments/synthetic_lm_lag_tails.py` from a checkout
    sys.path.insert(0, str(ROOT))

from offpolicylab.behavior import sample_rollout  # noqa: E402
from offpolicylab.build import build  # noqa: E402
from offpolicylab.config import TrainConfig, parse_assignments  # noqa: E402
from offpolicylab.contracts import Rollout  # noqa: E402
from offpolicylab.trainer import UpdateHook, train  # noqa: E402

GROUPS = ("head", "embed", "body")


def group_of(name: str) -> str:
    """The parameter group of a parameter name of the synthetic-LM student."""
    if name.startswith("head."):
        return "head"
    if name.startswith("blocks.") or name.startswith("norm."):
        return "body"
    return "embed"


BINS = (0.0, 1e-3, 1e-2, 1e-1, 0.5, 0.9, 1.0 + 1e-9)
BIN_NAMES = ("<1e-3", "1e-3–1e-2", "1e-2–0.1", "0.1–0.5", "0.5–0.9", "≥0.9")
CLIP_HIGH, CLIP_LOW = math.log(1.2), -math.log(0.8)  # 0.182, 0.223


def beyond_clip(log_ratio: np.ndarray | Tensor) -> np.ndarray | Tensor:
    """Whether r = exp(log r) lies outside [0.8, 1.2] (NumPy or torch, elementwise)."""
    return (log_ratio > CLIP_HIGH) | (log_ratio < -CLIP_LOW)


def tail_stats(log_ratio: np.ndarray, p_old: np.ndarray) -> dict:
    """Share of tokens outside [0.8, 1.2] and quantiles of |log r|, overall and per π_old bin."""
    def stats(x: np.ndarray) -> dict:
        if x.size == 0:
            return {"n": 0}
        a = np.abs(x)
        out = {"n": int(x.size), "outside": float(beyond_clip(x).mean())}
        for q in (0.5, 0.99, 0.999, 0.9999):
            out[f"p{q * 100:g}"] = float(np.quantile(a, q))
        out["max"] = float(a.max())
        return out

    result = {"all": stats(log_ratio), "bins": {}}
    if log_ratio.size == 0:
        return result
    for name, lo, hi in zip(BIN_NAMES, BINS[:-1], BINS[1:], strict=True):
        inside = (p_old >= lo) & (p_old < hi)
        result["bins"][name] = {"share": float(inside.mean()), **stats(log_ratio[inside])}
    return result


def measure(args: argparse.Namespace) -> dict:
    world_params = parse_assignments(args.world_param, "--world-param")
    policy = args.policy or ("hf" if "model" in world_params else None)  # as `offpolicylab run --model` does
    config = TrainConfig(world=args.world, world_params=world_params, policy=policy,
                         policy_params=parse_assignments(args.policy_param, "--policy-param"), objective="grpo",
                         objective_params={"eps_low": 0.2, "eps_high": 0.2}, schedule="stages:4",
                         updates=args.updates, lr=args.lr, seed=args.seed, eval_every=args.updates, sample_every=0,
                         checkpoint_every=args.updates, prompts_per_update=args.prompts_per_update,
                         group_size=args.group_size)
    tails = LagTails(args)
    with tempfile.TemporaryDirectory() as folder:  # the loop's own run, observed (its run directory is temporary)
        train(config, Path(folder) / "run", hooks=[tails])
    return tails.result(world_params)


class LagTails(UpdateHook):
    """Observes the training run (:class:`~offpolicylab.trainer.UpdateHook`): before each update's step the probes
    and the parameters, after it the in-run log-ratios, the probes' lags, Adam's step sizes and the parameter groups."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.world: Any = None  # the run's world, its prompt keys and its policy's end tokens: read at the first batch
        self.keys: Tensor | None = None
        self.eos: Tensor | None = None
        self.responses: list[np.ndarray] = []  # per stale response (staleness 1–3): tokens, Σ|log r|, outside, cut
        self.probe_gen = torch.Generator().manual_seed(10_000 + args.seed)
        self.lags = sorted({1, 2, 3, *args.long_lags})
        self.in_run: dict[int, list] = {k: [] for k in range(4)}
        self.probe_lr: dict[int, list] = {k: [] for k in self.lags}
        self.probe_p: dict[int, list] = {k: [] for k in self.lags}
        self.probes: list[tuple] = []  # (birth, rollout, logp_old, mask, parameters at birth)
        self.per_birth: list[dict] = []
        self.groups: dict[str, list] = {g: [] for g in GROUPS}
        self.full3: list = []
        self.trained_keys: list[set[int]] = []
        self.by_key: dict[str, dict[int, list]] = {"shared": {1: [], 2: [], 3: []}, "other": {1: [], 2: [], 3: []}}
        self.own: list = []
        self.clip, self.steps, self.lengths, self.ids = [], [], [], []
        self.start = self.shown = 0.0  # the loop's clock, from its first update

    def on_batch(self, update: int, stack: Any, rollouts: list[Rollout]) -> None:
        args, policy = self.args, stack.policy
        (self.rollout,) = rollouts  # the batch the update consumes
        if self.world is None:
            self.world, self.eos = stack.members[0].world, end_tokens(policy)
            self.keys = getattr(self.world, "prompt_keys", None)
            self.start = self.shown = time.perf_counter()
        if update >= args.measure_from and args.probe_size and update % args.probe_every == 0:
            with torch.no_grad():
                prompts = self.world.sample_prompts(args.probe_size, self.probe_gen)
                probe = sample_rollout(policy, prompts, 1, 1.0, self.probe_gen, stack.config.behavior_logp)
                logp_old, _ = policy.score(probe)
            self.probes.append((update, probe, logp_old, probe.response_mask.bool(),
                                [p.detach().clone() for _, p in named_parameters(policy)]))
            self.per_birth.append({"birth": update})
            self.lengths.append(float(probe.response_mask.sum(-1).float().mean()))
        self.before = [p.detach().clone() for p in policy.trainable_parameters()]

    def on_update(self, update: int, stack: Any, steps: list[Any], rows: list[dict[str, Any]]) -> None:
        args, policy, rollout, keys = self.args, stack.policy, self.rollout, self.keys
        (step,) = steps
        logp, output = step.batch.logp, step.output
        measured = update >= args.measure_from
        with torch.no_grad():
            if keys is not None:
                self.trained_keys.append({int(k) for k in keys[rollout.prompt_index].tolist()})
            if measured and args.rescore:
                after, _ = policy.score(rollout)
                self.own.append((after - logp.detach())[rollout.response_mask.bool()].numpy())
            params = policy.trainable_parameters()
            delta = torch.cat([(p.detach() - b).abs().flatten() for p, b in zip(params, self.before, strict=True)])
            ratio = (delta / args.lr).numpy()
            self.steps.append((update, float(np.median(ratio)), float(np.quantile(ratio, 0.99)), float(ratio.max()),
                               float(np.quantile(ratio, 0.999))))
            self.clip.append(float(output.metrics["clip_frac"]))
            if measured:
                mask = rollout.response_mask.bool()
                self.ids.append(torch.unique(rollout.response_ids[mask]).numel())
                staleness = int((update - rollout.version[0]).item())
                log_ratio = logp.detach() - rollout.behavior_logp
                self.in_run[staleness].append(np.stack([log_ratio[mask].numpy(),
                                                        rollout.behavior_logp[mask].exp().numpy()]))
                if staleness:
                    self.responses.append(per_response(log_ratio, rollout, self.eos))
            for probe in self.probes:  # after `update`: birth's policy + lag
                self.score_probe(update, policy, *probe)
            self.probes = [p for p in self.probes if update + 1 - p[0] < self.lags[-1]]
        if update % 50 == 0 or time.perf_counter() - self.shown > 60:  # a real model's updates take minutes
            self.shown = time.perf_counter()
            print(f"update {update}  {self.shown - self.start:.0f} s", file=sys.stderr, flush=True)

    def score_probe(self, update: int, policy: Any, birth: int, probe: Rollout, logp_old: Tensor, pmask: Tensor,
                    old_params: list[Tensor]) -> None:
        """The probe born at ``birth`` scored by the policy after ``update`` when its lag is one measured."""
        lag, keys = update + 1 - birth, self.keys
        if lag not in self.probe_lr:
            return
        new, _ = policy.score(probe)
        x = (new - logp_old)[pmask].numpy()
        self.probe_lr[lag].append(x)
        self.probe_p[lag].append(logp_old[pmask].exp().numpy())
        if lag <= 3 and keys is not None:
            recent = set().union(*self.trained_keys[birth:update + 1])
            hit = torch.tensor([int(k) in recent for k in keys[probe.prompt_index].tolist()])
            shared = (hit[:, None] & pmask)[pmask].numpy()
            self.by_key["shared"][lag].append(x[shared])
            self.by_key["other"][lag].append(x[~shared])
        if lag <= 3:
            row = next(r for r in self.per_birth if r["birth"] == birth)
            row[str(lag)] = {"outside": float(beyond_clip(x).mean()), "p99": float(np.quantile(np.abs(x), 0.99)),
                             "p99.9": float(np.quantile(np.abs(x), 0.999)), "max": float(np.abs(x).max())}
        if lag == 3 and self.args.world == "synthetic_lm":  # the student's parameter groups (group_of)
            self.full3.append(x)
            named = named_parameters(policy)
            current = [p.detach().clone() for _, p in named]
            for group in GROUPS:
                for (name, p), old, cur in zip(named, old_params, current, strict=True):
                    p.copy_(cur if group_of(name) == group else old)
                only, _ = policy.score(probe)
                self.groups[group].append((only - logp_old)[pmask].numpy())
            for (_, p), cur in zip(named, current, strict=True):
                p.copy_(cur)

    def result(self, world_params: dict) -> dict:
        """The measurement's JSON record."""
        args, steps = self.args, self.steps
        clip, lengths, ids, in_run = self.clip, self.lengths, self.ids, self.in_run
        probe_lr, probe_p, lags, per_birth, own = self.probe_lr, self.probe_p, self.lags, self.per_birth, self.own
        responses, by_key, keys, full3, groups = self.responses, self.by_key, self.keys, self.full3, self.groups
        start = self.start
        late = max(10, args.measure_from)  # Adam's steps are read from this update on
        window = steps[args.measure_from:]
        result = {
            "command": " ".join(sys.argv), "world_params": world_params, "lr": args.lr, "updates": args.updates,
            "seed": args.seed, "measure_from": args.measure_from, "clip_frac_mean": float(np.mean(clip[args.measure_from:])),
            "clip_frac_run": float(np.mean(clip)), "seconds": time.perf_counter() - start,
            "probe_length_mean": lengths,
            "adam_step_over_lr": {"first": steps[:4], "last": steps[-4:],
                                  "median_of_medians": float(np.median([s[1] for s in window])),
                                  "median_p99": float(np.median([s[2] for s in window])),
                                  "median_p999_after_10": float(np.median([s[4] for s in steps[late:]] or [np.nan])),
                                  "max_after_10": float(max([s[3] for s in steps[late:]] or [np.nan]))},
            "distinct_token_ids_per_update": float(np.mean(ids)),
            "in_run": {str(k): tail_stats(np.concatenate([a[0] for a in v]), np.concatenate([a[1] for a in v]))
                       for k, v in in_run.items() if v},
            "probe": {str(k): tail_stats(np.concatenate(probe_lr[k]), np.concatenate(probe_p[k]))
                      for k in lags if probe_lr[k]},
            "per_birth": per_birth,
            "self": tail_stats(np.concatenate(own), np.zeros(sum(a.size for a in own))) if own else {},
            "responses": concentration(np.concatenate(responses)) if responses else {},
            "by_key": {name: {str(k): tail_stats(np.concatenate(v), np.zeros(sum(a.size for a in v)))["all"]
                              for k, v in lags_.items() if v}
                       for name, lags_ in by_key.items()} if keys is not None else {},
            "groups_lag3": group_table(np.concatenate(full3), {g: np.concatenate(v) for g, v in groups.items()})
            if full3 else {},
        }
        return result


def named_parameters(policy: Any) -> list[tuple[str, Tensor]]:
    """The trainable parameters of the policy's model, with their names (:func:`group_of` reads them)."""
    return [(n, p) for n, p in policy.model.named_parameters() if p.requires_grad]


def end_tokens(policy: object) -> Tensor | None:
    """The token ids that end a response (``eos_ids`` of the ``hf`` policy, ``eos_id`` of the student), or None when
    responses have a fixed length."""
    ids = getattr(policy, "eos_ids", None)
    if ids is not None:
        return torch.as_tensor(ids)
    eos = getattr(policy, "eos_id", None)
    return None if eos is None else torch.tensor([eos])


def per_response(log_ratio: Tensor, rollout: Rollout, eos: Tensor | None) -> np.ndarray:
    """Per response of a consumed minibatch [B, 4]: response tokens, Σ |log r|, tokens outside [0.8, 1.2], and 1.0
    when truncated (its last position is a response token and not an end token; NaN when responses have a fixed
    length)."""
    mask = rollout.response_mask.bool()
    a = torch.where(mask, log_ratio.abs(), 0.0)
    outside = mask & beyond_clip(log_ratio)
    if eos is None:
        truncated = torch.full((mask.shape[0],), float("nan"))
    else:
        truncated = (mask[:, -1] & ~torch.isin(rollout.response_ids[:, -1], eos)).double()
    return torch.stack([mask.sum(-1).double(), a.sum(-1).double(), outside.sum(-1).double(), truncated], 1).numpy()


def half_share(outside: np.ndarray) -> float:
    """The smallest share of responses that holds at least half of the outside tokens (``outside``: per response)."""
    by_count = np.cumsum(np.sort(outside)[::-1]) / outside.sum()
    return float((np.searchsorted(by_count, 0.5 - 1e-12) + 1) / len(outside))


def concentration(rows: np.ndarray, draws: int = 200, seed: int = 0) -> dict:
    """Where the tokens outside [0.8, 1.2] sit among the stale responses (rows of :func:`per_response`): the
    smallest share of responses that holds half of them, beside the same share when as many outside tokens fall on
    uniformly random tokens (median of ``draws`` placements: few outside tokens look concentrated by chance alone);
    the share held by the 1 % and 5 % of responses with the largest mean |log r|; the share held by truncated
    responses, the share of tokens in truncated responses, and the share of responses truncated."""
    tokens, total, outside, truncated = rows.T
    n, clipped = len(rows), int(outside.sum())
    out: dict = {"responses": n, "tokens": int(tokens.sum()), "outside_tokens": clipped,
                 "truncated_responses": float(np.mean(truncated)),
                 "truncated_tokens": float(tokens[truncated == 1].sum() / max(tokens.sum(), 1))}
    if not clipped:
        return out
    out["half_in_share_of_responses"] = half_share(outside)
    rng = np.random.default_rng(seed)
    owner = np.repeat(np.arange(n), tokens.astype(int))
    null = [half_share(np.bincount(owner[rng.choice(owner.size, clipped, replace=False)], minlength=n))
            for _ in range(draws)]
    out["half_in_share_null"] = float(np.median(null))
    order = np.argsort(-total / np.maximum(tokens, 1), kind="stable")
    for pct in (1, 5):
        top = order[:max(1, math.ceil(n * pct / 100))]
        out[f"share_in_top{pct}pct_mean"] = float(outside[top].sum() / clipped)
    out["share_in_truncated"] = float(outside[truncated == 1].sum() / clipped)
    return out


def adam_displacement(signal: float, lags: tuple[int, ...] = (1, 2, 3, 256), params: int = 4000, burn: int = 3000,
                      steps: int = 3000, seed: int = 0) -> dict[int, float]:
    """RMS of θ_{t+k} − θ_t in units of the learning rate for Adam (Kingma & Ba 2014, arXiv:1412.6980; β 0.9 / 0.999,
    bias-corrected, steady state after ``burn`` steps) fed gradients g = ``signal`` + N(0, 1) per parameter: how fast
    any Adam run's parameters (and, to first order, its log-probs) drift with the lag k, whatever the gradient."""
    rng = np.random.default_rng(seed)
    m, v, theta, path = np.zeros(params), np.zeros(params), np.zeros(params), []
    for t in range(1, burn + steps + 1):
        g = signal + rng.standard_normal(params)
        m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
        theta = theta - (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.999**t)) + 1e-8)
        if t > burn:
            path.append(theta.copy())
    traj = np.array(path)
    return {k: float(np.sqrt(np.mean((traj[k:] - traj[:-k]) ** 2))) for k in lags}


def random_direction(world_params: dict, lr: float, probe_size: int, directions: int = 4, seed: int = 0) -> dict:
    """|log π_{θ₀+δ}(y | c) − log π_θ₀(y | c)| on π₀'s own samples for random sign steps δ = lr · sign(ξ), ξ ~ N(0, I):
    a step of Adam's first-update size (±lr on every parameter) in a direction unrelated to any gradient — the
    network's own per-token sensitivity, which the lag-1 tail at update 0 (δ = −lr · sign(∇)) can be set against."""
    config = TrainConfig(world="synthetic_lm", world_params=world_params, objective="grpo", schedule="stages:4",
                         updates=1, lr=lr, seed=seed)
    run = build(config)
    gen = torch.Generator().manual_seed(20_000 + seed)
    params = run.policy.trainable_parameters()
    with torch.no_grad():
        probe = sample_rollout(run.policy, run.world.sample_prompts(probe_size, gen), 1, 1.0, gen,
                               run.config.behavior_logp)
        old, _ = run.policy.score(probe)
        mask = probe.response_mask.bool()
        start = [p.detach().clone() for p in params]
        changes = []
        for _ in range(directions):
            for p, p0 in zip(params, start, strict=True):
                p.copy_(p0 + lr * torch.sign(torch.randn(p.shape, generator=gen)))
            new, _ = run.policy.score(probe)
            changes.append((new - old)[mask].numpy())
        for p, p0 in zip(params, start, strict=True):
            p.copy_(p0)
    p_old = np.tile(old[mask].exp().numpy(), directions)
    return tail_stats(np.concatenate(changes), p_old)


def group_table(full: np.ndarray, only: dict[str, np.ndarray]) -> dict:
    """Per parameter group: p99 / p99.9 of |log r| with only that group's change applied, and on the tokens in the
    top 0.1 % of the full |log r|, the mean of (group's log r) / (full log r)."""
    top = np.abs(full) >= np.quantile(np.abs(full), 0.999)
    out = {"full": {"p99": float(np.quantile(np.abs(full), 0.99)), "p99.9": float(np.quantile(np.abs(full), 0.999))}}
    for group, x in only.items():
        out[group] = {"p99": float(np.quantile(np.abs(x), 0.99)), "p99.9": float(np.quantile(np.abs(x), 0.999)),
                      "share_of_top": float(np.mean(x[top] / full[top]))}
    return out


def probe_lines(res: dict) -> list[str]:
    """The probes' tables: tails by π_old bin, per probe, by key, by parameter group, at long lags."""
    lines = []
    lines.append("\nby π_old bin (probes, lags 1 / 2 / 3; share of tokens; p99.9 and max of |log r|; outside):")
    lines.append("| π_old | share | p99.9 (lag 1 / 2 / 3) | max (lag 1 / 2 / 3) | outside lag 3 |")
    lines.append("|---|---:|---:|---:|---:|")
    for name in BIN_NAMES:
        cells = [res["probe"][str(k)]["bins"][name] for k in (1, 2, 3)]
        if not cells[0]["n"]:
            lines.append(f"| {name} | 0 | | | |")
            continue
        lines.append(f"| {name} | {100 * cells[0]['share']:.2f} % | "
                     + " / ".join(f"{c['p99.9']:.4f}" for c in cells) + " | "
                     + " / ".join(f"{c['max']:.3f}" for c in cells) + f" | {100 * cells[2]['outside']:.3f} % |")
    first, later = res["per_birth"][0], res["per_birth"][1:]
    lines.append(f"\nper probe, lag 3: the first probe (update {first['birth']}) vs the later probes (median): "
                 "outside / p99.9")
    later3 = [r["3"] for r in later if "3" in r]
    later_text = (f"{100 * np.median([r['outside'] for r in later3]):.4f} % / "
                  f"{np.median([r['p99.9'] for r in later3]):.4f}" if later3 else "none")
    lines.append(f"  update {first['birth']}: {100 * first['3']['outside']:.4f} % / {first['3']['p99.9']:.4f};  "
                 f"later: {later_text}  ({len(later3)} probes)")
    if res.get("by_key"):
        lines.append("by key (probes): tokens of prompts whose key was trained since the probe / the others: "
                     "share of tokens, p99.9, max, outside")
        for k in ("1", "2", "3"):
            a, b = res["by_key"]["shared"].get(k, {"n": 0}), res["by_key"]["other"].get(k, {"n": 0})
            n = a["n"] + b["n"]
            if not (a["n"] and b["n"]):
                lines.append(f"  lag {k}: {a['n']} of {n} tokens of just-trained keys")
                continue
            lines.append(f"  lag {k}: {100 * a['n'] / n:.1f} % p99.9 {a['p99.9']:.4f} max {a['max']:.3f} outside "
                         f"{100 * a['outside']:.4f} %  |  other p99.9 {b['p99.9']:.4f} max {b['max']:.3f} "
                         f"outside {100 * b['outside']:.4f} %")
    g = res["groups_lag3"]
    if g:
        lines.append("lag 3, one parameter group's change only: p99 / p99.9 of |log r|; mean share of the full log r "
                     "on the top 0.1 % tokens")
        lines.append(f"  all: {g['full']['p99']:.4f} / {g['full']['p99.9']:.4f}")
        for group in GROUPS:
            lines.append(f"  {group}: {g[group]['p99']:.4f} / {g[group]['p99.9']:.4f}; "
                         f"{g[group]['share_of_top']:.2f}")
    long = [k for k in res["probe"] if int(k) > 3]
    if long:
        lines.append("\nlong lags (probes; drift of on-policy training): lag: outside / p99 / p99.9 / max")
        for k in long:
            a = res["probe"][k]["all"]
            lines.append(f"  {k}: {100 * a['outside']:.3f} % / {a['p99']:.3f} / {a['p99.9']:.3f} / {a['max']:.2f}"
                         f"  (n {a['n']})")
    return lines


def response_lines(resp: dict) -> list[str]:
    """Where the stale minibatches' tokens outside [0.8, 1.2] sit among their responses (:func:`concentration`)."""
    lines = [f"\nstale responses (staleness 1–3): {resp['responses']}, {resp['tokens']} tokens, "
             f"{resp['outside_tokens']} outside [0.8, 1.2]; truncated {100 * resp['truncated_responses']:.1f} %"]
    if resp["outside_tokens"]:
        lines.append(f"  half of the outside tokens sit in {100 * resp['half_in_share_of_responses']:.2f} % of the "
                     f"responses; the 1 % / 5 % of responses with the largest mean |log r| hold "
                     f"{100 * resp['share_in_top1pct_mean']:.1f} % / {100 * resp['share_in_top5pct_mean']:.1f} %; "
                     f"truncated responses hold {100 * resp['share_in_truncated']:.1f} % (of the tokens: "
                     f"{100 * resp['truncated_tokens']:.1f} %)")
        lines.append(f"  by chance (as many outside tokens on random tokens, median): half in "
                     f"{100 * resp['half_in_share_null']:.2f} % of the responses")
    return lines



def table(results: list[dict]) -> str:
    lines = []
    for res in results:
        lines.append(f"\n## {res['world_params'] or 'seed_scale (the default when run)'}  lr {res['lr']:g}  {res['updates']} updates"
                     f"  clip_frac {100 * res['clip_frac_mean']:.4f} %  ({res['seconds']:.0f} s)")
        step = res["adam_step_over_lr"]
        lines.append(f"|Δθ|/lr: median {step['median_of_medians']:.3f}, p99 {step['median_p99']:.2f} (median over "
                     f"updates); update 0: median {step['first'][0][1]:.3f}, p99 {step['first'][0][2]:.2f}"
                     + (f"; after update 10: p99.9 {step['median_p999_after_10']:.2f} (median), max "
                        f"{step['max_after_10']:.2f}; distinct token ids per update "
                        f"{res['distinct_token_ids_per_update']:.0f}" if "max_after_10" in step else ""))
        if res.get("measure_from"):
            lines.append(f"measured from update {res['measure_from']} (|Δθ|/lr p99.9 and max from update "
                         f"{max(10, res['measure_from'])}); clip_frac over the whole run "
                         f"{100 * res['clip_frac_run']:.4f} %")
        lines.append("| source | lag | tokens | outside [0.8,1.2] | p99 | p99.9 | p99.99 | max |")
        lines.append("|---|---:|---:|---:|---:|---:|---:|---:|")
        for source in ("in_run", "probe"):
            for lag, s in res[source].items():
                a = s["all"]
                lines.append(f"| {source} | {lag} | {a['n']} | {100 * a['outside']:.4f} % | {a['p99']:.4f} | "
                             f"{a['p99.9']:.4f} | {a['p99.99']:.4f} | {a['max']:.4f} |")
        if res.get("self"):
            a = res["self"]["all"]
            lines.append(f"a minibatch's own tokens right after the update that trained on them: p99 {a['p99']:.4f}, "
                         f"p99.9 {a['p99.9']:.4f}, max {a['max']:.3f}, outside {100 * a['outside']:.4f} %")
        lines += probe_lines(res) if res["probe"] else []
        lines += response_lines(res["responses"]) if res.get("responses") else []
    return "\n".join(lines)

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lr", type=float, default=3e-5)
    parser.add_argument("--updates", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--probe-every", type=int, default=20, help="a multiple of 4 (a rollout boundary)")
    parser.add_argument("--probe-size", type=int, default=512)
    parser.add_argument("--measure-from", type=int, default=0,
                        help="probe and summarise only from this update on (a multiple of 4; training starts at 0)")
    parser.add_argument("--long-lags", default="4,8,16,32,64,128,256")
    parser.add_argument("--world", default="synthetic_lm", help="any world (gsm8k with --world-param model=...)")
    parser.add_argument("--world-param", action="append", default=[], metavar="K=V")
    parser.add_argument("--policy", default=None, help="policy kind (the world's default when not given)")
    parser.add_argument("--policy-param", action="append", default=[], metavar="K=V")
    parser.add_argument("--prompts-per-update", type=int, default=None)
    parser.add_argument("--group-size", type=int, default=None)
    parser.add_argument("--rescore", action=argparse.BooleanOptionalAction, default=True,
                        help="score each consumed minibatch again after its update (the 'self' tail; a forward)")
    parser.add_argument("--out", type=Path, default=None, help="write the result as JSON")
    parser.add_argument("--table", nargs="*", type=Path, default=None, help="only print the tables of these files")
    parser.add_argument("--adam-floor", action="store_true",
                        help="only print Adam's drift ratio RMS(k = 256) / RMS(k = 2) for pure-noise to pure-signal "
                             "gradients (seconds, no world)")
    parser.add_argument("--random-direction", action="store_true",
                        help="only print the tail of |Δ log π| on π₀'s samples after a random ±lr sign step")
    args = parser.parse_args(argv)
    if args.random_direction:
        world_params = parse_assignments(args.world_param, "--world-param")
        res = random_direction(world_params, args.lr, args.probe_size, seed=args.seed)["all"]
        print(f"random sign step ±{args.lr:g} on every parameter, {world_params or 'default'}: |Δ log π| over "
              f"{res['n']} tokens: p99 {res['p99']:.4f}, p99.9 {res['p99.9']:.4f}, p99.99 {res['p99.99']:.4f}, max "
              f"{res['max']:.4f}; p99.9 / p99 {res['p99.9'] / res['p99']:.2f}")
        return 0
    if args.adam_floor:
        for signal in (0.0, 0.1, 0.3, 1.0):
            d = adam_displacement(signal)
            print(f"signal {signal:g} (noise sd 1): RMS drift / lr at k = 1, 2, 3, 256: "
                  + ", ".join(f"{d[k]:.3f}" for k in (1, 2, 3, 256)) + f";  k = 256 / k = 2: {d[256] / d[2]:.1f}")
        return 0
    if args.table is not None:
        print(table([json.loads(p.read_text()) for p in args.table]))
        return 0
    if args.probe_every % 4 or args.measure_from % 4:
        parser.error("--probe-every and --measure-from must be multiples of 4 (a stages:4 rollout boundary)")
    if not 0 <= args.measure_from < args.updates:
        parser.error(f"--measure-from must be in [0, --updates = {args.updates}), got {args.measure_from}")
    args.long_lags = [int(x) for x in args.long_lags.split(",") if x]
    result = measure(args)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    print(table([result]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
