"""``report_to``: a run's metrics rows and histogram samples reach each tracker through the tracker's own API, and
are read back here with that tracker's own reader: TensorBoard's ``EventAccumulator``, the W&B offline run file
(LevelDB log records of W&B's ``Record`` protobuf), MLflow's client on its file store and Trackio's SQLite storage.
Every logged value equals the metrics.csv value of the same update (float32 where the tracker stores float32)."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from offpolicylab.run_dir import RunDir
from offpolicylab.tracking import open_tracker, parse_report_to, scalar_name
from offpolicylab.trainer import train
from tests.small_runs import mdp_config, read_rows

UPDATES = 6


def tracked_run(tmp_path: Path, report_to: str, name: str = "run") -> Path:
    out = tmp_path / name
    train(mdp_config(updates=UPDATES, eval_every=3, sample_every=3, checkpoint_every=3, report_to=report_to), out)
    return out


def csv_column(out: Path, column: str) -> dict[int, float]:
    return {int(row["update"]): float(row[column]) for row in read_rows(out) if row[column] != ""}


def test_tensorboard_event_file_read_back_by_tensorboard(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")  # the dev extra installs it; a bare install refuses --report-to tensorboard
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tracked_run(tmp_path, "tensorboard")
    events = EventAccumulator(str(out / "tracking" / "tensorboard"), size_guidance={"scalars": 0, "histograms": 0})
    events.Reload()
    for column in ("loss", "reward_mean", "ratio_p999", "ess", "eval_reward_sampled", "exact_kl_init"):
        logged = {event.step: event.value for event in events.Scalars(scalar_name(column))}
        expected = csv_column(out, column)
        assert set(logged) == set(expected)  # NaN evaluations are not logged
        for step, value in expected.items():
            assert logged[step] == pytest.approx(np.float32(value), rel=1e-6, abs=1e-7)
    histograms = events.Histograms("hist/log_ratio")
    assert [h.step for h in histograms] == [0, 3]
    with np.load(out / "samples" / "update_000003.npz") as samples:
        assert histograms[1].histogram_value.num == samples["log_ratio"].size
        assert histograms[1].histogram_value.sum == pytest.approx(float(samples["log_ratio"].sum()), abs=1e-4)
    assert "hist/entropy" in events.Tags()["histograms"]


def wandb_history(run_file: Path) -> list[dict[str, str]]:
    """The history records of a W&B offline run file: a 7-byte header, then the LevelDB log format (32 KiB blocks
    of records with a 7-byte header: CRC32, length, type 1 full / 2 first / 3 middle / 4 last)."""
    from wandb.proto import wandb_internal_pb2

    data, pos, block, records, pending = run_file.read_bytes(), 7, 32768, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0:
            break
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            records.append(pending)
    history = []
    for raw in records:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "history":
            history.append({item.key or "/".join(item.nested_key): item.value_json for item in record.history.item})
    return history


def test_wandb_offline_run_holds_the_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    out = tracked_run(tmp_path, "wandb")
    files = list((out / "tracking" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1
    history = wandb_history(files[0])
    logged = {int(h["_step"]): float(h["train/loss"]) for h in history if "train/loss" in h}
    expected = csv_column(out, "loss")
    assert set(logged) == set(expected)
    for step, value in expected.items():
        assert logged[step] == pytest.approx(value, rel=1e-12)
    assert any(h.get("hist/log_ratio/_type") == '"histogram"' for h in history)


def test_mlflow_file_store_holds_the_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mlflow")
    import mlflow

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = tracked_run(tmp_path, "mlflow")
    client = mlflow.MlflowClient(tracking_uri=(out / "tracking" / "mlruns").resolve().as_uri())
    run_id = __import__("json").loads((out / "tracking" / "ids.json").read_text())["mlflow"]
    history = {m.step: m.value for m in client.get_metric_history(run_id, "train/reward_mean")}
    assert history == pytest.approx(csv_column(out, "reward_mean"), rel=1e-12)
    assert client.get_run(run_id).data.params["objective"] == "grpo"
    assert client.get_run(run_id).info.status == "FINISHED"
    assert sorted(a.path for a in client.list_artifacts(run_id, "samples")) == \
        ["samples/update_000000.npz", "samples/update_000003.npz"]


def test_trackio_local_database_holds_the_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("trackio")
    import trackio.sqlite_storage
    import trackio.utils

    for module in (trackio.utils, trackio.sqlite_storage):  # Trackio reads TRACKIO_DIR once, at import
        monkeypatch.setattr(module, "TRACKIO_DIR", tmp_path / "trackio_db")
    monkeypatch.setenv("TRACKIO_PROJECT", "offpolicylab-test")
    out = tracked_run(tmp_path, "trackio")
    logs = trackio.sqlite_storage.SQLiteStorage.get_logs("offpolicylab-test", out.name)
    logged = {row["step"]: row["train/loss"] for row in logs if "train/loss" in row}
    assert logged == pytest.approx(csv_column(out, "loss"), rel=1e-12)


def test_resume_continues_the_tensorboard_log_without_duplicates(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tracked_run(tmp_path, "tensorboard")
    train(mdp_config(updates=UPDATES + 3, eval_every=3, sample_every=3, checkpoint_every=3, report_to="tensorboard"),
          out, resume=True)
    events = EventAccumulator(str(out / "tracking" / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == list(range(UPDATES + 3))


def test_report_to_names() -> None:
    assert parse_report_to("tensorboard, wandb,tensorboard") == ("tensorboard", "wandb")
    assert parse_report_to("none") == ()
    with pytest.raises(ValueError, match="report_to 'tb' is unknown; valid: a comma-separated list of tensorboard"):
        parse_report_to("tb")
    with pytest.raises(ValueError, match="none together with trackers"):
        parse_report_to("none,wandb")


def test_a_missing_library_is_refused_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ValueError, match=r"--report-to wandb needs the wandb package, which is not installed; "
                                         r"valid: pip install wandb"):
        open_tracker(["wandb"], tmp_path, {}, 0)
    with pytest.raises(ValueError, match="needs the wandb package"):  # refused before anything is written
        train(mdp_config(report_to="tensorboard,wandb"), tmp_path / "refused")
    assert not (tmp_path / "refused").exists()


def test_config_json_records_the_environment(tmp_path: Path) -> None:
    out = tracked_run(tmp_path, "none")
    environment = RunDir(out).read_environment()
    assert environment["torch"] and environment["numpy"] and environment["python"]
    assert "environment" not in RunDir(out).read_config()
    if "git_commit" in environment:
        assert len(environment["git_commit"]) == 40
