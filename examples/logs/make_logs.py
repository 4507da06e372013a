"""Writes the example logs of this folder (README.md says what each one is):

* ``trl_m2po/trainer_state.json`` and the recorded run ``trl_m2po_recorded/``: a real TRL run — TRL's own
  ``GRPOTrainer`` loop through our ``OffPolicyLabGRPOTrainer`` (objective m2po) on a tiny random Llama with a
  word-level tokenizer built here, no download — and what our recording integration (``record_dir``) wrote of it;
* ``verl_m2po.jsonl``: the metrics of an offpolicylab run (token_mdp, m2po at stale_k:8) written line by line as
  verl's ``FileLogger`` writes them (``{"step": N, "data": {...}}``, steps from 1) under verl's metric names and
  our plug-in's ``actor/offpolicylab/<name>`` keys (:data:`offpolicylab.logs.METRIC_NAMES`).

    python examples/logs/make_logs.py            # needs the llm extra (transformers, trl, datasets)
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORDS = ["add", "one", "two", "three", "yes", "no", "is", "the", "answer"] + [str(d) for d in range(10)]


def trl_run(steps: int = 12) -> None:
    """``trl_m2po/trainer_state.json`` and ``trl_m2po_recorded/`` from a real TRL run of m2po."""
    import torch
    from datasets import Dataset
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    from trl import GRPOConfig

    from offpolicylab.integrations.trl import OffPolicyLabGRPOTrainer

    vocab = {token: i for i, token in enumerate(["<pad>", "<s>", "</s>", "<unk>", *WORDS])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>",
                                        pad_token="<pad>", unk_token="<unk>", padding_side="left")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                                         max_position_embeddings=32, pad_token_id=0, bos_token_id=1,
                                         eos_token_id=2))

    def digit_reward(completions: list[str], **_: object) -> list[float]:
        return [sum(w.isdigit() for w in c.split()) / max(len(c.split()), 1) for c in completions]

    prompts = ["add one two", "add two three", "the answer is", "add three one"]
    recorded = HERE / "trl_m2po_recorded"
    shutil.rmtree(recorded, ignore_errors=True)
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(output_dir=out, per_device_train_batch_size=4, num_generations=4, max_completion_length=4,
                          max_steps=steps, learning_rate=1e-2, num_iterations=2, report_to="none", use_cpu=True,
                          save_strategy="steps", save_steps=steps, logging_steps=1, seed=0, disable_tqdm=True)
        trainer = OffPolicyLabGRPOTrainer(model=model, reward_funcs=digit_reward, args=args,
                                          train_dataset=Dataset.from_dict({"prompt": prompts * 4}),
                                          processing_class=tokenizer, objective="m2po",
                                          objective_params={"tau": 0.04}, record_dir=str(recorded),
                                          record_every=3)
        trainer.train()
        (recorded / ".lock").unlink(missing_ok=True)  # the recorder's lock: no process writes the folder now
        target = HERE / "trl_m2po"
        target.mkdir(exist_ok=True)
        state = Path(out) / f"checkpoint-{steps}" / "trainer_state.json"
        shutil.copyfile(state, target / "trainer_state.json")


def verl_jsonl(updates: int = 60) -> None:
    """``verl_m2po.jsonl``: an offpolicylab run's metrics in verl's FileLogger format and metric names."""
    import pandas as pd

    from offpolicylab.config import TrainConfig
    from offpolicylab.logs import METRIC_NAMES
    from offpolicylab.trainer import train

    with tempfile.TemporaryDirectory() as run:
        config = TrainConfig(world="token_mdp", objective="m2po", schedule="stale_k:8", updates=updates,
                             eval_every=10, sample_every=0, seed=0)
        train(config, Path(run) / "run", progress=False)
        metrics = pd.read_csv(Path(run) / "run" / "metrics.csv")
    # verl's name of each of our columns: critic/score/mean is the batch's score (our reward_mean)
    verl_name = {("reward_mean" if name.ours == "reward_mean" else name.run[0]): name.verl[0]
                 for name in METRIC_NAMES if name.verl and name.run}
    with open(HERE / "verl_m2po.jsonl", "w") as fh:
        for row in metrics.to_dict("records"):
            data = {}
            for column, value in row.items():
                if column == "update" or column.startswith("time_") or not isinstance(value, float | int):
                    continue
                if isinstance(value, float) and not math.isfinite(value):
                    continue
                if column in verl_name:
                    data[verl_name[column]] = float(value)
                data[f"actor/offpolicylab/{column}"] = float(value)
            fh.write(json.dumps({"step": int(row["update"]) + 1, "data": data}) + "\n")


if __name__ == "__main__":
    verl_jsonl()
    trl_run()
