"""A small causal transformer policy (GPT-style, pre-LayerNorm, learned positions) with key/value-cached sampling.

    h⁰_i  = E[s_i] + P[p_i]                       s = [prompt, y_1 … y_{T−1}],  p_i = real tokens before i
    hˡ_i  = hˡ⁻¹_i + MHA(LN(hˡ⁻¹))_i,  then + MLP(LN(·))_i        causal, padding keys masked   (l = 1 … L)
    π_θ(y_t | x, y_{<t}) = softmax(W LN(hᴸ_{P−1+t}) + b)

(Radford et al. 2019, GPT-2; Vaswani et al. 2017, arXiv:1706.03762.)  The last prompt position predicts the first
response token, so no BOS symbol is needed.  Prompts are left-padded; padded positions are never attended to and
positions count real tokens only, so padding does not change the numbers.

Two code paths compute the same logits:

- **scoring** (:meth:`TransformerPolicy.response_logits`): one teacher-forced pass over ``[prompt, y_{<T}]``;
- **sampling** (:meth:`TransformerPolicy.next_logits`): the prompt is encoded once ("prefill") and its per-layer
  keys/values are kept in a :class:`KVCache`; every new token then runs one position through the network and
  attends to the cache, O(L) instead of O(L²) per token.  Tests check the two agree within 1e-5.

:class:`CausalTransformer` is also the synthetic-LM world's random teacher network (``offpolicylab.worlds.synthetic_lm``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from offpolicylab.policies.autoregressive import ModulePolicy


@dataclass(frozen=True)
class TransformerShape:
    """Sizes of a :class:`CausalTransformer` (``input_vocab`` input symbols, ``output_vocab`` logits)."""

    input_vocab: int
    output_vocab: int
    max_len: int
    d_model: int = 64
    num_layers: int = 2
    num_heads: int = 4
    mlp_ratio: int = 4

    def __post_init__(self) -> None:
        for name in ("input_vocab", "output_vocab", "max_len", "d_model", "num_layers", "num_heads", "mlp_ratio"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model={self.d_model} must be divisible by num_heads={self.num_heads}")


@dataclass
class KVCache:
    """Per-layer keys and values ``[B, H, L, d_head]`` of the positions seen so far, their padding mask ``[B, L]``
    (True = real) and the position id the next token gets ``[B]``."""

    keys: list[Tensor] = field(default_factory=list)
    values: list[Tensor] = field(default_factory=list)
    real: Tensor | None = None
    next_position: Tensor | None = None


class _Block(nn.Module):
    """Pre-LN block: h + MHA(LN h), then + MLP(LN h) (GELU)."""

    def __init__(self, shape: TransformerShape) -> None:
        super().__init__()
        d = shape.d_model
        self.heads = shape.num_heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, shape.mlp_ratio * d), nn.GELU(), nn.Linear(shape.mlp_ratio * d, d))

    def forward(self, h: Tensor, allowed: Tensor | None,
                past: tuple[Tensor, Tensor] | None) -> tuple[Tensor, Tensor, Tensor]:
        """``h`` [B, L, d] new positions; ``allowed`` [B, L, L_past + L] which keys each query may read (None: all);
        returns (h', keys, values) with the keys/values of past and new positions."""
        batch, length, d = h.shape
        q, k, v = self.qkv(self.norm1(h)).split(d, dim=-1)
        q, k, v = (x.reshape(batch, length, self.heads, d // self.heads).transpose(1, 2) for x in (q, k, v))
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // self.heads)
        if allowed is not None:
            scores = scores.masked_fill(~allowed[:, None], float("-inf"))
        attended = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(batch, length, d)
        h = h + self.out(attended)
        return h + self.mlp(self.norm2(h)), k, v


class CausalTransformer(nn.Module):
    """Token + position embeddings → ``num_layers`` pre-LN blocks → final LayerNorm (see module docstring);
    :meth:`forward` gives the normalised hidden states, ``head`` the logits."""

    def __init__(self, shape: TransformerShape) -> None:
        super().__init__()
        self.shape = shape
        self.token = nn.Embedding(shape.input_vocab, shape.d_model)
        self.position = nn.Embedding(shape.max_len, shape.d_model)
        self.blocks = nn.ModuleList(_Block(shape) for _ in range(shape.num_layers))
        self.norm = nn.LayerNorm(shape.d_model)
        self.head = nn.Linear(shape.d_model, shape.output_vocab)

    def forward(self, tokens: Tensor, real: Tensor, cache: KVCache | None = None) -> Tensor:
        """Hidden states [B, L, d] of ``tokens`` [B, L] (``real`` [B, L] bool, False = padding).

        With ``cache`` the tokens continue the cached positions (their keys/values are appended to it); an empty
        cache is filled from scratch."""
        length = tokens.shape[1]
        if cache is not None and cache.real is not None:
            past_real, start = cache.real, cache.next_position
        else:
            past_real, start = real[:, :0], torch.zeros(tokens.shape[0], dtype=torch.long, device=tokens.device)
        positions = start[:, None] + real.long().cumsum(1) - real.long()
        if int(positions.max()) >= self.shape.max_len:
            raise ValueError(f"sequence of {int(positions.max()) + 1} positions exceeds max_len {self.shape.max_len}")
        keys_real = torch.cat([past_real, real], dim=1)
        past_len = past_real.shape[1]
        allowed: Tensor | None = None  # None: every key may be read (one new position, no padding anywhere)
        if length > 1 or not bool(keys_real.all()):
            causal = torch.ones(length, past_len + length, dtype=torch.bool, device=tokens.device).tril(past_len)
            allowed = causal[None] & keys_real[:, None, :]
            allowed = allowed | ~allowed.any(-1, keepdim=True)  # a query with nothing to read (padding) reads all
        h = self.token(tokens) + self.position(positions)
        fresh = cache is None or not cache.keys
        keys, values = [], []
        for i, block in enumerate(self.blocks):
            h, k, v = block(h, allowed, None if fresh else (cache.keys[i], cache.values[i]))
            keys.append(k)
            values.append(v)
        if cache is not None:
            cache.keys, cache.values = keys, values
            cache.real, cache.next_position = keys_real, start + real.long().sum(1)
        return self.norm(h)


class TransformerPolicy(ModulePolicy):
    """A :class:`CausalTransformer` over prompt + response tokens (see module docstring).

    Token id ``i`` is the same symbol in prompt and response; padded prompt positions get the extra symbol
    ``max(prompt_vocab_size, vocab_size)``.  ``seed`` makes the initial weights reproducible (a private RNG);
    ``state`` (a :meth:`state_dict`) starts the policy from given weights, e.g. a world's pretrained π₀."""

    def __init__(self, vocab_size: int, response_len: int, eos_id: int | None = None,
                 prompt_vocab_size: int | None = None, max_prompt_len: int = 16, d_model: int = 64,
                 num_layers: int = 2, num_heads: int = 4, sampler_noise_std: float = 0.0, seed: int = 0,
                 state: dict[str, Tensor] | None = None) -> None:
        self._init_common(vocab_size, response_len, eos_id, sampler_noise_std)
        prompt_vocab_size = vocab_size if prompt_vocab_size is None else int(prompt_vocab_size)
        if max_prompt_len < 1:
            raise ValueError(f"max_prompt_len must be >= 1, got {max_prompt_len}")
        self.pad_token = max(prompt_vocab_size, self.vocab_size)
        self.max_prompt_len = int(max_prompt_len)
        self.shape = TransformerShape(self.pad_token + 1, self.vocab_size, self.max_prompt_len + self.response_len,
                                      d_model, num_layers, num_heads)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.model = CausalTransformer(self.shape)
        if state is not None:
            self.load_state_dict(state)

    # ------------------------------------------------------------------------------------------ scoring
    def response_logits(self, prompt_ids: Tensor, prompt_mask: Tensor, prompt_index: Tensor,
                        response_ids: Tensor) -> Tensor:
        """Logits [B, T, V] from one causal pass over ``[prompt, response[:, :-1]]``."""
        if response_ids.shape[1] != self.response_len:
            raise ValueError(f"response_ids has {response_ids.shape[1]} positions, the policy has response_len "
                             f"{self.response_len}")
        prompt, real = self._prompt(prompt_ids, prompt_mask)
        tokens = torch.cat([prompt, response_ids[:, :-1]], dim=1)
        real = torch.cat([real, torch.ones_like(response_ids[:, :-1], dtype=torch.bool)], dim=1)
        hidden = self.model(tokens, real)
        return self.model.head(hidden[:, prompt.shape[1] - 1:])

    # ------------------------------------------------------------------------------------------ KV-cached sampling
    def start_decoding(self, prompt_ids: Tensor, prompt_mask: Tensor, prompt_index: Tensor) -> KVCache:
        return KVCache()

    def next_logits(self, state: KVCache, prompt_ids: Tensor, prompt_mask: Tensor, prompt_index: Tensor,
                    response_ids: Tensor, t: int) -> Tensor:
        """t = 0: prefill the cache with the prompt; t > 0: run token y_{t−1} against the cache.  Logits [B, V]."""
        if t == 0:
            prompt, real = self._prompt(prompt_ids, prompt_mask)
            hidden = self.model(prompt, real, state)
        else:
            token = response_ids[:, t - 1: t]
            hidden = self.model(token, torch.ones_like(token, dtype=torch.bool), state)
        return self.model.head(hidden[:, -1])

    # ------------------------------------------------------------------------------------------ state
    def _prompt(self, prompt_ids: Tensor, prompt_mask: Tensor) -> tuple[Tensor, Tensor]:
        if prompt_ids.shape[1] > self.max_prompt_len:
            raise ValueError(f"prompt has {prompt_ids.shape[1]} positions, the policy has max_prompt_len "
                             f"{self.max_prompt_len}")
        real = prompt_mask > 0
        return torch.where(real, prompt_ids, torch.full_like(prompt_ids, self.pad_token)).long(), real
