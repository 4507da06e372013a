"""`offpolicylab calibrate` end to end on the tests' tiny random Llama saved to disk, with a few GSM8k rows."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
import torch
import transformers

from offpolicylab import cli
from offpolicylab.calibrate import calibrate
from offpolicylab.diagnostics.profile import ENTROPY_BIN_EDGES, SHARE_KEYS
from offpolicylab.profile_files import load_profile
from offpolicylab.worlds.gsm8k import INSTRUCTION
from tests.tiny_llm import build_tokenizer, save_model_and_data

pytestmark = pytest.mark.llm

QUESTIONS = ["What is 1 plus 2?", "What is 3 plus 4?", "What is 2 plus 5?", "What is 0 plus 1?"]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A saved tiny model + tokenizer and a GSM8k directory holding only test.jsonl (calibrate reads no train)."""
    rows = [{"question": q, "answer": f"so\n#### {int(q.split()[2]) + int(q.split()[4][:-1])}"} for q in QUESTIONS]
    return save_model_and_data(tmp_path_factory.mktemp("calibrate"), build_tokenizer(), rows, ["test"])


def calibrate_args(files: dict[str, Path], out: Path, *extra: str) -> list[str]:
    return ["calibrate", "--model", str(files["model"]), "--data", str(files["data"]), "--out", str(out), *extra]


def test_calibrate_writes_a_consistent_profile(files, tmp_path, capsys):
    out = tmp_path / "sub" / "profile.json"
    args = ["--n-prompts", "3", "--samples-per-prompt", "2", "--max-new-tokens", "12", "--seed", "5",
            "--score-micro-batch", "4"]
    assert cli.main(calibrate_args(files, out, *args)) == 0
    printed = capsys.readouterr().out
    assert "entropy < 0.01 nat" in printed and "quantiles 0.5 / 0.8" in printed
    doc = json.loads(out.read_text())
    assert {"profile_version", "source", "model", "data", "sampling", "profile", "responses", "checks", "command",
            "environment"} <= set(doc)
    assert doc["profile_version"] == 2 and doc["source"] == "measured"
    assert load_profile(out)["profile"] == doc["profile"]  # the file passes the schema as written
    assert doc["data"]["prompt_indices"] == [0, 1, 2] and doc["sampling"]["temperature"] == 1.0
    assert doc["command"].startswith("offpolicylab calibrate --model ") and "--seed 5" in doc["command"]
    profile, responses = doc["profile"], doc["responses"]
    assert responses["n_responses"] == 6
    assert profile["n_tokens"] == round(responses["mean_length"] * 6)
    assert 1 <= responses["mean_length"] <= 12
    edges, hist = profile["entropy_bin_edges"], np.array(profile["entropy_histogram"])
    assert edges[:-1] == list(ENTROPY_BIN_EDGES[:-1]) and edges[-1] is None
    assert hist.sum() == pytest.approx(1.0) and (hist >= 0).all()
    for key in (*SHARE_KEYS, "share_sampled_prob_below_1e-2", "share_entropy_below_0.01"):
        assert 0.0 <= profile[key] <= 1.0
    assert hist[: edges.index(0.01)].sum() == pytest.approx(profile["share_entropy_below_0.01"])
    assert profile["median_entropy"] <= profile["entropy_p80"]
    assert hist[: edges.index(0.1)].sum() == pytest.approx(profile["share_entropy_below_0.1"])
    assert hist[edges.index(1.0):].sum() == pytest.approx(profile["share_entropy_at_least_1"])
    assert profile["share_sampled_prob_below_1e-3"] <= profile["share_sampled_prob_below_1e-2"]
    cumulative = np.cumsum(hist)
    median_bin = int(np.searchsorted(cumulative, 0.5))  # the bin where half the tokens are reached holds the median
    upper = np.inf if edges[median_bin + 1] is None else edges[median_bin + 1]
    assert edges[median_bin] <= profile["median_entropy"] <= upper
    assert 0.0 <= responses["share_hitting_length_limit"] <= 1.0
    assert doc["checks"]["max_abs_logp_sampling_vs_scoring"] < 1e-4  # sampling and scoring agree
    # the same seed gives the same profile through the Python API, also when scored one row at a time
    again = calibrate(str(files["model"]), files["data"], n_prompts=3, samples_per_prompt=2, max_new_tokens=12,
                      seed=5, score_micro_batch=1)["profile"]
    assert again["n_tokens"] == profile["n_tokens"]
    assert again["entropy_histogram"] == pytest.approx(profile["entropy_histogram"])
    for key in (*SHARE_KEYS, "median_entropy", "entropy_p80", "mean_entropy", "mean_neg_logp"):
        assert again[key] == pytest.approx(profile[key], abs=1e-5)


def test_one_token_responses_have_the_entropy_of_the_prompt_distribution_at_temperature(files, tmp_path):
    """With one-token responses every counted entropy is that of softmax(z / T) after the unpadded prompt,
    recomputed here with a plain forward and NumPy."""
    temperature = 0.7
    doc = calibrate(str(files["model"]), files["data"], n_prompts=4, max_new_tokens=1, temperature=temperature)
    tokenizer = transformers.AutoTokenizer.from_pretrained(files["model"])
    model = transformers.AutoModelForCausalLM.from_pretrained(files["model"]).eval()
    entropies = []
    for question in QUESTIONS:
        text = tokenizer.apply_chat_template([{"role": "user", "content": f"{question}\n{INSTRUCTION}"}],
                                             add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            z = model(input_ids=ids).logits[0, -1].double().numpy() / temperature
        p = np.exp(z - z.max())
        p /= p.sum()
        entropies.append(float(-(p * np.log(p)).sum()))
    profile = doc["profile"]
    assert profile["n_tokens"] == 4
    assert profile["median_entropy"] == pytest.approx(np.median(entropies), abs=1e-4)
    assert profile["entropy_p80"] == pytest.approx(np.quantile(entropies, 0.8), abs=1e-4)
    assert profile["mean_entropy"] == pytest.approx(np.mean(entropies), abs=1e-4)
    counts, _ = np.histogram(entropies, bins=np.array(ENTROPY_BIN_EDGES))
    assert profile["entropy_histogram"] == pytest.approx(counts / 4)
    assert doc["sampling"]["temperature"] == temperature


@pytest.mark.parametrize("case, message", [
    ("model", "not found"),
    ("data", "not found"),
    ("zero", "n_prompts=0 is invalid"),
    ("too_many", "n_prompts=9 is invalid"),
    ("out_dir", "is a directory"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(files, tmp_path, capsys, case, message):
    out = tmp_path / "profile.json"
    args = calibrate_args(files, out, "--n-prompts", "2")
    if case == "model":
        args[args.index("--model") + 1] = str(tmp_path / "missing.gguf")
    elif case == "data":
        args[args.index("--data") + 1] = str(tmp_path / "no_such_dir")
    elif case == "zero":
        args[-1] = "0"
    elif case == "too_many":
        args[-1] = "9"
    else:
        args[args.index("--out") + 1] = str(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len([line for line in err if line.startswith("offpolicylab: error:")]) == 1
    assert message in err[-1]
    assert not out.exists() and not (tmp_path / "profile.json.tmp").exists()
