"""The fused standard metrics against (1) a NumPy reference written from the definitions and (2) the unfused
per-statistic functions, and the ``metrics=False`` switch against the default call.

Definitions (Δ = logp − behavior_logp over the n valid tokens, r = e^min(Δ, 80)): ratio_mean = mean r, ratio_max = max r,
ratio_p999 = numpy.quantile(r, 0.999) (linear interpolation), log_ratio_abs_mean = mean |Δ|, m2 = mean Δ²,
ess = (Σ w)² / (n Σ w²) with w = e^Δ (Kong 1992), kl_k1 = mean(−Δ), kl_k3 = mean(e^Δ − 1 − Δ), mask_frac = share of
valid tokens outside the objective's token mask, entropy = mean entropy.

The fused path takes r = 1 + expm1(min(Δ, 80)) from the one transcendental k3 needs, so the ratio statistics and the
ESS equal the unfused ones (r = exp(min(Δ, 80)), ESS from e^(Δ − max Δ)) within float32 rounding, not bit for bit;
k1, k3, E|Δ|, M2, mask_frac and entropy sum the same terms computed by the same steps and stay bit for bit.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor

from offpolicylab.diagnostics import stats
from offpolicylab.objectives import AGG_MODES, TokenBatch, aggregate, get_objective, list_objectives
from offpolicylab.objectives.base import standard_metrics


def ragged_batch(seed: int, rows: int = 12, length: int = 40, dtype: torch.dtype = torch.float64,
                 spread: float = 0.5, empty_row: bool = True) -> dict[str, Tensor]:
    """Random ragged batch: heavy-tailed log-ratios (10 % of tokens ×8), a proximal policy halfway between behaviour
    and current policy, garbage (inf / nan / 1e6) in the padding, optionally one row with no valid token."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, length + 1, (rows,), generator=gen)
    if empty_row:
        lengths[rows // 2] = 0
    mask = (torch.arange(length)[None, :] < lengths[:, None]).to(dtype)
    behavior = torch.log(torch.rand(rows, length, generator=gen, dtype=dtype).clamp_min(1e-6))
    noise = spread * torch.randn(rows, length, generator=gen, dtype=dtype)
    noise = torch.where(torch.rand(rows, length, generator=gen) < 0.1, 8.0 * noise, noise)
    garbage = torch.tensor([math.inf, -math.inf, math.nan, 1e6], dtype=dtype)[
        torch.randint(0, 4, (rows, length), generator=gen)]
    pad = mask == 0
    return {
        "logp": torch.where(pad, garbage, behavior + noise),
        "behavior_logp": torch.where(pad, garbage.flip(0), behavior),
        "advantages": torch.randn(rows, generator=gen, dtype=dtype),
        "mask": mask,
        "rewards": (torch.rand(rows, generator=gen) < 0.5).to(dtype),
        "group_ids": torch.arange(rows) // 4,
        "entropy": torch.where(pad, garbage, 3.0 * torch.rand(rows, length, generator=gen, dtype=dtype)),
        "prox_logp": torch.where(pad, garbage, behavior + 0.5 * noise),  # halfway to the current policy
    }


def reference_metrics(fields: dict[str, Tensor], token_mask: np.ndarray) -> dict[str, float]:
    """The standard metrics from their definitions, in float64 NumPy (independent of the library)."""
    mask = fields["mask"].numpy() > 0
    delta = fields["logp"].double().numpy()[mask] - fields["behavior_logp"].double().numpy()[mask]
    if delta.size == 0:
        return {"ess": 1.0, "mask_frac": 0.0}
    return {**reference_summary(delta), "mask_frac": 1.0 - token_mask[mask].sum() / delta.size,
            "entropy": fields["entropy"].double().numpy()[mask].mean()}


def reference_summary(delta: np.ndarray) -> dict[str, float]:
    """The eight ratio statistics of the valid tokens' log-ratios ``delta`` (float64 NumPy), from the definitions."""
    if delta.size == 0:
        return {key: 1.0 if key == "ess" else 0.0 for key in stats.RATIO_METRICS}
    ratio = np.exp(np.minimum(delta, 80.0))
    weights = np.exp(delta - delta.max())  # ESS is scale-free; rescaled so that e^Δ cannot overflow
    return {
        "ratio_mean": ratio.mean(),
        "ratio_max": ratio.max(),
        "ratio_p999": np.quantile(ratio, 0.999),
        "log_ratio_abs_mean": np.abs(delta).mean(),
        "m2": np.mean(delta**2),
        "ess": weights.sum() ** 2 / (delta.size * np.sum(weights**2)),
        "kl_k1": np.mean(-delta),
        "kl_k3": np.mean(np.expm1(np.minimum(delta, 80.0)) - delta),
    }


def unfused_metrics(batch: TokenBatch, token_mask: Tensor) -> dict[str, Tensor]:
    """The standard metrics one statistic at a time with the masked (``torch.where``) functions and a full sort for
    the quantile: the computation the fused path replaced."""
    delta, mask = batch.log_ratio.detach(), batch.mask
    clamped = delta.clamp(max=stats.EXP_CLAMP)
    ratio = torch.exp(clamped)
    return {
        "ratio_mean": stats.masked_mean(ratio, mask),
        "ratio_max": stats.masked_max(ratio, mask),
        "ratio_p999": stats.masked_quantile(ratio, mask, stats.RATIO_TAIL_QUANTILE),
        "log_ratio_abs_mean": stats.masked_mean(delta.abs(), mask),
        "m2": stats.masked_mean(delta**2, mask),
        "ess": stats.effective_sample_size(delta, mask),
        "kl_k1": stats.masked_mean(-delta, mask),
        "kl_k3": stats.masked_mean(torch.expm1(clamped) - delta, mask),
        "mask_frac": 1.0 - token_mask.sum() / mask.sum().clamp_min(1.0),
        "entropy": stats.masked_mean(batch.entropy, mask),
    }


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fused_metrics_equal_numpy_definitions(seed: int, dtype: torch.dtype) -> None:
    fields = ragged_batch(seed, dtype=dtype)
    batch = TokenBatch(**fields)
    token_mask = (torch.rand(batch.mask.shape, generator=torch.Generator().manual_seed(seed)) < 0.8).to(dtype)
    got = standard_metrics(batch, token_mask * batch.mask)
    want = reference_metrics(fields, token_mask.double().numpy())
    rel = 1e-12 if dtype == torch.float64 else 2e-5
    for key, value in want.items():
        assert float(got[key]) == pytest.approx(value, rel=rel, abs=1e-12 if dtype == torch.float64 else 1e-6), key


#: The metrics the fused path computes from r = 1 + expm1(min(Δ, 80)) (and its ESS from those r): within float32
#: rounding of the unfused ones; every other metric is the unfused one bit for bit.
FROM_THE_RATIO = ("ratio_mean", "ratio_max", "ratio_p999", "ess")


def assert_fused_equals_unfused(fused: dict[str, Tensor], unfused: dict[str, Tensor]) -> None:
    """Bit for bit except :data:`FROM_THE_RATIO` (relative 2e-6 in float32, 1e-14 in float64)."""
    assert set(fused) == set(unfused)
    for key, value in unfused.items():
        if key in FROM_THE_RATIO:
            rel = 2e-6 if value.dtype == torch.float32 else 1e-14
            assert float(fused[key]) == pytest.approx(float(value), rel=rel, abs=1e-30), key
        else:
            assert torch.equal(fused[key], value), (key, fused[key], value)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape", [(12, 40), (3, 1), (64, 200)])
def test_fused_metrics_equal_the_unfused_computation(seed: int, dtype: torch.dtype, shape: tuple[int, int]) -> None:
    fields = ragged_batch(seed, rows=shape[0], length=shape[1], dtype=dtype, empty_row=shape[0] > 3)
    batch = TokenBatch(**fields)
    token_mask = (torch.rand(shape, generator=torch.Generator().manual_seed(seed)) < 0.8).to(dtype) * batch.mask
    unfused = unfused_metrics(batch, token_mask)
    assert_fused_equals_unfused(standard_metrics(batch, token_mask), unfused)
    public = stats.ratio_summary(batch.log_ratio, batch.mask)  # the public entry zeroes any padding itself
    assert_fused_equals_unfused(public, {key: unfused[key] for key in public})


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shared", ["ratio", "ess", "both"])
def test_metrics_from_what_the_loss_computed_first(seed: int, dtype: torch.dtype, shared: str) -> None:
    """An objective's loss may compute the batch's ratio r = e^Δ (PPO clip, CISPO) or its ESS (P3O) before the
    metrics: the ratio changes no metric (the summary computes its own ratios); the ESS the loss read (max-rescaled
    e^Δ) is the one reported, within float32 rounding of the summary's own; every other metric is the same bit for
    bit either way."""
    fields = ragged_batch(seed, rows=16, length=48, dtype=dtype)
    token_mask = (torch.rand(16, 48, generator=torch.Generator().manual_seed(seed)) < 0.7).to(dtype)
    alone = TokenBatch(**fields)
    plain = standard_metrics(alone, token_mask * alone.mask)
    batch = TokenBatch(**fields)
    ess = batch.ess() if shared in ("ess", "both") else None
    if shared in ("ratio", "both"):
        batch.ratio()
    metrics = standard_metrics(batch, token_mask * batch.mask)
    assert all(torch.equal(metrics[key], plain[key]) for key in plain if key != "ess" or ess is None)
    assert_fused_equals_unfused(metrics, unfused_metrics(batch, token_mask * batch.mask))
    if ess is not None:
        assert torch.equal(metrics["ess"], ess)
        assert float(plain["ess"]) == pytest.approx(float(ess), rel=2e-6 if dtype == torch.float32 else 1e-14)


def edge_blocks(seed: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """(Δ, mask) of seven run blocks of 6 rows × 50 tokens, ragged, 0 on padding, each an edge of the fused path:
    random log-ratios, Δ = 0 (on-policy), Δ ~ 1e-3 (k3 ≈ Δ²/2, where Σe^Δ − ΣΔ would cancel), huge log-ratios (up to
    100: r capped at e^80, Σ r² beyond float32), every ratio small (Δ ≈ −30), no valid token, one valid token."""
    gen = torch.Generator().manual_seed(seed)
    rows, length = 6, 50
    lengths = torch.randint(1, length + 1, (7, rows), generator=gen)
    lengths[5] = 0
    lengths[6] = torch.tensor([0, 0, 1, 0, 0, 0])
    mask = (torch.arange(length)[None, None, :] < lengths[..., None]).to(dtype)
    noise = torch.randn(7, rows, length, generator=gen, dtype=dtype)
    scale = torch.tensor([0.7, 0.0, 1e-3, 45.0, 2.0, 1.0, 1.0], dtype=dtype)[:, None, None]
    shift = torch.tensor([0.0, 0.0, 1e-3, 30.0, -30.0, 0.0, 0.3], dtype=dtype)[:, None, None]
    delta = (noise * scale + shift) * mask
    return delta.reshape(7 * rows, length), mask.reshape(7 * rows, length)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fused_summary_per_run_block_equals_numpy_at_the_edges(seed: int, dtype: torch.dtype) -> None:
    """Every statistic of every run block (:func:`edge_blocks`) against the float64 NumPy definitions, and each block
    of the joined call equal to the block's own call bit for bit (each block takes its own path)."""
    delta, mask = edge_blocks(seed, dtype)
    joined = stats.fused_ratio_summary(delta, mask, blocks=7)
    rel = 2e-5 if dtype == torch.float32 else 1e-12
    for block, (values, valid) in enumerate(zip(delta.chunk(7), mask.chunk(7), strict=True)):
        want = reference_summary(values.double().numpy()[valid.numpy() > 0])
        alone = stats.fused_ratio_summary(values, valid)
        for key, value in want.items():
            got = float(joined[key][block])
            assert got == pytest.approx(value, rel=rel, abs=1e-30 if key != "kl_k1" else 1e-7), (block, key)
            assert torch.equal(joined[key][block], alone[key]), (block, key)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fused_summary_is_the_same_when_every_block_takes_both_paths(dtype: torch.dtype, monkeypatch) -> None:
    """On the CPU the summary reads whether every block's ratios keep float32 precision from 1 + expm1 and takes the
    e^Δ path only then, and works out the percentile's ranks on the host; on other devices (no host read) it computes
    both paths and picks per block, and the ranks as tensors: the same numbers."""
    delta, mask = edge_blocks(5, dtype)
    cpu = stats.fused_ratio_summary(delta, mask, blocks=7)
    monkeypatch.setattr(stats, "_on_host", lambda values: False)
    both = stats.fused_ratio_summary(delta, mask, blocks=7)
    for key in stats.RATIO_METRICS:
        assert torch.equal(both[key], cpu[key]), key
    easy = stats.fused_ratio_summary(delta[:6], mask[:6])  # a random block alone: both paths, the fast one picked
    monkeypatch.undo()
    assert all(torch.equal(easy[key], cpu[key][0]) for key in stats.RATIO_METRICS)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("blocks", [1, 2, 4])
def test_ess_of_a_zero_padded_log_ratio_skips_the_mask_and_equals_the_masked_form(seed: int, blocks: int) -> None:
    """``effective_sample_size(..., zero_padded=True)`` on Δ that is 0 on padding (a TokenBatch's) equals the masked
    computation of the same values with garbage in the padding, per row block, bit for bit (empty rows and a block
    with no valid token included)."""
    fields = ragged_batch(seed, rows=16, length=30, dtype=torch.float32)
    mask = fields["mask"].clone()
    mask[:4] = 0.0  # the first block of 4 rows has no valid token
    delta = fields["logp"] - fields["behavior_logp"]
    zeroed = torch.where(mask > 0, delta, 0.0)
    garbage = torch.where(mask > 0, delta, torch.tensor(math.nan))
    want = stats.effective_sample_size(garbage, mask, blocks)
    got = stats.effective_sample_size(zeroed, mask, blocks, zero_padded=True)
    assert torch.equal(got, want)
    rows = mask.shape[0] // blocks
    for block in range(blocks):  # Kish's formula in NumPy, float64, on each block's valid tokens
        valid = mask[block * rows:(block + 1) * rows].numpy() > 0
        values = zeroed[block * rows:(block + 1) * rows].double().numpy()[valid]
        weights = np.exp(values - values.max()) if values.size else values
        want_block = weights.sum() ** 2 / (values.size * np.sum(weights**2)) if values.size else 1.0
        assert float(got.reshape(blocks)[block]) == pytest.approx(want_block, rel=2e-5)


def test_an_objective_that_removes_no_token_reports_the_batch_mask() -> None:
    """Objectives that keep every token return ``batch.mask`` itself as their token mask (no product with the mask):
    mask_frac is 0 and the output's mask is the batch's, as the product form ones · mask gives."""
    fields = ragged_batch(1, dtype=torch.float32)
    for name in ("reinforce", "cispo", "topr", "opmd"):
        batch = TokenBatch(**{**fields, "logp": fields["logp"].clone().requires_grad_(True)})
        out = get_objective(name)(batch)
        assert torch.equal(out.token_mask, torch.ones_like(batch.mask) * batch.mask), name
        assert float(out.metrics["mask_frac"]) == 0.0, name


@pytest.mark.parametrize("host", [True, False], ids=["ranks-on-host", "ranks-as-tensors"])
@pytest.mark.parametrize("valid", [0, 1, 2, 999, 1000, 1001, 2500])
def test_tail_quantile_from_topk_equals_the_sorted_quantile(valid: int, host: bool, monkeypatch) -> None:
    """The top-k read of the 99.9th percentile at the edges of k: n valid tokens among N = 3000, ties included; its
    ranks worked out on the host (CPU: the k the count needs) or as tensors (other devices: k for any count)."""
    if not host:
        monkeypatch.setattr(stats, "_on_host", lambda values: False)
    gen = torch.Generator().manual_seed(valid)
    values = torch.randint(0, 50, (1, 3000), generator=gen).double() / 7.0  # many ties
    mask = torch.zeros(1, 3000, dtype=torch.float64)
    mask[0, torch.randperm(3000, generator=gen)[:valid]] = 1.0
    batch = TokenBatch(logp=torch.log(values.clamp_min(1e-3)) * mask, behavior_logp=torch.zeros_like(values),
                       advantages=torch.zeros(1, dtype=torch.float64), mask=mask)
    fused = stats.fused_ratio_summary(batch.log_ratio, mask)
    ratio = batch.ratio().numpy()[0][mask.numpy()[0] > 0]
    expected = np.quantile(ratio, 0.999) if valid else 0.0
    assert float(fused["ratio_p999"]) == pytest.approx(expected, rel=1e-12)
    assert float(fused["ratio_max"]) == pytest.approx(ratio.max() if valid else 0.0, rel=1e-15)
    # the read from the top k alone, on the same values: the sort's quantile bit for bit
    assert torch.equal(stats._top_quantile(values * mask, mask.sum(-1), 0.999)[1],
                       stats.masked_quantile(values, mask, 0.999).reshape(1))


def test_an_empty_batch_reports_neutral_values() -> None:
    empty = torch.zeros(0, 5)
    summary = stats.fused_ratio_summary(empty, empty)
    assert set(summary) == set(stats.RATIO_METRICS)
    assert summary["ess"] == 1.0 and all(summary[key] == 0.0 for key in summary if key != "ess")


def test_fraction_and_indicator_equal_the_boolean_forms() -> None:
    gen = torch.Generator().manual_seed(0)
    left, right = torch.randn(6, 9, generator=gen), torch.randn(6, 9, generator=gen)
    right[0, :3] = left[0, :3]  # ties
    mask = (torch.rand(6, 9, generator=gen) < 0.6).float()
    for test in (torch.gt, torch.ge, torch.lt, torch.eq):
        assert torch.equal(stats.indicator(test, left, right), test(left, right).float())
        assert torch.equal(stats.indicator(test, left, 0.0), test(left, 0.0).float())
    selected = left > right
    expected = selected.numpy()[mask.numpy() > 0].mean()
    assert float(stats.fraction(selected, mask)) == pytest.approx(expected, rel=1e-6)
    assert torch.equal(stats.fraction(selected, mask), stats.fraction(stats.indicator(torch.gt, left, right), mask))


# ------------------------------------------------------------------------------------------ the metrics switch
def _all_configs() -> list[Any]:
    extra = [("grpo", {"dual_clip": 3.0}), ("grpo", {"eps_low": math.inf, "eps_high": math.inf}),
             ("m2po", {"variant": "cap"}), ("rec", {"importance_sampling": True})]
    return [(name, {}) for name in list_objectives()] + [(n, p) for n, p in extra if n in list_objectives()]


def _loss_and_grad(name: str, params: dict[str, Any], fields: dict[str, Tensor], **call: Any):
    objective = get_objective(name, **params)
    logp = fields["logp"].clone().requires_grad_(True)
    batch = TokenBatch(**{**fields, "logp": logp})
    if objective.stateful:
        objective.update(batch)
    out = objective(batch, **call)
    out.loss.backward()
    return out, logp.grad


@pytest.mark.parametrize(("name", "params"), _all_configs())
@pytest.mark.parametrize("agg", AGG_MODES)
def test_metrics_switch_changes_neither_loss_nor_gradient(name: str, params: dict[str, Any], agg: str) -> None:
    fields = ragged_batch(3, spread=0.3)
    params = {**params, "agg": agg}
    with_metrics, grad = _loss_and_grad(name, params, fields)
    without, grad_without = _loss_and_grad(name, params, fields, metrics=False)
    assert torch.equal(with_metrics.loss, without.loss)
    assert torch.equal(grad, grad_without)
    assert torch.equal(with_metrics.token_mask, without.token_mask)
    assert without.metrics == {} and "ratio_p999" in with_metrics.metrics


@pytest.mark.parametrize(("name", "params"), _all_configs())
def test_objectives_losses_are_finite_on_padding_so_the_mask_product_is_exact(name: str, params: dict[str, Any]) -> None:
    """Objectives aggregate with ``finite_padding=True`` (ℓ·m instead of ``torch.where``): their per-token loss is finite
    on padded tokens even when the caller's padding held inf / nan, and both aggregations agree bit for bit."""
    fields = ragged_batch(4)
    objective = get_objective(name, **params)
    batch = TokenBatch(**fields)
    if objective.stateful:
        objective.update(batch)
    per_token, _, _ = objective.token_loss(batch)
    assert torch.isfinite(per_token[batch.mask == 0]).all()
    for agg in AGG_MODES:
        assert torch.equal(aggregate(per_token, batch.mask, agg, finite_padding=True),
                           aggregate(per_token, batch.mask, agg))


def test_keep_rows_equals_a_validated_replace() -> None:
    """``keep_rows`` (products, no re-validation) gives the same batch as ``replace`` with the narrowed mask."""
    fields = ragged_batch(5)
    batch = TokenBatch(**{**fields, "sampler_logp": fields["behavior_logp"] + 0.01, "prox_logp": fields["logp"]})
    keep = torch.tensor([True, False] * 6)
    advantages = torch.randn(12, dtype=torch.float64)
    fast = batch.keep_rows(keep, advantages)
    slow = batch.replace(advantages=advantages, mask=batch.mask * keep[:, None].double())
    for name in ("logp", "behavior_logp", "advantages", "mask", "sampler_logp", "prox_logp", "entropy", "rewards",
                 "group_ids"):
        assert torch.equal(getattr(fast, name), getattr(slow, name)), name
    assert torch.equal(fast.ratio(), slow.ratio()) and torch.equal(fast.delta(), slow.delta())
    assert torch.equal(fast.log_ratio, slow.log_ratio)


def test_ess_equals_kongs_formula_at_the_edges() -> None:
    """Valid log-ratios of −inf (a zero-probability token) or ±50, padding, no valid token: the ESS equals
    (Σ w)² / (n Σ w²) worked out in float64 NumPy over the valid tokens alone (w = e^(Δ − max Δ))."""
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    for values in ([[-math.inf, 3.0, 0.0, 0.0], [-math.inf, 0.0, 0.0, 0.0]],
                   [[50.0, -50.0, 0.0, 0.0], [3.0, 0.0, 0.0, 0.0]], [[-50.0, -60.0, 0.0, 0.0], [-70.0, 0.0, 0.0, 0.0]]):
        delta = torch.tensor(values)
        valid = np.asarray(values, dtype=np.float64)[mask.numpy() > 0]
        weights = np.exp(valid - valid.max())
        expected = weights.sum() ** 2 / (valid.size * (weights**2).sum())
        assert float(stats.effective_sample_size(delta, mask)) == pytest.approx(expected, rel=1e-6)
    empty = torch.zeros(2, 4)
    assert float(stats.effective_sample_size(empty, empty)) == 1.0


@pytest.mark.parametrize("size", [64 * 1000, 64 * 4 * 70, 3000, 50])
def test_largest_values_from_blocks_equal_topk(size: int) -> None:
    """stats.largest reads the k largest values from the k blocks with the largest maxima (or falls back to one
    topk): the same values as torch.topk, ties and a single dominant block included."""
    gen = torch.Generator().manual_seed(size)
    values = torch.randint(0, 40, (size,), generator=gen).float() / 3.0  # many ties
    block = min(64, size)
    values[:block] = 100.0 + torch.arange(float(block))  # one block holds the largest values
    for k in (1, 5, math.ceil(0.001 * (size - 1)) + 2, 70):
        k = min(k, size)
        assert torch.equal(stats.largest(values, k), values.topk(k).values), k


@pytest.mark.parametrize(("eps_low", "eps_high"), [(1.0, 0.28), (0.0, 0.0), (0.2, 0.0), (math.inf, 0.1)])
def test_cispo_clip_fraction_counts_only_valid_tokens(eps_low: float, eps_high: float) -> None:
    """CISPO's clip_frac (its clipped indicator summed without the mask: r = 1 on padding lies inside every clip) is
    the share of valid tokens whose ratio lies outside [1 − ε_low, 1 + ε_high], counted in NumPy."""
    fields = ragged_batch(2, dtype=torch.float32)
    batch = TokenBatch(**fields)
    out = get_objective("cispo", eps_low=eps_low, eps_high=eps_high)(batch)
    valid = fields["mask"].numpy() > 0
    ratio = np.exp(fields["logp"].double().numpy()[valid] - fields["behavior_logp"].double().numpy()[valid])
    outside = (ratio < 1.0 - eps_low) | (ratio > 1.0 + eps_high)
    assert float(out.metrics["clip_frac"]) == pytest.approx(outside.mean(), abs=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("huge", [80.0, 85.0, 95.0])
def test_the_uncapped_first_pass_keeps_the_cap_where_a_log_ratio_reaches_it(dtype: torch.dtype, huge: float) -> None:
    """On the CPU the summary first computes e = expm1(Δ) without the cap min(Δ, 80); a block with a log-ratio at or
    beyond 80 (e finite above e^80 − 1; inf in float32 past Δ ≈ 88.7) is summarized again with the cap: k3 and every
    ratio statistic equal the capped definitions in float64 NumPy, and both runs of blocks (one with the huge
    log-ratio, one without) equal their own calls bit for bit (the other block's path)."""
    gen = torch.Generator().manual_seed(3)
    delta = 0.3 * torch.randn(4, 64, generator=gen, dtype=dtype)
    mask = torch.ones(4, 64, dtype=dtype)
    mask[1, 40:] = 0.0
    delta = delta * mask
    delta[0, 5] = huge
    joined = stats.fused_ratio_summary(delta, mask, blocks=2)
    for block in range(2):
        rows = slice(2 * block, 2 * block + 2)
        alone = stats.fused_ratio_summary(delta[rows], mask[rows])
        want = reference_summary(delta[rows].double().numpy()[mask[rows].numpy() > 0])
        for key in stats.RATIO_METRICS:
            assert torch.equal(joined[key][block], alone[key]), (block, key)
            assert float(alone[key]) == pytest.approx(want[key], rel=2e-5 if dtype == torch.float32 else 1e-12,
                                                      abs=1e-30), (block, key)
