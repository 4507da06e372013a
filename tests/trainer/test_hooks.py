"""The loop's hooks (``trainer.UpdateHook``): called once per update in order, handed the rollouts each update
consumes and the steps it took, and a run with a hook trains exactly as one without."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from offpolicylab import trainer
from offpolicylab.contracts import Rollout
from offpolicylab.stack import Stack
from tests.small_runs import mdp_config, read_rows

TIMES = ("time_update_s", "time_elapsed_s")


class Recorder(trainer.UpdateHook):
    """Records every call: (kind, update), the consumed rollouts and the steps' rollouts and losses."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.consumed: list[Rollout] = []
        self.stepped: list[Rollout] = []
        self.losses: list[float] = []

    def on_batch(self, update: int, stack: Stack, rollouts: list[Rollout]) -> None:
        self.calls.append(("batch", update))
        (rollout,) = rollouts
        self.consumed.append(rollout)

    def on_update(self, update: int, stack: Stack, steps: list[Any], rows: list[dict[str, Any]]) -> None:
        self.calls.append(("update", update))
        (step,), (row,) = steps, rows
        self.stepped.append(step.rollout)
        self.losses.append(float(step.output.loss.detach()))
        assert row["update"] == update and step.batch.logp.shape == step.rollout.response_mask.shape


def test_hooks_see_every_update_in_order_and_leave_the_run_untouched(tmp_path: Path) -> None:
    """stale_k:2 for 5 updates: on_batch then on_update at each update; the rollout handed before the step is the
    one the step consumed (the same object), generated 2 updates earlier once the queue is full; the metrics equal a
    run without hooks bit for bit (the clocks aside), and the hook's losses are the metrics' losses."""
    config = mdp_config(schedule="stale_k:2", updates=5)
    hook = Recorder()
    trainer.train(config, tmp_path / "hooked", hooks=[hook])
    trainer.train(config, tmp_path / "plain")
    assert hook.calls == [(kind, u) for u in range(5) for kind in ("batch", "update")]
    assert all(a is b for a, b in zip(hook.consumed, hook.stepped, strict=True))
    assert [int(r.version.unique()) for r in hook.consumed] == [0, 0, 0, 1, 2]
    hooked, plain = read_rows(tmp_path / "hooked"), read_rows(tmp_path / "plain")
    for a, b in zip(hooked, plain, strict=True):
        assert {k: v for k, v in a.items() if k not in TIMES} == {k: v for k, v in b.items() if k not in TIMES}
    assert [float(row["loss"]) for row in hooked] == hook.losses
