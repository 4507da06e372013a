"""Collapse warnings: streaming detectors that read what a run logs while it trains and alarm before a fall.

Each detector sees one update's row of logged metrics at a time (our names: ``reward_mean`` — the consumed batch's
reward —, ``kl_k3`` — KL of π to the behaviour policy —, ``grad_norm`` — pre-clip —, ``ess``, ``ratio_mean``,
``entropy``, ...; a missing or non-finite value is "not logged") and returns a reason when an alarm *starts* at that
update.  An alarm re-arms after ``cooldown`` updates without the condition.  The detectors, their signals and
sources:

- ``reward_spike``: the trainer's detector (:class:`~offpolicylab.diagnostics.collapse.CollapseDetector`): the
  smoothed reward gives back ≥ max(margin, ½ gain) within ``window`` updates of a KL or gradient-norm spike
  (M2PO; Zheng, Zhao, Chen 2025, arXiv:2510.01161, appendix G).
- ``verl_ranges``: verl's documented health ranges for importance weights (verl ``docs/algo/rollout_corr.md``): IS
  mean in [0.5, 2], ESS ≥ 0.3, |KL| ≤ 0.1, violated for ``patience`` consecutive updates.
- ``kl_slope``: the KL to the behaviour policy growing ("a sustained, growing mismatch KL is the early-warning
  sign", prime-rl's docs; ~30× growth before an entropy collapse, tinker-cookbook #822):
  EMA₂₀(log₁₀ KL_u) − median_{s<u} log₁₀ KL_s ≥ ``rise`` for ``patience`` updates.
- ``ess_grad``: VCPO's signals (collapse "reliably predicted by ESS and unstable gradient norms", arXiv:2602.17616):
  EMA₂₀(ESS_u) < ``ess_min``, or EMA₂₀(‖g‖_u) > ``factor`` · median_{s<u} ‖g‖_s, for ``patience`` updates.
- ``combined``: at least two of {KL rise, low ESS, gradient surge, entropy moved by ≥ ``entropy_change`` of its
  median} within ``window`` updates.

:func:`synthetic_history` and :func:`synthetic_kl_history` (KL-led falls) generate labelled histories from
documented formulas for the collapse-warning benchmark (``experiments/collapse_benchmark.md``).
"""

from __future__ import annotations

import bisect
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from offpolicylab.diagnostics.collapse import CollapseDetector

Row = Mapping[str, float]
EMA_SPAN = 20
COOLDOWN = 100


def value(row: Row, name: str) -> float | None:
    """``row[name]`` as a finite float, else None (missing, empty, NaN or inf count as not logged)."""
    raw = row.get(name)
    if raw is None or raw == "":
        return None
    try:
        number = float(raw)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


class RunningMedian:
    """Median of every value added so far (a sorted list; O(n) insertion, fine for 10⁴ updates)."""

    def __init__(self) -> None:
        self.values: list[float] = []

    def add(self, x: float) -> None:
        bisect.insort(self.values, x)

    def median(self) -> float | None:
        n = len(self.values)
        if n == 0:
            return None
        return self.values[n // 2] if n % 2 else 0.5 * (self.values[n // 2 - 1] + self.values[n // 2])


class Ema:
    """Exponential moving average with α = 2 / (span + 1), started at the first value."""

    def __init__(self, span: int = EMA_SPAN) -> None:
        self.alpha, self.value = 2.0 / (span + 1), None

    def add(self, x: float) -> float:
        self.value = x if self.value is None else (1 - self.alpha) * self.value + self.alpha * x
        return self.value


@dataclass
class Alarm:
    """Turns a per-update condition into alarm onsets: an onset after ``patience`` consecutive updates with the
    condition, then silence until ``cooldown`` updates pass without it."""

    patience: int = 1
    cooldown: int = COOLDOWN
    streak: int = 0
    active: bool = False
    quiet: int = 0

    def step(self, condition: bool) -> bool:
        self.streak = self.streak + 1 if condition else 0
        if self.active:
            self.quiet = 0 if condition else self.quiet + 1
            if self.quiet >= self.cooldown:
                self.active = False
            return False
        if self.streak >= self.patience:
            self.active, self.quiet = True, 0
            return True
        return False


class Detector(ABC):
    """A streaming collapse warning: :meth:`observe` one update's row; a reason string when an alarm starts."""

    name = "detector"
    warmup = 20  # updates before a detector that compares with its own history may alarm

    @abstractmethod
    def observe(self, update: int, row: Row) -> str | None:
        """Feed update ``update``'s logged metrics; the alarm's reason when one starts here, else None."""


class RewardSpike(Detector):
    """The trainer's reward-drop-after-spike detector, re-armed like the others (it fires at most once per run)."""

    name = "reward_spike"

    def __init__(self, margin: float = 0.1, window: int = 20, factor: float = 5.0) -> None:
        self.inner = CollapseDetector(margin=margin, window=window, spike=factor)

    def observe(self, update: int, row: Row) -> str | None:
        grad = value(row, "grad_norm")
        return self.inner.observe(update, value(row, "reward_mean"), value(row, "kl_k3"),
                                  self.inner.grad_mean if grad is None else grad)


class VerlRanges(Detector):
    """verl's health ranges: ratio_mean ∈ [0.5, 2], ess ≥ 0.3, |kl_k3| ≤ 0.1."""

    name = "verl_ranges"

    def __init__(self, patience: int = 1, is_range: tuple[float, float] = (0.5, 2.0), ess_min: float = 0.3,
                 kl_max: float = 0.1) -> None:
        self.alarm, self.is_range, self.ess_min, self.kl_max = Alarm(patience), is_range, ess_min, kl_max

    def observe(self, update: int, row: Row) -> str | None:
        mean, ess, kl = value(row, "ratio_mean"), value(row, "ess"), value(row, "kl_k3")
        broken = []
        if mean is not None and not self.is_range[0] <= mean <= self.is_range[1]:
            broken.append(f"IS mean {mean:.3g} outside [{self.is_range[0]:g}, {self.is_range[1]:g}]")
        if ess is not None and ess < self.ess_min:
            broken.append(f"ESS {ess:.3g} < {self.ess_min:g}")
        if kl is not None and abs(kl) > self.kl_max:
            broken.append(f"|KL| {abs(kl):.3g} > {self.kl_max:g}")
        return "; ".join(broken) if self.alarm.step(bool(broken)) else None


class KlSlope(Detector):
    """EMA₂₀(log₁₀ kl_k3) − median of its history ≥ ``rise`` decades for ``patience`` updates."""

    name = "kl_slope"

    def __init__(self, rise: float = 1.0, patience: int = 10) -> None:
        self.rise, self.alarm = rise, Alarm(patience)
        self.ema, self.history, self.seen = Ema(), RunningMedian(), 0

    def signal(self, row: Row) -> tuple[bool, str]:
        kl = value(row, "kl_k3")
        if kl is None:
            return False, ""
        level = math.log10(max(abs(kl), 1e-12))
        smooth, base = self.ema.add(level), self.history.median()
        self.history.add(level)
        self.seen += 1
        if base is None or self.seen < self.warmup:
            return False, ""
        up = smooth - base
        return up >= self.rise, f"KL {abs(kl):.3g} is {10 ** up:.3g}x its median {10 ** base:.3g}"

    def observe(self, update: int, row: Row) -> str | None:
        fired, reason = self.signal(row)
        return reason if self.alarm.step(fired) else None


class EssGrad(Detector):
    """EMA₂₀(ess) < ``ess_min`` or EMA₂₀(grad_norm) > ``factor`` · median of its history, ``patience`` updates."""

    name = "ess_grad"

    def __init__(self, ess_min: float = 0.5, factor: float = 5.0, patience: int = 5) -> None:
        self.ess_min, self.factor, self.alarm = ess_min, factor, Alarm(patience)
        self.ess, self.grad, self.grad_history, self.seen = Ema(), Ema(), RunningMedian(), 0

    def signals(self, row: Row) -> tuple[str | None, str | None]:
        """(low-ESS reason, gradient-surge reason), each None when that signal is quiet."""
        self.seen += 1
        ess, grad = value(row, "ess"), value(row, "grad_norm")
        low = surge = None
        if ess is not None:
            smooth = self.ess.add(ess)
            if self.seen >= self.warmup and smooth < self.ess_min:
                low = f"ESS {smooth:.3g} < {self.ess_min:g}"
        if grad is not None:
            smooth, base = self.grad.add(grad), self.grad_history.median()
            self.grad_history.add(grad)
            if self.seen >= self.warmup and base and smooth > self.factor * base:
                surge = f"gradient norm {smooth:.3g} > {self.factor:g} x median {base:.3g}"
        return low, surge

    def observe(self, update: int, row: Row) -> str | None:
        low, surge = self.signals(row)
        reasons = [r for r in (low, surge) if r]
        return "; ".join(reasons) if self.alarm.step(bool(reasons)) else None


class Combined(Detector):
    """At least two of {KL rise, low ESS, gradient surge, entropy change} fired within ``window`` updates."""

    name = "combined"

    def __init__(self, rise: float = 0.5, ess_min: float = 0.7, factor: float = 3.0, entropy_change: float = 0.3,
                 window: int = 50) -> None:
        self.kl, self.ess_grad = KlSlope(rise=rise, patience=1), EssGrad(ess_min=ess_min, factor=factor)
        self.entropy, self.entropy_history = Ema(), RunningMedian()
        self.entropy_change, self.window, self.alarm = entropy_change, window, Alarm(1)
        self.last: dict[str, tuple[int, str]] = {}
        self.seen = 0

    def observe(self, update: int, row: Row) -> str | None:
        self.seen += 1
        kl_fired, kl_reason = self.kl.signal(row)
        low, surge = self.ess_grad.signals(row)
        fired = {"kl": kl_reason if kl_fired else None, "ess": low, "grad": surge, "entropy": self.entropy_signal(row)}
        for signal, reason in fired.items():
            if reason:
                self.last[signal] = (update, reason)
        recent = [reason for when, reason in self.last.values() if update - when <= self.window]
        return "; ".join(recent) if self.alarm.step(len(recent) >= 2) else None

    def entropy_signal(self, row: Row) -> str | None:
        entropy = value(row, "entropy")
        if entropy is None:
            return None
        smooth, base = self.entropy.add(entropy), self.entropy_history.median()
        self.entropy_history.add(entropy)
        if self.seen < self.warmup or not base:
            return None
        change = smooth / base - 1
        if abs(change) >= self.entropy_change:
            return f"entropy {smooth:.3g} moved {change:+.0%} from its median {base:.3g}"
        return None


DETECTORS: dict[str, Callable[..., Detector]] = {
    cls.name: cls for cls in (RewardSpike, VerlRanges, KlSlope, EssGrad, Combined)}
#: parameter grids searched on the benchmark's training split (experiments/collapse_benchmark.md)
PARAMETER_GRIDS: dict[str, list[dict[str, Any]]] = {
    "reward_spike": [{}],
    "verl_ranges": [{"patience": p} for p in (1, 5, 20)],
    "kl_slope": [{"rise": r, "patience": p} for r in (0.3, 0.5, 1.0, 1.5) for p in (5, 20)],
    "ess_grad": [{"ess_min": e, "factor": f, "patience": p} for e in (0.3, 0.5, 0.7) for f in (3.0, 5.0, 10.0)
                 for p in (5, 20)],
    "combined": [{"rise": r, "ess_min": e, "factor": f, "entropy_change": c} for r in (0.3, 0.5, 1.0)
                 for e in (0.5, 0.7) for f in (3.0, 5.0) for c in (0.2, 0.4)],
}


#: the detector of ``analyze`` and of the live warning in training runs, chosen by the committed rule on the
#: benchmark's training split, KL-led falls included (experiments/collapse_benchmark.md; its measured scores:
#: docs/diagnosing.md)
DEFAULT_DETECTOR = "kl_slope"
#: each detector's parameters as chosen on the benchmark's training split (the ones docs/diagnosing.md scores)
CHOSEN_PARAMS: dict[str, dict[str, Any]] = {
    "reward_spike": {},
    "verl_ranges": {"patience": 1},
    "kl_slope": {"rise": 0.3, "patience": 5},
    "ess_grad": {"ess_min": 0.7, "factor": 3.0, "patience": 5},
    "combined": {"rise": 0.3, "ess_min": 0.7, "factor": 3.0, "entropy_change": 0.2},
}
DEFAULT_PARAMS: dict[str, Any] = CHOSEN_PARAMS[DEFAULT_DETECTOR]


def default_warning() -> Detector:
    """The live collapse warning of training runs: :data:`DEFAULT_DETECTOR` with :data:`DEFAULT_PARAMS`."""
    return make_detector(DEFAULT_DETECTOR, **DEFAULT_PARAMS)


def make_detector(name: str, **params: Any) -> Detector:
    """The detector ``name`` (one of :data:`DETECTORS`) with ``params``; ValueError naming the valid ones."""
    if name not in DETECTORS:
        raise ValueError(f"detector {name!r} is unknown; valid: {', '.join(DETECTORS)}")
    return DETECTORS[name](**params)


def alarms(detector: Detector, rows: list[tuple[int, Row]]) -> list[tuple[int, str]]:
    """Every alarm onset (update, reason) of ``detector`` fed ``rows`` in order."""
    found = []
    for update, row in rows:
        reason = detector.observe(update, row)
        if reason:
            found.append((update, reason))
    return found


# ==================================================================================== labels and scores
FALL_FLOOR = 0.1
SUSTAIN = 2
MAX_LEAD = 500


def fall_update(evaluations: list[tuple[int, float]], floor: float = FALL_FLOOR, sustain: int = SUSTAIN) -> int | None:
    """The first evaluation update u_i with J_i ≤ L_i = P_i − max(½(P_i − J₀), floor) whose next ``sustain``
    evaluations (those that exist) also stay ≤ L_i; P_i the running peak, J₀ the first evaluation; None if none."""
    if not evaluations:
        return None
    first, peak = evaluations[0][1], -math.inf
    for i, (update, j) in enumerate(evaluations):
        peak = max(peak, j)
        line = peak - max(0.5 * (peak - first), floor)
        if j <= line and all(later <= line for _, later in evaluations[i + 1:i + 1 + sustain]):
            return update
    return None


@dataclass
class Score:
    """One detector's score over a set of runs."""

    falls: int = 0
    detected: int = 0
    false_alarms: int = 0
    scored_updates: int = 0
    leads: list[int] = field(default_factory=list)

    @property
    def recall(self) -> float:
        return self.detected / self.falls if self.falls else math.nan

    @property
    def false_per_1000(self) -> float:
        return 1000.0 * self.false_alarms / self.scored_updates if self.scored_updates else math.nan

    @property
    def median_lead(self) -> float:
        return float(np.median(self.leads)) if self.leads else math.nan


def score_run(onsets: list[int], updates: list[int], fall: int | None, into: Score) -> None:
    """Add one run to ``into``: alarms in [fall − MAX_LEAD, fall] detect it (lead from the first), earlier ones are
    false alarms; without a fall every alarm is false.  Updates after the fall are not scored."""
    if fall is None:
        into.false_alarms += len(onsets)
        into.scored_updates += len(updates)
        return
    into.falls += 1
    early = [u for u in onsets if u < fall - MAX_LEAD]
    in_time = [u for u in onsets if fall - MAX_LEAD <= u <= fall]
    into.false_alarms += len(early)
    into.scored_updates += sum(1 for u in updates if u < fall - MAX_LEAD)
    if in_time:
        into.detected += 1
        into.leads.append(fall - in_time[0])


# ==================================================================================== synthetic histories
def synthetic_history(seed: int, updates: int = 800, eval_every: int = 25) -> dict[str, Any]:
    """A labelled history from documented formulas: {"rows": [(u, row)], "evaluations": [(u, J)], "falls": bool}.

    J(u) = J₀ + g (1 − e^{−u/τ}) + N(0, 0.02²) with J₀ ~ U(0.1, 0.3), g ~ U(0.3, 0.6), τ ~ U(100, 300); the
    consumed reward lags it by s ∈ {0, 64, 256} updates, + N(0, 0.05²).  Every run carries bait: gradient-norm
    spikes ×10 at rate 1/300 and reward dips of −0.15 for 30 updates at rate 1/400, which recover.  Half the runs
    (seed odd) fall at F ~ U(0.4, 0.9)·updates: J decays to 0.2·J₀ with time constant 20 after F; over the
    L ~ U(20, 300) updates before F, KL to the behaviour policy grows geometrically to 30× its base (tinker-cookbook
    #822), the gradient norm to 5× in the last L/3 (verl #1051; VCPO, arXiv:2602.17616), ESS = exp(−20 KL) falls with
    it, and entropy drops by half after F.  Base KL ~ 10^U(−3.5, −2), gradient norm ~ 0.5·LogNormal(0, 0.3)."""
    rng = np.random.default_rng(seed)
    j0, gain, tau = rng.uniform(0.1, 0.3), rng.uniform(0.3, 0.6), rng.uniform(100, 300)
    lag = int(rng.choice([0, 64, 256]))
    falls = seed % 2 == 1
    fall_at = int(rng.uniform(0.4, 0.9) * updates) if falls else updates * 10
    lead = int(rng.uniform(20, 300))
    kl_base = 10 ** rng.uniform(-3.5, -2.0)
    u = np.arange(updates)
    clean = j0 + gain * (1 - np.exp(-u / tau))
    after = np.clip(u - fall_at, 0, None)
    clean = np.where(u >= fall_at, 0.2 * j0 + (clean - 0.2 * j0) * np.exp(-after / 20.0), clean)
    growth = np.clip((u - (fall_at - lead)) / lead, 0, 1)
    kl = kl_base * 30.0 ** growth * np.exp(rng.normal(0, 0.3, updates))
    grad_growth = np.clip((u - (fall_at - lead / 3)) / (lead / 3), 0, 1)
    grad = 0.5 * np.exp(rng.normal(0, 0.3, updates)) * 5.0 ** grad_growth
    grad = np.where(rng.random(updates) < 1 / 300, grad * 10, grad)
    dips = np.zeros(updates)
    for start in np.flatnonzero(rng.random(updates) < 1 / 400):
        dips[start:start + 30] -= 0.15
    lagged = np.interp(u - lag, u, clean, left=clean[0]) + dips + rng.normal(0, 0.05, updates)
    entropy = 0.8 * np.exp(-u / 2000) * np.where(u >= fall_at, 0.5, 1.0) * np.exp(rng.normal(0, 0.02, updates))
    rows = [(int(k), {"reward_mean": float(lagged[k]), "kl_k3": float(kl[k]), "grad_norm": float(grad[k]),
                      "ess": float(np.exp(-20 * kl[k])), "ratio_mean": 1.0, "entropy": float(entropy[k])})
            for k in range(updates)]
    evaluations = [(int(k), float(clean[k] + rng.normal(0, 0.02))) for k in range(0, updates, eval_every)]
    return {"rows": rows, "evaluations": evaluations, "falls": falls}


def synthetic_kl_history(seed: int, updates: int = 800, eval_every: int = 25) -> dict[str, Any]:
    """A labelled KL-led history, as a verl log shows one (no ESS or IS mean logged): {"rows", "evaluations", "falls"}.

    J(u) = J₀ + g (1 − e^{−u/τ}) + N(0, 0.02²) as in :func:`synthetic_history`, the consumed reward lagging it by
    s ∈ {0, 64, 256} updates + N(0, 0.05²), with the same bait (gradient-norm spikes ×10 at rate 1/300, dips of
    −0.15 for 30 updates at rate 1/400).  Half the runs (seed odd) fall slowly behind a KL that climbs steadily:
    from D ~ U(0.3, 0.6)·updates, log₁₀ KL grows linearly by d ~ U(1, 2) decades over S ~ U(150, 400) updates (and
    on at that rate to 1.5 S) — "a sustained, growing mismatch KL is the early-warning sign" (prime-rl's docs;
    tinker-cookbook #822) — and from D + U(0.2, 0.5)·S the return declines linearly to 0.2·J₀ over U(150, 400)
    updates; the gradient norm grows at most 2× with the KL, the entropy falls by at most 30 %.  Runs that do not
    fall carry a KL drifting up 3× over the whole run.  Base KL ~ 10^U(−3.5, −2), gradient norm ~ 0.5·LogNormal(0,
    0.3)."""
    rng = np.random.default_rng([seed, 1])
    j0, gain, tau = rng.uniform(0.1, 0.3), rng.uniform(0.3, 0.6), rng.uniform(100, 300)
    lag = int(rng.choice([0, 64, 256]))
    falls = seed % 2 == 1
    onset = rng.uniform(0.3, 0.6) * updates if falls else updates * 10.0
    span, decades = rng.uniform(150, 400), rng.uniform(1.0, 2.0)
    start, length = onset + rng.uniform(0.2, 0.5) * span, rng.uniform(150, 400)
    kl_base = 10 ** rng.uniform(-3.5, -2.0)
    u = np.arange(updates)
    climb = np.clip((u - onset) / span, 0.0, 1.5)
    grown = np.clip(climb, 0.0, 1.0)
    clean = j0 + gain * (1 - np.exp(-u / tau))
    clean = clean - (clean - 0.2 * j0) * np.clip((u - start) / length, 0.0, 1.0)
    drift = 0.0 if falls else np.log10(3.0) * u / updates
    kl = kl_base * 10.0 ** (decades * climb + drift) * np.exp(rng.normal(0, 0.3, updates))
    grad = 0.5 * np.exp(rng.normal(0, 0.3, updates)) * (1.0 + grown)
    grad = np.where(rng.random(updates) < 1 / 300, grad * 10, grad)
    dips = np.zeros(updates)
    for begin in np.flatnonzero(rng.random(updates) < 1 / 400):
        dips[begin:begin + 30] -= 0.15
    lagged = np.interp(u - lag, u, clean, left=clean[0]) + dips + rng.normal(0, 0.05, updates)
    entropy = 0.8 * np.exp(-u / 2000) * (1.0 - 0.3 * grown) * np.exp(rng.normal(0, 0.02, updates))
    rows = [(int(k), {"reward_mean": float(lagged[k]), "kl_k3": float(kl[k]), "grad_norm": float(grad[k]),
                      "entropy": float(entropy[k])}) for k in range(updates)]
    evaluations = [(int(k), float(clean[k] + rng.normal(0, 0.02))) for k in range(0, updates, eval_every)]
    return {"rows": rows, "evaluations": evaluations, "falls": falls}
