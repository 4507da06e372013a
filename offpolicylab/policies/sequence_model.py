"""A small torch causal sequence model: embedding → GRU → linear head over the response vocabulary.

    h = GRU(E[x_1 … x_P, BOS, y_1 … y_{T−1}]),   π_θ(y_t | x, y_{<t}) = softmax(W h_{P+t} + b)

Prompt and response tokens share one embedding table (token id ``i`` means the same symbol on both sides, e.g. a
digit in the arithmetic world); ``PAD`` (left padding of prompts) and ``BOS`` get their own rows.  The head is
zero-initialised, so a fresh model is the uniform policy.  A GRU is causal by construction: the output at step t
reads only inputs ≤ t, which is what :class:`~offpolicylab.policies.autoregressive.AutoregressivePolicy` needs to
share one code path between sampling and scoring.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from offpolicylab.policies.autoregressive import AutoregressivePolicy


class _GRUCore(nn.Module):
    def __init__(self, input_vocab: int, vocab_size: int, embed_dim: int, hidden_size: int, num_layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(input_vocab, embed_dim)
        self.gru = nn.GRU(embed_dim, hidden_size, num_layers=num_layers, batch_first=True)
        self.head = nn.Linear(hidden_size, vocab_size)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, tokens: Tensor) -> Tensor:
        out, _ = self.gru(self.embed(tokens))
        return self.head(out)


class SequenceModelPolicy(AutoregressivePolicy):
    """GRU policy over prompt + response tokens (see module docstring).

    ``prompt_vocab_size``: number of distinct prompt token ids (defaults to ``vocab_size``).
    ``seed`` makes the initial weights reproducible (a private generator; global RNG untouched).
    """

    def __init__(self, vocab_size: int, response_len: int, eos_id: int | None = None,
                 prompt_vocab_size: int | None = None, embed_dim: int = 32, hidden_size: int = 64,
                 num_layers: int = 1, sampler_noise_std: float = 0.0, seed: int = 0) -> None:
        self._init_common(vocab_size, response_len, eos_id, sampler_noise_std)
        prompt_vocab_size = vocab_size if prompt_vocab_size is None else int(prompt_vocab_size)
        for name, value in (("prompt_vocab_size", prompt_vocab_size), ("embed_dim", embed_dim),
                            ("hidden_size", hidden_size), ("num_layers", num_layers)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        symbols = max(prompt_vocab_size, self.vocab_size)
        self.pad_token, self.bos_token = symbols, symbols + 1
        self.prompt_vocab_size = prompt_vocab_size
        devnull = torch.random.fork_rng(devices=[])
        with devnull:
            torch.manual_seed(seed)
            self.model = _GRUCore(symbols + 2, self.vocab_size, embed_dim, hidden_size, num_layers)

    def response_logits(self, prompt_ids: Tensor, prompt_mask: Tensor, prompt_index: Tensor,
                        response_ids: Tensor) -> Tensor:
        """Logits [B, T, V] from one GRU pass over [prompt, BOS, response[:, :-1]] (batched, no row loop)."""
        batch, width = response_ids.shape
        if width != self.response_len:
            raise ValueError(f"response_ids has {width} positions, the policy has response_len {self.response_len}")
        prompt = torch.where(prompt_mask > 0, prompt_ids, torch.full_like(prompt_ids, self.pad_token))
        bos = torch.full((batch, 1), self.bos_token, dtype=torch.long)
        tokens = torch.cat([prompt.long(), bos, response_ids[:, :-1]], dim=1)
        logits = self.model(tokens)
        return logits[:, prompt.shape[1]:]

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return list(self.model.parameters())

    def state_dict(self) -> dict[str, Any]:
        return {key: value.detach().clone() for key, value in self.model.state_dict().items()}

    def load_state_dict(self, state: dict[str, Any]) -> Any:
        try:
            return self.model.load_state_dict(state)
        except RuntimeError as error:
            raise ValueError(f"sequence-model state does not match the architecture: {error}") from None
