"""Where a run's time goes: the trainer's sections and a function-level profile (``offpolicylab run --profile``).

The loop's wall clock T is split by a :class:`Stopwatch` into sections

    policy = policy_forward (sample + score) + policy_backward (backward, clipping, optimizer step)
    outside share (evaluation excluded) = (T − policy − eval) / (T − eval)

(the objective, advantages, the ``TokenBatch``, the metrics row, logging and checkpoints are all "outside"; time in
no section, e.g. the schedule's bookkeeping, is listed as ``unsectioned``).  A :mod:`cProfile` profile of the same
updates ranks the Python functions (and the torch operators they call) by their own time.  cProfile adds a fixed
cost per Python call, so a profiled run is slower than a plain one and its shares lean towards Python-heavy code;
``benchmarks/trainer_loop.py`` measures the same sections without it.
"""

from __future__ import annotations

import cProfile
import io
import marshal
import pstats
import time
from dataclasses import dataclass
from typing import Any

import torch

SECTIONS = ("policy_forward", "policy_backward", "objective", "other", "eval", "checkpoint")
TOP_FUNCTIONS = 30  # rows of each function table in profile.txt
SHORT_FUNCTIONS = 8  # rows printed on the terminal


def breakdown(updates: int, total: float, sections: dict[str, float]) -> dict[str, float]:
    """Updates per second, shares of the loop's ``total`` seconds and milliseconds per update of each section."""
    seconds = {name: sections.get(name, 0.0) for name in SECTIONS}
    policy = seconds["policy_forward"] + seconds["policy_backward"]
    without_eval = total - seconds["eval"]
    return {
        "updates_per_s": updates / total,
        "outside_share": (total - policy) / total,
        "objective_share": seconds["objective"] / total,
        "eval_share": seconds["eval"] / total,
        "checkpoint_share": seconds["checkpoint"] / total,
        "bookkeeping_share": (total - policy - seconds["objective"] - seconds["eval"]) / total,
        "outside_share_without_eval": (without_eval - policy) / without_eval if without_eval > 0 else 0.0,
        **{f"ms_per_update_{name}": 1000 * value / updates for name, value in seconds.items()},
        "ms_per_update_unsectioned": 1000 * (total - sum(seconds.values())) / updates,
        "ms_per_update_total": 1000 * total / updates,
    }


@dataclass
class LoopProfile:
    """The result of a profiled stretch of updates: its sections (:func:`breakdown`) and the cProfile statistics."""

    updates: int
    total_s: float
    sections: dict[str, float]
    profiler: cProfile.Profile

    @property
    def numbers(self) -> dict[str, float]:
        return breakdown(max(self.updates, 1), self.total_s, self.sections)

    def section_table(self) -> str:
        """``section  ms/update  share`` for every section, then the outside-the-policy shares."""
        numbers, total = self.numbers, self.total_s
        lines = [f"{self.updates} updates in {total:.3f} s ({numbers['updates_per_s']:.1f} updates/s)",
                 f"{'section':<18}{'ms/update':>10}{'share':>8}"]
        for name in (*SECTIONS, "unsectioned"):
            ms = numbers[f"ms_per_update_{name}"]
            lines.append(f"{name:<18}{ms:>10.3f}{ms / numbers['ms_per_update_total']:>8.1%}")
        lines.append(f"outside forward/backward: {numbers['outside_share']:.1%} "
                     f"({numbers['outside_share_without_eval']:.1%} with evaluation excluded)")
        return "\n".join(lines)

    def function_table(self, sort: str, rows: int) -> str:
        """The ``rows`` first functions of the cProfile statistics sorted by ``sort`` (tottime, cumulative)."""
        out = io.StringIO()
        stats = pstats.Stats(self.profiler, stream=out)
        stats.strip_dirs().sort_stats(sort).print_stats(rows)
        text = out.getvalue()
        start = text.find("   ncalls")  # drop pstats' preamble (timing line, sort order, list reduced …)
        return text[start:].rstrip() if start >= 0 else text.rstrip()

    def report(self) -> str:
        """profile.txt: the section table and the top functions by own time and by cumulative time."""
        return "\n\n".join([
            self.section_table(),
            f"top {TOP_FUNCTIONS} functions by own time (tottime, seconds over the whole run):",
            self.function_table("tottime", TOP_FUNCTIONS),
            f"top {TOP_FUNCTIONS} functions by cumulative time:",
            self.function_table("cumulative", TOP_FUNCTIONS),
        ]) + "\n"

    def short(self) -> str:
        """What the command line prints: the section table and the few most expensive functions."""
        return (self.section_table() + f"\ntop {SHORT_FUNCTIONS} functions by own time:\n"
                + self.function_table("tottime", SHORT_FUNCTIONS))

    def stats_bytes(self) -> bytes:
        """The raw statistics in the format of :meth:`pstats.Stats.dump_stats` (``pstats.Stats(path)`` reads them,
        as do viewers such as snakeviz)."""
        self.profiler.create_stats()
        return marshal.dumps(self.profiler.stats)  # type: ignore[attr-defined]


class Stopwatch:
    """Wall-clock seconds per named section: ``with watch("policy_forward"): ...`` (sections do not nest).

    ``synchronize`` is called when a section starts and ends (default: ``torch.cuda.synchronize`` when CUDA is
    available, else nothing), so that GPU work queued in a section is charged to it rather than to the next one."""

    def __init__(self, synchronize: Any = "auto") -> None:
        self.seconds: dict[str, float] = {}
        if synchronize == "auto":
            synchronize = torch.cuda.synchronize if torch.cuda.is_available() else None
        self.synchronize = synchronize

    def __call__(self, name: str) -> _Section:
        return _Section(self.seconds, name, self.synchronize)


class _Section:
    """One timed ``with`` block of a :class:`Stopwatch`."""

    __slots__ = ("name", "seconds", "start", "synchronize")

    def __init__(self, seconds: dict[str, float], name: str, synchronize: Any = None) -> None:
        self.seconds, self.name, self.start, self.synchronize = seconds, name, 0.0, synchronize

    def __enter__(self) -> None:
        if self.synchronize is not None:
            self.synchronize()
        self.start = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        if self.synchronize is not None:
            self.synchronize()
        self.seconds[self.name] = self.seconds.get(self.name, 0.0) + (time.perf_counter() - self.start)
