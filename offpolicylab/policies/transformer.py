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

``compiled = True`` runs every block through ``torch.compile`` (inductor; on the CPU it needs a C++ compiler): the
same function with fused kernels, whose results differ from eager ones by float32 rounding (tests check 1e-5) and
which cost a compilation per process (benchmarks/README.md has both sides' speed).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from offpolicylab.contracts import Rollout
from offpolicylab.policies.autoregressive import ModulePolicy, check_temperature, token_log_probs
from offpolicylab.policies.mixed_precision import (
    cast_parameters,
    check_split_k,
    check_trainer_precision,
    check_trainer_weights,
    head_logits,
    loss_scaler,
    split_k_gemms,
    trainer_autocast,
)
from offpolicylab.policies.precision import sampler_weights

SCORE_PADDINGS = ("fixed", "longest")


def check_score_padding(padding: str) -> str:
    """``padding`` if it is one of :data:`SCORE_PADDINGS`, else ``ValueError`` naming them."""
    if padding not in SCORE_PADDINGS:
        raise ValueError(f"score_padding={padding!r} is invalid; valid: {', '.join(SCORE_PADDINGS)}")
    return padding


def longest_response(mask: Tensor) -> int:
    """1 + the last position any row of ``mask`` [B, T] holds a valid token at (1 when none does)."""
    used = (mask > 0).any(0).nonzero()
    return int(used[-1]) + 1 if len(used) else 1


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
    """Per-layer key and value buffers ``[B, H, capacity, d_head]`` whose first ``length`` positions hold the
    positions seen so far (preallocated at the prompt and written in place, so a new token copies only its own
    keys/values), their padding mask ``[B, capacity]`` (True = real), the position id the next token gets ``[B]``,
    the largest position id so far and whether every position so far is real."""

    keys: list[Tensor] = field(default_factory=list)
    values: list[Tensor] = field(default_factory=list)
    real: Tensor | None = None
    next_position: Tensor | None = None
    length: int = 0
    last_position: int = -1
    all_real: bool = True


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
                cache: tuple[Tensor, Tensor, int] | None = None) -> Tensor:
        """``h`` [B, L, d] new positions; ``allowed`` [B, L, L_past + L] which keys each query may read (None: all);
        ``cache`` (key buffer, value buffer, L_past): the new keys/values are written at L_past … L_past + L − 1
        and the queries read positions 0 … L_past + L − 1 of the buffers; returns h'."""
        batch, length, d = h.shape
        q, k, v = self.qkv(self.norm1(h)).split(d, dim=-1)
        q, k, v = (x.reshape(batch, length, self.heads, d // self.heads).transpose(1, 2) for x in (q, k, v))
        if cache is not None:
            keys, values, past = cache
            keys[:, :, past:past + length], values[:, :, past:past + length] = k, v
            if past:
                k, v = keys[:, :, :past + length], values[:, :, :past + length]
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // self.heads)
        if allowed is not None:
            scores = scores.masked_fill(~allowed[:, None], float("-inf"))
        attended = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(batch, length, d)
        h = h + self.out(attended)
        return h + self.mlp(self.norm2(h))


RECOMPILE_LIMIT = 64  # graphs per compiled function: scoring with and without grad, prefill, decoding, batch sizes …


@functools.cache
def compiled_block() -> Callable[..., Tensor]:
    """``_Block.forward(block, h, allowed, cache)`` through ``torch.compile(dynamic=True)``: one compiled function
    that every block passes itself to (nothing bound to one module, so copies of a model stay independent).  A run
    needs ≈ 6–10 graphs of it (scoring with and without grad, the prompt's prefill, one-token decoding, evaluation's
    batch), so dynamo's recompile limit is raised to :data:`RECOMPILE_LIMIT` (its default, 8, would silently fall
    back to eager blocks beyond it)."""
    dynamo = torch._dynamo.config
    dynamo.recompile_limit = max(dynamo.recompile_limit, RECOMPILE_LIMIT)
    return torch.compile(_Block.forward, dynamic=True)


def check_compiled(compiled: bool, sampler_precision: str) -> bool:
    """``compiled`` itself when compiled blocks can run it, else ``ValueError``: an FP8 sampler rounds every linear
    map's input with a forward pre-hook, which a compiled block does not see, and inductor needs a C++ compiler."""
    if not compiled:
        return False
    if sampler_precision.startswith("fp8"):
        raise ValueError(f"compiled=true cannot run sampler_precision={sampler_precision} (its input rounding is a "
                         "module hook that compiled blocks skip); valid: sampler_precision fp32, bf16 or fp16, or "
                         "compiled=false")
    if not any(shutil.which(name) for name in (os.environ.get("CXX", ""), "g++", "c++", "clang++") if name):
        raise ValueError("compiled=true needs a C++ compiler (g++, c++, clang++ or $CXX) for torch.compile on the "
                         "CPU; valid: install one, or compiled=false")
    return True


class CausalTransformer(nn.Module):
    """Token + position embeddings → ``num_layers`` pre-LN blocks → final LayerNorm (see module docstring);
    :meth:`forward` gives the normalised hidden states, ``head`` the logits.  ``compiled``: run the blocks through
    :func:`compiled_block`."""

    def __init__(self, shape: TransformerShape, compiled: bool = False) -> None:
        super().__init__()
        self.shape = shape
        self.compiled = compiled
        self.token = nn.Embedding(shape.input_vocab, shape.d_model)
        self.position = nn.Embedding(shape.max_len, shape.d_model)
        self.blocks = nn.ModuleList(_Block(shape) for _ in range(shape.num_layers))
        self.norm = nn.LayerNorm(shape.d_model)
        self.head = nn.Linear(shape.d_model, shape.output_vocab)

    def forward(self, tokens: Tensor, real: Tensor, cache: KVCache | None = None) -> Tensor:
        """Hidden states [B, L, d] of ``tokens`` [B, L] (``real`` [B, L] bool, False = padding).

        With ``cache`` the tokens continue the cached positions (their keys/values are written into it); an empty
        cache is allocated and filled from scratch."""
        if cache is not None and cache.length and tokens.shape[1] == 1 and bool(real.all()):
            return self.step(tokens, cache)
        length = tokens.shape[1]
        if cache is not None and cache.length:
            past_real, start = cache.real[:, :cache.length], cache.next_position
        else:
            past_real, start = real[:, :0], torch.zeros(tokens.shape[0], dtype=torch.long, device=tokens.device)
        positions = start[:, None] + real.long().cumsum(1) - real.long()
        last_position = int(positions.max())
        if last_position >= self.shape.max_len:
            raise ValueError(f"sequence of {last_position + 1} positions exceeds max_len {self.shape.max_len}")
        keys_real = torch.cat([past_real, real], dim=1)
        past_len = past_real.shape[1]
        allowed: Tensor | None = None  # None: every key may be read (one new position, no padding anywhere)
        if length > 1 or not bool(keys_real.all()):
            causal = torch.ones(length, past_len + length, dtype=torch.bool, device=tokens.device).tril(past_len)
            allowed = causal[None] & keys_real[:, None, :]
            allowed = allowed | ~allowed.any(-1, keepdim=True)  # a query with nothing to read (padding) reads all
        h = self.token(tokens) + self.position(positions)
        if cache is None:
            for block in self.blocks:
                h = self._block(block, h, allowed)
            return self.norm(h)
        if not cache.length:
            self._allocate(cache, tokens.shape[0], length, tokens.device)
        h = self._run_cached(h, allowed, cache, length)
        cache.real[:, past_len:past_len + length] = real
        cache.next_position, cache.last_position = start + real.long().sum(1), last_position
        cache.all_real = cache.all_real and bool(real.all())
        return self.norm(h)

    def step(self, tokens: Tensor, cache: KVCache) -> Tensor:
        """Hidden states [B, 1, d] of one new real token per row ``tokens`` [B, 1] continuing a filled ``cache``:
        :meth:`forward` with ``real`` all True, whose position is the row's next position id and whose query may
        read every real cached key and itself (no causal mask is needed for one query)."""
        position, past_len = cache.next_position, cache.length
        if cache.last_position + 1 >= self.shape.max_len:
            raise ValueError(f"sequence of {cache.last_position + 2} positions exceeds max_len {self.shape.max_len}")
        cache.real[:, past_len] = True
        allowed = None if cache.all_real else cache.real[:, None, :past_len + 1]
        h = self.token(tokens) + self.position(position[:, None])
        h = self._run_cached(h, allowed, cache, 1)
        cache.next_position, cache.last_position = position + 1, cache.last_position + 1
        return self.norm(h)

    def _run_cached(self, h: Tensor, allowed: Tensor | None, cache: KVCache, length: int) -> Tensor:
        """The blocks over ``length`` new positions against the cache; advances ``cache.length``.  Returns h."""
        if cache.length + length > cache.keys[0].shape[2]:
            raise ValueError(f"the key/value cache holds {cache.keys[0].shape[2]} positions; "
                             f"{cache.length + length} were asked for")
        for block, keys, values in zip(self.blocks, cache.keys, cache.values, strict=True):
            h = self._block(block, h, allowed, (keys, values, cache.length))
        cache.length += length
        return h

    def _block(self, block: nn.Module, h: Tensor, allowed: Tensor | None,
               cache: tuple[Tensor, Tensor, int] | None = None) -> Tensor:
        return compiled_block()(block, h, allowed, cache) if self.compiled else block(h, allowed, cache)

    def _allocate(self, cache: KVCache, batch: int, prompt_len: int, device: torch.device) -> None:
        """Buffers for the prompt and up to ``max_len`` new positions (each new real token takes a position id)."""
        heads = self.shape.num_heads
        shape = (batch, heads, prompt_len + self.shape.max_len, self.shape.d_model // heads)
        dtype = self.token.weight.dtype  # a reduced-precision sampler's (policies.precision)
        cache.keys = [torch.empty(shape, device=device, dtype=dtype) for _ in self.blocks]
        cache.values = [torch.empty(shape, device=device, dtype=dtype) for _ in self.blocks]
        cache.real = torch.zeros(batch, shape[2], dtype=torch.bool, device=device)


class TransformerPolicy(ModulePolicy):
    """A :class:`CausalTransformer` over prompt + response tokens (see module docstring).

    Token id ``i`` is the same symbol in prompt and response; padded prompt positions get the extra symbol
    ``max(prompt_vocab_size, vocab_size)``.  ``seed`` makes the initial weights reproducible (a private RNG);
    ``state`` (a :meth:`state_dict`) starts the policy from given weights, e.g. a world's pretrained π₀;
    ``token_draw`` and ``compiled``: see :mod:`offpolicylab.policies.autoregressive` and the module docstring;
    ``trainer_precision``, ``lm_head_fp32`` and ``trainer_weights``: the precision of the scoring forward
    (:mod:`offpolicylab.policies.mixed_precision`); ``loss_scaler`` is fp16's dynamic loss scale (else None)."""

    SCALER_KEY = "loss_scaler."  # state_dict keys of the loss scaler's state (fp16)
    score_padding = "fixed"  # the length of a scoring forward (:meth:`score`)
    recompute_split_k = 1  # > 1: the recompute's GEMMs split-K (:meth:`recompute_kernels`)

    def __init__(self, vocab_size: int, response_len: int, eos_id: int | None = None,
                 prompt_vocab_size: int | None = None, max_prompt_len: int = 16, d_model: int = 64,
                 num_layers: int = 2, num_heads: int = 4, sampler_noise_std: float = 0.0, seed: int = 0,
                 state: dict[str, Tensor] | None = None, sampler_precision: str = "fp32", token_draw: str = "race",
                 compiled: bool = False, trainer_precision: str = "fp32", lm_head_fp32: bool = False,
                 trainer_weights: str = "master") -> None:
        self._init_common(vocab_size, response_len, eos_id, sampler_noise_std, sampler_precision, token_draw)
        self.set_trainer_precision(trainer_precision, lm_head_fp32, trainer_weights)
        prompt_vocab_size = vocab_size if prompt_vocab_size is None else int(prompt_vocab_size)
        if max_prompt_len < 1:
            raise ValueError(f"max_prompt_len must be >= 1, got {max_prompt_len}")
        self.pad_token = max(prompt_vocab_size, self.vocab_size)
        self.max_prompt_len = int(max_prompt_len)
        self.shape = TransformerShape(self.pad_token + 1, self.vocab_size, self.max_prompt_len + self.response_len,
                                      d_model, num_layers, num_heads)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.model = CausalTransformer(self.shape, check_compiled(compiled, self.sampler_precision))
        if state is not None:
            self.load_state_dict(state)

    # ------------------------------------------------------------------------------------------ scoring
    def score(self, rollout: Rollout) -> tuple[Tensor, Tensor]:
        """(logp, entropy) [B, T] as :meth:`ModulePolicy.score`; with ``score_padding = "longest"`` the forward runs
        over positions 0 … L − 1 only, L = the rows' longest response (as Hugging Face collators and verl's
        micro-batches pad to the longest sequence), the positions beyond 0.  Causal attention makes the valid
        positions the same function of the weights either way: only the rounding of reductions over fewer or more
        keys can differ."""
        length = longest_response(rollout.response_mask) if self.score_padding == "longest" else self.response_len
        if length == self.response_len:
            return super().score(rollout)
        check_temperature(rollout.temperature)
        logits = self._logits(rollout.prompt_ids, rollout.prompt_mask, rollout.response_ids[:, :length])
        if rollout.temperature != 1.0:
            logits = logits / rollout.temperature
        logp, entropy = token_log_probs(logits, rollout.response_ids[:, :length])
        rest = (0, self.response_len - length)
        return torch.nn.functional.pad(logp, rest), torch.nn.functional.pad(entropy, rest)

    def response_logits(self, prompt_ids: Tensor, prompt_mask: Tensor, prompt_index: Tensor,
                        response_ids: Tensor) -> Tensor:
        """Logits [B, T, V] from one causal pass over ``[prompt, response[:, :-1]]``."""
        if response_ids.shape[1] != self.response_len:
            raise ValueError(f"response_ids has {response_ids.shape[1]} positions, the policy has response_len "
                             f"{self.response_len}")
        return self._logits(prompt_ids, prompt_mask, response_ids)

    def _logits(self, prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor) -> Tensor:
        """Logits [B, L, V] of ``response_ids`` [B, L], L ≤ ``response_len``, in the trainer's precision."""
        prompt, real = self._prompt(prompt_ids, prompt_mask)
        tokens = torch.cat([prompt, response_ids[:, :-1]], dim=1)
        real = torch.cat([real, torch.ones_like(response_ids[:, :-1], dtype=torch.bool)], dim=1)
        with trainer_autocast(self.trainer_precision, tokens.device):
            if self.trainer_weights == "master":
                hidden = self.model(tokens, real)
                return head_logits(self.model.head, hidden[:, prompt.shape[1] - 1:], self.lm_head_fp32)
            return self._cast_logits(tokens, real, prompt.shape[1] - 1)

    def _cast_logits(self, tokens: Tensor, real: Tensor, first: int) -> Tensor:
        """Logits of positions ``first`` … of ``tokens`` from 16-bit copies of every weight
        (``trainer_weights=cast``); with ``lm_head_fp32`` the head reads its fp32 masters."""
        weights = cast_parameters(self.model, self.trainer_precision)
        hidden = torch.func.functional_call(self.model, weights, (tokens, real))[:, first:]
        if self.lm_head_fp32:
            return head_logits(self.model.head, hidden, True)
        head = {name: weights["head." + name] for name, _ in self.model.head.named_parameters()}
        return torch.func.functional_call(self.model.head, head, (hidden,))

    def set_recompute_split_k(self, splits: int) -> None:
        """The old-log-prob recompute's GEMMs split into ``splits`` slices of the inner dimension
        (:func:`~offpolicylab.policies.mixed_precision.split_k_linear`); 1: torch's own kernels.  Needs a 16-bit
        trainer and ``logp_micro_batch`` > 0 (:func:`~offpolicylab.policies.mixed_precision.check_split_k`), and eager
        blocks (``compiled = False``)."""
        self.recompute_split_k = check_split_k(int(splits), self.trainer_precision, self.logp_micro_batch,
                                               self.model.compiled)

    def recompute_kernels(self) -> contextlib.AbstractContextManager:
        """The block the old-log-prob recompute's micro-batches are scored in: split-K GEMMs with
        ``recompute_split_k`` > 1 (the kernel a GPU picks for a smaller micro-batch), else nothing."""
        return split_k_gemms(self.recompute_split_k) if self.recompute_split_k > 1 else contextlib.nullcontext()

    def shift_logits(self, offset: float) -> None:
        """z ← z + c for every logit, through the LM head's bias (b ← b + c): softmax(z + c) = softmax(z) in exact
        arithmetic, so only rounding sees it — a 16-bit logit rounds with the spacing of its magnitude (bf16: 0.125
        in [16, 32), 0.25 in [32, 64)), as a real LLM's large logits do."""
        with torch.no_grad():
            self.model.head.bias.add_(float(offset))

    # ------------------------------------------------------------------------------------------ trainer precision
    def set_trainer_precision(self, precision: str, lm_head_fp32: bool = False, weights: str = "master") -> None:
        """The scoring forward's precision, LM head and weights (module
        :mod:`~offpolicylab.policies.mixed_precision`); a fresh loss scaler for fp16."""
        self.trainer_precision = check_trainer_precision(precision)
        self.trainer_weights = check_trainer_weights(weights, self.trainer_precision)
        self.lm_head_fp32 = bool(lm_head_fp32)
        self.loss_scaler = loss_scaler(self.trainer_precision)

    def state_dict(self) -> dict[str, Tensor]:
        """The model's weights, and with fp16 the loss scaler's scale and growth count (so a resumed run goes on
        with the scale it had)."""
        state = super().state_dict()
        if self.loss_scaler is not None and self.loss_scaler._scale is not None:
            scaler = self.loss_scaler.state_dict()
            state[self.SCALER_KEY + "scale"] = torch.tensor(scaler["scale"], dtype=torch.float64)
            state[self.SCALER_KEY + "growth_tracker"] = torch.tensor(scaler["_growth_tracker"])
        return state

    def load_state_dict(self, state: dict[str, Tensor]) -> object:
        """:meth:`state_dict`'s output; scaler entries restore an fp16 policy's scale and are ignored otherwise."""
        scaler = {key[len(self.SCALER_KEY):]: value for key, value in state.items() if key.startswith(self.SCALER_KEY)}
        weights = {key: value for key, value in state.items() if not key.startswith(self.SCALER_KEY)}
        if scaler and getattr(self, "loss_scaler", None) is not None:
            own = self.loss_scaler
            own.load_state_dict({"scale": float(scaler["scale"]), "_growth_tracker": int(scaler["growth_tracker"]),
                                 "growth_factor": own.get_growth_factor(), "backoff_factor": own.get_backoff_factor(),
                                 "growth_interval": own.get_growth_interval()})
        return super().load_state_dict(weights)

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
            hidden = self.model.step(response_ids[:, t - 1: t], state)
        return head_logits(self.model.head, hidden[:, -1], self.lm_head_fp32)

    def sampler_engine(self) -> contextlib.AbstractContextManager[None]:
        """The sampling engine: the network's weights stored in ``sampler_precision``; with ``lm_head_fp32`` the
        head keeps its fp32 weights and reads fp32(h), as MiniMax-M1's fix runs in both engines."""
        return sampler_weights(self.model, self.sampler_precision,
                               fp32_modules=[self.model.head] if self.lm_head_fp32 else ())

    def engine_softmax_precision(self) -> str:
        """fp32 with ``lm_head_fp32`` (fp32 logits are normalised in fp32), else ``sampler_precision``."""
        return "fp32" if self.lm_head_fp32 else self.sampler_precision

    # ------------------------------------------------------------------------------------------ state
    def _prompt(self, prompt_ids: Tensor, prompt_mask: Tensor) -> tuple[Tensor, Tensor]:
        if prompt_ids.shape[1] > self.max_prompt_len:
            raise ValueError(f"prompt has {prompt_ids.shape[1]} positions, the policy has max_prompt_len "
                             f"{self.max_prompt_len}")
        real = prompt_mask > 0
        return torch.where(real, prompt_ids, torch.full_like(prompt_ids, self.pad_token)).long(), real
