"""Calibration against a real language model: sample GSM8k responses and write their token-statistics profile.

For the first ``n_prompts`` problems of the GSM8k test split (fixed, no shuffling), the model samples responses with
y_t ~ softmax(z_t / T) (no top-k / top-p, see :class:`~offpolicylab.policies.hf.HFPolicy`); one teacher-forced
forward over prompt + response then gives the full next-token distribution at every response position, from which
:func:`offpolicylab.diagnostics.profile.token_profile` computes the entropy histogram and shares.  Entropies and
probabilities are those of the *sampling* distribution, i.e. at temperature T.  The sampled-token log-probabilities
come from the sampling pass itself; the largest gap to the scoring pass is recorded as a consistency check.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from offpolicylab.contracts import rewards_of
from offpolicylab.diagnostics.profile import side_by_side, token_profile
from offpolicylab.locations import output_file, physical_memory
from offpolicylab.profile_files import PROFILE_VERSION, list_profiles, load_profile, validate_profile

_LIBRARIES = ("torch", "transformers", "peft", "numpy", "gguf", "tokenizers")


def calibrate(
    model: str,
    data: str | Path,
    *,
    n_prompts: int = 64,
    max_new_tokens: int = 256,
    temperature: float = 1.0,
    seed: int = 0,
    samples_per_prompt: int = 1,
    score_micro_batch: int = 8,
    command: str | None = None,
) -> dict[str, Any]:
    """The token-statistics profile (a JSON-ready dict) of ``model`` (hub id, directory or ``.gguf`` file) sampling
    ``samples_per_prompt`` responses of at most ``max_new_tokens`` tokens to each of the first ``n_prompts`` GSM8k
    test problems in ``data`` (a directory with ``test.jsonl``, or a ``.jsonl`` file), at ``temperature``, with a
    CPU generator seeded by ``seed``; all responses are generated in one batch, scored ``score_micro_batch`` rows
    at a time.  Bad input raises ValueError before the model is loaded (:func:`check_inputs`), and a batch that
    cannot fit in memory before sampling (:func:`check_memory`)."""
    from offpolicylab.worlds.gsm8k import GSM8kWorld

    problems = check_inputs(model, data, n_prompts=n_prompts, max_new_tokens=max_new_tokens,
                            temperature=temperature, seed=seed, samples_per_prompt=samples_per_prompt,
                            score_micro_batch=score_micro_batch)
    started = time.perf_counter()
    policy = _load_policy(model, max_new_tokens, score_micro_batch)
    check_memory(n_prompts * samples_per_prompt, max_new_tokens, len(policy.tokenizer))
    world = GSM8kWorld(policy.tokenizer, problems, problems, max_response_len=max_new_tokens, n_eval=n_prompts)
    prompts = world.eval_prompts(n_prompts)
    generator = torch.Generator().manual_seed(int(seed))
    rollout = policy.initial_policy().sample(prompts, samples_per_prompt, float(temperature), generator)
    with torch.no_grad():
        scored_logp, entropy = policy.initial_policy().score(rollout)
    mask = rollout.response_mask
    profile = token_profile(entropy, rollout.behavior_logp, mask)
    rewards = rewards_of(world, rollout)
    lengths = mask.sum(1)
    ended = (torch.isin(rollout.response_ids, policy.eos_ids.to(mask.device)) & (mask > 0)).any(1)
    texts = world.decode(rollout.response_ids, rollout.response_mask)
    return validate_profile({
        "profile_version": PROFILE_VERSION,
        "source": "measured",
        "model": model,
        "data": {"split": "test", "prompts": f"first {n_prompts} problems of the test split",
                 "prompt_indices": list(range(n_prompts)), "chat_template": world.use_chat_template},
        "sampling": {"temperature": float(temperature), "samples_per_prompt": int(samples_per_prompt),
                     "max_new_tokens": int(max_new_tokens), "seed": int(seed), "top_k": None, "top_p": None,
                     "entropy_temperature": "entropies and probabilities are of softmax(z / T) at this temperature"},
        "profile": profile,
        "responses": {
            "n_responses": int(mask.shape[0]),
            "mean_length": float(lengths.mean()),
            "median_length": float(lengths.median()),
            "share_hitting_length_limit": float((~ended).float().mean()),
            "mean_reward": float(rewards.mean()),
            "share_correct": float((rewards == 1.0).float().mean()),
            "share_parsable": float((rewards > 0).float().mean()),
            "examples": [text[:400] for text in texts[:3]],
        },
        "checks": {"max_abs_logp_sampling_vs_scoring": float(((scored_logp - rollout.behavior_logp).abs()
                                                                * mask).max())},
        "command": command,
        "environment": {**_versions(), "python": platform.python_version(), "torch_threads": torch.get_num_threads()},
        "wall_seconds": round(time.perf_counter() - started, 1),
    }, model)


def write_profile(profile: dict[str, Any], out: str | Path) -> Path:
    """Write ``profile`` as indented JSON to ``out`` atomically (a temporary file renamed into place)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(profile, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    tmp.replace(out)
    return out


def check_inputs(model: str, data: str | Path, *, n_prompts: int, max_new_tokens: int, temperature: float,
                 seed: int, samples_per_prompt: int, score_micro_batch: int) -> list[Any]:
    """Everything :func:`calibrate` can check before it loads the model — the options, the local model files
    (:func:`~offpolicylab.policies.hf_loading.check_model_files`) and the GSM8k test split — returning the test
    problems; bad input raises ``ValueError``."""
    from offpolicylab.policies.hf_loading import check_model_files
    from offpolicylab.worlds.gsm8k import load_problems

    _check_options(n_prompts, max_new_tokens, temperature, seed, samples_per_prompt, score_micro_batch)
    if not Path(model).exists() and (model.lower().endswith(".gguf") or model.startswith((".", os.sep))):
        raise ValueError(f"model {model!r} not found; valid: a .gguf file, a model directory or a hub id")
    check_model_files(model)
    problems = load_problems(data, "test")
    if n_prompts > len(problems):
        raise ValueError(f"n_prompts={n_prompts} is invalid; valid: an integer in [1, {len(problems)}] "
                         f"(the test split of {data} has {len(problems)} problems)")
    return problems


MAX_SEED = 2**32 - 1


def _check_options(n_prompts: int, max_new_tokens: int, temperature: float, seed: int, samples_per_prompt: int,
                   score_micro_batch: int) -> None:
    for name, value in (("n_prompts", n_prompts), ("max_new_tokens", max_new_tokens),
                        ("samples_per_prompt", samples_per_prompt), ("score_micro_batch", score_micro_batch)):
        if int(value) != value or value < 1:
            raise ValueError(f"{name}={value} is invalid; valid: an integer >= 1")
    if not (temperature > 0 and math.isfinite(temperature)):
        raise ValueError(f"temperature={temperature} is invalid; valid: a finite float > 0")
    if int(seed) != seed or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"seed={seed} is out of range; valid: an integer in [0, {MAX_SEED}]")


def check_memory(rows: int, max_new_tokens: int, vocab_size: int) -> None:
    """Refuse a sampling batch that cannot fit in this machine's memory, before sampling.  A lower bound: the
    responses' own tensors (ids, mask, log-probabilities: 24 bytes per token, as the trainer counts them) and one
    step's float32 logits and probabilities over the vocabulary for every row (8 · V bytes per row)."""
    need = rows * (24 * max_new_tokens + 8 * vocab_size)
    total = physical_memory()
    if need > total:
        raise ValueError(f"n_prompts × samples_per_prompt = {rows:,} responses of up to {max_new_tokens:,} tokens "
                         f"over a vocabulary of {vocab_size:,} need at least {need / 2**30:,.1f} GiB but this machine "
                         f"has {total / 2**30:,.1f} GiB; valid: fewer n_prompts or samples_per_prompt, or a smaller "
                         "max_new_tokens")


def _load_policy(model: str, max_new_tokens: int, score_micro_batch: int) -> Any:
    """The model as an :class:`HFPolicy`; only its base model (adapter disabled) is ever used here."""
    from offpolicylab.policies.hf import HFPolicy, LoraSpec
    from offpolicylab.policies.hf_loading import load_model_and_tokenizer

    lm, tokenizer = load_model_and_tokenizer(model)
    return HFPolicy(lm, tokenizer, lora=LoraSpec(r=1), max_new_tokens=max_new_tokens,
                    score_micro_batch=score_micro_batch)


def _versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in _LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


# ============================================================================================ command line
def add_arguments(parser: Any) -> None:
    """The ``offpolicylab calibrate`` flags."""
    parser.add_argument("--model", required=True, metavar="PATH_OR_GGUF",
                        help="a .gguf file, a model directory (save_pretrained) or a hub id")
    parser.add_argument("--data", required=True, metavar="DIR",
                        help="GSM8k data: a directory with test.jsonl, or a .jsonl file")
    parser.add_argument("--n-prompts", type=int, default=64, help="first N test problems (default 64)")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="longest response (default 256)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature T (default 1.0)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampling generator (default 0)")
    parser.add_argument("--samples-per-prompt", type=int, default=1, help="responses per problem (default 1)")
    parser.add_argument("--score-micro-batch", type=int, default=8, help="rows per scoring forward (default 8)")
    parser.add_argument("--out", required=True, metavar="PROFILE.json", help="the profile file to write")
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="let transformers run the Python code a model folder ships (off unless given)")


def run_command(args: Any) -> int:
    """``offpolicylab calibrate``: compute the profile, write it to ``--out``, print its headline numbers.  The
    output file's location and every input are checked before the model is loaded (docs/bad_input.md)."""
    from offpolicylab.policies.hf_loading import allow_remote_code

    output_file(args.out, "--out", "profile.json")
    check_inputs(args.model, args.data, n_prompts=args.n_prompts, max_new_tokens=args.max_new_tokens,
                 temperature=args.temperature, seed=args.seed, samples_per_prompt=args.samples_per_prompt,
                 score_micro_batch=args.score_micro_batch)
    allow_remote_code(args.trust_remote_code)
    command = (f"offpolicylab calibrate --model {args.model} --data {args.data} --n-prompts {args.n_prompts} "
               f"--max-new-tokens {args.max_new_tokens} --temperature {args.temperature:g} --seed {args.seed} "
               f"--samples-per-prompt {args.samples_per_prompt} --out {args.out}")
    try:
        import peft  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        raise ValueError(f"calibrate needs the llm extra ({exc}); install it with pip install 'offpolicylab[llm]'"
                         ) from None
    profile = calibrate(args.model, args.data, n_prompts=args.n_prompts, max_new_tokens=args.max_new_tokens,
                        temperature=args.temperature, seed=args.seed, samples_per_prompt=args.samples_per_prompt,
                        score_micro_batch=args.score_micro_batch, command=command)
    out = write_profile(profile, args.out)
    stats, responses = profile["profile"], profile["responses"]
    print(f"{stats['n_tokens']} tokens in {responses['n_responses']} responses (mean length "
          f"{responses['mean_length']:.1f}, {responses['share_hitting_length_limit']:.1%} hit the limit)")
    print(f"entropy < 0.01 nat: {stats['share_entropy_below_0.01']:.3f}  < 0.1 nat: "
          f"{stats['share_entropy_below_0.1']:.3f}  >= 1 nat: {stats['share_entropy_at_least_1']:.3f}  "
          f"quantiles 0.5 / 0.8: {stats['median_entropy']:.4f} / {stats['entropy_p80']:.4f} nat  "
          f"pi(y) < 1e-3: {stats['share_sampled_prob_below_1e-3']:.4f}")
    print(f"profile: {out}")
    return 0


MAX_SHOWN = 4
"""``offpolicylab profiles show`` prints at most this many profiles side by side."""


def add_profiles_arguments(parser: Any) -> None:
    """The ``offpolicylab profiles`` sub-commands: ``list`` and ``show NAME [NAME ...]``."""
    sub = parser.add_subparsers(dest="profiles_command", required=True, parser_class=type(parser),
                                metavar="list|show")
    sub.add_parser("list", help="the packaged profiles: name, source, model, citation")
    show = sub.add_parser("show", help=f"up to {MAX_SHOWN} profiles side by side (a Markdown table)")
    show.add_argument("names", nargs="+", metavar="NAME_OR_FILE",
                      help="a packaged profile (its name or a prefix naming one, e.g. smollm2, qwen3_8b_cot) or a "
                           "profile JSON file")


def run_profiles_command(args: Any) -> int:
    """``offpolicylab profiles list | show``: every profile is validated first (a malformed one: one line, exit 2)."""
    if args.profiles_command == "list":
        for name in list_profiles():
            doc = load_profile(name)
            cited = doc.get("citation") or {}
            origin = f"arXiv:{cited['arxiv']}" if cited.get("arxiv") else cited.get("url") or "offpolicylab calibrate"
            print(f"{name}  [{doc['source']}]  {Path(doc['model']).name}  {origin}")
        return 0
    if len(args.names) > MAX_SHOWN:
        raise ValueError(f"profiles show got {len(args.names)} profiles; valid: 1 to {MAX_SHOWN} names or files")
    docs: dict[str, dict[str, Any]] = {}
    for name in args.names:
        doc = load_profile(name)
        label = Path(name).stem if Path(name).suffix == ".json" else _packaged_name(name)
        while label in docs:
            label += "'"
        docs[label] = doc
    print(side_by_side(docs))
    return 0


def _packaged_name(prefix: str) -> str:
    """The packaged profile that ``prefix`` names (:func:`load_profile` has refused any other)."""
    names = list_profiles()
    return prefix if prefix in names else next(n for n in names if n.startswith(prefix))
