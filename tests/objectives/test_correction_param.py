"""The objectives' ``correction`` parameter: any engine's mismatch correction (offpolicylab.corrections) applied to
every objective's per-token loss, configured by a mapping (YAML / JSON) or a spec string (``--param``)."""

from __future__ import annotations

import numpy as np
import pytest

from offpolicylab import corrections
from offpolicylab.config import parse_assignments
from offpolicylab.objectives import AGG_MODES, get_objective
from tests.objectives._golden import expected, random_batch, run, tensor

OFFSETS = np.array([-1.0, -0.2, 0.0, 0.3, 1.2, 2.0])  # behavior − sampler per column


def mismatched(seed: int) -> dict[str, np.ndarray]:
    data = random_batch(seed=seed)
    data["sampler_logp"] = data["behavior_logp"] - OFFSETS[None, :]
    return data


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("name", ["reinforce", "grpo", "cispo"])
def test_tis_cap_is_slimes_tis(agg: str, name: str) -> None:
    """tis_cap=C and correction={engine: slime, use_tis: true, tis_clip: C} give the same loss and gradient."""
    data = mismatched(seed=2)
    old = run(name, data, agg=agg, tis_cap=2.0)
    new = run(name, data, agg=agg, correction={"engine": "slime", "use_tis": True, "tis_clip": 2.0})
    assert new[0] == old[0]
    np.testing.assert_array_equal(new[1], old[1])


@pytest.mark.parametrize("agg", AGG_MODES)
def test_verl_rejection_leaves_the_denominator_trl_masking_does_not(agg: str) -> None:
    """verl's rejection edits its response mask (the rejected tokens leave the aggregation); TRL's token_mask zeroes
    their loss and keeps them in it.  Columns with |log r| > log 2 (offsets −1, 1.2, 2) are rejected by both."""
    data = mismatched(seed=4)
    ratio = np.broadcast_to(np.exp(OFFSETS), data["logp"].shape)
    inside = (ratio >= 0.5) & (ratio <= 2.0)
    adv = data["advantages"][:, None]
    weight = np.where(inside, ratio, 0.0)
    mask = data["mask"]
    want_trl = expected(-weight * adv * data["logp"], -weight * adv, mask, agg)
    want_verl = expected(-weight * adv * data["logp"], -weight * adv, mask * inside, agg)
    trl = run("reinforce", data, agg=agg, correction={"engine": "trl", "vllm_importance_sampling_mode": "token_mask",
                                                       "vllm_importance_sampling_clip_min": 0.5,
                                                       "vllm_importance_sampling_clip_max": 2.0})
    verl = run("reinforce", data, agg=agg, correction="verl:rollout_is=token:rollout_is_threshold=0.5_2.0:"
                                                      "rollout_rs=token_k1:rollout_rs_threshold=0.5_2.0")
    assert trl[0] == pytest.approx(want_trl[0], rel=1e-12)
    assert verl[0] == pytest.approx(want_verl[0], rel=1e-12)
    np.testing.assert_allclose(verl[1], want_verl[1], rtol=1e-12, atol=1e-15)
    assert float(verl[2].metrics["mask_frac"]) == pytest.approx(1 - (mask * inside).sum() / mask.sum())


def test_the_correction_is_the_engines_own_weights() -> None:
    """Each engine's default correction scales the per-token loss by weights · keep of corrections.apply."""
    data = mismatched(seed=5)
    plain = run("reinforce", data, agg="seq-mean-token-sum")
    for engine in corrections.ENGINES:
        config = {"engine": engine} | ({"use_tis": True} if engine == "slime" else {})
        weights, keep = corrections.apply(engine, tensor(data["behavior_logp"]), tensor(data["sampler_logp"]),
                                          tensor(data["mask"]), advantages=tensor(data["advantages"]),
                                          current_logp=tensor(data["logp"]), **{k: v for k, v in config.items()
                                                                                if k != "engine"})
        factor = (weights * keep).numpy()
        _, grad, _ = run("reinforce", data, agg="seq-mean-token-sum", correction=config)
        np.testing.assert_allclose(grad, plain[1] * factor, rtol=1e-12, atol=1e-15, err_msg=engine)


def test_from_the_command_line_and_inert_without_sampler_logp() -> None:
    params = parse_assignments(["correction=verl:rollout_is=token:rollout_is_threshold=2.0"], "--param")
    objective = get_objective("grpo", **params)
    assert objective.correction == {"engine": "verl", "rollout_is": "token", "rollout_is_threshold": "2.0"}
    data = random_batch(seed=3)
    assert run("grpo", data, **params)[0] == run("grpo", data)[0]


@pytest.mark.parametrize(("params", "message"), [
    (dict(correction={"engine": "vllm"}), "valid: verl, trl"),
    (dict(correction="verl:rollout_iss=token"), "no parameter rollout_iss"),
    (dict(correction={"rollout_is": "token"}), "correction"),
    (dict(correction=3), "correction"),
    (dict(correction={"engine": "trl"}, tis_cap=2.0), "not both"),
])
def test_bad_settings_say_what_is_valid(params, message) -> None:
    with pytest.raises(ValueError, match=message):
        get_objective("grpo", **params)


def test_a_run_with_a_correction_from_the_command_line(tmp_path, capsys) -> None:
    """``--param correction=engine:key=value:...`` trains and is stored in config.json as the mapping a YAML config
    would give (the sampler is given a mismatch, sampler_noise_std, so the batches carry sampler_logp)."""
    import json

    from tests.cli.test_cli import run_cli

    out = tmp_path / "run"
    code, _, err = run_cli(["run", "--world", "bandit", "--objective", "grpo", "--policy-param", "sampler_noise_std=0.3",
                            "--param", "correction=verl:rollout_is=token:rollout_rs=token_k1:"
                                       "rollout_rs_threshold=0.5_2.0", "--updates", "2", "--eval-every", "1",
                            "--out", str(out)], capsys)
    assert code == 0, err
    stored = json.loads((out / "config.json").read_text())["objective_params"]["correction"]
    assert stored == {"engine": "verl", "rollout_is": "token", "rollout_rs": "token_k1",
                      "rollout_rs_threshold": "0.5_2.0"}


def test_correction_metrics_say_what_the_correction_did() -> None:
    """corr_ess, corr_weight_mean/max, corr_drop_frac, corr_seq_drop_frac and corr_trunc_frac, worked out from the
    offsets: column ratios e^[−1, −0.2, 0, 0.3, 1.2, 2] → slime's token TIS at 2 caps columns 4 and 5 (e^1.2, e^2);
    verl's token IcePop [0.5, 2] (weight 0 outside) drops columns 0, 4 and 5; SkyRL's product mask [0.5, 2] drops
    the responses whose ratio product leaves [0.5, 2]."""
    data = mismatched(seed=4)
    mask = data["mask"]
    n = mask.sum()
    ratio = np.broadcast_to(np.exp(OFFSETS), mask.shape)

    def check(metrics, factor, dropped, truncated):
        f = factor * mask
        seq_dropped = ((dropped * mask).sum(axis=1) == mask.sum(axis=1)).mean()
        assert float(metrics["corr_ess"]) == pytest.approx(f.sum() ** 2 / (n * (f * f).sum()), rel=1e-12)
        assert float(metrics["corr_weight_mean"]) == pytest.approx(f.sum() / n, rel=1e-12)
        assert float(metrics["corr_weight_max"]) == pytest.approx(f.max(), rel=1e-12)
        assert float(metrics["corr_drop_frac"]) == pytest.approx((dropped * mask).sum() / n)
        assert float(metrics["corr_trunc_frac"]) == pytest.approx((truncated * mask).sum() / n)
        assert float(metrics["corr_seq_drop_frac"]) == pytest.approx(seq_dropped)

    capped = ratio > 2.0
    out = run("reinforce", data, correction={"engine": "slime", "use_tis": True, "tis_clip": 2.0})[2]
    check(out.metrics, np.minimum(ratio, 2.0), np.zeros_like(mask), capped)
    assert float(run("reinforce", data, tis_cap=2.0)[2].metrics["corr_trunc_frac"]) == pytest.approx(
        (capped * mask).sum() / n)

    outside = (ratio < 0.5) | (ratio > 2.0)
    out = run("reinforce", data, correction="verl:rollout_is=token:rollout_is_threshold=0.5_2.0")[2]
    check(out.metrics, np.where(outside, 0.0, ratio), outside, np.zeros_like(mask))

    product = np.exp((OFFSETS[None, :] * mask).sum(axis=1))
    rejected = (product < 0.5) | (product > 2.0)
    out = run("reinforce", data, correction={"engine": "skyrl", "sequence_mask_metric": "product"})[2]
    check(out.metrics, np.where(rejected[:, None], 0.0, 1.0), np.repeat(rejected[:, None], mask.shape[1], 1),
          np.zeros_like(mask))
    assert 0 < rejected.sum() < rejected.size
    assert "corr_ess" not in run("reinforce", data)[2].metrics
