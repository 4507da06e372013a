"""Run directories: this module defines their files and writes and reads them through :class:`RunDir`
(docs/design.md, "Run directories"; the trainer and the sweep act on a directory only through it, except a sweep's
``error.txt`` of a failed cell).  :class:`RunDir` writes a run while it trains; :mod:`offpolicylab.run_records`
reads finished runs back for plots, the demo figure, paper figures and experiments.

    config.json                  the resolved TrainConfig
    metrics.csv                  one row per update, ``update`` first, appended and flushed every update;
                                 wall-clock columns are named ``time_*``
    samples/update_XXXXXX.npz    token samples for histograms (log_ratio, advantage, entropy, kept; per sequence
                                 seq_log_ratio and staleness), ``np.load(allow_pickle=False)``-loadable
    samples/completions_XXXXXX.jsonl  a text policy's consumed responses at those updates (:meth:`RunDir
                                 .write_completions`)
    adapter/                     an adapter policy's adapter, replaced whole (:meth:`RunDir.save_adapter`)
    tracking/                    the ``--report-to`` trackers' local files (:mod:`offpolicylab.tracking`)
    events.jsonl                 collapse, non_finite_loss, resume, ...
    checkpoint/state.pt          the latest checkpoint, replaced atomically (temp file, rename): a killed process
                                 leaves the previous or the new checkpoint, never a torn one.  With
                                 ``fsync=True`` metrics.csv and the checkpoint are also fsynced (survives an OS
                                 crash / power loss).  Loaded with
                                 ``torch.load(weights_only=True)`` — never an arbitrary unpickle
    profile.txt, profile.pstats  with ``offpolicylab run --profile``: where the time went (sections, top functions;
                                 :mod:`offpolicylab.profiling`) and the raw cProfile statistics
    summary.json                 at the end: status ∈ completed / collapsed / failed, final and peak metrics
    .lock                        the writer's lock (``fcntl.flock``; the OS drops it when the process ends, even
                                 by SIGKILL): one process writes a run directory at a time

Resume checks that metrics.csv agrees with the checkpoint: the checkpoint records the header and the SHA-256 of
the metrics file up to its update, and the file must hold exactly rows ``0 … next_update − 1`` under that header.
A torn last line (a write cut short by a full disk or a kill) is never counted and is dropped on resume; temp
files left by a process that died mid-write are removed when the next writer takes the lock.

A sweep folder holds ``grid.json`` (the grid file it ran), ``sweep_results.csv`` (one row per cell) and one run
directory per cell; a cell's axis labels are recomputed from ``grid.json``, never parsed from directory names.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import functools
import hashlib
import io
import json
import math
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from offpolicylab.config import upgrade_stored_config

if TYPE_CHECKING:

    from offpolicylab.tracking import Tracker

STATUSES = ("completed", "collapsed", "failed")
MAX_SAMPLE_TOKENS = 4096
SUMMARY_KEYS = ("reward_mean", "reward_current", "exact_return", "eval_reward_greedy", "eval_reward_sampled")
#: The columns that hold "the reward" of a run (docs/metrics.md, "One reward"), in order: the first with a finite
#: value is the one ``final_reward`` / ``peak_reward`` in summary.json, the console and ``analyze`` report.
REWARD_COLUMNS = ("reward_current", "reward_mean")
GRID_FILE = "grid.json"
SWEEP_RESULTS = "sweep_results.csv"
LOCK_NAME = ".lock"
TEMP_MARK = ".tmp-"
# every name a run directory may hold: what :meth:`RunDir.clear` may delete
PROFILE_FILES = ("profile.txt", "profile.pstats")
ADAPTER_DIR = "adapter"  # an adapter policy's adapter, in its library's own format
RUN_ENTRIES = frozenset({"config.json", "metrics.csv", "events.jsonl", "summary.json", "checkpoint", "samples",
                         "error.txt", "tracking", ADAPTER_DIR, LOCK_NAME, *PROFILE_FILES})
SAMPLE_PREFIX = "update_"  # samples/update_XXXXXX.npz
COMPLETIONS_PREFIX = "completions_"  # samples/completions_XXXXXX.jsonl
ENVIRONMENT_KEY = "environment"  # config.json: package versions and git commit (not part of the configuration)
_HELD_LOCKS: dict[Path, list[int]] = {}  # resolved run path -> [lock file descriptor, nesting depth]


class RunError(ValueError):
    """A run directory cannot be used as asked (exists without --resume, corrupt checkpoint, ...)."""


class RunLocked(RunError):
    """Another process holds the run directory's lock."""


def take_lock(fd: int, error: type[Exception], in_use: str, record_pid: bool = True) -> None:
    """Take the exclusive ``fcntl.flock`` of the open file ``fd`` without waiting, and (``record_pid``) write this
    process's pid into it; when another process holds it, raise ``error(in_use + its pid + what to do)``.  The OS
    releases the lock when ``fd`` is closed or the process ends, however it ends."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
        raise error(f"{in_use}{f' (pid {holder})' if holder.isdigit() else ''}; wait for it to end or stop it, "
                    "then try again") from None
    if record_pid:
        with contextlib.suppress(OSError):  # the pid only makes the message above clearer
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)


class RunDir:
    """Reads and writes the files of one run directory."""

    def __init__(self, path: str | Path, fsync: bool = False) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self._columns: list[str] | None = None
        self._metrics_file: io.TextIOWrapper | None = None  # kept open between rows, flushed after each
        self._line = io.StringIO()
        self._line_writer = csv.writer(self._line)  # csv's default dialect, the one csv.DictReader reads
        self._digest = hashlib.sha256()  # of the bytes of metrics.csv written so far (header included)
        self.tracker: Tracker | None = None  # experiment trackers fed with every row, samples file and the summary

    # ---------------------------------------------------------------------------------------- paths
    config_path = property(lambda self: self.path / "config.json")
    metrics_path = property(lambda self: self.path / "metrics.csv")
    events_path = property(lambda self: self.path / "events.jsonl")
    summary_path = property(lambda self: self.path / "summary.json")
    checkpoint_path = property(lambda self: self.path / "checkpoint" / "state.pt")
    samples_dir = property(lambda self: self.path / "samples")
    profile_path = property(lambda self: self.path / PROFILE_FILES[0])
    adapter_path = property(lambda self: self.path / ADAPTER_DIR)

    def holds_run(self) -> bool:
        return self.config_path.exists() or self.metrics_path.exists()

    # ---------------------------------------------------------------------------------------- one writer
    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the directory's writer lock (``fcntl.flock`` on ``.lock``, created with the directory).  The OS
        releases it when the process ends, however it ends; re-entrant within one process.  Another process gets
        :class:`RunLocked` at once.  Taking the lock removes temp files orphaned by a writer that died mid-write."""
        if self.path.exists() and not self.path.is_dir():
            raise RunError(f"{self.path} is a file, not a run directory; valid: a directory path")
        self.path.mkdir(parents=True, exist_ok=True)
        key = self.path.resolve()
        if key in _HELD_LOCKS:
            _HELD_LOCKS[key][1] += 1
            try:
                yield
            finally:
                _HELD_LOCKS[key][1] -= 1
            return
        fd = os.open(self.path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            take_lock(fd, RunLocked, f"run directory {self.path} is in use by another process")
        except RunLocked:
            os.close(fd)
            raise
        _HELD_LOCKS[key] = [fd, 1]
        try:
            self.remove_orphans()
            yield
        finally:
            del _HELD_LOCKS[key]
            os.close(fd)  # releases the lock

    def check_free(self) -> None:
        """Refuse, without creating anything, a path that is a file or a directory another process holds locked
        (what :meth:`locked` would refuse), so that a command over several directories can check all first."""
        if self.path.exists() and not self.path.is_dir():
            raise RunError(f"{self.path} is a file, not a run directory; valid: a directory path")
        lock = self.path / LOCK_NAME
        if self.path.resolve() in _HELD_LOCKS or not lock.is_file():
            return
        fd = os.open(lock, os.O_RDONLY)
        try:
            take_lock(fd, RunLocked, f"run directory {self.path} is in use by another process", record_pid=False)
        finally:
            os.close(fd)  # releases the trial lock

    def remove_orphans(self) -> list[Path]:
        """Delete temp files (``.NAME.tmp-PID``) that a process killed mid-write left behind; call with the lock."""
        removed = []
        for folder in (self.path, self.checkpoint_path.parent, self.samples_dir):
            if folder.is_dir():
                for entry in folder.glob(f".*{TEMP_MARK}*"):
                    entry.unlink(missing_ok=True)
                    removed.append(entry)
        return removed

    def clear(self) -> None:
        """Delete this run (to start it again).  Deletes only the names a run writes (:data:`RUN_ENTRIES` and
        their temp files): a directory holding anything else raises :class:`RunError` and nothing is deleted."""
        if self.path.is_symlink() or not self.path.is_dir():
            raise RunError(f"{self.path} is not a run directory; refusing to delete it")
        foreign = sorted(p.name for p in self.path.iterdir()
                         if p.name not in RUN_ENTRIES and TEMP_MARK not in p.name)
        if foreign:
            raise RunError(f"{self.path} holds files a run does not write ({', '.join(foreign[:3])}); "
                           "move them away or choose another --out; nothing was deleted")
        for entry in self.path.iterdir():
            if entry.name == LOCK_NAME:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        self._columns = None
        self._digest = hashlib.sha256()

    # ---------------------------------------------------------------------------------------- lifecycle
    def create(self, config: dict[str, Any]) -> None:
        """Start a fresh run; refuses a directory that already holds one.  config.json holds ``config`` and, under
        ``"environment"``, the package versions and git commit of this process (:func:`environment`)."""
        if self.holds_run():
            raise RunError(f"run directory {self.path} already holds a run; pass --resume to continue it "
                           "or choose another --out")
        self.path.mkdir(parents=True, exist_ok=True)
        self.write_config(config, environment())

    def write_config(self, config: dict[str, Any], environment: dict[str, Any]) -> None:
        """Replace config.json (atomically) by ``config`` with ``environment`` under ``"environment"``."""
        write_text_atomically(self.config_path, json.dumps({**config, ENVIRONMENT_KEY: environment}, indent=2) + "\n")

    def read_config(self) -> dict[str, Any]:
        """The run's configuration as config.json holds it, without the environment record, in today's terms
        (:func:`~offpolicylab.config.upgrade_stored_config`: a run written before a world parameter's default
        changed gets the value it ran with)."""
        config = self._read_config_file()
        config.pop(ENVIRONMENT_KEY, None)
        return upgrade_stored_config(config)

    def read_environment(self) -> dict[str, Any]:
        """config.json's environment record (package versions, git commit); empty for runs written before it."""
        return dict(self._read_config_file().get(ENVIRONMENT_KEY, {}))

    def _read_config_file(self) -> dict[str, Any]:
        if not self.config_path.exists():
            raise RunError(f"{self.path} holds no run to resume (no config.json)")
        data = read_json(self.config_path, "config.json")
        if not isinstance(data, dict):
            raise RunError(f"{self.config_path} holds a JSON {type(data).__name__}; the config file is damaged "
                           "(valid: the JSON object a run writes)")
        return data

    def read_summary(self) -> dict[str, Any] | None:
        """summary.json, or None while the run has none — and when it is damaged (unreadable, not a JSON object):
        such a run counts as unfinished, so a sweep or a resume continues it instead of trusting the file."""
        try:
            summary = read_json(self.summary_path, "summary.json")
        except (RunError, OSError):
            return None
        return upgrade_summary(summary) if isinstance(summary, dict) else None

    # ---------------------------------------------------------------------------------------- metrics
    def append_metrics(self, row: dict[str, Any]) -> None:
        """Append one row (the header is fixed by the first row written; missing columns are left empty, extra
        keys ignored) with a single write, flushed at once (a killed process loses no finished row)."""
        if self._metrics_file is None:
            self._open_metrics(row)
        assert self._metrics_file is not None and self._columns is not None
        self._write_metrics(self._csv_line([_format(row.get(key)) for key in self._columns]))
        if self.tracker is not None:
            self.tracker.row(row)

    def close(self) -> None:
        """Close the metrics file kept open by :meth:`append_metrics` (it reopens on the next row)."""
        if self._metrics_file is not None:
            self._metrics_file.close()
            self._metrics_file = None

    def _open_metrics(self, row: dict[str, Any]) -> None:
        new_file = not self.metrics_path.exists() or self.metrics_path.stat().st_size == 0
        if self._columns is None:
            self._columns = list(row) if new_file else self._read_header()
        self._metrics_file = open(self.metrics_path, "a", newline="", encoding="utf-8")  # noqa: SIM115 - close()
        if new_file:
            self._digest = hashlib.sha256()
            self._write_metrics(self._csv_line(self._columns))

    def _write_metrics(self, line: str) -> None:
        assert self._metrics_file is not None
        self._digest.update(line.encode("utf-8"))
        self._metrics_file.write(line)
        self._metrics_file.flush()

    def _csv_line(self, values: list[str]) -> str:
        self._line.seek(0)
        self._line.truncate()
        self._line_writer.writerow(values)
        return self._line.getvalue()

    def truncate_metrics(self, next_update: int, checkpoint: dict[str, Any] | None = None) -> None:
        """Keep the header and rows ``0 … next_update − 1`` (rows written after the checkpoint are redone, a torn
        last line is dropped).  Raises :class:`RunError` (naming the file and line) unless the kept rows are
        exactly those updates and, when ``checkpoint`` recorded them, carry its header and SHA-256
        (:meth:`check_metrics`)."""
        self.close()
        kept = self.check_metrics(next_update, checkpoint)
        if kept is None:
            self._columns, self._digest = None, hashlib.sha256()
            return
        text, columns, digest = kept
        write_text_atomically(self.metrics_path, text)
        self._columns, self._digest = columns, digest

    def check_metrics(self, next_update: int, checkpoint: dict[str, Any] | None = None
                      ) -> tuple[str, list[str], Any] | None:
        """What :meth:`truncate_metrics` keeps — (text, header, SHA-256 object of the text), or None for a missing
        or empty file at update 0 — checked as it checks, without writing anything (a batched resume checks every
        seed before it touches any)."""
        lines = self._complete_lines()
        if not lines:
            if next_update > 0:
                raise RunError(f"{self.metrics_path} is missing or empty but the checkpoint is at update "
                               f"{next_update}; the run cannot be resumed consistently (start it again)")
            return None
        kept = [lines[0]]
        for number, line in enumerate(lines[1:next_update + 1], 2):
            first = line.split(",", 1)[0]
            if first != str(number - 2):
                raise RunError(f"{self.metrics_path}:{number}: expected the row of update {number - 2}, found "
                               f"{first[:20]!r}; the metrics file does not match the checkpoint (update "
                               f"{next_update}), so the run cannot be resumed consistently")
            kept.append(line)
        if len(kept) - 1 != next_update:
            raise RunError(f"{self.metrics_path} holds {len(kept) - 1} rows before update {next_update} but the "
                           "checkpoint needs all of them; the run cannot be resumed consistently")
        text = "".join(kept)
        columns = next(csv.reader([lines[0]]))
        checkpoint = checkpoint or {}
        if "metrics_columns" in checkpoint and list(checkpoint["metrics_columns"]) != columns:
            raise RunError(f"{self.metrics_path}:1: the header differs from the one the checkpoint recorded; "
                           "the run cannot be resumed consistently")
        digest = hashlib.sha256(text.encode("utf-8"))
        if "metrics_digest" in checkpoint and checkpoint["metrics_digest"] != digest.hexdigest():
            raise RunError(f"{self.metrics_path}: rows 0..{next_update - 1} differ from what the checkpoint "
                           "recorded (edited, or the checkpoint's update counter was changed); the run cannot be "
                           "resumed consistently")
        return text, columns, digest

    def _complete_lines(self) -> list[str]:
        """The lines of metrics.csv that end in a newline (a torn last line is not a row)."""
        if not self.metrics_path.exists():
            return []
        lines = self.metrics_path.read_bytes().decode("utf-8", errors="replace").splitlines(keepends=True)
        return [line for line in lines if line.endswith("\n")]

    def read_metrics(self) -> list[dict[str, str]]:
        """The complete rows of metrics.csv (a torn last line is left out), checked by :func:`read_table`; none
        while the file is missing or holds no complete line (a run that failed before its first update)."""
        if not self._complete_lines():
            return []
        header, rows = read_table(self.metrics_path)
        return [dict(zip(header, row, strict=True)) for row in rows]

    def _read_header(self) -> list[str]:
        with open(self.metrics_path, newline="") as fh:
            return next(csv.reader(fh))

    # ---------------------------------------------------------------------------------------- events, samples
    def event(self, kind: str, update: int, **details: Any) -> None:
        record = {"event": kind, "update": update, "time": time.time(), **details}
        with open(self.events_path, "a") as fh:
            fh.write(json.dumps(record, default=_json_default) + "\n")
            fh.flush()

    def read_events(self) -> list[dict[str, Any]]:
        """The records of events.jsonl, one JSON object per line; a damaged line raises :class:`RunError` naming
        the file and line."""
        if not self.events_path.exists():
            return []
        try:
            lines = self.events_path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise RunError(f"{self.events_path} cannot be read ({error_reason(exc)}); the events file is damaged") from None
        events = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                record = None
            if not isinstance(record, dict):
                raise RunError(f"{self.events_path}:{number}: not a JSON object; the events file is damaged "
                               "(valid: one JSON object per line)")
            events.append(record)
        return events

    def write_samples(self, update: int, arrays: dict[str, np.ndarray]) -> Path:
        self.samples_dir.mkdir(exist_ok=True)
        path = self.samples_dir / f"{SAMPLE_PREFIX}{update:06d}.npz"
        buffer = io.BytesIO()
        np.savez_compressed(buffer, **arrays)
        _atomic_write_bytes(path, buffer.getvalue(), self.fsync)
        if self.tracker is not None:
            self.tracker.samples(arrays, update, path)
        return path

    def write_completions(self, update: int, records: list[dict[str, Any]]) -> Path:
        """``samples/completions_<update>.jsonl``: one JSON object per line (written whole, then renamed into
        place)."""
        self.samples_dir.mkdir(exist_ok=True)
        path = self.samples_dir / f"{COMPLETIONS_PREFIX}{update:06d}.jsonl"
        staging = path.with_name(path.name + ".partial")
        staging.write_text("".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records),
                           encoding="utf-8")
        staging.replace(path)
        return path

    def adapter_paths(self) -> tuple[Path, Path, Path]:
        """(staging, old, final): where :meth:`save_adapter` writes the adapter, parks the previous one, and keeps
        it."""
        folder = self.checkpoint_path.parent
        return folder / "adapter.staging", folder / "adapter.old", self.adapter_path

    def check_adapter(self) -> None:
        """Before a resume trains: ``RUN/adapter`` and the staging folders in ``checkpoint/`` are folders the run
        writes, or absent.  Anything else there (a file put in place of the adapter folder) is refused naming it —
        training would otherwise run every update and fail when the adapter is saved — and left as it is."""
        for path in self.adapter_paths():
            if (path.exists() or path.is_symlink()) and (path.is_symlink() or not path.is_dir()):
                raise RunError(f"{path} is not a folder (a file or a link where the run keeps its LoRA adapter); the "
                               f"run cannot save its adapter there; valid: move it away (the run writes {path.name}/ "
                               "again from its checkpoint) and resume")

    def save_adapter(self, save: Callable[[Path], Any]) -> None:
        """``adapter/``: the adapter ``save(folder)`` writes (a policy's ``save_adapter``, its library's own format),
        replaced whole (staged and swapped inside ``checkpoint/``)."""
        staging, old, final = self.adapter_paths()
        self.check_adapter()  # a fresh run's folder was checked by create, a resume's by checked_resume
        for leftover in (staging, old):
            shutil.rmtree(leftover, ignore_errors=True)
        staging.parent.mkdir(exist_ok=True)
        save(staging)
        if final.exists():
            final.rename(old)
        staging.rename(final)
        shutil.rmtree(old, ignore_errors=True)

    def write_profile(self, report: str, stats: bytes) -> None:
        """profile.txt (``report``) and profile.pstats (``stats``, cProfile's marshal format), each atomically."""
        _atomic_write_bytes(self.profile_path, report.encode(), self.fsync)
        _atomic_write_bytes(self.path / PROFILE_FILES[1], stats, self.fsync)

    # ---------------------------------------------------------------------------------------- checkpoint
    def save_checkpoint(self, state: dict[str, Any]) -> None:
        """Write ``state`` (tensors, dicts, lists, numbers, strings only) atomically to checkpoint/state.pt."""
        self.checkpoint_path.parent.mkdir(exist_ok=True)
        if self.fsync and self.metrics_path.exists():  # rows up to the checkpoint must be on disk first
            with open(self.metrics_path, "rb+") as fh:
                os.fsync(fh.fileno())
        if self._columns is not None:  # what resume checks metrics.csv against
            state = {**state, "metrics_columns": list(self._columns), "metrics_digest": self._digest.hexdigest()}
        buffer = io.BytesIO()
        torch.save(state, buffer)
        _atomic_write_bytes(self.checkpoint_path, buffer.getvalue(), self.fsync)

    def load_checkpoint(self) -> dict[str, Any]:
        """The latest checkpoint; a missing or corrupt one raises :class:`RunError`."""
        if not self.checkpoint_path.exists():
            raise RunError(f"{self.path} has no checkpoint to resume from ({self.checkpoint_path} is missing)")
        try:
            state = torch.load(self.checkpoint_path, weights_only=True, map_location="cpu")
        except Exception as exc:  # noqa: BLE001 - any failure to read is a corrupt checkpoint
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise RunError(f"corrupt checkpoint {self.checkpoint_path} ({first[:120]}); "
                           "delete the run directory or restore the checkpoint") from None
        if not isinstance(state, dict) or "next_update" not in state:
            raise RunError(f"corrupt checkpoint {self.checkpoint_path} (no update counter)")
        return state

    # ---------------------------------------------------------------------------------------- summary
    def write_summary(self, status: str, **extra: Any) -> dict[str, Any]:
        """summary.json with ``status``, the number of updates and final / peak values of the main metrics."""
        if status not in STATUSES:
            raise ValueError(f"status {status!r} is invalid; valid: {', '.join(STATUSES)}")
        rows, path = self.read_metrics(), self.metrics_path
        summary: dict[str, Any] = {"status": status, "updates_done": len(rows)}
        for key in SUMMARY_KEYS:
            values = [(int(metric_number(path, line, r, "update")), metric_number(path, line, r, key))
                      for line, r in enumerate(rows, 2) if r.get(key, "") not in ("", None)]
            finite = [(u, v) for u, v in values if math.isfinite(v)]
            if finite:
                summary[f"final_{key}"] = finite[-1][1]
                peak_update, peak_value = max(finite, key=lambda uv: uv[1])
                summary[f"peak_{key}"] = peak_value
                summary[f"peak_{key}_update"] = peak_update
        reward = next((key for key in REWARD_COLUMNS if f"final_{key}" in summary), None)
        if reward is not None:  # the one reward (docs/metrics.md): what the detector and analyze watch
            summary.update(reward_column=reward, final_reward=summary[f"final_{reward}"],
                           peak_reward=summary[f"peak_{reward}"], peak_reward_update=summary[f"peak_{reward}_update"])
        summary.update(extra)
        if summary.get("collapse_update", None) == -1:  # no collapse: null, as in analyze's collapse_step
            summary["collapse_update"] = None
        write_text_atomically(self.summary_path, json.dumps(summary, indent=2, default=_json_default) + "\n")
        if self.tracker is not None:  # the summary ends the run: the trackers get it and are closed
            tracker, self.tracker = self.tracker, None
            tracker.close(summary)
        return summary


def read_table(path: Path, needed: tuple[str, ...] = ("update",)) -> tuple[list[str], list[list[str]]]:
    """The header and complete rows of a metrics.csv (a torn last line — a write cut short — is left out), checked
    before any row is read as numbers: UTF-8, a header of distinct non-empty names holding ``needed``, and every row
    as wide as the header (a row wider or narrower than its header would put each value under another column's
    name).  Anything else raises :class:`RunError` naming the file and line.  The one reader of metrics.csv
    (``analyze``, ``plot``, resume, the summary)."""
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise RunError(f"{path} does not exist; valid: a run directory offpolicylab wrote") from None
    except UnicodeDecodeError as exc:
        raise RunError(f"{path} is not UTF-8 text ({error_reason(exc)}); the metrics file is damaged") from None
    complete = text[:text.rfind("\n") + 1]
    try:
        table = list(csv.reader(io.StringIO(complete)))
    except csv.Error as exc:
        raise RunError(f"{path} is not a CSV table ({error_reason(exc)}); the metrics file is damaged") from None
    if not table or not any(table[0]):
        raise RunError(f"{path} is empty; the metrics file is damaged (valid: a header and one row per update)")
    header = table[0]
    blank = [i + 1 for i, name in enumerate(header) if not name.strip()]
    twice = sorted({name for name in header if header.count(name) > 1})
    if blank or twice:
        what = f"column {blank[0]} has no name" if blank else f"names {', '.join(twice)} twice"
        raise RunError(f"{path}:1: the header {what}; the metrics file is damaged (valid: a header of distinct "
                       "column names, update first)")
    missing = [name for name in needed if name not in header]
    if missing:
        raise RunError(f"{path} has no {', '.join(repr(n) for n in missing)} column; columns are {header[:8]}; the "
                       "metrics file is damaged")
    rows = []
    for line, row in enumerate(table[1:], 2):
        if not row:
            continue
        if len(row) != len(header):
            raise RunError(f"{path}:{line}: {len(row)} values but the header names {len(header)} columns, so they "
                           "would be read under other columns' names; the metrics file is damaged (valid: a header "
                           "and one row per update, each as wide as the header)")
        rows.append(row)
    return header, rows



# -------------------------------------------------------------------------------------------- sweep folders
def write_grid(sweep_dir: str | Path, grid: dict[str, Any]) -> None:
    """The grid file of a sweep (its cells' labels are read back from it); a different grid already there is kept
    as ``grid.previous-N.json``."""
    out = Path(sweep_dir)
    out.mkdir(parents=True, exist_ok=True)
    path, text = out / GRID_FILE, json.dumps(grid, indent=2) + "\n"
    if path.exists() and path.read_text() != text:
        number = 1
        while (out / f"grid.previous-{number}.json").exists():
            number += 1
        os.replace(path, out / f"grid.previous-{number}.json")
    write_text_atomically(path, text)


def write_sweep_results(sweep_dir: str | Path, rows: list[dict[str, Any]]) -> Path:
    """``sweep_results.csv``: one row per cell (columns in order of first appearance)."""
    path = Path(sweep_dir) / SWEEP_RESULTS
    columns = list(dict.fromkeys(key for row in rows for key in row))
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, restval="")
    writer.writeheader()
    writer.writerows(rows)
    write_text_atomically(path, out.getvalue())
    return path


# -------------------------------------------------------------------------------------------- helpers
def _format(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return str(value)


def read_json(path: Path, what: str) -> Any:
    """The JSON value in ``path``; ``RunError`` naming the file for a damaged one (``OSError`` when it is missing or
    cannot be opened)."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise RunError(f"{path} is not UTF-8 text ({error_reason(exc)}); the {what} file is damaged") from None
    except IsADirectoryError:
        raise RunError(f"{path} is a folder; valid: the {what} file a run writes") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise RunError(f"{path} is not valid JSON ({exc.msg})") from None
    except RecursionError:
        raise RunError(f"{path} is not valid JSON (nested too deeply)") from None


def error_reason(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def upgrade_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """A summary.json of an earlier version in today's vocabulary (docs/metrics.md): ``final_reward`` /
    ``peak_reward`` / ``peak_reward_update`` from the first of :data:`REWARD_COLUMNS` it holds, and
    ``collapse_update`` null instead of -1 when nothing collapsed.  A current summary comes back unchanged."""
    out = dict(summary)
    if "final_reward" not in out:
        reward = next((key for key in REWARD_COLUMNS if f"final_{key}" in out), None)
        if reward is not None:
            out.update(reward_column=reward, final_reward=out[f"final_{reward}"],
                       peak_reward=out.get(f"peak_{reward}"), peak_reward_update=out.get(f"peak_{reward}_update"))
    if out.get("collapse_update") == -1:
        out["collapse_update"] = None
    return out


def metric_number(path: Path, line: int, row: dict[str, str], key: str) -> float:
    """``row[key]`` of line ``line`` of the metrics file ``path`` as a float; ``RunError`` naming them if it is not."""
    try:
        return float(row[key])
    except (TypeError, ValueError):
        raise RunError(f"{path}:{line}: {key}={row[key]!r} is not a number; the metrics file is damaged") from None


def _json_default(value: Any) -> Any:
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, torch.Tensor):
        return value.tolist()
    return str(value)


def _atomic_write_bytes(path: Path, data: bytes, fsync: bool = True) -> None:
    """Write to a temp file in the same directory, (fsync,) then rename over ``path`` (atomic on POSIX)."""
    tmp = path.with_name(f".{path.name}{TEMP_MARK}{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            if fsync:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk, a file-size limit, an interrupt: leave no orphan temp file
        tmp.unlink(missing_ok=True)
        raise
    if not fsync:
        return
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_text_atomically(path: Path, text: str) -> None:
    """Replace ``path`` by ``text`` atomically (temp file, fsync, rename): readers see the old or the new text."""
    _atomic_write_bytes(path, text.encode())


def write_json(path: Path, data: Any) -> None:
    """``data`` as indented JSON at ``path`` (its folder created), replaced atomically: the result files the
    experiment scripts write with ``--json``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(path, json.dumps(data, indent=1) + "\n")


# -------------------------------------------------------------------------------------------- environment record
#: Packages whose versions config.json records (those installed).
ENVIRONMENT_PACKAGES = ("offpolicylab", "torch", "numpy", "scipy", "gymnasium", "transformers", "peft",
                        "bitsandbytes", "tensorboard", "wandb", "mlflow-skinny", "mlflow", "trackio")


def environment() -> dict[str, Any]:
    """The Python version, the installed versions of :data:`ENVIRONMENT_PACKAGES` and — when the package runs from
    a git checkout — the commit and whether the checkout has uncommitted changes (``git`` on this machine only),
    found once per process (a sweep creates many run directories; reading 13 packages' metadata and running git
    costs about as much as a short toy run)."""
    return dict(_environment())


@functools.cache
def _environment() -> dict[str, Any]:
    import platform
    from importlib import metadata

    record: dict[str, Any] = {"python": platform.python_version()}
    for name in ENVIRONMENT_PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            record[name] = metadata.version(name)
    record.update(git_commit(Path(__file__).resolve().parent))
    return record


def git_commit(folder: Path) -> dict[str, Any]:
    """``{"git_commit": sha, "git_dirty": bool}`` of the git checkout holding ``folder``, or ``{}``."""
    import subprocess

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=10,
                                  check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return {}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"git_commit": commit, **({} if status is None else {"git_dirty": bool(status)})}
