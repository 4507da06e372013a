"""The synthetic-LM world on a tiny recipe (seconds): teacher distribution against NumPy, reward on hand-built
responses, the π₀ cache, the Gymnasium env and a CLI run with the world's training defaults."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

from offpolicylab import cli
from offpolicylab.policies import make_policy
from offpolicylab.worlds import make_world, world_train_defaults
from offpolicylab.worlds.synthetic_lm import ANS, FIRST_TEXT, NUM_DIGITS, Recipe, SyntheticLM

TINY = {"preset": "seed_scale", "vocab_size": 32, "response_len": 8, "num_keys": 4, "num_train_prompts": 16,
        "d_model": 16, "num_heads": 2, "num_layers": 1, "distill_steps": 40, "distill_batch": 16, "alpha": 7.0,
        "delta": 0.125}
# (alpha, delta: the smollm2 preset's broad teacher, so that a 40-step student samples text the teacher finds likely)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("slm_cache")


@pytest.fixture(scope="module")
def world(cache) -> SyntheticLM:
    return make_world("synthetic_lm", cache_dir=str(cache), **TINY)


# ------------------------------------------------------------------------------------------ teacher
def test_teacher_distribution_matches_numpy_formula(world):
    r = world.recipe
    prompt = world.prompt_tokens[:3]
    response = torch.randint(FIRST_TEXT, r.vocab_size, (3, r.response_len), generator=torch.Generator().manual_seed(0))
    response[0, -2], response[0, -1] = ANS, 3
    logp = world.teacher.log_probs(prompt, response).double().numpy()
    net = world.teacher.net
    with torch.no_grad():
        tokens = torch.cat([prompt, response[:, :-1]], 1)
        hidden = net(tokens, torch.ones_like(tokens, dtype=torch.bool))[:, prompt.shape[1] - 1:]
        z = net.head(hidden).double().numpy()
        u_h = (hidden @ world.teacher.direction).double().numpy()

    def softmax(x):
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    def standard(x):
        return (x - x.mean(-1, keepdims=True)) / x.std(-1, ddof=1, keepdims=True)

    zt = standard(z[..., FIRST_TEXT:])
    kappa = np.exp(r.sharpness_spread * u_h)
    text = (1 - r.delta) * softmax(r.alpha * kappa[..., None] * zt) + r.delta * softmax(zt)
    expected = np.zeros_like(z)
    expected[..., FIRST_TEXT:] = text
    expected[:, -2] *= 1 - r.ans_prob
    expected[:, -2, ANS] = r.ans_prob
    expected[0, -1] = 0.0
    key = int(prompt[0, 0]) - FIRST_TEXT
    expected[0, -1, :NUM_DIGITS] = softmax(r.key_scale * world.teacher.key_logits[key].double().numpy()
                                           + r.digit_scale * standard(z[0, -1, :NUM_DIGITS]))
    assert np.allclose(np.exp(logp), expected, atol=1e-5)
    assert np.allclose(np.exp(logp).sum(-1), 1.0, atol=1e-5)


def test_teacher_sampling_probabilities_equal_full_pass(world):
    prompt = world.prompt_tokens[:5]
    response, logp = world.teacher.sample(prompt, torch.Generator().manual_seed(1))
    full = world.teacher.log_probs(prompt, response)
    finite = torch.isfinite(full)
    assert torch.equal(finite, torch.isfinite(logp))
    # the sharp component multiplies float32 rounding of the hidden state (~1e-7) by α κ (~1e2-1e3)
    assert (full[finite] - logp[finite]).abs().max() < 1e-4


# ------------------------------------------------------------------------------------------ reward
def _teacher_greedy_text(world, prompt):
    """The teacher's most probable token at every position (high teacher log-probability: on the manifold)."""
    r = world.recipe
    response = torch.full((1, r.response_len), FIRST_TEXT)
    for t in range(r.response_len - 2):
        response[0, t] = world.teacher.log_probs(prompt[None], response)[0, t].argmax()
    return response


def test_reward_on_hand_built_responses(world):
    index = 5
    prompt, key = world.prompt_tokens[index], int(world.prompt_keys[index])
    right = int(world.table[key])
    wrong = (right + 1) % NUM_DIGITS
    base = _teacher_greedy_text(world, prompt)
    loop = torch.full_like(base, 3)  # degenerate: a digit repeated through the text (teacher probability 0 there)

    def build(text, slot, digit):
        y = text.clone()
        y[0, -2], y[0, -1] = slot, digit
        return y

    cases = {  # (response, reward worked out from the rule: format valid? digit right?)
        "valid, right digit": (build(base, ANS, right), 1.0),
        "valid, wrong digit": (build(base, ANS, wrong), 0.1),
        "no ANS at T-2": (build(base, FIRST_TEXT + 1, right), 0.0),
        "text instead of a digit at T-1": (build(base, ANS, FIRST_TEXT + 2), 0.0),
        "ANS at T-1 (not a digit)": (build(base, ANS, ANS), 0.0),
        "degenerate loop, right digit": (build(loop, ANS, right), 0.0),
    }
    responses = torch.cat([c[0] for c in cases.values()])
    got = world.reward(torch.full((len(cases),), index), responses, torch.ones(responses.shape))
    assert got.tolist() == pytest.approx([c[1] for c in cases.values()])
    m = world.teacher.mean_log_prob(prompt[None].expand(2, -1), torch.cat([cases["valid, right digit"][0],
                                                                             cases["degenerate loop, right digit"][0]]))
    assert m[0] >= world.threshold > m[1]
    log_p_format = float(np.log(world.recipe.ans_prob)) + float(world.teacher.log_probs(
        prompt[None], cases["degenerate loop, right digit"][0])[0, -1, right])
    assert float(m[1]) == pytest.approx((-30.0 * (world.recipe.response_len - 2) + log_p_format)
                                        / world.recipe.response_len, abs=1e-4)  # log 0 floored at -30


def test_threshold_is_the_first_percentile_of_pi0_samples(world):
    policy = world.pretrained_policy()
    prompts = world._prompts(torch.arange(world.num_prompts))
    rollout = policy.sample(prompts, world.recipe.threshold_samples, 1.0,
                            torch.Generator().manual_seed(world.recipe.seed + 1299709))
    m = world.teacher.mean_log_prob(rollout.prompt_ids.long(), rollout.response_ids).double().numpy()
    assert world.threshold == pytest.approx(float(np.percentile(m, 1)), abs=1e-6)
    below = int((m < world.threshold).sum())  # linear interpolation at rank 0.01 (n-1): ceil of it lie below
    assert below == int(np.ceil(0.01 * (m.size - 1)))


def test_token_log_probs_equal_the_full_distribution_read_at_the_tokens_bit_for_bit(world):
    """The reward reads p_T only at the response's tokens: the same numbers as the full [B, T, V] distribution,
    on π₀'s samples and on random responses with ANS / digits in and out of their slots, for batch sizes whose
    B·T is and is not a multiple of the vector width."""
    r, gen = world.recipe, torch.Generator().manual_seed(4)
    policy = world.pretrained_policy()
    for batch in (1, 3, 8, 13):
        index = torch.randint(r.num_train_prompts, (batch,), generator=gen)
        prompt = world.prompt_tokens[index]
        sampled = policy.sample(world._prompts(index), 2, 1.0, gen).response_ids
        noise = torch.randint(r.vocab_size, (batch, r.response_len), generator=gen)
        noise[::2, -2] = ANS
        noise[::3, -1] = torch.randint(NUM_DIGITS, noise[::3, -1].shape, generator=gen)
        noise[1::4, 2] = ANS
        for prompts, response in ((prompt.repeat_interleave(2, 0), sampled), (prompt, noise)):
            full = world.teacher.log_probs(prompts, response).gather(-1, response[..., None])[..., 0]
            assert torch.equal(world.teacher.token_log_probs(prompts, response), full)
    assert torch.isinf(full).any() and torch.isfinite(full).any()  # both kinds of entry were compared


def test_prompts_keys_and_eval_set(world):
    r = world.recipe
    assert world.prompt_tokens.shape == (r.num_train_prompts + r.num_keys, 4)
    assert torch.equal(world.eval_prompts().ids[:, 0], FIRST_TEXT + torch.arange(r.num_keys))
    assert torch.equal(torch.bincount(world.prompt_keys[: r.num_train_prompts]),
                       torch.full((r.num_keys,), r.num_train_prompts // r.num_keys))
    assert int(world.sample_prompts(50, torch.Generator().manual_seed(0)).index.max()) < r.num_train_prompts
    big = make_world("synthetic_lm", cache_dir=str(world.cache_dir), **{**TINY, "num_keys": 15, "num_train_prompts": 30})
    counts = torch.bincount(big.table, minlength=NUM_DIGITS)  # 15 keys: five digits answer 2 keys, five answer 1
    assert sorted(counts.tolist()) == [1] * 5 + [2] * 5


# ------------------------------------------------------------------------------------------ π₀ cache
def test_cache_is_deterministic_and_keyed_by_the_recipe(world, cache, tmp_path):
    other = make_world("synthetic_lm", cache_dir=str(tmp_path), **TINY)  # cold build elsewhere
    assert other.cache_path.name == world.cache_path.name
    assert other.threshold == world.threshold
    assert all(torch.equal(other.pretrained_state[k], world.pretrained_state[k]) for k in world.pretrained_state)
    changed = replace(Recipe(**{k: v for k, v in TINY.items() if k != "preset"}), alpha=world.recipe.alpha * 2)
    assert changed.digest() != world.recipe.digest()
    # a file under the new recipe's name that holds another recipe is rebuilt, not reused
    shutil.copy(world.cache_path, tmp_path / SyntheticLM(changed, cache_dir=tmp_path).cache_path.name)
    rebuilt = SyntheticLM(changed, cache_dir=tmp_path)
    assert not all(torch.equal(rebuilt.pretrained_state[k], world.pretrained_state[k])
                   for k in world.pretrained_state)
    stored = torch.load(rebuilt.cache_path, weights_only=True)
    assert json.loads(stored["recipe"])["alpha"] == world.recipe.alpha * 2


def test_policy_starts_from_pi0(world):
    policy = make_policy("transformer", world)
    assert all(torch.equal(policy.state_dict()[k], world.pretrained_state[k]) for k in world.pretrained_state)
    with pytest.raises(ValueError, match="differs from the world's pretrained"):
        make_policy("transformer", world, d_model=32)
    fresh = make_policy("transformer", world, init="random", d_model=16, num_heads=2, num_layers=1)
    assert not all(torch.equal(fresh.state_dict()[k], world.pretrained_state[k]) for k in world.pretrained_state)


def test_bad_recipe_values_name_the_valid_range(cache):
    with pytest.raises(ValueError, match="vocab_size=20 is too small"):
        make_world("synthetic_lm", cache_dir=str(cache), **{**TINY, "vocab_size": 20, "num_keys": 10})
    with pytest.raises(ValueError, match="delta"):
        make_world("synthetic_lm", cache_dir=str(cache), **{**TINY, "delta": 1.5})


# ------------------------------------------------------------------------------------------ Gymnasium, CLI
def test_gymnasium_env(cache):
    env = gym.make("offpolicylab/SyntheticLM-v0", cache_dir=str(cache), **TINY)
    check_env(env.unwrapped, skip_render_check=True)
    env = env.unwrapped
    _, info = env.reset(seed=0, options={"prompt_index": 2})
    world = env.world
    key = int(world.prompt_keys[2])
    response = _teacher_greedy_text(world, world.prompt_tokens[2])[0].tolist()
    response[-2:] = [ANS, int(world.table[key])]
    rewards = [env.step(token)[1] for token in response]
    assert rewards == [0.0] * (len(response) - 1) + [1.0]


def test_cli_run_trains_with_the_world_defaults(cache, tmp_path, capsys):
    args = ["run", "--world", "synthetic_lm", "--objective", "grpo", "--updates", "2", "--eval-every", "1",
            "--prompts-per-update", "2", "--group-size", "4", "--out", str(tmp_path / "run"),
            "--world-param", f"cache_dir={cache}"]
    args += [x for k, v in TINY.items() for x in ("--world-param", f"{k}={v}")]
    assert cli.main(args) == 0
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    for key, value in world_train_defaults("synthetic_lm", TINY).items():
        if key not in ("prompts_per_update", "group_size"):
            assert config[key] == value, key
    assert config["prompts_per_update"] == 2  # a flag that was given wins
    assert (tmp_path / "run" / "metrics.csv").read_text().count("\n") == 3


# ------------------------------------------------------------------------------------------ calibration measurements
def test_pi0_profile_shares_against_numpy(world):
    from offpolicylab.synthetic_lm_calibration import policy_token_profile

    policy = world.pretrained_policy()
    profile = policy_token_profile(world, policy, samples_per_prompt=2, seed=3)
    rollout = policy.sample(world._prompts(torch.arange(world.num_prompts)), 2, 1.0, torch.Generator().manual_seed(3))
    with torch.no_grad():
        logits = policy.response_logits(rollout.prompt_ids, rollout.prompt_mask, rollout.prompt_index,
                                        rollout.response_ids).double().numpy()
    logp = logits - logits.max(-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    entropy = -(np.exp(logp) * logp).sum(-1)
    sampled = np.take_along_axis(logp, rollout.response_ids.numpy()[..., None], -1)[..., 0]
    assert profile["n_tokens"] == entropy.size
    assert profile["share_entropy_below_0.1"] == pytest.approx(float((entropy < 0.1).mean()), abs=1e-9)
    assert profile["share_entropy_at_least_1"] == pytest.approx(float((entropy >= 1.0).mean()), abs=1e-9)
    assert profile["share_sampled_prob_below_1e-3"] == pytest.approx(float((sampled < np.log(1e-3)).mean()),
                                                                     abs=1e-9)
    assert profile["median_entropy"] == pytest.approx(float(np.median(entropy)), abs=1e-5)
    assert profile["share_entropy_below_0.01"] == pytest.approx(float((entropy < 0.01).mean()), abs=1e-9)
    ordered = np.sort(entropy.ravel())  # the 0.8 quantile by linear interpolation between order statistics
    rank = 0.8 * (ordered.size - 1)
    below = int(np.floor(rank))
    expected = ordered[below] + (rank - below) * (ordered[min(below + 1, ordered.size - 1)] - ordered[below])
    assert profile["entropy_p80"] == pytest.approx(float(expected), abs=1e-5)


def test_pi0_temperature_divides_the_distilled_students_logits(cache, world):
    """π₀ = softmax(z / t_π₀): the same distilled student (the recipe differs only in t_π₀), logits at t = 0.5 are
    twice those at t = 1 on any response (checked on random ones, so not only where π₀ samples)."""
    plain = make_world("synthetic_lm", cache_dir=str(cache), **{**TINY, "pi0_temperature": 1.0})
    sharp = make_world("synthetic_lm", cache_dir=str(cache), **{**TINY, "pi0_temperature": 0.5})
    prompts = plain._prompts(torch.arange(6))
    response = torch.randint(plain.vocab_size, (6, plain.max_response_len), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        z_plain, z_sharp = (w.pretrained_policy().response_logits(prompts.ids, prompts.mask, prompts.index, response)
                            for w in (plain, sharp))
    assert torch.allclose(z_sharp, 2.0 * z_plain, atol=1e-5)
    assert sharp.threshold > plain.threshold  # θ is π₀'s own 1st percentile: a sharper π₀ scores higher


def test_update_kl_is_the_exact_kl_between_consecutive_policies(cache):
    from offpolicylab.config import TrainConfig
    from offpolicylab.synthetic_lm_calibration import update_kls

    params = {**TINY, "cache_dir": str(cache)}
    config = TrainConfig.from_dict({"world": "synthetic_lm", "world_params": params, "objective": "grpo",
                                    "prompts_per_update": 2, "group_size": 4, "lr": 1e-3, "updates": 3})
    kls = update_kls(config)
    assert len(kls) == 3 and all(k >= -1e-9 for k in kls) and max(kls) > 0  # KL >= 0 up to rounding
    small = update_kls(TrainConfig.from_dict({**config.to_dict(), "lr": 1e-6}))
    assert max(small) < min(k for k in kls if k > 0)  # a step 1000x smaller moves the policy far less


@pytest.mark.parametrize("changes", [{}, {"objective_params": {"kl_coef": 0.5}},
                                     {"objective": "decoupled_ppo", "schedule": "stale_k:1"}])
def test_calibration_updates_are_a_training_runs_updates(cache, tmp_path, changes):
    """The calibration tool observes a training run (its hook leaves the training untouched): after u updates its
    policy is bit for bit the policy a training run of the same configuration checkpoints after u updates (also with
    a KL penalty, which needs π_0's log-probs, and decoupled PPO, which needs π_prox), and KL_0 equals the KL between
    π_0 and that checkpoint's policy, computed here from the two policies' logits on the first consumed batch."""
    from offpolicylab import trainer
    from offpolicylab.build import build
    from offpolicylab.config import TrainConfig
    from offpolicylab.run_dir import RunDir
    from offpolicylab.synthetic_lm_calibration import measured_updates

    class FirstBatch(trainer.UpdateHook):
        def on_batch(self, update, stack, rollouts):
            if update == 0:
                (self.rollout,) = rollouts

    params = {**TINY, "cache_dir": str(cache)}
    config = TrainConfig.from_dict({"world": "synthetic_lm", "world_params": params, "objective": "grpo",
                                    "prompts_per_update": 2, "group_size": 4, "lr": 1e-3, "updates": 3,
                                    "eval_every": 1, **changes})
    run, kls = measured_updates(config)
    trainer.train(config, tmp_path / "three")
    for name, value in RunDir(tmp_path / "three").load_checkpoint()["policy"].items():
        assert torch.equal(run.policy.state_dict()[name], value), name
    first = FirstBatch()
    trainer.train(replace(config, updates=1), tmp_path / "one", hooks=[first])
    fresh, batch = build(config), first.rollout  # π_0, and the batch update 0 consumed
    logits = [fresh.policy.response_logits(batch.prompt_ids, batch.prompt_mask, batch.prompt_index,
                                           batch.response_ids).double().log_softmax(-1).detach()]
    fresh.policy.load_state_dict(RunDir(tmp_path / "one").load_checkpoint()["policy"])
    logits.append(fresh.policy.response_logits(batch.prompt_ids, batch.prompt_mask, batch.prompt_index,
                                                batch.response_ids).double().log_softmax(-1).detach())
    kl = (logits[0].exp() * (logits[0] - logits[1])).sum(-1)
    assert kls[0] == pytest.approx(float((kl * batch.response_mask).sum() / batch.response_mask.sum()), rel=1e-12)


# ------------------------------------------------------------------ the shipped recipes against the real-LM profiles
def test_seed_scale_world_has_a_reasoning_llms_token_entropies(tmp_path, capsys):
    """The ``seed_scale`` recipe's (v5, the default before v7) π₀ — the copy shipped with the package — has the token entropies of a
    reasoning LLM's chain of thought: 45–60 % of its temperature-1 tokens below 0.01 nat and the 80th percentile in
    [0.5, 0.85] nat (Qwen3-8B: over 50 % and 0.672 nat, Wang et al. 2025, arXiv:2506.01939), a rare-token tail
    (sampled π(y) < 1e-3) kept, and the answer digit (where the reward is decided) a fork; printed beside Qwen3-8B's
    published numbers and SmolLM2-135M's measured profile."""
    from offpolicylab.profile_files import load_profile
    from offpolicylab.synthetic_lm_calibration import (
        SEED_SCALE_TARGETS,
        seed_scale_table,
        world_profile_document,
    )
    from offpolicylab.worlds.synthetic_lm import PACKAGED_DIR, read_cached

    shipped = PACKAGED_DIR / f"{Recipe().digest()[:32]}.pt"
    assert read_cached(shipped, Recipe()) is not None, f"{shipped} must hold recipe v5's π₀"
    world = make_world("synthetic_lm", preset="seed_scale", cache_dir=str(tmp_path))  # the shipped copy is used
    assert not any(tmp_path.iterdir()), "the shipped π₀ must be found without a build"
    pi0 = world.pretrained_policy()
    print(seed_scale_table(world, pi0))
    stats = world_profile_document(world, pi0)["profile"]
    assert SEED_SCALE_TARGETS == {"share_entropy_below_0.01": (0.45, 0.60), "entropy_p80": (0.5, 0.85)}
    qwen = load_profile("qwen3_8b_cot")["profile"]  # the published numbers the ranges are drawn around
    assert (qwen["share_entropy_below_0.01"], qwen["entropy_p80"]) == (0.5064, 0.672)
    assert 0.45 <= stats["share_entropy_below_0.01"] <= 0.60
    assert 0.5 <= stats["entropy_p80"] <= 0.85
    assert stats["share_sampled_prob_below_1e-3"] >= 1e-3
    rollout = pi0.sample(world.eval_prompts(), 16, 1.0, torch.Generator().manual_seed(0))
    with torch.no_grad():
        _, entropy = pi0.score(rollout)
    answered = rollout.response_ids[:, -2] == ANS
    assert float(entropy[answered, -1].mean()) > 1.0  # the answer digit stays a fork (nats, over 10 digits)


def test_smollm2_preset_matches_the_committed_smollm2_profile(tmp_path, capsys):
    """The ``smollm2`` preset's π₀ (shipped with the package) has each headline share of the committed
    SmolLM2-135M-Instruct GSM8k profile within ± 5 points (16,384 temperature-1 tokens)."""
    from offpolicylab.diagnostics.profile import SHARE_KEYS, compare_profiles, format_comparison
    from offpolicylab.profile_files import load_profile
    from offpolicylab.synthetic_lm_calibration import policy_token_profile
    from offpolicylab.worlds.synthetic_lm import PACKAGED_DIR, PRESETS, read_cached

    recipe = PRESETS["smollm2"]
    assert (recipe.alpha, recipe.delta, recipe.pi0_temperature) == (7.0, 0.125, 1.0)
    shipped = PACKAGED_DIR / f"{recipe.digest()[:32]}.pt"
    assert read_cached(shipped, recipe) is not None, f"{shipped} must hold the smollm2 preset's π₀"
    world = make_world("synthetic_lm", preset="smollm2", cache_dir=str(tmp_path))
    assert world.recipe == recipe and not any(tmp_path.iterdir()), "the shipped π₀ must be found without a build"
    reference = load_profile("smollm2_135m_instruct_gsm8k")
    rows = compare_profiles(reference, policy_token_profile(world, world.pretrained_policy()))
    print(format_comparison(rows, names=("SmolLM2-135M", "synthetic_lm π₀ (smollm2 preset)")))
    checked = {row.name: row for row in rows if row.within is not None}
    assert set(checked) == set(SHARE_KEYS)
    for row in checked.values():
        assert abs(row.candidate - row.reference) <= 0.05, (row.name, row.reference, row.candidate)


def test_a_preset_is_overridden_by_the_parameters_given(cache):
    shape = {k: v for k, v in TINY.items() if k not in ("alpha", "delta", "preset")}
    world = make_world("synthetic_lm", preset="smollm2", cache_dir=str(cache), **{**shape, "alpha": 3.0})
    assert (world.recipe.alpha, world.recipe.delta, world.recipe.pi0_temperature) == (3.0, 0.125, 1.0)
    assert (Recipe().alpha, Recipe().delta, Recipe().pi0_temperature) == (64.0, 0.0, 0.8)  # preset seed_scale
    with pytest.raises(ValueError, match="preset"):
        make_world("synthetic_lm", cache_dir=str(cache), **{**TINY, "preset": "qwen"})


# ------------------------------------------------------------------------------------------ drift calibration
def test_choose_lr_by_the_clip_fraction_windows():
    """The rule fixed before any stale run, on hand-made clip fractions (targets √(0.07 %·0.05 %) = 0.0592 % and
    √(0.66 %·1.22 %) = 0.897 %, worked out by hand)."""
    from offpolicylab.synthetic_lm_calibration import S0_TARGET, STALE_TARGET, choose_lr

    assert S0_TARGET == pytest.approx(5.916e-4, rel=1e-3) and STALE_TARGET == pytest.approx(8.973e-3, rel=1e-3)
    # both windows met by 2e-4 (distances 0.169, 0.003) and 4e-4 (0.707, 0.80): the smaller larger-distance wins
    rows = [{"lr": 1e-4, "s0": 2e-4, "s256": 4e-3}, {"lr": 2e-4, "s0": 5e-4, "s256": 9e-3},
            {"lr": 4e-4, "s0": 1.2e-3, "s256": 2e-2}]
    assert choose_lr(rows) == (2e-4, "both windows met")
    # no s = 0 value in [0.03 %, 0.15 %]: the stale window decides, |log(0.5 / 0.897)| = 0.58 > |log(1.5 / 0.897)| = 0.51
    rows = [{"lr": 1e-4, "s0": 2e-3, "s256": 2e-3}, {"lr": 2e-4, "s0": 3e-3, "s256": 5e-3},
            {"lr": 4e-4, "s0": 5e-3, "s256": 1.5e-2}]
    assert choose_lr(rows) == (4e-4, "no rate meets both windows; the stale window decides")
    rows = [{"lr": 1e-4, "s0": 2e-3, "s256": 0.05}, {"lr": 2e-4, "s0": 3e-3, "s256": 0.2}]
    assert choose_lr(rows) == (1e-4, "no rate meets the stale window; closest stale clip fraction")


def test_drift_grid_is_eps_clipped_grpo_at_the_papers_two_staleness_settings():
    from offpolicylab.grid import expand_grid
    from offpolicylab.synthetic_lm_calibration import drift_grid

    cells = expand_grid(drift_grid([1e-4, 3e-4], updates=300), "/nowhere")
    assert [(c.config["lr"], c.config["schedule"]) for c in cells] == [
        (1e-4, "stages:4"), (1e-4, "stale_k:256"), (3e-4, "stages:4"), (3e-4, "stale_k:256")]
    assert all(c.config["objective"] == "grpo" and c.config["objective_params"] == {"eps_low": 0.2, "eps_high": 0.2}
               and c.config["updates"] == 300 for c in cells)


def test_a_recipe_checks_its_fields_with_the_registered_world_parameters() -> None:
    """One source of truth: every recipe field a user may set is checked by the Param the world registers, so a value
    the command line refuses (alpha = 0: the teacher needs a positive sharpness) is refused by Recipe too."""
    from offpolicylab.worlds import WORLDS
    from offpolicylab.worlds.synthetic_lm import RECIPE_PARAMS

    registered = WORLDS.params("synthetic_lm")
    assert all(registered[name] is param for name, param in RECIPE_PARAMS.items())
    for name, bad in (("alpha", 0.0), ("delta", 1.0), ("pi0_temperature", 0.01), ("ans_prob", 0.0),
                      ("response_len", 2), ("distill_batch", 0), ("seed", -1)):
        with pytest.raises(ValueError, match=f"parameter {name}=.* valid:"):
            Recipe(**{name: bad})
        with pytest.raises(ValueError, match=f"{name}"):
            registered[name].validate(name, bad)
