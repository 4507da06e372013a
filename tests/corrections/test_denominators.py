"""Each engine's loss aggregation of a corrected loss, on a batch where its rejection changes the denominator: the
expected loss is worked out from the engine's own formula, with the kept tokens and their factors read off the
ratio table by hand (the batch of ``tests/corrections/test_by_hand.py``):

    row A: r = 4, 0.25, 1.5, 6        A_A = −1
    row B: r = 1, 0.4, 3, —           A_B = −1
    row C: empty response             A_C = +1
    row D: r = 8, 8, —, —             A_D = +1

The per-token loss is REINFORCE's ℓ_t = −A·log π_θ(y_t), times the factor f_t = w_t·keep_t; 9 valid tokens.

Where the denominator is taken (read from each engine's source):

* verl 0.9.1 — **after** rejection: ``rollout_corr_helper.compute_rollout_correction_and_add_to_batch`` stores the
  rejected mask as ``batch["response_mask"]``, and ``core_algos.agg_loss`` divides by it (token-mean: Σ m'ℓ / Σ m';
  seq-mean-token-mean over the rows with a kept token).
* TRL 1.16.0 — before: ``GRPOTrainer._compute_loss`` multiplies ``per_token_loss`` by the IS ratio (0 when masked)
  and divides by ``completion_mask``.
* OpenRLHF 0.11.2 — before: ``models/loss.py`` ``PolicyLoss.forward`` multiplies the loss by ``coef`` (0 outside the
  band) and ``aggregate_loss`` divides by ``action_mask``.
* slime (``THUDM/slime`` 2fc4883, ``slime/backends/megatron_utils/loss.py``) — before: ``vanilla_tis_function`` and
  ``icepop_function`` return the ``loss_masks`` they were given, so ``policy_loss_function``'s rebuilt
  ``sum_of_sample_mean`` divides by the original masks.
* SkyRL 0.3.0 — before: ``ppo_utils.reduce_loss`` sums ``loss · loss_mask`` (the rejected mask) over advantages the
  trainer divided beforehand by the mini-batch's original ``loss_mask`` sum
  (``apply_loss_reduction_to_advantages_minibatch``, token_mean; sequence_mean ÷ B·Σ_t m).
* AReaL 1.0.4 — before: ``functional.ppo_actor_loss_fn`` takes ``loss_mask_count`` before ``apply_rejection_sampling``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from offpolicylab import corrections
from tests.corrections.test_by_hand import ADV, LOGP, MASK, SAMPLER
from tests.objectives._golden import run

#: engine → (correction config, {(row, column): factor f = w·keep of each kept token}), worked by hand from the
#: table above; every other valid token is rejected.
CASES = {
    # rollout_rs=token_k1 "0.5_2.0": keep 0.5 ≤ r ≤ 2 (−log r within [log 0.5, log 2]); token IS min(r, 2)
    "verl": ({"engine": "verl", "rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_rs": "token_k1",
              "rollout_rs_threshold": "0.5_2.0"}, {(0, 2): 1.5, (1, 0): 1.0}),
    # token_mask [0.5, 2]: w = r·1[0.5 ≤ r ≤ 2]
    "trl": ({"engine": "trl", "vllm_importance_sampling_mode": "token_mask", "vllm_importance_sampling_clip_min": 0.5,
             "vllm_importance_sampling_clip_max": 2.0}, {(0, 2): 1.5, (1, 0): 1.0}),
    # icepop in its default band [0.5, 5]: w = r·1[0.5 ≤ r ≤ 5]
    "openrlhf": ({"engine": "openrlhf", "vllm_is_correction_type": "icepop"},
                 {(0, 0): 4.0, (0, 2): 1.5, (1, 0): 1.0, (1, 2): 3.0}),
    # icepop_function with tis_clip_low 0.5, tis_clip 2: w = r·1[0.5 ≤ r ≤ 2]
    "slime": ({"engine": "slime", "use_tis": True, "tis_clip_low": 0.5,
               "custom_tis_function_path": "slime.backends.megatron_utils.loss.icepop_function"},
              {(0, 2): 1.5, (1, 0): 1.0}),
    # token mask [0.5, 2], no TIS weight
    "skyrl": ({"engine": "skyrl", "token_mask_is_threshold_low": 0.5, "token_mask_is_threshold_high": 2.0},
              {(0, 2): 1.0, (1, 0): 1.0}),
    # the default when enabled: token mask r ≤ 5, weight r
    "areal": ({"engine": "areal"}, {(0, 0): 4.0, (0, 1): 0.25, (0, 2): 1.5, (1, 0): 1.0, (1, 1): 0.4, (1, 2): 3.0}),
}
AFTER = {"verl"}  # the engines whose denominator counts only the kept tokens
LENGTHS = {0: 4, 1: 3, 2: 0, 3: 2}


def loss_terms(kept: dict[tuple[int, int], float]) -> dict[tuple[int, int], float]:
    """ℓ_t·f_t = −A·log π(y_t)·f_t of each kept token (log π_θ = the batch's logp)."""
    return {(r, c): -float(ADV[r]) * float(LOGP[r, c]) * f for (r, c), f in kept.items()}


def engine_loss(engine: str, agg: str, after: bool) -> float:
    """The engine's aggregation of the corrected loss, from its formula (see the module docstring): the denominator
    after the rejection (``after``: verl's) or before it (the others')."""
    terms = loss_terms(CASES[engine][1])
    if agg == "token-mean":
        count = len(terms) if after else sum(LENGTHS.values())
        return sum(terms.values()) / count
    rows = {}  # seq-mean-token-mean: the mean over rows of each row's token mean
    for (r, _), value in terms.items():
        rows.setdefault(r, []).append(value)
    if after:  # verl: the rows with a kept token, each over its kept tokens
        return sum(sum(v) / len(v) for v in rows.values()) / len(rows)
    nonempty = [r for r, n in LENGTHS.items() if n > 0]  # the others: every non-empty row over its own length
    return sum(sum(rows.get(r, [])) / LENGTHS[r] for r in nonempty) / len(nonempty)


def data() -> dict[str, np.ndarray]:
    return {"logp": LOGP.numpy(), "behavior_logp": LOGP.numpy(), "sampler_logp": SAMPLER.numpy(),
            "advantages": ADV.numpy(), "mask": MASK.numpy()}


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("engine", sorted(CASES))
def test_corrected_loss_is_aggregated_as_the_engine_does(engine: str, agg: str) -> None:
    config, kept = CASES[engine]
    weights, keep = corrections.apply(engine, LOGP, SAMPLER, MASK, advantages=ADV,
                                      **{k: v for k, v in config.items() if k != "engine"})
    rejected = int(MASK.sum() - keep.sum())
    assert rejected == int(MASK.sum()) - len(kept) > 0  # the rejection this case is about
    loss, grad, _ = run("reinforce", data(), agg=agg, correction=config)
    after = engine in AFTER
    assert loss == pytest.approx(engine_loss(engine, agg, after), rel=1e-6), (engine, agg)
    assert not math.isclose(loss, engine_loss(engine, agg, not after), rel_tol=1e-3)  # the other denominator differs
    if agg == "token-mean":  # d L / d log π(y_t) = −A·f_t / N on the kept tokens, 0 elsewhere
        count = len(kept) if after else int(MASK.sum())
        want_grad = np.zeros_like(grad)
        for (r, c), f in kept.items():
            want_grad[r, c] = -float(ADV[r]) * f / count
        np.testing.assert_allclose(grad, want_grad, rtol=1e-6, atol=1e-12)


def test_only_verl_counts_the_kept_tokens() -> None:
    """The flag the objectives read, engine by engine, as the module docstring's sources say."""
    assert {name for name, engine in corrections.ENGINES.items() if engine.denominator_after_rejection} == AFTER
