"""TRL hook: OffPolicyLabGRPOTrainer trains a tiny random Llama (local tokenizer, no network) with our objectives,
and the loss it uses equals the objective evaluated on log-probs the test computes itself from the model logits."""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("trl")  # optional extra (installed here and in CI); the hook cannot exist without it

from datasets import Dataset  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402
from trl import GRPOConfig  # noqa: E402

from offpolicylab.integrations.trl import OffPolicyLabGRPOTrainer  # noqa: E402
from offpolicylab.objectives import TokenBatch, get_objective  # noqa: E402

WORDS = ["add", "one", "two", "three", "yes", "no", "is", "the", "answer"] + [str(d) for d in range(10)]


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {token: i for i, token in enumerate(["<pad>", "<s>", "</s>", "<unk>", *WORDS])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>", padding_side="left")


def tiny_model(vocab_size: int) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return LlamaForCausalLM(config)


def digit_reward(completions: list[str], **_: Any) -> list[float]:
    """Rule-based reward: share of completion words that are digits."""
    return [sum(w.isdigit() for w in c.split()) / max(len(c.split()), 1) for c in completions]


class RecordingTrainer(OffPolicyLabGRPOTrainer):
    """Keeps the inputs of every loss call so the test can recompute the loss independently."""

    def _compute_loss(self, model: torch.nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
        self.recorded_inputs = dict(inputs)
        return super()._compute_loss(model, inputs)


def make_trainer(tmp_path, objective: str, params: dict[str, Any], **config: Any) -> RecordingTrainer:
    tokenizer = tiny_tokenizer()
    dataset = Dataset.from_dict({"prompt": ["add one two", "add two three", "the answer is", "add three one"]})
    settings = dict(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=4, max_completion_length=4,
        max_steps=2, learning_rate=1e-2, temperature=1.0, report_to="none", use_cpu=True, save_strategy="no",
        logging_steps=1, seed=0, disable_tqdm=True,
    )
    args = GRPOConfig(**{**settings, **config})
    return RecordingTrainer(model=tiny_model(len(tokenizer)), reward_funcs=digit_reward, args=args,
                            train_dataset=dataset, processing_class=tokenizer, objective=objective,
                            objective_params=params)


def completion_logp(model: torch.nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
    """log π_θ(completion token) straight from the logits: position t predicts token t + 1."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    logits = model(input_ids=ids, attention_mask=attention).logits.double()
    n = inputs["completion_ids"].shape[1]
    logp = torch.log_softmax(logits[:, -n - 1 : -1], dim=-1)
    return logp.gather(-1, inputs["completion_ids"][..., None]).squeeze(-1)


def test_trl_trainer_trains_and_uses_our_objective(tmp_path) -> None:
    params = {"tau": 0.04}
    trainer = make_trainer(tmp_path, "m2po", params, num_iterations=2)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    assert trainer.state.global_step == 2
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, trainer.model.parameters(), strict=True))
    logged = {key for record in trainer.state.log_history for key in record}
    assert {"offpolicylab/m2", "offpolicylab/mask_frac"} <= logged

    inputs = trainer.recorded_inputs
    assert inputs.get("old_per_token_logps") is not None  # num_iterations = 2: TRL keeps π_old
    trainer.model.eval()
    used = trainer._compute_loss(trainer.model, inputs)
    with torch.no_grad():
        logp = completion_logp(trainer.model, inputs)
    batch = TokenBatch(logp=logp, behavior_logp=inputs["old_per_token_logps"].double(),
                       advantages=inputs["advantages"].double(), mask=inputs["completion_mask"].double())
    expected = get_objective("m2po", **params)(batch).loss
    assert used.item() == pytest.approx(expected.item(), rel=1e-4, abs=1e-6)
    assert (logp - inputs["old_per_token_logps"]).abs().max() > 0  # the check is off-policy, not a ratio of 1


def test_trl_stateful_objective_advances_once_per_optimizer_step(tmp_path) -> None:
    trainer = make_trainer(tmp_path, "ac_mispo", {"warmup": 4}, gradient_accumulation_steps=2,
                           per_device_train_batch_size=2, num_generations=2)
    trainer.train()
    assert trainer.state.global_step == 2
    assert trainer.objective.step == 2  # 4 micro-batches, 2 optimizer steps


def test_trl_bad_objective_is_a_value_error(tmp_path) -> None:
    with pytest.raises(ValueError, match="valid"):
        make_trainer(tmp_path, "m2po", {"tau": -1.0})
    with pytest.raises(ValueError, match="unknown objective"):
        make_trainer(tmp_path, "not_an_objective", {})
