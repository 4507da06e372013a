"""A calibrated synthetic language-model world: a random teacher network plays "the data the pretrained model
saw", a small causal transformer distilled from it is π₀ ("the pretrained model"), and a sparse verifiable reward
with GSM8k-like 1 / 0.1 / 0 credit asks for a hidden key → digit answer at the end of a 32-token response.

Tokens (V = 256 by default): ids 0–9 are answer digits, 10 is the answer marker ANS, the rest are text.  A prompt is
4 tokens: a key token (text id 11 + k, k ∈ {0 … K−1}) and 3 random text tokens; 512 fixed training prompts (keys
balanced) and K fixed evaluation prompts (one per key, fresh contexts), all drawn from ``seed``.

**Teacher** (a random :class:`~offpolicylab.policies.transformer.CausalTransformer` over prompt + response, weights
from ``seed``).  At response position t with hidden state h its standardised logits ẑ = (z − mean z) / std z
(z = W h + b over the allowed tokens) and a sharpness κ(h) = exp(γ · u·h) (u a fixed random unit vector, h layer-normed so u·h ≈ N(0, 1)) give

    p_T(· | x, y_{<t}) = (1 − δ) · softmax(α κ ẑ) + δ · softmax(ẑ)                      over text tokens,

so α moves the share of near-deterministic positions against high-entropy forks (κ spreads the sharpness over
positions) and δ puts a tail of sampled tokens with p < 1e-3 into the data.  The format is built in: at t = T−2
the teacher writes ANS with probability ``ans_prob`` (else text from p_T), and at t = T−1 after ANS it writes a
digit from softmax(``key_scale`` · E[k] + ``digit_scale`` · ẑ_digits) — E a fixed random [K, 10] Gaussian matrix,
so the data's answer depends on the key (π₀ learns to carry the key to the answer position, as an LLM carries the
question) yet stays near uniform (entropy ≈ 1.9 nat), independent of the hidden reward table: the high-entropy
decision position; text positions never hold digits or ANS.

**π₀** is a :class:`~offpolicylab.policies.transformer.TransformerPolicy` student distilled by minimising
KL(p_T ‖ π) over the full next-token distribution on teacher-sampled sequences of random prompts (AdamW, cosine
learning rate, fixed steps and seed), then sharpened to temperature t_π₀ (``pi0_temperature``): π₀ = softmax(z / t_π₀)
for the student's logits z — a small student stays less certain than its teacher at the teacher's near-deterministic
positions, and a reasoning LLM is sharper than its pretraining data (instruction tuning, RL); t_π₀ < 1 models that
sharpening with one number, keeping the student's ranking of tokens and its forks.  π₀ is then cached on disk (``cache_dir``, file named by the SHA-256 of the
recipe; ``torch.save`` of tensors and numbers, loaded with ``weights_only=True``).

**Reward** (verifiable, like GSM8k's 1 / 0.1 / 0; Cobbe et al. 2021, M2PO's scorer): the format is valid when
y_{T−2} = ANS, y_{T−1} is a digit and the response stays on the pretrained manifold, m(y) ≥ θ with
m(y) = (1/T) Σ_t max(log p_T(y_t | x, y_{<t}), −30) the mean teacher log-probability per token and θ its 1st
percentile over π₀'s own samples on the training prompts (computed once at build, cached with π₀).  Then
r = 1.0 if y_{T−1} = table[key] (a hidden random key → digit table, balanced: each digit answers ⌊K/10⌋ or
⌈K/10⌉ keys, so no constant answer beats chance), 0.1 if the format is valid but the digit is wrong, 0 otherwise.  Degenerate text (loops, gibberish) falls below θ and loses even the format credit, as an LLM's
answer stops being extractable.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from offpolicylab.contracts import Prompts
from offpolicylab.locations import check_writable, physical_memory
from offpolicylab.policies.transformer import CausalTransformer, KVCache, TransformerPolicy, TransformerShape
from offpolicylab.registry import MAX_SEED, Param
from offpolicylab.worlds.fixed_prompts import FixedPrompts

NUM_DIGITS = 10
ANS = 10
FIRST_TEXT = 11
CONTEXT_LEN = 3
LOG_FLOOR = -30.0
CORRECT_REWARD = 1.0
FORMAT_REWARD = 0.1
RECIPE_VERSION = 4  # bump when the build code changes what a recipe produces
CORPUS_CHUNK = 8  # distillation steps whose teacher sequences are sampled together
MAX_TEACHER_SCALE = 1000.0  # alpha, digit_scale, key_scale: beyond it the teacher's float32 logits need not be finite
MAX_SHARPNESS_SPREAD = 10.0  # gamma: kappa = exp(gamma u.h) <= exp(10 sqrt(teacher_d_model)) stays finite in float32


@dataclass(frozen=True)
class RecipeBase:
    """What recipes v5 (:class:`Recipe`) and v6 (:class:`~offpolicylab.worlds.synthetic_lm_v6.ChainRecipe`) share:
    the teacher's and π₀'s transformer sizes, the distillation's batch and learning rate, and the cache key."""

    teacher_d_model: int = 32
    teacher_layers: int = 1
    teacher_heads: int = 2
    d_model: int = 64
    num_layers: int = 2
    num_heads: int = 4
    distill_batch: int = 128
    distill_lr: float = 5e-3

    def identity(self) -> dict[str, Any]:
        """The fields that name this recipe in its digest and its cache file (all of them here)."""
        return asdict(self)

    def digest(self) -> str:
        """SHA-256 (hex) of the recipe, the build-code version and torch's major.minor version."""
        text = json.dumps({"recipe": self.identity(), "version": RECIPE_VERSION,
                           "torch": ".".join(torch.__version__.split(".")[:2])}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Recipe(RecipeBase):
    """Everything that determines the teacher, π₀ and θ (the cache key is the SHA-256 of this, see :meth:`digest`)."""

    vocab_size: int = 256
    response_len: int = 32
    num_keys: int = 64
    num_train_prompts: int = 512
    alpha: float = 64.0
    delta: float = 0.0
    sharpness_spread: float = 1.5
    ans_prob: float = 0.9
    digit_scale: float = 0.3
    key_scale: float = 1.0
    distill_steps: int = 1200
    pi0_temperature: float = 0.8
    threshold_samples: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        """Every field that is a world parameter is checked by its registered :data:`RECIPE_PARAMS` entry (one
        source of truth for the ranges); then the checks across fields and of the fields only a recipe has."""
        for name, param in RECIPE_PARAMS.items():
            param.validate(name, getattr(self, name))
        if self.vocab_size < FIRST_TEXT + max(self.num_keys, CONTEXT_LEN) + 1:
            raise ValueError(f"vocab_size={self.vocab_size} is too small; valid: >= {FIRST_TEXT + self.num_keys + 1} "
                             f"(10 digits, ANS and at least num_keys + 1 text tokens)")
        if self.threshold_samples < 1:
            raise ValueError(f"threshold_samples={self.threshold_samples} is invalid; valid: an integer >= 1")


RECIPE_PARAMS: dict[str, Param] = {
        "num_keys": Param(Recipe.num_keys, int, low=1, doc="keys k (one evaluation prompt each; the reward asks "
                                                           "for a hidden digit table[k])"),
        "num_train_prompts": Param(Recipe.num_train_prompts, int, low=1, doc="fixed training prompts"),
        "response_len": Param(Recipe.response_len, int, low=3, doc="response length T (ANS at T-2, digit at T-1)"),
        "vocab_size": Param(Recipe.vocab_size, int, low=16,
                            doc="vocabulary V (10 digits, ANS, text): at least num_keys + 12"),
        "alpha": Param(None, float, low=0.0, low_open=True, high=MAX_TEACHER_SCALE, optional=True,
                       doc="teacher sharpness: more near-deterministic positions as it grows (default: the "
                           "preset's, 64 / 7)"),
        "delta": Param(None, float, low=0.0, high=1.0, high_open=True, optional=True,
                       doc="teacher tail share: weight of the broad softmax in p_T (default: the preset's, "
                           "0 / 0.125)"),
        "pi0_temperature": Param(None, float, low=0.05, high=10.0, optional=True,
                                 doc="π₀ = the distilled student at this temperature (< 1 sharpens; default: the "
                                     "preset's, 0.8 / 1)"),
        "sharpness_spread": Param(Recipe.sharpness_spread, float, low=0.0, high=MAX_SHARPNESS_SPREAD,
                                  doc="gamma: spread of the per-position sharpness exp(gamma u.h)"),
        "ans_prob": Param(Recipe.ans_prob, float, low=0.0, high=1.0, low_open=True,
                          doc="teacher probability of ANS at position T-2"),
        "digit_scale": Param(Recipe.digit_scale, float, low=0.0, high=MAX_TEACHER_SCALE,
                             doc="teacher digit logits: context part scale"),
        "key_scale": Param(Recipe.key_scale, float, low=0.0, high=MAX_TEACHER_SCALE,
                           doc="teacher digit logits: key part scale"),
        "d_model": Param(Recipe.d_model, int, low=1, doc="π₀ transformer width (a multiple of num_heads)"),
        "num_layers": Param(Recipe.num_layers, int, low=1, doc="π₀ transformer layers"),
        "num_heads": Param(Recipe.num_heads, int, low=1, doc="π₀ attention heads"),
        "distill_steps": Param(Recipe.distill_steps, int, low=0, doc="π₀ distillation steps"),
        "distill_batch": Param(Recipe.distill_batch, int, low=1, doc="teacher sequences per distillation step"),
        "seed": Param(Recipe.seed, int, low=0, high=MAX_SEED, doc="world seed (teacher, prompts, table, π₀)"),
}
"""The recipe fields a user may set as world parameters, with their valid ranges (``alpha``, ``delta`` and
``pi0_temperature`` default to None: the preset's value); :class:`Recipe` checks its fields with them."""

PRESETS: dict[str, Recipe] = {
    "seed_scale": Recipe(),
    "smollm2": Recipe(alpha=7.0, delta=0.125, pi0_temperature=1.0),
}
"""Named recipes.  ``seed_scale`` (the default) matches the token entropies of a reasoning LLM's chain of thought
(Qwen3-8B, Wang et al. 2025, arXiv:2506.01939): over half the tokens below 0.01 nat, the 80th percentile near
0.67 nat.  ``smollm2`` matches the profile of SmolLM2-135M-Instruct (Q4_1, temperature 1) on GSM8k that
``offpolicylab calibrate`` measured: 83 % of the tokens at or above 1 nat."""

PACKAGED_DIR = Path(__file__).resolve().parent.parent / "data" / "synthetic_lm"


def default_cache_dir() -> Path:
    """``$OFFPOLICYLAB_CACHE/synthetic_lm``, else ``$XDG_CACHE_HOME/offpolicylab/synthetic_lm`` (~/.cache)."""
    root = os.environ.get("OFFPOLICYLAB_CACHE")
    if root:
        return Path(root) / "synthetic_lm"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "offpolicylab" / "synthetic_lm"


# ================================================================================================ the teacher
def random_teacher(recipe: Any) -> tuple[CausalTransformer, Tensor, Tensor]:
    """The teacher's frozen random parts from ``recipe.seed``: its causal transformer over prompt + response, the
    unit direction u of the sharpness κ(h) = exp(γ u·h), and the key logits E [num_keys, 10] (the data's
    key-dependent answer beliefs).  Shared by every recipe's teacher, so one seed gives one network."""
    shape = TransformerShape(recipe.vocab_size, recipe.vocab_size, 1 + CONTEXT_LEN + recipe.response_len,
                             recipe.teacher_d_model, recipe.teacher_layers, recipe.teacher_heads)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(recipe.seed + 7919)
        net = CausalTransformer(shape).eval()
        direction = torch.randn(shape.d_model)
        key_logits = torch.randn(recipe.num_keys, NUM_DIGITS)
    net.requires_grad_(False)
    return net, direction / direction.norm(), key_logits


class Teacher:
    """The random teacher p_T of the module docstring (no parameters are trained)."""

    def __init__(self, recipe: Recipe) -> None:
        self.recipe = recipe
        self.vocab_size, self.response_len = recipe.vocab_size, recipe.response_len
        self.net, self.direction, self.key_logits = random_teacher(recipe)

    def log_probs(self, prompt: Tensor, response: Tensor) -> Tensor:
        """log p_T(· | x, y_{<t}) for every response position, [B, T, V] (−inf where p_T = 0), one causal pass."""
        with torch.no_grad():
            hidden, previous = self._teacher_forced(prompt, response)
            return self._distribution(hidden, torch.arange(self.response_len), previous, prompt[:, 0])

    def _teacher_forced(self, prompt: Tensor, response: Tensor) -> tuple[Tensor, Tensor]:
        """(hidden states [B, T, d] of the positions predicting y_1 … y_T, the token before each y_t [B, T])."""
        tokens = torch.cat([prompt, response[:, :-1]], dim=1)
        hidden = self.net(tokens, torch.ones_like(tokens, dtype=torch.bool))[:, prompt.shape[1] - 1:]
        return hidden, torch.cat([prompt[:, -1:], response[:, :-1]], dim=1)

    def sample(self, prompt: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """(responses [B, T], log p_T [B, T, V]) sampled with a key/value cache."""
        batch, width = prompt.shape[0], self.response_len
        response = torch.zeros(batch, width, dtype=torch.long)
        log_probs = torch.empty(batch, width, self.vocab_size)
        cache = KVCache()
        with torch.no_grad():
            inputs, previous = prompt, prompt[:, -1]
            for t in range(width):
                hidden = self.net(inputs, torch.ones_like(inputs, dtype=torch.bool), cache)[:, -1:]
                logp = self._distribution(hidden, torch.tensor([t]), previous[:, None], prompt[:, 0])[:, 0]
                token = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(1)
                response[:, t], log_probs[:, t] = token, logp
                inputs, previous = token[:, None], token
        return response, log_probs

    def _distribution(self, hidden: Tensor, steps: Tensor, previous: Tensor, key_token: Tensor) -> Tensor:
        """log p_T [B, W, V] at response positions ``steps`` [W] from hidden states [B, W, d], the token before
        each position ``previous`` [B, W] (the format rule at t = T−1 reads whether it is ANS) and the prompt's key
        token [B] (the digit logits depend on the key)."""
        r, vocab = self.recipe, self.vocab_size
        sharp, broad, digit_probs = self._softmaxes(hidden, key_token)
        text = torch.arange(vocab) >= FIRST_TEXT
        p_text = (1 - r.delta) * sharp + r.delta * broad
        probs = torch.zeros(*sharp.shape[:-1], vocab)
        probs[..., text] = p_text
        is_ans_slot = (steps == self.response_len - 2)[None, :, None]
        ans = torch.zeros_like(probs)
        ans[..., ANS] = r.ans_prob
        probs = torch.where(is_ans_slot, ans + (1 - r.ans_prob) * probs, probs)
        digits = torch.zeros_like(probs)
        digits[..., :NUM_DIGITS] = digit_probs
        is_digit_slot = (steps == self.response_len - 1)[None, :, None] & (previous == ANS)[..., None]
        probs = torch.where(is_digit_slot, digits, probs)
        return probs.log()

    def _softmaxes(self, hidden: Tensor, key_token: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The three distributions p_T mixes, from hidden states [B, W, d] and key tokens [B]: softmax(α κ ẑ) and
        softmax(ẑ) over the text tokens [B, W, V − 11], and the digit distribution [B, W, 10]."""
        r = self.recipe
        z = self.net.head(hidden)
        z_text = _standardise(z[..., FIRST_TEXT:])
        kappa = torch.exp(r.sharpness_spread * (hidden @ self.direction))
        sharp = torch.softmax(r.alpha * kappa[..., None] * z_text, -1)
        key_part = r.key_scale * self.key_logits[(key_token - FIRST_TEXT).clamp(0, r.num_keys - 1)][:, None]
        digits = torch.softmax(key_part + r.digit_scale * _standardise(z[..., :NUM_DIGITS]), -1)
        return sharp, torch.softmax(z_text, -1), digits

    def token_log_probs(self, prompt: Tensor, response: Tensor) -> Tensor:
        """log p_T(y_t | x, y_{<t}) [B, T] of the response's own tokens: :meth:`log_probs` read at y_t, with the
        mixture, format rules and log applied to the T read entries instead of all T·V (the same numbers)."""
        r, width = self.recipe, self.response_len
        with torch.no_grad():
            hidden, previous = self._teacher_forced(prompt, response)
            sharp, broad, digit_probs = self._softmaxes(hidden, prompt[:, 0])
            text_index = (response - FIRST_TEXT).clamp(min=0)[..., None]
            p_text = ((1 - r.delta) * sharp.gather(-1, text_index) + r.delta * broad.gather(-1, text_index))[..., 0]
            probs = torch.where(response >= FIRST_TEXT, p_text, 0.0)
            steps = torch.arange(width)[None]
            ans = torch.where(response == ANS, r.ans_prob, 0.0)
            probs = torch.where(steps == width - 2, ans + (1 - r.ans_prob) * probs, probs)
            digit = digit_probs.gather(-1, response.clamp(max=NUM_DIGITS - 1)[..., None])[..., 0]
            digit = torch.where(response < NUM_DIGITS, digit, 0.0)
            probs = torch.where((steps == width - 1) & (previous == ANS), digit, probs)
            return probs.log()

    def mean_log_prob(self, prompt: Tensor, response: Tensor) -> Tensor:
        """m(y) = (1/T) Σ_t max(log p_T(y_t | x, y_{<t}), LOG_FLOOR), [B]."""
        return self.token_log_probs(prompt, response).clamp(min=LOG_FLOOR).mean(1)


def _standardise(z: Tensor) -> Tensor:
    return (z - z.mean(-1, keepdim=True)) / z.std(-1, keepdim=True).clamp(min=1e-6)


def spell_prompts(keys: Tensor, vocab_size: int, generator: torch.Generator, first_text: int = FIRST_TEXT) -> Tensor:
    """[key token first_text + k, 3 random text tokens in [first_text, V)] for each key k: [N, 4] (the prompts of
    recipes v5 and v6; ``first_text`` is the recipe's first text token: 11 in v5, 13 in v6)."""
    context = torch.randint(first_text, vocab_size, (keys.shape[0], CONTEXT_LEN), generator=generator)
    return torch.cat([first_text + keys[:, None], context], dim=1)


# ================================================================================================ the world
class KeyedLM(FixedPrompts):
    """What the synthetic LM worlds share (recipe v5: :class:`SyntheticLM`; v6:
    :class:`~offpolicylab.worlds.synthetic_lm_v6.ChainLM`): the prompts — the ``num_train_prompts`` training prompts
    (key i mod K) then one evaluation prompt per key, each spelled by :func:`spell_prompts` —, the teacher and where
    π₀'s cache file lives."""

    recipe: Any

    def _spell(self, generator: torch.Generator, first_text: int, teacher: Callable[[Any], Any],
               cache_dir: str | Path | None) -> None:
        """Sizes, prompts (drawn from ``generator``), ``teacher(recipe)`` and the cache path of ``self.recipe``."""
        r = self.recipe
        self.vocab_size, self.max_response_len = r.vocab_size, r.response_len
        self.prompt_vocab_size, self.prompt_len = r.vocab_size, 1 + CONTEXT_LEN
        keys = torch.cat([torch.arange(r.num_train_prompts) % r.num_keys, torch.arange(r.num_keys)])
        self.prompt_tokens = spell_prompts(keys, r.vocab_size, generator, first_text)
        self.prompt_keys = keys
        self.num_prompts = r.num_train_prompts
        self.teacher = teacher(r)
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
        self.cache_path = self.cache_dir / f"{r.digest()[:32]}.pt"

    def eval_prompts(self) -> Prompts:
        """The K evaluation prompts (one per key, contexts unseen in training)."""
        return self._prompts(self.num_prompts + torch.arange(self.recipe.num_keys))


class SyntheticLM(KeyedLM):
    """The ``synthetic_lm`` world (module docstring).  ``make_world("synthetic_lm", ...)`` builds it; the first
    build of a recipe distils π₀ (minutes for the default recipe), later builds load it from ``cache_dir``."""

    eos_id: int | None = None

    def __init__(self, recipe: Recipe | None = None, cache_dir: str | Path | None = None) -> None:
        self.recipe = recipe or Recipe()
        generator = torch.Generator().manual_seed(self.recipe.seed)
        # balanced: every digit answers ⌊K/10⌋ or ⌈K/10⌉ keys, so no constant answer beats chance
        num_keys = self.recipe.num_keys
        self.table = (torch.arange(num_keys) % NUM_DIGITS)[torch.randperm(num_keys, generator=generator)]
        self._spell(generator, FIRST_TEXT, Teacher, cache_dir)
        self.pretrained_state, self.threshold = load_or_build(self)

    # ------------------------------------------------------------------------------------------ reward
    def reward(self, prompt_index: Tensor, response_ids: Tensor, response_mask: Tensor,
               generator: torch.Generator | None = None) -> Tensor:
        """1.0 (valid format, right digit) / 0.1 (valid format, wrong digit) / 0 (invalid format), [B]."""
        if response_ids.dim() != 2 or response_ids.shape[1] != self.max_response_len:
            raise ValueError(f"response_ids must be [B, {self.max_response_len}], got {tuple(response_ids.shape)}")
        response_ids = response_ids.cpu()
        prompt_index = prompt_index.cpu()
        valid = self.format_valid(self.prompt_tokens[prompt_index], response_ids)
        right = response_ids[:, -1] == self.table[self.prompt_keys[prompt_index]]
        return torch.where(valid, torch.where(right, CORRECT_REWARD, FORMAT_REWARD), 0.0)

    def format_valid(self, prompt: Tensor, response: Tensor) -> Tensor:
        """ANS at T−2, a digit at T−1 and mean teacher log-prob m(y) ≥ θ: [B] bool."""
        shape_ok = (response[:, -2] == ANS) & (response[:, -1] < NUM_DIGITS)
        return shape_ok & (self.teacher.mean_log_prob(prompt, response) >= self.threshold)

    # ------------------------------------------------------------------------------------------ π₀
    def pretrained_policy(self) -> TransformerPolicy:
        """A fresh copy of π₀."""
        return make_student(self.recipe, self.pretrained_state)


# ================================================================================================ building π₀
def make_student(recipe: Recipe, state: dict[str, Tensor] | None = None, eos_id: int | None = None) -> TransformerPolicy:
    """A transformer policy of the recipe's π₀ architecture (initial weights from ``recipe.seed``; ``eos_id``: the
    token that ends a response, none by default)."""
    return TransformerPolicy(recipe.vocab_size, recipe.response_len, eos_id=eos_id, prompt_vocab_size=recipe.vocab_size,
                             max_prompt_len=1 + CONTEXT_LEN, d_model=recipe.d_model, num_layers=recipe.num_layers,
                             num_heads=recipe.num_heads, seed=recipe.seed, state=state)


def random_prompts(recipe: Recipe, n: int, generator: torch.Generator, first_text: int = FIRST_TEXT) -> Tensor:
    """Prompts of the world's form with random keys and contexts (the distillation corpus): [n, 4], key tokens
    ``first_text + k`` and context tokens from ``first_text`` up."""
    keys = torch.randint(recipe.num_keys, (n, 1), generator=generator)
    context = torch.randint(first_text, recipe.vocab_size, (n, CONTEXT_LEN), generator=generator)
    return torch.cat([first_text + keys, context], dim=1)


def distill(recipe: Recipe, teacher: Teacher, log_every: int = 0,
            make_prompts: Callable[[Any, int, torch.Generator], Tensor] | None = None) -> TransformerPolicy:
    """π₀ = argmin E_{x, y ~ p_T} Σ_t KL(p_T(· | x, y_{<t}) ‖ π(· | x, y_{<t})), AdamW (weight decay 0.01), linear
    warm-up over 5 % of the steps then cosine decay to 0, ``distill_steps`` steps of ``distill_batch`` fresh teacher
    sequences (random prompts of the world's form: ``make_prompts(recipe, n, generator)``, default
    :func:`random_prompts`)."""
    make_prompts = make_prompts or random_prompts
    student = make_student(recipe)
    params = student.trainable_parameters()
    optimizer = torch.optim.AdamW(params, lr=recipe.distill_lr, weight_decay=0.01)
    warmup = max(1, recipe.distill_steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (
        1 + math.cos(math.pi * min(1.0, s / max(1, recipe.distill_steps)))))
    generator = torch.Generator().manual_seed(recipe.seed + 104729)
    batch = recipe.distill_batch
    ones, index = torch.ones(batch, 1 + CONTEXT_LEN), torch.zeros(batch, dtype=torch.long)
    for step in range(recipe.distill_steps):
        if step % CORPUS_CHUNK == 0:  # teacher sequences for the next CORPUS_CHUNK steps, sampled in one pass
            prompts = make_prompts(recipe, CORPUS_CHUNK * batch, generator)
            responses, teacher_logps = teacher.sample(prompts, generator)
        rows = slice((step % CORPUS_CHUNK) * batch, (step % CORPUS_CHUNK + 1) * batch)
        prompt, response, teacher_logp = prompts[rows], responses[rows], teacher_logps[rows]
        logits = student.response_logits(prompt, ones, index, response)
        loss = kl_to_teacher(teacher_logp, torch.log_softmax(logits, -1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        if log_every and step % log_every == 0:
            print(f"distill step {step}: KL {float(loss.detach()):.4f}", flush=True)
    return student


def sharpen(policy: TransformerPolicy, temperature: float) -> TransformerPolicy:
    """π₀(· | x, y_{<t}) = softmax(z / t_π₀) for the distilled student's logits z: the head's weight and bias are
    divided by t_π₀ (``pi0_temperature``; 1 leaves the student as distilled, < 1 sharpens it)."""
    if temperature != 1.0:
        with torch.no_grad():
            policy.model.head.weight.div_(temperature)
            policy.model.head.bias.div_(temperature)
    return policy


def kl_to_teacher(teacher_logp: Tensor, student_logp: Tensor) -> Tensor:
    """Mean over positions of KL(p_T ‖ π) = Σ_v p_T,v (log p_T,v − log π_v) (terms with p_T,v = 0 add 0)."""
    p = teacher_logp.exp()
    terms = torch.where(p > 0, p * (teacher_logp - student_logp), torch.zeros_like(p))
    return terms.sum(-1).mean()


def format_threshold(world: SyntheticLM, policy: TransformerPolicy) -> float:
    """θ = 1st percentile of m(y) over ``threshold_samples`` samples of ``policy`` per training prompt."""
    r = world.recipe
    generator = torch.Generator().manual_seed(r.seed + 1299709)
    prompts = world._prompts(torch.arange(world.num_prompts))
    rollout = policy.sample(prompts, r.threshold_samples, 1.0, generator)
    scores = world.teacher.mean_log_prob(rollout.prompt_ids.long(), rollout.response_ids)
    return float(torch.quantile(scores.double(), 0.01))


def read_cached(path: Path, recipe: Recipe) -> tuple[dict[str, Tensor], float] | None:
    """(π₀ state, θ) stored at ``path`` for exactly this recipe and build version, else None (a missing file, or one
    :func:`cache_problem` rejects: never trusted; tensors only, ``weights_only=True``)."""
    found = _load_cached(path, recipe)
    return None if isinstance(found, str) or found is None else found


def cache_problem(path: Path, recipe: Recipe) -> str | None:
    """Why the file at ``path`` cannot serve as this recipe's π₀ (None when it can, or when there is no file): it
    must load with ``torch.load(weights_only=True)`` as a dict holding ``recipe`` (this recipe's JSON), ``version``
    (:data:`RECIPE_VERSION`), ``state`` (π₀'s tensors: every name, shape and dtype of the recipe's architecture)
    and ``threshold`` (a finite number)."""
    found = _load_cached(path, recipe)
    return found if isinstance(found, str) else None


def _load_cached(path: Path, recipe: Recipe) -> tuple[dict[str, Tensor], float] | str | None:
    if not path.exists():
        return None
    try:
        stored = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a damaged or foreign file is ignored, never trusted
        return f"not loadable with weights_only=True: {type(exc).__name__}"
    if not isinstance(stored, dict) or not {"recipe", "version", "state", "threshold"} <= set(stored):
        return "not a π₀ cache file (a dict with recipe, version, state and threshold)"
    if stored["recipe"] != json.dumps(recipe.identity(), sort_keys=True) or stored["version"] != RECIPE_VERSION:
        return "built for another recipe or build version"
    expected = make_student(recipe).state_dict()
    state = stored["state"]
    if not isinstance(state, dict) or set(state) != set(expected) or any(
            not isinstance(state[k], Tensor) or state[k].shape != v.shape or state[k].dtype != v.dtype
            for k, v in expected.items()):
        return "its π₀ weights do not fit the recipe's architecture"
    threshold = stored["threshold"]
    if isinstance(threshold, Tensor) and threshold.numel() == 1:
        threshold = threshold.item()
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
        return "its format threshold is not a finite number"
    return state, float(threshold)


_BUILT: dict[Path, tuple[dict[str, Tensor], float]] = {}  # π₀ built in this process but not cached on disk
_WARNED: set[str] = set()


def warn_once(message: str) -> None:
    """Print ``offpolicylab: warning: MESSAGE`` on stderr, once per process."""
    if message not in _WARNED:
        _WARNED.add(message)
        print(f"offpolicylab: warning: {message}", file=sys.stderr, flush=True)


def load_or_build(world: SyntheticLM) -> tuple[dict[str, Tensor], float]:
    """(π₀ state, θ) from ``world.cache_path``, else from the copy shipped with the package (the default recipe's
    build, made by this same code), else distilled and written to ``world.cache_path`` atomically.

    A file that exists but is not this recipe's π₀ (:func:`cache_problem`) is ignored with one warning line.  A
    cache folder that cannot be written is found before the build: π₀ is then built, kept in memory for this
    process (later builds of the recipe reuse it) and not written, which one warning line says."""
    for path in (world.cache_path, PACKAGED_DIR / world.cache_path.name):
        found = _load_cached(path, world.recipe)
        if isinstance(found, str):
            warn_once(f"ignoring the π₀ cache file {path} ({found})")
        elif found is not None:
            return found
    if world.cache_path in _BUILT:
        return _BUILT[world.cache_path]
    unwritable = _unwritable(world.cache_dir)
    if unwritable:
        warn_once(f"π₀ cannot be cached in {world.cache_dir} ({unwritable}); it is built for this process only "
                  "and rebuilt next time: set OFFPOLICYLAB_CACHE (or the world parameter cache_dir) to a writable "
                  "folder to keep it")
    check_build_memory(world.recipe)
    with torch.random.fork_rng(devices=[]):
        student = sharpen(distill(world.recipe, world.teacher), world.recipe.pi0_temperature)
        threshold = format_threshold(world, student)
    state = student.state_dict()
    if unwritable or not _write_cache(world.cache_path, world.recipe, state, threshold):
        _BUILT[world.cache_path] = (state, threshold)
    return state, threshold


def _unwritable(folder: Path) -> str | None:
    """Why π₀ cannot be written into ``folder`` (created if missing), or None when it can."""
    try:
        check_writable(folder, "cache_dir")
    except ValueError as exc:
        return str(exc).split(": ", 1)[-1].split("; valid:")[0]
    return None


def _write_cache(path: Path, recipe: Recipe, state: dict[str, Tensor], threshold: float) -> bool:
    """Write π₀ atomically (a temporary file renamed into place); False, after one warning line, when the disk
    refuses (the build is then kept in memory)."""
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"recipe": json.dumps(recipe.identity(), sort_keys=True), "version": RECIPE_VERSION,
                    "state": state, "threshold": threshold}, partial)
        os.replace(partial, path)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        warn_once(f"π₀ could not be cached at {path} ({' '.join(str(exc).split())}); it is kept for this process "
                  "only: set OFFPOLICYLAB_CACHE (or the world parameter cache_dir) to a writable folder to keep it")
        return False
    return True


def check_build_memory(recipe: Recipe) -> None:
    """Refuse a recipe whose distillation cannot fit in this machine's memory, before building: a lower bound, the
    teacher corpus of :data:`CORPUS_CHUNK` steps (its tokens and full log p_T, 4 bytes per vocabulary entry, held
    twice while sampled: [CORPUS_CHUNK · distill_batch, T, V] floats)."""
    need = 2 * CORPUS_CHUNK * recipe.distill_batch * recipe.response_len * recipe.vocab_size * 4
    total = physical_memory()
    if need > total:
        raise ValueError(f"building π₀ needs at least {need / 2**30:,.1f} GiB (distill_batch × response_len × "
                         f"vocab_size = {recipe.distill_batch} × {recipe.response_len} × {recipe.vocab_size} teacher "
                         f"distributions, {CORPUS_CHUNK} steps at a time) but this machine has {total / 2**30:,.1f} "
                         "GiB; valid: a smaller distill_batch, response_len or vocab_size")
