"""``offpolicylab replay SAMPLES --objectives m2po,grpo,gspo --out DIR``: what each objective does with the same
recorded token batches — the analysis of Fig. 4 of "Prosperity before Collapse" (Zheng, Zhao, Chen 2025,
arXiv:2510.01161), for any run whose batches were recorded (:mod:`offpolicylab.integrations.record`).

Each recorded micro-batch is scored again by every objective, micro-batch by micro-batch as the run scored it
(batch statistics such as M2PO's M̂₂ are the micro-batch's), with ``logp = Δ`` and ``behavior_logp = 0`` so that the
log-ratio Δ is bit for bit the one the run saw (masks and gradients depend on log π only through Δ).  Over the valid
tokens i of all replayed batches, with g_i = −∂L/∂log π_i the objective's loss-gradient weight and g_i^RF = A_i / n
(token-mean; the same ``agg`` as the objective) REINFORCE's:

    silenced        share of tokens the objective clipped or masked (its token mask is 0: no gradient)
    by entropy decile   the same share within each decile of token entropy (deciles of all replayed tokens)
    grad_top20      Σ_{top-20 % entropy} |g_i| / Σ_i |g_i|   (REINFORCE: the share of Σ|A_i|)
    weight_mean     mean of w_i = g_i / g_i^RF over tokens with A_i ≠ 0 (1: REINFORCE's weight; 0: silenced)
    ess_before / ess_after   Kish ESS (Σw)² / (n Σw²) of the ratios r_i = e^Δ_i, and of |w_i| (tokens with A ≠ 0),
                    per micro-batch, averaged weighted by tokens (Kong 1992)
    m2_before / m2_after   M̂₂ = mean Δ_i² over all tokens, and over the tokens the objective kept
    as_run          for the run's own objective (its recorded parameters): share of tokens whose replayed mask
                    equals the one recorded in the run (1.0: the run is reproduced)

A stateful objective (``ac_mispo``) starts fresh and advances once per replayed update, so it matches the run only
when every update was recorded from the start.

``--corrections SPEC,...`` (``engine:key=value:...``, docs/corrections.md) also replays engines' mismatch
corrections on the recorded trainer/sampler log-ratios log r = log π_behaviour − log π_sampler (batches recorded
with sampler log-probs).  Per correction, over the valid tokens (``replay_corrections.csv``):

    tokens_dropped  share of tokens the correction rejects (keep = 0)
    seqs_dropped / seqs_touched   share of responses with every / at least one token rejected
    weight_mean, weight_p50, weight_p99, weight_max   of the applied factor w·keep
    ess             Kish ESS (Σw)² / (n Σw²) of w·keep per micro-batch, averaged weighted by tokens
    grad_norm_ratio ‖g‖ / ‖g₀‖ over all replayed tokens, g the REINFORCE (token-mean) gradient with the
                    correction, g₀ without
    verl_health     the ranges verl's docs give (IS mean in [0.5, 2], ESS ≥ 0.3): "ok" or what is outside

Every replay (with or without ``--corrections``) also writes the raw, pre-truncation log-ratios of every recorded
token — current vs behaviour (Δ) and, where the sampler's log-probs were recorded, trainer vs sampler (log r) — as
histograms by version lag × token-entropy tercile × advantage sign (``replay_raw_log_ratios.csv``), whatever the
engines then clip or mask; ``replay_corrections.png`` shows them beside the corrections.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from offpolicylab.corrections import Correction, parse_specs
from offpolicylab.objectives import Objective, TokenBatch, get_objective, objective_params
from offpolicylab.output import OutputWriter
from offpolicylab.recorded import (
    VERL_IS_MEAN,
    VERL_MIN_ESS,
    ReplayError,
    draw_raw_log_ratios,
    kish_ess,
    micro_batches,
    raw_histograms,
    recorded_raw_log_ratios,
    recorded_token_batch,
)
from offpolicylab.run_dir import RunDir, write_text_atomically
from offpolicylab.run_records import sample_update

DEFAULT_OBJECTIVES = "reinforce,grpo,m2po,gspo"
DECILES = 10
TOP_DECILES = 2  # the top-20 % entropy tokens


@dataclass
class Pooled:
    """Per valid token, pooled over every replayed micro-batch, for one objective."""

    entropy: list[np.ndarray] = field(default_factory=list)
    delta: list[np.ndarray] = field(default_factory=list)
    silenced: list[np.ndarray] = field(default_factory=list)
    grad: list[np.ndarray] = field(default_factory=list)
    reference: list[np.ndarray] = field(default_factory=list)
    same_as_run: list[np.ndarray] = field(default_factory=list)
    ess: list[tuple[float, float, int]] = field(default_factory=list)  # (before, after, tokens) per micro-batch

    def array(self, name: str) -> np.ndarray:
        parts = getattr(self, name)
        return np.concatenate(parts) if parts else np.zeros(0)


# ------------------------------------------------------------------------------------------------ reading
def sample_files(path: str | Path, updates: tuple[int, int] | None = None) -> list[Path]:
    """The ``update_XXXXXX.npz`` files of a run directory, of a samples folder, or the one file given."""
    path = Path(path)
    if not path.exists():
        raise ReplayError(f"{path} does not exist; valid: a recorded run directory, its samples folder or one "
                          "samples/update_XXXXXX.npz file")
    if path.is_file():
        files = [path]
    else:
        folder = path / "samples" if (path / "samples").is_dir() else path
        files = sorted(folder.glob("update_*.npz"))
    if updates is not None:
        files = [f for f in files if updates[0] <= sample_update(f) <= updates[1]]
    if not files:
        which = "" if updates is None else f" in updates {updates[0]}..{updates[1]}"
        raise ReplayError(f"{path} holds no samples/update_XXXXXX.npz file{which}; valid: a run directory "
                          "recorded with OFFPOLICYLAB_RECORD (docs/diagnosing.md) or one of its sample files")
    return files


class RunObjective(NamedTuple):
    """The objective a recorded run trained with, its parameters and the config.json they come from."""

    name: str
    params: dict[str, Any]
    source: str | None = None


def run_objective(path: str | Path) -> RunObjective | None:
    """The objective and parameters the recorded run trained with (its config.json), or None; a config.json whose
    objective is not a known name or whose objective_params is not a mapping is refused naming the field."""
    from offpolicylab.objectives import OBJECTIVES

    path = Path(path)
    for folder in (path, path.parent, path.parent.parent):
        if (folder / "config.json").is_file():
            config = RunDir(folder).read_config()
            if "objective" not in config:
                continue
            name, params = config["objective"], config.get("objective_params") or {}
            if not isinstance(name, str) or name not in OBJECTIVES:
                raise ReplayError(f"{folder / 'config.json'}: objective={name!r} is invalid; valid: one of "
                                  f"{', '.join(OBJECTIVES)} (the config file is damaged)")
            if not isinstance(params, dict):
                raise ReplayError(f"{folder / 'config.json'}: objective_params={params!r} is invalid; valid: a "
                                  "mapping of the objective's parameters (the config file is damaged)")
            return RunObjective(name, dict(params), str(folder / "config.json"))
    return None


# ------------------------------------------------------------------------------------------------ scoring
def gradient_weights(objective: Objective, batch: TokenBatch, logp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(token mask, g = −∂L/∂log π) of ``objective`` on ``batch``."""
    out = objective(batch)
    (grad,) = torch.autograd.grad(out.loss, logp, allow_unused=True)
    grad = torch.zeros_like(logp) if grad is None else grad
    kept = batch.mask if out.token_mask is None else out.token_mask
    return kept.detach(), -grad.detach()


def replay(files: list[Path], objectives: dict[str, Objective], own: str | None = None) -> dict[str, Pooled]:
    """Score every micro-batch of ``files`` with each objective; ``own`` names the label of the run's own
    objective (compared token by token with the recorded mask)."""
    pooled = {label: Pooled() for label in objectives}
    references = {(o.agg, o.agg_norm): get_objective("reinforce", agg=o.agg, agg_norm=o.agg_norm)
                  for o in objectives.values()}
    for path in files:
        parts = micro_batches(path)
        for label, objective in objectives.items():
            for index, part in enumerate(parts):
                batch, logp = recorded_token_batch(part)
                if index == 0 and objective.stateful:
                    objective.update(batch)
                if not (batch.mask > 0).any():  # an all-padding micro-batch: no token to score
                    continue
                try:
                    kept, grad = gradient_weights(objective, batch, logp)
                except (ValueError, RuntimeError) as exc:
                    first = " ".join(str(exc).split())
                    raise ReplayError(f"{label} cannot be replayed on {path}: {first}") from None
                _, reference = gradient_weights(references[objective.agg, objective.agg_norm], *recorded_token_batch(part))
                collect(pooled[label], batch, kept, grad, reference, part.get("kept") if label == own else None)
    if not any(p.delta for p in pooled.values()):
        raise ReplayError(f"{files[0].parent if len(files) > 1 else files[0]}: the {len(files)} replayed sample "
                          "file(s) hold no valid token (every batch_mask is 0); valid: recorded batches with at "
                          "least one response token")
    return pooled


def collect(into: Pooled, batch: TokenBatch, kept: torch.Tensor, grad: torch.Tensor, reference: torch.Tensor,
            run_kept: torch.Tensor | None) -> None:
    """Append one micro-batch's valid tokens to ``into``."""
    valid = (batch.mask > 0).numpy()
    delta = batch.delta().numpy().astype(np.float64)[valid]
    entropy = None if batch.entropy is None else batch.entropy.numpy()[valid]
    silenced = (kept.numpy() <= 0)[valid]
    g, g_rf = grad.numpy().astype(np.float64)[valid], reference.numpy().astype(np.float64)[valid]
    into.delta.append(delta)
    into.silenced.append(silenced)
    into.grad.append(g)
    into.reference.append(g_rf)
    if entropy is not None:
        into.entropy.append(entropy)
    if run_kept is not None:
        into.same_as_run.append(silenced == (run_kept.numpy() <= 0)[valid])
    signal = g_rf != 0
    into.ess.append((kish_ess(delta, log=True), kish_ess(np.abs(g[signal] / g_rf[signal])), int(valid.sum())))


@dataclass
class CorrectionPool:
    """One correction's numbers pooled over the replayed micro-batches."""

    factor: list[np.ndarray] = field(default_factory=list)  # w·keep on valid tokens
    dropped: list[np.ndarray] = field(default_factory=list)
    seq_all: list[np.ndarray] = field(default_factory=list)
    seq_any: list[np.ndarray] = field(default_factory=list)
    ess: list[tuple[float, int]] = field(default_factory=list)
    grad_sq: float = 0.0


def has_sampler_logp(path: Path) -> bool:
    """Whether the sample file ``path`` carries the sampler's log-probs (read from the archive's index, not its
    arrays); a file that cannot be read counts as carrying them (its reader says what is wrong)."""
    try:
        with np.load(path) as archive:
            return "batch_sampler_log_ratio" in archive.files
    except (OSError, ValueError):
        return True


def replay_corrections(files: list[Path], chosen: list[Correction]) -> list[dict[str, Any]]:
    """One row per correction over the micro-batches of ``files`` that carry sampler log-probs; none carrying them
    raises :class:`ReplayError`."""
    without = [path for path in files if not has_sampler_logp(path)]
    if without and len(without) < len(files):
        names = ", ".join(path.name for path in without[:3]) + (", ..." if len(without) > 3 else "")
        raise ReplayError(f"--corrections: {len(without)} of {len(files)} sample files have no sampler log-probs "
                          f"(batch_sampler_log_ratio: {names}), so the corrections would cover only part of the "
                          "tokens; valid: samples that all carry them (choose those updates with --updates "
                          "FIRST:LAST)")
    pools = {c.label(): CorrectionPool() for c in chosen}
    scorers = {c.label(): get_objective("reinforce", correction={"engine": c.engine, **c.params}) for c in chosen}
    plain = get_objective("reinforce")
    base_sq, found = 0.0, False
    for path in files:
        for part in micro_batches(path):
            if "sampler_log_ratio" not in part:
                continue
            batch, logp = recorded_token_batch(part)
            assert batch.sampler_logp is not None
            valid = batch.mask > 0
            rows = valid.any(dim=1)
            _, g0 = gradient_weights(plain, batch, logp)
            base_sq += float((g0.double() ** 2).sum())
            for correction in chosen:
                label = correction.label()
                weights, keep = correction(batch.behavior_logp, batch.sampler_logp, batch.mask,
                                           advantages=batch.advantages, current_logp=batch.logp.detach())
                batch, logp = recorded_token_batch(part)
                _, grad = gradient_weights(scorers[label], batch, logp)
                pool = pools[label]
                factor = (weights * keep).double()[valid].numpy()
                rejected = (keep <= 0) & valid
                pool.factor.append(factor)
                pool.dropped.append(rejected[valid].numpy())
                pool.seq_all.append((rejected.sum(dim=1) == valid.sum(dim=1))[rows].numpy())
                pool.seq_any.append(rejected.any(dim=1)[rows].numpy())
                pool.ess.append((kish_ess(factor), int(valid.sum())))
                pool.grad_sq += float((grad.double() ** 2).sum())
            found = True
    if not found:
        raise ReplayError("--corrections needs batches recorded with the sampler's log-probs (batch_sampler_log_ratio); "
                          "these samples have none: record a run whose sampler computes differently from the trainer")
    rows_out = []
    for label, pool in pools.items():
        factor = np.concatenate(pool.factor)
        ess = np.array(pool.ess, dtype=np.float64)
        mean, ess_value = float(factor.mean()), _weighted(ess[:, 0], ess[:, 1])
        problems = []
        if not VERL_IS_MEAN[0] <= mean <= VERL_IS_MEAN[1]:
            problems.append(f"IS mean {mean:.3g}")
        if not ess_value >= VERL_MIN_ESS:
            problems.append(f"ESS {ess_value:.3g}")
        rows_out.append({
            "correction": label, "tokens": int(factor.size),
            "tokens_dropped": float(np.concatenate(pool.dropped).mean()),
            "seqs_dropped": float(np.concatenate(pool.seq_all).mean()),
            "seqs_touched": float(np.concatenate(pool.seq_any).mean()),
            "weight_mean": mean, "weight_p50": float(np.quantile(factor, 0.5)),
            "weight_p99": float(np.quantile(factor, 0.99)), "weight_max": float(factor.max()),
            "ess": ess_value,
            "grad_norm_ratio": math.sqrt(pool.grad_sq / base_sq) if base_sq > 0 else math.nan,
            "verl_health": "ok" if not problems else "; ".join(problems),
        })
    return rows_out


# ------------------------------------------------------------------------------------------------ tables
def entropy_deciles(pooled: dict[str, Pooled]) -> np.ndarray | None:
    """Decile index 0..9 of each token's entropy among all replayed tokens (None when no entropy was recorded)."""
    first = next(iter(pooled.values()))
    entropy = first.array("entropy")
    if entropy.size == 0 or entropy.size != first.array("delta").size:
        return None
    edges = np.quantile(entropy, np.arange(1, DECILES) / DECILES)
    return np.searchsorted(edges, entropy, side="right")


def summary_table(pooled: dict[str, Pooled], params: dict[str, str]) -> list[dict[str, Any]]:
    """One row per objective (see the module docstring for the columns)."""
    deciles = entropy_deciles(pooled)
    rows = []
    for label, p in pooled.items():
        silenced, grad, reference, delta = (p.array(n) for n in ("silenced", "grad", "reference", "delta"))
        magnitude, signal = np.abs(grad), reference != 0
        top = None if deciles is None else deciles >= DECILES - TOP_DECILES
        ess = np.array(p.ess, dtype=np.float64)
        same = p.array("same_as_run")
        rows.append({
            "objective": label, "params": params[label], "tokens": int(delta.size),
            "silenced": float(silenced.mean()),
            "silenced_top20": math.nan if top is None else float(silenced[top].mean()),
            "grad_top20": math.nan if top is None or magnitude.sum() == 0 else
            float(magnitude[top].sum() / magnitude.sum()),
            "weight_mean": float(np.mean(grad[signal] / reference[signal])) if signal.any() else math.nan,
            "ess_before": _weighted(ess[:, 0], ess[:, 2]), "ess_after": _weighted(ess[:, 1], ess[:, 2]),
            "m2_before": float(np.mean(delta**2)),
            "m2_after": float(np.mean(delta[~silenced] ** 2)) if (~silenced).any() else math.nan,
            "as_run": float(same.mean()) if same.size else math.nan,
        })
    return rows


def decile_table(pooled: dict[str, Pooled]) -> list[dict[str, Any]]:
    """Per objective and entropy decile: tokens, silenced share, share of Σ|g|, mean entropy."""
    deciles = entropy_deciles(pooled)
    if deciles is None:
        return []
    rows = []
    for label, p in pooled.items():
        silenced, magnitude, entropy = p.array("silenced"), np.abs(p.array("grad")), p.array("entropy")
        total = magnitude.sum()
        for d in range(DECILES):
            pick = deciles == d
            rows.append({"objective": label, "decile": d + 1, "tokens": int(pick.sum()),
                         "entropy_mean": float(entropy[pick].mean()) if pick.any() else math.nan,
                         "silenced": float(silenced[pick].mean()) if pick.any() else math.nan,
                         "grad_share": float(magnitude[pick].sum() / total) if total > 0 else math.nan})
    return rows


def _weighted(values: np.ndarray, weights: np.ndarray) -> float:
    ok = np.isfinite(values)
    return float(np.average(values[ok], weights=weights[ok])) if ok.any() and weights[ok].sum() > 0 else math.nan


# ------------------------------------------------------------------------------------------------ objectives
def parse_objectives(names: str, assignments: list[str], run: tuple[str, dict[str, Any]] | None
                     ) -> tuple[dict[str, Objective], dict[str, str], str | None]:
    """Build the objectives of ``--objectives a,b`` with ``--param a.key=value``; the run's own objective, when
    listed without ``--param``, gets the run's recorded parameters.  Returns (objectives by label, their shown
    parameters, the label of the run's own objective or None)."""
    chosen = [name.strip() for name in names.split(",") if name.strip()]
    if not chosen or len(set(chosen)) != len(chosen):
        raise ReplayError(f"--objectives {names!r} is invalid; valid: distinct comma-separated objective names, "
                          f"e.g. {DEFAULT_OBJECTIVES}")
    given: dict[str, dict[str, str]] = {name: {} for name in chosen}
    for text in assignments:
        target, _, value = text.partition("=")
        name, _, key = target.partition(".")
        if not (value and key) or name not in given:
            raise ReplayError(f"--param {text!r} is invalid; valid: OBJECTIVE.KEY=VALUE for a listed objective "
                              f"({', '.join(chosen)}), e.g. m2po.tau=0.04")
        given[name][key] = value
    objectives, shown, own = {}, {}, None
    for name in chosen:
        params: dict[str, Any] = dict(given[name])
        source = None
        if run is not None and name == run[0] and not params:
            params, own = dict(run[1]), name
            source = getattr(run, "source", None)
        try:
            objectives[name] = get_objective(name, **params)
        except (TypeError, ValueError) as exc:
            if source is None:
                raise
            raise ReplayError(f"{source}: {' '.join(str(exc).split())} (the config file is damaged)") from None
        defaults = {key: spec.default for key, spec in objective_params(name).items()}
        shown[name] = ", ".join(f"{k}={v}" for k, v in objectives[name].config.items() if defaults.get(k) != v)
    return objectives, shown, own


def parse_corrections(text: str | None) -> list[Correction]:
    """The corrections of ``--corrections`` (none when not given); a bad one is a :class:`ReplayError`."""
    if text is None:
        return []
    try:
        chosen = parse_specs(text)
    except ValueError as exc:
        raise ReplayError(f"--corrections {text!r} is invalid: {exc}") from None
    labels = [c.label() for c in chosen]
    if not chosen or len(set(labels)) != len(labels):
        raise ReplayError(f"--corrections {text!r} is invalid; valid: distinct engine:key=value:... specs, "
                          "comma-separated")
    return chosen


def parse_updates(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    first, sep, last = text.partition(":")
    if not (sep and first.strip().isdigit() and last.strip().isdigit() and int(first) <= int(last)):
        raise ReplayError(f"--updates {text!r} is invalid; valid: FIRST:LAST, two update numbers, e.g. 800:1200")
    return int(first), int(last)


# ------------------------------------------------------------------------------------------------ output
def figure(rows: list[dict[str, Any]], deciles: list[dict[str, Any]], title: str, path: Path) -> Path:
    """"Which tokens each objective silences here": share silenced and share of |gradient| by entropy decile (or,
    without recorded entropy, the silenced share per objective)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from offpolicylab.plots import objective_color

    if deciles:
        fig, axes = plt.subplots(1, 2, figsize=(11.0, 4.0))
        for row in rows:
            label = row["objective"]
            mine = [d for d in deciles if d["objective"] == label]
            style = {"color": objective_color(label), "marker": "o", "ms": 3, "label": label}
            axes[0].plot([d["decile"] for d in mine], [d["silenced"] for d in mine], **style)
            axes[1].plot([d["decile"] for d in mine], [d["grad_share"] for d in mine], **style)
        axes[0].set(xlabel="token entropy decile (1 = lowest)", ylabel="share of tokens clipped or masked")
        axes[1].set(xlabel="token entropy decile (1 = lowest)", ylabel="share of Σ|gradient weight|")
        axes[1].legend(fontsize=8)
    else:
        fig, ax = plt.subplots(figsize=(6.0, 3.5))
        labels = [row["objective"] for row in rows]
        ax.bar(labels, [row["silenced"] for row in rows], color=[objective_color(lab) for lab in labels])
        ax.set(ylabel="share of tokens clipped or masked", title="(no token entropy recorded: no deciles)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def corrections_figure(rows: list[dict[str, Any]], raw: list[dict[str, Any]], title: str, path: Path) -> Path:
    """Left: the raw (pre-truncation) log-ratio histograms, trainer vs sampler and current vs behaviour, all lags,
    terciles and signs pooled, with the ratio bounds the engines' defaults use (TIS 2 / 3 / 5, IcePop 0.5) marked.
    Right: per correction the share of tokens dropped and its ESS, with verl's health floor ESS ≥ 0.3."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12.0, 4.2))
    draw_raw_log_ratios(axes[0], raw, "raw log-ratios, before any truncation or mask")
    labels = [correction_label(row["correction"]) for row in rows]
    x = np.arange(len(rows))
    axes[1].bar(x - 0.2, [row["tokens_dropped"] for row in rows], width=0.4, label="share of tokens dropped")
    axes[1].bar(x + 0.2, [row["ess"] for row in rows], width=0.4, label="ESS of w·keep")
    axes[1].axhline(VERL_MIN_ESS, color="red", lw=0.8, ls="--", label=f"verl's ESS floor {VERL_MIN_ESS:g}")
    axes[1].set_xticks(x, labels, fontsize=7)  # whole, one engine parameter per line (no label is cut)
    axes[1].set(ylim=(0, 1.05), title="what each correction does here")
    axes[1].legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, 1.0), ncol=3, frameon=False,
                   bbox_transform=axes[1].transAxes).set_in_layout(True)
    axes[1].set_ylim(0, 1.2)  # room for the legend above the bars
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def correction_label(spec: str) -> str:
    """A correction's tick label, whole: ``engine:key=value:...`` with one ``key=value`` per line."""
    return "\n".join(spec.split(":"))


def _json_number(value: Any) -> Any:
    """NaN as null (strict JSON has no NaN)."""
    return None if isinstance(value, float) and math.isnan(value) else value


def format_table(rows: list[dict[str, Any]]) -> str:
    import pandas as pd

    frame = pd.DataFrame(rows).drop(columns=["params"])
    return frame.to_string(index=False, float_format=lambda v: f"{v:.4g}")


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    import pandas as pd

    write_text_atomically(path, pd.DataFrame(rows).to_csv(index=False))


# ------------------------------------------------------------------------------------------------ command line
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("samples", metavar="SAMPLES",
                        help="a recorded run directory, its samples folder, or one samples/update_XXXXXX.npz")
    parser.add_argument("--objectives", default=DEFAULT_OBJECTIVES,
                        help=f"comma-separated objectives to replay (default {DEFAULT_OBJECTIVES})")
    parser.add_argument("--param", action="append", default=[], metavar="OBJ.K=V",
                        help="an objective parameter, e.g. m2po.tau=0.02 (repeatable; the run's own objective "
                             "gets the run's parameters unless given)")
    parser.add_argument("--updates", default=None, metavar="FIRST:LAST", help="replay only these updates")
    parser.add_argument("--corrections", default=None, metavar="SPEC,...",
                        help="engines' mismatch corrections to replay on the recorded sampler log-probs, each "
                             "engine:key=value:... (docs/corrections.md), e.g. verl:rollout_is=token,trl,"
                             "skyrl:sequence_mask_metric=geometric; writes replay_corrections.csv and "
                             "replay_raw_log_ratios.csv")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder for replay.csv, replay_deciles.csv, "
                                                                    "replay.png")


OUTPUT_FILES = ("replay.csv", "replay_deciles.csv", "replay.png", "replay.json", "replay_corrections.csv",
                "replay_raw_log_ratios.csv", "replay_corrections.png")


def updates_text(updates: list[int]) -> str:
    """``update 100`` for one update, ``3 updates (100..300)`` for several (figure titles)."""
    return f"update {updates[0]}" if len(updates) == 1 else f"{len(updates)} updates ({updates[0]}..{updates[-1]})"


def run_command(args: argparse.Namespace) -> int:
    target = OutputWriter(args.out, "replay", OUTPUT_FILES.__contains__, ", ".join(OUTPUT_FILES))  # checked first
    files = sample_files(args.samples, parse_updates(args.updates))
    objectives, shown, own = parse_objectives(args.objectives, args.param, run_objective(args.samples))
    chosen = parse_corrections(args.corrections)
    pooled = replay(files, objectives, own)
    fixes = replay_corrections(files, chosen) if chosen else None
    raw = raw_histograms(recorded_raw_log_ratios(files))  # every recorded token, before any truncation or mask
    rows, deciles = summary_table(pooled, shown), decile_table(pooled)
    updates = [sample_update(f) for f in files]
    title = f"which tokens each objective silences here: {rows[0]['tokens']} tokens, {updates_text(updates)}"
    record = {"samples": str(args.samples), "files": len(files), "updates": [updates[0], updates[-1]],
              "run_objective": own, "rows": [{k: _json_number(v) for k, v in row.items()} for row in rows]}
    with target.staging() as out:  # written whole, swapped in at the end
        write_csv(out / "replay.csv", rows)
        if deciles:
            write_csv(out / "replay_deciles.csv", deciles)
        figure(rows, deciles, title, out / "replay.png")
        write_csv(out / "replay_raw_log_ratios.csv", raw)
        if fixes is not None:
            write_csv(out / "replay_corrections.csv", fixes)
            corrections_figure(fixes, raw, f"what each mismatch correction does here: {fixes[0]['tokens']} "
                               f"tokens with sampler log-probs, {updates_text(updates)}",
                               out / "replay_corrections.png")
            record["corrections"] = [{k: _json_number(v) for k, v in row.items()} for row in fixes]
        write_text_atomically(out / "replay.json", json.dumps(record, indent=2) + "\n")
    print(title)
    print(format_table(rows))
    if fixes is not None:
        import pandas as pd

        print(pd.DataFrame(fixes).to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        print(f"-> {args.out}/replay_corrections.csv, replay_corrections.png")
    print(f"-> {args.out}/replay.csv, replay.png, replay_raw_log_ratios.csv" + (", replay_deciles.csv" if deciles else ""))
    return 0
