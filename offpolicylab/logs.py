"""Training logs of other RL engines, read as one table of our metric names (docs/diagnosing.md, "Metric names").

Four formats, told apart by their content (never by a file name alone):

- ``verl``: verl's ``FileLogger`` JSON lines (``trainer.logger=['console','file']``), one ``{"step": N, "data":
  {name: value}}`` per line; ``step`` is verl's training step (one rollout batch, possibly several optimizer steps).
- ``trl``: the ``trainer_state.json`` of a Hugging Face / TRL trainer (an output or checkpoint directory, or the
  file), whose ``log_history`` holds one record per logged optimizer step.
- ``tensorboard``: a folder of ``events.out.tfevents.*`` files of one run (verl's ``tensorboard`` logger, TRL's
  ``report_to="tensorboard"``, whose tags carry a ``train/`` prefix and ``eval/`` for evaluations, or our own
  ``--report-to tensorboard``, whose tags are read back as the run's metrics.csv columns), read with TensorBoard's
  own ``EventAccumulator``.
- ``offpolicylab``: one of our run directories (``metrics.csv``, read by :mod:`offpolicylab.run_records`).

:data:`METRIC_NAMES` is the one mapping from their names to ours; :func:`canonical` applies it.  Values that are
not finite numbers (``null`` in JSON, NaN, inf) are kept as NaN and counted: the reader of a log decides what a
missing value means.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

FORMATS = ("verl", "trl", "tensorboard", "offpolicylab")
VALID_LOGS = ("a verl FileLogger .jsonl file, a TRL trainer_state.json (or its output / checkpoint directory), "
              "a TensorBoard event folder, or an offpolicylab run directory")
TRL_STATE = "trainer_state.json"
EVENT_PREFIX = "events.out.tfevents."
TENSORBOARD_SPLIT = "train/"  # transformers' TensorBoard callback prefixes training logs with train/ (eval/: eval)


@dataclass(frozen=True)
class MetricName:
    """One of our metric names and the names verl, TRL and our run directories log it under, in order of
    preference (the first one a log holds is used)."""

    ours: str
    verl: tuple[str, ...]
    trl: tuple[str, ...]
    run: tuple[str, ...]
    meaning: str


#: The mapping of their metric names to ours (docs/diagnosing.md shows this table).  A metric our plug-ins log
#: (``actor/offpolicylab/<name>`` in verl, ``offpolicylab/<name>`` in TRL) is always preferred under its own name.
METRIC_NAMES: tuple[MetricName, ...] = (
    MetricName("reward_mean", ("critic/score/mean",), ("reward",), ("reward_current", "reward_mean"),
               "mean sequence reward of the step's batch (ours: of the current policy's responses where recorded)"),
    MetricName("clip_frac", ("actor/pg_clipfrac",), ("clip_ratio/region_mean",), ("clip_frac",),
               "share of response tokens whose ratio the clip cut from the gradient"),
    MetricName("clip_frac_low", (), ("clip_ratio/low_mean",), (),
               "share of tokens clipped at 1 − ε (A < 0)"),
    MetricName("clip_frac_high", (), ("clip_ratio/high_mean",), (),
               "share of tokens clipped at 1 + ε (A > 0)"),
    MetricName("dual_clip_frac", ("actor/pg_clipfrac_lower",), (), (),
               "share of tokens cut by the dual clip (A < 0, r > c)"),
    MetricName("mask_frac", (), (), ("mask_frac",),
               "share of response tokens the objective removed from the gradient (clip or mask)"),
    MetricName("kl_k1", ("actor/ppo_kl",), (), ("kl_k1",),
               "k1 estimate of KL(π_behaviour ‖ π_θ) per token, mean(−log r)"),
    MetricName("kl_k3", (), (), ("kl_k3",),
               "k3 estimate of KL(π_behaviour ‖ π_θ) per token, mean(r − 1 − log r)"),
    MetricName("kl_ref", ("actor/kl_loss",), ("kl",), ("kl_ref", "eval_kl_init_k3"),
               "KL(π_θ ‖ π_ref) per token (TRL: k3; verl: its kl_loss_type; ours: the KL penalty's estimate to π₀, "
               "else the evaluation's k3 to π₀)"),
    MetricName("entropy", ("actor/entropy",), ("entropy",), ("entropy",),
               "mean token entropy of π_θ on the responses (nat)"),
    MetricName("loss", ("actor/pg_loss",), ("loss",), ("loss",), "the policy loss of the step"),
    MetricName("grad_norm", ("actor/grad_norm",), ("grad_norm",), ("grad_norm",),
               "gradient norm before clipping"),
    MetricName("ratio_max", (), (), ("ratio_max",), "largest token ratio r = π_θ / π_behaviour of the batch"),
    MetricName("ratio_p999", (), (), ("ratio_p999",), "99.9th percentile of the token ratios"),
    MetricName("ratio_mean", (), (), ("ratio_mean",), "mean token ratio"),
    MetricName("log_ratio_abs_mean", (), (), ("log_ratio_abs_mean",), "mean |log r| per token"),
    MetricName("m2", (), (), ("m2",), "M₂ = mean (log r)², M2PO's second moment"),
    MetricName("ess", (), (), ("ess",), "effective sample size (Σr)² / (n Σr²) of the token ratios"),
    MetricName("sampler_kl_k1", ("rollout_corr/kl", "mismatch/mismatch_kl"), (), (),
               "k1 KL(π_sampler ‖ π_trainer) per token: the sampler / trainer numeric mismatch"),
    MetricName("sampler_kl_k3", ("rollout_corr/k3_kl", "mismatch/mismatch_k3_kl"), (), (),
               "k3 KL(π_sampler ‖ π_trainer) per token"),
    MetricName("sampler_log_ratio_abs_mean", (), ("sampling/sampling_logp_difference/mean",), (),
               "mean |log π_trainer − log π_sampler| per token"),
    MetricName("sampler_log_ratio_abs_max", (), ("sampling/sampling_logp_difference/max",), (),
               "largest |log π_trainer − log π_sampler|"),
    MetricName("sampler_ratio_mean", ("rollout_corr/rollout_is_mean", "mismatch/rollout_is_mean"),
               ("sampling/importance_sampling_ratio/mean",), (), "mean π_trainer / π_sampler"),
    MetricName("sampler_ratio_max", ("rollout_corr/rollout_is_max", "mismatch/rollout_is_max"),
               ("sampling/importance_sampling_ratio/max",), (), "largest π_trainer / π_sampler"),
    MetricName("sampler_ess", ("rollout_corr/rollout_is_eff_sample_size", "mismatch/rollout_is_eff_sample_size"),
               (), (), "effective sample size of the sampler / trainer weights"),
    MetricName("sampler_chi2", ("rollout_corr/chi2_token",), (), (), "token χ² = E[ρ²] − 1 of π_trainer / π_sampler"),
    MetricName("response_len", ("response_length/mean",), ("completions/mean_length",), ("response_len",),
               "mean response length (tokens)"),
    MetricName("staleness_mean", (), (), ("staleness_mean",), "mean policy versions between generation and use"),
    MetricName("eval_reward", ("val-core/<data source>/reward/mean@<n>",), ("eval_reward",),
               ("eval_reward_sampled",), "mean reward on the evaluation prompts (verl: its validation, the first "
               "data source; TRL: its evaluation loop)"),
)
PLUGIN_PREFIXES = {"verl": "actor/offpolicylab/", "trl": "offpolicylab/"}


#: A logged value beyond ±LIMIT counts as not finite (an overflow): the detector's running sums and the figures'
#: axes stay finite (±1e308 rewards gave numpy overflow warnings and "arange: cannot compute length").
VALUE_LIMIT = 1e150
#: Integers of more digits than this are read as floats (``int("9" * 400)`` cannot become a float).
MAX_INT_DIGITS = 18


def load_json(text: str, where: str) -> Any:
    """``json.loads`` with bounded numbers (an integer of more than :data:`MAX_INT_DIGITS` digits is read as a
    float, inf beyond float range) and bounded nesting (``LogError`` naming ``where`` instead of a
    ``RecursionError``); ``json.JSONDecodeError`` as json raises it."""
    def bounded_int(digits: str) -> int | float:
        return int(digits) if len(digits.lstrip("-")) <= MAX_INT_DIGITS else _LongInt(digits)

    try:
        return json.loads(text, parse_int=bounded_int)
    except RecursionError:
        raise LogError(f"{where}: JSON nested too deeply; valid: {VALID_LOGS}") from None


class _LongInt(float):
    """An integer of more than :data:`MAX_INT_DIGITS` digits in a log, as the float it rounds to (inf beyond float
    range); :meth:`Log.add` counts it as an overflow when it exceeds ±:data:`VALUE_LIMIT`."""


class LogError(ValueError):
    """A path that is not a log ``analyze`` reads, or a damaged one (the CLI prints it as one line, exit 2)."""


@dataclass
class Log:
    """One run's logged scalars: ``series[name] = {step: value}`` under the names the engine used."""

    path: Path
    format: str
    series: dict[str, dict[int, float]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: per name, the first step and count of values beyond ±VALUE_LIMIT (kept as NaN, said in a note)
    overflow: dict[str, list[int]] = field(default_factory=dict)
    #: per name, the first step, count and first value of values that are no number (left out, said in a note)
    non_numbers: dict[str, list[Any]] = field(default_factory=dict)

    def add(self, step: int, name: str, value: Any) -> None:
        """Record one value (a later value of the same step replaces the earlier one): the one reader of logged
        values.  ``null`` / NaN / inf and values beyond ±:data:`VALUE_LIMIT` are kept as NaN; a value that is no
        number (a string, a boolean, an object) is left out and counted, and :meth:`non_number_notes` names it
        and its first step (a dropped reward would make another step's the final one)."""
        number = scalar(value)
        if number is None:
            first = self.non_numbers.setdefault(name, [int(step), 0, value])
            first[1] += 1
            return
        raw = value[0] if isinstance(value, list) and len(value) == 1 else value
        if abs(number) > VALUE_LIMIT or (isinstance(raw, _LongInt) and abs(raw) > VALUE_LIMIT):
            first = self.overflow.setdefault(name, [int(step), 0])
            first[1] += 1
            number = math.nan
        self.series.setdefault(name, {})[int(step)] = number

    def overflow_notes(self) -> list[str]:
        """One note per metric that logged values beyond ±:data:`VALUE_LIMIT`."""
        return [f"{self.path}: {name} logs {count} value(s) beyond ±{VALUE_LIMIT:g} (first at step {step}), "
                "counted as not finite" for name, (step, count) in sorted(self.overflow.items())]

    def non_number_notes(self) -> list[str]:
        """One note per metric that logged values that are no number (strings, booleans, objects)."""
        return [f"{self.path}: {name} logs {count} value(s) that are not numbers (first at step {step}: "
                f"{_shown(value)}), left out" for name, (step, count, value) in sorted(self.non_numbers.items())]

    @property
    def steps(self) -> list[int]:
        return sorted({step for values in self.series.values() for step in values})


def _shown(value: Any, width: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= width else text[:width - 3] + "..."


def scalar(value: Any) -> float | None:
    """A logged value as a float: numbers (bool excluded), one-element lists; ``None`` → NaN; anything else None."""
    if value is None:
        return math.nan
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer beyond float range
        return math.inf
    return number if math.isfinite(number) else math.nan


# ------------------------------------------------------------------------------------------------ reading
def read_log(path: str | Path) -> Log:
    """Detect the format of ``path`` (see the module docstring) and read it; :class:`LogError` names what was wrong
    and what is valid."""
    path = Path(path)
    try:
        path.stat()
    except FileNotFoundError:
        raise LogError(f"{path} does not exist; valid: {VALID_LOGS}") from None
    except OSError as exc:  # a symlink loop (ELOOP), a name too long, a folder without permission ...
        raise LogError(f"{path} cannot be read ({exc.strerror}); valid: {VALID_LOGS}") from None
    log = _read_path(path)
    log.notes.extend(log.overflow_notes() + log.non_number_notes())
    return log


def _read_path(path: Path) -> Log:
    if path.is_dir():
        return _read_folder(path)
    if path.name.startswith(EVENT_PREFIX):
        return read_tensorboard(path.parent)
    if path.name == "metrics.csv":
        return read_run(path.parent)
    return _read_file(path)


def _read_folder(path: Path) -> Log:
    from offpolicylab.run_records import is_run_dir

    if is_run_dir(path):
        return read_run(path)
    if (path / TRL_STATE).is_file():
        return read_trl(path / TRL_STATE)
    checkpoints = sorted((p for p in path.glob("checkpoint-*") if (p / TRL_STATE).is_file()
                          and p.name.removeprefix("checkpoint-").isdigit()),
                         key=lambda p: int(p.name.removeprefix("checkpoint-")))
    if checkpoints:
        return read_trl(checkpoints[-1] / TRL_STATE)
    if any(path.rglob(f"{EVENT_PREFIX}*")):
        return read_tensorboard(path)
    jsonl = sorted(path.glob("*.jsonl"))
    if len(jsonl) == 1:
        return _read_file(jsonl[0])
    if len(jsonl) > 1:
        raise LogError(f"{path} holds {len(jsonl)} .jsonl files ({', '.join(p.name for p in jsonl[:3])}); "
                       "valid: give the one verl FileLogger file to read")
    raise LogError(f"{path} holds none of the logs analyze reads (no {TRL_STATE}, checkpoint-N/{TRL_STATE}, "
                   f"{EVENT_PREFIX}* file, .jsonl file, or config.json + metrics.csv); valid: {VALID_LOGS}")


def _read_file(path: Path) -> Log:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise LogError(f"{path} cannot be read ({exc.strerror}); valid: {VALID_LOGS}") from None
    if not data.strip():
        raise LogError(f"{path} is empty; valid: {VALID_LOGS}")
    if data.lstrip()[:1] != b"{":
        raise LogError(f"{path} is not a log analyze reads (it does not start with a JSON object); "
                       f"valid: {VALID_LOGS}")
    text = data.decode("utf-8", errors="replace")
    try:
        whole = load_json(text, str(path))
    except json.JSONDecodeError:
        whole = None
    except LogError:  # nested too deeply: JSON lines name the line, a single document the file
        if not text.strip().count("\n"):
            raise
        return verl_log(path, text)
    if isinstance(whole, dict) and "log_history" in whole:
        return trl_log(path, whole)
    if isinstance(whole, dict) and not ("step" in whole and "data" in whole):
        raise LogError(f"{path} is a JSON object without log_history (TRL) or step and data (verl); "
                       f"valid: {VALID_LOGS}")
    if whole is None and not _first_line_is_json(text):
        if '"log_history"' in text:
            raise LogError(f"{path} is truncated or damaged JSON (a trainer_state.json that does not parse); "
                           "valid: a complete trainer_state.json")
        raise LogError(f"{path} is truncated or damaged JSON (it does not parse); valid: {VALID_LOGS}")
    return verl_log(path, text)


def _first_line_is_json(text: str) -> bool:
    try:
        return isinstance(json.loads(text.split("\n", 1)[0]), dict)
    except (json.JSONDecodeError, RecursionError, ValueError):
        return False


def read_trl(path: Path) -> Log:
    """A TRL / transformers ``trainer_state.json``."""
    text = path.read_text(encoding="utf-8", errors="replace")
    if not text.strip():
        raise LogError(f"{path} is empty; valid: a trainer_state.json written by a TRL / transformers trainer")
    try:
        state = load_json(text, str(path))
    except json.JSONDecodeError as exc:
        raise LogError(f"{path} is truncated or damaged JSON ({exc.msg} at line {exc.lineno}); "
                       "valid: a complete trainer_state.json") from None
    if not isinstance(state, dict) or "log_history" not in state:
        raise LogError(f"{path} has no log_history; valid: a trainer_state.json written by a TRL / transformers "
                       "trainer")
    return trl_log(path, state)


def trl_log(path: Path, state: dict[str, Any]) -> Log:
    history = state["log_history"]
    if not isinstance(history, list):
        raise LogError(f"{path}: log_history is not a list; valid: a trainer_state.json written by a trainer")
    log = Log(path, "trl")
    for index, record in enumerate(history):
        if not isinstance(record, dict) or not _is_step(record.get("step")):
            raise LogError(f"{path}: log_history[{index}] is not a record with an integer step; "
                           "valid: a trainer_state.json written by a TRL / transformers trainer")
        for name, value in record.items():
            if name not in ("step", "epoch"):
                log.add(record["step"], name, value)
    return log


def verl_log(path: Path, text: str) -> Log:
    """verl's FileLogger lines ``{"step": N, "data": {...}}``.  A last line without its newline that does not parse
    is a write cut short by a killed process: it is left out with a note; any other damaged line is an error."""
    log = Log(path, "verl")
    lines = text.split("\n")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = load_json(line, f"{path}:{number}")
        except json.JSONDecodeError as exc:
            if number == len(lines):  # no newline after it: torn by a kill mid-write
                log.notes.append(f"{path}:{number}: a torn last line (no newline, not JSON) was left out")
                continue
            raise LogError(f"{path}:{number}: not valid JSON ({exc.msg}); valid: verl FileLogger lines "
                           '{"step": N, "data": {...}}') from None
        if not (isinstance(record, dict) and _is_step(record.get("step")) and isinstance(record.get("data"), dict)):
            raise LogError(f"{path}:{number}: not a verl FileLogger record; valid: {VALID_LOGS} "
                           '(verl lines are {"step": N, "data": {...}})')
        for name, value in record["data"].items():
            log.add(record["step"], name, value)
    return log


def read_tensorboard(path: Path) -> Log:
    """The scalars of the one run whose event files lie in ``path`` or below it (TensorBoard's EventAccumulator)."""
    try:
        from tensorboard.backend.event_processing import event_accumulator
        from tensorboard.util import tensor_util
    except ImportError:
        raise LogError("reading TensorBoard event files needs the tensorboard package; valid: "
                       'pip install "offpolicylab[tensorboard]"') from None
    folders = sorted({p.parent for p in path.rglob(f"{EVENT_PREFIX}*")} if path.is_dir() else {path})
    if not folders:
        raise LogError(f"{path} holds no {EVENT_PREFIX}* file; valid: {VALID_LOGS}")
    if len(folders) > 1:
        names = ", ".join(str(f.relative_to(path)) for f in folders[:3])
        raise LogError(f"{path} holds the event files of {len(folders)} runs ({names}); valid: the folder of one run")
    notes = [note for file in sorted(folders[0].glob(f"{EVENT_PREFIX}*")) if (note := check_event_file(file))]
    accumulator = event_accumulator.EventAccumulator(
        str(folders[0]), size_guidance={event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0})
    accumulator.Reload()
    tags = accumulator.Tags()
    log = Log(folders[0], "tensorboard", notes=notes)
    for tag in tags.get("scalars", []):
        for event in accumulator.Scalars(tag):
            log.add(event.step, tag, event.value)
    for tag in tags.get("tensors", []):
        for event in accumulator.Tensors(tag):
            value = tensor_util.make_ndarray(event.tensor_proto)
            if value.size == 1 and np.issubdtype(value.dtype, np.number):
                log.add(event.step, tag, float(value.reshape(())))
    if not log.series:
        raise LogError(f"{folders[0]} holds event files without scalars (empty or damaged); valid: {VALID_LOGS}")
    return log


def check_event_file(path: Path) -> str | None:
    """Read every record of the TensorBoard event file ``path`` with TensorBoard's own record reader (which checks
    each record's CRC-32C; its event loader stops at the first bad record without a word).  A record cut short at
    the end of the file (a writer killed mid-write) gives a note (returned); a record whose checksum fails — damage
    in the middle, after which the accumulator would read a shorter run — raises :class:`LogError` naming the file
    and the record."""
    from tensorboard.compat.tensorflow_stub import errors
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import PyRecordReader_New

    reader = PyRecordReader_New(str(path))
    count, offset = 0, 0
    try:
        while True:
            try:
                reader.GetNext()
            except errors.OutOfRangeError:
                return None
            except errors.DataLossError as exc:
                if "truncated record" in str(exc):
                    return f"{path}: a torn last record (cut short at byte {offset}) was left out"
                raise LogError(f"{path}: record {count + 1} at byte {offset} is damaged (its CRC-32C checksum "
                               "fails), so every later record would be lost; valid: event files a SummaryWriter "
                               "wrote (a torn last record is left out with a note)") from None
            count += 1
            offset += 16 + len(reader.record())
    finally:
        reader.file_handle.close()


def read_run(path: Path) -> Log:
    """One of our run directories: ``metrics.csv`` by update (an empty cell: not logged at that update; ``nan``:
    logged, not finite)."""
    from offpolicylab.run_dir import RunDir

    log = Log(path, "offpolicylab")
    for line, row in enumerate(RunDir(path).read_metrics(), 2):
        step = row.get("update", "")
        if not step.isdigit():
            raise LogError(f"{path}/metrics.csv:{line}: update={step!r} is not an update number; the metrics file "
                           "is damaged (valid: a run directory offpolicylab wrote)")
        for name, text in row.items():
            if name != "update" and text not in ("", None):
                log.add(int(step), name, _number_or_text(text))
    return log


def _number_or_text(text: str) -> float | str:
    """A metrics.csv cell as a float, or the text itself (which :meth:`Log.add` counts as no number)."""
    try:
        return float(text)
    except ValueError:
        return text


def _is_step(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# ------------------------------------------------------------------------------------------------ our names
def engine_of(log: Log) -> str:
    """Which engine's names a log uses: ``verl``, ``trl`` or ``offpolicylab``.  TensorBoard logs are ours when they
    hold a tag only our trackers write (:data:`OUR_TENSORBOARD_TAGS`), TRL's when their tags carry the ``train/``
    prefix, else verl's."""
    if log.format != "tensorboard":
        return "offpolicylab" if log.format == "offpolicylab" else log.format
    if any(name in log.series for name in OUR_TENSORBOARD_TAGS):
        return "offpolicylab"
    return "trl" if any(name.startswith(TENSORBOARD_SPLIT) for name in log.series) else "verl"


#: Tags of our ``--report-to tensorboard`` folders that no other engine writes (every update logs them).
OUR_TENSORBOARD_TAGS = ("train/reward_current", "train/staleness_mean")


def plain_names(log: Log) -> dict[str, dict[int, float]]:
    """The log's series under the engine's own names: for TensorBoard, the tags turned back into the names the
    engine logged — TRL's ``train/x`` → ``x`` and ``eval/x`` → ``eval_x``; ours (:func:`column_of_tag`) → the
    metrics.csv column; verl's tags are its names."""
    engine = engine_of(log)
    if log.format != "tensorboard" or engine == "verl":
        return log.series
    if engine == "offpolicylab":
        return {column: values for name, values in log.series.items()
                if (column := column_of_tag(name)) is not None}
    out: dict[str, dict[int, float]] = {}
    for name, values in log.series.items():
        if name.startswith(TENSORBOARD_SPLIT):
            out[name.removeprefix(TENSORBOARD_SPLIT)] = values
        elif name.startswith("eval/"):
            out["eval_" + name.removeprefix("eval/")] = values
    return out


def column_of_tag(tag: str) -> str | None:
    """The metrics.csv column of one of our TensorBoard tags (the inverse of
    :func:`offpolicylab.tracking.scalar_name`), including the doubled tags of earlier versions
    (``eval/eval_reward_sampled``, ``time/time_update_s``); None for a tag that is no column (histograms, text)."""
    group, _, name = tag.partition("/")
    if not name or "/" in name:
        return None
    if group == "train":
        return name
    if group == "eval":
        return name if name.startswith(("eval_", "exact_")) else f"eval_{name}"
    if group == "time":
        return name if name.startswith("time_") else f"time_{name}"
    return None


def _matcher(name: str) -> re.Pattern[str]:
    """A name of :data:`METRIC_NAMES` as a pattern: each ``<...>`` placeholder stands for any text."""
    return re.compile("^" + ".+?".join(re.escape(part) for part in re.split(r"<[^<>]*>", name)) + "$")


def canonical(log: Log) -> tuple[dict[str, dict[int, float]], dict[str, str]]:
    """The log's series under our names (:data:`METRIC_NAMES`) and, for each, the name it was read from.  Our
    plug-ins' metrics (``actor/offpolicylab/<name>``, ``offpolicylab/<name>``) come first under their own name.
    Of the names a metric may be logged under, the first that holds a finite value is used (a column that is
    empty or NaN throughout is passed over: an offline run's ``reward_current``); a name with a ``<...>``
    placeholder takes the first of the log's names (sorted) that fits it."""
    engine = engine_of(log)
    series = plain_names(log)
    out: dict[str, dict[int, float]] = {}
    source: dict[str, str] = {}
    prefix = PLUGIN_PREFIXES.get(engine)
    if prefix is not None:
        for name, values in series.items():
            if name.startswith(prefix):
                out[name.removeprefix(prefix)], source[name.removeprefix(prefix)] = values, name
    for metric in METRIC_NAMES:
        if metric.ours in out:
            continue
        found = []
        for pattern in getattr(metric, "run" if engine == "offpolicylab" else engine):
            if "<" in pattern:
                fits = _matcher(pattern)
                found += [name for name in sorted(series) if fits.match(name)]
            elif pattern in series:
                found.append(pattern)
        if found:
            name = next((n for n in found if any(math.isfinite(v) for v in series[n].values())), found[0])
            out[metric.ours], source[metric.ours] = series[name], name
    return out, source


def unmapped(log: Log, used: Iterable[str]) -> list[str]:
    """Names in the log that :func:`canonical` did not use (for the summary: what else the log holds)."""
    taken = set(used)
    return sorted(name for name in plain_names(log) if name not in taken)


def mapping_table() -> str:
    """:data:`METRIC_NAMES` as the Markdown table docs/diagnosing.md shows (a test keeps the two equal)."""
    def cell(names: tuple[str, ...]) -> str:
        return ", ".join(f"`{name}`" for name in names) or "–"

    rows = ["| ours | verl | TRL | our run directories | meaning |", "|---|---|---|---|---|"]
    for metric in METRIC_NAMES:
        rows.append(f"| `{metric.ours}` | {cell(metric.verl)} | {cell(metric.trl)} | {cell(metric.run)} | "
                    f"{metric.meaning} |")
    return "\n".join(rows)

