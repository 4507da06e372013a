"""Commands that do long work validate first: ``calibrate`` refuses an output it could not write, bad options and
bad files before it loads or samples anything; ``convert-gguf`` refuses an output folder it could not create before
it loads the model; damaged model files and GSM8k data give one line naming the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from offpolicylab import calibrate as calibrate_module
from offpolicylab.policies import hf_loading
from tests.cli.test_cli import run_cli

ROWS = [{"question": "What is 1 plus 2?", "answer": "so\n#### 3"}, {"question": "What is 3 plus 4?", "answer": "#### 7"}]


@pytest.fixture
def inputs(tmp_path: Path) -> dict[str, Path]:
    """A model folder that passes the file checks (config.json + tokenizer.json, never loaded here) and GSM8k data."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (model / "tokenizer.json").write_text("{}")
    data = tmp_path / "gsm8k"
    data.mkdir()
    (data / "test.jsonl").write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    return {"model": model, "data": data}


@pytest.fixture
def no_loading(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Loading a model fails the test (and is recorded): the commands must refuse before."""
    loads: list[str] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        loads.append(str(args[0]) if args else "?")
        raise AssertionError("the model was loaded before the input was validated")

    monkeypatch.setattr(calibrate_module, "_load_policy", refuse)
    monkeypatch.setattr(hf_loading, "load_model_and_tokenizer", refuse)
    return loads


def calibrate(inputs: dict[str, Path], out: Path | str, *extra: str) -> list[str]:
    return ["calibrate", "--model", str(inputs["model"]), "--data", str(inputs["data"]), "--n-prompts", "2",
            "--max-new-tokens", "4", "--out", str(out), *extra]


# ============================================================================================ calibrate
@pytest.mark.parametrize(("out", "message"), [
    ("{model}/config.json/profile.json", "--out {model}/config.json/profile.json cannot be created: "
                                         "{model}/config.json is a file"),
    ("{model}", "--out '{model}' is a directory; valid: a file path such as profile.json"),
    ("", "--out '' is a directory; valid: a file path such as profile.json"),
])
def test_calibrate_refuses_an_output_it_cannot_write_before_loading(inputs: dict[str, Path], no_loading: list[str],
                                                                    out: str, message: str,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(calibrate(inputs, out.format(model=inputs["model"])), capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert message.format(model=inputs["model"]) in err
    assert no_loading == []


@pytest.mark.parametrize(("extra", "message"), [
    (["--seed", "-1"], "seed=-1 is out of range; valid: an integer in [0, 4294967295]"),
    (["--seed", "99999999999999999999999"], "seed=99999999999999999999999 is out of range"),
    (["--temperature", "nan"], "temperature=nan is invalid; valid: a finite float > 0"),
    (["--samples-per-prompt", "0"], "samples_per_prompt=0 is invalid; valid: an integer >= 1"),
    (["--n-prompts", "5"], "n_prompts=5 is invalid; valid: an integer in [1, 2]"),
])
def test_calibrate_refuses_bad_options_before_loading(inputs: dict[str, Path], no_loading: list[str],
                                                      tmp_path: Path, extra: list[str], message: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    args = calibrate(inputs, tmp_path / "p.json", *extra)
    code, _, err = run_cli(args, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert message in err and no_loading == [] and not (tmp_path / "p.json").exists()


def test_calibrate_names_what_a_model_folder_lacks(inputs: dict[str, Path], no_loading: list[str], tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = run_cli(calibrate({**inputs, "model": empty}, tmp_path / "p.json"), capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"model directory '{empty}' holds no tokenizer" in err and "sentencepiece" not in err
    (empty / "tokenizer.json").write_text("{}")
    code, _, err = run_cli(calibrate({**inputs, "model": empty}, tmp_path / "p.json"), capsys)
    assert code == 2 and f"model directory '{empty}' holds no config.json" in err
    (empty / "config.json").write_text("[1]")
    code, _, err = run_cli(calibrate({**inputs, "model": empty}, tmp_path / "p.json"), capsys)
    assert code == 2 and "config.json holds a JSON list" in err
    not_gguf = tmp_path / "m.gguf"
    not_gguf.write_bytes(b"not a gguf at all")
    code, _, err = run_cli(calibrate({**inputs, "model": not_gguf}, tmp_path / "p.json"), capsys)
    assert code == 2 and "is not a GGUF file (it does not start with the GGUF magic bytes)" in err
    assert no_loading == []


@pytest.mark.parametrize(("content", "message"), [
    (b'{"question": "q", "answer": "#### 1"}\n\xff\xfe\n', "test.jsonl:2: not UTF-8 text"),
    (b'{"question": 5, "answer": "#### 1"}\n', "test.jsonl:1: a GSM8k row's question must be a string, got int"),
    (b'{"question": "q", "answer": 7}\n', "test.jsonl:1: a GSM8k row's answer must be a string, got int"),
    (b"[" * 100_000 + b"]" * 100_000 + b"\n", "test.jsonl:1: not valid JSON (nested too deeply)"),
], ids=["not UTF-8", "question an int", "answer an int", "nested too deeply"])
def test_damaged_gsm8k_data_names_the_file_and_line(inputs: dict[str, Path], no_loading: list[str],
                                                    tmp_path: Path, content: bytes, message: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    (inputs["data"] / "test.jsonl").write_bytes(content)
    code, _, err = run_cli(calibrate(inputs, tmp_path / "p.json"), capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert message in err and str(inputs["data"]) in err


def test_calibrate_has_the_flag_its_refusal_names() -> None:
    """The custom-code refusal says "pass --trust-remote-code": calibrate accepts that flag (off by default)."""
    from offpolicylab.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["calibrate", "--model", "m", "--data", "d", "--out", "o"]).trust_remote_code is False
    assert parser.parse_args(["calibrate", "--model", "m", "--data", "d", "--out", "o",
                              "--trust-remote-code"]).trust_remote_code is True


# ============================================================================================ convert-gguf
def test_convert_gguf_refuses_an_output_it_cannot_create_before_loading(tmp_path: Path, no_loading: list[str],
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "m.gguf"
    source.write_bytes(b"GGUF" + bytes(60))
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, _, err = run_cli(["convert-gguf", str(source), str(blocker / "out")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"convert-gguf: OUT {blocker / 'out'} cannot be created: {blocker} is a file" in err
    assert no_loading == []


@pytest.mark.llm
@pytest.mark.parametrize("damage", ["empty", "magic only", "truncated header", "truncated tensors", "random bytes",
                                    "unknown version", "garbage after the magic"])
def test_a_damaged_gguf_file_gives_one_line(tmp_path: Path, damage: str, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("gguf")
    pytest.importorskip("transformers")
    from tests.tiny_llm import write_tiny_gguf

    write_tiny_gguf(str(tmp_path / "good.gguf"))
    good = (tmp_path / "good.gguf").read_bytes()
    content = {
        "empty": b"", "magic only": b"GGUF", "truncated header": good[:40], "truncated tensors": good[:len(good) // 2],
        "random bytes": bytes(range(256)) * 8, "unknown version": good[:4] + (99).to_bytes(4, "little") + good[8:],
        "garbage after the magic": b"GGUF" + bytes(reversed(range(256))) * 8,
    }[damage]
    (tmp_path / "bad.gguf").write_bytes(content)

    code, _, err = run_cli(["convert-gguf", str(tmp_path / "bad.gguf"), str(tmp_path / "out")], capsys)

    ours = [line for line in err.splitlines() if line.startswith("offpolicylab")]
    assert code == 2 and len(ours) == 1, err
    assert str(tmp_path / "bad.gguf") in ours[0] and "Traceback" not in err
    assert not (tmp_path / "out").exists()
