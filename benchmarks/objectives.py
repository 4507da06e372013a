"""Forward + backward time of every registered objective, as a ratio to ``grpo`` on the same batch.

    python benchmarks/objectives.py                      # 256 × 1024 tokens, 1 torch thread, all objectives
    python benchmarks/objectives.py --threads 2 --repeats 30
    python benchmarks/objectives.py --profile m2po       # per-operator profile of one objective
    python benchmarks/objectives.py --vs-verl            # ours vs verl's core_algos losses (needs verl installed)

Method: one realistic batch (varied response lengths, group-relative advantages over groups of 8, binary rewards,
log-ratios with a heavy tail, ``sampler_logp`` and ``entropy``) is built once.  Each round times every objective once,
in a rotated order (interleaving spreads machine-load drift over all objectives); the TokenBatch is rebuilt from a
fresh leaf ``logp`` before each timing, outside the timed region.  The timed region is ``update`` (stateful
objectives only: it runs once per optimizer update) + forward + ``loss.backward()``.  The first ``--warmup`` rounds
are dropped.  Reported: the median time over rounds and the median over rounds of the *paired* ratio
t(objective) / t(grpo) measured in the same round.  Target: every objective ≤ 1.5× grpo.

``--before REV`` times every objective of this tree against the same objective of git revision ``REV`` of this
repository (its ``offpolicylab`` extracted with ``git archive`` into a temporary folder and imported under the name
``offpolicylab_before``, so both run in this process, round by round in a rotating order); reported: medians and the
paired ratio this tree / REV, metrics included.

Clock: ``--clock cpu`` (default) reads this process's CPU time (``time.process_time``: all its threads, none of the
machine's other jobs), ``--clock wall`` the wall clock (``time.perf_counter``).  On a shared machine the wall clock
counts the time the scheduler gives to other processes inside a timed call; the CPU time does not.

``--vs-verl`` times each of our objectives against the verl ``core_algos`` policy loss that computes the same
thing (:data:`VERL_PAIRS`: same clip parameters, same aggregation mode), metrics included on both sides (ours: the
standard metrics every call; verl: its own ``pg_clipfrac`` / ``ppo_kl`` with their ``.item()``).  Before timing, the
two losses and their gradients are checked to agree on the benchmark batch.  Each round times ours and verl's
back to back on fresh inputs (the order rotates between rounds), and ours once more with ``metrics=False`` when the
installed objectives have that switch; reported: medians, the medians of the paired per-round ratios ours / verl
(with and without metrics) and, derived from the same paired times, the ratio with metrics every 10th call
(``metrics_every=10``).  Targets: ≤ 1.5× verl's loss with metrics every call, ≤ 1.0× without.
``--vs-verl --metrics-alone`` times REINFORCE with and without its metrics, the ten standard metrics alone, Δ with the
one transcendental they need, and verl's ``gpg`` loss, paired per round (what the metrics cost against the loss
REINFORCE is paired with); ``--compiled`` adds one ``torch.compile``'d pass of the metrics, alone and with REINFORCE's
loss in it (:func:`compiled_parts`: a measurement of what fusing would give, not the library's code).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import math
import re
import shlex
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

import offpolicylab
from offpolicylab.objectives import TokenBatch, get_objective, list_objectives

TARGET_RATIO = 1.5
REFERENCE = "grpo"
#: the clock of every timing (``--clock``): this process's CPU time, or the wall clock
CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
clock = CLOCKS["cpu"]


def make_fields(batch: int, length: int, group_size: int = 8, seed: int = 0) -> dict[str, Tensor]:
    """Fields of a realistic LLM batch: lengths uniform in [length/16, length], rewards ~ Bernoulli(0.5) with
    GRPO advantages (r − mean_g)/(std_g + 1e-6) per group of ``group_size``, behaviour log-probs of a peaked policy,
    log-ratios N(0, 0.05²) with 10% of tokens at N(0, 1) (stale tokens: trust-region M2 ≈ 0.07 > τ = 0.04, so
    M2PO masks; log π_θ clamped at 0), sampler noise N(0, 0.01²), a proximal policy halfway between (decoupled PPO)."""
    if batch % group_size:
        raise ValueError(f"batch={batch} must be a multiple of group_size={group_size}")
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(max(1, length // 16), length + 1, (batch,), generator=gen)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).float()
    rewards = (torch.rand(batch, generator=gen) < 0.5).float()
    grouped = rewards.view(-1, group_size)
    advantages = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-6)).reshape(
        -1
    )
    uniform = torch.rand(batch, length, generator=gen).clamp_min(1e-9)
    behavior_logp = 0.5 * torch.log(uniform)  # −Exponential(rate 2): most tokens near log-prob 0
    noise = 0.05 * torch.randn(batch, length, generator=gen)
    stale = torch.rand(batch, length, generator=gen) < 0.10
    noise = torch.where(stale, torch.randn(batch, length, generator=gen), noise)
    return {
        "logp": (behavior_logp + noise).clamp(max=0.0),
        "behavior_logp": behavior_logp,
        "advantages": advantages,
        "mask": mask,
        "rewards": rewards,
        "group_ids": torch.arange(batch) // group_size,
        "sampler_logp": behavior_logp + 0.01 * torch.randn(batch, length, generator=gen),
        "entropy": torch.rand(batch, length, generator=gen) * 3.0,
        "prox_logp": (behavior_logp + 0.5 * noise).clamp(max=0.0),  # decoupled PPO's π_prox, halfway
    }


def fresh_batch(fields: dict[str, Tensor]) -> TokenBatch:
    return TokenBatch(**{**fields, "logp": fields["logp"].clone().requires_grad_(True)})


def run_step(objective, batch: TokenBatch) -> None:
    """(update +) forward + backward: the timed region."""
    if objective.stateful:
        objective.update(batch)
    objective(batch).loss.backward()


def time_once(objective, fields: dict[str, Tensor]) -> float:
    """Seconds for :func:`run_step` of one objective on a freshly built batch (built outside the timed region)."""
    batch = fresh_batch(fields)
    start = clock()
    run_step(objective, batch)
    return clock() - start


@dataclass
class Timing:
    name: str
    seconds: list[float]
    ratios: list[float]

    @property
    def median_ms(self) -> float:
        return 1e3 * statistics.median(self.seconds)

    @property
    def median_ratio(self) -> float:
        return statistics.median(self.ratios)


def benchmark(names: Sequence[str], fields: dict[str, Tensor], repeats: int, warmup: int) -> list[Timing]:
    """Interleaved rounds; per-round paired ratios against ``grpo``."""
    names = list(dict.fromkeys([REFERENCE, *names]))
    objectives = {name: get_objective(name) for name in names}
    seconds: dict[str, list[float]] = {name: [] for name in names}
    ratios: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(warmup + repeats):
        shift = round_index % len(names)
        order = names[shift:] + names[:shift]
        this_round = {name: time_once(objectives[name], fields) for name in order}
        if round_index < warmup:
            continue
        for name in names:
            seconds[name].append(this_round[name])
            ratios[name].append(this_round[name] / this_round[REFERENCE])
    return [Timing(name, seconds[name], ratios[name]) for name in names]


def format_table(timings: list[Timing]) -> str:
    rows = [f"| objective | median ms | ratio vs grpo (median of paired) | ≤ {TARGET_RATIO:g}× |", "|---|---:|---:|:---:|"]
    for timing in timings:
        ok = "yes" if timing.median_ratio <= TARGET_RATIO else "**NO**"
        rows.append(f"| {timing.name} | {timing.median_ms:.1f} | {timing.median_ratio:.2f} | {ok} |")
    return "\n".join(rows)


def profile(name: str, fields: dict[str, Tensor], rows: int = 15, steps: int = 3) -> str:
    """Per-operator CPU profile (self time, summed over ``steps`` passes) of forward + backward of one objective;
    batches are built before profiling starts so only the objective's own operators show."""
    objective = get_objective(name)
    for _ in range(2):
        time_once(objective, fields)
    batches = [fresh_batch(fields) for _ in range(steps)]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for batch in batches:
            run_step(objective, batch)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


# ------------------------------------------------------------------------------------------------ vs verl
VERL_TARGET = 1.5  # ours with its ten standard metrics / verl's loss alone
VERL_BARE_TARGET = 1.0  # ours without metrics / verl's loss
AMORTIZE_EVERY = 10  # the extra column: metrics every 10th call (``metrics_every=10``), from the paired times


@dataclass(frozen=True)
class VerlPair:
    """One of our objectives and the verl ``core_algos`` policy loss computing the same loss and gradient."""

    ours: str
    verl: str
    agg: str = "token-mean"
    params: dict[str, Any] = field(default_factory=dict)  # ours; verl gets the same clip edges
    verl_config: dict[str, Any] = field(default_factory=dict)  # verl ActorConfig fields

    @property
    def label(self) -> str:
        return f"{self.ours} vs {self.verl}"


#: Every loss verl 0.9.1 registers that we also have.  Not paired: ``geo_mean`` (GMPO), ``clip_cov``, ``kl_cov``,
#: ``dppo_tv``, ``dppo_kl``, ``sapo``, ``dro`` (no counterpart here) and ``bypass_mode`` (a dispatcher to verl's
#: rollout-correction REINFORCE / PPO, not a loss of its own).
VERL_PAIRS = (
    VerlPair("grpo", "vanilla", params={"eps_low": 0.2, "eps_high": 0.28, "dual_clip": 3.0},
             verl_config={"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0}),
    VerlPair("gspo", "gspo", agg="seq-mean-token-mean", params={"eps_low": 3e-4, "eps_high": 4e-4},
             verl_config={"clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4}),
    VerlPair("cispo", "cispo", params={"eps_low": 1.0, "eps_high": 0.28},
             verl_config={"clip_ratio_low": 1.0, "clip_ratio_high": 0.28}),
    VerlPair("reinforce", "gpg"),
)


def verl_inputs(fields: dict[str, Tensor]) -> dict[str, Tensor]:
    """verl's loss arguments for the benchmark batch: token-level advantages, a fresh leaf ``log_prob``."""
    mask = fields["mask"]
    return {
        "old_log_prob": fields["behavior_logp"],
        "log_prob": fields["logp"].clone().requires_grad_(True),
        "advantages": fields["advantages"][:, None].expand_as(mask).contiguous(),
        "response_mask": mask,
    }


class VerlSide:
    """verl's loss function for a pair, with its ActorConfig."""

    def __init__(self, core_algos: Any, actor_config: Any, pair: VerlPair) -> None:
        self.fn = core_algos.get_policy_loss_fn(pair.verl)
        self.config = actor_config(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, **pair.verl_config)
        self.agg = pair.agg

    def loss(self, inputs: dict[str, Tensor]) -> Tensor:
        return self.fn(**inputs, loss_agg_mode=self.agg, config=self.config)[0]


def our_objective(pair: VerlPair):
    return get_objective(pair.ours, **pair.params, agg=pair.agg)


def our_batch(fields: dict[str, Tensor]) -> TokenBatch:
    """The benchmark batch for the verl comparison: verl's token-level advantages, ``entropy`` kept (its mean is one of
    our standard metrics)."""
    return fresh_batch({**fields, "advantages": verl_inputs(fields)["advantages"]})


def check_same_loss(pair: VerlPair, objective, verl: VerlSide, fields: dict[str, Tensor]) -> str:
    """Loss values and gradients of both sides on the benchmark batch; raises ``AssertionError`` if they differ."""
    leaf = fields["logp"].clone().requires_grad_(True)
    ours = objective(our_batch({**fields, "logp": leaf})).loss
    ours.backward()
    ours = ours.detach()
    inputs = verl_inputs(fields)
    theirs = verl.loss(inputs)
    theirs.backward()
    theirs = theirs.detach()
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-7, msg=lambda m: f"{pair.label} loss: {m}")
    torch.testing.assert_close(leaf.grad, inputs["log_prob"].grad, rtol=1e-5, atol=1e-9,
                               msg=lambda m: f"{pair.label} gradient: {m}")
    return f"{pair.label}: loss {ours.item():.6g} = {theirs.item():.6g}, gradients agree"


def supports_metrics_switch(objective) -> bool:
    """Whether the objective can be called without its metrics (``objective(batch, metrics=False)``)."""
    return "metrics" in inspect.signature(objective.__call__).parameters


def time_ours(objective, fields: dict[str, Tensor], metrics: bool = True) -> float:
    batch = our_batch(fields)
    kwargs = {} if metrics else {"metrics": False}
    start = clock()
    objective(batch, **kwargs).loss.backward()
    return clock() - start


def time_verl(verl: VerlSide, fields: dict[str, Tensor]) -> float:
    inputs = verl_inputs(fields)
    start = clock()
    verl.loss(inputs).backward()
    return clock() - start


@dataclass
class PairTiming:
    label: str
    ours: list[float] = field(default_factory=list)
    bare: list[float] = field(default_factory=list)  # ours without metrics (empty when not supported)
    verl: list[float] = field(default_factory=list)

    def ratio(self, side: list[float]) -> float:
        return statistics.median(a / b for a, b in zip(side, self.verl, strict=True))

    def amortized_ratio(self, every: int) -> float:
        """Paired median of (t_metrics + (every − 1)·t_no_metrics) / every / t_verl: metrics every ``every`` calls."""
        per_call = [(m + (every - 1) * b) / every for m, b in zip(self.ours, self.bare, strict=True)]
        return statistics.median(a / v for a, v in zip(per_call, self.verl, strict=True))


def benchmark_vs_verl(pairs: Sequence[VerlPair], fields: dict[str, Tensor], repeats: int, warmup: int) -> list[PairTiming]:
    """Per round and pair: ours (metrics), ours (no metrics, when supported) and verl's, in an order that rotates
    between rounds; paired ratios over the rounds after ``warmup``."""
    from verl.trainer.ppo import core_algos
    from verl.workers.config import ActorConfig

    sides = [(pair, our_objective(pair), VerlSide(core_algos, ActorConfig, pair)) for pair in pairs]
    for pair, objective, verl in sides:
        print(check_same_loss(pair, objective, verl, fields))
    timings = [PairTiming(pair.label) for pair in pairs]
    for round_index in range(warmup + repeats):
        for (_, objective, verl), timing in zip(sides, timings, strict=True):
            runs = {"ours": lambda o=objective: time_ours(o, fields), "verl": lambda v=verl: time_verl(v, fields)}
            if supports_metrics_switch(objective):
                runs["bare"] = lambda o=objective: time_ours(o, fields, metrics=False)
            names = list(runs)
            shift = round_index % len(names)
            measured = {name: runs[name]() for name in names[shift:] + names[:shift]}
            if round_index >= warmup:
                for name, seconds in measured.items():
                    getattr(timing, name).append(seconds)
    return timings


def format_verl_table(timings: list[PairTiming], every: int = AMORTIZE_EVERY) -> str:
    rows = ["| ours vs verl | ours ms | ours, no metrics ms | verl ms | ours / verl (paired median) | "
            f"no metrics / verl | metrics every {every}th / verl | ≤ {VERL_TARGET:g}× with, ≤ {VERL_BARE_TARGET:g}× "
            "without |", "|---|---:|---:|---:|---:|---:|---:|:---:|"]
    for t in timings:
        bare_ms = f"{1e3 * statistics.median(t.bare):.1f}" if t.bare else "n/a"
        bare_ratio = f"{t.ratio(t.bare):.2f}" if t.bare else "n/a"
        amortized = f"{t.amortized_ratio(every):.2f}" if t.bare else "n/a"
        ok = "yes" if t.ratio(t.ours) <= VERL_TARGET and (not t.bare or t.ratio(t.bare) <= VERL_BARE_TARGET) \
            else "**NO**"
        rows.append(f"| {t.label} | {1e3 * statistics.median(t.ours):.1f} | {bare_ms} | "
                    f"{1e3 * statistics.median(t.verl):.1f} | {t.ratio(t.ours):.2f} | {bare_ratio} | {amortized} | {ok} |")
    return "\n".join(rows)


def metrics_parts(fields: dict[str, Tensor]) -> dict[str, Any]:
    """The timed parts of ``--metrics-alone``, each on a fresh batch built outside the timer: the ten standard
    metrics alone (the batch's token count computed first, as the loss does), Δ = logp − behavior_logp with the one
    transcendental the metrics need (``capped_expm1``) and one sum, and verl's ``gpg`` loss (forward + backward)."""
    from verl.trainer.ppo import core_algos
    from verl.workers.config import ActorConfig

    from offpolicylab.formulas import capped_expm1
    from offpolicylab.objectives.base import standard_metrics

    gpg = VerlSide(core_algos, ActorConfig, VERL_PAIRS[-1])

    def metrics() -> float:
        batch = our_batch(fields)
        batch.tokens()
        start = clock()
        standard_metrics(batch, batch.mask)
        return clock() - start

    def floor() -> float:
        batch = our_batch(fields)
        start = clock()
        capped_expm1(batch.delta()).sum()
        return clock() - start

    reinforce = our_objective(VERL_PAIRS[-1])
    return {"reinforce with the ten metrics (forward + backward)": lambda: time_ours(reinforce, fields),
            "reinforce loss alone (forward + backward)": lambda: time_ours(reinforce, fields, metrics=False),
            "ten standard metrics alone": metrics, "Δ + expm1(min(Δ, 80)) + one sum": floor,
            "verl gpg loss (forward + backward)": lambda: time_verl(gpg, fields)}


#: e^x − 1 = Σ_{j ≥ 1} x^j / j!, to j = 8 (Horner): below |x| < 1/2 the rest is < 2⁻²⁷ relative
_EXPM1_TAYLOR = tuple(1.0 / math.factorial(j) for j in range(8, 0, -1))


def _precise_expm1(x: Tensor) -> Tensor:
    """e^x − 1 for a compiled pass: inductor's vectorized ``expm1`` is exp(x) − 1, which loses k3 = (e^x − 1) − x
    near x = 0, so the Taylor polynomial below |x| < 1/2 and exp(x) − 1 above (where it keeps float32 precision)."""
    series = torch.full_like(x, _EXPM1_TAYLOR[0])
    for coefficient in _EXPM1_TAYLOR[1:]:
        series = series * x + coefficient
    return torch.where(x.abs() < 0.5, series * x, torch.exp(x) - 1.0)


def _one_pass(logp: Tensor, behavior: Tensor, mask: Tensor, entropy: Tensor, advantages: Tensor) -> tuple[Tensor, Tensor]:
    """[1, N] inputs → ([N/64, 8] per-64-token partial sums of Δ, k3, r·m, |Δ|, Δ², (r·m)², entropy, A·log π;
    [N/64] 64-token maxima of r·m): every statistic's pass in one loop when compiled."""
    delta = (logp - behavior).reshape(-1, 64)
    expm1 = _precise_expm1(torch.clamp(delta, max=80.0))
    ratio = expm1 + mask.reshape(-1, 64)
    terms = (delta, expm1 - delta, ratio, delta.abs(), delta * delta, ratio * ratio, entropy.reshape(-1, 64),
             (advantages * logp).reshape(-1, 64))
    return torch.stack([term.sum(-1) for term in terms], -1), ratio.amax(-1)


def compiled_parts(fields: dict[str, Tensor]) -> dict[str, Any]:
    """``--compiled``: what one fused pass would cost — a measurement, not the library's code.  ``torch.compile``
    (inductor) of :func:`_one_pass` (Δ, e = e^min(Δ, 80) − 1, the 64-token partial sums of the metrics' terms and
    the 64-token maxima of r·m in one loop over the tokens), the partial sums summed and the percentile read from
    the 136 blocks with the largest maxima (their ratios recomputed eagerly); the second row adds REINFORCE's
    −Σ A·log π / n to the same pass, its gradient A·(−g/n) backward."""
    from offpolicylab.diagnostics.stats import largest

    one_pass = torch.compile(_one_pass, dynamic=False)

    def summary(batch: TokenBatch) -> tuple[Tensor, Tensor]:
        flat = [value.detach().reshape(1, -1) for value in (batch.logp, batch.behavior_logp, batch.mask,
                                                              batch.entropy, batch.advantages)]
        partial, maxima = one_pass(*flat)
        k = 136  # the top ranks the 99.9th percentile of 262,144 tokens needs
        chosen = maxima.topk(k, sorted=False).indices
        logp, behavior, mask = (value.reshape(-1, 64).index_select(0, chosen) for value in flat[:3])
        top = largest((torch.expm1((logp - behavior).clamp(max=80.0)) + mask).reshape(1, -1), k)
        return partial.sum(0) / batch.tokens(), top

    class Fused(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, logp: Tensor, batch: TokenBatch) -> Tensor:
            sums, _ = summary(batch)
            ctx.save_for_backward(batch.advantages, batch.tokens())
            return -sums[7]

        @staticmethod
        def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
            advantages, tokens = ctx.saved_tensors
            return advantages * -(grad / tokens), None

    def metrics() -> float:
        batch = our_batch(fields)
        batch.tokens()
        start = clock()
        summary(batch)
        return clock() - start

    def fused() -> float:
        batch = our_batch(fields)
        batch.tokens()
        start = clock()
        Fused.apply(batch.logp, batch).backward()
        return clock() - start

    start = time.perf_counter()
    metrics()
    print(f"compiled the one pass in {time.perf_counter() - start:.1f} s")
    return {"compiled: the metrics' one pass + percentile read": metrics,
            "compiled: reinforce loss + metrics in one pass (forward + backward)": fused}


def run_metrics_alone(fields: dict[str, Tensor], repeats: int, warmup: int, compiled: bool = False) -> int:
    """What the metrics cost against verl's ``gpg`` (the loss REINFORCE is paired with): paired per round."""
    parts = metrics_parts(fields)
    if compiled:
        parts = {**compiled_parts(fields), **parts}
    seconds: dict[str, list[float]] = {name: [] for name in parts}
    for round_index in range(warmup + repeats):
        names = list(parts)
        shift = round_index % len(names)
        measured = {name: parts[name]() for name in names[shift:] + names[:shift]}
        if round_index >= warmup:
            for name, value in measured.items():
                seconds[name].append(value)
    gpg = seconds[list(parts)[-1]]
    print("| part | median ms | / verl gpg (median of paired) |\n|---|---:|---:|")
    for name, values in seconds.items():
        ratio = statistics.median(a / b for a, b in zip(values, gpg, strict=True))
        print(f"| {name} | {1e3 * statistics.median(values):.3f} | {ratio:.2f} |")
    return 0


def run_vs_verl(fields: dict[str, Tensor], repeats: int, warmup: int, metrics_alone: bool = False,
                compiled: bool = False) -> int:
    try:
        import verl
    except ImportError as error:
        print(f"--vs-verl needs verl installed (pip install -c constraints.txt verl): {error}", file=sys.stderr)
        return 2
    print(f"verl {verl.__version__}")
    if metrics_alone:
        return run_metrics_alone(fields, repeats, warmup, compiled)
    timings = benchmark_vs_verl(VERL_PAIRS, fields, repeats, warmup)
    print(format_verl_table(timings))
    over = [t.label for t in timings if t.ratio(t.ours) > VERL_TARGET or (t.bare and t.ratio(t.bare) > VERL_BARE_TARGET)]
    print(f"all within {VERL_TARGET:g}× verl with metrics and {VERL_BARE_TARGET:g}× without" if not over
          else f"over a target: {', '.join(over)}")
    return 0


# ------------------------------------------------------------------------------------------------ vs before
def import_revision(revision: str, into: Path) -> Any:
    """The ``offpolicylab`` package of git revision ``revision`` of this repository, extracted into ``into`` and
    imported as ``offpolicylab_before`` (every ``offpolicylab`` name in its sources renamed), next to this tree's."""
    root = Path(__file__).resolve().parents[1]
    archive = into / "before.tar"
    with open(archive, "wb") as fh:
        subprocess.run(["git", "-C", str(root), "archive", revision, "offpolicylab"], stdout=fh, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    package = into / "offpolicylab_before"
    (into / "offpolicylab").rename(package)
    for source in package.rglob("*.py"):
        source.write_text(re.sub(r"\boffpolicylab\b", "offpolicylab_before", source.read_text()))
    sys.path.insert(0, str(into))
    return importlib.import_module("offpolicylab_before.objectives")


def fresh_before_batch(module: Any, fields: dict[str, Tensor]) -> Any:
    return module.TokenBatch(**{**fields, "logp": fields["logp"].clone().requires_grad_(True)})


def benchmark_vs_before(names: Sequence[str], module: Any, fields: dict[str, Tensor], repeats: int,
                        warmup: int) -> list[Timing]:
    """Per round and objective: this tree's and the revision's (update +) forward + backward with metrics, in an
    order that rotates between rounds; the paired ratio this tree / revision over the rounds after ``warmup``."""
    known = set(module.list_objectives())
    pairs = {name: (get_objective(name), module.get_objective(name)) for name in names if name in known}
    seconds: dict[str, list[float]] = {name: [] for name in pairs}
    ratios: dict[str, list[float]] = {name: [] for name in pairs}
    for round_index in range(warmup + repeats):
        for name, (ours, theirs) in pairs.items():
            sides = [("ours", ours, fresh_batch), ("before", theirs, lambda f: fresh_before_batch(module, f))]
            if round_index % 2:
                sides.reverse()
            measured = {}
            for side, objective, build in sides:
                batch = build(fields)
                start = clock()
                run_step(objective, batch)
                measured[side] = clock() - start
            if round_index >= warmup:
                seconds[name].append(measured["ours"])
                ratios[name].append(measured["ours"] / measured["before"])
    return [Timing(name, seconds[name], ratios[name]) for name in pairs]


def format_before_table(timings: list[Timing], revision: str) -> str:
    rows = [f"| objective | this tree ms | this tree / {revision} (median of paired) |", "|---|---:|---:|"]
    rows += [f"| {t.name} | {t.median_ms:.2f} | {t.median_ratio:.2f} |" for t in timings]
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=256, help="sequences (multiple of --group-size)")
    parser.add_argument("--length", type=int, default=1024, help="tokens per sequence (T)")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=15, help="timed rounds (median over them)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed rounds first")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--objectives", nargs="*", default=None, help="subset (default: all registered)")
    parser.add_argument("--profile", metavar="NAME", default=None, help="profile one objective instead")
    parser.add_argument("--vs-verl", action="store_true", help="time ours vs verl's core_algos losses instead")
    parser.add_argument("--metrics-alone", action="store_true",
                        help="with --vs-verl: the ten standard metrics alone, Δ with its one expm1, and verl's gpg")
    parser.add_argument("--compiled", action="store_true",
                        help="with --metrics-alone: also one torch.compile'd pass of the metrics (and REINFORCE's "
                             "loss), a measurement of what fusing would give (needs a C++ compiler)")
    parser.add_argument("--before", metavar="REV", default=None,
                        help="time this tree's objectives vs git revision REV's, in this process, instead")
    parser.add_argument("--clock", choices=tuple(CLOCKS), default="cpu",
                        help="cpu: this process's CPU time (default; steady on a shared machine), wall: wall clock")
    args = parser.parse_args(argv)
    global clock
    clock = CLOCKS[args.clock]
    valid = list_objectives()
    chosen = args.objectives or valid
    unknown = [name for name in chosen + ([args.profile] if args.profile else []) if name not in valid]
    if unknown:
        print(f"unknown objective(s) {', '.join(unknown)}; valid: {', '.join(valid)}", file=sys.stderr)
        return 2
    if args.metrics_alone and not args.vs_verl:
        print("--metrics-alone is a part of --vs-verl; valid: --vs-verl --metrics-alone", file=sys.stderr)
        return 2
    if args.compiled and not args.metrics_alone:
        print("--compiled is a part of --metrics-alone; valid: --vs-verl --metrics-alone --compiled", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    fields = make_fields(args.batch, args.length, args.group_size, args.seed)
    tokens = int(fields["mask"].sum())
    print(f"offpolicylab imported from {Path(offpolicylab.__file__).parent}")
    print(f"command: {shlex.join([Path(sys.executable).name, *sys.argv])}")
    print(
        f"batch {args.batch} × {args.length} ({tokens} valid tokens), torch {torch.__version__}, "
        f"{torch.get_num_threads()} thread(s), {args.repeats} rounds after {args.warmup} warm-up, "
        f"{args.clock} clock"
    )
    if args.profile:
        print(profile(args.profile, fields))
        return 0
    if args.vs_verl:
        return run_vs_verl(fields, args.repeats, args.warmup, args.metrics_alone, args.compiled)
    if args.before:
        with tempfile.TemporaryDirectory() as folder:
            module = import_revision(args.before, Path(folder))
            print(format_before_table(benchmark_vs_before(chosen, module, fields, args.repeats, args.warmup),
                                      args.before))
        return 0
    build = []
    for _ in range(6):
        start = time.perf_counter()
        fresh_batch(fields)
        build.append(time.perf_counter() - start)
    print(f"TokenBatch construction (untimed below): {1e3 * statistics.median(build[1:]):.1f} ms")
    timings = benchmark(chosen, fields, args.repeats, args.warmup)
    print(format_table(timings))
    over = [t.name for t in timings if t.median_ratio > TARGET_RATIO]
    print(f"all within {TARGET_RATIO:g}× grpo" if not over else f"over {TARGET_RATIO:g}× grpo: {', '.join(over)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
