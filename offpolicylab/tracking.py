"""Experiment tracking (``--report-to tensorboard,wandb,mlflow,trackio``): every metrics row a run writes goes to
the chosen trackers too, through each library's own API, and so do the histogram samples (token log-ratios and
entropies, every ``sample_every`` updates).  ``metrics.csv`` stays the record; a tracker is a view of it.

Everything stays on this machine unless the user asks otherwise:

=============  ======================================================================================================
tensorboard    ``torch.utils.tensorboard.SummaryWriter`` writing ``RUN/tracking/tensorboard`` (``tensorboard --logdir
               RUN/tracking``); a resumed run purges the steps it redoes.
wandb          ``wandb.init(mode="offline")`` into ``RUN/tracking/wandb`` unless ``WANDB_MODE`` says otherwise
               (``wandb sync RUN/tracking/wandb/offline-run-*`` uploads it later); a resume continues the same run id.
mlflow         ``mlflow.MlflowClient`` on the file store ``RUN/tracking/mlruns`` unless ``MLFLOW_TRACKING_URI`` names
               another (``mlflow ui --backend-store-uri RUN/tracking/mlruns``); histogram samples are logged as
               artifacts (MLflow has no histogram type).
trackio        ``trackio.init`` on Trackio's local database (``TRACKIO_DIR``, default ``~/.cache/huggingface/trackio``;
               ``trackio show --project offpolicylab``).
=============  ======================================================================================================

Scalars are named ``train/<column>``, ``eval/<name>`` (``eval_<name>`` columns; ``exact_*`` columns keep their
name: ``eval/exact_return``) and ``time/<name>`` (``time_<name>`` columns),
with the update (0-based, as in ``metrics.csv``) as the step; a value that is NaN (no evaluation at that update) is
not logged.  The tracker's run name is the run directory's name, its group the parent folder's (a sweep's cells).
Each library is imported only when asked for; a missing one is refused before the run starts, in one line, and so is
one that cannot be opened (a broken install, an online mode without a key, an MLflow server that does not answer
within seconds): every tracker is opened before the run writes its config.json (:class:`TrackerError`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import shutil
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

#: The trackers ``--report-to`` accepts (comma-separated, several at once); ``none`` alone means no tracker.
REPORT_TO = ("tensorboard", "wandb", "mlflow", "trackio", "none")
_MODULES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow", "trackio": "trackio"}
PROJECT = "offpolicylab"
FOLDER = "tracking"  # inside the run directory
IDS_FILE = "ids.json"  # the trackers' run ids, so that a resume continues the same runs
HISTOGRAMS = ("log_ratio", "seq_log_ratio", "entropy", "advantage", "staleness")


def parse_report_to(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """``"tensorboard,wandb"`` → ``("tensorboard", "wandb")``; ``"none"`` / empty → ``()``.  An unknown name raises
    ``ValueError`` naming the valid ones."""
    if value is None:
        return ()
    names = [part.strip().lower() for part in (value.split(",") if isinstance(value, str) else value)]
    names = [name for name in names if name]
    unknown = [name for name in names if name not in REPORT_TO]
    if unknown:
        raise ValueError(f"report_to {unknown[0]!r} is unknown; valid: a comma-separated list of "
                         f"{', '.join(REPORT_TO)}")
    chosen = tuple(dict.fromkeys(name for name in names if name != "none"))
    if chosen and "none" in names:
        raise ValueError(f"report_to {value!r} names none together with trackers; valid: none alone, or trackers")
    return chosen


def check_installed(names: Iterable[str]) -> None:
    """Refuse a tracker whose library is not installed (one line naming the package and the extra)."""
    for name in names:
        if importlib.util.find_spec(_MODULES[name]) is None:
            raise ValueError(f"--report-to {name} needs the {_MODULES[name]} package, which is not installed; "
                             f"valid: pip install {_MODULES[name]} (or the tracking extra: pip install "
                             "'offpolicylab[tracking]')")


def scalar_name(column: str) -> str:
    """The tracker's name of a metrics column (docs/metrics.md): ``eval_x`` → ``eval/x``, ``exact_x`` →
    ``eval/exact_x``, ``time_x`` → ``time/x``, any other ``x`` → ``train/x`` (the group is not repeated in the name;
    :func:`offpolicylab.logs.column_of_tag` is the inverse)."""
    if column.startswith("eval_"):
        return "eval/" + column.removeprefix("eval_")
    if column.startswith("exact_"):
        return f"eval/{column}"
    if column.startswith("time_"):
        return "time/" + column.removeprefix("time_")
    return f"train/{column}"


def scalars_of(row: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a metrics row by their tracker names (``update`` is the step, not a scalar)."""
    out = {}
    for key, value in row.items():
        if key == "update" or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value):
            out[scalar_name(key)] = float(value)
    return out


# ============================================================================================ the sinks
class TensorBoardSink:
    """:class:`torch.utils.tensorboard.SummaryWriter` into ``folder/tensorboard``."""

    def __init__(self, folder: Path, config: dict[str, Any], start: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(folder / "tensorboard"), purge_step=start or None)
        if not start:
            self.writer.add_text("config", "```\n" + json.dumps(config, indent=2) + "\n```", 0)

    def scalars(self, values: dict[str, float], step: int) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)

    def histograms(self, arrays: dict[str, np.ndarray], step: int, path: Path | None) -> None:
        for key, values in arrays.items():
            self.writer.add_histogram(f"hist/{key}", values, step)

    def close(self, summary: dict[str, Any]) -> None:
        self.writer.close()


class WandbSink:
    """``wandb.init`` (offline unless ``WANDB_MODE`` is set) into ``folder/wandb``."""

    def __init__(self, folder: Path, config: dict[str, Any], start: int, ids: dict[str, str], name: str,
                 group: str) -> None:
        import wandb
        from wandb.sdk.lib.runid import generate_id

        self.wandb = wandb
        ids.setdefault("wandb", generate_id())
        (folder / "wandb").mkdir(parents=True, exist_ok=True)
        settings = wandb.Settings(silent=True, console="off", x_disable_stats=True, disable_git=True)
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", PROJECT), name=name, group=group,
                              id=ids["wandb"], resume="allow", dir=str(folder), config=config,
                              mode=os.environ.get("WANDB_MODE", "offline"), settings=settings, reinit="create_new")
        self.pending: dict[str, Any] = {}
        self.step = -1

    def scalars(self, values: dict[str, float], step: int) -> None:
        self._add(values, step)

    def histograms(self, arrays: dict[str, np.ndarray], step: int, path: Path | None) -> None:
        self._add({f"hist/{key}": self.wandb.Histogram(values) for key, values in arrays.items()}, step)

    def _add(self, values: dict[str, Any], step: int) -> None:
        """Gather a step's values and log them as one committed step when the next step begins (or at the end):
        W&B otherwise holds an uncommitted step, and may lose the last one when the run finishes."""
        if self.pending and step != self.step:
            self.flush()
        self.step = step
        self.pending.update(values)

    def flush(self) -> None:
        if self.pending:
            self.run.log(self.pending, step=self.step, commit=True)
            self.pending = {}

    def close(self, summary: dict[str, Any]) -> None:
        self.flush()
        self.run.summary.update(_flat_numbers(summary))
        self.run.finish(exit_code=0 if summary.get("status") != "failed" else 1)
        self.wandb.teardown()  # finish returns before W&B's service has written the run file's last block


class MlflowSink:
    """``mlflow.MlflowClient`` on the file store ``folder/mlruns`` (or ``MLFLOW_TRACKING_URI``)."""

    def __init__(self, folder: Path, config: dict[str, Any], start: int, ids: dict[str, str], name: str,
                 group: str) -> None:
        import mlflow
        from mlflow.entities import Param

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if uri is None:  # MLflow keeps its file store in maintenance mode behind this switch
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            uri = (folder / "mlruns").resolve().as_uri()
        self.mlflow = mlflow
        self.client = mlflow.MlflowClient(tracking_uri=uri)
        if "mlflow" not in ids:
            experiment = self.client.get_experiment_by_name(PROJECT)
            experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(PROJECT)
            run = self.client.create_run(experiment_id, run_name=name, tags={"group": group})
            ids["mlflow"] = run.info.run_id
            params = [Param(key, str(value)[:500]) for key, value in _flat(config).items()]
            for first in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
                self.client.log_batch(ids["mlflow"], params=params[first:first + 100])
        else:
            self.client.update_run(ids["mlflow"], status="RUNNING")
        self.run_id = ids["mlflow"]

    def scalars(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        stamp = _millis()
        self.client.log_batch(self.run_id, metrics=[Metric(key, value, stamp, step) for key, value in values.items()])

    def histograms(self, arrays: dict[str, np.ndarray], step: int, path: Path | None) -> None:
        if path is not None:
            self.client.log_artifact(self.run_id, str(path), artifact_path="samples")

    def close(self, summary: dict[str, Any]) -> None:
        self.client.set_terminated(self.run_id, status="FAILED" if summary.get("status") == "failed" else "FINISHED")


class TrackioSink:
    """``trackio.init`` on Trackio's local database; its console notes go to stderr."""

    def __init__(self, folder: Path, config: dict[str, Any], start: int, ids: dict[str, str], name: str,
                 group: str) -> None:
        import trackio

        self.trackio = trackio
        with contextlib.redirect_stdout(sys.stderr):
            self.run = trackio.init(project=os.environ.get("TRACKIO_PROJECT", PROJECT), name=name, group=group,
                                    config=config, resume="allow" if start else "never", embed=False,
                                    auto_log_cpu=False, auto_log_gpu=False)

    def scalars(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)

    def histograms(self, arrays: dict[str, np.ndarray], step: int, path: Path | None) -> None:
        self.run.log({f"hist/{key}": self.trackio.Histogram(values) for key, values in arrays.items()}, step=step)

    def close(self, summary: dict[str, Any]) -> None:
        with contextlib.redirect_stdout(sys.stderr):
            self.run.finish()
        # trackio's exit hook finishes the context's current run again, printing on stdout after everything else
        context = getattr(self.trackio, "context_vars", None)
        if context is not None and context.current_run.get() is self.run:
            context.current_run.set(None)


# ============================================================================================ the tracker
class Tracker:
    """The chosen sinks of one run, fed by its :class:`~offpolicylab.run_dir.RunDir`: :meth:`row` after each metrics
    row, :meth:`samples` after each histogram-samples file, :meth:`close` with the summary."""

    def __init__(self, sinks: list[Any]) -> None:
        self.sinks = sinks

    def row(self, row: dict[str, Any]) -> None:
        values, step = scalars_of(row), int(row["update"])
        for sink in self.sinks:
            sink.scalars(values, step)

    def samples(self, arrays: dict[str, np.ndarray], step: int, path: Path | None = None) -> None:
        chosen = {key: np.asarray(arrays[key]) for key in HISTOGRAMS if key in arrays and np.size(arrays[key])}
        for sink in self.sinks:
            sink.histograms(chosen, step, path)

    def close(self, summary: dict[str, Any]) -> None:
        sinks, self.sinks = self.sinks, []
        for sink in sinks:
            sink.close(summary)


def open_tracker(names: Sequence[str], run_dir: str | Path, config: dict[str, Any], start: int) -> Tracker | None:
    """The trackers ``names`` for the run in ``run_dir`` (config.json's ``config``; ``start``: the first update
    this process trains, > 0 on a resume), or None when there are none.  The trackers' run ids are kept in
    ``run_dir/tracking/ids.json`` so that a resume continues the same runs."""
    names = parse_report_to(names)
    if not names:
        return None
    check_installed(names)
    run_dir = Path(run_dir)
    folder = run_dir / FOLDER
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    ids_path = folder / IDS_FILE
    ids: dict[str, str] = json.loads(ids_path.read_text()) if ids_path.exists() else {}
    name, group = run_dir.resolve().name, run_dir.resolve().parent.name
    sinks: list[Any] = []
    for tracker in names:
        try:
            if tracker == "tensorboard":
                sinks.append(TensorBoardSink(folder, config, start))
            elif tracker == "mlflow":
                with bounded_mlflow_requests(os.environ.get("MLFLOW_TRACKING_URI")):
                    sinks.append(MlflowSink(folder, config, start, ids, name, group))
            else:
                kind = {"wandb": WandbSink, "trackio": TrackioSink}[tracker]
                sinks.append(kind(folder, config, start, ids, name, group))
        except Exception as exc:  # noqa: BLE001 - any failure to open a tracker is one line, before any run file
            for sink in sinks:
                with contextlib.suppress(Exception):
                    sink.close({"status": "failed"})
            if created:
                shutil.rmtree(folder, ignore_errors=True)
            raise TrackerError(tracker, exc) from None
    ids_path.write_text(json.dumps(ids, indent=2) + "\n")
    return Tracker(sinks)


#: What makes each tracker open, for the message of one that does not.
OPEN_HINTS = {
    "tensorboard": "a run directory this user can write",
    "wandb": "WANDB_MODE=offline (the default here: nothing is sent), or `wandb login` before an online run",
    "mlflow": "a reachable MLFLOW_TRACKING_URI, or none (the file store RUN/tracking/mlruns)",
    "trackio": "a writable TRACKIO_DIR (default ~/.cache/huggingface/trackio)",
}
#: Seconds a remote MLflow server has to accept a connection (an unreachable one hung for minutes).
MLFLOW_CONNECT_TIMEOUT = 5.0


class TrackerError(ValueError):
    """A tracker that cannot be opened (a broken install, a missing login key, an unreachable server): one line
    naming the tracker, the cause and what is valid; raised before the run writes its config.json."""

    def __init__(self, tracker: str, exc: BaseException) -> None:
        cause = " ".join(str(exc).split())[:300] or type(exc).__name__
        super().__init__(f"--report-to {tracker} cannot be opened ({type(exc).__name__}: {cause}); valid: "
                         f"{OPEN_HINTS[tracker]}, or another --report-to")


@contextlib.contextmanager
def bounded_mlflow_requests(uri: str | None, timeout: float = MLFLOW_CONNECT_TIMEOUT) -> Any:
    """While MLflow opens its run on an ``http(s)://`` tracking URI: its host must accept a connection within
    ``timeout`` seconds (``ConnectionError`` otherwise), and each request gets ``timeout`` seconds and no retry
    (``MLFLOW_HTTP_REQUEST_TIMEOUT``, ``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, unless the user set them), so that a
    server that is down or does not answer is refused within seconds (it hung for minutes).  The training that
    follows keeps MLflow's own timeouts and retries."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(uri or "")
    if parts.scheme not in ("http", "https"):
        yield
        return
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname or "", port), timeout=timeout).close()
    except OSError as exc:
        raise ConnectionError(f"MLflow server {uri} cannot be reached within {timeout:g} s ({exc})") from None
    bounds = {"MLFLOW_HTTP_REQUEST_TIMEOUT": str(int(timeout)), "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}
    added = [key for key in bounds if key not in os.environ]
    os.environ.update({key: bounds[key] for key in added})
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` → ``{"a.b": 1}``."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _flat_numbers(summary: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in _flat(summary).items() if isinstance(value, (int, float, str))}


def _millis() -> int:
    import time

    return int(time.time() * 1000)
