"""Hostile input, round three (docs/bad_input.md): a test per class of failure — damaged input gives one line that
names the file, field or line and what is valid (exit 2), never a traceback; the output location is checked before
the work; output is swapped in whole (no torn or stale files, nothing left after a kill); nothing of a run is lost;
every parameter's range is checked before anything is written; nothing damaged is read silently; a YAML file
cannot exhaust memory."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from offpolicylab import analyze, cli, replay
from offpolicylab.run_dir import RunDir


def verl_log(path: Path, steps: int = 6, spikes: bool = True, reward: object = None) -> Path:
    """A verl FileLogger log: one ``{"step": N, "data": {...}}`` line per step."""
    lines = []
    for step in range(1, steps + 1):
        data: dict[str, object] = {"critic/score/mean": 0.1 * step if reward is None else reward}
        if spikes:
            data["actor/grad_norm"] = 1.0
        lines.append(json.dumps({"step": step, "data": data}))
    path.write_text("\n".join(lines) + "\n")
    return path


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one stderr line of a command refused with exit code 2."""
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2, err
    assert err.count("\n") == 1 and err.startswith("offpolicylab: error: "), err
    return err.strip()


def small_run(path: Path, rows: int = 3) -> Path:
    """A finished run directory (config.json, metrics.csv, summary.json) of ``rows`` updates."""
    run = RunDir(path)
    run.create({"objective": "grpo"})
    for update in range(rows):
        run.append_metrics({"update": update, "loss": 0.1, "grad_norm": 0.5, "reward_mean": 0.1 * update})
    run.write_summary("completed")
    run.close()
    return path


def recorded(path: Path) -> Path:
    """A recorded run (samples/update_XXXXXX.npz with whole batches) of one update."""
    from tests.diagnostics.test_replay import random_batch, record

    return record(path, "grpo", {}, [[random_batch(1), random_batch(2)]])


def dead_pid() -> int:
    """The id of a process that has ended."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


# ------------------------------------------------------------------------------- 3: output location checked first
def test_analyze_and_replay_check_the_output_location_before_the_work(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "file"
    file.write_text("x")

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the work started before the output location was checked")

    monkeypatch.setattr(analyze, "analyze", never)
    monkeypatch.setattr(replay, "replay", never)
    log = verl_log(tmp_path / "run.jsonl")
    err = refused(["analyze", str(log), "--out", str(file / "sub")], capsys)
    assert f"--out {file / 'sub'} cannot be created: {file} is a file; valid: a path under a folder" in err
    err = refused(["replay", str(recorded(tmp_path / "rec")), "--out", str(file / "sub")], capsys)
    assert f"--out {file / 'sub'} cannot be created: {file} is a file" in err


# ------------------------------------------------------------------------------- 4: no torn or stale output
def test_a_full_disk_while_analyze_overwrites_leaves_the_earlier_output_whole(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch,
                                                                              capsys: pytest.CaptureFixture[str]
                                                                              ) -> None:
    out = tmp_path / "a"
    assert cli.main(["analyze", str(verl_log(tmp_path / "one.jsonl")), "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real = analyze.draw

    def full_disk(analysis: analyze.Analysis, name: str, path: Path) -> Path:
        if name != "reward":
            path.write_bytes(b"\x89PNG torn")
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(analysis, name, path)

    monkeypatch.setattr(analyze, "draw", full_disk)
    assert cli.main(["analyze", str(verl_log(tmp_path / "two.jsonl", steps=9)), "--out", str(out)]) == 1
    assert capsys.readouterr().err == f"offpolicylab: error: [Errno 28] No space left on device: '{out}/spikes.png'\n"
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "one.jsonl", "two.jsonl"]


def test_figures_of_an_earlier_analysis_do_not_stay_beside_a_new_summary(tmp_path: Path) -> None:
    out = tmp_path / "a"
    assert cli.main(["analyze", str(verl_log(tmp_path / "one.jsonl")), "--out", str(out)]) == 0
    assert (out / "spikes.png").exists()
    assert cli.main(["analyze", str(verl_log(tmp_path / "two.jsonl", spikes=False)), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert sorted(p.name for p in out.iterdir()) == sorted([*summary["figures"], "summary.json"])
    assert "spikes.png" not in summary["figures"]


def test_nothing_a_killed_writer_left_stays_after_a_rerun(tmp_path: Path) -> None:
    out = tmp_path / "p"
    pid = dead_pid()
    (tmp_path / f".p.tmp-{pid}").mkdir()  # the staging folder of an analyze killed mid-write
    (tmp_path / f".p.tmp-{pid}" / f".summary.json.tmp-{pid}").write_text("{")
    out.mkdir()
    (out / f".summary.json.tmp-{pid}").write_text("{")  # what a kill left before there was a staging folder
    assert cli.main(["analyze", str(verl_log(tmp_path / "one.jsonl")), "--out", str(out)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one.jsonl", "p"]
    assert not [p for p in out.iterdir() if ".tmp-" in p.name]


def test_plot_swaps_its_figures_in_whole_and_never_writes_into_a_run(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from matplotlib.figure import Figure

    from offpolicylab import trainer
    from tests.small_runs import mdp_config

    run, out = tmp_path / "run", tmp_path / "figs"
    trainer.train(mdp_config(updates=2, eval_every=1, sample_every=0), run)
    assert cli.main(["plot", str(run), "--out", str(out), "--figures", "training_curves"]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real = Figure.savefig

    def full_disk(self: Figure, path: object, *args: object, **kwargs: object) -> None:
        real(self, path, *args, **kwargs)
        Path(str(path)).write_bytes(b"\x89PNG torn")
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(Figure, "savefig", full_disk)
    assert cli.main(["plot", str(run), "--out", str(out), "--figures", "training_curves"]) == 1
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    monkeypatch.setattr(Figure, "savefig", real)
    assert cli.main(["plot", str(run), "--out", str(run)]) == 2
    assert "is a run directory plot did not create" in capsys.readouterr().err


def test_replay_swaps_its_output_in_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    rec, out = recorded(tmp_path / "rec"), tmp_path / "r"
    assert cli.main(["replay", str(rec), "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def full_disk(*args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(replay, "figure", full_disk)
    assert cli.main(["replay", str(rec), "--out", str(out), "--objectives", "grpo"]) == 1
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


# ------------------------------------------------------------------------------- 5: nothing of a run is lost
def test_analyze_never_writes_into_a_run_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = small_run(tmp_path / "run")
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    err = refused(["analyze", str(run / "metrics.csv"), "--out", str(run)], capsys)
    assert f"--out {run} is a run directory analyze did not create; valid: a folder outside any run directory" in err
    err = refused(["analyze", str(run / "metrics.csv"), "--out", str(run / "analysis")], capsys)
    assert f"lies inside the run directory {run}" in err
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    assert not (run / "analysis").exists()


def test_an_output_folder_holding_other_files_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    err = refused(["analyze", str(verl_log(tmp_path / "one.jsonl")), "--out", str(out)], capsys)
    assert f"--out {out} holds files analyze does not write (notes.txt); valid: a new or empty folder" in err
    assert (out / "notes.txt").read_text() == "keep me"


def test_resume_to_fewer_updates_than_a_collapsed_run_recorded_is_refused(tmp_path: Path) -> None:
    """A run whose loss turns NaN at update 2 stops there as collapsed, its checkpoint at update 2 and three rows
    recorded; ``--resume --updates 2`` used to drop the collapse row and call the run completed."""
    from offpolicylab import trainer
    from tests.small_runs import bandit_config, nan_objective

    with nan_objective("reinforce", after=2) as objective:
        assert trainer.train(bandit_config(objective=objective, updates=6, checkpoint_every=1),
                             tmp_path)["status"] == "collapsed"
        before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
        with pytest.raises(ValueError, match=rf"--updates 2 is below the 3 updates {tmp_path}/metrics.csv already "
                                             r"records \(it ended collapsed there\); valid: --updates 3 or more"):
            trainer.train(bandit_config(objective=objective, updates=2, checkpoint_every=1), tmp_path, resume=True)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before


# ------------------------------------------------------------------------------- 1, 2: damaged logs in one line
@pytest.mark.parametrize(("case", "message"), [
    ("deep", "{log}:1: JSON nested too deeply; valid: a verl FileLogger .jsonl file"),
    ("huge", "{log} (verl): critic/score/mean holds no finite value within ±1e+150 (4 logged); valid: the log of an "
             "RL run with finite rewards"),
    ("loop", "{log} cannot be read (Too many levels of symbolic links); valid: a verl FileLogger .jsonl file"),
], ids=["deep", "huge", "loop"])
def test_damaged_logs_are_one_line_naming_the_file(tmp_path: Path, case: str, message: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "run.jsonl"
    if case == "deep":
        log.write_text('{"step": 1, "data": {"critic/score/mean": ' + "[" * 100_000 + "]" * 100_000 + "}}\n"
                       + '{"step": 2, "data": {"critic/score/mean": 1}}\n')
    elif case == "huge":
        log.write_text("".join(json.dumps({"step": s, "data": {"critic/score/mean": (-1) ** s * 1e308}}) + "\n"
                               for s in range(4)))
    else:
        log.symlink_to(log.name)
    err = refused(["analyze", str(log), "--out", str(tmp_path / "a")], capsys)
    assert message.format(log=log) in err
    assert not (tmp_path / "a").exists()


def test_a_400_digit_or_overflowing_value_is_noted_not_a_traceback(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "run.jsonl"
    values = ["0.1", "9" * 400, "1e308", "0.4", "0.5"]
    log.write_text("".join(f'{{"step": {s}, "data": {{"critic/score/mean": {v}}}}}\n' for s, v in enumerate(values)))
    assert cli.main(["analyze", str(log), "--out", str(tmp_path / "a")]) == 0
    note = f"{log}: critic/score/mean logs 2 value(s) beyond ±1e+150 (first at step 1), counted as not finite"
    assert f"note: {note}" in capsys.readouterr().out
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["notes"] == [note] and summary["not_finite"] == {"reward_mean": 2}


# ------------------------------------------------------------------------------- 7, 8: the YAML and JSON loader
CONFIG_CASES = [
    ("dup.yaml", "world: bandit\nupdates: 2\nupdates: 3\n",
     " is refused at line 3: duplicate key 'updates' (first at line 2); valid: each key once"),
    ("dup.json", '{"world": "bandit", "updates": 2, "updates": 3}',
     " is refused: duplicate key 'updates'; valid: each key once"),
    ("on.yaml", "world: bandit\non: 3\n",
     " is refused at line 2: key True is not a string (YAML 1.1 reads on, off, yes, no as booleans); valid: a "
     "string key (quote it: 'on':)"),
    ("long.yaml", "world: bandit\nlr: " + "9" * 400 + "\n",
     " is refused at line 2: a number of 400 digits; valid: at most 100 digits"),
    ("long.json", '{"world": "bandit", "lr": ' + "9" * 400 + "}",
     " is refused: a number of 400 digits; valid: at most 100 digits"),
    ("laughs.yaml", "world: bandit\na0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 10)),
     ' is refused: its aliases expand to more than 100,000 values (nested anchors, as in a "billion laughs" '
     "file); valid: a config without nested aliases"),
    ("list.yaml", "world: bandit\nobjective: grpo\nworld_params: [1, 2]\n",
     ": world_params holds a list; valid: a mapping of world parameters (name: value)"),
]


@pytest.mark.parametrize(("name", "text", "message"), CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_config_files_refuse_duplicates_non_string_keys_long_numbers_and_alias_bombs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], name: str, text: str,
        message: str) -> None:
    monkeypatch.chdir(tmp_path)
    Path(name).write_text(text)
    err = refused(["run", "--config", name, "--out", "out"], capsys)
    assert f"offpolicylab: error: --config {name}{message}" == err
    assert not Path("out").exists()


# ------------------------------------------------------------------------------- 1, 2, 7: damaged recorded batches
def _set(name: str, value: object) -> object:
    return lambda arrays: arrays.__setitem__(name, value(arrays) if callable(value) else value)


REPLAY_CASES = {
    "missing": (lambda a: a.pop("batch_advantage"), None,
                "{file}: array 'batch_advantage' is missing; valid: the arrays a recorder writes"),
    "fewer rows": (_set("micro_batch", lambda a: a["micro_batch"][:1]), None,
                   "{file}: micro_batch has shape (1,) but batch_log_ratio (6, 6); valid: (6,)"),
    "zero rows": (lambda a: a.update({k: v[:0] for k, v in a.items() if k.startswith(("batch_", "micro"))}), None,
                  "{file}: batch_log_ratio has shape (0, 6) (no token to replay); valid: a [B, T] batch"),
    "nan": (lambda a: a["batch_log_ratio"].__setitem__((0, 0), float("nan")), None,
            "{file}: batch_log_ratio holds 1 value(s) that are not finite (NaN or inf) on valid tokens, the first "
            "at row 0, token 0; valid: finite values"),
    "all padding": (_set("batch_mask", lambda a: 0 * a["batch_mask"]), None,
                    "{file}: the 1 replayed sample file(s) hold no valid token (every batch_mask is 0)"),
    "config type": (None, {"objective_params": [1, 2]},
                    "{run}/config.json: objective_params=[1, 2] is invalid; valid: a mapping"),
    "config value": (None, {"objective_params": {"eps_high": "abc"}},
                     "{run}/config.json: parameter eps_high='abc' is invalid; valid: a float in [0, inf] (the config "
                     "file is damaged)"),
}


@pytest.mark.parametrize("case", list(REPLAY_CASES))
def test_damaged_recorded_batches_are_one_line_naming_file_and_array(tmp_path: Path, case: str,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    import numpy as np

    change, config, message = REPLAY_CASES[case]
    run = recorded(tmp_path / "rec")
    file = sorted((run / "samples").glob("*.npz"))[0]
    if change is not None:
        with np.load(file) as data:
            arrays = {key: data[key] for key in data.files}
        change(arrays)
        np.savez(file, **arrays)
    if config is not None:
        stored = json.loads((run / "config.json").read_text())
        (run / "config.json").write_text(json.dumps({**stored, **config}))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # numpy's "mean of empty slice" and friends
        err = refused(["replay", str(run), "--out", str(tmp_path / "r")], capsys)
    assert message.format(file=file, run=run) in err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("dtype", ["int32", "float16"])
def test_integer_and_float16_batches_replay_as_float32(tmp_path: Path, dtype: str) -> None:
    import numpy as np

    run = recorded(tmp_path / "rec")
    file = sorted((run / "samples").glob("*.npz"))[0]
    with np.load(file) as data:
        arrays = {key: data[key] for key in data.files}
    for key in ("batch_log_ratio", "batch_mask", "batch_advantage"):
        arrays[key] = np.round(arrays[key]).astype(dtype) if dtype == "int32" else arrays[key].astype(dtype)
    np.savez(file, **arrays)
    assert cli.main(["replay", str(run), "--out", str(tmp_path / "r")]) == 0
    assert (tmp_path / "r" / "replay.csv").exists()


# ------------------------------------------------------------------------------- 6: refused before anything is written
BANDIT = ["run", "--world", "bandit", "--objective", "grpo", "--updates", "2"]


@pytest.mark.parametrize(("flags", "message"), [
    (["--param", "kl_coef=inf"], "parameter kl_coef=inf is out of range; valid: a float in [0, inf)"),
    (["--param", "entropy_coef=inf"], "parameter entropy_coef=inf is out of range; valid: a float in [0, inf)"),
    (["--eval-samples", "100000000000"], "eval_samples=100,000,000,000 × 1 evaluation prompts = 100,000,000,000 "
                                         "responses need at least"),
], ids=["kl_coef", "entropy_coef", "eval_samples"])
def test_parameters_out_of_their_range_are_refused_before_the_run_directory(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str) -> None:
    err = refused([*BANDIT, *flags, "--out", str(tmp_path / "run")], capsys)
    assert message in err
    assert not (tmp_path / "run").exists()


def test_a_tracker_that_cannot_be_opened_is_refused_before_config_json(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from offpolicylab import tracking

    def broken(*args: object) -> None:
        raise ImportError("libtensorboard.so: cannot open shared object file")

    monkeypatch.setattr(tracking, "TensorBoardSink", broken)
    run = tmp_path / "run"
    err = refused([*BANDIT, "--report-to", "tensorboard", "--out", str(run)], capsys)
    assert err == ("offpolicylab: error: --report-to tensorboard cannot be opened (ImportError: libtensorboard.so: "
                   "cannot open shared object file); valid: a run directory this user can write, or another "
                   "--report-to")
    assert not (run / "config.json").exists() and not (run / "tracking").exists()
    assert cli.main([*BANDIT, "--out", str(run)]) == 0  # the same folder, without the tracker: no "already holds"


def test_an_unreachable_mlflow_server_is_refused_within_seconds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    import socket
    import time

    pytest.importorskip("mlflow")
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    began = time.monotonic()
    err = refused([*BANDIT, "--report-to", "mlflow", "--out", str(tmp_path / "run")], capsys)
    assert time.monotonic() - began < 30
    assert f"--report-to mlflow cannot be opened (ConnectionError: MLflow server http://127.0.0.1:{port} cannot " \
           "be reached within 5 s" in err
    assert not (tmp_path / "run" / "config.json").exists()


# ------------------------------------------------------------------------------- 1, 2: damaged profile files
@pytest.mark.parametrize(("case", "message"), [
    ("wrong type", "profile {file}: not_recorded=[['x']]; valid: a list of statistic names"),
    ("long number", "profile {file}: a number of 401 digits; valid: at most 100 digits"),
    ("deep", "profile {file}: not valid JSON (nested too deeply); valid: a JSON object (docs/calibration.md)"),
    ("latin-1", "profile {file}: not UTF-8 text (invalid continuation byte at byte 1); valid: a JSON object in "
                "UTF-8 (docs/calibration.md)"),
], ids=["wrong type", "long number", "deep", "latin-1"])
def test_damaged_profiles_are_one_line_naming_the_file(tmp_path: Path, case: str, message: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from offpolicylab.profile_files import list_profiles, load_profile

    good = load_profile(list_profiles()[0])
    file = tmp_path / "p.json"
    if case == "wrong type":
        file.write_text(json.dumps({**good, "not_recorded": [["x"]]}))
    elif case == "long number":
        file.write_text(json.dumps({**good, "profile": {**good["profile"], "mean_entropy": 10**400}}))
    elif case == "deep":
        file.write_text("[" * 100_000 + "]" * 100_000)
    else:
        file.write_bytes(b'{\xe9"model": 1}')
    err = refused(["profiles", "show", str(file)], capsys)
    assert err == f"offpolicylab: error: {message.format(file=file)}"


# ------------------------------------------------------------------------------- 7: a damaged TensorBoard file
def test_a_tensorboard_file_damaged_mid_way_is_refused_and_a_torn_end_noted(tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("tensorboard")
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "tb"))
    for step in range(40):
        writer.add_scalar("critic/score/mean", 0.01 * step, step)
    writer.close()
    file = next((tmp_path / "tb").glob("events.out.tfevents.*"))
    data = file.read_bytes()
    middle = len(data) // 2
    file.write_bytes(data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:])
    err = refused(["analyze", str(tmp_path / "tb"), "--out", str(tmp_path / "a")], capsys)
    assert f"{file}: record " in err and "is damaged (its CRC-32C checksum fails), so every later record would be " \
                                         "lost; valid: event files a SummaryWriter wrote" in err
    file.write_bytes(data[:-7])  # a writer killed mid-record
    assert cli.main(["analyze", str(tmp_path / "tb"), "--out", str(tmp_path / "a")]) == 0
    assert f"note: {file}: a torn last record (cut short at byte" in capsys.readouterr().out
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["steps"] == 39


def test_batched_gru_seeds_with_a_reduced_precision_sampler_write_nothing(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """docs/bad_input.md said the seeds' config.json was already written when this was refused; it is not."""
    err = refused(["run", "--world", "token_mdp", "--objective", "grpo", "--policy", "sequence_model",
                   "--policy-param", "sampler_precision=bf16", "--seeds", "0,1", "--updates", "2", "--out",
                   str(tmp_path / "out")], capsys)
    assert "batched sequence_model seeds need sampler_precision=fp32, got 'bf16'" in err
    assert not (tmp_path / "out").exists()


def test_batched_compiled_transformer_seeds_and_an_unknown_token_draw_write_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["run", "--world", "token_mdp", "--objective", "grpo", "--policy", "transformer", "--policy-param",
            "init=random", "--updates", "2", "--out", str(tmp_path / "out")]
    err = refused([*base, "--policy-param", "compiled=true", "--seeds", "0,1"], capsys)
    assert "batched transformer seeds need compiled=false" in err
    err = refused([*base, "--policy-param", "token_draw=gumbel"], capsys)
    assert "token_draw='gumbel' is invalid; valid: one of race, inverse_cdf" in err
    assert not (tmp_path / "out").exists()


def test_the_swap_without_renameat2_and_a_kill_between_its_renames(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the kernel lacks RENAME_EXCHANGE the swap takes two renames; an output a kill left moved aside is put
    back by the next writer before it stages anything."""
    from offpolicylab import output

    monkeypatch.setattr(output, "_exchange", lambda a, b: False)
    out = tmp_path / "out"
    writer = output.OutputWriter(out, "analyze", analyze.owns, "summary.json and figures")
    for text in ("old", "new"):
        with writer.staging() as folder:
            (folder / "summary.json").write_text(text)
    assert (out / "summary.json").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    pid = dead_pid()
    out.rename(tmp_path / f".out.old-{pid}")  # killed after moving the old output aside
    (tmp_path / f".out.tmp-{pid}").mkdir()
    output.clean_leftovers(tmp_path, "out")
    assert (out / "summary.json").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_batched_seed_whose_tracker_fails_leaves_every_seed_unwritten(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Seed 1's tracker fails after seed 0's opened: no seed gets a config.json (the command checks all first)."""
    from offpolicylab import tracking

    real, opened = tracking.TensorBoardSink, []

    def second_fails(*args: object) -> object:
        if opened:
            raise OSError(errno.EACCES, "Permission denied")
        opened.append(real(*args))
        return opened[-1]

    monkeypatch.setattr(tracking, "TensorBoardSink", second_fails)
    out = tmp_path / "out"
    err = refused(["run", "--world", "bandit", "--objective", "grpo", "--updates", "2", "--seeds", "0,1",
                   "--report-to", "tensorboard", "--out", str(out)], capsys)
    assert "--report-to tensorboard cannot be opened (PermissionError: [Errno 13] Permission denied)" in err
    assert not list(out.rglob("config.json"))
