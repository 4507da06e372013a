"""A Hugging Face causal LM with a peft LoRA adapter as a :class:`~offpolicylab.contracts.Policy` (docs/design.md, "Policies").

Sampling draws y_t ~ softmax(z_t / T) with its own KV-cache loop (so the distribution is *exactly* softmax of the
raw logits at temperature T: no top-k / top-p / repetition processors from ``generation_config``, and the caller's
``torch.Generator`` drives every draw) and records behavior_logp_t = log softmax(z_t / T)[y_t].  Scoring runs one
forward over prompt + response ids with the same attention mask and position ids, giving the same numbers for the
same weights (|Δ| ≤ 1e-4 in fp32, tested).  Only the LoRA parameters train (Hu et al. 2021, "LoRA"); the base model can
be quantized to 4-bit NF4 (Dettmers et al. 2023, "QLoRA").  The base model *without* the adapter is available as a
second policy (:meth:`HFPolicy.initial_policy`, or ``sample(..., use_adapter=False)``) for the ``mixture`` schedule.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from offpolicylab.contracts import Prompts, Rollout
from offpolicylab.policies.precision import PRECISIONS, check_precision, engine_log_softmax, sampler_weights

#: Third-party messages a user of this policy cannot act on, silenced by :func:`quiet_third_parties`: (logger name,
#: level it is raised to) and (warning category, regex of the message start).
QUIET_LOGGERS = (
    # bitsandbytes ≥ 0.49 on CPUs with AVX512-BF16, at import, with or without 4-bit: "Failed to load CPU
    # gemm_4bit_forward from kernels-community: No module named 'kernels'" (an optional speed-up; the fallback runs)
    ("bitsandbytes.backends.cpu.ops", logging.ERROR),
)
QUIET_WARNINGS = (
    # peft reads model.is_gradient_checkpointing, which transformers 5 renamed
    (FutureWarning, r"`is_gradient_checkpointing` is deprecated"),
)


def quiet_third_parties() -> None:
    """Raise :data:`QUIET_LOGGERS` to their level and ignore :data:`QUIET_WARNINGS` (both narrow: one logger, one
    message each; everything else still shows).  Idempotent; run when this module is imported and again when a
    policy is built (a test framework may reset warning filters in between)."""
    for name, level in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(level)
    for category, message in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)


quiet_third_parties()

ADAPTER_FILE = "adapter_model.safetensors"
# The share of the available memory an automatic scoring plan may fill (the rest: the rollout, the optimizer, the
# allocator's slack, other processes' growth); an explicit plan is refused only beyond all of it.
SCORE_MEMORY_SHARE = 0.6
GIB = 2**30
PLANNED_PARAMS = ("score_micro_batch", "score_recompute")  # the options HFPolicy.plan_scoring fills in
# Scoring m rows per forward with recompute peaks at about m + 2 rows' worth: measured on SmolLM2-135M (CPU, 8 rows
# of 130 + 200 tokens, 0.795 GiB per row by HFPolicy.score_row_bytes): 2.86 GiB for m = 2 and 4.70 GiB for m = 4.
RECOMPUTE_EXTRA_ROWS = 2


@dataclass(frozen=True)
class LoraSpec:
    """LoRA options: ΔW = (alpha / r) · B A with A ∈ R^{r×d_in}, B ∈ R^{d_out×r} (Hu et al. 2021).

    ``target_modules``: ``"all-linear"`` (every linear layer but the output head) or module-name suffixes such as
    ``("q_proj", "v_proj")``."""

    r: int = 16
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: str | tuple[str, ...] = "all-linear"

    def __post_init__(self) -> None:
        if int(self.r) != self.r or self.r < 1:
            raise ValueError(f"lora_r={self.r!r} is invalid; valid: an integer >= 1")
        if not self.alpha > 0:
            raise ValueError(f"lora_alpha={self.alpha!r} is invalid; valid: a float > 0")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora_dropout={self.dropout!r} is invalid; valid: a float in [0, 1)")
        if isinstance(self.target_modules, str) and self.target_modules != "all-linear":
            object.__setattr__(self, "target_modules", tuple(m.strip() for m in self.target_modules.split(",")
                                                             if m.strip()))
        if not self.target_modules:
            raise ValueError("lora_target_modules is empty; valid: 'all-linear' or comma-separated module names")

    def to_peft(self) -> Any:
        from peft import LoraConfig

        targets = self.target_modules if isinstance(self.target_modules, str) else list(self.target_modules)
        return LoraConfig(r=int(self.r), lora_alpha=float(self.alpha), lora_dropout=float(self.dropout),
                          target_modules=targets, bias="none", task_type="CAUSAL_LM")


class HFPolicy:
    """AutoModelForCausalLM + LoRA adapter implementing sample / score / trainable state.

    Args:
        model: a ``transformers`` causal LM (already quantized when ``quantized``), its base weights are frozen.
        tokenizer: its tokenizer (pad token set; EOS ends a response).
        lora: the adapter options.
        max_new_tokens: T, the longest response.
        sample_micro_batch: rows generated per forward (None: all rows at once).
        score_micro_batch: rows scored per forward (None: all rows at once).
        gradient_checkpointing: recompute the model's activations in backward (less memory, ~1/3 more compute).
        score_recompute: store only the [B, T] outputs of each scoring micro-batch and recompute its forward in
            backward, so peak memory is one micro-batch's activations and logits even though the objective sees the
            whole batch (None: off until :meth:`plan_scoring` decides).
        quantized: the base model is bitsandbytes k-bit (runs ``peft.prepare_model_for_kbit_training``).
        eos_ids: token ids that end a response (default: the tokenizer's and generation_config's EOS).
        sampler_precision: the precision the sampler computes in (:mod:`offpolicylab.policies.precision`: the
            model's weights stored in it while sampling, logits and softmax in it); needs a float32 model, the
            trainer's precision.  The sampled rollout's ``behavior_logp`` and ``sampler_logp`` are then the
            sampler's numbers.
    """

    #: :meth:`score` returns the entropy without gradient (its graph would hold [B, T, V] more), so the entropy
    #: bonus ``entropy_coef`` is refused with this policy.
    entropy_gradient = False

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        lora: LoraSpec | None = None,
        max_new_tokens: int = 200,
        sample_micro_batch: int | None = None,
        score_micro_batch: int | None = None,
        gradient_checkpointing: bool = False,
        score_recompute: bool | None = None,
        quantized: bool = False,
        eos_ids: Sequence[int] | None = None,
        sampler_precision: str = "fp32",
    ) -> None:
        from peft import get_peft_model, prepare_model_for_kbit_training

        quiet_third_parties()
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens} is invalid; valid: an integer >= 1")
        for name, value in (("sample_micro_batch", sample_micro_batch), ("score_micro_batch", score_micro_batch)):
            if value is not None and value < 1:
                raise ValueError(f"{name}={value} is invalid; valid: an integer >= 1 or none")
        lora = lora or LoraSpec()
        self.sampler_precision = check_precision(sampler_precision)
        weight_dtype = model.get_input_embeddings().weight.dtype
        if sampler_precision != "fp32" and (quantized or weight_dtype != torch.float32):
            raise ValueError(f"sampler_precision={sampler_precision} needs a float32 model (the trainer's precision), "
                             f"got {'4-bit' if quantized else weight_dtype}; valid: dtype=float32 without "
                             "load_in_4bit, or sampler_precision=fp32")
        if quantized:
            keep_trainable_4bit_layout(model)
            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=gradient_checkpointing,
                                                    gradient_checkpointing_kwargs={"use_reentrant": False})
        elif gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.enable_input_require_grads()
        self.model = get_peft_model(model, lora.to_peft())
        self._cache_name = kv_cache_name(model)
        self.tokenizer = tokenizer
        self.lora = lora
        self.max_new_tokens = int(max_new_tokens)
        self.sample_micro_batch = sample_micro_batch
        self.score_micro_batch = score_micro_batch
        self.score_recompute = score_recompute
        self.gradient_checkpointing = gradient_checkpointing
        self.eos_ids = torch.tensor(sorted(set(eos_ids) if eos_ids is not None else _eos_ids(model, tokenizer)))
        if self.eos_ids.numel() == 0:
            raise ValueError("the tokenizer has no EOS token; pass eos_ids=[...]")
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0])
        self._adapter_enabled = True

    # ------------------------------------------------------------------------------------------- construction
    @classmethod
    def from_pretrained(
        cls,
        model: str,
        *,
        gguf_file: str | None = None,
        dtype: str = "float32",
        load_in_4bit: bool = False,
        device: str = "cpu",
        lora_r: int = 16,
        lora_alpha: float = 32.0,
        lora_dropout: float = 0.0,
        lora_target_modules: str | tuple[str, ...] = "all-linear",
        **kwargs: Any,
    ) -> HFPolicy:
        """Load ``model`` (hub id, directory or ``.gguf`` file, see :mod:`offpolicylab.policies.hf_loading`) and
        wrap it with a fresh LoRA adapter; ``kwargs`` go to :class:`HFPolicy`."""
        from offpolicylab.policies.hf_loading import load_model_and_tokenizer

        quiet_third_parties()
        lora = LoraSpec(lora_r, lora_alpha, lora_dropout, lora_target_modules)
        lm, tokenizer = load_model_and_tokenizer(model, gguf_file=gguf_file, dtype=dtype, load_in_4bit=load_in_4bit,
                                                 device=device)
        return cls(lm, tokenizer, lora=lora, quantized=load_in_4bit, **kwargs)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    # ------------------------------------------------------------------------------------------------ memory
    def score_row_bytes(self, prompt_tokens: int, response_tokens: int) -> int:
        """Estimated peak memory (bytes) of scoring one row of P + T tokens with grad and back-propagating it:

            (P + T) · L · (11 d + 7 d_ff) · s  +  4 · T · V · 4

        with L layers of width d and MLP width d_ff, activations of s bytes (the model's dtype) and V the vocabulary.
        The first term is what a LoRA decoder layer keeps for backward per token (normalised inputs of the attention
        and MLP projections, q, k, v and their rotary copies, the attention output, gate, up, the SiLU product: about
        8 d + 5 d_ff by hand, 11 d + 7 d_ff as measured; with gradient checkpointing only each layer's input, d, plus
        one layer recomputed); the second is the response's full-vocabulary logits in fp32 (logits, the log-softmax
        kept for backward, their gradients).  Calibration: peak resident memory of SmolLM2-135M (L = 30, d = 576,
        d_ff = 1536, V = 49152, fp32, LoRA on every linear layer) scoring 8 rows on a CPU was 793, 605 and 402 MiB
        per row for (P, T) = (130, 200), (30, 200), (130, 50); this formula gives 795, 600 and 390."""
        config = self.model.config
        config = config.get_text_config() if hasattr(config, "get_text_config") else config
        width = int(config.hidden_size)
        layers = int(config.num_hidden_layers)
        mlp = int(getattr(config, "intermediate_size", None) or 4 * width)
        itemsize = self.model.get_input_embeddings().weight.element_size()
        per_layer = 11 * width + 7 * mlp
        per_token = (layers * width + per_layer) if self.gradient_checkpointing else layers * per_layer
        activations = (prompt_tokens + response_tokens) * per_token * itemsize
        return int(activations + 4 * response_tokens * self.vocab_size * 4)

    def plan_scoring(self, rows: int, prompt_tokens: int, *, available: int | None = None) -> ScorePlan:
        """Choose the options the user left unset so that scoring ``rows`` responses (P = ``prompt_tokens``,
        T = ``max_new_tokens``) and its backward fit in memory, set them, and return the plan.

        With r = :meth:`score_row_bytes` and A the available memory (``available``, else
        :func:`available_memory` of the policy's device): all rows in one forward when rows · r ≤ 0.6 A, else
        micro-batches of m = ⌊0.6 A / r⌋ − 2 rows (at least 1) recomputed in backward, whose peak is about
        (m + 2) · r.  A plan that needs more than A (one row too large, or the user's own options) raises
        ``ValueError`` saying what fits."""
        available = available_memory(self.device) if available is None else int(available)
        row_bytes = self.score_row_bytes(prompt_tokens, self.max_new_tokens)
        fits = int(SCORE_MEMORY_SHARE * available // row_bytes) - RECOMPUTE_EXTRA_ROWS
        recompute = self.score_recompute
        if recompute is None:
            recompute = rows * row_bytes > SCORE_MEMORY_SHARE * available
        micro_batch = min(self.score_micro_batch or (max(fits, 1) if recompute else rows), rows)
        plan = ScorePlan(micro_batch, bool(recompute), row_bytes, available)
        if plan.need(rows) > available:
            raise ValueError(plan.refusal(rows, prompt_tokens, self.max_new_tokens, fits))
        self.score_micro_batch, self.score_recompute = plan.micro_batch, plan.recompute
        return plan

    # ------------------------------------------------------------------------------------------------ sample
    @torch.no_grad()
    def sample(
        self,
        prompts: Prompts,
        group_size: int,
        temperature: float,
        generator: torch.Generator,
        *,
        use_adapter: bool = True,
        greedy: bool = False,
    ) -> Rollout:
        """``group_size`` responses per prompt, y_t ~ softmax(z_t / T), behavior_logp_t = log softmax(z_t / T)[y_t].

        ``greedy`` takes argmax tokens instead (evaluation; behavior_logp still at ``temperature``);
        ``use_adapter=False`` samples from the base model (the second policy of the ``mixture`` schedule).
        ``generator`` may live on another device than the model (the trainer's is on the CPU): the draws then use
        a generator on the model's device seeded from one draw of ``generator`` (see :func:`device_generator`)."""
        if group_size < 1:
            raise ValueError(f"group_size={group_size} is invalid; valid: an integer >= 1")
        if not temperature > 0:
            raise ValueError(f"temperature={temperature} is invalid; valid: a float > 0 (use greedy=True for argmax)")
        device = self.device
        ids = prompts.ids.to(device).repeat_interleave(group_size, 0)
        mask = prompts.mask.to(device).long().repeat_interleave(group_size, 0)
        generator = device_generator(generator, device)
        order, chunks = length_batches(mask, self.sample_micro_batch)
        parts = []
        precision = "fp32" if greedy else self.sampler_precision  # greedy decoding is evaluation: the policy's own
        with self._adapter(use_adapter), _eval_mode(self.model), sampler_weights(self.model, precision):
            for rows in chunks:
                parts.append(self._generate(ids[rows], mask[rows], temperature, generator, greedy, precision))
        width = max(p[0].shape[1] for p in parts)
        response_ids = torch.cat([_pad_right(p[0], width, self.pad_id) for p in parts])
        response_mask = torch.cat([_pad_right(p[1], width, 0.0) for p in parts])
        behavior_logp = torch.cat([_pad_right(p[2], width, 0.0) for p in parts])
        if order is not None:  # back to the caller's row order
            inverse = torch.argsort(order)
            response_ids, response_mask, behavior_logp = (response_ids[inverse], response_mask[inverse],
                                                          behavior_logp[inverse])
        group_ids = torch.arange(len(prompts), device=device).repeat_interleave(group_size)
        return Rollout(
            prompt_ids=ids, prompt_mask=mask.to(torch.float32), response_ids=response_ids,
            response_mask=response_mask, behavior_logp=behavior_logp, group_ids=group_ids,
            prompt_index=prompts.index.to(device).repeat_interleave(group_size), temperature=float(temperature),
            sampler_logp=None if precision == "fp32" else behavior_logp.clone(),
        )

    def _generate(
        self, ids: Tensor, mask: Tensor, temperature: float, generator: torch.Generator, greedy: bool,
        precision: str = "fp32",
    ) -> tuple[Tensor, Tensor, Tensor]:
        """KV-cache decoding of one micro-batch → (tokens [b, t], mask [b, t], behavior_logp [b, t]); with a
        reduced ``precision`` (inside :func:`~offpolicylab.policies.precision.sampler_weights`) the log-softmax runs
        in it too.

        Work saved without changing the distribution: columns that are padding in every row are cut; identical
        prompt rows (a group's G copies) are prefilled once and their cache is copied; a row that has emitted EOS
        leaves the batch and its cache (later steps compute only the rows still generating)."""
        rows, steps = ids.shape[0], self.max_new_tokens
        ids, mask = _trim_left_padding(ids, mask)
        positions = (mask.cumsum(-1) - 1).clamp_min(0)
        first, source = _distinct_rows(torch.cat([ids, mask], 1))
        out = self.model(input_ids=ids[first], attention_mask=mask[first], position_ids=positions[first],
                         use_cache=True, logits_to_keep=1)
        cache, logits = getattr(out, self._cache_name), out.logits[:, -1]
        if not torch.equal(source, torch.arange(rows, device=source.device)):  # back to the rows' order (also
            cache.batch_select_indices(source)                                  # when all rows are distinct)
            logits = logits[source]
        next_position = positions[:, -1:] + 1
        eos = self.eos_ids.to(ids.device)
        tokens = torch.full((rows, steps), self.pad_id, dtype=torch.long, device=ids.device)
        logps = torch.zeros((rows, steps), dtype=torch.float32, device=ids.device)
        lengths = torch.zeros(rows, dtype=torch.long, device=ids.device)
        active = torch.arange(rows, device=ids.device)  # the original row of each computed row
        for step in range(steps):
            if precision == "fp32":
                logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)
            else:
                logp_all = engine_log_softmax(logits, temperature, precision)
            if greedy:
                token = logp_all.argmax(-1)
            else:
                token = torch.multinomial(logp_all.exp(), 1, generator=generator).squeeze(-1)
            tokens[active, step] = token
            logps[active, step] = logp_all.gather(-1, token[:, None]).squeeze(-1)
            lengths[active] = step + 1
            going = ~torch.isin(token, eos)
            if step == steps - 1 or not bool(going.all()):  # one host sync per token, as HF generate
                if step == steps - 1 or not bool(going.any()):
                    break
                keep = going.nonzero().squeeze(-1)
                cache.batch_select_indices(keep)
                active, token, mask, next_position = active[keep], token[keep], mask[keep], next_position[keep]
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            out = self.model(input_ids=token[:, None], attention_mask=mask, position_ids=next_position,
                             use_cache=True, **{self._cache_name: cache})
            logits = out.logits[:, -1]
            next_position = next_position + 1
        width = int(lengths.max())
        response_mask = (torch.arange(width, device=ids.device) < lengths[:, None]).to(torch.float32)
        return tokens[:, :width], response_mask, logps[:, :width] * response_mask

    def greedy(self, prompts: Prompts, *, use_adapter: bool = True) -> Rollout:
        """One argmax response per prompt (evaluation decoding; behavior_logp at temperature 1)."""
        return self.sample(prompts, 1, 1.0, torch.Generator(device=self.device), use_adapter=use_adapter,
                           greedy=True)

    def clone(self) -> HFPolicy | BaseModelPolicy:
        """A frozen copy of the current policy: the base model itself (no copy) while the adapter is still the
        identity (every LoRA B is zero, as after init), else a deep copy."""
        import copy

        at_init = all(torch.count_nonzero(p) == 0 for n, p in self.model.named_parameters() if "lora_B" in n)
        return BaseModelPolicy(self) if at_init else copy.deepcopy(self)

    # ------------------------------------------------------------------------------------------------- score
    def score(self, rollout: Rollout, *, use_adapter: bool = True) -> tuple[Tensor, Tensor]:
        """(logp [B, T] with grad, entropy [B, T] detached) of the response tokens at ``rollout.temperature``:
        logp_t = log softmax(z_t / T)[y_t], H_t = −Σ_v p_v log p_v, from one forward over prompt + response."""
        device = self.device
        ids = torch.cat([rollout.prompt_ids.to(device), rollout.response_ids.to(device)], dim=1)
        mask = torch.cat([rollout.prompt_mask.to(device), rollout.response_mask.to(device)], dim=1).long()
        response = rollout.response_ids.to(device)
        chunk = self.score_micro_batch or ids.shape[0]
        logps, entropies = [], []
        with self._adapter(use_adapter):
            for start in range(0, ids.shape[0], chunk):
                rows = slice(start, start + chunk)
                args = (ids[rows], mask[rows], response[rows], float(rollout.temperature))
                if self.score_recompute and torch.is_grad_enabled():
                    logp, entropy = checkpoint(self._score_rows, *args, use_reentrant=False)
                else:
                    logp, entropy = self._score_rows(*args)
                logps.append(logp)
                entropies.append(entropy)
        return torch.cat(logps), torch.cat(entropies)

    def _score_rows(self, ids: Tensor, mask: Tensor, response: Tensor, temperature: float) -> tuple[Tensor, Tensor]:
        length = response.shape[1]
        positions = (mask.cumsum(-1) - 1).clamp_min(0)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False,
                         logits_to_keep=length + 1)
        logp_all = torch.log_softmax(out.logits[:, :length].float() / temperature, dim=-1)
        logp = logp_all.gather(-1, response[..., None]).squeeze(-1)
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1)
        return logp, entropy

    # --------------------------------------------------------------------------------- adapter / second policy
    @contextlib.contextmanager
    def adapter_disabled(self) -> Iterator[None]:
        """Inside this block the policy is the base model (LoRA off)."""
        with self._adapter(False):
            yield

    def initial_policy(self) -> BaseModelPolicy:
        """The initial policy π₀ of a LoRA run: the base model without the adapter, as a Policy sharing this one's
        weights (no copy)."""
        return BaseModelPolicy(self)

    @contextlib.contextmanager
    def _adapter(self, enabled: bool) -> Iterator[None]:
        if enabled or not self._adapter_enabled:
            yield
            return
        self._adapter_enabled = False
        try:
            with self.model.disable_adapter():
                yield
        finally:
            self._adapter_enabled = True

    # ------------------------------------------------------------------------------------------ trainable state
    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """The LoRA parameters (the only ones with ``requires_grad``)."""
        return [p for p in self.model.parameters() if p.requires_grad]

    def state_dict(self) -> dict[str, Tensor]:
        """The adapter weights only (peft's key names, without the adapter name), cloned."""
        from peft import get_peft_model_state_dict

        return {k: v.detach().clone() for k, v in get_peft_model_state_dict(self.model).items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load adapter weights from :meth:`state_dict`; missing or unexpected LoRA keys raise ValueError."""
        from peft import set_peft_model_state_dict

        expected = set(self.state_dict())
        if set(state) != expected:
            missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
            raise ValueError(f"adapter state does not match this model: {len(missing)} missing keys "
                             f"{missing[:3]}, {len(unexpected)} unexpected keys {unexpected[:3]}")
        set_peft_model_state_dict(self.model, state)

    def save_adapter(self, directory: str | Path) -> Path:
        """Write ``adapter_config.json`` + ``adapter_model.safetensors`` (peft's format) to ``directory``."""
        directory = Path(directory)
        self.model.save_pretrained(str(directory), safe_serialization=True)
        return directory

    def decode(self, ids: Tensor, mask: Tensor) -> list[str]:
        """The text of each row of ``ids`` over its tokens where ``mask`` is 1 (special tokens kept: an EOS shows)."""
        rows = [row[keep > 0].tolist() for row, keep in zip(ids.cpu(), mask.cpu(), strict=True)]
        return self.tokenizer.batch_decode(rows, skip_special_tokens=False)

    def load_adapter(self, directory: str | Path) -> None:
        """Load adapter weights saved by :meth:`save_adapter` (safetensors: nothing is unpickled)."""
        from peft.utils import load_peft_weights

        path = Path(directory)
        if not (path / ADAPTER_FILE).is_file():
            raise ValueError(f"no {ADAPTER_FILE} in {path}")
        self.load_state_dict(load_peft_weights(str(path), device=str(self.device)))


@dataclass(frozen=True)
class ScorePlan:
    """How :meth:`HFPolicy.score` runs: ``micro_batch`` rows per forward, ``recompute`` (each micro-batch's forward
    again in backward), the estimated bytes per row and the memory that was available."""

    micro_batch: int
    recompute: bool
    row_bytes: int
    available: int

    def need(self, rows: int) -> int:
        """Peak bytes of scoring ``rows`` rows: about m + 2 rows with recompute, all rows' graphs without."""
        held = min(self.micro_batch + RECOMPUTE_EXTRA_ROWS, rows) if self.recompute else rows
        return held * self.row_bytes

    def params(self) -> dict[str, Any]:
        """The plan as ``hf`` policy parameters (what config.json records)."""
        return dict(zip(PLANNED_PARAMS, (self.micro_batch, self.recompute), strict=True))

    def describe(self) -> str:
        return (f"score_micro_batch={self.micro_batch}, score_recompute={str(self.recompute).lower()} "
                f"(~{self.row_bytes / GIB:.2f} GiB per response, {self.available / GIB:.1f} GiB available)")

    def refusal(self, rows: int, prompt_tokens: int, response_tokens: int, fits: int) -> str:
        what = (f"scoring {rows} responses of up to {prompt_tokens} + {response_tokens} tokens "
                f"({self.micro_batch if self.recompute else rows} at a time) needs about {self.need(rows) / GIB:.1f} "
                f"GiB ({self.row_bytes / GIB:.2f} GiB per response, forward and backward) but "
                f"{self.available / GIB:.1f} GiB are available")
        if fits >= 1:
            return f"{what}; valid: score_micro_batch <= {fits} with score_recompute=true (or leave both unset)"
        return (f"{what}; valid: a shorter max_response_len or max_prompt_tokens, gradient_checkpointing=true, "
                "or more memory")


def available_memory(device: torch.device | str) -> int:
    """Bytes that new tensors on ``device`` can take: the free memory of a CUDA device
    (``torch.cuda.mem_get_info``), else the kernel's MemAvailable (``/proc/meminfo``), else the free physical
    pages."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


class BaseModelPolicy:
    """The base model (adapter disabled) of an :class:`HFPolicy`, as a Policy: the second policy of ``mixture``.

    It has no trainable state of its own (``trainable_parameters()`` is empty)."""

    def __init__(self, policy: HFPolicy) -> None:
        self.policy = policy

    def sample(self, prompts: Prompts, group_size: int, temperature: float, generator: torch.Generator,
               **kwargs: Any) -> Rollout:
        return self.policy.sample(prompts, group_size, temperature, generator, use_adapter=False, **kwargs)

    def score(self, rollout: Rollout) -> tuple[Tensor, Tensor]:
        return self.policy.score(rollout, use_adapter=False)

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return []

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            raise ValueError(f"the base model has no trainable state, got keys {sorted(state)[:3]}")


def kv_cache_name(model: Any) -> str:
    """The name of the KV cache in ``model``'s forward arguments and outputs: ``cache`` from transformers 5.2x on
    (``past_key_values`` still works there but warns once per process), ``past_key_values`` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    for value in (tokenizer.eos_token_id, getattr(getattr(model, "generation_config", None), "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return ids


def keep_trainable_4bit_layout(model: torch.nn.Module) -> int:
    """Stop bitsandbytes from repacking 4-bit weights for its CPU inference kernel; returns the layers changed.

    On a CPU with AVX512-BF16, ``bitsandbytes.nn.Linear4bit`` converts its weight to a packed layout on the first
    eval-mode forward without grad (i.e. sampling) and from then on multiplies with ``gemv_4bit``, which has no
    backward: the LoRA gradients of every layer but the last come out wrong (measured 5e-7 instead of 3e-3) and
    sampling log-probs drift from scoring ones (|Δ| 0.11).  Keeping the trainable layout makes sampling and scoring
    run the same dequantize-then-matmul kernel."""
    changed = 0
    for module in model.modules():
        if getattr(module, "support_avx512bf16_for_cpu", False):
            module.support_avx512bf16_for_cpu = False
            changed += 1
        quant_state = getattr(getattr(module, "weight", None), "quant_state", None)
        if getattr(quant_state, "packing_format_for_cpu", False):
            raise ValueError("the 4-bit weights were already repacked for bitsandbytes' CPU inference kernel "
                             "(it has no backward); build the policy before running the model")
    return changed


def device_generator(generator: torch.Generator, device: torch.device) -> torch.Generator:
    """``generator`` itself when it lives on ``device``; else a new generator on ``device`` seeded with one 63-bit
    draw of ``generator`` (so a CPU generator drives CUDA sampling reproducibly, and its saved state still
    determines every later draw, as a resumed run needs)."""
    if torch.device(generator.device) == torch.device(device):
        return generator
    seed = int(torch.randint(0, 2**63 - 1, (1,), generator=generator))
    return torch.Generator(device=device).manual_seed(seed)


def length_batches(mask: Tensor, micro_batch: int | None) -> tuple[Tensor | None, list[Tensor]]:
    """(order, row indices of each micro-batch): with ``micro_batch`` rows sorted by prompt length (stable, so a
    group stays together) and cut into batches of that size, so that a batch holds prompts of similar length and
    carries little padding; one batch of all rows (order None) otherwise."""
    rows = mask.shape[0]
    if micro_batch is None or micro_batch >= rows:
        return None, [torch.arange(rows, device=mask.device)]
    order = torch.argsort(mask.sum(-1), stable=True)
    return order, list(order.split(micro_batch))


def _trim_left_padding(ids: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Drop the leading columns that are padding in every row (prompts are left-padded)."""
    used = mask.any(0).nonzero()
    start = int(used[0]) if used.numel() else 0
    return ids[:, start:], mask[:, start:]


def _distinct_rows(rows: Tensor) -> tuple[Tensor, Tensor]:
    """(first, source): the index of the first occurrence of each distinct row, and for every row the position of
    its distinct row in ``first`` (so ``rows[first][source] == rows``)."""
    _, source = torch.unique(rows, dim=0, return_inverse=True)
    count = int(source.max()) + 1
    first = torch.full((count,), rows.shape[0], dtype=torch.long, device=rows.device)
    first = first.scatter_reduce(0, source, torch.arange(rows.shape[0], device=rows.device), reduce="amin")
    return first, source


def _pad_right(x: Tensor, width: int, value: float) -> Tensor:
    return F.pad(x, (0, width - x.shape[1]), value=value) if x.shape[1] < width else x


@contextlib.contextmanager
def _eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Eval mode while sampling (no dropout, KV cache allowed under gradient checkpointing), then restore."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def hf_policy_params() -> dict[str, Any]:
    """Parameter specs of the ``hf`` policy kind (``--policy-param k=v``) for ``offpolicylab.policies.POLICIES``."""
    from offpolicylab.registry import Param

    return {
        "lora_r": Param(16, int, low=1, doc="LoRA rank r"),
        "lora_alpha": Param(32.0, float, low=0.0, low_open=True, doc="LoRA scale alpha (ΔW = alpha/r · BA)"),
        "lora_dropout": Param(0.0, float, low=0.0, high=1.0, high_open=True, doc="LoRA dropout"),
        "lora_target_modules": Param("all-linear", str, doc="'all-linear' or comma-separated module names"),
        "load_in_4bit": Param(False, bool, doc="bitsandbytes 4-bit NF4 base weights (QLoRA)"),
        "dtype": Param("float32", str, choices=("float32", "bfloat16", "float16"), doc="base weight dtype"),
        "device": Param("cpu", str, doc="torch device (cpu, cuda, cuda:1, ...)"),
        "gradient_checkpointing": Param(False, bool, doc="recompute activations in backward"),
        "score_recompute": Param(None, bool, optional=True, doc="recompute each scoring micro-batch in backward "
                                                                "(none: chosen from the memory available)"),
        "sample_micro_batch": Param(None, int, low=1, optional=True, doc="rows per generation forward"),
        "sampler_precision": Param("fp32", str, choices=PRECISIONS,
                                   doc="precision the sampler computes its logits and softmax in (the weights stored "
                                       "in it while sampling; fp8 simulated; needs dtype=float32)"),
        "score_micro_batch": Param(None, int, low=1, optional=True, doc="rows per scoring forward (none: chosen "
                                                                        "from the memory available)"),
    }


def make_hf_policy(world: Any, **params: Any) -> HFPolicy:
    """The ``hf`` policy for a GSM8k-like ``world`` that names its model (``world.model``, ``world.gguf_file``):
    a fresh LoRA adapter on that model, ``max_new_tokens = world.max_response_len``.  ``params`` are
    :func:`hf_policy_params` (already validated by the policy registry)."""
    model = getattr(world, "model", None)
    if not model:
        raise ValueError("the hf policy needs a world that names its model (e.g. --world gsm8k "
                         "--world-param model=PATH)")
    return HFPolicy.from_pretrained(model, gguf_file=getattr(world, "gguf_file", None),
                                    max_new_tokens=world.max_response_len, **params)
