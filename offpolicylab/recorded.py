"""Recorded batches: a run's ``samples/update_XXXXXX.npz`` files (whole batches recorded by our trainer, or by
:mod:`offpolicylab.integrations.record` inside TRL / verl) read back as token batches, and the raw log-ratio
forensics of them that ``replay`` and ``plot`` both show — the ratios before any truncation or mask, which the
engines do not log (TRL #5231 asks for them), with verl's rollout-correction health numbers
(docs/algo/rollout_corr.md in verl: IS mean in [0.5, 2], ESS ≥ 0.3, χ²_token ≤ 1).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from offpolicylab.diagnostics import stats
from offpolicylab.objectives import TokenBatch
from offpolicylab.run_records import load_samples


class ReplayError(ValueError):
    """Samples that cannot be replayed as asked (the CLI prints it as one line, exit 2)."""


#: The arrays a recorder writes for the whole batch: [B, T] per token, [B] per row (``batch_`` + name).
TOKEN_ARRAYS = ("log_ratio", "mask", "kept", "entropy", "sampler_log_ratio")


ROW_ARRAYS = ("rewards", "group_ids")


REQUIRED = ("batch_log_ratio", "batch_advantage", "batch_mask", "micro_batch")


FINITE = ("log_ratio", "advantage", "entropy", "sampler_log_ratio", "rewards")


def checked_arrays(path: Path, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The whole-batch arrays of one sample file, checked and as replay scores them: every required array there,
    the shapes of one batch of B ≥ 1 rows, finite values on valid tokens; integer, boolean and float16 values
    widened to float32 (group ids and micro-batch numbers to int64).  ``ReplayError`` names the file, the array and
    what is valid."""
    valid = ("the arrays a recorder writes: batch_log_ratio, batch_advantage, batch_mask [B, T], micro_batch [B] "
             "(docs/diagnosing.md)")
    missing = [name for name in REQUIRED if name not in arrays]
    if missing:
        raise ReplayError(f"{path}: array {missing[0]!r} is missing; valid: {valid}")
    ratio = arrays["batch_log_ratio"]
    if ratio.ndim != 2 or ratio.shape[0] == 0 or ratio.shape[1] == 0:
        raise ReplayError(f"{path}: batch_log_ratio has shape {ratio.shape} (no token to replay); valid: a [B, T] "
                          "batch of at least one row and token")
    rows = ratio.shape[0]
    shapes = {"micro_batch": (rows,), "staleness": (rows,), "batch_advantage": ((rows,), ratio.shape)}
    shapes |= {f"batch_{name}": ratio.shape for name in TOKEN_ARRAYS} | {f"batch_{n}": (rows,) for n in ROW_ARRAYS}
    out: dict[str, np.ndarray] = {}
    for key, array in arrays.items():
        wanted = shapes.get(key)
        if wanted is None:
            out[key] = array
            continue
        allowed = wanted if isinstance(wanted[0], tuple) else (wanted,)
        if array.shape not in allowed:
            raise ReplayError(f"{path}: {key} has shape {array.shape} but batch_log_ratio {ratio.shape}; valid: "
                              f"{' or '.join(str(a) for a in allowed)} (the sample file is damaged)")
        if key in ("micro_batch", "batch_group_ids"):
            if array.dtype.kind not in "iu":
                raise ReplayError(f"{path}: {key} holds {array.dtype} values; valid: integers (the sample file is "
                                  "damaged)")
            out[key] = array.astype(np.int64)
        else:
            out[key] = array if array.dtype in (np.float32, np.float64) else array.astype(np.float32)
    mask = out["batch_mask"] > 0
    for name in FINITE:
        array = out.get(f"batch_{name}")
        if array is None:
            continue
        bad = ~np.isfinite(array) & (mask if array.shape == ratio.shape else mask.any(axis=1))
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            at = f"row {where[0]}" + (f", token {where[1]}" if len(where) > 1 else "")
            raise ReplayError(f"{path}: batch_{name} holds {int(bad.sum())} value(s) that are not finite (NaN or "
                              f"inf) on valid tokens, the first at {at}; valid: finite values (a run's non-finite "
                              "steps cannot be replayed)")
    return out


def micro_batches(path: Path) -> list[dict[str, torch.Tensor]]:
    """The micro-batches of one sample file as tensors (``batch_*`` arrays split by ``micro_batch``)."""
    try:
        arrays = load_samples(path)
    except (OSError, ValueError) as exc:
        raise ReplayError(f"{path} is not a readable sample file ({exc}); valid: a .npz file a recorder wrote") from None
    if "batch_log_ratio" not in arrays:
        raise ReplayError(f"{path} holds token samples without the whole batch (no batch_log_ratio): replay needs "
                          "the batches a recorder writes; valid: a run recorded with OFFPOLICYLAB_RECORD or "
                          "record_dir (docs/diagnosing.md)")
    arrays = checked_arrays(path, arrays)
    rows = arrays["micro_batch"]
    parts = []
    for index in np.unique(rows):
        pick = rows == index
        part = {key.removeprefix("batch_"): torch.from_numpy(value[pick]) for key, value in arrays.items()
                if key.startswith("batch_")}
        if "staleness" in arrays:
            part["staleness"] = torch.from_numpy(arrays["staleness"][pick].astype(np.float32))
        parts.append(part)
    return parts


def recorded_token_batch(part: dict[str, torch.Tensor]) -> tuple[TokenBatch, torch.Tensor]:
    """The micro-batch as a :class:`TokenBatch` with ``logp = Δ`` (a leaf that takes the gradient) and
    ``behavior_logp = 0``; the sampler's log-prob is −(log π_behaviour − log π_sampler)."""
    logp = part["log_ratio"].clone().requires_grad_(True)
    dtype = logp.dtype
    sampler = part.get("sampler_log_ratio")
    staleness = part.get("staleness")
    batch = TokenBatch(
        logp=logp, behavior_logp=torch.zeros_like(logp), advantages=part["advantage"].to(dtype),
        mask=part["mask"].to(dtype), sampler_logp=None if sampler is None else -sampler.to(dtype),
        entropy=None if "entropy" not in part else part["entropy"].to(dtype),
        rewards=None if "rewards" not in part else part["rewards"].to(dtype),
        group_ids=part.get("group_ids"),
        staleness=None if staleness is None or (staleness < 0).any() else staleness,
    )
    return batch, logp


def kish_ess(values: np.ndarray, log: bool = False) -> float:
    """(Σw)² / (n Σw²) of weights w (``log``: of w = e^values): the toolkit's one ESS,
    :func:`~offpolicylab.diagnostics.stats.effective_sample_size`, on float64 log-weights (rescaled by the largest,
    so nothing overflows); NaN for no weights, 0 when every weight is 0."""
    if values.size == 0:
        return math.nan
    with np.errstate(divide="ignore"):  # a zero weight is a log-weight of −inf: weight 0
        log_w = torch.from_numpy(np.asarray(values if log else np.log(values), dtype=np.float64).reshape(1, -1))
    return float(stats.effective_sample_size(log_w, torch.ones_like(log_w)))


# ------------------------------------------------------------------------------------------------ corrections
#: Bin edges of the raw log-ratio histograms (nats), symmetric about 0.
RAW_EDGES = np.array([-np.inf, -2.0, -1.0, -0.5, -0.2, -0.1, -0.05, -0.02, -0.01, -0.001, 0.001, 0.01, 0.02, 0.05,
                      0.1, 0.2, 0.5, 1.0, 2.0, np.inf])


#: verl's documented health ranges (docs/algo/rollout_corr.md): IS weight mean in [0.5, 2], ESS ≥ 0.3.
VERL_IS_MEAN, VERL_MIN_ESS = (0.5, 2.0), 0.3


def raw_log_ratios(part: dict[str, torch.Tensor], batch: TokenBatch) -> dict[str, np.ndarray]:
    """The valid tokens of one recorded micro-batch, before any truncation or mask: ``sampler`` = log π_behaviour −
    log π_sampler (when recorded), ``delta`` = Δ = log π_θ − log π_behaviour, ``adv`` the advantage, ``lag`` the
    version lag (−1: not recorded) and ``entropy`` the token entropy (NaN: not recorded), all float64 [n]."""
    valid = batch.mask > 0
    lag = part.get("staleness")
    out = {"delta": batch.delta().double()[valid].numpy(),
           "adv": batch.advantages.double()[valid].numpy(),
           "lag": (torch.full_like(batch.mask, -1.0) if lag is None else
                   lag.to(batch.mask.dtype)[:, None].expand_as(batch.mask))[valid].double().numpy(),
           "entropy": (torch.full_like(batch.mask, math.nan) if batch.entropy is None
                       else batch.entropy)[valid].double().numpy()}
    if "sampler_log_ratio" in part:
        out["sampler"] = part["sampler_log_ratio"].double()[valid].numpy()
    return out


def pooled_raw(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """:func:`raw_log_ratios` of several micro-batches concatenated; ``sampler`` only when every one has it."""
    keys = set.intersection(*(set(part) for part in parts)) if parts else set()
    return {key: np.concatenate([part[key] for part in parts]) for key in sorted(keys)}


def recorded_raw_log_ratios(files: list[Path]) -> dict[str, np.ndarray]:
    """The raw log-ratios (:func:`raw_log_ratios`) of every micro-batch of the sample ``files``, pooled; a file
    without the whole batch (``batch_log_ratio``) raises :class:`ReplayError`."""
    parts = []
    for path in files:
        for part in micro_batches(path):
            batch, _ = recorded_token_batch(part)
            parts.append(raw_log_ratios(part, batch))
    return pooled_raw(parts)


#: verl's health ceiling on χ²_token = E[ρ²] − 1 (docs/algo/rollout_corr.md).
VERL_MAX_CHI2 = 1.0


def raw_health(log_ratio: np.ndarray) -> dict[str, float]:
    """verl's rollout-correction health numbers (``compute_offpolicy_metrics``, docs/algo/rollout_corr.md) of the raw
    token ratios ρ = e^{log r}, before any truncation: IS mean E[ρ] (healthy in [0.5, 2]), Kish ESS
    (Σρ)² / (n Σρ²) (≥ 0.3; Kong 1992) and χ²_token = E[ρ²] − 1 (≤ 1); plus mean |log r| and the share of
    tokens with ρ outside [0.5, 2] (TIS's usual cap, Yao et al. 2025; IcePop's band, arXiv:2510.18855).  NaN
    for no tokens."""
    if log_ratio.size == 0:
        return {"tokens": 0, "is_mean": math.nan, "ess": math.nan, "chi2": math.nan, "abs_log_ratio_mean": math.nan,
                "share_outside_0.5_2": math.nan}
    values = log_ratio.astype(np.float64)
    with np.errstate(over="ignore"):
        ratio = np.exp(values)
        chi2 = float(np.mean(ratio * ratio) - 1.0)
    return {"tokens": int(values.size), "is_mean": float(ratio.mean()), "ess": kish_ess(values, log=True),
            "chi2": chi2, "abs_log_ratio_mean": float(np.abs(values).mean()),
            "share_outside_0.5_2": float(np.mean(np.abs(values) > math.log(2.0)))}


def health_flags(row: dict[str, float]) -> str:
    """"ok" or what of :func:`raw_health`'s numbers lies outside verl's documented health ranges; a negative
    χ²_token = E[ρ²] − 1 (possible on a sample whose IS mean is below 1, while χ² itself is ≥ 0) is named too."""
    problems = []
    if not VERL_IS_MEAN[0] <= row["is_mean"] <= VERL_IS_MEAN[1]:
        problems.append(f"IS mean {row['is_mean']:.3g}")
    if not row["ess"] >= VERL_MIN_ESS:
        problems.append(f"ESS {row['ess']:.3g}")
    if not row["chi2"] <= VERL_MAX_CHI2:
        problems.append(f"chi2 {row['chi2']:.3g}")
    elif row["chi2"] < 0:  # χ² ≥ 0 for any two distributions: a negative estimate reads nothing about health
        problems.append(f"chi2 {row['chi2']:.3g} < 0, E[ρ²] < 1: an estimate below the bound, not a health reading")
    return "ok" if not problems else "; ".join(problems)


#: The per-token ratio bounds of the engines' defaults marked on the raw histograms: IcePop / OpenRLHF's lower 0.5,
#: slime / verl / SkyRL TIS 2, TRL 3, OpenRLHF / AReaL 5 (docs/corrections.md).
ENGINE_BOUNDS = (0.5, 2.0, 3.0, 5.0)


RATIO_NAMES = {"sampler": "log π_trainer − log π_sampler", "staleness": "log π_θ − log π_behaviour (Δ)"}


def draw_raw_log_ratios(ax: Any, raw: list[dict[str, Any]], title: str) -> None:
    """Bars of the :func:`raw_histograms` rows ``raw`` (lags, terciles and signs pooled; share of each ratio's
    tokens per :data:`RAW_EDGES` bin), trainer vs sampler beside current vs behaviour, with the engines' default
    ratio bounds (:data:`ENGINE_BOUNDS`) marked."""
    centers = np.arange(RAW_EDGES.size - 1)
    for offset, ratio in ((-0.2, "sampler"), (0.2, "staleness")):
        counts = np.zeros(centers.size)
        for row in raw:
            if row["ratio"] == ratio:
                counts[int(np.searchsorted(RAW_EDGES, row["bin_low"]))] += row["count"]
        if counts.sum() > 0:
            ax.bar(centers + offset, counts / counts.sum(), width=0.4, label=RATIO_NAMES[ratio])
    names = [f"{lo:g}..{hi:g}" for lo, hi in zip(RAW_EDGES[:-1], RAW_EDGES[1:], strict=True)]
    ax.set_xticks(centers, names, rotation=90, fontsize=7)
    for bound in ENGINE_BOUNDS:
        x = np.interp(math.log(bound), RAW_EDGES[1:-1], centers[:-1] + 0.5)
        ax.axvline(x, color="grey", lw=0.8, ls=":")
        ax.text(x, ax.get_ylim()[1] * 0.95, f"r={bound:g}", fontsize=7, rotation=90, va="top")
    ax.set(ylabel="share of tokens", title=title)
    ax.legend(fontsize=8)


def raw_histograms(raw: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    """Counts of the raw log-ratios in :data:`RAW_EDGES` bins, by ratio (``sampler``: log π_behaviour −
    log π_sampler, when ``raw`` has it; ``staleness``: Δ = log π_θ − log π_behaviour), version lag (−1: not
    recorded), token-entropy tercile (0: not recorded) and advantage sign."""
    entropy = raw["entropy"]
    known = np.isfinite(entropy)
    tercile = np.zeros(entropy.shape, dtype=np.int64)
    if known.any():
        edges = np.quantile(entropy[known], [1 / 3, 2 / 3])
        tercile[known] = np.searchsorted(edges, entropy[known], side="right") + 1
    sign = np.sign(raw["adv"]).astype(np.int64)
    rows = []
    for ratio, key in (("sampler", "sampler"), ("staleness", "delta")):
        if key not in raw:
            continue
        values = raw[key]
        for lag in np.unique(raw["lag"]):
            for third in np.unique(tercile):
                for s in (-1, 0, 1):
                    pick = (raw["lag"] == lag) & (tercile == third) & (sign == s)
                    if not pick.any():
                        continue
                    counts, _ = np.histogram(values[pick], bins=RAW_EDGES)
                    rows += [{"ratio": ratio, "lag": float(lag), "entropy_tercile": int(third), "advantage_sign": s,
                              "bin_low": float(RAW_EDGES[i]), "bin_high": float(RAW_EDGES[i + 1]),
                              "count": int(counts[i])} for i in range(counts.size)]
    return rows

