"""A resume checks the LoRA adapter folder before it trains: ``RUN/adapter`` replaced by a file is refused with one
line naming it (exit 2), and nothing is changed — the file stays, no ``adapter.staging`` is left, the summary is
not marked failed — instead of training every update and failing when the adapter is saved."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

from offpolicylab import cli  # noqa: E402
from tests.tiny_llm import build_tokenizer, save_model_and_data  # noqa: E402

pytestmark = pytest.mark.llm


def llm_args(root: Path, out: Path, updates: int) -> list[str]:
    rows = [{"question": f"What is {a} plus {b}?", "answer": f"{a} + {b} = {a + b}\n#### {a + b}"}
            for a, b in [(1, 2), (3, 4)]]
    if not root.exists():
        save_model_and_data(root, build_tokenizer([f"#### {d}" for d in range(8)]), rows, ["train", "test"])
    files = {"model": root / "model", "data": root / "gsm8k"}
    return ["run", "--world", "gsm8k", "--model", str(files["model"]), "--world-param", f"data={files['data']}",
            "--world-param", "max_response_len=4", "--world-param", "n_eval=1", "--objective", "grpo",
            "--prompts-per-update", "2", "--group-size", "2", "--updates", str(updates), "--eval-every", "10",
            "--checkpoint-every", "1", "--seed", "0", "--out", str(out)]


@pytest.mark.parametrize("where", ["adapter", "checkpoint/adapter.old"])
def test_a_resume_refuses_a_file_where_the_adapter_folder_belongs_before_training(
        where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "run"
    assert cli.main(llm_args(tmp_path / "model", out, 2)) == 0
    if where == "adapter":
        import shutil

        shutil.rmtree(out / "adapter")
    (out / where).write_text("my notes")
    summary = (out / "summary.json").read_text()
    metrics = (out / "metrics.csv").read_text()
    capsys.readouterr()

    from offpolicylab import trainer

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("training started before the adapter folder was checked")

    monkeypatch.setattr(trainer, "run_updates", never)
    with pytest.raises(SystemExit) as stop:
        cli.main([*llm_args(tmp_path / "model", out, 3)[:-2], "--resume", "--out", str(out)])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip() and "Loading weights" not in line]
    assert stop.value.code == 2 and len(lines) == 1, lines  # the one line (beside transformers' progress bar)
    err = lines[0]
    assert f"{out / where} is not a folder (a file or a link where the run keeps its LoRA adapter)" in err, err
    assert "valid: move it away" in err
    assert (out / where).read_text() == "my notes"
    assert not (out / "checkpoint" / "adapter.staging").exists()
    assert (out / "summary.json").read_text() == summary and json.loads(summary)["status"] == "completed"
    assert (out / "metrics.csv").read_text() == metrics
