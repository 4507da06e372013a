"""Quiet output on the LLM path: a `run --world gsm8k` on a tiny local Llama prints our lines and no third-party
warnings a user cannot act on (transformers' and peft's FutureWarnings, the KV-cache rename notice, bitsandbytes'
"Failed to load CPU gemm_4bit_forward from kernels-community" on AVX512-BF16 CPUs)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

from tests.tiny_llm import build_tokenizer, save_model_and_data  # noqa: E402

pytestmark = pytest.mark.llm

ROOT = Path(__file__).resolve().parents[2]
NOISE = ("warning", "deprecated", "kernels-community", "failed to load", "traceback")

# bitsandbytes' message, emitted as bitsandbytes does (its module logger, WARNING), after our hf module is imported
BNB_PROBE = """
import logging
import offpolicylab.policies.hf
logging.getLogger("bitsandbytes.backends.cpu.ops").warning("Failed to load CPU gemm_4bit_forward from "
                                                           "kernels-community: No module named 'kernels'")
logging.getLogger("bitsandbytes.backends.cpu.ops").error("an error still shows")
"""


def env() -> dict[str, str]:
    """A user's environment: Python's default warning filters (FutureWarning shown, DeprecationWarning only from
    __main__)."""
    return {**{k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}, "PYTHONPATH": str(ROOT),
            "OMP_NUM_THREADS": "1"}


def test_llm_run_prints_no_third_party_noise(tmp_path: Path) -> None:
    rows = [{"question": "What is 1 plus 2?", "answer": "1 + 2 = 3\n#### 3"}]
    files = save_model_and_data(tmp_path, build_tokenizer(["#### 3"]), rows, ["train", "test"])
    command = [sys.executable, "-m", "offpolicylab", "run", "--world", "gsm8k", "--model", str(files["model"]),
               "--world-param", f"data={files['data']}", "--world-param", "max_response_len=6",
               "--world-param", "n_eval=1", "--objective", "grpo", "--prompts-per-update", "1", "--group-size", "2",
               "--updates", "2", "--eval-every", "1", "--out", str(tmp_path / "run")]
    done = subprocess.run(command, env=env(), capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    output = (done.stdout + done.stderr).lower()
    assert not [word for word in NOISE if word in output], done.stderr
    assert "update 1 (2/2 done)" in done.stderr and "run: completed" in done.stdout


def test_bitsandbytes_kernel_notice_is_silenced_errors_are_not() -> None:
    done = subprocess.run([sys.executable, "-c", BNB_PROBE], env=env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "kernels-community" not in done.stderr and "an error still shows" in done.stderr
