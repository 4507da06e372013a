"""`offpolicylab profiles list | show`: packaged and file profiles side by side, and one-line refusals (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from offpolicylab import cli
from tests.diagnostics.test_profile import measured, published


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = cli.main(args)
    except SystemExit as exc:
        code = int(exc.code)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_list_names_each_packaged_profile_with_its_source(capsys):
    code, out, _ = run(["profiles", "list"], capsys)
    lines = out.splitlines()
    assert code == 0 and len(lines) == 2
    assert lines[0].startswith("qwen3_8b_cot  [published]") and "arXiv:2506.01939" in lines[0]
    assert lines[1].startswith("smollm2_135m_instruct_gsm8k  [measured]")


def test_show_prints_two_or_three_profiles_side_by_side(capsys, tmp_path):
    code, out, _ = run(["profiles", "show", "smollm2", "qwen3_8b_cot"], capsys)
    assert code == 0
    assert out.splitlines()[0] == "| statistic | smollm2_135m_instruct_gsm8k | qwen3_8b_cot |"
    assert "| share of tokens with entropy < 0.01 nat | 0.8 % | 50.6 % |" in out
    assert "| entropy, quantile 0.8, nats | — (in [4, 6) by its histogram) | 0.672 |" in out
    assert "| entropy, quantile 0.5 (median), nats | 2.647 | — |" in out
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps(measured()))
    code, out, _ = run(["profiles", "show", "qwen3", "smollm2", str(mine)], capsys)
    assert code == 0 and out.splitlines()[0] == "| statistic | qwen3_8b_cot | smollm2_135m_instruct_gsm8k | mine |"


@pytest.mark.parametrize(("content", "message"), [
    ("{not json", "not valid JSON (Expecting property name enclosed in double quotes at line 1)"),
    ("[1, 2]", "holds a JSON list; valid: a JSON object"),
    (json.dumps(published(citation=None)), "a published profile needs a citation object"),
    (json.dumps(published({"share_entropy_below_0.01": 50.64})), "share_entropy_below_0.01=50.64; valid: a number "
                                                                 "in [0, 1] or null"),
])
def test_a_malformed_profile_file_is_refused_with_one_line(content, message, capsys, tmp_path: Path):
    path = tmp_path / "bad.json"
    path.write_text(content)
    code, out, err = run(["profiles", "show", "smollm2", str(path)], capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith(f"offpolicylab: error: profile {path}: ") and message in err


@pytest.mark.parametrize(("args", "message"), [
    (["profiles", "show", "nope"], "profile 'nope' is not a packaged profile; valid: a profile JSON file or one of "
                                   "['qwen3_8b_cot', 'smollm2_135m_instruct_gsm8k'] (or a prefix naming one)"),
    (["profiles", "show", "q", "s", "q", "s", "q"], "profiles show got 5 profiles; valid: 1 to 4 names or files"),
    (["profiles"], "the following arguments are required: list|show"),
])
def test_bad_profile_commands_exit_2_with_one_line(args, message, capsys):
    code, out, err = run(args, capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and message in err
