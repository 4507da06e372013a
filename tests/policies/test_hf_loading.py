"""Model loading runs no model-folder code unless asked; LLM-world bad input; strict GSM8k numbers; bad jsonl."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from offpolicylab.config import TrainConfig
from offpolicylab.policies import hf_loading
from offpolicylab.worlds.gsm8k import extract_answer, load_problems

pytestmark = pytest.mark.llm
REPO = Path(__file__).resolve().parents[2]
CUSTOM_CODE = '''import os
open(os.environ["MARKER"], "w").write("the model folder's code ran")
from transformers import PretrainedConfig, PreTrainedModel
class CustomConfig(PretrainedConfig):
    model_type = "custom"
class CustomModel(PreTrainedModel):
    config_class = CustomConfig
'''


@pytest.fixture
def custom_code_model(tmp_path: Path) -> Path:
    """A model folder whose config asks transformers to import its own ``custom.py`` (which leaves a marker)."""
    folder = tmp_path / "custom_model"
    folder.mkdir()
    (folder / "custom.py").write_text(CUSTOM_CODE)
    auto_map = {"AutoConfig": "custom.CustomConfig", "AutoModelForCausalLM": "custom.CustomModel"}
    (folder / "config.json").write_text(json.dumps({"model_type": "custom", "auto_map": auto_map}))
    (folder / "tokenizer_config.json").write_text(json.dumps({"auto_map": {"AutoTokenizer": ["custom.CustomConfig",
                                                                                             None]}}))
    return folder


def test_a_model_folders_code_never_runs_even_when_stdin_says_yes(custom_code_model: Path, tmp_path: Path,
                                                                  data_dir: Path) -> None:
    marker = tmp_path / "marker"
    env = {**os.environ, "MARKER": str(marker), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO),
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "offpolicylab", "run", "--world", "gsm8k", "--model",
                           str(custom_code_model), "--world-param", f"data={data_dir}", "--objective", "grpo",
                           "--out", str(tmp_path / "run")], input="y\ny\n", env=env, capture_output=True, text=True,
                          timeout=300)
    ours = [line for line in proc.stderr.splitlines() if line.startswith("offpolicylab")]
    assert proc.returncode == 2 and len(ours) == 1, proc.stderr  # (transformers may log a warning of its own)
    assert "contains custom code, which offpolicylab does not run; pass --trust-remote-code" in ours[0]
    assert not marker.exists() and not (tmp_path / "run").exists()


def test_trust_remote_code_is_false_everywhere_unless_the_user_opts_in(monkeypatch: pytest.MonkeyPatch) -> None:
    import transformers

    seen: list[tuple[str, Any]] = []

    class Loaded:
        pad_token_id, eos_token = 0, "<eos>"

        def to(self, device: Any) -> Loaded:
            return self

    def recorder(name: str) -> Any:
        def from_pretrained(model: str, **kwargs: Any) -> Loaded:
            seen.append((name, kwargs.get("trust_remote_code", "missing")))
            return Loaded()
        return from_pretrained

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", recorder("tokenizer"))
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", recorder("model"))
    hf_loading.load_model_and_tokenizer("some/model")
    assert seen == [("tokenizer", False), ("model", False)]
    try:
        hf_loading.allow_remote_code(True)
        hf_loading.load_model_and_tokenizer("some/model")
    finally:
        hf_loading.allow_remote_code(False)
    assert seen[2:] == [("tokenizer", True), ("model", True)]


def test_no_config_file_can_turn_remote_code_on(tmp_path: Path, data_dir: Path, tokenizer: Any) -> None:
    from offpolicylab.build import build

    tokenizer.save_pretrained(tmp_path / "tok")
    world = {"model": str(tmp_path / "tok"), "data": str(data_dir), "n_eval": 1}
    assert "trust_remote_code" not in TrainConfig().to_dict()
    for params in ({"world_params": {**world, "trust_remote_code": True}},
                   {"world_params": world, "policy_params": {"trust_remote_code": True}}):
        with pytest.raises(ValueError, match="no parameter trust_remote_code"):
            build(TrainConfig(world="gsm8k", policy="hf", **params))
    assert not hf_loading.remote_code_allowed()


def test_a_tabular_policy_on_gsm8k_is_refused(tmp_path: Path, data_dir: Path, tokenizer: Any,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from offpolicylab import cli

    tokenizer.save_pretrained(tmp_path / "tok")
    with pytest.raises(SystemExit) as exit_:
        cli.main(["run", "--world", "gsm8k", "--model", str(tmp_path / "tok"), "--policy", "tabular",
                  "--world-param", f"data={data_dir}", "--world-param", "n_eval=1", "--objective", "grpo",
                  "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "policy 'tabular' cannot act in a world that names a language model (GSM8kWorld); valid: --policy hf" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("text", ["#### ４２", "#### 4,2", "#### 12,34,567", "#### 1,2345", "\\boxed{4,2}",
                                  "the answer is ٤٢", "#### 42,0"])
def test_unicode_digits_and_misplaced_commas_are_not_answers(text: str) -> None:
    assert extract_answer(text) is None


@pytest.mark.parametrize(("text", "expected"), [("#### 1,234", "1234"), ("#### 12,345,678.5", "12345678.5"),
                                                ("#### 42, so", "42"), ("#### 1234", "1234")])
def test_ascii_numbers_with_thousands_groups_are_answers(text: str, expected: str) -> None:
    assert extract_answer(text) == Decimal(expected)


@pytest.mark.parametrize(("line", "message"), [
    ("not json", r"train.jsonl:2: not valid JSON \(Expecting value at column 1\)"),
    ("[1, 2]", r"train.jsonl:2: a GSM8k row needs 'question' and 'answer', got a JSON list"),
    ('{"question": "q", "answer": "#### ４"}', r"train.jsonl:2: GSM8k answer has no '#### N' final answer"),
])
def test_a_bad_jsonl_line_is_named(tmp_path: Path, line: str, message: str) -> None:
    (tmp_path / "train.jsonl").write_text(json.dumps({"question": "q", "answer": "#### 1"}) + "\n" + line + "\n")
    with pytest.raises(ValueError, match=message):
        load_problems(tmp_path, "train")


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "data"
    folder.mkdir()
    for split in ("train", "test"):
        (folder / f"{split}.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n")
    return folder
