"""Pure statistics of importance ratios and policies, on masked ``[B, T]`` tensors.

Every function takes ``mask`` (1 = token counts) and returns detached tensors; the per-update statistics never sync
a device with the host (:func:`fused_ratio_summary` reads a few numbers only from CPU tensors, where reading costs
no sync; :func:`stratified_standard_error`, for evaluation, reads the group sizes).
Notation: r = exp(Δ), Δ = log r = logp − behavior_logp.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from offpolicylab.formulas import EXP_CLAMP, capped_expm1, clipped, k3, kish_ess, kish_ess_of_sums

# Log-ratios are clamped at EXP_CLAMP (80) before exp, so exp never overflows.


def _masked(values: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask > 0, values, torch.zeros((), dtype=values.dtype, device=values.device))


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Σ m·x / max(Σ m, 1)."""
    return _masked(values, mask).sum() / mask.sum().clamp_min(1.0)


def masked_max(values: Tensor, mask: Tensor) -> Tensor:
    """max over tokens with m = 1 (0 when none)."""
    if values.numel() == 0:
        return values.new_zeros(())
    neg_inf = torch.full((), float("-inf"), dtype=values.dtype, device=values.device)
    top = torch.where(mask > 0, values, neg_inf).max()
    return torch.where(torch.isfinite(top), top, values.new_zeros(()))


def masked_quantile(values: Tensor, mask: Tensor, q: float) -> Tensor:
    """The q-quantile of the valid tokens' values with linear interpolation (``numpy.quantile``'s default): with the
    n valid values sorted, v_(0) ≤ … ≤ v_(n−1), and p = q·(n − 1), it is v_(⌊p⌋) + (p − ⌊p⌋)·(v_(⌊p⌋+1) − v_(⌊p⌋));
    0 when no token is valid.  One sort, no host sync (invalid tokens are sorted first as −inf)."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q={q!r} is invalid; valid: a number in [0, 1]")
    flat = torch.where(mask > 0, values, torch.full((), float("-inf"), dtype=values.dtype, device=values.device))
    flat = flat.reshape(-1)
    if flat.numel() == 0:
        return values.new_zeros(())
    ordered = flat.sort().values
    count = (mask > 0).sum().reshape(())
    position = q * (count - 1).clamp_min(0).to(torch.float64)  # float64: a float32 position is off by ~1e-4
    below = position.floor()
    last = flat.numel() - 1
    low = (flat.numel() - count + below.long()).clamp(0, last)
    high = (low + 1).clamp(max=last)
    value = ordered[low] + (position - below).to(values.dtype) * (ordered[high] - ordered[low])
    value = torch.where(position > below, value, ordered[low])  # exact index: no (−inf) − (−inf) at the end
    return torch.where(count > 0, value, values.new_zeros(()))


RATIO_TAIL_QUANTILE = 0.999
"""The quantile of token ratios reported as ``ratio_p999`` (the tail M2PO's figures show; the max is one token)."""


def trust_region_mask(log_ratio: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """M2PO's trust-region tokens H = {(A > 0, r > 1) or (A < 0, r < 1)} (the tokens PPO would clip), as 0/1."""
    return (clipped(log_ratio, advantages, 0.0, 0.0) & (mask > 0)).to(mask.dtype)


def effective_sample_size(log_ratio: Tensor, mask: Tensor, blocks: int = 1, *, zero_padded: bool = False) -> Tensor:
    """ESS = (Σ w)² / (n · Σ w²), w = r over the n valid tokens (:func:`~offpolicylab.formulas.kish_ess`); 1 for
    uniform ratios, → 1/n when one dominates.

    Computed with weights rescaled by max(w) (ESS is scale-free), so log-ratios of ±50 stay finite: the weights are
    e^((Δ − max Δ)·m)·m, max Δ over the valid tokens, exactly 0 on padding.  (The padding never reaches ``exp`` as
    a huge negative number: CPU ``exp`` takes a slow path for arguments far below its range; benchmarks/README.md.)
    ``blocks`` > 1: the ESS of each of ``blocks`` equal consecutive row blocks (several runs' batches joined
    row-wise), shape [blocks], each reduced exactly as its block alone.  ``zero_padded``: ``log_ratio`` is already
    finite and 0 on padded tokens (a :class:`~offpolicylab.objectives.TokenBatch`'s Δ), so it is not masked again
    (the same result, one pass less).  Source: Kish (1965), Kong (1992); P3O "Trust the Batch" (FeynRL).
    """
    if log_ratio.numel() == 0:
        return log_ratio.new_ones(() if blocks == 1 else (blocks,))
    mask = mask.to(log_ratio.dtype).reshape(blocks, -1)
    delta = log_ratio.detach().reshape(blocks, -1)
    delta = delta if zero_padded else _masked(delta, mask)
    return _shaped(_ess_rows(delta, mask, torch.empty_like(delta)), blocks)


def _ess_rows(delta: Tensor, mask: Tensor, work: Tensor) -> Tensor:
    """[blocks] :func:`effective_sample_size` of each row of a [blocks, N] ``delta`` that is finite and 0 on padding,
    every elementwise step written into the scratch buffer ``work`` (no allocation of its own)."""
    tokens = mask.sum(-1)
    floor = torch.finfo(delta.dtype).max
    # Δ on valid tokens, −finfo.max on padding: (m − 1)·floor + Δ
    top = torch.sub(mask, 1.0, out=work).mul_(floor).add_(delta).amax(-1, keepdim=True)
    top = torch.where(top > -floor, top, delta.new_zeros(()))  # no valid token: weights 0
    weights = torch.sub(delta, top, out=work).mul_(mask).exp_().mul_(mask)  # e^((Δ − max Δ)·m)·m
    ess = kish_ess(weights, tokens.clamp_min(1.0), overwrite=True)
    return torch.where(tokens > 0, ess, delta.new_ones(()))


def _shaped(values: Tensor, blocks: int) -> Tensor:
    """A per-block statistic [blocks] as the caller asked for it: a 0-d tensor when ``blocks`` is 1."""
    return values.reshape(()) if blocks == 1 else values


def ratio_summary(log_ratio: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """The standard ratio statistics over valid tokens (Δ = log r, r = e^Δ):

        ratio_mean = E[r], ratio_max = max r, ratio_p999 = its 99.9th percentile (:func:`masked_quantile`),
        log_ratio_abs_mean = E|Δ|,
        m2 = E[Δ²]  (M̂2 of M2PO, "Prosperity before collapse"),  ess = (Σ r)² / (n Σ r²)  (Kong 1992),
        kl_k1 = E[−Δ], kl_k3 = E[(e^Δ − 1) − Δ]  (Schulman's estimators of KL(π_b ‖ π_θ) from samples of π_b;
        k3 is unbiased and non-negative).

    Any values on padded tokens are ignored (they are zeroed once, then :func:`fused_ratio_summary` runs).
    """
    delta = _masked(log_ratio.detach(), mask)
    return fused_ratio_summary(delta, mask)


#: The mean ratio below which :func:`fused_ratio_summary` takes a block's ratio statistics from e^Δ instead of from
#: 1 + (e^Δ − 1): the latter is within 2⁻²⁴ of e^Δ in absolute terms, so it keeps float32's relative precision only
#: for ratios that are not small, and a mean of at least this keeps the mean and the ESS so.
RATIO_MEAN_FLOOR = 0.125

#: Ratios below e^80 were not capped (:data:`~offpolicylab.formulas.EXP_CLAMP`), so their ESS is that of e^Δ.
_UNCAPPED = math.exp(EXP_CLAMP)


def fused_ratio_summary(delta: Tensor, mask: Tensor, blocks: int = 1, tokens: Tensor | None = None,
                        ess: Tensor | None = None) -> dict[str, Tensor]:
    """:func:`ratio_summary` of a detached log-ratio ``delta`` that is already 0 on padded tokens (as
    :attr:`~offpolicylab.objectives.TokenBatch.log_ratio` is), with a binary float ``mask``.  ``tokens``: Σ mask per
    block when the caller has it; ``ess``: :func:`effective_sample_size` of the same arguments when the caller has
    it (P3O's loss reads it), reported instead of the one from the ratios, its equal within float32 rounding.
    ``blocks`` > 1: the statistics of each of ``blocks`` equal consecutive row blocks (several runs' batches joined
    row-wise), each a [blocks] tensor, every block reduced exactly as it would be alone (one call for a stack of runs
    instead of one per run).

    Fused: one transcendental, e = e^min(Δ, 80) − 1 (:func:`~offpolicylab.formulas.capped_expm1`; 0 on padding,
    where Δ = 0), gives k3 = e − Δ (:func:`~offpolicylab.formulas.k3`, the same steps) and the valid ratios
    r·m = e + m (r on valid tokens, 0 on padding), from which the mean, the ESS
    (:func:`~offpolicylab.formulas.kish_ess_of_sums` of the means of r·m and (r·m)²: ESS is scale-free) and the max
    and 99.9th percentile are read.  The per-token terms k3, (r·m)², |Δ|, Δ² are written into one scratch buffer in
    turn, each summed right after (while it is still in the cache; one reduction over all of them, written first, is
    slower); the padding is removed by the 0/1 mask (no ``torch.where``, no boolean tensors).  The 99.9th percentile
    and the max come from the largest r·m (:func:`_top_quantile`, :func:`largest`) instead of a sort of all N = B·T:
    with r ≥ 0 and the padding at 0, the top ranks of the valid ratios are the top ranks of all.  On the CPU the
    cap min(Δ, 80) is skipped first (one pass less): it changes no number in a block whose flags below hold (its
    ratios lie below e^80, so every Δ < 80); if some block's do not, the summary is computed again with the cap.

    Precision: k1, k3, E|Δ| and M2 sum the unfused definitions' terms, computed by the same steps.  Each ratio
    r = 1 + e is within 2⁻²⁴ (float32) of e^min(Δ, 80) below 1 and within 2⁻²³ of it relatively above, so the
    ratio statistics and the ESS agree with the definitions within float32 rounding — not bit for bit — while a
    block's mean ratio is at least :data:`RATIO_MEAN_FLOOR` and its largest ratio is below e^80 (none capped: the
    ESS weighs e^Δ uncapped) and below √(largest float / N), so that Σ (r·m)² is finite (float32, N = 262,144:
    Δ below ≈ 38).  A block outside that (every ratio small, or huge log-ratios) takes them from r = e^min(Δ, 80)
    and the max-rescaled ESS (:func:`effective_sample_size`) instead: on the CPU only when some block needs it (the
    check reads the flags, which costs no device sync there), on other devices always (both, then ``torch.where``:
    no host sync).
    """
    if delta.numel() == 0:
        return {key: _shaped(delta.new_ones(blocks) if key == "ess" else delta.new_zeros(blocks), blocks)
                for key in RATIO_METRICS}
    mask = mask.to(delta.dtype).reshape(blocks, -1)
    delta = delta.reshape(blocks, -1)
    tokens = mask.sum(-1) if tokens is None else tokens.reshape(blocks)
    if _on_host(delta):  # first without the cap, which changes nothing unless some ratio reaches the bound
        summary, exact = _ratio_statistics(delta, mask, tokens, ess, capped=False)
        if _surely(exact):
            return summary
    return _ratio_statistics(delta, mask, tokens, ess, capped=True)[0]


def _ratio_statistics(delta: Tensor, mask: Tensor, tokens: Tensor, ess: Tensor | None,
                      capped: bool) -> tuple[dict[str, Tensor], Tensor]:
    """(:func:`fused_ratio_summary` of a [blocks, N] ``delta`` and ``mask``, the [blocks] flags of the blocks whose
    ratios keep float32 precision from 1 + expm1 Δ).  ``capped``: e = expm1(min(Δ, 80)) as the definition reads;
    else e = expm1(Δ), the same numbers in every block whose flag holds (their ratios lie below e^80, so every
    Δ < 80), and the blocks whose flag fails take the e^Δ path (their k3 too: the caller calls again capped)."""
    blocks = delta.shape[0]
    count = tokens.clamp_min(1.0)
    work, ratio = torch.empty_like(delta), torch.empty_like(delta)
    expm1 = capped_expm1(delta, out=work) if capped else torch.expm1(delta, out=work)
    torch.add(expm1, mask, out=ratio)  # r·m = e + m
    metrics = dict(zip(("kl_k1", "kl_k3"), _kl_terms(delta, count, work, expm1=work), strict=True))
    sums = {"ratio_mean": ratio.sum(-1), "log_ratio_abs_mean": torch.abs(delta, out=work).sum(-1),
            "m2": torch.mul(delta, delta, out=work).sum(-1)}  # each term summed right after it is written (cached)
    if ess is None:
        sums["square"] = torch.mul(ratio, ratio, out=work).sum(-1)
    metrics.update(zip(sums, torch.stack(tuple(sums.values())).div_(count).unbind(), strict=True))
    metrics["ratio_max"], metrics["ratio_p999"] = _top_quantile(ratio, tokens, RATIO_TAIL_QUANTILE)
    metrics["ess"] = (_ess_of_means(metrics["ratio_mean"], metrics.pop("square"), tokens) if ess is None
                      else ess.reshape(blocks))
    exact = (metrics["ratio_mean"] >= RATIO_MEAN_FLOOR) & (metrics["ratio_max"] < _ratio_bound(delta))
    if capped and not _surely(exact):
        torch.exp(torch.clamp(delta, max=EXP_CLAMP, out=ratio), out=ratio).mul_(mask)  # r·m from e^Δ
        direct = {"ratio_mean": ratio.sum(-1) / count}
        direct["ratio_max"], direct["ratio_p999"] = _top_quantile(ratio, tokens, RATIO_TAIL_QUANTILE)
        if ess is None:
            direct["ess"] = _ess_rows(delta, mask, work)
        metrics.update({key: torch.where(exact, metrics[key], value) for key, value in direct.items()})
    return {key: _shaped(metrics[key], blocks) for key in RATIO_METRICS}, exact


def _ratio_bound(delta: Tensor) -> float:
    """The ratio below which 1 + expm1 Δ keeps the ESS exact in meaning: below e^80 (no ratio capped, so the ESS
    weighs e^Δ) and below √(largest float / N), N tokens per row, so that Σ (r·m)² ≤ N·max² is finite."""
    return min(_UNCAPPED, math.sqrt(torch.finfo(delta.dtype).max / delta.shape[-1]))


def _ess_of_means(mean: Tensor, square: Tensor, tokens: Tensor) -> Tensor:
    """Kish's ESS (:func:`~offpolicylab.formulas.kish_ess_of_sums`) from the means of the weights and of their squares
    over the n = ``tokens`` valid tokens (scale-free: (Σ w / n)² / (Σ w² / n) = (Σ w)² / (n Σ w²)); 1 when n = 0."""
    return torch.where(tokens > 0, kish_ess_of_sums(mean, square, 1.0), mean.new_ones(()))


def _surely(flags: Tensor) -> bool:
    """Whether every flag holds, read only where reading costs no device sync (:func:`_on_host`); False elsewhere."""
    return _on_host(flags) and bool(flags.all())


def kl_estimates(log_ratio: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """(k1, k3) = (E[−Δ], E[(e^Δ − 1) − Δ]) over valid tokens (Schulman's estimators of KL(π_b ‖ π_θ) from samples of
    π_b), alone: the ``kl_k1`` and ``kl_k3`` of :func:`ratio_summary`, bit for bit (the same steps), without its
    other statistics."""
    if log_ratio.numel() == 0:
        return log_ratio.new_zeros(()), log_ratio.new_zeros(())
    delta = _masked(log_ratio.detach(), mask).reshape(1, -1)
    count = mask.to(delta.dtype).reshape(1, -1).sum(-1).clamp_min(1.0)
    k1, k3 = _kl_terms(delta, count, torch.empty_like(delta))
    return k1.reshape(()), k3.reshape(())


def _kl_terms(delta: Tensor, count: Tensor, work: Tensor, expm1: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(Σ(−Δ), Σ k3(Δ)) / count per row of a [blocks, N] ``delta`` that is 0 on padding
    (:func:`~offpolicylab.formulas.k3`; ``expm1``: its e^min(Δ, 80) − 1 when the caller has it); ``work``: a scratch
    buffer like ``delta`` (it may hold ``expm1``).  Σ(−Δ) is computed as 0 − ΣΔ: the same number, and +0 (not −0)
    when ΣΔ = 0."""
    k1 = (0.0 - delta.sum(-1)) / count
    return k1, k3(delta, out=work, expm1=expm1).sum(-1) / count


RATIO_METRICS = ("ratio_mean", "ratio_max", "ratio_p999", "log_ratio_abs_mean", "m2", "ess", "kl_k1", "kl_k3")
"""The keys of :func:`ratio_summary`."""


def _top_quantile(values: Tensor, tokens: Tensor, q: float) -> tuple[Tensor, Tensor]:
    """(max, q-quantile) per row of the valid entries of ``values`` [blocks, N] ≥ 0 (finite) whose padding is 0,
    ``tokens`` [blocks] valid entries per row; the quantile interpolates as :func:`masked_quantile` does (with p =
    q·(n − 1), v_(⌊p⌋) + (p − ⌊p⌋)·(v_(⌊p⌋+1) − v_(⌊p⌋)), the same steps; 0 for n = 0, where every value read is
    padding), read from the top values only (:func:`largest`): order statistic ⌊p⌋ is n − ⌊p⌋ ranks from the top.

    Where the counts can be read without a device sync (CPU), the ranks and interpolation weights are worked out on
    the host and only the c − ⌊q·(c − 1)⌋ top values the largest count c needs are read; elsewhere as tensors, from
    the top ⌈(1 − q)·(N − 1)⌉ + 2 values (enough for any n ≤ N).  The same numbers either way."""
    n = values.shape[-1]
    counts = tokens.tolist() if _on_host(tokens) else None
    if counts is None:
        k = min(n, math.ceil((1.0 - q) * (n - 1)) + 2)
        last = tokens.to(torch.float64) - 1.0  # n − 1, float64 as masked_quantile (float32 positions are off by ~1e-4)
        position = last.clamp_min(0.0).mul_(q)
        below = position.floor()
        low = (last - below).clamp_(0, k - 1).long()  # rank from the top of order statistic ⌊p⌋
        ranks = torch.stack([low, (low - 1).clamp_min_(0)], -1)  # and of ⌊p⌋ + 1 (the same one at the very top)
        fraction = position.sub_(below).to(values.dtype)
    else:
        positions = [q * max(count - 1.0, 0.0) for count in counts]
        lows = [max(int(count - 1.0 - math.floor(p)), 0) for count, p in zip(counts, positions, strict=True)]
        k = min(n, max(lows) + 1)
        ranks = torch.tensor([[low, max(low - 1, 0)] for low in lows], device=values.device)
        fraction = torch.tensor([p - math.floor(p) for p in positions], dtype=values.dtype, device=values.device)
    top = largest(values, k)  # [blocks, k], descending
    low_value, high_value = top.gather(-1, ranks).unbind(-1)  # a gather: indexing with a tensor syncs the host
    return top[:, 0], low_value + fraction * (high_value - low_value)


def _on_host(values: Tensor) -> bool:
    """Whether reading ``values`` costs no device sync (a CPU tensor)."""
    return values.device.type == "cpu"


TOPK_BLOCK = 64
"""Block length of :func:`largest`."""


def largest(values: Tensor, k: int) -> Tensor:
    """The k largest values along the last dimension of ``values`` ([N] or [rows, N]), descending — exactly
    ``values.topk(k).values``, read from the k blocks of :data:`TOPK_BLOCK` values with the largest maxima: a value
    among the k largest lies in such a block (otherwise k blocks would each hold a larger value).  One pass for the
    block maxima and two small ``topk`` instead of one ``topk`` over all N values, with static shapes (no host
    sync).  Sizes that are not a multiple of the block, or with fewer than 4k blocks, take the plain ``topk``."""
    n = values.shape[-1]
    blocks = n // TOPK_BLOCK
    if n % TOPK_BLOCK or blocks < 4 * k:
        return values.topk(k).values
    rows = values.reshape(-1, blocks, TOPK_BLOCK)
    chosen = rows.amax(dim=-1).topk(k, sorted=False).indices  # [rows, k]
    if rows.shape[0] > 1:  # as indices of the [rows · blocks, TOPK_BLOCK] blocks
        chosen = chosen + torch.arange(0, rows.shape[0] * blocks, blocks, device=chosen.device)[:, None]
    picked = rows.reshape(-1, TOPK_BLOCK).index_select(0, chosen.reshape(-1))
    return picked.reshape(rows.shape[0], -1).topk(k).values.reshape(*values.shape[:-1], k)


def stratified_standard_error(values: Tensor, group_ids: Tensor) -> Tensor:
    """Standard error of the mean of ``values`` [N] when each group (e.g. the responses to one fixed prompt) is a
    stratum: SE = √(Σ_g n_g s_g²) / N, with s_g² the unbiased variance inside group g (n_g ≥ 2 everywhere).  With
    fixed evaluation prompts this is the Monte-Carlo error of the sampled responses alone.  When some group has a
    single value the within-group variance is unknown and the i.i.d. formula s/√N of all values is used (it also
    counts the spread between groups, so it is larger).  0 for N < 2.  (For evaluation: unlike the per-update
    statistics above, it reads the group sizes on the host.)"""
    values = values.detach().to(torch.float64).reshape(-1)
    group_ids = group_ids.to(values.device)  # rewards come back on the host, a GPU policy's group ids do not
    total = values.numel()
    if total < 2:
        return values.new_zeros(())
    groups = int(group_ids.max()) + 1
    zeros = values.new_zeros(groups)
    count = zeros.index_add(0, group_ids, torch.ones_like(values))
    present = count > 0
    if bool((count[present] < 2).any()):
        return values.std(unbiased=True) / math.sqrt(total)
    mean = zeros.index_add(0, group_ids, values) / count.clamp_min(1.0)
    squares = zeros.index_add(0, group_ids, (values - mean[group_ids]) ** 2)  # (n_g − 1)·s_g² per group
    within = torch.where(present, squares / (count - 1).clamp_min(1.0) * count, zeros)
    return within.sum().sqrt() / total


#: The most elements a row block may hold for its sum, taken as one row of a [blocks, N] tensor, to run in the order
#: of the block's own sum: PyTorch's CPU reductions split larger rows over threads (its grain size).
ROW_LIMIT = 32768


def total(values: Tensor, blocks: int = 1) -> Tensor:
    """Σ of ``values`` (0-d), or with ``blocks`` > 1 the sum of each of ``blocks`` equal consecutive row blocks
    (several runs' batches joined row-wise; [blocks]): each block summed as ``block.sum()`` sums it alone, bit for
    bit, while a block holds at most :data:`ROW_LIMIT` elements."""
    return values.sum() if blocks == 1 else values.reshape(blocks, -1).sum(-1)


def fraction(selected: Tensor, mask: Tensor, blocks: int = 1) -> Tensor:
    """Share of valid tokens where ``selected`` holds: Σ m·s / max(Σ m, 1) (``selected``: bool, or 0/1 floats); per
    row block with ``blocks`` > 1 (:func:`total`).

    Multiplies by the 0/1 mask instead of masking with ``torch.where`` (exact for 0/1 values, and much faster on CPU).
    """
    return total(selected.to(mask.dtype) * mask, blocks) / total(mask, blocks).clamp_min(1.0)


def indicator(test: Callable[..., Tensor], left: Tensor, right: Tensor | float) -> Tensor:
    """1.0 where ``test(left, right)`` holds (``torch.gt``, ``torch.eq``, ...), else 0.0, in ``left``'s dtype.

    Writing the comparison straight into a float tensor skips PyTorch's boolean tensors, which are several times
    slower on CPU (and a conversion pass).  Inputs must not require grad (no gradient flows through a test anyway)."""
    other = right.shape if isinstance(right, Tensor) else ()
    shape = left.shape if other in ((), left.shape) else torch.broadcast_shapes(left.shape, other)  # the common case
    return test(left, right, out=torch.empty(shape, dtype=left.dtype, device=left.device))


def sequence_log_ratio(log_ratio: Tensor, mask: Tensor) -> Tensor:
    """[B] log of the geometric-mean ratio ρ(τ) = exp(mean_t log r_t) (GSPO, MIS-PO); 0 for empty sequences."""
    tokens = mask.sum(dim=-1)
    return _masked(log_ratio, mask).sum(dim=-1) / tokens.clamp_min(1.0)
