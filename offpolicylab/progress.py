"""What a training run prints while it runs (stderr).  Updates are numbered from 0 everywhere — the console,
``metrics.csv``, ``events.jsonl``, ``summary.json`` (``peak_*_update``, ``collapse_update``) and the plots: "update 7"
is the eighth optimizer step, and "8/30 done" counts the updates finished.

* On a terminal (``"bar"``): a tqdm bar whose postfix shows the latest reward, clip or mask fraction, ratio p99.9,
  ESS and entropy (and the KL to the reference when the KL penalty is on); evaluation lines and warnings are printed
  above it.
* Off a terminal (``"lines"``, e.g. a log file): one line per update at most every :data:`LINE_SECONDS` seconds,
  the last update always, every evaluation, and every warning (a non-finite step, a detected collapse).

The line starting the run (:func:`describe_run`) names the world, policy, objective and schedule and the training
settings a world or policy chose for the fields the user left unset.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from offpolicylab.config import TrainConfig

LINE_SECONDS = 5.0
#: The columns of an update line and the bar's postfix, in order, with their short names.
#: ``reward`` is the run's one reward (docs/metrics.md): ``reward_current`` where the update has it, else
#: ``reward_mean`` (:func:`live_values`).
LIVE_COLUMNS = (("reward", "reward"), ("clip_frac", "clip"), ("mask_frac", "mask"), ("ratio_p999", "r_p99.9"),
                ("ess", "ess"), ("entropy", "entropy"), ("kl_ref", "kl_ref"), ("loss", "loss"))
SETTINGS = ("prompts_per_update", "group_size", "temperature", "advantage", "optimizer", "lr", "grad_clip",
            "eval_samples")


def describe_run(config: TrainConfig, memory_plan: str | None = None) -> str:
    """``offpolicylab: synthetic_lm / transformer / grpo / stale_k:256, 400 updates; optimizer adamw, lr 0.0015, ...
    (chosen by world synthetic_lm: ...)``: the run and the settings that worlds and policies may choose, naming
    those the world or policy chose."""
    text = (f"offpolicylab: {config.world} / {config.policy} / {config.objective} / {config.schedule}, "
            f"{config.updates} updates (0..{config.updates - 1})")
    text += "; " + ", ".join(f"{name} {_number(getattr(config, name))}" for name in SETTINGS)
    by: dict[str, list[str]] = {}
    for name, source in config.sources().items():
        if source != "default":
            by.setdefault(source, []).append(name)
    if by:
        text += " (" + "; ".join(f"chosen by {source}: {', '.join(names)}" for source, names in by.items()) + ")"
    if memory_plan:
        text += f"; scoring: {memory_plan}"
    return text


def log(text: str) -> None:
    """Print ``text`` on stderr, flushed (the run's start line, profile summary and notes)."""
    print(text, file=sys.stderr, flush=True)


def progress_line(row: dict[str, Any], total: int, seconds: float) -> str:
    """``update 2 (3/30 done)  reward 0.125  clip 0.05  …  1.2 s/update``: an update's live diagnostics."""
    update, row = int(row["update"]), live_values(row)
    parts = [f"update {update} ({update + 1}/{total} done)"]
    parts += [f"{short} {_number(row[key])}" for key, short in LIVE_COLUMNS if _shown(row.get(key))]
    return "  ".join([*parts, f"{seconds:.2g} s/update"])


def eval_line(row: dict[str, Any], seconds: float | None = None) -> str:
    """``  eval update 9  eval_reward_sampled 0.1  eval_reward_greedy 0.05``: the evaluation numbers of an update."""
    parts = [f"{key} {_number(value)}" for key, value in row.items()
             if key.startswith(("eval_", "exact_")) and _shown(value)]
    return "  ".join([f"  eval update {int(row['update'])}", *parts] + ([f"{seconds:.1f} s"] if seconds else []))


def evaluated(row: dict[str, Any]) -> bool:
    return any(key.startswith(("eval_", "exact_")) and _shown(value) for key, value in row.items())


class Progress:
    """The console view of a run (one or several seeds trained together), fed once per update by the trainer.

    ``mode``: ``"bar"`` (or True), ``"lines"``, or False / None for silence.  ``write`` and ``clock`` are the
    output and the time source (stderr and :func:`time.monotonic`; tests pass their own)."""

    def __init__(self, mode: bool | str | None, total: int, start: int, *,
                 write: Callable[[str], None] | None = None, clock: Callable[[], float] = time.monotonic,
                 stream: TextIO | None = None) -> None:
        self.mode = "bar" if mode is True else (mode or None)
        self.total, self.clock = total, clock
        self.stream = stream or sys.stderr
        self.bar: Any = None
        if self.mode == "bar":
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=start, unit="upd", dynamic_ncols=True, leave=False, file=self.stream)
        self._write = write or self._print
        self.last_line = -math.inf
        self.last_update = clock()
        self.warned: set[tuple[str, int]] = set()

    def update(self, rows: list[dict[str, Any]], labels: list[str], warnings: list[str | None]) -> None:
        """One update's rows (one per member, labelled), after evaluation; ``warnings[i]`` is a warning of member
        i at this update (None: none)."""
        now = self.clock()
        seconds, self.last_update = now - self.last_update, now
        for label, row, warning in zip(labels, rows, warnings, strict=True):
            if warning:
                self._write(f"{label}warning: update {int(row['update'])}: {warning}")
        if self.mode == "bar":
            self.bar.update(1)
            self.bar.set_postfix_str(self._postfix(rows[0]), refresh=False)
            self.bar.set_description_str(f"update {int(rows[0]['update'])}", refresh=True)
        elif self.mode == "lines":
            last = int(rows[0]["update"]) == self.total - 1
            if last or now - self.last_line >= LINE_SECONDS:
                self.last_line = now
                for label, row in zip(labels, rows, strict=True):
                    self._write(label + progress_line(row, self.total, seconds))
        if self.mode:
            for label, row in zip(labels, rows, strict=True):
                if evaluated(row):
                    self._write(label + eval_line(row))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def _postfix(self, row: dict[str, Any]) -> str:
        row = live_values(row)
        return " ".join(f"{short}={_number(row[key])}" for key, short in LIVE_COLUMNS[:-1] if _shown(row.get(key)))

    def _print(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)


def update_warnings(rows: list[dict[str, Any]], collapsed_at: list[int],
                    alarms: list[tuple[int, str] | None] | None = None) -> list[str | None]:
    """Each member's warning at its row's update: a non-finite loss or gradient norm, the collapse its detector
    flagged at this update, or the collapse warning (``alarms``: each member's latest (update, reason)) raised
    at this update."""
    out: list[str | None] = []
    for row, collapse, alarm in zip(rows, collapsed_at, alarms or [None] * len(rows), strict=True):
        if not (math.isfinite(row["loss"]) and math.isfinite(row["grad_norm"])):
            out.append(f"non-finite step (loss {row['loss']}, grad_norm {row['grad_norm']}); the run stops")
        elif collapse == int(row["update"]):
            out.append("collapse detected (events.jsonl has the reason)")
        elif alarm is not None and alarm[0] == int(row["update"]):
            out.append(f"collapse warning: {alarm[1]}")
        else:
            out.append(None)
    return out


def live_values(row: dict[str, Any]) -> dict[str, Any]:
    """A metrics row with ``reward``, the one reward the summary and ``analyze`` report: the current policy's
    (``reward_current``) where this update has it, else the consumed batch's (``reward_mean``)."""
    current = row.get("reward_current")
    return {**row, "reward": current if _shown(current) else row.get("reward_mean")}


def _shown(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _number(value: Any) -> str:
    """A readable number: 4 significant digits (``0.0001999800026662447`` → ``0.0002``, ``1e-05``), ints as is."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return str(value)
    return f"{value:.4g}"


def readable(value: Any) -> str:
    """A parameter value as ``offpolicylab list`` prints it: none, numbers with at most 4 significant digits, lists
    comma-separated."""
    if value is None:
        return "none"
    if isinstance(value, (list, tuple)):
        return ",".join(readable(v) for v in value)
    return _number(value)


class SweepProgress:
    """A sweep's progress on stderr.  Off a terminal, lines: ``sweep: 3/12 cells done, 2 running, 1 failed``
    whenever a cell finishes (at most every :data:`LINE_SECONDS` seconds, and always for the last); on a terminal a
    tqdm bar.  Given the cells' run directories and update counts (``run_dirs``, ``updates``), it also watches the
    updates done from the first second: a line at once (cells, updates in all), then, from a background thread,
    ``sweep: 840/2100 updates (40%), 2/6 cells done, 1m10s elapsed, ETA 1m45s`` (every :data:`LINE_SECONDS` at
    first, less often as the sweep goes on: every tenth of the time elapsed, at most every minute); the bar then
    counts updates and shows tqdm's own ETA.  The ETA extrapolates the rate of updates since the first one this
    sweep saw (cells already done before are not counted)."""

    def __init__(self, total: int, mode: bool | str | None, *, write: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, run_dirs: Sequence[str | Path] | None = None,
                 updates: Sequence[int] | None = None, poll: float = LINE_SECONDS) -> None:
        self.total, self.clock, self.mode = total, clock, ("bar" if mode is True else (mode or None))
        self.done = self.failed = 0
        self.last = -math.inf
        self._write = write or (lambda text: print(text, file=sys.stderr, flush=True))
        self.bar: Any = None
        self.run_dirs = [Path(d) for d in run_dirs or ()]
        self.updates = list(updates or ())
        self.watching = bool(self.run_dirs) and len(self.updates) == len(self.run_dirs)
        self.start = clock()
        self.baseline = self.updates_done() if self.watching else 0
        self.first: tuple[float, int] | None = None  # (time, updates done) when this sweep's first update was seen
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if self.mode == "bar":
            from tqdm.auto import tqdm

            if self.watching:
                self.bar = tqdm(total=sum(self.updates), initial=self.baseline, unit="update", dynamic_ncols=True)
            else:
                self.bar = tqdm(total=total, unit="cell", dynamic_ncols=True)
        elif self.mode == "lines" and self.watching:
            self._write(f"sweep: {total} cells, {sum(self.updates)} updates in all"
                        + (f" ({self.baseline} done before)" if self.baseline else "")
                        + "; progress with an ETA follows every few seconds")
        if self.mode is not None and self.watching and poll > 0:
            self._thread = threading.Thread(target=self._watch, args=(poll,), name="sweep-progress", daemon=True)
            self._thread.start()

    # ------------------------------------------------------------------------------------------ updates done
    def updates_done(self) -> int:
        """Updates written so far: the rows of each cell's metrics.csv (at most its update count)."""
        return sum(min(_rows(path / "metrics.csv"), n) for path, n in zip(self.run_dirs, self.updates, strict=True))

    def eta(self, done: int, now: float) -> float | None:
        """Seconds left: at the rate since the first look that saw updates (start-up — imports, π₀ — is then not
        extrapolated), or at that first look, the rate since the sweep started; None before any update."""
        if self.first is None and done > self.baseline:
            self.first = (now, done)
        if self.first is None:
            return None
        since, count = self.first if now > self.first[0] and done > self.first[1] else (self.start, self.baseline)
        if now <= since or done <= count:
            return None
        return (sum(self.updates) - done) / ((done - count) / (now - since))

    def status(self, now: float | None = None) -> str:
        """The progress line: updates done, cells done, elapsed time and ETA."""
        now = self.clock() if now is None else now
        done, total = self.updates_done(), sum(self.updates)
        eta = self.eta(done, now)
        return (f"sweep: {done}/{total} updates ({100 * done / max(total, 1):.0f}%), {self.done}/{self.total} cells "
                f"done, {duration(now - self.start)} elapsed, "
                + ("ETA " + duration(eta) if eta is not None else "ETA once the first updates are done"))

    def _watch(self, poll: float) -> None:
        wait = poll
        while not self._stop.wait(wait):
            if self.done >= self.total:  # the last cell's line has been written: nothing more to say
                return
            now = self.clock()
            if self.bar is not None:
                self.bar.n = self.updates_done()
                self.bar.refresh()
            else:
                self._write(self.status(now))
                self.last = now
            wait = min(60.0, max(poll, (now - self.start) / 10))

    # ------------------------------------------------------------------------------------------ cells done
    def finished(self, results: list[dict[str, Any]], running: int) -> None:
        """Cells finished (their results) and how many are running now."""
        self.done += len(results)
        self.failed += sum(result.get("status") == "failed" for result in results)
        if self.bar is not None:
            if not self.watching:
                self.bar.update(len(results))
            else:
                self.bar.n = self.updates_done()
                self.bar.refresh()
            self.bar.set_postfix_str(f"cells {self.done}/{self.total}, running {running}, failed {self.failed}")
        elif self.mode == "lines":
            now = self.clock()
            if self.done == self.total or now - self.last >= LINE_SECONDS:
                self.last = now
                line = f"sweep: {self.done}/{self.total} cells done, {running} running, {self.failed} failed"
                if self.watching and self.done < self.total:
                    eta = self.eta(self.updates_done(), now)
                    line += f", ETA {duration(eta)}" if eta is not None else ""
                self._write(line)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.bar is not None:
            self.bar.close()


def duration(seconds: float) -> str:
    """``45s``, ``3m05s``, ``1h02m``."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _rows(path: Path) -> int:
    """Data rows of a CSV file (lines after the header); 0 for a file not (yet) there."""
    try:
        with open(path, "rb") as fh:
            return max(0, sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 16), b"")) - 1)
    except OSError:
        return 0


def print_table(rows: list[dict[str, Any]], columns: Sequence[str], headers: dict[str, str] | None = None) -> None:
    """``rows`` as an aligned text table on stdout: the ``columns`` that any row has a value of, floats to 4
    significant digits, as ``run`` and ``analyze`` print them (the end of a sweep or demo); ``headers`` renames
    columns in the header line."""
    shown = [c for c in columns if any(row.get(c) not in ("", None) for row in rows)]
    cells = [[_cell(row.get(c, "")) for c in shown] for row in rows]
    names = [(headers or {}).get(c, c) for c in shown]
    widths = [max(len(n), *(len(r[i]) for r in cells)) for i, n in enumerate(names)]
    print("  ".join(n.ljust(w) for n, w in zip(names, widths, strict=True)))
    for r in cells:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)))


def _cell(value: Any) -> str:
    return "" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)
