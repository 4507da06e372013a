"""`offpolicylab run --world gsm8k --model DIR` end to end on a tiny random Llama saved to disk.

The model directory and a four-row GSM8k jsonl are written to ``tmp_path``; the CLI then trains a LoRA adapter through
the same loop as the toy worlds.  The tokenizer is the tests' character tokenizer plus eight whole-answer tokens
``"#### 0"`` … ``"#### 7"`` (the references are 1, 3 and 7), so that the random model's responses are a mix of
unparsable (0), parsable (0.1) and correct (1) ones: about 1 in 4 is parsable, and 2 prompts × 4 samples give a
batch with non-zero group advantages (hence a gradient) in ~98% of seeds.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")
import torch
import transformers

from offpolicylab import cli
from offpolicylab.build import with_stored_plan
from offpolicylab.config import TrainConfig
from offpolicylab.policies import hf
from offpolicylab.policies.hf import device_generator
from offpolicylab.run_dir import RunDir
from tests.tiny_llm import build_tokenizer, save_model_and_data

pytestmark = pytest.mark.llm

ANSWER_TOKENS = [f"#### {d}" for d in range(8)]
PROBLEMS = [(1, 2), (3, 4), (2, 5), (0, 1)]
LORA_R = 4
# tiny.build_model: hidden 32, intermediate 64, 4 heads of 8 → k/v width 2 heads × 8 = 16, two layers.
# LoRA on every linear layer but the head: r·(d_in + d_out) numbers per layer.
LINEAR_SHAPES = {"q_proj": (32, 32), "k_proj": (32, 16), "v_proj": (32, 16), "o_proj": (32, 32),
                 "gate_proj": (32, 64), "up_proj": (32, 64), "down_proj": (64, 32)}
LORA_NUMEL = 2 * sum(LORA_R * (d_in + d_out) for d_in, d_out in LINEAR_SHAPES.values())  # = 4096


def answer_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """tiny.build_tokenizer's vocabulary + :data:`ANSWER_TOKENS` (decodable; prompts still encode per character)."""
    return build_tokenizer(ANSWER_TOKENS)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A saved tiny model + tokenizer (save_pretrained) and GSM8k train/test jsonl files."""
    rows = [{"question": f"What is {a} plus {b}?", "answer": f"{a} + {b} = {a + b}\n#### {a + b}"} for a, b in PROBLEMS]
    return save_model_and_data(tmp_path_factory.mktemp("llm_run"), answer_tokenizer(), rows, ["train", "test"])


def run_args(files: dict[str, Path], out: Path, schedule: str = "stale_k:1", updates: int = 4) -> list[str]:
    return ["run", "--world", "gsm8k", "--model", str(files["model"]), "--world-param", f"data={files['data']}",
            "--world-param", "max_response_len=8", "--world-param", "n_eval=2", "--objective", "m2po",
            "--param", "tau=0.04", "--schedule", schedule, "--policy-param", f"lora_r={LORA_R}",
            "--policy-param", "lora_alpha=8", "--prompts-per-update", "2", "--group-size", "4",
            "--updates", str(updates), "--lr", "0.02", "--eval-every", "2", "--eval-samples", "1",
            "--sample-every", "1", "--checkpoint-every", "1", "--seed", "3", "--out", str(out)]


def read_rows(run: Path) -> list[dict[str, str]]:
    with open(run / "metrics.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def column(rows: list[dict[str, str]], name: str) -> list[float]:
    return [float(r[name]) for r in rows]


def without_time(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    return [{k: v for k, v in r.items() if not k.startswith("time_")} for r in rows]


def killed_before_second_checkpoint(args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the CLI with ``args`` and die (like a kill: no summary) after update 1's metrics row but before its
    checkpoint."""
    save = RunDir.save_checkpoint

    def dies_at_second(self: RunDir, state: dict) -> None:
        if state["next_update"] == 2:
            raise KeyboardInterrupt
        save(self, state)

    monkeypatch.setattr(RunDir, "save_checkpoint", dies_at_second)
    assert cli.main(args) == cli.EXIT_INTERRUPTED  # the CLI turns the interrupt into one line and exit 130
    monkeypatch.setattr(RunDir, "save_checkpoint", save)


@pytest.fixture(scope="module")
def stale_run(files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("stale") / "run"
    assert cli.main(run_args(files, out)) == 0
    return out


def test_stale_m2po_run_directory(stale_run: Path, files: dict[str, Path]) -> None:
    config = json.loads((stale_run / "config.json").read_text())
    assert config["policy"] == "hf" and config["world"] == "gsm8k" and config["schedule"] == "stale_k:1"
    assert config["world_params"]["model"] == str(files["model"]) and config["policy_params"]["lora_r"] == LORA_R
    assert config["objective"] == "m2po" and config["objective_params"]["tau"] == 0.04
    rows = read_rows(stale_run)
    assert [int(r["update"]) for r in rows] == [0, 1, 2, 3]
    # stale_k:1: update 0 consumes π_0's first batch, every later update the batch generated one update earlier
    assert column(rows, "staleness_mean") == [0.0, 1.0, 1.0, 1.0]
    assert all(0.0 < length <= 8.0 for length in column(rows, "response_len"))
    # the rewards are GSM8k's (1 / 0.1 / 0 per response): a mean over 8 responses is a multiple of 0.0125
    assert np.allclose(np.round(np.array(column(rows, "reward_mean")) / 0.0125) * 0.0125, column(rows, "reward_mean"),
                       atol=1e-6)
    grad = column(rows, "grad_norm")
    assert grad[0] > 0.0, "the first batch carried no gradient (no reward differences): the test proves nothing"
    # sampling and scoring agree for the same weights; once the adapter has moved, the stale batch's ratios do not
    log_ratio = column(rows, "log_ratio_abs_mean")
    assert log_ratio[0] < 1e-4 and log_ratio[1] > 1e-4
    eval_greedy = [r["eval_reward_greedy"] for r in rows]
    assert eval_greedy[1] == "" and all(eval_greedy[u] != "" for u in (0, 2, 3))
    summary = json.loads((stale_run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["updates_done"] == 4
    assert sorted(p.name for p in (stale_run / "samples").iterdir()) == sorted(
        [f"update_00000{u}.npz" for u in range(4)] + [f"completions_00000{u}.jsonl" for u in range(4)])


def test_checkpoint_holds_only_the_adapter(stale_run: Path) -> None:
    state = RunDir(stale_run).load_checkpoint()
    assert state["next_update"] == 4
    policy = state["policy"]
    assert len(policy) == 2 * 2 * len(LINEAR_SHAPES)  # lora_A and lora_B of 7 linear layers in 2 layers
    assert all(("lora_A" in key or "lora_B" in key) for key in policy)
    assert sum(t.numel() for t in policy.values()) == LORA_NUMEL
    for key, tensor in policy.items():
        module = next(name for name in LINEAR_SHAPES if f".{name}." in key)
        d_in, d_out = LINEAR_SHAPES[module]
        assert tuple(tensor.shape) == ((LORA_R, d_in) if "lora_A" in key else (d_out, LORA_R))
    assert any(torch.count_nonzero(t) > 0 for k, t in policy.items() if "lora_B" in k)  # B starts at 0: it trained
    # Adam holds exp_avg and exp_avg_sq for the adapter parameters only
    moments = [t for s in state["optimizer"]["state"].values() for k, t in s.items() if k != "step"]
    assert sum(t.numel() for t in moments) == 2 * LORA_NUMEL


def test_interrupted_run_resumes_to_identical_metrics(
    files: dict[str, Path], stale_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Die after update 1's metrics row but before its checkpoint (like a kill: no summary); --resume restores the
    adapter, Adam, RNGs and the pending stale batch, redoes update 1, and ends with the uninterrupted metrics."""
    killed_before_second_checkpoint(run_args(files, tmp_path / "cut"), monkeypatch)
    assert len(read_rows(tmp_path / "cut")) == 2 and not (tmp_path / "cut" / "summary.json").exists()
    assert RunDir(tmp_path / "cut").load_checkpoint()["buffer"], "stale_k:1 leaves a pending batch to restore"
    assert cli.main(["run", "--out", str(tmp_path / "cut"), "--resume"]) == 0
    assert without_time(read_rows(tmp_path / "cut")) == without_time(read_rows(stale_run))
    assert [(e["event"], e["update"]) for e in RunDir(tmp_path / "cut").read_events()] == [("resume", 1)]
    assert json.loads((tmp_path / "cut" / "summary.json").read_text())["status"] == "completed"


def test_mixture_with_the_base_model_as_second_policy(files: dict[str, Path], tmp_path: Path) -> None:
    """mixture:0.5 with 2 prompts × 4 samples: rows 0-3 from the adapted policy (fresh), rows 4-7 from the base model
    (version 0, staleness = u).  Fresh rows are scored by the policy that sampled them (log ρ ≈ 0); base-model rows
    differ from the adapted policy once the adapter has moved."""
    out = tmp_path / "mix"
    assert cli.main(run_args(files, out, schedule="mixture:0.5", updates=3)) == 0
    rows = read_rows(out)
    assert column(rows, "staleness_mean") == [0.0, 0.5, 1.0] and column(rows, "staleness_max") == [0.0, 1.0, 2.0]
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"
    assert column(rows, "grad_norm")[0] > 0.0
    with np.load(out / "samples" / "update_000002.npz", allow_pickle=False) as samples:
        staleness, seq_log_ratio = samples["staleness"], samples["seq_log_ratio"]
    assert staleness.tolist() == [0.0] * 4 + [2.0] * 4
    assert np.abs(seq_log_ratio[:4]).max() < 1e-4
    assert np.abs(seq_log_ratio[4:]).min() > 1e-4


def test_a_generator_on_the_model_device_is_used_as_is() -> None:
    """The trainer passes its CPU generator; on a CPU model the policy draws from it directly (a model on another
    device gets a generator there, seeded from one draw of this one: that branch needs an accelerator)."""
    generator = torch.Generator().manual_seed(0)
    assert device_generator(generator, torch.device("cpu")) is generator


def test_relative_paths_are_stored_absolute_and_policy_defaults_are_printed(
    files: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Model and data given relative to the working directory, no --lr / --eval-samples: config.json holds absolute
    paths and the hf policy's defaults (lr 1e-4, one sampled evaluation response), stderr (not a terminal) names those
    defaults and has one line per update, and a run cut after its first checkpoint resumes from another directory."""
    args = run_args(files, tmp_path / "rel", updates=2)
    for flag in ("--lr", "--eval-samples"):
        del args[args.index(flag):args.index(flag) + 2]
    args[args.index(str(files["model"]))] = "model"
    args[args.index(f"data={files['data']}")] = "data=gsm8k"
    monkeypatch.chdir(files["model"].parent)
    killed_before_second_checkpoint(args, monkeypatch)
    config = json.loads((tmp_path / "rel" / "config.json").read_text())
    assert config["world_params"]["model"] == str(files["model"].resolve())
    assert config["world_params"]["data"] == str(files["data"].resolve())
    assert config["lr"] == 1e-4 and config["eval_samples"] == 1
    err = capsys.readouterr().err
    assert "lr 0.0001, grad_clip 1, eval_samples 1 (chosen by policy hf: lr, eval_samples)" in err
    assert [line.split("  ")[0] for line in err.splitlines() if line.startswith("update ")] == [
        "update 0 (1/2 done)", "update 1 (2/2 done)"]
    monkeypatch.chdir(tmp_path)
    assert cli.main(["run", "--out", "rel", "--resume"]) == 0
    assert len(read_rows(tmp_path / "rel")) == 2


def test_scoring_plan_is_chosen_printed_recorded_and_kept_on_resume(
    files: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """With 1000 bytes per scored response and 7000 available, the 8 rows of an update are scored 2 at a time
    (⌊0.6 · 7⌋ − 2) with recompute: printed at the start, stored in config.json, and kept by a resume that finds
    plenty of memory."""
    monkeypatch.setattr(hf.HFPolicy, "score_row_bytes", lambda self, prompt, response: 1000)
    monkeypatch.setattr(hf, "available_memory", lambda device: 7000)
    out = tmp_path / "planned"
    killed_before_second_checkpoint(run_args(files, out, updates=2), monkeypatch)
    config = json.loads((out / "config.json").read_text())
    assert config["policy_params"] == {"lora_r": LORA_R, "lora_alpha": 8.0, "score_micro_batch": 2,
                                       "score_recompute": True}
    assert "scoring: score_micro_batch=2, score_recompute=true (~0.00 GiB per response" in capsys.readouterr().err
    monkeypatch.setattr(hf, "available_memory", lambda device: 10**12)
    assert cli.main(["run", "--out", str(out), "--resume"]) == 0
    assert json.loads((out / "config.json").read_text()) == config
    given = TrainConfig(world="gsm8k", policy="hf", policy_params={"lora_r": LORA_R})
    assert with_stored_plan(given, config).policy_params == {"lora_r": LORA_R, "score_micro_batch": 2,
                                                             "score_recompute": True}


def test_a_batch_that_cannot_be_scored_in_memory_is_refused(files: dict[str, Path], tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(hf.HFPolicy, "score_row_bytes", lambda self, prompt, response: 1000)
    monkeypatch.setattr(hf, "available_memory", lambda device: 500)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(run_args(files, tmp_path / "oom"))
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after transformers' weight-loading bar
    assert exit_info.value.code == 2 and last.startswith("offpolicylab: error: scoring 8 responses of up to ")
    assert "+ 8 tokens" in last and "valid: a shorter max_response_len" in last
    assert not (tmp_path / "oom").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a torch without a usable GPU")
def test_cuda_device_without_cuda_is_one_line_exit_2(files: dict[str, Path], tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main([*run_args(files, tmp_path / "gpu"), "--policy-param", "device=cuda"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "device='cuda' is not available" in err and "valid: cpu" in err
    assert not (tmp_path / "gpu").exists()


def test_recomputed_behavior_logp_separates_staleness_from_numeric_mismatch(files: dict[str, Path],
                                                                            tmp_path: Path) -> None:
    """A bf16 sampler (``sampler_precision=bf16``: the sampler's logits rounded to bf16) beside the fp32 trainer:
    sampling and scoring log-probs of the same tokens differ on any CPU (a bf16 *model* is not used: whether its
    incremental and full forwards round alike depends on the CPU's kernels).  On-policy, without recompute the
    objective's |log ratio| at update 0 is that numeric mismatch; with recompute it is 0 (the same training forward
    on both sides) and the mismatch moves to sampler_log_ratio_abs_mean, equal to the first run's |log ratio|."""
    runs = {}
    for name, extra in (("plain", []), ("recompute", ["--behavior-logp", "trainer"])):
        out = tmp_path / name
        args = run_args(files, out, schedule="on_policy", updates=1)
        assert cli.main([*args, "--policy-param", "sampler_precision=bf16", *extra]) == 0
        runs[name] = read_rows(out)[0]
    plain, recompute = runs["plain"], runs["recompute"]
    assert plain["response_len"] == recompute["response_len"] and plain["reward_mean"] == recompute["reward_mean"]
    assert float(plain["log_ratio_abs_mean"]) > 0.0
    assert float(plain.get("sampler_log_ratio_abs_mean") or 0.0) == 0.0  # behaviour = the sampler's numbers
    assert float(recompute["log_ratio_abs_mean"]) == 0.0
    assert float(recompute["sampler_log_ratio_abs_mean"]) == pytest.approx(float(plain["log_ratio_abs_mean"]),
                                                                           rel=1e-5)
    assert float(recompute["sampler_log_ratio_abs_max"]) >= float(recompute["sampler_log_ratio_abs_mean"])
