"""`list`: a part's description is its docstring's first paragraph (and, when that ends with ":", the formula or
list it introduces), whole, never cut mid-sentence; a part without parameters says so instead of an empty line."""

from __future__ import annotations

import re

import pytest

from offpolicylab import cli
from offpolicylab.registry import doc_summary


def test_doc_summary_by_hand() -> None:
    doc = """ℓ = −A · log π  (Williams 1992).  No importance weight: on stale data this is the biased
        "NoIS" gradient.

        More detail that is not part of the summary.
        """
    assert doc_summary(doc) == 'ℓ = −A · log π (Williams 1992). No importance weight: on stale data this is the biased ' \
                               '"NoIS" gradient.'
    intro = """P3O, over the n valid tokens:

            ESS = (Σ w)² / (n·Σ w²),
            ρ_t = clamp(w_t, 0, ESS).

        Normalisation: not in the summary.
        """
    assert doc_summary(intro) == "P3O, over the n valid tokens: ESS = (Σ w)² / (n·Σ w²), ρ_t = clamp(w_t, 0, ESS)."
    assert doc_summary("Two forms:\n\n    - IS: a\n    - NoIS: b\n") == "Two forms: • IS: a • NoIS: b"
    assert doc_summary("") == ""


def joined(out: str, name: str) -> str:
    """The description of ``name`` in `list --verbose` output, its wrapped lines joined."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"  {name} ") or line.startswith(f"  {name}:"))
    text = [lines[start]]
    for line in lines[start + 1:]:
        if not line.startswith("        ") or line.startswith("        ") and "=" in line.split()[0]:
            break
        text.append(line.strip())
    return " ".join(text)


def test_verbose_list_keeps_whole_sentences(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["list", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines() if line.startswith("  ") and not line.startswith("      ")) \
        <= cli.LIST_WIDTH
    assert joined(out, "reinforce").endswith("the 3-arm pitfall of REC (Yao et al. 2025, arXiv:2509.24203).")
    p3o = joined(out, "p3o")
    assert "over the n valid tokens: ESS = (Σ w)² / (n·Σ w²)" in p3o and p3o.endswith("KL_k3 = Δ + e^−Δ − 1.")


def test_a_part_without_parameters_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "  three_arm_pitfall: (no parameters)" in lines
    assert not [line for line in lines if re.fullmatch(r"  \S+( \(.*\))?: ?", line)]  # nothing after the name
