"""A TRL ``GRPOTrainer`` whose policy loss is any offpolicylab objective (checked against trl 1.16).

TRL's ``GRPOTrainer._compute_loss`` scores the completion tokens and then branches on ``loss_type``.  This subclass
keeps TRL's generation, rewards, advantages and logging and replaces only the loss:

    batch = TokenBatch(logp = per_token_logps,            # π_θ, with grad
                       behavior_logp = old_per_token_logps, # π_old; = per_token_logps.detach() when TRL skips it
                       advantages = advantages,             # [B] broadcast, or [B, T]
                       mask = completion_mask · tool_mask,
                       sampler_logp = sampling_per_token_logps (vLLM only; used by the objective's tis_cap or correction),
                       entropy = per-token entropy)
    loss = objective(batch).loss [+ β · agg(KL_k3(π_θ ‖ π_ref))] / gradient_accumulation_steps

TRL's own loss knobs (``loss_type``, ``epsilon``, ``delta``, ``importance_sampling_level``, ``top_entropy_quantile``,
``off_policy_mask_threshold``, vLLM importance-sampling correction, entropy bonus) are not applied: the objective
and its parameters (``agg`` included) define the loss.  ``agg`` takes TRL's ``loss_type`` names with TRL's scale:
``dr_grpo`` divides by B·``max_completion_length`` (unless ``agg_norm`` is given), ``dapo`` by TRL's
``num_items_in_batch`` normaliser (the whole generation batch's tokens; ``loss`` is then not divided by the
accumulation steps), ``bnpo`` and the other modes by the micro-batch's own count divided by the accumulation
steps.  The KL-to-reference term (``beta``) is kept, aggregated
with the objective's ``agg``.  Metrics are logged as ``offpolicylab/<name>``.

Stateful objectives (``ac_mispo``) advance ``update()`` once per optimizer step: on the first training micro-batch
after ``state.global_step`` changed (TRL increments it once per optimizer step), on that micro-batch.

Recording (``record_dir=DIR``, or ``$OFFPOLICYLAB_RECORD``; :mod:`offpolicylab.integrations.record`): every training
micro-batch the objective scores goes to an offpolicylab run directory, with the staleness of its data (optimizer
steps since TRL generated it) and the reward TRL logged for that generation; each optimizer step is written when
it ends (a ``TrainerCallback``), and summary.json when training ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from transformers import TrainerCallback
from trl import GRPOTrainer

from offpolicylab.integrations.record import Recorder, objective_config
from offpolicylab.objectives import LossOutput, TokenBatch, aggregate, get_objective
from offpolicylab.objectives.regularization import kl_penalty

_EXTRA_MODEL_INPUTS = (
    "pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes", "num_tiles",
    "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids",
)


class OffPolicyLabGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer(..., objective="m2po", objective_params={"tau": 0.04})``: TRL's GRPO loop, our loss.

    ``objective`` is any name of :func:`offpolicylab.objectives.list_objectives`; a bad name or parameter raises
    ``ValueError`` before the model is loaded.  After each loss, ``last_loss_output`` holds the objective's
    :class:`~offpolicylab.objectives.LossOutput` (before gradient-accumulation scaling).  ``record_dir`` (default
    ``$OFFPOLICYLAB_RECORD``): record the token batches into that run directory, a sample file every
    ``record_every`` optimizer steps (see the module docstring).
    """

    def __init__(self, *args: Any, objective: str = "grpo", objective_params: Mapping[str, Any] | None = None,
                 record_dir: str | Path | None = None, record_every: int = 1, **kwargs: Any) -> None:
        self.objective = get_objective(objective, **dict(objective_params or {}))
        self.last_loss_output: LossOutput | None = None
        self._objective_step: int | None = None
        self._generated_at = 0  # state.global_step when the batches being trained on were generated
        self._generated_reward: float | None = None  # the mean reward TRL logged for that generation
        super().__init__(*args, **kwargs)
        self.objective.response_limit = self.args.max_completion_length  # dr_grpo's constant, as TRL's
        config = objective_config("trl", self.objective, num_iterations=self.num_iterations,
                                  steps_per_generation=self.args.steps_per_generation)
        self.recorder = (Recorder(record_dir, config, record_every) if record_dir is not None
                         else Recorder.from_env(config))
        if self.recorder is not None:
            self.add_callback(_RecordSteps(self))

    def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
        output = super()._generate_and_score_completions(inputs)
        if self.model.training:
            self._generated_at = self.state.global_step
            rewards = self._metrics["train"].get("reward") or [None]
            self._generated_reward = rewards[-1]
        return output

    def _compute_loss(self, model: torch.nn.Module, inputs: dict[str, Any]) -> Tensor:
        batch = self.inputs_token_batch(model, inputs)
        training = self.model.training
        if training and self._objective_step != self.state.global_step:
            self.objective.update(batch)
            self._objective_step = self.state.global_step
        out = self.objective(batch)
        self.last_loss_output = out
        if training and self.recorder is not None:
            self.recorder.add(batch, out, staleness=self.state.global_step - self._generated_at)
        loss = out.loss
        if self.beta != 0.0:
            loss = loss + self.beta * aggregate(self._reference_kl(inputs, batch.logp), batch.mask, self.objective.agg,
                                                norm=self.objective.norm_constant)
        self._log_objective_metrics(out.metrics, "train" if training else "eval")
        if self.objective.agg == "dapo" and inputs.get("num_items_in_batch") is not None:
            return loss * batch.mask.sum().clamp_min(1.0) / self._dapo_normalizer(inputs, training)
        return loss / self.current_gradient_accumulation_steps if training else loss

    def _dapo_normalizer(self, inputs: dict[str, Any], training: bool) -> Tensor:
        """TRL's ``loss_type="dapo"`` denominator: the generation batch's completion tokens over every process
        (``num_items_in_batch``) per process, times the share of that batch one accumulation window holds."""
        normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
        if training:
            normalizer = normalizer * self.current_gradient_accumulation_steps / self.args.steps_per_generation
        return normalizer

    def inputs_token_batch(self, model: torch.nn.Module, inputs: dict[str, Any]) -> TokenBatch:
        """Score the completion tokens with ``model`` and build the :class:`TokenBatch` (see module docstring)."""
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], completion_mask], dim=1)
        extra = {key: inputs.get(key) for key in _EXTRA_MODEL_INPUTS}
        logp, entropy, _ = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=True, **extra
        )
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
        behavior = inputs.get("old_per_token_logps")
        corrects = self.objective.tis_cap is not None or self.objective.correction is not None
        sampler = inputs.get("sampling_per_token_logps") if corrects else None
        return TokenBatch(
            logp=logp,
            behavior_logp=logp.detach() if behavior is None else behavior,
            advantages=inputs["advantages"],
            mask=mask.to(logp.dtype),
            sampler_logp=sampler,
            entropy=entropy,
        )

    @staticmethod
    def _reference_kl(inputs: dict[str, Any], logp: Tensor) -> Tensor:
        """k3 estimator of KL(π_θ ‖ π_ref) per token, e^δ − 1 − δ with δ = ref − logp (TRL's GRPO uses the same
        estimator): the objectives' own :func:`~offpolicylab.objectives.regularization.kl_penalty`."""
        return kl_penalty(logp, inputs["ref_per_token_logps"], "k3")

    def _log_objective_metrics(self, metrics: Mapping[str, Tensor], mode: str) -> None:
        if not metrics:
            return
        names = list(metrics)
        values = torch.stack([metrics[name].detach().float().reshape(()) for name in names])
        values = self.accelerator.gather(values[None]).mean(dim=0).tolist()  # one host sync per micro-batch
        for name, value in zip(names, values, strict=True):
            self._metrics[mode][f"offpolicylab/{name}"].append(value)


class _RecordSteps(TrainerCallback):
    """Writes the recorded optimizer step when TRL ends it, and closes the record when training ends."""

    def __init__(self, trainer: OffPolicyLabGRPOTrainer) -> None:
        self.trainer = trainer

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        reward = self.trainer._generated_reward
        self.trainer.recorder.end_step(**({} if reward is None else {"reward_mean": reward}))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.trainer.recorder.close()
