"""HFPolicy on a tiny random Llama: sampling/scoring agreement, masks, LoRA-only updates, objectives, state."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")
import torch

from offpolicylab.contracts import Policy, Prompts, Rollout
from offpolicylab.objectives import TokenBatch, get_objective, list_objectives
from tests.tiny_llm import build_model, encode_prompts

pytestmark = pytest.mark.llm


@pytest.fixture
def prompts(tokenizer) -> Prompts:
    return encode_prompts(tokenizer, ["What is 2+3?", "Hi", "Add 17 and 25 please."])


def reference_logp(model, prompts: Prompts, rollout, temperature: float) -> torch.Tensor:
    """Independent check: each row alone, *unpadded* prompt + its real response tokens, plain forward."""
    out = torch.zeros_like(rollout.behavior_logp)
    for row in range(len(rollout)):
        prompt = rollout.prompt_ids[row][rollout.prompt_mask[row] > 0]
        length = int(rollout.response_mask[row].sum())
        response = rollout.response_ids[row, :length]
        ids = torch.cat([prompt, response])[None]
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1] / temperature
        out[row, :length] = torch.log_softmax(logits, -1).gather(-1, response[:, None]).squeeze(-1)
    return out


def test_policy_protocol(make_policy):
    assert isinstance(make_policy(), Policy)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampling_logp_equals_scoring_logp(make_policy, prompts, temperature):
    policy = make_policy(max_new_tokens=10, sample_micro_batch=4, score_micro_batch=5)
    _nudge_lora(policy)  # a non-zero adapter, so the check covers the LoRA path too
    rollout = policy.sample(prompts, 3, temperature, torch.Generator().manual_seed(1))
    assert rollout.response_ids.shape[0] == 9 and rollout.temperature == temperature
    logp, entropy = policy.score(rollout)
    mask = rollout.response_mask > 0
    assert logp.requires_grad
    assert (logp - rollout.behavior_logp)[mask].abs().max() <= 1e-4
    independent = reference_logp(policy.model, prompts, rollout, temperature)
    assert (logp.detach() - independent)[mask].abs().max() <= 1e-4
    assert torch.all(entropy[mask] > 0) and not entropy.requires_grad


def test_sampling_distribution_is_softmax_over_temperature(make_policy, tokenizer):
    """Empirical frequencies of the first token over 4000 draws vs softmax(z / T) of a direct forward."""
    policy = make_policy(max_new_tokens=1)
    prompts = encode_prompts(tokenizer, ["abc"])
    with torch.no_grad():
        logits = policy.model(input_ids=prompts.ids).logits[0, -1]
    probs = torch.softmax(logits / 0.8, -1)
    rollout = policy.sample(prompts, 4000, 0.8, torch.Generator().manual_seed(0))
    freq = torch.bincount(rollout.response_ids[:, 0], minlength=probs.numel()).float() / 4000
    assert 0.5 * (freq - probs).abs().sum() < 0.06
    expected = torch.log(probs[rollout.response_ids[:, 0]])
    assert torch.allclose(rollout.behavior_logp[:, 0], expected, atol=1e-5)


def test_eos_ends_response_and_padding_is_masked(make_policy, prompts, tokenizer):
    common = list(range(5, 103))  # nearly every token ends a response → many short responses
    policy = make_policy(max_new_tokens=8, eos_ids=common[::3])
    rollout = policy.sample(prompts, 8, 1.0, torch.Generator().manual_seed(3))
    eos = torch.tensor(common[::3])
    for ids, mask, blogp in zip(rollout.response_ids, rollout.response_mask, rollout.behavior_logp, strict=True):
        hits = torch.isin(ids, eos).nonzero()
        length = int(hits[0]) + 1 if len(hits) and mask[int(hits[0])] > 0 else int(mask.sum())
        assert mask[:length].eq(1).all() and mask[length:].eq(0).all()
        assert ids[length:].eq(tokenizer.pad_token_id).all() and blogp[length:].eq(0).all()
    assert rollout.response_mask.sum(1).min() < 8  # some responses did end early
    # what padding holds after EOS cannot change the scores of real tokens
    noisy = rollout.with_(response_ids=torch.where(rollout.response_mask > 0, rollout.response_ids,
                                                   torch.randint_like(rollout.response_ids, 5, 100)))
    real = rollout.response_mask > 0
    assert torch.equal(policy.score(rollout)[0][real], policy.score(noisy)[0][real])


@pytest.mark.parametrize("micro_batch", [None, 5])
def test_rows_that_end_leave_the_batch_without_changing_the_numbers(make_policy, prompts, micro_batch):
    """The sampler drops a row from the batch (and its KV cache) once it emits EOS, prefills a group's identical
    prompts once and, with micro-batches, batches rows by prompt length: the log-probs still equal an independent
    forward of each row alone, rows come back in the caller's order, and greedy tokens are each step's argmax."""
    policy = make_policy(max_new_tokens=8, eos_ids=list(range(5, 103))[::4], sample_micro_batch=micro_batch)
    _nudge_lora(policy)
    rollout = policy.sample(prompts, 4, 1.0, torch.Generator().manual_seed(2))
    lengths = rollout.response_mask.sum(1)
    assert lengths.min() < lengths.max()  # rows ended at different steps
    assert torch.equal(rollout.prompt_ids, prompts.ids.repeat_interleave(4, 0))
    mask = rollout.response_mask > 0
    independent = reference_logp(policy.model, prompts, rollout, 1.0)
    assert (rollout.behavior_logp - independent)[mask].abs().max() <= 1e-4
    assert rollout.response_ids[~mask].eq(policy.pad_id).all()
    greedy = policy.sample(prompts, 2, 1.0, torch.Generator().manual_seed(0), greedy=True)
    for row in range(len(greedy)):
        prompt = greedy.prompt_ids[row][greedy.prompt_mask[row] > 0]
        length = int(greedy.response_mask[row].sum())
        ids = torch.cat([prompt, greedy.response_ids[row, :length]])[None]
        with torch.no_grad():
            argmax = policy.model(input_ids=ids).logits[0, len(prompt) - 1:-1].argmax(-1)
        assert torch.equal(argmax, greedy.response_ids[row, :length])


def test_all_rows_finishing_stops_generation(make_policy, prompts):
    policy = make_policy(max_new_tokens=20, eos_ids=list(range(103)))  # every token is EOS
    rollout = policy.sample(prompts, 2, 1.0, torch.Generator().manual_seed(0))
    assert rollout.response_ids.shape[1] == 1 and rollout.response_mask.eq(1).all()


def test_greedy_takes_argmax(make_policy, prompts):
    policy = make_policy(max_new_tokens=4)
    a = policy.sample(prompts, 2, 1.0, torch.Generator().manual_seed(0), greedy=True)
    b = policy.sample(prompts, 2, 1.0, torch.Generator().manual_seed(99), greedy=True)
    assert torch.equal(a.response_ids, b.response_ids)
    logp, _ = policy.score(a)
    with torch.no_grad():
        full = policy.score(a)[0]
    assert torch.allclose(logp.detach(), full)
    first = policy.model(input_ids=prompts.ids[1:2][prompts.mask[1:2] > 0][None]).logits[0, -1].argmax()
    assert a.response_ids[2, 0] == first


def _nudge_lora(policy, scale: float = 0.3) -> None:
    with torch.no_grad():
        gen = torch.Generator().manual_seed(7)
        for p in policy.trainable_parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))


def scored_token_batch(policy, rollout, rewards: torch.Tensor) -> TokenBatch:
    logp, entropy = policy.score(rollout)
    groups = rollout.group_ids
    mean = torch.zeros(int(groups.max()) + 1).index_add(0, groups, rewards) / torch.bincount(groups).float()
    return TokenBatch(logp=logp, behavior_logp=rollout.behavior_logp, advantages=rewards - mean[groups],
                      mask=rollout.response_mask, rewards=rewards, group_ids=groups, entropy=entropy,
                      staleness=torch.zeros(len(rollout)))


def test_only_lora_parameters_change_in_a_step(make_policy, prompts):
    policy = make_policy(max_new_tokens=6)
    names = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    rollout = policy.sample(prompts, 4, 1.0, torch.Generator().manual_seed(0))
    rewards = torch.linspace(0, 1, len(rollout))
    optimizer = torch.optim.SGD(policy.trainable_parameters(), lr=0.5)
    get_objective("grpo")(scored_token_batch(policy, rollout, rewards)).loss.backward()
    optimizer.step()
    changed = {n for n, p in policy.model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lora_" in n for n in changed)
    assert any("lora_B" in n for n in changed)


@pytest.mark.parametrize("name", list_objectives())
def test_every_objective_runs_a_step(make_policy, prompts, name):
    policy = make_policy(max_new_tokens=5)
    rollout = policy.sample(prompts, 4, 1.0, torch.Generator().manual_seed(0))
    rewards = (torch.arange(len(rollout)) % 3 == 0).float()
    objective = get_objective(name)
    batch = scored_token_batch(policy, rollout, rewards)
    if objective.needs_prox:  # π_prox at the batch's first consumption: the current policy, as the trainer does
        batch = batch.replace(prox_logp=batch.logp.detach())
    if objective.stateful:
        objective.update(batch)
    out = objective(batch)
    assert torch.isfinite(out.loss)
    out.loss.backward()
    grads = [p.grad for p in policy.trainable_parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)


def test_score_recompute_and_gradient_checkpointing_give_the_same_gradients(make_policy, prompts):
    def grads(plan: float | None = None, **kwargs):
        policy = make_policy(max_new_tokens=6, **kwargs)
        if plan is not None:  # the policy's own plan for 6 rows with memory for 3.5 rows: 1 row per forward
            chosen = policy.plan_scoring(6, prompts.ids.shape[1], available=int(plan * policy.score_row_bytes(
                prompts.ids.shape[1], 6)))
            assert (chosen.micro_batch, chosen.recompute) == (1, True)
        _nudge_lora(policy)
        rollout = policy.sample(prompts, 2, 1.0, torch.Generator().manual_seed(0))
        logp, _ = policy.score(rollout)
        (logp * rollout.response_mask).sum().backward()
        return rollout, [p.grad.clone() for p in policy.trainable_parameters()]

    base_rollout, base = grads()
    for kwargs in ({"score_recompute": True, "score_micro_batch": 2}, {"score_micro_batch": 4},
                   {"gradient_checkpointing": True}, {"plan": 3.5}):
        rollout, other = grads(**kwargs)
        assert torch.equal(rollout.response_ids, base_rollout.response_ids)
        assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-4) for a, b in zip(base, other, strict=True))


def test_score_row_bytes_is_activations_plus_logits(make_policy, tokenizer):
    """tiny_llm's Llama: L = 2 layers, d = 32, d_ff = 64, fp32; per token a LoRA layer keeps 11 d + 7 d_ff numbers
    (= 800), with gradient checkpointing only its input d per layer plus one layer (= 2·32 + 800 = 864); the
    response's logits cost 4 fp32 copies of the vocabulary per token."""
    vocab = len(tokenizer)
    assert make_policy().score_row_bytes(30, 10) == 40 * 2 * 800 * 4 + 4 * 10 * vocab * 4
    assert make_policy(gradient_checkpointing=True).score_row_bytes(30, 10) == 40 * 864 * 4 + 4 * 10 * vocab * 4


@pytest.mark.parametrize(("given", "memory_rows", "expected"), [
    ({}, 100.0, (8, False)),                       # 8 rows need 8 r <= 0.6 · 100 r: one forward
    ({}, 10.0, (4, True)),                         # 0.6 · 10 = 6 rows fit, less the 2 recompute holds on top: 4
    ({}, 4.0, (1, True)),                          # ⌊2.4⌋ − 2 = 0: one row, peak 3 r within all of the 4 r
    ({"score_micro_batch": 2}, 10.0, (2, True)),   # the user's micro-batch; 8 rows do not fit: recompute
    ({"score_micro_batch": 2}, 100.0, (2, False)),  # ... they do: no recompute needed
    ({"score_recompute": True}, 100.0, (8, True)),
])
def test_plan_scoring_chooses_the_micro_batch_from_the_memory(make_policy, given, memory_rows, expected):
    policy = make_policy(max_new_tokens=10, **given)
    row = policy.score_row_bytes(20, 10)
    plan = policy.plan_scoring(8, 20, available=int(memory_rows * row))
    assert (plan.micro_batch, plan.recompute) == expected
    assert (policy.score_micro_batch, policy.score_recompute) == expected
    assert plan.params() == {"score_micro_batch": expected[0], "score_recompute": expected[1]}


@pytest.mark.parametrize(("given", "memory_rows", "valid"), [
    ({}, 0.5, "valid: a shorter max_response_len"),  # not even one row
    ({"score_micro_batch": 8, "score_recompute": False}, 7.0, "valid: score_micro_batch <= 2 with score_recompute"),
    ({"score_micro_batch": 6}, 7.0, "valid: score_micro_batch <= 2 with score_recompute"),  # peak (6 + 2) r > 7 r
])
def test_plan_scoring_refuses_what_cannot_fit(make_policy, given, memory_rows, valid):
    policy = make_policy(max_new_tokens=10, **given)
    with pytest.raises(ValueError, match=valid) as info:
        policy.plan_scoring(8, 20, available=int(memory_rows * policy.score_row_bytes(20, 10)))
    assert "8 responses of up to 20 + 10 tokens" in str(info.value) and "\n" not in str(info.value)


def test_adapter_disabled_is_the_base_model(make_policy, prompts, tokenizer):
    policy = make_policy(max_new_tokens=6)
    _nudge_lora(policy)
    rollout = policy.sample(prompts, 2, 1.0, torch.Generator().manual_seed(0))
    plain = build_model(len(tokenizer), seed=0)  # same seed: the weights the adapter was put on
    expected = reference_logp(plain, prompts, rollout, 1.0)
    mask = rollout.response_mask > 0
    base = policy.initial_policy()
    assert base.trainable_parameters() == [] and base.state_dict() == {}
    assert (base.score(rollout)[0].detach() - expected)[mask].abs().max() <= 1e-4
    with policy.adapter_disabled():
        assert (policy.score(rollout)[0].detach() - expected)[mask].abs().max() <= 1e-4
    assert (policy.score(rollout)[0].detach() - expected)[mask].abs().max() > 1e-3  # adapter back on
    from_base = base.sample(prompts, 2, 1.0, torch.Generator().manual_seed(0))
    assert (reference_logp(plain, prompts, from_base, 1.0) - from_base.behavior_logp).abs().max() <= 1e-4


def test_adapter_state_and_safetensors_round_trip(make_policy, prompts, tmp_path):
    policy = make_policy(max_new_tokens=6)
    _nudge_lora(policy)
    state = policy.state_dict()
    assert state and all("lora_" in k for k in state)
    rollout = policy.sample(prompts, 2, 1.0, torch.Generator().manual_seed(0))
    expected = policy.score(rollout)[0].detach()
    directory = policy.save_adapter(tmp_path / "adapter")
    assert (directory / "adapter_model.safetensors").is_file()

    fresh = make_policy(max_new_tokens=6)
    assert not torch.allclose(fresh.score(rollout)[0].detach(), expected)
    fresh.load_adapter(directory)
    assert torch.allclose(fresh.score(rollout)[0].detach(), expected, atol=1e-6)
    other = make_policy(max_new_tokens=6)
    other.load_state_dict(state)
    assert all(torch.equal(v, other.state_dict()[k]) for k, v in state.items())
    with pytest.raises(ValueError, match="missing"):
        other.load_state_dict({k: v for k, v in list(state.items())[1:]})
    with pytest.raises(ValueError, match="adapter_model.safetensors"):
        other.load_adapter(tmp_path / "nothing")


def test_bad_arguments_raise(make_policy, prompts):
    policy = make_policy()
    with pytest.raises(ValueError, match="temperature"):
        policy.sample(prompts, 2, 0.0, torch.Generator())
    with pytest.raises(ValueError, match="group_size"):
        policy.sample(prompts, 0, 1.0, torch.Generator())
    with pytest.raises(ValueError, match="lora_r"):
        make_policy(lora=__import__("offpolicylab.policies.hf", fromlist=["LoraSpec"]).LoraSpec(r=0))


@pytest.fixture
def four_bit_policy(tokenizer, tmp_path):
    """A 4-bit NF4 tiny Llama (bitsandbytes' CPU 4-bit kernels need in_features >= its block size 64: hidden 64)
    with a LoRA adapter whose B is non-zero, so that every LoRA parameter gets a gradient."""
    pytest.importorskip("bitsandbytes")
    from offpolicylab.policies.hf import HFPolicy, LoraSpec
    from offpolicylab.policies.hf_loading import load_model_and_tokenizer

    build_model(len(tokenizer), seed=0, hidden=64).save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    model, tok = load_model_and_tokenizer(str(tmp_path / "tiny"), load_in_4bit=True)
    assert any(type(m).__name__ == "Linear4bit" for m in model.modules())
    policy = HFPolicy(model, tok, lora=LoraSpec(r=4, alpha=8.0), max_new_tokens=5, quantized=True)
    _nudge_lora(policy, scale=0.1)
    return policy


def test_four_bit_path_runs_on_cpu(four_bit_policy, prompts):
    policy = four_bit_policy
    rollout = policy.sample(prompts, 2, 1.0, torch.Generator().manual_seed(0))
    logp, _ = policy.score(rollout)
    mask = rollout.response_mask > 0
    assert (logp - rollout.behavior_logp)[mask].abs().max() <= 1e-4
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    optimizer = torch.optim.SGD(policy.trainable_parameters(), lr=0.5)
    get_objective("grpo")(scored_token_batch(policy, rollout, torch.linspace(0, 1, len(rollout)))).loss.backward()
    optimizer.step()
    changed = {n for n, p in policy.model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lora_" in n for n in changed)


def test_four_bit_gradients_are_the_same_after_sampling(four_bit_policy, prompts):
    """bitsandbytes repacks 4-bit weights for a CPU inference kernel without backward on the first eval-mode no-grad
    forward; the LoRA gradients of one fixed rollout must be the same before and after sampling."""
    policy = four_bit_policy
    gen = torch.Generator().manual_seed(1)
    ids = prompts.ids.repeat_interleave(2, 0)
    response = torch.randint(10, 60, (ids.shape[0], 6), generator=gen)
    rollout = Rollout(prompt_ids=ids, prompt_mask=prompts.mask.repeat_interleave(2, 0), response_ids=response,
                      response_mask=torch.ones(response.shape), behavior_logp=torch.zeros(response.shape),
                      group_ids=torch.arange(3).repeat_interleave(2), prompt_index=torch.arange(3).repeat_interleave(2))
    weights = torch.randn(response.shape, generator=gen)

    def gradients() -> list[torch.Tensor]:
        policy.model.zero_grad(set_to_none=True)
        logp, _ = policy.score(rollout)
        (logp * weights).sum().backward()
        return [p.grad.clone() for p in policy.trainable_parameters()]

    first = gradients()
    assert all(g.abs().sum() > 0 for g in first)
    policy.sample(prompts, 2, 1.0, torch.Generator().manual_seed(0))
    policy.greedy(prompts)
    second = gradients()
    for a, b in zip(first, second, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7)


def test_offline_hub_id_fails_with_a_clear_message(monkeypatch):
    import huggingface_hub.constants

    from offpolicylab.policies.hf_loading import load_model_and_tokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ValueError, match="pass a local model"):
        load_model_and_tokenizer("no-such-org/no-such-model-xyz")
    with pytest.raises(ValueError, match="no such GGUF"):
        load_model_and_tokenizer("/nonexistent/model.gguf")


def test_convert_gguf_writes_a_plain_model_directory(tmp_path, capsys):
    """A tiny GGUF written in the test: the converted directory has no GGUF quantization entry, gives the same
    logits as the GGUF loaded directly, and its tokenizer encodes, templates and ends responses the same way."""
    import json

    from offpolicylab import cli
    from offpolicylab.policies.hf_loading import load_model_and_tokenizer
    from tests.tiny_llm import write_tiny_gguf

    pytest.importorskip("gguf")
    gguf_path = tmp_path / "tiny.gguf"
    write_tiny_gguf(str(gguf_path))
    assert cli.main(["convert-gguf", str(gguf_path), str(tmp_path / "plain")]) == 0
    assert "quantization_config" not in json.loads((tmp_path / "plain" / "config.json").read_text())
    original, original_tok = load_model_and_tokenizer(str(gguf_path))
    plain, plain_tok = load_model_and_tokenizer(str(tmp_path / "plain"))
    assert not (tmp_path / "plain" / "tiny.gguf").exists()
    messages = [{"role": "user", "content": "What is 12 + 30? Think."}]
    text = original_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert plain_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == text
    ids = original_tok(text)["input_ids"]
    assert plain_tok(text)["input_ids"] == ids and "<|im_start|>" in plain_tok.convert_ids_to_tokens(ids)
    assert plain_tok.eos_token == original_tok.eos_token == "<|im_end|>"
    with torch.no_grad():
        expected = original(input_ids=torch.tensor([ids])).logits
        torch.testing.assert_close(plain(input_ids=torch.tensor([ids])).logits, expected, rtol=0, atol=0)
    with pytest.raises(SystemExit) as exit_info:  # an existing, non-empty OUT is refused
        cli.main(["convert-gguf", str(gguf_path), str(tmp_path / "plain")])
    assert exit_info.value.code == 2 and "not an empty directory" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["convert-gguf", str(tmp_path / "plain" / "config.json"), str(tmp_path / "other")])
    assert not (tmp_path / "other").exists()


# ------------------------------------------------------------------------------------------ reduced-precision sampler
def _mean_gap(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    return float(((a - b).abs() * mask).sum() / mask.sum())


def test_a_bf16_sampler_reports_a_bf16_models_numbers_and_leaves_the_fp32_weights(make_policy, prompts):
    """sampler_precision=bf16: the draws and their log-probs are those of the model converted by
    ``Module.to(bfloat16)`` (its buffers, the rotary tables, kept in float32 as the sampler keeps them) sampling
    with a bf16 softmax, bit for bit; ``behavior_logp`` holds the same numbers (the hf sampler reports its own),
    and the trainer's recompute (``behavior_logp=trainer``) puts the fp32 scoring there and keeps the sampler's
    numbers in ``sampler_logp``."""
    import copy

    from offpolicylab.behavior import resolve_behavior

    policy = make_policy(max_new_tokens=10, sampler_precision="bf16")
    _nudge_lora(policy)
    before = {name: param.detach().clone() for name, param in policy.model.named_parameters()}
    rollout = policy.sample(prompts, 3, 1.0, torch.Generator().manual_seed(4))
    reference = copy.copy(policy)
    reference.model = copy.deepcopy(policy.model).to(torch.bfloat16)
    for name, buffer in policy.model.named_buffers():
        owner, _, attr = name.rpartition(".")
        reference.model.get_submodule(owner)._buffers[attr] = buffer
    expected = reference.sample(prompts, 3, 1.0, torch.Generator().manual_seed(4))
    assert torch.equal(rollout.response_ids, expected.response_ids)
    assert torch.equal(rollout.sampler_logp, expected.sampler_logp)
    assert torch.equal(rollout.sampler_logp, rollout.behavior_logp)
    for name, param in policy.model.named_parameters():
        assert param.dtype == torch.float32 and torch.equal(param, before[name]), name
    trainer = reference_logp(policy.model, prompts, rollout, 1.0)
    assert _mean_gap(rollout.sampler_logp, trainer, rollout.response_mask) > 1e-3
    resolved = resolve_behavior(policy, rollout, "trainer")
    assert torch.equal(resolved.sampler_logp, rollout.sampler_logp)
    assert (resolved.behavior_logp - trainer).abs().max() < 1e-4
    assert torch.equal(resolve_behavior(policy, rollout, "auto").behavior_logp, rollout.sampler_logp)


def test_one_response_per_prompt_of_different_lengths_keeps_each_rows_numbers(make_policy, prompts):
    """Regression: with every row distinct (group size 1: greedy decoding, one evaluation sample per prompt) the
    prefill's rows came back in the order of torch.unique, so a row continued another row's prompt."""
    policy = make_policy(max_new_tokens=6)
    _nudge_lora(policy)
    for rollout in (policy.sample(prompts, 1, 1.0, torch.Generator().manual_seed(0)), policy.greedy(prompts)):
        assert (rollout.behavior_logp - reference_logp(policy.model, prompts, rollout, 1.0)).abs().max() < 1e-4


def test_an_fp8_sampler_strays_further_than_bf16_and_greedy_decoding_stays_fp32(make_policy, prompts):
    gaps = {}
    for precision in ("bf16", "fp8_e4m3"):
        policy = make_policy(max_new_tokens=10, sampler_precision=precision)
        _nudge_lora(policy)
        rollout = policy.sample(prompts, 3, 1.0, torch.Generator().manual_seed(5))
        gaps[precision] = _mean_gap(rollout.sampler_logp, reference_logp(policy.model, prompts, rollout, 1.0),
                                    rollout.response_mask)
        greedy = policy.greedy(prompts)
        assert greedy.sampler_logp is None
        assert (greedy.behavior_logp - reference_logp(policy.model, prompts, greedy, 1.0)).abs().max() < 1e-4
    assert 0 < gaps["bf16"] < gaps["fp8_e4m3"]


def test_a_reduced_precision_sampler_needs_a_float32_model(tokenizer):
    from offpolicylab.policies.hf import HFPolicy

    model = build_model(len(tokenizer), 0).to(torch.bfloat16)
    with pytest.raises(ValueError, match="sampler_precision=bf16 needs a float32 model .* got torch.bfloat16; valid"):
        HFPolicy(model, tokenizer, sampler_precision="bf16")
