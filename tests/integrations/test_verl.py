"""verl plug-in: the adapter (always run, no verl needed) and, when the optional ``verl`` extra is installed, our
losses looked up through verl's own registry and verl's built-in losses as a peer oracle.

Only the tests in the second half need verl; they are skipped (``pytest.importorskip``) when the optional extra
is not installed — that skip is about the optional engine, not a missing feature: the adapter logic itself is
exercised without verl in the first half.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from offpolicylab.integrations import verl as verl_adapter
from offpolicylab.objectives import AGG_MODES, TokenBatch, aggregate, get_objective

TOKEN_LEVEL_OBJECTIVES = ("reinforce", "grpo", "gspo", "cispo", "m2po", "mispo")


class FakeActorConfig:
    """The two things the adapter reads from verl's ActorConfig: ``get`` and ``global_batch_info``."""

    def __init__(self, **info: object) -> None:
        self.global_batch_info = dict(info)

    def get(self, key: str, default: object = None) -> object:
        return getattr(self, key, default)


def random_verl_inputs(
    seed: int, batch: int = 4, length: int = 6, spread: float = 0.3, padding: float = float("nan")
) -> dict[str, torch.Tensor]:
    """verl-style tensors: bool response mask with ragged lengths (one empty row), [B, T] advantages; padded
    old log-probs hold ``padding`` (NaN by default: ours must ignore whatever padding holds)."""
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, length, generator=gen, dtype=torch.float64) * 2.0 - 0.1
    new = (old + spread * torch.randn(batch, length, generator=gen, dtype=torch.float64)).requires_grad_(True)
    seq_adv = torch.randn(batch, generator=gen, dtype=torch.float64)
    lengths = torch.tensor([length, length // 2, 1, 0][:batch] + [length] * max(0, batch - 4))
    mask = torch.arange(length)[None, :] < lengths[:, None]
    old = torch.where(mask, old, torch.full_like(old, padding))
    return {"old_log_prob": old, "log_prob": new, "advantages": seq_adv[:, None].expand(batch, length),
            "response_mask": mask}


def verl_row_factor(mask: torch.Tensor, agg: str) -> float:
    """verl's local seq-mean-token-sum divides by the non-empty rows, ours (aggregation.py) by all B rows."""
    return float(mask.shape[0] / (mask.sum(-1) > 0).sum()) if agg == "seq-mean-token-sum" else 1.0


def our_loss(name: str, inputs: dict[str, torch.Tensor], agg: str, **params: object) -> torch.Tensor:
    batch = TokenBatch(logp=inputs["log_prob"], behavior_logp=inputs["old_log_prob"],
                       advantages=inputs["advantages"], mask=inputs["response_mask"].to(torch.float64))
    return get_objective(name, agg=agg, **params)(batch).loss


# --------------------------------------------------------------------------------------- adapter, no verl
@pytest.mark.parametrize("name", TOKEN_LEVEL_OBJECTIVES)
@pytest.mark.parametrize("agg", AGG_MODES)
def test_adapter_equals_objective_without_global_info(name: str, agg: str) -> None:
    inputs = random_verl_inputs(seed=1)
    adapter = verl_adapter.VerlPolicyLoss(get_objective(name))
    loss, metrics = adapter(**inputs, loss_agg_mode=agg, config=FakeActorConfig())
    expected = our_loss(name, inputs, agg)
    torch.testing.assert_close(loss, expected)
    (grad,) = torch.autograd.grad(loss, inputs["log_prob"])
    (expected_grad,) = torch.autograd.grad(expected, inputs["log_prob"])
    torch.testing.assert_close(grad, expected_grad)
    assert adapter.objective.agg == agg
    assert "actor/offpolicylab/kl_k1" in metrics and "actor/pg_clipfrac" in metrics
    assert all(not value.requires_grad for value in metrics.values())


def test_global_scale_matches_verl_agg_formula_by_hand() -> None:
    """verl token-mean with global info: Σ_local m·ℓ / batch_num_tokens · dp_size; seq-mean-*: Σ_i ℓ_i / gbs · dp."""
    inputs = random_verl_inputs(seed=2)
    mask = inputs["response_mask"].numpy()
    per_token = -(inputs["log_prob"].detach().numpy() - 0.0) * inputs["advantages"].numpy()  # reinforce: −A·logp
    per_token = np.where(mask, per_token, 0.0)
    adapter = verl_adapter.VerlPolicyLoss(get_objective("reinforce"))
    info = {"dp_size": 2, "batch_num_tokens": 20, "global_batch_size": 7}
    expected = {
        "token-mean": per_token.sum() / 20 * 2,
        "seq-mean-token-mean": (per_token.sum(-1)[mask.sum(-1) > 0] / mask.sum(-1)[mask.sum(-1) > 0]).sum() / 7 * 2,
        "seq-mean-token-sum": per_token.sum() / 7 * 2,
    }
    for agg, value in expected.items():
        loss, _ = adapter(**inputs, loss_agg_mode=agg, config=FakeActorConfig(**info))
        assert loss.item() == pytest.approx(value, rel=1e-12)


def test_global_info_without_totals_under_data_parallel_is_an_error() -> None:
    adapter = verl_adapter.VerlPolicyLoss(get_objective("grpo"))
    with pytest.raises(ValueError, match="batch_num_tokens"):
        adapter(**random_verl_inputs(seed=3), config=FakeActorConfig(dp_size=2))


def test_refuses_rollout_weights_and_unknown_agg_modes() -> None:
    adapter = verl_adapter.VerlPolicyLoss(get_objective("grpo"))
    inputs = random_verl_inputs(seed=4)
    with pytest.raises(ValueError, match="rollout_is_weights"):
        adapter(**inputs, config=FakeActorConfig(), rollout_is_weights=torch.ones_like(inputs["log_prob"]))
    with pytest.raises(ValueError, match="seq-mean-token-mean"):
        adapter(**inputs, loss_agg_mode="token-sum", config=FakeActorConfig())


def test_legacy_return_is_verl_four_tuple() -> None:
    inputs = random_verl_inputs(seed=5, spread=0.6)
    adapter = verl_adapter.VerlPolicyLoss(get_objective("grpo", eps_low=0.1, eps_high=0.1), legacy_return=True)
    loss, clip_frac, ppo_kl, clip_lower = adapter(**inputs, config=None)
    mask = inputs["response_mask"]
    delta = (inputs["log_prob"].detach() - inputs["old_log_prob"])[mask]
    adv = inputs["advantages"][mask]
    clipped = ((delta > np.log1p(0.1)) & (adv > 0)) | ((delta < np.log1p(-0.1)) & (adv < 0))
    assert clip_frac.item() == pytest.approx(clipped.double().mean().item())
    assert ppo_kl.item() == pytest.approx((-delta).mean().item())
    assert clip_lower.item() == 0.0 and loss.requires_grad


def test_rollout_log_probs_feed_tis() -> None:
    """Old verl passes rollout_log_probs: they become sampler_logp, weighted by min(π_old/π_rollout, tis_cap)."""
    inputs = random_verl_inputs(seed=6)
    rollout = inputs["old_log_prob"] + 0.5
    adapter = verl_adapter.VerlPolicyLoss(get_objective("reinforce", tis_cap=0.8))
    loss, _ = adapter(**inputs, rollout_log_probs=rollout)
    mask = inputs["response_mask"]
    weight = torch.exp(torch.tensor(-0.5, dtype=torch.float64)).clamp(max=0.8)
    expected = (-(inputs["log_prob"].detach()) * inputs["advantages"] * weight)[mask].mean()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-12)


def test_decoupled_ppo_takes_old_log_prob_as_prox_and_rollout_log_probs_as_behaviour() -> None:
    """verl's old_log_prob (recomputed at the step's start) is π_prox; the rollout's log-probs are the behaviour."""
    inputs = random_verl_inputs(seed=8, padding=0.0)
    rollout = inputs["old_log_prob"] - 0.3
    adapter = verl_adapter.VerlPolicyLoss(get_objective("decoupled_ppo"))
    loss, metrics = adapter(**inputs, rollout_log_probs=rollout)
    batch = TokenBatch(logp=inputs["log_prob"], behavior_logp=rollout, prox_logp=inputs["old_log_prob"],
                       advantages=inputs["advantages"], mask=inputs["response_mask"].double())
    assert loss.item() == get_objective("decoupled_ppo")(batch).loss.item()
    # by the formula: w = π_prox / π_behavior = e^0.3 on every token, u = π_θ / π_prox clipped at 0.8 / 1.2
    mask = inputs["response_mask"]
    u = torch.exp(inputs["log_prob"].detach() - inputs["old_log_prob"])
    adv = inputs["advantages"]
    per_token = -np.exp(0.3) * torch.minimum(u * adv, u.clamp(0.8, 1.2) * adv)
    assert loss.item() == pytest.approx(per_token[mask].mean().item(), rel=1e-12)
    with pytest.raises(ValueError, match="needs the rollout's log-probs"):
        adapter(**inputs)


def test_stateful_objective_updates_once_per_optimizer_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """ac_mispo advances k once per optimizer step (global step hook), whatever the number of micro-batches, and
    its losses equal a directly driven instance that is updated before each step's first micro-batch."""
    adapter = verl_adapter.VerlPolicyLoss(get_objective("ac_mispo", warmup=4))
    monkeypatch.setattr(verl_adapter, "_ADAPTERS", {"offpolicylab_ac_mispo": adapter})
    reference = get_objective("ac_mispo", warmup=4)
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=0.1)
    verl_adapter.install_step_hook()
    try:
        for step in range(3):
            micro_batches = [random_verl_inputs(seed=10 * step + i, spread=0.01) for i in range(2)]
            for i, inputs in enumerate(micro_batches):
                loss, _ = adapter(**inputs)
                batch = TokenBatch(logp=inputs["log_prob"], behavior_logp=inputs["old_log_prob"],
                                   advantages=inputs["advantages"], mask=inputs["response_mask"].double())
                if i == 0:
                    reference.update(batch)
                torch.testing.assert_close(loss, reference(batch).loss)
            assert adapter.objective.step == step + 1
            optimizer.step()
    finally:
        verl_adapter.remove_step_hook()
    assert adapter.objective.state_dict() == reference.state_dict()


def test_register_without_verl_raises_import_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "verl.trainer.ppo", None)
    with pytest.raises(ImportError, match="pip install"):
        verl_adapter.register_with_verl()


def test_params_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(verl_adapter.PARAMS_ENV, '{"m2po": {"tau": 0.05}}')
    assert verl_adapter.params_from_env() == {"m2po": {"tau": 0.05}}
    monkeypatch.setenv(verl_adapter.PARAMS_ENV, "tau=0.05")
    with pytest.raises(ValueError, match="JSON"):
        verl_adapter.params_from_env()
    monkeypatch.setenv(verl_adapter.PARAMS_ENV, '{"m2po": 0.05}')
    with pytest.raises(ValueError, match="object of objects"):
        verl_adapter.params_from_env()


# ------------------------------------------------------------------------------------- with verl installed
@pytest.fixture
def core_algos():
    """verl's core_algos, with our registrations removed again afterwards (optional extra: skipped without it)."""
    algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    before = dict(algos.POLICY_LOSS_REGISTRY)
    yield algos
    algos.POLICY_LOSS_REGISTRY.clear()
    algos.POLICY_LOSS_REGISTRY.update(before)
    verl_adapter.remove_step_hook()
    verl_adapter._ADAPTERS.clear()


def actor_config(eps_low: float = 0.2, eps_high: float = 0.28, **info: object):
    from verl.workers.config import ActorConfig

    config = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1,
                         clip_ratio_low=eps_low, clip_ratio_high=eps_high)
    config.global_batch_info.update(info)
    return config


@pytest.mark.parametrize("agg", AGG_MODES)
def test_verl_registry_lookup_returns_our_objective(core_algos, agg: str) -> None:
    names = verl_adapter.register_with_verl(params={"m2po": {"tau": 0.01}, "grpo": {"eps_high": 0.28}})
    assert "offpolicylab_m2po" in names and "vanilla" in core_algos.POLICY_LOSS_REGISTRY
    inputs = random_verl_inputs(seed=20, spread=0.4)
    for name, params in (("m2po", {"tau": 0.01}), ("grpo", {"eps_high": 0.28}), ("cispo", {})):
        loss_fn = core_algos.get_policy_loss_fn(f"offpolicylab_{name}")
        loss, metrics = loss_fn(**inputs, loss_agg_mode=agg, config=actor_config())
        torch.testing.assert_close(loss, our_loss(name, inputs, agg, **params))
        assert isinstance(metrics, dict)


def test_verl_global_batch_info_scaling_matches_verl_agg_loss(core_algos) -> None:
    inputs = random_verl_inputs(seed=21)
    mask = inputs["response_mask"]
    per_token = -inputs["advantages"] * inputs["log_prob"]
    info = {"dp_size": 4, "batch_num_tokens": 37, "global_batch_size": 13}
    adapter = verl_adapter.VerlPolicyLoss(get_objective("reinforce"))
    for agg in AGG_MODES:
        loss, _ = adapter(**inputs, loss_agg_mode=agg, config=actor_config(**info))
        verl_loss = core_algos.agg_loss(per_token, mask, agg, **info)
        torch.testing.assert_close(loss, verl_loss)
        # without global info the row counts differ on empty rows; the adapter's rescale (above) removes that
        rows = verl_row_factor(mask, agg)
        torch.testing.assert_close(aggregate(per_token, mask.double(), agg) * rows, core_algos.agg_loss(per_token, mask, agg))


@pytest.mark.parametrize(("verl_name", "ours", "params"), [
    ("vanilla", "grpo", {"eps_low": 0.2, "eps_high": 0.28, "dual_clip": 3.0}),
    ("gspo", "gspo", {"eps_low": 3e-3, "eps_high": 4e-3}),
    ("cispo", "cispo", {"eps_low": 0.2, "eps_high": 0.28}),
])
@pytest.mark.parametrize("agg", AGG_MODES)
def test_verl_builtin_losses_agree_with_ours(core_algos, verl_name: str, ours: str, params: dict, agg: str) -> None:
    """Peer oracle: verl's own vanilla (PPO + dual clip c = 3), GSPO and CISPO equal our grpo/gspo/cispo,
    value and gradient, on random batches (ratios well inside verl's ±20 / 10 log-ratio clamps)."""
    for seed in (30, 31):
        # verl's gspo multiplies padding by 0 (NaN · 0 = NaN), so the oracle gets finite padding
        inputs = random_verl_inputs(seed=seed, spread=0.3 if ours != "gspo" else 0.01, padding=-7.0)
        config = actor_config(params["eps_low"], params["eps_high"])
        verl_loss, _ = core_algos.get_policy_loss_fn(verl_name)(**inputs, loss_agg_mode=agg, config=config)
        expected = our_loss(ours, inputs, agg, **params) * verl_row_factor(inputs["response_mask"], agg)
        torch.testing.assert_close(verl_loss, expected)
        (grad,) = torch.autograd.grad(verl_loss, inputs["log_prob"])
        (expected_grad,) = torch.autograd.grad(expected, inputs["log_prob"])
        torch.testing.assert_close(grad, expected_grad)


def test_verl_stateful_objective_keeps_one_instance(core_algos) -> None:
    verl_adapter.register_with_verl(names=["ac_mispo"], params={"ac_mispo": {"warmup": 3}})
    loss_fn = core_algos.get_policy_loss_fn("offpolicylab_ac_mispo")
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=0.1)
    for step in range(2):
        for micro in range(3):
            loss_fn(**random_verl_inputs(seed=40 + 3 * step + micro, spread=0.01), config=actor_config())
        optimizer.step()
    assert core_algos.get_policy_loss_fn("offpolicylab_ac_mispo") is loss_fn
    assert verl_adapter.policy_loss_adapter("ac_mispo").objective.step == 2


def test_verl_refuses_to_overwrite_a_foreign_loss(core_algos) -> None:
    core_algos.POLICY_LOSS_REGISTRY["offpolicylab_grpo"] = core_algos.POLICY_LOSS_REGISTRY["vanilla"]
    with pytest.raises(ValueError, match="not offpolicylab"):
        verl_adapter.register_with_verl(names=["grpo"])
    with pytest.raises(ValueError, match="not registered"):
        verl_adapter.register_with_verl(names=["cispo"], params={"m2po": {"tau": 0.1}})


# ------------------------------------------------------------------------------------- analyze and record in verl
@pytest.mark.parametrize("kind", ["collapsing", "healthy"])
def test_verl_tracking_logs_collapse_is_flagged_and_healthy_is_not(tmp_path, monkeypatch, kind: str) -> None:
    """verl's own Tracking (``trainer.logger=['file','tensorboard']``) writes its FileLogger .jsonl and its
    TensorBoard events; analyze flags the run that prospers and collapses, not the healthy one, from either."""
    tracking = pytest.importorskip("verl.utils.tracking")
    from offpolicylab import analyze
    from tests.analyze_curves import SPIKE_STEP, VERL_NAMES, history

    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "run.jsonl"))
    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path / "tensorboard"))
    tracker = tracking.Tracking("project", "experiment", default_backend=["file", "tensorboard"])
    for row in history(kind):
        tracker.log({name: row[ours] for ours, name in VERL_NAMES.items()}, step=row["step"])
    tracker.logger["file"].finish()
    tracker.logger["tensorboard"].finish()
    from_file = analyze.analyze(tmp_path / "run.jsonl").summary
    from_events = analyze.analyze(tmp_path / "tensorboard").summary
    assert (from_file["format"], from_events["format"]) == ("verl", "tensorboard")
    assert from_file["detector"]["reward"] == "critic/score/mean" and from_file["detector"]["kl"] == "actor/ppo_kl"
    for summary in (from_file, from_events):
        if kind == "collapsing":
            assert summary["status"] == "collapsed"
            assert SPIKE_STEP <= summary["collapse_step"] <= SPIKE_STEP + 20
        else:
            assert summary["status"] == "completed" and summary["collapse_step"] is None
    assert from_events["collapse_step"] == from_file["collapse_step"]


def test_verl_loss_records_its_batches_and_replay_reproduces_them(core_algos, tmp_path, monkeypatch) -> None:
    """OFFPOLICYLAB_RECORD in a verl process: the loss verl looks up records every micro-batch it scores, one update
    per optimizer step; replay masks exactly what the loss masked and its mask fraction is the one verl got."""
    import json

    from offpolicylab import cli
    from offpolicylab.run_records import load_run, load_samples

    monkeypatch.setenv("OFFPOLICYLAB_RECORD", str(tmp_path / "record"))
    verl_adapter.register_with_verl(names=["m2po"], params={"m2po": {"tau": 0.01}})
    loss_fn = core_algos.get_policy_loss_fn("offpolicylab_m2po")
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=0.1)
    returned = []
    for step in range(3):
        fractions = []
        for micro in range(2):
            inputs = random_verl_inputs(seed=60 + 2 * step + micro, spread=0.3, padding=-7.0)
            _, metrics = loss_fn(**inputs, loss_agg_mode="token-mean", config=actor_config())
            fractions.append(float(metrics["actor/offpolicylab/mask_frac"]))
        returned.append(fractions)
        optimizer.step()  # verl's actor step: the step hook ends the recorded update
    run = load_run(tmp_path / "record")
    assert run.config["engine"] == "verl" and run.objective == "m2po" and len(run.sample_files) == 3
    np.testing.assert_allclose(run.metrics["mask_frac"], [np.mean(f) for f in returned], rtol=1e-6)
    arrays = load_samples(run.sample_files[0])
    assert list(np.unique(arrays["micro_batch"])) == [0, 1] and "batch_entropy" not in arrays
    assert max(max(f) for f in returned) > 0
    for update in range(3):
        out = tmp_path / f"replay{update}"
        assert cli.main(["replay", str(tmp_path / "record"), "--objectives", "m2po", "--updates",
                         f"{update}:{update}", "--out", str(out)]) == 0
        row = json.loads((out / "replay.json").read_text())["rows"][0]
        assert row["as_run"] == 1.0
        samples = load_samples(run.sample_files[update])
        valid = samples["batch_mask"] > 0
        assert row["silenced"] == pytest.approx(float((samples["batch_kept"][valid] == 0).mean()))
