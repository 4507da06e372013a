"""Policies (DESIGN §2.3): the :class:`Policy` protocol, a tabular softmax and a small torch sequence model.

>>> from envs import make_task
>>> from offpolicylab.policies import make_policy
>>> task = make_task("token_mdp", family="target")
>>> policy = make_policy("tabular", task)
"""

from __future__ import annotations

from typing import Any

from offpolicylab.objectives.base import Param
from offpolicylab.policies.autoregressive import AutoregressivePolicy
from offpolicylab.policies.base import Policy, Prompts, Rollout
from offpolicylab.policies.hf import hf_policy_params, make_hf_policy
from offpolicylab.policies.sequence_model import SequenceModelPolicy
from offpolicylab.policies.tabular import CONTEXTS, TabularSoftmaxPolicy
from offpolicylab.policies.transformer import TransformerPolicy

POLICY_PARAMS: dict[str, dict[str, Param]] = {
    "tabular": {
        "context": Param("prev_token", str, choices=CONTEXTS, doc="what a logits row is conditioned on"),
        "init": Param("task", str, choices=("task", "uniform"),
                      doc="task = the world's suggested initial policy (e.g. π_b of the pitfall) when it has one"),
        "sampler_noise_std": Param(0.0, float, low=0.0, doc="std of the sampler's logit noise (0 = exact sampler)"),
    },
    "sequence_model": {
        "embed_dim": Param(32, int, low=1, doc="token embedding width"),
        "hidden_size": Param(64, int, low=1, doc="GRU hidden width"),
        "num_layers": Param(1, int, low=1, doc="GRU layers"),
        "seed": Param(0, int, doc="initial-weight seed"),
        "logit_scale": Param(0.4, float, low=0.0, low_open=True,
                             doc="logits = logit_scale/√features · head(features); smaller explores longer"),
        "max_prompt_len": Param(64, int, low=1, doc="longest prompt the prompt code accepts"),
        "sampler_noise_std": Param(0.0, float, low=0.0, doc="std of the sampler's logit noise (0 = exact sampler)"),
    },
    "transformer": {
        "init": Param("pretrained", str, choices=("pretrained", "random"),
                      doc="pretrained = the world's π₀ (synthetic_lm) when it has one; random = fresh weights"),
        "d_model": Param(None, int, low=1, optional=True, doc="width (default: π₀'s, else 64)"),
        "num_layers": Param(None, int, low=1, optional=True, doc="layers (default: π₀'s, else 2)"),
        "num_heads": Param(None, int, low=1, optional=True, doc="attention heads (default: π₀'s, else 4)"),
        "max_prompt_len": Param(64, int, low=1, doc="longest prompt (random init; π₀ keeps its own)"),
        "seed": Param(0, int, doc="initial-weight seed (random init)"),
        "sampler_noise_std": Param(0.0, float, low=0.0, doc="std of the sampler's logit noise (0 = exact sampler)"),
    },
    "hf": hf_policy_params(),  # a Hugging Face causal LM + peft LoRA adapter (worlds that name a model: gsm8k)
}


def list_policies() -> list[str]:
    """Policy kinds :func:`make_policy` builds."""
    return list(POLICY_PARAMS)


def make_policy(kind: str, task: Any, **params: Any) -> Any:
    """Build a policy of ``kind`` sized for ``task`` (its ``vocab_size``, ``max_response_len``, ``eos_id``,
    ``num_prompts``; optional ``prompt_vocab_size`` and ``initial_logits()``).  Parameters may be CLI strings;
    an unknown kind or parameter raises ``ValueError`` naming the valid ones."""
    if kind not in POLICY_PARAMS:
        raise ValueError(f"unknown policy kind {kind!r}; valid: {', '.join(POLICY_PARAMS)}")
    specs = POLICY_PARAMS[kind]
    unknown = sorted(set(params) - set(specs))
    if unknown:
        raise ValueError(f"policy {kind!r} has no parameter {', '.join(unknown)}; valid: {', '.join(specs)}")
    config = {key: spec.validate(key, params.get(key, spec.default)) for key, spec in specs.items()}
    if kind == "hf":
        return make_hf_policy(task, **config)
    if getattr(task, "model", None):  # a language-model world: its token space is the model's tokenizer
        raise ValueError(f"policy {kind!r} cannot act in a world that names a language model "
                         f"({type(task).__name__}); valid: --policy hf")
    common = {"vocab_size": task.vocab_size, "response_len": task.max_response_len, "eos_id": task.eos_id,
              "sampler_noise_std": config["sampler_noise_std"]}
    if kind == "transformer":
        return _make_transformer(task, config, common)
    if kind == "tabular":
        init = task.initial_logits() if config["init"] == "task" and hasattr(task, "initial_logits") else None
        context = "none" if task.max_response_len == 1 and task.eos_id is None else config["context"]
        return TabularSoftmaxPolicy(num_prompts=task.num_prompts, context=context, init_logits=init, **common)
    return SequenceModelPolicy(prompt_vocab_size=getattr(task, "prompt_vocab_size", None),
                               embed_dim=config["embed_dim"], hidden_size=config["hidden_size"],
                               num_layers=config["num_layers"], seed=config["seed"],
                               logit_scale=config["logit_scale"], max_prompt_len=config["max_prompt_len"], **common)


def _make_transformer(task: Any, config: dict[str, Any], common: dict[str, Any]) -> TransformerPolicy:
    """π₀ of a world that has one (``init=pretrained``; sizes given must equal π₀'s), else fresh weights."""
    sizes = {key: config[key] for key in ("d_model", "num_layers", "num_heads")}
    pretrained = config["init"] == "pretrained" and hasattr(task, "pretrained_policy")
    if not pretrained:
        defaults = {"d_model": 64, "num_layers": 2, "num_heads": 4}
        sizes = {key: defaults[key] if value is None else value for key, value in sizes.items()}
        return TransformerPolicy(prompt_vocab_size=getattr(task, "prompt_vocab_size", None),
                                 max_prompt_len=config["max_prompt_len"], seed=config["seed"], **sizes, **common)
    policy = task.pretrained_policy()
    shape = {"d_model": policy.shape.d_model, "num_layers": policy.shape.num_layers,
             "num_heads": policy.shape.num_heads}
    clash = [f"{key}={value} (π₀ has {shape[key]})" for key, value in sizes.items()
             if value is not None and value != shape[key]]
    if clash:
        raise ValueError(f"transformer {', '.join(clash)} differs from the world's pretrained π₀; valid: leave the "
                         "sizes unset, or init=random")
    policy.sampler_noise_std = common["sampler_noise_std"]
    return policy


__all__ = [
    "POLICY_PARAMS",
    "AutoregressivePolicy",
    "Policy",
    "Prompts",
    "Rollout",
    "SequenceModelPolicy",
    "TabularSoftmaxPolicy",
    "TransformerPolicy",
    "list_policies",
    "make_policy",
]
