"""Recipe v6 of the synthetic-LM world (preset ``seed_scale_v6``): a reward decided by a chain of forks, responses of
variable length ended by EOS and truncated at T_max (design: ``docs/synthetic_lm_v6.md``).

Tokens (V = 256): 0–9 digits, 10 ANS, 11 EOS, 12 ``=`` (a step's result follows), 13–255 text; a prompt is
[key token 13 + k, 3 random text tokens].  Grammar of a response::

    y = s_1 … s_n  ANS  a  EOS,        s_j = (text)*  =  d_j

The hidden task: a start digit start[k] per key (balanced) and step rules G_0 … G_{R−1} (R = ``num_rules``, 1 in v6
and v7), permutations of the digits without fixed points; key k follows G = G_{k mod R}.  The chain is right when
d_1 = start[k], d_j = G(d_{j−1}) and a = G(d_n).

**Teacher** p_T (the v5 random transformer; Zheng et al. 2025, arXiv:2510.01161, motivates the regime): at a text
position p_T = softmax(α κ(h) (ẑ + b)) over text ∪ {=, ANS} with b_= = ``step_bias``, b_ANS = λ (t − t_c); after ``=``
or ANS a digit from softmax(β_s 1[d = start[k]] + key_scale E[k] + digit_scale ẑ_d) (no step yet) or
softmax(β_G 1[d = G(d_prev)] + g ẑ_d); after the answer digit EOS; after EOS only EOS.

**Reward**: 0 when truncated (no EOS within T_max), ungrammatical, with fewer than ``min_steps`` steps or off the
pretrained manifold (m(y) < θ, m the mean teacher log-probability over the tokens up to and including EOS, floored
at −30; θ its 1st percentile over π₀'s samples); else 1.0 when the chain is right and 0.1 when it is wrong.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from offpolicylab.policies.transformer import KVCache, TransformerPolicy
from offpolicylab.worlds import synthetic_lm as v5

NUM_DIGITS = 10
ANS = 10
EOS = 11
STEP = 12
FIRST_TEXT = 13
CONTEXT_LEN = 3
LOG_FLOOR = -30.0
CORRECT_REWARD = 1.0
FORMAT_REWARD = 0.1
SCORE_CHUNK = 512  # rows of teacher log-probs [rows, T, V] computed at a time


@dataclass(frozen=True)
class ChainRecipe(v5.RecipeBase):
    """Everything that determines the v6 teacher, π₀ and θ (cached by the SHA-256 of this, like v5's Recipe)."""

    task: str = "chain"
    vocab_size: int = 256
    response_len: int = 64
    num_keys: int = 64
    num_train_prompts: int = 512
    alpha: float = 64.0
    sharpness_spread: float = 1.5
    step_bias: float = 1.75
    answer_slope: float = 0.25
    answer_centre: float = 36.0
    start_bonus: float = 2.0
    rule_bonus: float = 5.0
    step_noise: float = 1.5
    key_scale: float = 1.0
    digit_scale: float = 0.3
    min_steps: int = 3
    num_rules: int = 1  # R step rules, key k follows G_{k mod R} (docs/synthetic_lm_v7.md, part 20)
    distill_steps: int = 600  # the design's fallback: 1200 steps project to 19 min on this machine
    pi0_temperature: float = 0.7  # chosen by the design's rule from one scan of the distilled student
    threshold_samples: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        if self.vocab_size < FIRST_TEXT + max(self.num_keys, CONTEXT_LEN) + 1:
            raise ValueError(f"vocab_size={self.vocab_size} is too small; valid: >= {FIRST_TEXT + self.num_keys + 1}")
        if self.response_len < 3 * self.min_steps + 3:
            raise ValueError(f"response_len={self.response_len} is invalid; valid: >= 3 * min_steps + 3 "
                             f"({3 * self.min_steps + 3})")
        for name in ("num_keys", "num_train_prompts", "distill_batch", "threshold_samples"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} is invalid; valid: an integer >= 1")
        if self.min_steps < 0:
            raise ValueError(f"min_steps={self.min_steps} is invalid; valid: an integer >= 0")
        if not 1 <= self.num_rules <= self.num_keys:
            raise ValueError(f"num_rules={self.num_rules} is invalid; valid: an integer in [1, num_keys] "
                             f"([1, {self.num_keys}])")
        if not 0.05 <= self.pi0_temperature <= 10.0:
            raise ValueError(f"pi0_temperature={self.pi0_temperature} is invalid; valid: a float in [0.05, 10]")
        if not 0.0 <= self.alpha <= v5.MAX_TEACHER_SCALE:
            raise ValueError(f"alpha={self.alpha} is invalid; valid: a float in [0, {v5.MAX_TEACHER_SCALE:g}]")
        if not 0.0 <= self.sharpness_spread <= v5.MAX_SHARPNESS_SPREAD:
            raise ValueError(f"sharpness_spread={self.sharpness_spread} is invalid; valid: a float in "
                             f"[0, {v5.MAX_SHARPNESS_SPREAD:g}]")

    def identity(self) -> dict[str, Any]:
        """The recipe's fields without ``num_rules`` when it is 1: recipes v6 and v7 keep the digest (and so the
        shipped π₀ file) they had before the field existed."""
        fields = asdict(self)
        if self.num_rules == 1:
            del fields["num_rules"]
        return fields


CHAIN_PRESETS: dict[str, ChainRecipe] = {"seed_scale_v6": ChainRecipe(),
                                          "seed_scale_v7": ChainRecipe(num_layers=8)}
#: the policy options a preset suggests (:func:`~offpolicylab.policies.preset_engines`: an option a run leaves
#: unset takes the preset's): recipe v7 is v6's world with an 8 × 64 π₀ (the depth its screen chose) trained as the
#: seeds' engines run it — a bf16 trainer on 16-bit copies of the weights, logits at a real model's level (+12), a
#: bf16 sampler, the old log-probs recomputed in 16-row micro-batches whose GEMMs split the inner dimension in 4
#: (docs/synthetic_lm_v7.md, parts 7 and 12)
PRESET_POLICY: dict[str, dict[str, object]] = {
    "seed_scale_v7": {"trainer_precision": "bf16", "sampler_precision": "bf16", "logp_micro_batch": 16,
                      "trainer_weights": "cast", "logit_offset": 12.0, "recompute_split_k": 4}}


def _derangement(generator: torch.Generator) -> Tensor:
    """A permutation of the digits without fixed points (every step changes the digit): uniform draws until one
    has none."""
    while True:
        rule = torch.randperm(NUM_DIGITS, generator=generator)
        if bool((rule != torch.arange(NUM_DIGITS)).all()):
            return rule


def _standardise(z: Tensor) -> Tensor:
    return (z - z.mean(-1, keepdim=True)) / z.std(-1, keepdim=True).clamp(min=1e-6)


# ================================================================================================ grammar state
@dataclass
class ChainState:
    """What the grammar needs to know before token y_t, per row [B]: the two previous tokens, whether EOS was
    written, the last step digit (−1: none) and the number of steps so far."""

    prev: Tensor
    prev2: Tensor
    ended: Tensor
    last_step: Tensor
    steps: Tensor

    @classmethod
    def start(cls, prompt: Tensor) -> ChainState:
        batch = prompt.shape[0]
        return cls(prompt[:, -1].clone(), prompt[:, -2].clone(), torch.zeros(batch, dtype=torch.bool),
                   torch.full((batch,), -1, dtype=torch.long), torch.zeros(batch, dtype=torch.long))

    def advance(self, token: Tensor) -> ChainState:
        """The state before the next token, after ``token`` [B] was written."""
        is_step = (self.prev == STEP) & (token < NUM_DIGITS) & ~self.ended
        return ChainState(token, self.prev, self.ended | (token == EOS), torch.where(is_step, token, self.last_step),
                          self.steps + is_step.long())

    def after_answer(self) -> Tensor:
        """[B] bool: the previous token is the answer digit (EOS must follow)."""
        return (self.prev < NUM_DIGITS) & (self.prev2 == ANS)


def chain_states(prompt: Tensor, response: Tensor) -> list[ChainState]:
    """The :class:`ChainState` before each response position t = 0 … T−1."""
    state = ChainState.start(prompt)
    states = []
    for t in range(response.shape[1]):
        states.append(state)
        state = state.advance(response[:, t])
    return states


def flat_states(states: list[ChainState]) -> ChainState:
    """The states before every position as one state of B·T rows, row b·T + t = row b of ``states[t]``."""
    fields = ("prev", "prev2", "ended", "last_step", "steps")
    return ChainState(*(torch.stack([getattr(state, name) for state in states], 1).reshape(-1) for name in fields))


# ================================================================================================ the teacher
class ChainTeacher:
    """p_T of the module docstring (no parameter is trained)."""

    def __init__(self, recipe: ChainRecipe) -> None:
        self.recipe = recipe
        self.vocab_size, self.response_len = recipe.vocab_size, recipe.response_len
        self.net, self.direction, self.key_logits = v5.random_teacher(recipe)  # CONTEXT_LEN is v5's 3 too
        generator = torch.Generator().manual_seed(recipe.seed + 15485863)
        self.start = (torch.arange(recipe.num_keys) % NUM_DIGITS)[torch.randperm(recipe.num_keys, generator=generator)]
        self.rules = torch.stack([_derangement(generator) for _ in range(recipe.num_rules)])  # [R, 10]
        self.free = torch.cat([torch.tensor([ANS]), torch.arange(STEP, recipe.vocab_size)])  # text-position tokens

    def rule_of(self, key: Tensor) -> Tensor:
        """Each key's step rule G_{k mod R} as a digit table, [B, 10] for keys [B]."""
        return self.rules[key % self.rules.shape[0]]

    def distribution(self, hidden: Tensor, t: Tensor, state: ChainState, key_token: Tensor) -> Tensor:
        """p_T [B, V] at response position t (a [1] or [B] tensor) from hidden states [B, d] and the state."""
        r, batch = self.recipe, hidden.shape[0]
        z = self.net.head(hidden)
        bias = torch.zeros(batch, self.free.numel())
        bias[:, 0] = r.answer_slope * (t.float() - r.answer_centre)
        bias[:, 1] = r.step_bias
        kappa = torch.exp(r.sharpness_spread * (hidden @ self.direction))
        text = torch.softmax(r.alpha * kappa[:, None] * (_standardise(z[:, self.free]) + bias), -1)
        z_digit = _standardise(z[:, :NUM_DIGITS])
        key = (key_token - FIRST_TEXT).clamp(0, r.num_keys - 1)
        onehot_start = torch.nn.functional.one_hot(self.start[key], NUM_DIGITS).float()
        first = torch.softmax(r.start_bonus * onehot_start + r.key_scale * self.key_logits[key]
                              + r.digit_scale * z_digit, -1)
        after = self.rule_of(key).gather(1, state.last_step.clamp(min=0)[:, None]).squeeze(1)
        onehot_rule = torch.nn.functional.one_hot(after, NUM_DIGITS).float()
        following = torch.softmax(r.rule_bonus * onehot_rule + r.step_noise * z_digit, -1)
        digit = torch.where((state.last_step < 0)[:, None], first, following)
        probs = torch.zeros(batch, self.vocab_size)
        probs[:, self.free] = text
        slot = (state.prev == STEP) | (state.prev == ANS)
        probs = torch.where(slot[:, None], torch.cat([digit, torch.zeros(batch, self.vocab_size - NUM_DIGITS)], 1),
                            probs)
        eos = torch.nn.functional.one_hot(torch.full((batch,), EOS), self.vocab_size).float()
        return torch.where((state.ended | state.after_answer())[:, None], eos, probs)

    def log_probs(self, prompt: Tensor, response: Tensor) -> Tensor:
        """log p_T(· | x, y_{<t}) for every response position, [B, T, V] (−inf where p_T = 0)."""
        return self.probs(prompt, response).log()

    def probs(self, prompt: Tensor, response: Tensor) -> Tensor:
        """p_T(· | x, y_{<t}) for every response position, [B, T, V]: one causal pass, and :meth:`distribution` once
        over all B·T positions."""
        batch, width = response.shape
        with torch.no_grad():
            tokens = torch.cat([prompt, response[:, :-1]], dim=1)
            hidden = self.net(tokens, torch.ones_like(tokens, dtype=torch.bool))[:, prompt.shape[1] - 1:]
            state = flat_states(chain_states(prompt, response))
            t = torch.arange(width).repeat(batch)
            probs = self.distribution(hidden.reshape(batch * width, -1), t, state,
                                      prompt[:, 0].repeat_interleave(width))
            return probs.reshape(batch, width, -1)

    def sample(self, prompt: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """(responses [B, T], log p_T [B, T, V]) sampled with a key/value cache."""
        batch, width = prompt.shape[0], self.response_len
        response = torch.zeros(batch, width, dtype=torch.long)
        log_probs = torch.empty(batch, width, self.vocab_size)
        cache = KVCache()
        state = ChainState.start(prompt)
        with torch.no_grad():
            inputs = prompt
            for t in range(width):
                hidden = self.net(inputs, torch.ones_like(inputs, dtype=torch.bool), cache)[:, -1]
                probs = self.distribution(hidden, torch.tensor([t]), state, prompt[:, 0])
                token = torch.multinomial(probs, 1, generator=generator).squeeze(1)
                response[:, t], log_probs[:, t] = token, probs.log()
                state = state.advance(token)
                inputs = token[:, None]
        return response, log_probs

    def token_log_probs(self, prompt: Tensor, response: Tensor) -> Tensor:
        """log p_T(y_t | x, y_{<t}) [B, T], in chunks of :data:`SCORE_CHUNK` rows."""
        parts = []
        for rows in torch.arange(prompt.shape[0]).split(SCORE_CHUNK):
            probs = self.probs(prompt[rows], response[rows])
            parts.append(probs.gather(-1, response[rows][..., None])[..., 0].log())
        return torch.cat(parts)

    def mean_log_prob(self, prompt: Tensor, response: Tensor) -> Tensor:
        """m(y) = mean over the tokens up to and including the first EOS (all T without one) of
        max(log p_T(y_t | x, y_{<t}), −30), [B]."""
        mask = response_mask(response)
        return (self.token_log_probs(prompt, response).clamp(min=LOG_FLOOR) * mask).sum(1) / mask.sum(1)


def response_mask(response: Tensor) -> Tensor:
    """1 up to and including the first EOS, 0 after it, [B, T] float."""
    is_eos = (response == EOS).long()
    return (torch.cumsum(is_eos, 1) - is_eos == 0).float()


# ================================================================================================ parsing
def parse(response: Tensor, start: Tensor, rule: Tensor, prompt: Tensor | None = None) -> dict[str, Tensor]:
    """Per row [B]: ``ended`` (an EOS within T), ``grammar`` (digits exactly after ``=``/ANS, EOS exactly after the
    answer digit), ``steps`` (digits after ``=``), ``right`` (d_1 = start, d_j = G(d_{j−1}), answer = G(d_n)),
    ``length`` (tokens up to and including EOS, T when truncated).  ``start`` [B]: each row's start digit; ``rule``:
    G as a digit table, [10] for every row or [B, 10] per row; ``prompt`` [B, P] (default: text) gives the tokens
    before the response."""
    batch, width = response.shape
    rule = rule.expand(batch, NUM_DIGITS)
    state = ChainState.start(torch.full((batch, 2), FIRST_TEXT) if prompt is None else prompt)
    grammar = torch.ones(batch, dtype=torch.bool)
    right = torch.ones(batch, dtype=torch.bool)
    expected = start.clone()
    answered = torch.zeros(batch, dtype=torch.bool)
    for t in range(width):
        token, live = response[:, t], ~state.ended
        slot = (state.prev == STEP) | (state.prev == ANS)
        ok = ((token < NUM_DIGITS) == slot) & ((token == EOS) == state.after_answer())
        grammar &= ~live | ok
        digit = live & slot & (token < NUM_DIGITS)
        right &= ~digit | (token == expected)
        answered |= digit & (state.prev == ANS)
        expected = torch.where(digit, rule.gather(1, token.clamp(0, NUM_DIGITS - 1)[:, None]).squeeze(1), expected)
        state = state.advance(token)
    return {"ended": state.ended, "grammar": grammar & answered, "steps": state.steps, "right": right & answered,
            "length": response_mask(response).sum(1).long()}


# ================================================================================================ the world
class ChainLM(v5.KeyedLM):
    """The ``synthetic_lm`` world at preset ``seed_scale_v6`` (module docstring)."""

    eos_id: int | None = EOS
    policy_defaults: dict[str, object] = {}  # noqa: RUF012 - replaced per world, never mutated (PRESET_POLICY)

    def __init__(self, recipe: ChainRecipe | None = None, cache_dir: str | Path | None = None) -> None:
        self.recipe = recipe or ChainRecipe()
        self._spell(torch.Generator().manual_seed(self.recipe.seed), FIRST_TEXT, ChainTeacher, cache_dir)
        self.pretrained_state, self.threshold = load_or_build(self)

    def parse(self, prompt_index: Tensor, response_ids: Tensor) -> dict[str, Tensor]:
        """:func:`parse` of the responses of these prompts."""
        prompt_index, response_ids = prompt_index.cpu(), response_ids.cpu()
        keys = self.prompt_keys[prompt_index]
        return parse(response_ids, self.teacher.start[keys], self.teacher.rule_of(keys),
                     self.prompt_tokens[prompt_index])

    def reward(self, prompt_index: Tensor, response_ids: Tensor, response_mask: Tensor,
               generator: torch.Generator | None = None) -> Tensor:
        """1.0 (valid, chain right) / 0.1 (valid, chain wrong) / 0 (truncated, ungrammatical, < min_steps steps or
        m(y) < θ), [B]."""
        if response_ids.dim() != 2 or response_ids.shape[1] != self.max_response_len:
            raise ValueError(f"response_ids must be [B, {self.max_response_len}], got {tuple(response_ids.shape)}")
        prompt_index, response_ids = prompt_index.cpu(), response_ids.cpu()
        found = self.parse(prompt_index, response_ids)
        valid = found["ended"] & found["grammar"] & (found["steps"] >= self.recipe.min_steps)
        if bool(valid.any()):
            m = self.teacher.mean_log_prob(self.prompt_tokens[prompt_index[valid]], response_ids[valid])
            on_manifold = torch.zeros_like(valid)
            on_manifold[valid] = m >= self.threshold
            valid = on_manifold
        return torch.where(valid, torch.where(found["right"], CORRECT_REWARD, FORMAT_REWARD), 0.0)

    def pretrained_policy(self) -> TransformerPolicy:
        """A fresh copy of π₀ (EOS ends its responses)."""
        return make_student(self.recipe, self.pretrained_state)


# ================================================================================================ building π₀
def make_student(recipe: ChainRecipe, state: dict[str, Tensor] | None = None) -> TransformerPolicy:
    """v5's π₀ architecture (:func:`~offpolicylab.worlds.synthetic_lm.make_student`) with EOS = 11 ending responses."""
    return v5.make_student(recipe, state, eos_id=EOS)  # type: ignore[arg-type]


def random_prompts(recipe: ChainRecipe, n: int, generator: torch.Generator) -> Tensor:
    """v5's distillation prompts (:func:`~offpolicylab.worlds.synthetic_lm.random_prompts`) in this world's
    vocabulary (text from token 13): [n, 4]."""
    return v5.random_prompts(recipe, n, generator, first_text=FIRST_TEXT)  # type: ignore[arg-type]


def load_or_build(world: ChainLM) -> tuple[dict[str, Tensor], float]:
    """(π₀ state, θ): the recipe's cache file (user cache, then the package's copy); else the same recipe at
    t_π₀ = 1 (the distilled student, cached the same way) sharpened to t_π₀ with θ recomputed; else distilled
    (:func:`offpolicylab.worlds.synthetic_lm.distill`) and both files written."""
    r = world.recipe
    found = _find(world.cache_dir, r)
    if found is not None:
        return found
    plain = replace(r, pi0_temperature=1.0)
    student_state = _find(world.cache_dir, plain)
    if student_state is None:
        v5.check_build_memory(r)  # type: ignore[arg-type]
        with torch.random.fork_rng(devices=[]):
            student = v5.distill(r, world.teacher, make_prompts=random_prompts)  # type: ignore[arg-type]
            student = make_student(plain, student.state_dict())
            theta = v5.format_threshold(world, student)  # type: ignore[arg-type]
        student_state = (student.state_dict(), theta)
        v5._write_cache(world.cache_dir / f"{plain.digest()[:32]}.pt", plain, *student_state)  # type: ignore[arg-type]
    if r.pi0_temperature == 1.0:
        return student_state
    with torch.random.fork_rng(devices=[]):
        policy = v5.sharpen(make_student(r, student_state[0]), r.pi0_temperature)
        theta = v5.format_threshold(world, policy)  # type: ignore[arg-type]
    v5._write_cache(world.cache_path, r, policy.state_dict(), theta)  # type: ignore[arg-type]
    return policy.state_dict(), theta


def _find(cache_dir: Path, recipe: ChainRecipe) -> tuple[dict[str, Tensor], float] | None:
    name = f"{recipe.digest()[:32]}.pt"
    for path in (cache_dir / name, v5.PACKAGED_DIR / name):
        found = v5._load_cached(path, recipe)  # type: ignore[arg-type]
        if isinstance(found, str):
            v5.warn_once(f"ignoring the π₀ cache file {path} ({found})")
        elif found is not None:
            return found
    return None


V5_ONLY = ("ans_prob", "delta")


def build_chain(preset: str, cache_dir: str | None, given: dict[str, Any], registry_defaults: dict[str, Any]
                ) -> ChainLM:
    """The v6 world for :func:`offpolicylab.worlds.synthetic_lm_presets.build_synthetic_lm`: the preset's recipe with the
    parameters that were given.  The registry fills every unset parameter with v5's default, so a value equal to
    that default means "the preset's value" here; v5-only parameters must stay at their defaults."""
    recipe = CHAIN_PRESETS[preset]
    changes = {}
    for name, value in given.items():
        if value is None or registry_defaults.get(name, object()) == value:
            continue
        if name in V5_ONLY or not hasattr(recipe, name):
            raise ValueError(f"{name}={value!r} is not a parameter of preset {preset!r}; valid: leave it unset, or "
                             "name a recipe-v5 preset (preset=seed_scale)")
        changes[name] = value
    world = ChainLM(replace(recipe, **changes), cache_dir=cache_dir)
    world.policy_defaults = dict(PRESET_POLICY.get(preset, {}))
    return world
