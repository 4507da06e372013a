"""Continuing a run: which stored settings a resume may change, and extending a finished or stopped run to more
updates (``offpolicylab run --out RUN --resume --updates N``).

A resume must use the configuration the run was started with (config.json), except

* the fields in :data:`OUTPUT_FIELDS`, which change where the numbers are shown, not the numbers; and
* ``updates``: the run then continues to N updates, and ends with the metrics of one straight run of N updates —
  the rows of every update equal, except that the update where the first run ended also keeps the evaluation it
  made there (an evaluation has its own generator, so it changes nothing after it; with ``metrics_every`` > 1 that
  row also keeps its objective metrics).

Extension is refused where it could not equal a straight run: N below the updates already trained, or a schedule
whose batches near the old end were generated differently because the run was to end there (a ``sync:M,N`` or
``stages:MU`` run stopping inside a generation stage, an ``epochs:E`` run stopping inside an epoch group).  A stale
queue (``stale_k:K``) extends exactly when ``collapse_tail`` is on (the default): the batches the current policy
generates in the last K updates for the collapse detector are the batches a longer run would train on, and the
trainer keeps them in its buffer (:func:`tail_key`).
"""

from __future__ import annotations

from typing import Any

from offpolicylab.staleness import Schedule

#: config.json fields that a resume may change: they decide where the metrics are shown, not what they are.
OUTPUT_FIELDS = ("report_to",)


def config_changes(stored: dict[str, Any], resolved: dict[str, Any]) -> list[str]:
    """The config fields that differ between a run's config.json (``stored``) and a new resolved config, leaving
    out :data:`OUTPUT_FIELDS`; a field (or objective parameter) that a run written before it existed lacks counts
    as its default."""
    from offpolicylab.config import config_params

    defaults = {name: param.default for name, param in config_params().items()}
    stored = {**defaults, **stored, "objective_params": _with_defaults(stored)}
    resolved = {**defaults, **resolved}
    return sorted(key for key in set(stored) | set(resolved)
                  if key not in OUTPUT_FIELDS and stored.get(key) != resolved.get(key))


def _with_defaults(config: dict[str, Any]) -> Any:
    """The objective parameters of a config.json with the defaults of parameters added since it was written."""
    from offpolicylab.objectives import OBJECTIVES

    params = config.get("objective_params")
    name = config.get("objective")
    if not isinstance(params, dict) or not isinstance(name, str) or name not in OBJECTIVES:
        return params
    return {key: params.get(key, param.default) for key, param in OBJECTIVES.params(name).items()} \
        if set(params) <= set(OBJECTIVES.params(name)) else params


def check_extension(schedule: Schedule, old_total: int, new_total: int, next_update: int, collapse_tail: bool,
                    buffered: set[int]) -> None:
    """Refuse (``ValueError`` naming why) continuing a run planned for ``old_total`` updates, at ``next_update``
    with the batches ``buffered``, to ``new_total`` updates unless the result equals a straight run of
    ``new_total``: every update before ``next_update`` drew as many batches as the straight run draws there, and
    every batch the straight run would hold at ``next_update`` is buffered."""
    if new_total < next_update:
        raise ValueError(f"--updates {new_total} is below the {next_update} updates this run has already trained; "
                         f"valid: --updates {next_update} or more")
    for update in range(max(0, next_update - schedule.horizon - 1), next_update):
        if draws(schedule, update, old_total, collapse_tail) != draws(schedule, update, new_total, collapse_tail):
            raise ValueError(f"this {schedule} run cannot be extended from {old_total} to {new_total} updates: at "
                             f"update {update} it generated its batches for a run ending at {old_total}, so the "
                             "result would differ from one straight run; valid: --updates "
                             f"{old_total} (resume as planned)"
                             + ("" if collapse_tail else ", or start runs to extend with collapse_tail=true"))
    needed = {schedule.key(c) for c in range(next_update, min(new_total, next_update + schedule.horizon + 1))
              if schedule.version(c) < next_update and schedule.other_share < 1.0}
    missing = sorted(needed - buffered)
    if missing:
        raise ValueError(f"this {schedule} run cannot be extended from {old_total} to {new_total} updates: the "
                         f"batch(es) {', '.join(map(str, missing[:3]))} that later updates consume were released "
                         f"when the run was to end; valid: --updates {old_total} (resume as planned)")


def watches_tail(schedule: Schedule, update: int, total: int) -> bool:
    """Whether the current policy generates a batch at ``update`` only for the collapse detector: a run without an
    end would generate here, but every batch it would generate is consumed at or after ``total`` (the drained tail of
    a stale queue: the last K updates of ``stale_k:K``).  Versions never decrease with the update, so no batch that a
    later update trains on is generated after this point: drawing the extra batch from the run's own generator leaves
    every trained batch — and so the whole training — unchanged."""
    if schedule.other_share >= 1.0 or schedule.generate_at(update, total):
        return False
    return bool(schedule.generate_at(update, update + schedule.horizon + 1))


def draws(schedule: Schedule, update: int, total: int, collapse_tail: bool) -> int:
    """How many batches the current policy generates at ``update`` of a run of ``total`` updates (the batches it
    trains on, or the collapse detector's one batch in a drained stale tail)."""
    keys = schedule.generate_at(update, total)
    if keys:
        return len(keys)
    return int(collapse_tail and watches_tail(schedule, update, total))


def tail_key(schedule: Schedule, update: int) -> int | None:
    """The buffer key under which a run longer than this one would train on the batch the collapse detector's
    tail generates at ``update`` (one batch generated there in a run without an end), else None."""
    keys = schedule.generate_at(update, update + schedule.horizon + 1)
    return keys[0] if len(keys) == 1 else None
