"""One sampling / scoring code path shared by the toy policies.

A subclass implements only :meth:`AutoregressivePolicy.response_logits`: the next-token logits ``[B, T, V]`` of
every response position given the prompt and the response *prefix* (teacher forcing; position ``t`` may read only
``response_ids[:, :t]``).  Both :meth:`sample` and :meth:`score` call it on a full-width ``[B, T]`` response buffer,
so the log-probs recorded at sampling and those recomputed at scoring come from the same arithmetic:

    behavior_logp_t = log softmax(z_t / τ)[y_t],     z = response_logits(prompt, y_{<t})
    entropy_t       = −Σ_v p_v log p_v,              p = softmax(z_t / τ)

Sampling loops over positions only (``T`` calls of :meth:`AutoregressivePolicy.next_logits`, by default
``response_logits`` on the growing buffer; a policy with a key/value cache decodes incrementally); scoring is one call;
:meth:`AutoregressivePolicy.prefix_tree_log_probs` (exact enumeration) gives π(· | x, y_{<t}) once per distinct
prefix, by default from one ``response_logits`` call over the V^(T−1) prefixes of length T−1.
After an EOS the remaining positions are padded with the EOS id and masked out (``response_mask`` = 0 there,
EOS itself counts).

The sampling engine (rollout/trainer numeric mismatch, as in the TIS / P3O settings) may differ from the trainer's
arithmetic in two ways, and then reports its own log-prob of each drawn token as ``sampler_logp``:

- ``sampler_precision = p`` (:mod:`offpolicylab.policies.precision`): the engine runs the network with its weights
  stored in p and computes the logits and the softmax in p, ℓ = log softmax_p(z^p/τ);
- ``sampler_noise_std = σ > 0``: the engine draws from ``softmax(ℓ + σ·ε)``, ε ~ N(0, 1) fresh per token (a crude
  knob: a real engine rounds, it does not add noise).

``behavior_logp`` stays the policy's own log softmax(z/τ) of the sampled token in float32 (from the same pass when
p = fp32, else from one teacher-forced pass after decoding; ``sample(..., policy_logp=False)`` skips that pass and
then reports the engine's numbers there too).

How a token is drawn from p (``token_draw``; both draw exactly from p, with other random numbers):

- ``race`` (default): the exponential race y = argmax_v p_v / q_v, q_v ~ Exp(1) — ``torch.multinomial``'s own
  draws, V numbers per row and step;
- ``inverse_cdf``: y = min{v : Σ_{w≤v} p_w > u · Σ_w p_w}, u ~ U[0, 1) — one number per row and step, which makes
  decoding cheaper (benchmarks/README.md) and changes which tokens a seed draws.
"""

from __future__ import annotations

import contextlib
import copy
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from offpolicylab.contracts import Prompts, Rollout
from offpolicylab.policies.precision import check_precision, engine_log_softmax, sampler_weights

TOKEN_DRAWS = ("race", "inverse_cdf")


class AutoregressivePolicy(ABC):
    """Base of :class:`TabularSoftmaxPolicy` and :class:`SequenceModelPolicy` (the :class:`Policy` protocol)."""

    vocab_size: int
    response_len: int
    eos_id: int | None
    sampler_noise_std: float
    sampler_precision: str = "fp32"
    trainer_precision: str = "fp32"  # the precision of score's forward (policies.mixed_precision)
    logp_micro_batch: int = 0  # > 0: behaviour log-probs recomputed by score in micro-batches of this many rows
    token_draw: str = "race"  # one of TOKEN_DRAWS (module docstring)

    def _init_common(self, vocab_size: int, response_len: int, eos_id: int | None, sampler_noise_std: float,
                     sampler_precision: str = "fp32", token_draw: str = "race") -> None:
        if vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
        if response_len < 1:
            raise ValueError(f"response_len must be >= 1, got {response_len}")
        if eos_id is not None and not 0 <= eos_id < vocab_size:
            raise ValueError(f"eos_id must be None or in [0, {vocab_size - 1}], got {eos_id}")
        if not sampler_noise_std >= 0.0:
            raise ValueError(f"sampler_noise_std must be >= 0, got {sampler_noise_std}")
        self.vocab_size = int(vocab_size)
        self.response_len = int(response_len)
        self.eos_id = eos_id
        self.sampler_noise_std = float(sampler_noise_std)
        self.sampler_precision = check_precision(sampler_precision)
        self.token_draw = check_token_draw(token_draw)

    # ------------------------------------------------------------------------------------------ to implement
    @abstractmethod
    def response_logits(self, prompt_ids: Tensor, prompt_mask: Tensor, prompt_index: Tensor,
                        response_ids: Tensor) -> Tensor:
        """Next-token logits ``[B, T, V]``; position t depends on the prompt and ``response_ids[:, :t]`` only."""

    @abstractmethod
    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """The parameters the optimizer updates."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """The trainable state (checkpoints, frozen copies)."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> Any:
        """Restore :meth:`state_dict`'s output."""

    # ------------------------------------------------------------------------------------------ decoding hooks
    def start_decoding(self, prompt_ids: Tensor, prompt_mask: Tensor, prompt_index: Tensor) -> Any:
        """Per-batch decoding state handed to :meth:`next_logits` (e.g. a key/value cache); default None."""
        return None

    def next_logits(self, state: Any, prompt_ids: Tensor, prompt_mask: Tensor, prompt_index: Tensor,
                    response_ids: Tensor, t: int) -> Tensor:
        """Logits ``[B, V]`` of response position ``t`` given ``response_ids[:, :t]`` (called for t = 0, 1, …
        in order).  Default: ``response_logits(...)[:, t]`` on the whole buffer; a subclass with an incremental
        pass (a KV cache) overrides this and :meth:`start_decoding` and must give the same numbers."""
        return self.response_logits(prompt_ids, prompt_mask, prompt_index, response_ids)[:, t]

    def sampler_engine(self) -> contextlib.AbstractContextManager[None]:
        """The block in which decoding runs as the sampling engine: the weights stored in ``sampler_precision``
        (:func:`~offpolicylab.policies.precision.sampler_weights`).  Default: the network ``self.model``; the
        tabular policy names its logits table."""
        return sampler_weights(getattr(self, "model", None), self.sampler_precision)

    def engine_softmax_precision(self) -> str:
        """The precision the sampling engine normalises its logits in: ``sampler_precision`` (a policy whose
        engine computes fp32 logits says fp32)."""
        return self.sampler_precision

    # ------------------------------------------------------------------------------------------ shared path
    @property
    def pad_id(self) -> int:
        """Token written after EOS (the EOS id itself, so every response has one canonical padded form)."""
        return 0 if self.eos_id is None else self.eos_id

    def clone(self) -> AutoregressivePolicy:
        """An independent deep copy (for schedules that keep a second, frozen policy)."""
        return copy.deepcopy(self)

    def sample(self, prompts: Prompts, group_size: int, temperature: float = 1.0,
               generator: torch.Generator | Sequence[torch.Generator] | None = None, *,
               policy_logp: bool = True) -> Rollout:
        """Draw ``group_size`` responses per prompt (rows of one prompt are consecutive), under ``no_grad``.

        ``generator`` may be a sequence of k generators: the rows are then k equal consecutive blocks and block i
        draws from generator i (batched seeds: each seed's draws are those its separate run would make).
        ``policy_logp=False``: with a reduced-precision engine, ``behavior_logp`` holds the engine's numbers (as
        ``sampler_logp``) and the policy's own are not computed (one forward pass less)."""
        check_temperature(temperature)
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        n = len(prompts)
        rows = torch.arange(n).repeat_interleave(group_size)
        prompt_ids, prompt_mask = prompts.ids[rows], prompts.mask[rows]
        prompt_index = prompts.index[rows]
        batch, width = n * group_size, self.response_len
        ids = torch.full((batch, width), self.pad_id, dtype=torch.long)
        alive = torch.ones(batch, dtype=torch.bool)
        mask = torch.zeros(batch, width)
        behavior = torch.zeros(batch, width)
        # the engine computes with the policy's own numbers only when both are fp32
        exact = self.sampler_precision == "fp32" and self.trainer_precision == "fp32"
        noisy = self.sampler_noise_std > 0
        sampler = torch.zeros(batch, width) if noisy or not exact else None
        ahead: Tensor | None = None  # every step's random numbers, drawn at the first (see draws_ahead)
        with torch.no_grad(), self.sampler_engine():
            state = self.start_decoding(prompt_ids, prompt_mask, prompt_index)
            for t in range(width):
                logits = self.next_logits(state, prompt_ids, prompt_mask, prompt_index, ids, t)
                if exact:
                    logp = torch.log_softmax(logits if temperature == 1.0 else logits / temperature, -1)
                else:
                    logp = engine_log_softmax(logits, temperature, self.engine_softmax_precision())
                engine_logp = logp
                if noisy:
                    noise = _randn(logp.shape, generator, logp.dtype)
                    engine_logp = torch.log_softmax(logp + self.sampler_noise_std * noise, -1)
                probs = engine_logp.exp()
                if t == 0 and not noisy:  # nothing else draws between the steps
                    ahead = draws_ahead(self.token_draw, width, probs, generator)
                token = draw_tokens(self.token_draw, probs, generator, None if ahead is None else ahead[t])
                token = torch.where(alive, token, torch.full_like(token, self.pad_id))
                ids[:, t] = token
                mask[:, t] = alive.to(mask.dtype)
                behavior[:, t] = torch.where(alive, logp.gather(1, token[:, None]).squeeze(1), 0.0)
                if sampler is not None:
                    sampler[:, t] = torch.where(alive, engine_logp.gather(1, token[:, None]).squeeze(1), 0.0)
                if self.eos_id is not None:
                    alive = alive & (token != self.eos_id)
                    if ahead is not None and not bool(alive.any()):
                        break  # every row ended; the later steps' numbers were drawn ahead, so nothing else changes
        rollout = Rollout(
            prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=ids, response_mask=mask,
            behavior_logp=behavior, group_ids=rows, prompt_index=prompt_index, sampler_logp=sampler,
            temperature=float(temperature),
        )
        if exact:
            return rollout
        if not policy_logp:
            return rollout.with_(behavior_logp=sampler.clone())
        with torch.no_grad():  # the policy's own numbers: one teacher-forced float32 pass (as score)
            own, _ = self.score(rollout)
        return rollout.with_(behavior_logp=torch.where(mask > 0, own, 0.0))

    def score(self, rollout: Rollout) -> tuple[Tensor, Tensor]:
        """(logp [B, T], entropy [B, T]) of ``rollout.response_ids`` at ``rollout.temperature``, with grad.
        Padded positions hold the values of the pad token (the mask removes them).  Logits in a 16-bit
        ``trainer_precision`` are divided by τ in their dtype and normalised in float32 (verl's
        ``logprobs_from_logits``)."""
        check_temperature(rollout.temperature)
        logits = self._scaled_logits(rollout.prompt_ids, rollout.prompt_mask, rollout.prompt_index,
                                     rollout.response_ids, rollout.temperature)
        return token_log_probs(logits, rollout.response_ids)

    def prefix_tree_log_probs(self, prompts: Prompts, temperature: float = 1.0) -> Tensor:
        """log softmax(z/τ) ``[N, K, V]`` after every response prefix of length t < T, K = Σ_{t<T} V^t, with grad.

        Node ``offset_t + Σ_{s<t} y_s V^(t−1−s)`` (offset_t = Σ_{s<t} V^s: depth by depth, base-V order, first token
        most significant) holds π(· | x, y_{<t}).  Exact enumeration reads log π(y_t | x, y_{<t}) of all V^T
        responses off these K ≈ V^(T−1)·V/(V−1) distributions.  Logits come from :meth:`prefix_tree_logits`."""
        check_temperature(temperature)
        logits = self.prefix_tree_logits(prompts.ids, prompts.mask, prompts.index)
        return torch.log_softmax(logits if temperature == 1.0 else logits / temperature, -1)

    def prefix_tree_logits(self, prompt_ids: Tensor, prompt_mask: Tensor, prompt_index: Tensor) -> Tensor:
        """Logits ``[N, K, V]`` of the prefix tree of :meth:`prefix_tree_log_probs`.

        Default: one teacher-forced :meth:`response_logits` call over the V^(T−1) responses of length T−1 (a last
        id that a causal policy never reads appended); the prefix of length t of row r·V^(T−1−t) is node r of depth
        t.  A subclass may override it with an incremental pass that gives the same numbers."""
        vocab, width = self.vocab_size, self.response_len
        leaves = vocab ** (width - 1)
        digits = torch.arange(leaves)[:, None] // vocab ** torch.arange(width - 2, -1, -1)[None, :] % vocab
        responses = torch.cat([digits, torch.full((leaves, 1), self.pad_id)], dim=1)
        n = prompt_ids.shape[0]
        rows = torch.arange(n).repeat_interleave(leaves)
        logits = self.response_logits(prompt_ids[rows], prompt_mask[rows], prompt_index[rows],
                                      responses.repeat(n, 1)).reshape(n, leaves, width, vocab)
        return torch.cat([logits[:, :: vocab ** (width - 1 - t), t] for t in range(width)], dim=1)

    def greedy(self, prompts: Prompts) -> Rollout:
        """The argmax response of every prompt (one per prompt; ``behavior_logp`` at temperature 1)."""
        n = len(prompts)
        ids = torch.full((n, self.response_len), self.pad_id, dtype=torch.long)
        alive = torch.ones(n, dtype=torch.bool)
        mask = torch.zeros(n, self.response_len)
        behavior = torch.zeros(n, self.response_len)
        with torch.no_grad():
            state = self.start_decoding(prompts.ids, prompts.mask, prompts.index)
            for t in range(self.response_len):
                logp = torch.log_softmax(self.next_logits(state, prompts.ids, prompts.mask, prompts.index, ids, t), -1)
                token = torch.where(alive, logp.argmax(-1), torch.full((n,), self.pad_id))
                ids[:, t], mask[:, t] = token, alive.to(mask.dtype)
                behavior[:, t] = torch.where(alive, logp.gather(1, token[:, None]).squeeze(1), 0.0)
                if self.eos_id is not None:
                    alive = alive & (token != self.eos_id)
                    if not bool(alive.any()):
                        break
        return Rollout(prompt_ids=prompts.ids, prompt_mask=prompts.mask, response_ids=ids, response_mask=mask,
                       behavior_logp=behavior, group_ids=torch.arange(n), prompt_index=prompts.index)

    def _scaled_logits(self, prompt_ids: Tensor, prompt_mask: Tensor, prompt_index: Tensor, response_ids: Tensor,
                       temperature: float) -> Tensor:
        logits = self.response_logits(prompt_ids, prompt_mask, prompt_index, response_ids)
        return logits if temperature == 1.0 else logits / temperature


def token_log_probs(logits: Tensor, ids: Tensor) -> tuple[Tensor, Tensor]:
    """(log p(y_t), H_t) with log p = log_softmax(float32(z)) and H = −Σ_v p_v log p_v, from ``logits`` [B, T, V]
    of ``ids`` [B, T], normalised in float32 whatever the logits' dtype (verl's ``logprobs_from_logits``)."""
    log_probs = torch.log_softmax(logits.float(), -1)
    logp = log_probs.gather(-1, ids[..., None]).squeeze(-1)
    return logp, -(log_probs.exp() * log_probs).sum(-1)


def _randn(shape: torch.Size, generator: torch.Generator | Sequence[torch.Generator] | None,
           dtype: torch.dtype) -> Tensor:
    """Standard normal noise of ``shape``; with k generators, k equal row blocks, block i from generator i."""
    if generator is None or isinstance(generator, torch.Generator):
        return torch.randn(shape, generator=generator, dtype=dtype)
    rows = shape[0] // len(generator)
    return torch.cat([torch.randn((rows, *shape[1:]), generator=g, dtype=dtype) for g in generator])


def check_token_draw(token_draw: str) -> str:
    """``token_draw`` itself when it is one of :data:`TOKEN_DRAWS`, else ``ValueError`` naming them."""
    if token_draw not in TOKEN_DRAWS:
        raise ValueError(f"token_draw={token_draw!r} is invalid; valid: {', '.join(TOKEN_DRAWS)}")
    return token_draw


def draws_ahead(token_draw: str, width: int, probs: Tensor,
                generator: torch.Generator | Sequence[torch.Generator] | None) -> Tensor | None:
    """The random numbers of all ``width`` decoding steps of ``probs`` [B, V]'s rows, drawn at once (so a loop that
    stops after the last EOS leaves every generator where the full loop would): race numbers [T, B, V] or uniforms
    [T, B, 1]; None when the race is ``torch.multinomial``'s own (:func:`_races`)."""
    if token_draw == "inverse_cdf":
        return uniforms((width, probs.shape[0], 1), generator)
    return race_numbers((width, *probs.shape), generator) if _races(probs) else None


def draw_tokens(token_draw: str, probs: Tensor, generator: torch.Generator | Sequence[torch.Generator] | None,
                numbers: Tensor | None = None) -> Tensor:
    """One token per row of ``probs`` [B, V] by ``token_draw`` (module docstring), from ``numbers`` when they were
    drawn ahead (:func:`draws_ahead`), else from ``generator``."""
    if token_draw == "inverse_cdf":
        return inverse_cdf(probs, uniforms((probs.shape[0], 1), generator) if numbers is None else numbers)
    return _multinomial(probs, generator, numbers)


def inverse_cdf(probs: Tensor, uniform: Tensor) -> Tensor:
    """y = min{v : Σ_{w≤v} p_w > u · Σ_w p_w} per row of ``probs`` [B, V] (≥ 0, unnormalised allowed) for the
    uniforms u [B, 1] in [0, 1), in float64: a token of probability 0 is never drawn (its cumulative sum equals its
    predecessor's), and u · Σ < Σ for every double u < 1 (the rounded product falls at least one step below Σ), so
    some token always qualifies."""
    _check_finite(probs)
    cumulative = probs.double().cumsum(-1)
    total = cumulative[:, -1:]
    if bool((total <= 0).any()):
        raise RuntimeError("a row of the probability tensor sums to 0")
    return torch.searchsorted(cumulative, uniform.double() * total, right=True).squeeze(1)


def _check_finite(probs: Tensor) -> None:
    """``RuntimeError`` (``torch.multinomial``'s message) unless every probability is finite: they are ≥ 0, so the
    sum is finite iff every one is."""
    if not math.isfinite(float(probs.sum())):
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")


def uniforms(shape: tuple[int, ...] | torch.Size, generator: torch.Generator | Sequence[torch.Generator] | None) -> Tensor:
    """u ~ U[0, 1) float64 of ``shape`` = [..., B, k]; with n generators, the B rows are n equal blocks and block i's
    numbers come from generator i, filling it in order of the leading dimensions (:func:`race_numbers` turns them
    into Exp(1) numbers)."""
    generators = [generator] if generator is None or isinstance(generator, torch.Generator) else list(generator)
    rows = shape[-2] // len(generators)
    parts = [torch.rand((*shape[:-2], rows, shape[-1]), dtype=torch.float64, generator=g) for g in generators]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-2)


def _multinomial(probs: Tensor, generator: torch.Generator | Sequence[torch.Generator] | None,
                 race: Tensor | None = None) -> Tensor:
    """One token per row of ``probs`` [B, V], the token ``torch.multinomial(probs, 1)`` draws; with k generators,
    k equal row blocks, block i from generator i.

    ``torch.multinomial`` draws one sample by the exponential race (the Gumbel-max trick in exponential form):
    y = argmax_v p_v / q_v with q_v ~ Exp(1) i.i.d., q from ``exponential_``.  For float32 probabilities on the CPU
    (:func:`_races`) the same q come from :func:`exponential` (same generator draws, bit for bit, about twice as
    fast), so tokens and the generator's state are those of ``torch.multinomial``; other cases call it.  ``race``:
    this draw's q when the caller drew them ahead (:func:`race_numbers`)."""
    if not _races(probs):
        generators = [generator] if generator is None or isinstance(generator, torch.Generator) else list(generator)
        blocks = probs.split(probs.shape[0] // len(generators))
        return torch.cat([torch.multinomial(b, 1, generator=g) for b, g in zip(blocks, generators, strict=True)]
                         ).squeeze(1)
    _check_finite(probs)
    return (probs / (race_numbers(probs.shape, generator) if race is None else race)).argmax(-1)


def _races(probs: Tensor) -> bool:
    """Whether :func:`_multinomial` draws ``probs`` by its own exponential race (float32 on the CPU)."""
    return probs.dtype == torch.float32 and probs.device.type == "cpu"


def race_numbers(shape: tuple[int, ...] | torch.Size,
                 generator: torch.Generator | Sequence[torch.Generator] | None) -> Tensor:
    """q ~ Exp(1) float32 of ``shape`` = [..., B, V] as :func:`exponential` draws them; with k generators, the B
    rows are k equal blocks and block i's numbers come from generator i.  A generator's uniforms fill its block in
    order of the leading dimensions, so [T, B, V] at once are, bit for bit (numbers and generator states), T draws
    of [B, V] in a row (a decoding loop that draws nothing else: its steps' numbers in one call per generator, and
    one pass for all of them)."""
    return exponential_of(uniforms(shape, generator).neg_())


def exponential(shape: tuple[int, ...] | torch.Size, generator: torch.Generator | None) -> Tensor:
    """q ~ Exp(1) i.i.d., float32: bit for bit the numbers (and generator state) of
    ``torch.empty(shape).exponential_(generator=generator)``, vectorised.

    ``exponential_`` draws u ~ U[0, 1) as doubles (the generator's 53-bit draws, those of ``torch.rand(...,
    dtype=float64)``) and returns float32(−log1p(−u)) with the C library's scalar ``log1p``.  Here ``torch.log1p``
    computes all of them at once; it is within 1 ulp (double) of the scalar one, which changes the float32 result
    only where the double sits within an ulp of a float32 rounding boundary: those rare entries (bounded by
    perturbing the double by ±2⁻⁵⁰ relative) are recomputed with the scalar ``math.log1p``."""
    return exponential_of(torch.rand(shape, dtype=torch.float64, generator=generator).neg_())


def exponential_of(minus_u: Tensor) -> Tensor:
    """float32(−log1p(−u)) as the scalar C ``log1p`` gives it, from −u (float64) (see :func:`exponential`)."""
    q = torch.log1p(minus_u).neg_()
    out = q.to(torch.float32)
    unsure = (q * (1 - 2.0 ** -50)).to(torch.float32) != (q * (1 + 2.0 ** -50)).to(torch.float32)
    if bool(unsure.any()):
        where = unsure.nonzero(as_tuple=True)
        exact = [-math.log1p(value) for value in minus_u[where].tolist()]
        out[where] = torch.tensor(exact, dtype=torch.float64).to(torch.float32)
    return out


def check_temperature(temperature: float) -> None:
    if not (isinstance(temperature, (int, float)) and temperature > 0 and temperature < float("inf")):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r} (use greedy() for argmax)")


class ModulePolicy(AutoregressivePolicy):
    """An :class:`AutoregressivePolicy` whose whole trainable state is one torch module, ``self.model``."""

    model: torch.nn.Module

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return list(self.model.parameters())

    def state_dict(self) -> dict[str, Any]:
        return {key: value.detach().clone() for key, value in self.model.state_dict().items()}

    def load_state_dict(self, state: dict[str, Any]) -> Any:
        try:
            return self.model.load_state_dict(state)
        except RuntimeError as error:
            raise ValueError(f"{type(self).__name__} state does not match the architecture: "
                             f"{str(error).splitlines()[0]}") from None
