"""Synthetic token-sequence MDPs: RLVR in miniature (prompt → response of up to T tokens from a vocabulary of V →
verifiable terminal reward), small enough that every response can be enumerated (V^T ≤ 10^5).

Responses are compared in canonical form ŷ (positions after an EOS hold the EOS id).  Families:

- ``target``: a hidden target y*(x) per prompt (random from ``seed``; with EOS a random length then EOS).
  partial credit R = (1/T) Σ_t 1[ŷ_t = y*_t];  exact credit R = Π_t 1[ŷ_t = y*_t].
- ``arithmetic`` (GSM8k in miniature): the prompt spells two operands a, b in base β (β = V − 1 with EOS, else V)
  as ``a_digits b_digits`` (T digits each, most significant first); the response must spell a + b (with EOS: the minimal digits, most
  significant first, then EOS; without: T digits, zero-padded).  Credit as for ``target`` against that spelling.
- ``forking``: a few decision positions F (``num_forks``, evenly spread) each with a correct token c_f(x), and
  "filler" positions with a required token s_t(x).  R = [(1/|F|) Σ_f 1[y_f = c_f]] · filler credit, filler credit =
  mean_t∉F 1[y_t = s_t] (partial) or Π_t∉F (exact).  The world's suggested initial policy
  (:meth:`TokenMDP.initial_logits`, used by the tabular policy's ``init="world"``) is a "pretrained" prior:
  near-deterministic on fillers (``filler_prob`` on s_t) and uniform (maximal entropy) on forks — the high-entropy
  minority tokens that decide the reward (M2PO's analysis).

Exact return / KL / χ² / optimal return by enumeration live in :mod:`offpolicylab.worlds.exact`; the methods below delegate.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import Tensor

from offpolicylab.contracts import Prompts
from offpolicylab.worlds.exact import MAX_ENUMERATION, EnumerableWorld
from offpolicylab.worlds.fixed_prompts import FixedPrompts

MAX_PROMPT_RESPONSES = 10_000_000  # num_prompts × V^T: the exact return's table of every prompt's responses

FAMILIES = ("target", "arithmetic", "forking")
CREDITS = ("partial", "exact")


class TokenMDP(FixedPrompts, EnumerableWorld):
    """A token-sequence world (see module docstring).  Prompts are fixed: ``num_prompts`` of them, all of length
    ``prompt_len``, no padding; ``sample_prompts`` draws indices uniformly with replacement, ``eval_prompts`` is all
    of them in order."""

    #: :meth:`reward` of a row reads that row alone (elementwise ops and a reduction over its T positions) and draws
    #: nothing, so scoring several runs' rows in one call gives each row's reward bit for bit (batched seeds do).
    rowwise_reward: ClassVar[bool] = True

    def __init__(self, family: str = "target", vocab_size: int = 4, length: int = 5, num_prompts: int = 8,
                 eos: bool = False, credit: str = "partial", num_forks: int = 2, filler_prob: float = 0.9,
                 seed: int = 0) -> None:
        _check_choice("family", family, FAMILIES)
        _check_choice("credit", credit, CREDITS)
        _check_int("vocab_size", vocab_size, 2 + int(eos))
        _check_int("length", length, 1)
        _check_int("num_prompts", num_prompts, 1)
        if length * math.log(vocab_size) > math.log(MAX_ENUMERATION) + 1e-9:  # V^T without computing a huge V^T
            raise ValueError(f"vocab_size^length = {vocab_size}^{length} exceeds {MAX_ENUMERATION}: the world must "
                             "stay enumerable")
        if num_prompts * vocab_size ** length > MAX_PROMPT_RESPONSES:
            raise ValueError(f"num_prompts × vocab_size^length = {num_prompts} × {vocab_size}^{length} exceeds "
                             f"{MAX_PROMPT_RESPONSES:,}: exact returns enumerate every response of every prompt; "
                             "valid: fewer prompts or a smaller vocab_size or length")
        self.family, self.credit, self.seed = family, credit, int(seed)
        self.vocab_size, self.max_response_len, self.num_prompts = int(vocab_size), int(length), int(num_prompts)
        self.eos_id: int | None = self.vocab_size - 1 if eos else None
        self.fork_mask = torch.zeros(self.max_response_len, dtype=torch.bool)
        self.filler_prob = float(filler_prob)
        generator = torch.Generator().manual_seed(self.seed)
        if family == "arithmetic":
            self._build_arithmetic(generator)
        else:
            self._build_code_prompts(generator)
            if family == "target":
                self.targets = self._random_targets(generator)
            else:
                self._build_forking(generator, num_forks)

    # ------------------------------------------------------------------------------------------ construction
    def _build_code_prompts(self, generator: torch.Generator) -> None:
        """Prompt i = the base-V digits of a distinct random code (length ⌈log_V N⌉, at least 2)."""
        self.prompt_len = max(2, math.ceil(math.log(self.num_prompts, self.vocab_size) - 1e-9))
        codes = torch.randperm(self.vocab_size ** self.prompt_len, generator=generator)[: self.num_prompts]
        self.prompt_tokens = _digits(codes, self.vocab_size, self.prompt_len)
        self.prompt_vocab_size = self.vocab_size

    def _random_targets(self, generator: torch.Generator) -> Tensor:
        n, width = self.num_prompts, self.max_response_len
        if self.eos_id is None:
            return torch.randint(self.vocab_size, (n, width), generator=generator)
        tokens = torch.randint(self.vocab_size - 1, (n, width), generator=generator)  # EOS is the last id
        lengths = torch.randint(1, width + 1, (n,), generator=generator)
        return torch.where(torch.arange(width)[None, :] < lengths[:, None], tokens, self.eos_id)

    def _build_arithmetic(self, generator: torch.Generator) -> None:
        self.base = self.vocab_size - (1 if self.eos_id is not None else 0)
        top = (self.base ** self.max_response_len - 1) // 2
        pairs = (top + 1) ** 2
        if self.num_prompts > pairs:
            raise ValueError(f"arithmetic world has only {pairs} operand pairs for vocab_size={self.vocab_size}, "
                             f"length={self.max_response_len}; num_prompts must be <= {pairs}")
        codes = torch.randperm(pairs, generator=generator)[: self.num_prompts]
        self.operands = torch.stack([codes // (top + 1), codes % (top + 1)], dim=1)
        width = self.max_response_len
        self.prompt_tokens = torch.cat([_digits(self.operands[:, 0], self.base, width),
                                        _digits(self.operands[:, 1], self.base, width)], dim=1)
        self.prompt_len = 2 * width
        self.prompt_vocab_size = self.base
        self.targets = self.spell(self.operands.sum(1))

    def spell(self, numbers: Tensor) -> Tensor:
        """Canonical response spelling each number (arithmetic world): [N, T]."""
        width = self.max_response_len
        digits = _digits(numbers, self.base, width)
        if self.eos_id is None:
            return digits
        powers = self.base ** torch.arange(1, width)
        ndig = 1 + (numbers[:, None] >= powers[None, :]).long().sum(1)  # significant digits (0 has one)
        shift = width - ndig  # left-align the significant digits
        index = (torch.arange(width)[None, :] + shift[:, None]).clamp(max=width - 1)
        aligned = digits.gather(1, index)
        return torch.where(torch.arange(width)[None, :] < ndig[:, None], aligned, self.eos_id)

    def _build_forking(self, generator: torch.Generator, num_forks: int) -> None:
        if self.eos_id is not None:
            raise ValueError("the forking family has fixed-length responses; use eos=false")
        if not 1 <= num_forks < self.max_response_len:
            raise ValueError(f"num_forks must be in [1, {self.max_response_len - 1}] (length - 1), got {num_forks}")
        if not 1.0 / self.vocab_size < self.filler_prob < 1.0:
            raise ValueError(f"filler_prob must be in (1/vocab_size, 1), got {self.filler_prob}")
        positions = torch.linspace(0, self.max_response_len - 1, num_forks + 2)[1:-1].round().long()
        if positions.unique().numel() < num_forks:
            positions = torch.arange(num_forks) * (self.max_response_len // num_forks)
        self.fork_mask[positions] = True
        self.targets = torch.randint(self.vocab_size, (self.num_prompts, self.max_response_len), generator=generator)

    # ------------------------------------------------------------------------------------------ World
    def eval_prompts(self) -> Prompts:
        """All prompts, in index order."""
        return self._prompts(torch.arange(self.num_prompts))

    def reward(self, prompt_index: Tensor, response_ids: Tensor, response_mask: Tensor,
               generator: torch.Generator | None = None) -> Tensor:
        """Terminal reward [B] in [0, 1] of each response (deterministic; ``generator`` unused)."""
        if response_ids.dim() != 2 or response_ids.shape[1] != self.max_response_len:
            raise ValueError(f"response_ids must be [B, {self.max_response_len}], got {tuple(response_ids.shape)}")
        pad = 0 if self.eos_id is None else self.eos_id
        canonical = torch.where(response_mask > 0, response_ids, torch.full_like(response_ids, pad))
        correct = (canonical == self.targets[prompt_index]).float()
        if self.family != "forking":
            return correct.mean(1) if self.credit == "partial" else correct.prod(1)
        forks = correct[:, self.fork_mask].mean(1)
        fillers = correct[:, ~self.fork_mask]
        return forks * (fillers.mean(1) if self.credit == "partial" else fillers.prod(1))

    expected_reward = reward

    # ------------------------------------------------------------------------------------------ exact
    def initial_logits(self) -> Tensor | None:
        """The forking world's prior, [N, T, 1, V] log-probs (filler_prob on each filler, uniform on forks);
        None (uniform start) for the other families."""
        if self.family != "forking":
            return None
        v = self.vocab_size
        rest = (1.0 - self.filler_prob) / (v - 1)
        filler = torch.full((self.num_prompts, self.max_response_len, v), rest)
        filler.scatter_(2, self.targets[..., None], self.filler_prob)
        probs = torch.where(self.fork_mask[None, :, None], torch.full_like(filler, 1.0 / v), filler)
        return probs.log()[:, :, None, :]

    def optimal_return(self) -> float:
        """J* = E_x max_y R(x, y) (1.0 in every family: the target response is always reachable)."""
        return self.enumeration.optimal_return()


def _digits(numbers: Tensor, base: int, width: int) -> Tensor:
    """Base-``base`` digits of each number, most significant first, zero-padded to ``width``: [N, width]."""
    powers = base ** torch.arange(width - 1, -1, -1)
    return (numbers[:, None] // powers[None, :]) % base


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, got {value!r}")


def _check_int(name: str, value: int, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
