"""What an LLM run leaves for other tools: ``RUN/adapter``, a peft adapter folder written at every checkpoint and at
the end, that ``PeftModel.from_pretrained`` loads onto the base model and that gives the policy's log-probs; and
``samples/completions_<update>.jsonl``, the consumed batch as text (prompt, response, reward, advantage,
staleness) at every sample update."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
import torch  # noqa: E402
import transformers  # noqa: E402

from offpolicylab import cli  # noqa: E402
from offpolicylab.build import build  # noqa: E402
from offpolicylab.config import TrainConfig  # noqa: E402
from offpolicylab.run_dir import RunDir  # noqa: E402
from offpolicylab.run_records import load_samples  # noqa: E402
from tests.tiny_llm import build_tokenizer, save_model_and_data  # noqa: E402

pytestmark = pytest.mark.llm

ANSWERS = [f"#### {d}" for d in range(8)]


@pytest.fixture(scope="module")
def llm_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    root = tmp_path_factory.mktemp("outputs")
    rows = [{"question": f"What is {a} plus {b}?", "answer": f"{a} + {b} = {a + b}\n#### {a + b}"}
            for a, b in [(1, 2), (3, 4), (2, 5)]]
    files = save_model_and_data(root, build_tokenizer(ANSWERS), rows, ["train", "test"])
    out = root / "run"
    args = ["run", "--world", "gsm8k", "--model", str(files["model"]), "--world-param", f"data={files['data']}",
            "--world-param", "max_response_len=6", "--world-param", "n_eval=1", "--objective", "grpo",
            "--schedule", "stale_k:1", "--prompts-per-update", "2", "--group-size", "4", "--updates", "3",
            "--eval-every", "10", "--sample-every", "2", "--checkpoint-every", "2", "--lr", "0.05", "--seed", "3",
            "--out", str(out)]
    assert cli.main(args) == 0
    return out, files


def test_adapter_folder_loads_with_peft_and_gives_the_policy_log_probs(llm_run: tuple[Path, dict[str, Path]]) -> None:
    out, files = llm_run
    adapter = out / "adapter"
    assert sorted(p.name for p in adapter.iterdir() if p.suffix in (".json", ".safetensors")) == \
        ["adapter_config.json", "adapter_model.safetensors"]
    assert not (out / "checkpoint" / "adapter.staging").exists() and not (out / "checkpoint" / "adapter.old").exists()
    # the policy at the end of the run: the config rebuilt, its checkpoint's adapter loaded
    run = build(TrainConfig.from_dict(RunDir(out).read_config()))
    run.policy.load_state_dict(RunDir(out).load_checkpoint()["policy"])
    assert any(torch.count_nonzero(t) > 0 for k, t in run.policy.state_dict().items() if "lora_B" in k)  # it trained
    prompts = run.world.sample_prompts(1, torch.Generator().manual_seed(0))
    rollout = run.policy.sample(prompts, 3, 1.0, torch.Generator().manual_seed(1))
    with torch.no_grad():
        logp, _ = run.policy.score(rollout)
    # the same tokens through peft's own loading of the folder (one prompt: no left padding)
    base = transformers.AutoModelForCausalLM.from_pretrained(files["model"], dtype=torch.float32)
    loaded = peft.PeftModel.from_pretrained(base, adapter).eval()
    width = rollout.prompt_ids.shape[1]
    ids = torch.cat([rollout.prompt_ids, rollout.response_ids], 1)
    with torch.no_grad():
        logits = loaded(input_ids=ids, attention_mask=torch.cat([rollout.prompt_mask, rollout.response_mask], 1)).logits
    predicted = torch.log_softmax(logits[:, width - 1:-1].float(), -1)
    expected = predicted.gather(-1, rollout.response_ids[..., None]).squeeze(-1)
    mask = rollout.response_mask > 0
    assert rollout.prompt_mask.all() and mask.any()
    torch.testing.assert_close(logp[mask], expected[mask], atol=1e-5, rtol=1e-5)


def test_completions_are_saved_as_text_at_each_sample_update(llm_run: tuple[Path, dict[str, Path]]) -> None:
    out, _ = llm_run
    names = sorted(p.name for p in (out / "samples").glob("completions_*.jsonl"))
    assert names == ["completions_000000.jsonl", "completions_000002.jsonl"]
    records = [json.loads(line) for line in (out / "samples" / names[1]).read_text().splitlines()]
    assert len(records) == 2 * 4
    assert set(records[0]) == {"prompt", "response", "reward", "advantage", "staleness", "version", "group"}
    assert all("plus" in r["prompt"] and isinstance(r["response"], str) for r in records)
    assert {r["staleness"] for r in records} == {1} and {r["version"] for r in records} == {1}  # stale_k:1 at update 2
    assert sorted({r["group"] for r in records}) == [0, 1]
    samples = load_samples(out / "samples" / "update_000002.npz")  # the same batch's numbers, row by row
    assert [r["reward"] for r in records] == pytest.approx(samples["batch_rewards"].tolist(), abs=1e-7)
    assert [r["group"] for r in records] == samples["batch_group_ids"].tolist()
    assert {r["reward"] for r in records} <= {0.0, 0.1, 1.0}  # GSM8k's rewards, written as decimals
