"""The synthetic-LM π₀ cache trusts only what it recognises: a file at a recipe's cache name is used only when it is
this recipe's π₀ (a dict of the expected schema whose recipe matches), anything else is ignored with one warning
line; a cache folder that cannot be written is found before the build, which is then kept in memory."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from offpolicylab.worlds import make_world, synthetic_lm
from offpolicylab.worlds.synthetic_lm import PACKAGED_DIR, Recipe, cache_problem, read_cached
from tests.worlds.test_synthetic_lm import TINY

SHIPPED = PACKAGED_DIR / f"{Recipe().digest()[:32]}.pt"


def foreign_files(recipe: Recipe) -> dict[str, Any]:
    """Loadable (weights_only) files that are not this recipe's π₀, by what is wrong with them."""
    good = torch.load(SHIPPED, weights_only=True) if recipe == Recipe() else None
    files: dict[str, Any] = {
        "a list": [1, 2, 3],
        "a string": "π₀",
        "a tensor": torch.zeros(3),
        "a dict without the keys": {"x": torch.zeros(2)},
        "another recipe": {"recipe": "{}", "version": synthetic_lm.RECIPE_VERSION, "state": {}, "threshold": 0.0},
    }
    if good is not None:
        files["weights of another shape"] = {**good, "state": {k: torch.zeros(1) for k in good["state"]}}
        files["a missing weight"] = {**good, "state": dict(list(good["state"].items())[1:])}
        files["a threshold that is not a number"] = {**good, "threshold": "low"}
        files["an infinite threshold"] = {**good, "threshold": float("inf")}
    return files


@pytest.fixture(autouse=True)
def fresh_process_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts as a new process would: nothing built in memory, nothing warned yet."""
    monkeypatch.setattr(synthetic_lm, "_BUILT", {})
    monkeypatch.setattr(synthetic_lm, "_WARNED", set())


@pytest.mark.parametrize("case", list(foreign_files(Recipe())))
def test_a_foreign_file_at_the_v5_recipes_name_is_ignored(tmp_path: Path, case: str,
                                                               capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    name = SHIPPED.name
    torch.save(foreign_files(Recipe())[case], tmp_path / name)
    monkeypatch.setattr(synthetic_lm, "distill", _no_build)

    world = make_world("synthetic_lm", preset="seed_scale", cache_dir=str(tmp_path))

    shipped = read_cached(SHIPPED, Recipe())
    assert shipped is not None and world.threshold == shipped[1]  # the packaged copy, no build
    assert all(torch.equal(world.pretrained_state[k], v) for k, v in shipped[0].items())
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"offpolicylab: warning: ignoring the π₀ cache file "
                                                   f"{tmp_path / name} ("), lines
    assert cache_problem(tmp_path / name, Recipe()) is not None


def _no_build(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("π₀ was distilled although the packaged copy serves the recipe")


def test_a_damaged_file_for_a_new_recipe_is_rebuilt_and_replaced(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    reference = make_world("synthetic_lm", cache_dir=str(tmp_path / "clean"), **TINY)
    path = tmp_path / "cache" / reference.cache_path.name
    path.parent.mkdir()
    for content in (b"", b"garbage", b"PK\x03\x04 not a zip"):
        path.write_bytes(content)
        world = make_world("synthetic_lm", cache_dir=str(path.parent), **TINY)
        assert world.threshold == reference.threshold
        assert read_cached(path, reference.recipe) is not None  # the rebuild replaced the damaged file
    assert "ignoring the π₀ cache file" in capsys.readouterr().err


def test_an_unwritable_cache_is_found_before_the_build_and_kept_in_memory(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch,
                                                                           capsys: pytest.CaptureFixture[str]
                                                                           ) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    events: list[str] = []
    real_distill = synthetic_lm.distill

    def distill(*args: Any, **kwargs: Any) -> Any:
        events.append(capsys.readouterr().err)  # what was said before the build started
        return real_distill(*args, **kwargs)

    monkeypatch.setattr(synthetic_lm, "distill", distill)
    monkeypatch.setenv("OFFPOLICYLAB_CACHE", str(blocker / "cache"))

    first = make_world("synthetic_lm", **TINY)
    second = make_world("synthetic_lm", **TINY)

    assert len(events) == 1, "the second world of the process reuses the π₀ built in memory"
    warning = events[0].strip().splitlines()
    assert len(warning) == 1 and "OFFPOLICYLAB_CACHE" in warning[0] and f"{blocker} is a file" in warning[0]
    assert warning[0].startswith(f"offpolicylab: warning: π₀ cannot be cached in {blocker / 'cache' / 'synthetic_lm'}")
    assert capsys.readouterr().err == ""  # said once
    assert first.threshold == second.threshold and not (blocker.parent / "cache").exists()


def test_a_cache_write_that_fails_keeps_the_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    def full_disk(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(synthetic_lm.os, "replace", full_disk)
    world = make_world("synthetic_lm", cache_dir=str(tmp_path), **TINY)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "could not be cached" in lines[0] and "No space left on device" in lines[0]
    assert "OFFPOLICYLAB_CACHE" in lines[0]
    assert world.pretrained_state and not list(tmp_path.iterdir())  # no partial file left


def test_a_distillation_that_cannot_fit_is_refused_before_it_starts(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.sysconf
    monkeypatch.setattr(os, "sysconf", lambda name: 16 if name == "SC_PHYS_PAGES" else real(name))
    monkeypatch.setattr(synthetic_lm, "distill", _no_build)
    with pytest.raises(ValueError, match="building π₀ needs at least .* GiB .* valid: a smaller distill_batch"):
        make_world("synthetic_lm", cache_dir=str(tmp_path), **TINY)
    assert not list(tmp_path.iterdir())
