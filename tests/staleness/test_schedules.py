"""Schedules against hand-worked version / key / generation sequences (docs/design.md, "Schedules")."""

from __future__ import annotations

import pytest

from offpolicylab.staleness import SCHEDULE_FORMS, parse_schedule

U = 8


def table(spec: str, total: int = U) -> tuple[list[int], list[int], list[list[int]], list[list[int]]]:
    s = parse_schedule(spec)
    return ([s.version(u) for u in range(total)], [s.staleness(u) for u in range(total)],
            [s.generate_at(u, total) for u in range(total)], [s.release_after(u, total) for u in range(total)])


def test_on_policy_is_fresh_every_update() -> None:
    versions, staleness, generated, released = table("on_policy")
    assert versions == list(range(U)) and staleness == [0] * U
    assert generated == [[u] for u in range(U)] and released == [[u] for u in range(U)]


def test_stale_k_is_m2po_queue() -> None:
    # k = 3: updates 0..3 consume distinct batches of π_0 (generated at update 0); update u ≥ 3 consumes the batch
    # generated at u − 3, once.
    versions, staleness, generated, released = table("stale_k:3")
    assert versions == [0, 0, 0, 0, 1, 2, 3, 4]
    assert staleness == [0, 1, 2, 3, 3, 3, 3, 3]
    assert generated == [[0, 1, 2, 3], [4], [5], [6], [7], [], [], []]
    assert released == [[u] for u in range(U)]  # consumed once


def test_stale_k_zero_equals_on_policy() -> None:
    assert table("stale_k:0") == table("on_policy")


def test_sync_interval_and_offset() -> None:
    # Trinity-RFT: lag (u mod M) + N, clamped at version 0.  M = 3, N = 1: lags 1,2,3,1,2,3,1,2.
    versions, staleness, generated, _ = table("sync:3,1")
    assert versions == [0, 0, 0, 2, 2, 2, 5, 5]
    assert staleness == [0, 1, 2, 1, 2, 3, 1, 2]
    assert generated == [[0, 1, 2], [], [3, 4, 5], [], [], [6, 7], [], []]


def test_stages_mu_grpo() -> None:
    versions, staleness, generated, _ = table("stages:4")
    assert versions == [0, 0, 0, 0, 4, 4, 4, 4]
    assert staleness == [0, 1, 2, 3, 0, 1, 2, 3]
    assert generated == [[0, 1, 2, 3], [], [], [], [4, 5, 6, 7], [], [], []]
    assert table("stages:4") == table("sync:4,0")


def test_epochs_reuse_one_batch() -> None:
    s = parse_schedule("epochs:3")
    assert [s.key(u) for u in range(U)] == [0, 0, 0, 3, 3, 3, 6, 6]
    versions, staleness, generated, released = table("epochs:3")
    assert versions == [0, 0, 0, 3, 3, 3, 6, 6] and staleness == [0, 1, 2, 0, 1, 2, 0, 1]
    assert generated == [[0], [], [], [3], [], [], [6], []]
    assert released == [[], [], [0], [], [], [3], [], [6]]  # kept until its last epoch


def test_offline_fixed_dataset_cycles_and_is_never_released() -> None:
    s = parse_schedule("offline:3")
    assert [s.key(u) for u in range(U)] == [0, 1, 2, 0, 1, 2, 0, 1]
    versions, staleness, generated, released = table("offline:3")
    assert versions == [0] * U and staleness == list(range(U))
    assert generated == [[0, 1, 2]] + [[]] * (U - 1)
    assert released[: U - 3] == [[]] * (U - 3)  # still needed later
    assert released[U - 3:] == [[2], [0], [1]]  # last uses


def test_fresh_offline_and_mixture_use_the_frozen_initial_policy() -> None:
    offline, mixture = parse_schedule("offline"), parse_schedule("mixture:0.25")
    assert offline.other_share == 1.0 and mixture.other_share == 0.25
    assert [mixture.version(u) for u in range(U)] == list(range(U))
    assert parse_schedule("on_policy").other_share == 0.0


def test_generation_stops_at_the_last_update() -> None:
    assert parse_schedule("stale_k:5").generate_at(0, 3) == [0, 1, 2]


@pytest.mark.parametrize("bad", ["", "stale", "stale_k", "stale_k:", "stale_k:-1", "stale_k:1.5", "sync:3",
                                 "sync:0,1", "sync:2,-1", "stages:0", "epochs:0", "offline:0", "mixture:1.5",
                                 "mixture:-0.1", "mixture:nan", "mixture:x", "on_policy:3", 3])
def test_bad_schedules_name_the_valid_forms(bad: object) -> None:
    with pytest.raises(ValueError) as info:
        parse_schedule(bad)  # type: ignore[arg-type]
    assert all(form in str(info.value) for form in SCHEDULE_FORMS)


def test_negative_staleness_is_named() -> None:
    with pytest.raises(ValueError, match=r"schedule 'stale_k:-4': parameter K=-4 is out of range; valid: an int in \[0, 1000000000\]"):
        parse_schedule("stale_k:-4")
