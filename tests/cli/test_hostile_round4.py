"""Hostile input, round four (docs/bad_input.md): each root cause once — every number a parameter holds is range-
and NaN-checked where parameters are parsed; a setting given twice is refused naming both, whether in a correction
spec, by flags or in a file; a malformed correction says the ``engine:key=value`` form; replay says when samples lack
the sampler's log-probs; a missing file is said to be missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from offpolicylab import cli
from offpolicylab.objectives import TokenBatch, get_objective
from tests.cli.test_hostile_inputs import refused

RUN = ["run", "--world", "three_arm_pitfall", "--objective", "grpo", "--updates", "2"]
FORM = "valid: engine:key=value:... (engine one of verl, trl, openrlhf, slime, skyrl, areal"


# ------------------------------------------------------------------ every number checked where parameters are parsed
@pytest.mark.parametrize("spec", [
    "verl:rollout_is_threshold=nan",
    "verl:rollout_is_threshold=-1",
    "verl:rollout_is_threshold=0.5_nan",
    "verl:rollout_rs=token_k1:rollout_rs_threshold=nan",
    "verl:rollout_rs=token_k1,seq_max_k2:rollout_rs_threshold=0.5_2.0,nan",
    "openrlhf:vllm_is_truncated_threshold=nan,5",
])
def test_a_nan_or_negative_threshold_is_refused_before_the_run(spec: str, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    err = refused([*RUN, "--param", f"correction={spec}", "--out", str(out)], capsys)
    assert "is out of range; valid:" in err and "threshold" in err, err
    assert not out.exists()


def test_the_range_of_a_threshold_holds_every_number_it_spells() -> None:
    from offpolicylab.corrections import parse_spec

    assert parse_spec("verl:rollout_is_threshold=0.5_2.0").params == {"rollout_is_threshold": "0.5_2.0"}
    assert parse_spec("verl:rollout_is_threshold=inf").params == {"rollout_is_threshold": "inf"}  # no truncation
    with pytest.raises(ValueError, match=r"rollout_is_threshold='0_2' is out of range; valid: a number, "
                                         r"\"lower_upper\" or comma-separated ones \(each in \(0, inf\]\)"):
        parse_spec("verl:rollout_is_threshold=0_2")
    with pytest.raises(ValueError, match=r"tok_bounds=\(nan, 2.0\) is out of range"):  # a list's items too
        get_objective("ac_mispo", tok_bounds="nan,2")


# ----------------------------------------------------------------------------- a setting given twice: one rule
@pytest.mark.parametrize(("argv", "message"), [
    (["--max-steps", "3", "--updates", "2"], "run: --max-steps 3 and --updates 2 name the same setting updates; "
                                            "valid: one of them"),
    (["--updates", "2", "--updates", "3"], "run: --updates 2 and --updates 3 name the same setting updates"),
    (["--clip-ratio-low", "0.1", "--clip-ratio-low", "0.2"],
     "--clip-ratio-low 0.1 and --clip-ratio-low 0.2 name the same setting clip_ratio_low"),
    (["--param", "eps_low=0.1", "--param", "eps_low=0.2"],
     "--param eps_low=0.1 and --param eps_low=0.2 name the same setting eps_low; valid: one of them"),
    (["--param", "correction=verl:rollout_is=token:rollout_is=sequence"],
     "rollout_is=token and rollout_is=sequence name the same setting rollout_is"),
])
def test_a_setting_given_twice_on_the_command_line_is_refused_naming_both(argv: list[str], message: str,
                                                                         tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    base = [flag for i, flag in enumerate(RUN) if "--updates" not in RUN[max(i - 1, 0):i + 1]]
    out = tmp_path / "out"
    err = refused([*base, *argv, "--out", str(out)], capsys)
    assert message in err, err
    assert not out.exists()


def test_a_setting_given_twice_in_a_file_or_replay_spec_is_refused_naming_both(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "twice.json").write_text('{"world": "three_arm_pitfall", "objective": "grpo", "updates": 2, '
                                         '"max_steps": 3}')
    err = refused(["run", "--config", str(tmp_path / "twice.json"), "--out", str(tmp_path / "a")], capsys)
    assert "config fields updates=2 and max_steps=3 name the same setting updates; valid: one of them" in err, err
    (tmp_path / "c.yaml").write_text("world: three_arm_pitfall\nobjective: grpo\n"
                                     "objective_params:\n  correction: verl:rollout_is=token:rollout_is=sequence\n")
    err = refused(["run", "--config", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "b")], capsys)
    assert "rollout_is=token and rollout_is=sequence name the same setting rollout_is" in err, err
    recording = recorded_with_sampler(tmp_path / "rec", [True])
    err = refused(["replay", str(recording), "--objectives", "grpo", "--corrections",
                   "verl:rollout_is=token:rollout_is=sequence", "--out", str(tmp_path / "c")], capsys)
    assert "rollout_is=token and rollout_is=sequence name the same setting rollout_is" in err, err
    assert not (tmp_path / "c").exists()


# -------------------------------------------------------------------- a malformed correction says the valid form
@pytest.mark.parametrize(("value", "why"), [
    ("verl:rollout_is", "'rollout_is' is not key=value"),
    ("verl:=token", "'=token' is not key=value"),
])
def test_a_malformed_correction_states_the_engine_key_value_form(value: str, why: str, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    err = refused([*RUN, "--param", f"correction={value}", "--out", str(tmp_path / "out")], capsys)
    assert why in err and FORM in err, err
    err = refused(["replay", str(recorded_with_sampler(tmp_path / "rec", [True])), "--objectives", "grpo",
                   "--corrections", value, "--out", str(tmp_path / "o")], capsys)
    assert why in err and FORM in err, err


@pytest.mark.parametrize("text", ["correction: 5", "correction: {rollout_is: token}"])
def test_a_correction_in_a_file_that_is_no_correction_states_the_form(text: str, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "c.yaml").write_text(f"world: three_arm_pitfall\nobjective: grpo\nobjective_params:\n  {text}\n")
    err = refused(["run", "--config", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "out")], capsys)
    assert "parameter correction=" in err and FORM in err, err


# ----------------------------------------------------------------- replay: samples without the sampler's log-probs
def mismatched(seed: int, sampler: bool) -> TokenBatch:
    import torch

    gen = torch.Generator().manual_seed(seed)
    delta = 0.2 * torch.randn(3, 5, generator=gen, dtype=torch.float64)
    mask = torch.ones(3, 5, dtype=torch.float64)
    return TokenBatch(logp=delta, behavior_logp=torch.zeros_like(delta), mask=mask,
                      advantages=torch.randn(3, generator=gen, dtype=torch.float64),
                      sampler_logp=-0.3 * torch.randn(3, 5, generator=gen, dtype=torch.float64) if sampler else None)


def recorded_with_sampler(path: Path, sampler: list[bool]) -> Path:
    """A recording of one step per entry of ``sampler``; True: its batch carries the sampler's log-probs."""
    from offpolicylab.integrations.record import Recorder

    recorder = Recorder(path, {"engine": "test", "objective": "grpo", "objective_params": {}}, 1)
    scorer = get_objective("grpo")
    for seed, with_sampler in enumerate(sampler):
        batch = mismatched(seed, with_sampler)
        recorder.add(batch, scorer(batch), staleness=1)
        recorder.end_step(reward_mean=0.5)
    recorder.close()
    return path


def test_replay_corrections_refuses_samples_half_without_the_sampler_logprobs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recording = recorded_with_sampler(tmp_path / "rec", [True, False])
    out = tmp_path / "out"
    err = refused(["replay", str(recording), "--objectives", "grpo", "--corrections", "trl", "--out", str(out)],
                  capsys)
    assert "1 of 2 sample files have no sampler log-probs (batch_sampler_log_ratio: update_000001.npz)" in err, err
    assert "--updates FIRST:LAST" in err
    assert not out.exists()
    assert cli.main(["replay", str(recording), "--objectives", "grpo", "--corrections", "trl", "--updates", "0:0",
                     "--out", str(out)]) == 0


# ------------------------------------------------------------------------------------ a missing file is missing
def test_convert_gguf_on_a_missing_file_says_it_does_not_exist(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")
    err = refused(["convert-gguf", str(tmp_path / "nope.gguf"), str(tmp_path / "OUT")], capsys)
    assert "nope.gguf' does not exist; valid: a .gguf file" in err, err
    (tmp_path / "model.bin").write_text("x")
    err = refused(["convert-gguf", str(tmp_path / "model.bin"), str(tmp_path / "OUT")], capsys)
    assert "is not a .gguf file" in err, err
    assert not (tmp_path / "OUT").exists()


# ------------------------------------------------------------- one reader of logged values: a non-number is noted
@pytest.mark.parametrize("bad", ['"0.7"', "true", '{"mean": 0.7}', "[1, 2]"])
def test_a_reward_that_is_no_number_is_noted_naming_its_step(bad: str, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    import json

    log = tmp_path / "verl.jsonl"
    values = ["0.5", bad, "0.6", "0.4"]
    log.write_text("".join(f'{{"step": {step}, "data": {{"critic/score/mean": {value}}}}}\n'
                           for step, value in enumerate(values, 1)))
    assert cli.main(["analyze", str(log), "--out", str(tmp_path / "out")]) == 0
    note = f"{log}: critic/score/mean logs 1 value(s) that are not numbers (first at step 2: "
    assert f"note: {note}" in capsys.readouterr().out
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert any(text.startswith(note) for text in summary["notes"]), summary["notes"]
    assert summary["final_reward"] == 0.4 and summary["steps"] == 3


def test_a_text_value_in_our_metrics_csv_is_noted_by_analyze(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from tests.cli.test_hostile_inputs import small_run

    run = small_run(tmp_path / "run")
    text = (run / "metrics.csv").read_text().splitlines()
    header = text[0].split(",")
    cells = text[2].split(",")
    cells[header.index("reward_mean")] = "high"
    (run / "metrics.csv").write_text("\n".join([*text[:2], ",".join(cells), *text[3:]]) + "\n")
    assert cli.main(["analyze", str(run), "--out", str(tmp_path / "out")]) == 0
    assert "reward_mean logs 1 value(s) that are not numbers (first at step 1: 'high'), left out" in \
        capsys.readouterr().out


# ------------------------------------------------------- one metrics.csv reader: the header checked before the rows
def header_damaged(run: Path, how: str) -> Path:
    lines = (run / "metrics.csv").read_text().split("\n")
    names = lines[0].split(",")
    if how == "a name removed":
        del names[2]
    elif how == "a name blank":
        names[2] = ""
    else:
        names[2] = names[1]
    lines[0] = ",".join(names)
    (run / "metrics.csv").write_text("\n".join(lines))
    return run


@pytest.mark.parametrize(("how", "message"), [
    ("a name removed", "metrics.csv:2: 4 values but the header names 3 columns, so they would be read under other "
                       "columns' names; the metrics file is damaged"),
    ("a name blank", "metrics.csv:1: the header column 3 has no name; the metrics file is damaged"),
    ("a name twice", "metrics.csv:1: the header names loss twice; the metrics file is damaged"),
])
@pytest.mark.parametrize("command", ["analyze", "plot"])
def test_a_damaged_metrics_header_is_refused_before_any_row_is_read(how: str, message: str, command: str,
                                                                    tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from tests.cli.test_hostile_inputs import small_run

    run = header_damaged(small_run(tmp_path / "run"), how)
    out = tmp_path / "out"
    try:
        code = cli.main([command, str(run), "--out", str(out)])
    except SystemExit as stop:
        code = stop.code
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err and "Traceback" not in err, err
    assert not out.exists() or not any(out.iterdir())


def test_profiles_show_refuses_a_sampling_that_is_a_string(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from offpolicylab.profile_files import load_profile

    doc = load_profile("qwen3_8b_cot")
    (tmp_path / "p.json").write_text(json.dumps({**doc, "sampling": "temperature 1"}))
    err = refused(["profiles", "show", str(tmp_path / "p.json")], capsys)
    assert "sampling='temperature 1'; valid: a JSON object of the sampling settings" in err, err


# ------------------------------------------------------------------------------- a run's own config.json reused
def test_run_config_accepts_a_runs_own_config_json_and_reruns_it(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """config.json = the run's settings + an environment record (package versions, git commit): --config takes it,
    ignores the record with a note, and the run it starts is the same run (same settings, same metrics)."""
    import json

    first, again = tmp_path / "first", tmp_path / "again"
    assert cli.main([*RUN, "--seed", "3", "--out", str(first)]) == 0
    capsys.readouterr()
    assert cli.main(["run", "--config", str(first / "config.json"), "--out", str(again)]) == 0
    err = capsys.readouterr().err
    assert (f"offpolicylab: note: --config {first / 'config.json'} is a run's config.json; its environment record "
            "(the versions it ran with) is not a setting and is ignored") in err
    settings = [json.loads((run / "config.json").read_text()) for run in (first, again)]
    assert "environment" in settings[0] and "environment" in settings[1]
    same = [{k: v for k, v in s.items() if k != "environment"} for s in settings]
    assert same[0] == same[1]
    import csv

    rows = [[{k: v for k, v in row.items() if not k.startswith("time_")}  # the clock differs, nothing else
             for row in csv.DictReader((run / "metrics.csv").open())] for run in (first, again)]
    assert rows[0] == rows[1] and len(rows[0]) == 2


def test_an_environment_key_that_is_no_record_is_still_an_unknown_key(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "c.json").write_text('{"world": "three_arm_pitfall", "objective": "grpo", "environment": "gpu"}')
    err = refused(["run", "--config", str(tmp_path / "c.json"), "--out", str(tmp_path / "out")], capsys)
    assert "unknown config key(s) environment" in err, err
