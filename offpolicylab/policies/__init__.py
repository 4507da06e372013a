"""Policies: a tabular softmax, a small GRU sequence model and a Hugging Face causal LM with a LoRA adapter
(docs/design.md, "Policies").  Every kind is built by the :data:`POLICIES` registry from a world.

>>> from offpolicylab.worlds import make_world
>>> from offpolicylab.policies import make_policy
>>> world = make_world("token_mdp", family="target")
>>> policy = make_policy("tabular", world)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from offpolicylab.contracts import InitialLogitsWorld, Policy, PretrainedWorld, Prompts, Rollout, World
from offpolicylab.policies.autoregressive import TOKEN_DRAWS, AutoregressivePolicy, check_token_draw
from offpolicylab.policies.hf import PLANNED_PARAMS, hf_policy_params, make_hf_policy
from offpolicylab.policies.mixed_precision import TRAINER_PRECISIONS, TRAINER_WEIGHTS
from offpolicylab.policies.precision import PRECISIONS
from offpolicylab.policies.sequence_model import SequenceModelPolicy, StackedSequenceModelPolicy
from offpolicylab.policies.tabular import CONTEXTS, StackedTabularPolicy, TabularSoftmaxPolicy
from offpolicylab.policies.transformer import (
    SCORE_PADDINGS,
    TransformerPolicy,
    check_compiled,
    check_score_padding,
)
from offpolicylab.policies.transformer_stack import StackedTransformerPolicy
from offpolicylab.registry import MAX_SEED, Param, Registry

POLICIES: Registry[Policy] = Registry("policy", plugins="offpolicylab.policies")
"""Policy kinds.  An entry's metadata declares optional abilities: ``stack`` (a class whose constructor takes the
members' policies and answers row block s of a batch with member s: batched seeds), ``stack_in_sweeps`` (stacking
saves time, so a sweep trains such cells together), ``planned_params`` (the options the policy's memory plan fills
in), ``frozen_copy`` (whether evaluation keeps a frozen copy of π₀ by default: not for a large model)."""

MAX_LOGIT_SCALE = 1000.0  # logit_scale and sampler_noise_std: beyond it float32 logits need not stay finite
_SAMPLER_NOISE = Param(0.0, float, low=0.0, high=MAX_LOGIT_SCALE,
                       doc="std of the sampler's logit noise (0 = exact sampler)")
_SAMPLER_PRECISION = Param("fp32", str, choices=PRECISIONS,
                           doc="precision the sampling engine computes its logits and softmax in (weights stored in "
                               "it; fp8 simulated, docs/sampler_precision.md); the trainer scores in fp32")


def _shape(kind: str, world: World) -> dict[str, Any]:
    """The token space of a toy policy for ``world``; a world that names a language model has the model's."""
    if getattr(world, "model", None):
        raise ValueError(f"policy {kind!r} cannot act in a world that names a language model "
                         f"({type(world).__name__}); valid: --policy hf")
    return {"vocab_size": world.vocab_size, "response_len": world.max_response_len, "eos_id": world.eos_id}


def build_tabular(world: World, *, context: str, init: str, sampler_noise_std: float,
                  sampler_precision: str) -> TabularSoftmaxPolicy:
    """A logits table per prompt (and context) sized for ``world``; ``init="world"`` starts from the world's
    suggested logits when it has them."""
    shape = _shape("tabular", world)
    wants_init = init == "world" and isinstance(world, InitialLogitsWorld)
    init_logits = world.initial_logits() if wants_init else None
    context = "none" if world.max_response_len == 1 and world.eos_id is None else context
    return TabularSoftmaxPolicy(num_prompts=world.num_prompts, context=context, init_logits=init_logits,
                                sampler_noise_std=sampler_noise_std, sampler_precision=sampler_precision, **shape)


def _check_prompt_len(max_prompt_len: int, world: World) -> None:
    """``ValueError`` when the world's prompts (``prompt_len`` tokens, where it says) exceed ``max_prompt_len``."""
    longest = getattr(world, "prompt_len", None)
    if isinstance(longest, int) and longest > max_prompt_len:
        raise ValueError(f"parameter max_prompt_len={max_prompt_len} is shorter than the world's prompts ({longest} "
                         f"tokens); valid: an int in [{longest}, inf]")


def build_sequence_model(world: World, **params: Any) -> SequenceModelPolicy:
    """A GRU over the prompt code and the response so far, sized for ``world``."""
    _check_prompt_len(params["max_prompt_len"], world)
    return SequenceModelPolicy(prompt_vocab_size=getattr(world, "prompt_vocab_size", None), **params,
                               **_shape("sequence_model", world))


ENGINE_OPTIONS = ("trainer_precision", "sampler_precision", "logp_micro_batch", "trainer_weights", "logit_offset",
                  "score_padding", "recompute_split_k")
"""The transformer options a pretrained world's ``policy_defaults`` (a preset's engines) may set."""


def build_transformer(world: World, *, init: str, max_prompt_len: int, seed: int, sampler_noise_std: float,
                      token_draw: str, compiled: bool, lm_head_fp32: bool, **options: Any) -> TransformerPolicy:
    """π₀ of a world that has one (``init=pretrained``; sizes given must equal π₀'s), else fresh weights; scored in
    ``trainer_precision`` from ``trainer_weights`` (:mod:`offpolicylab.policies.mixed_precision`) over
    ``score_padding``, every logit shifted by ``logit_offset``
    (:meth:`~offpolicylab.policies.transformer.TransformerPolicy.shift_logits`); ``logp_micro_batch`` > 0: the
    behaviour log-probs recomputed after generation in micro-batches of that many rows (:mod:`offpolicylab.behavior`),
    their GEMMs split-K with ``recompute_split_k`` > 1.  A pretrained world's preset engines reach these options
    through :func:`make_policy` (:func:`preset_engines`)."""
    sizes = {name: value for name, value in options.items() if name not in ENGINE_OPTIONS}
    policy = _build_transformer(world, init, max_prompt_len, seed, sampler_noise_std, options["sampler_precision"],
                                token_draw, compiled, sizes)
    policy.set_trainer_precision(options["trainer_precision"], lm_head_fp32, options["trainer_weights"])
    policy.score_padding = check_score_padding(options["score_padding"])
    if options["logit_offset"]:
        policy.shift_logits(options["logit_offset"])
    policy.logp_micro_batch = options["logp_micro_batch"]
    policy.set_recompute_split_k(options["recompute_split_k"])
    return policy


def _build_transformer(world: World, init: str, max_prompt_len: int, seed: int, sampler_noise_std: float,
                       sampler_precision: str, token_draw: str, compiled: bool,
                       sizes: dict[str, int | None]) -> TransformerPolicy:
    shape = _shape("transformer", world)
    if not (init == "pretrained" and isinstance(world, PretrainedWorld)):
        _check_prompt_len(max_prompt_len, world)
        defaults = {"d_model": 64, "num_layers": 2, "num_heads": 4}
        sizes = {key: defaults[key] if value is None else value for key, value in sizes.items()}
        return TransformerPolicy(prompt_vocab_size=getattr(world, "prompt_vocab_size", None),
                                 max_prompt_len=max_prompt_len, seed=seed, sampler_noise_std=sampler_noise_std,
                                 sampler_precision=sampler_precision, token_draw=token_draw, compiled=compiled,
                                 **sizes, **shape)
    policy = world.pretrained_policy()
    pretrained = {"d_model": policy.shape.d_model, "num_layers": policy.shape.num_layers,
                  "num_heads": policy.shape.num_heads}
    clash = [f"{key}={value} (π₀ has {pretrained[key]})" for key, value in sizes.items()
             if value is not None and value != pretrained[key]]
    if clash:
        raise ValueError(f"transformer {', '.join(clash)} differs from the world's pretrained π₀; valid: leave the "
                         "sizes unset, or init=random")
    policy.sampler_noise_std, policy.sampler_precision = sampler_noise_std, sampler_precision
    policy.token_draw = check_token_draw(token_draw)
    policy.model.compiled = check_compiled(compiled, sampler_precision)
    return policy


POLICIES.register("tabular", build_tabular, {
    "context": Param("prev_token", str, choices=CONTEXTS, doc="what a logits row is conditioned on"),
    "init": Param("world", str, choices=("world", "uniform"),
                  doc="world = the world's suggested initial policy (e.g. π_b of the pitfall) when it has one"),
    "sampler_noise_std": _SAMPLER_NOISE,
    "sampler_precision": _SAMPLER_PRECISION,
}, doc="a softmax logits table per prompt and context", stack=StackedTabularPolicy, stack_in_sweeps=True)
POLICIES.register("sequence_model", build_sequence_model, {
    "embed_dim": Param(32, int, low=1, doc="token embedding width"),
    "hidden_size": Param(64, int, low=1, doc="GRU hidden width"),
    "num_layers": Param(1, int, low=1, doc="GRU layers"),
    "seed": Param(0, int, low=0, high=MAX_SEED, doc="initial-weight seed"),
    "logit_scale": Param(0.4, float, low=0.0, low_open=True, high=MAX_LOGIT_SCALE,
                         doc="logits = logit_scale/√features · head(features); smaller explores longer"),
    "max_prompt_len": Param(64, int, low=1, doc="longest prompt the prompt code accepts"),
    "sampler_noise_std": _SAMPLER_NOISE,
    "sampler_precision": _SAMPLER_PRECISION,
}, doc="a small GRU sequence model", stack=StackedSequenceModelPolicy, stack_in_sweeps=True)
POLICIES.register("transformer", build_transformer, {
    "init": Param("pretrained", str, choices=("pretrained", "random"),
                  doc="pretrained = the world's π₀ (synthetic_lm) when it has one; random = fresh weights"),
    "d_model": Param(None, int, low=1, optional=True, doc="width (default: π₀'s, else 64)"),
    "num_layers": Param(None, int, low=1, optional=True, doc="layers (default: π₀'s, else 2)"),
    "num_heads": Param(None, int, low=1, optional=True, doc="attention heads (default: π₀'s, else 4)"),
    "max_prompt_len": Param(64, int, low=1, doc="longest prompt (random init; π₀ keeps its own)"),
    "seed": Param(0, int, low=0, high=MAX_SEED, doc="initial-weight seed (random init)"),
    "sampler_noise_std": _SAMPLER_NOISE,
    "sampler_precision": _SAMPLER_PRECISION,
    "token_draw": Param("race", str, choices=TOKEN_DRAWS,
                        doc="how decoding draws a token: race = torch.multinomial's exponential race (V numbers per "
                            "step); inverse_cdf = one uniform per step (faster, other tokens)"),
    "compiled": Param(False, bool, doc="run the blocks through torch.compile (faster after a compilation per "
                                       "process; float32 rounding differs; needs a C++ compiler; not with an fp8 "
                                       "sampler_precision)"),
    "trainer_precision": Param("fp32", str, choices=TRAINER_PRECISIONS,
                               doc="precision of the trainer's forwards (loss, old-log-prob recompute, evaluation "
                                   "scoring) under autocast, fp32 master weights and Adam state, log-softmax in fp32; "
                                   "fp16 with a dynamic loss scale (docs/sampler_precision.md)"),
    "lm_head_fp32": Param(False, bool, doc="compute the LM head and its softmax in fp32 in both engines, the "
                                           "trainer's and the sampler's, under 16-bit precisions (MiniMax-M1's "
                                           "fix)"),
    "trainer_weights": Param("master", str, choices=TRAINER_WEIGHTS,
                             doc="which weights a 16-bit trainer forward reads: master = the fp32 masters (autocast "
                                 "rounds the matrix products only); cast = 16-bit copies of every weight (FSDP "
                                 "param_dtype: embeddings, residual stream and LayerNorms round too)"),
    "logit_offset": Param(0.0, float, low=-64.0, high=64.0,
                          doc="add c to every logit of the initial weights (the LM head's bias): softmax is unchanged "
                              "in exact arithmetic, but 16-bit logits round with the spacing of their magnitude, as a "
                              "real LLM's large logits do (docs/synthetic_lm_v7.md)"),
    "score_padding": Param("fixed", str, choices=SCORE_PADDINGS,
                           doc="length of each scoring forward: fixed = every row over the full response length; "
                               "longest = over its rows' longest response, as Hugging Face / verl micro-batches pad "
                               "(the recompute's micro-batches and the training forward then differ in length)"),
    "recompute_split_k": Param(1, int, low=1, high=16,
                               doc="> 1: the old-log-prob recompute's linear maps run as split-K GEMMs with this many "
                                   "fp32 partial sums (the same products added in another order, as a GPU's kernel "
                                   "for a smaller micro-batch; docs/synthetic_lm_v7.md part 12); needs a 16-bit "
                                   "trainer_precision and logp_micro_batch > 0"),
    "logp_micro_batch": Param(0, int, low=0, doc="> 0: the trainer recomputes the behaviour (old) log-probs right "
                                                  "after generation in micro-batches of this many rows, as verl does; "
                                                  "0: they come from the sampling pass (fp32) or one forward"),
}, doc="a small causal transformer (the synthetic_lm world's π₀ by default)", stack=StackedTransformerPolicy,
    stack_in_sweeps=False)  # its stacked work grows with the rows: ≈ separate runs' cost (benchmarks/README.md)
POLICIES.register("hf", make_hf_policy, hf_policy_params(),
                  doc="a Hugging Face causal LM + peft LoRA adapter (worlds that name a model: gsm8k)",
                  planned_params=PLANNED_PARAMS, frozen_copy=False)


def policy_ability(kind: str, name: str, default: Any = None) -> Any:
    """The registry metadata ``name`` of policy ``kind`` (``default`` when it does not declare it)."""
    return POLICIES.get(kind).meta.get(name, default) if kind in POLICIES else default


def list_policies() -> list[str]:
    """Policy kinds :func:`make_policy` builds."""
    return POLICIES.names()


def make_policy(kind: str, world: World, **params: Any) -> Policy:
    """Build a policy of ``kind`` sized for ``world`` (its ``vocab_size``, ``max_response_len``, ``eos_id``,
    ``num_prompts``; optional ``prompt_vocab_size`` and ``initial_logits()``), with the engine options its preset
    suggests for those ``params`` leaves unset (:func:`preset_engines`).  Parameters may be CLI strings; an unknown
    kind or parameter raises ``ValueError`` naming the valid ones."""
    return POLICIES.build(kind, world, **params, **preset_engines(kind, world, params))


def preset_engines(kind: str, world: World, params: Mapping[str, Any]) -> dict[str, Any]:
    """The :data:`ENGINE_OPTIONS` a pretrained world's preset suggests (``world.policy_defaults``, e.g.
    ``seed_scale_v7``'s bf16 trainer) for a transformer starting from its π₀, less every option ``params`` gives: a
    given option is kept even at its registered default (``trainer_precision=fp32`` on v7 trains in fp32).  The
    preset's 16-bit parts go with what they need: an fp32 trainer leaves out its 16-bit weight copies
    (``trainer_weights``) and split-K recompute, no recompute (``logp_micro_batch=0``) its split-K — so turning v7's
    16-bit trainer off is one option, not three.  ``compiled=true`` keeps the preset's split-K, which
    :func:`~offpolicylab.policies.mixed_precision.check_split_k` then refuses, saying what is valid."""
    suggested = getattr(world, "policy_defaults", {})
    if kind != "transformer" or not suggested:
        return {}
    given = POLICIES.resolve(kind, params)
    if given["init"] != "pretrained":
        return {}
    engines = {name: value for name, value in suggested.items() if name in ENGINE_OPTIONS and name not in params}
    merged = {**given, **engines}
    if merged["trainer_precision"] == "fp32":
        engines.pop("trainer_weights", None)
        engines.pop("recompute_split_k", None)
    if not merged["logp_micro_batch"]:
        engines.pop("recompute_split_k", None)
    return engines


__all__ = [
    "POLICIES",
    "AutoregressivePolicy",
    "Policy",
    "Prompts",
    "Rollout",
    "SequenceModelPolicy",
    "TabularSoftmaxPolicy",
    "TransformerPolicy",
    "list_policies",
    "policy_ability",
    "make_policy",
]
