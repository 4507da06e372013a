"""``offpolicylab replay`` and the recorder: every column of the replay table against NumPy worked out from the
formulas (PPO's clip rule, REINFORCE's gradient A/n, Kish's ESS, M̂₂), and a record scored micro-batch by
micro-batch reproduces the masks the run applied."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from offpolicylab import cli, replay
from offpolicylab.integrations.record import Recorder
from offpolicylab.objectives import TokenBatch, get_objective
from offpolicylab.run_dir import RunDir, RunError
from offpolicylab.run_records import load_run, load_samples

EPS = 0.2


def random_batch(seed: int, rows: int = 3, length: int = 6, spread: float = 0.4) -> TokenBatch:
    gen = torch.Generator().manual_seed(seed)
    delta = spread * torch.randn(rows, length, generator=gen)
    lengths = torch.randint(2, length + 1, (rows,), generator=gen)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).float()
    advantages = torch.randn(rows, generator=gen)
    advantages[0] = 0.0  # a sequence without signal
    entropy = 3.0 * torch.rand(rows, length, generator=gen)
    return TokenBatch(logp=delta, behavior_logp=torch.zeros_like(delta), advantages=advantages, mask=mask,
                      entropy=entropy)


def record(path: Path, objective: str, params: dict, steps: list[list[TokenBatch]], every: int = 1) -> Path:
    """What a plug-in does: score each micro-batch with the objective, hand both to the recorder, end the step."""
    recorder = Recorder(path, {"engine": "test", "objective": objective, "objective_params": params}, every)
    scorer = get_objective(objective, **params)
    for batches in steps:
        for batch in batches:
            recorder.add(batch, scorer(batch), staleness=3)
        recorder.end_step(reward_mean=0.5)
    recorder.close()
    return path


def numpy_tokens(steps: list[list[TokenBatch]]) -> dict[str, np.ndarray]:
    """Valid tokens of every micro-batch, with n = the micro-batch's valid-token count (token-mean)."""
    out: dict[str, list[np.ndarray]] = {"delta": [], "adv": [], "entropy": [], "n": [], "part": []}
    part = 0
    for batches in steps:
        for batch in batches:
            valid = batch.mask.numpy() > 0
            out["delta"].append(batch.delta().numpy()[valid].astype(np.float64))
            out["adv"].append(batch.advantages.numpy()[valid].astype(np.float64))
            out["entropy"].append(batch.entropy.numpy()[valid])
            out["n"].append(np.full(valid.sum(), valid.sum(), dtype=np.float64))
            out["part"].append(np.full(valid.sum(), part))
            part += 1
    return {key: np.concatenate(value) for key, value in out.items()}


def test_replay_table_matches_the_formulas_by_hand(tmp_path: Path) -> None:
    steps = [[random_batch(1), random_batch(2)], [random_batch(3)]]
    path = record(tmp_path / "rec", "grpo", {"eps_low": EPS, "eps_high": EPS}, steps)
    files = replay.sample_files(path)
    objectives, shown, own = replay.parse_objectives("reinforce,grpo", [], replay.run_objective(path))
    assert own == "grpo" and shown["grpo"] == ""
    pooled = replay.replay(files, objectives, own)
    rows = {row["objective"]: row for row in replay.summary_table(pooled, shown)}
    deciles = replay.decile_table(pooled)

    t = numpy_tokens(steps)
    r = np.exp(t["delta"])
    # PPO clip (Schulman et al. 2017): the min cuts A > 0 above 1 + ε and A < 0 below 1 − ε
    clipped = ((t["adv"] > 0) & (r > 1 + EPS)) | ((t["adv"] < 0) & (r < 1 - EPS))
    signal = t["adv"] != 0
    weight = np.where(clipped, 0.0, r)  # g / g_RF: r on kept tokens, 0 on clipped ones
    grad = np.abs(t["adv"] * weight / t["n"])
    edges = np.quantile(t["entropy"], np.arange(1, 10) / 10)
    decile = np.searchsorted(edges, t["entropy"], side="right")
    top = decile >= 8

    def kish(w: np.ndarray) -> float:
        return w.sum() ** 2 / (w.size * (w**2).sum())

    parts = np.unique(t["part"])
    counts = np.array([(t["part"] == p).sum() for p in parts])
    ess_before = np.average([kish(r[t["part"] == p]) for p in parts], weights=counts)
    ess_after = np.average([kish(weight[(t["part"] == p) & signal]) for p in parts], weights=counts)

    grpo = rows["grpo"]
    assert grpo["tokens"] == t["delta"].size
    assert grpo["silenced"] == pytest.approx(clipped.mean())
    assert grpo["silenced_top20"] == pytest.approx(clipped[top].mean())
    assert grpo["weight_mean"] == pytest.approx(weight[signal].mean(), rel=1e-6)
    assert grpo["grad_top20"] == pytest.approx(grad[top].sum() / grad.sum(), rel=1e-6)
    assert grpo["ess_before"] == pytest.approx(ess_before, rel=1e-6)
    assert grpo["ess_after"] == pytest.approx(ess_after, rel=1e-6)
    assert grpo["m2_before"] == pytest.approx(np.mean(t["delta"] ** 2), rel=1e-6)
    assert grpo["m2_after"] == pytest.approx(np.mean(t["delta"][~clipped] ** 2), rel=1e-6)
    assert grpo["as_run"] == 1.0

    reinforce = rows["reinforce"]
    rf_grad = np.abs(t["adv"] / t["n"])
    assert reinforce["silenced"] == 0.0 and reinforce["weight_mean"] == pytest.approx(1.0)
    assert reinforce["ess_after"] == pytest.approx(1.0) and np.isnan(reinforce["as_run"])
    assert reinforce["grad_top20"] == pytest.approx(rf_grad[top].sum() / rf_grad.sum(), rel=1e-6)

    for d in range(10):
        row = next(x for x in deciles if x["objective"] == "grpo" and x["decile"] == d + 1)
        assert row["tokens"] == (decile == d).sum()
        assert row["silenced"] == pytest.approx(clipped[decile == d].mean())
        assert row["grad_share"] == pytest.approx(grad[decile == d].sum() / grad.sum(), rel=1e-6)


def test_replay_scores_each_micro_batch_as_the_run_did(tmp_path: Path) -> None:
    """M2PO's M̂₂ is a batch statistic: one micro-batch far off-policy, one close.  The run masked each on its own;
    replaying the joined batch would mask differently, replaying micro-batch by micro-batch reproduces the run."""
    far, near = random_batch(4, spread=1.0), random_batch(5, spread=0.05)
    m2po = get_objective("m2po", tau=0.04)
    path = record(tmp_path / "rec", "m2po", {"tau": 0.04}, [[far, near]])
    joined = TokenBatch(logp=torch.cat([far.logp, near.logp]), behavior_logp=torch.zeros(6, 6),
                        advantages=torch.cat([far.advantages, near.advantages]), mask=torch.cat([far.mask, near.mask]))
    separate = torch.cat([m2po(far).token_mask, m2po(near).token_mask])
    assert not torch.equal(m2po(joined).token_mask, separate)  # the micro-batch boundary matters here
    objectives, shown, own = replay.parse_objectives("m2po", [], replay.run_objective(path))
    rows = replay.summary_table(replay.replay(replay.sample_files(path), objectives, own), shown)
    valid = torch.cat([far.mask, near.mask]) > 0
    assert rows[0]["as_run"] == 1.0
    assert rows[0]["silenced"] == pytest.approx(float((separate[valid] == 0).float().mean()))


def test_recorder_writes_rows_samples_and_config(tmp_path: Path) -> None:
    steps = [[random_batch(s), random_batch(s + 10)] for s in range(5)]
    path = record(tmp_path / "rec", "grpo", {}, steps, every=2)
    run = load_run(path)
    assert run.objective == "grpo" and run.config["record_every"] == 2
    assert [int(f.stem[-6:]) for f in run.sample_files] == [0, 2, 4]
    grpo = get_objective("grpo")
    for update, batches in enumerate(steps):
        expected = np.mean([float(grpo(b).metrics["clip_frac"]) for b in batches])
        assert run.metrics["clip_frac"][update] == pytest.approx(expected)
    assert (run.metrics["staleness_mean"] == 3.0).all() and (run.metrics["reward_mean"] == 0.5).all()
    arrays = load_samples(run.sample_files[1])
    assert arrays["batch_log_ratio"].shape == (6, 6) and list(arrays["micro_batch"]) == [0, 0, 0, 1, 1, 1]
    valid = arrays["batch_mask"] > 0
    np.testing.assert_array_equal(arrays["log_ratio"], arrays["batch_log_ratio"][valid])  # all tokens, in order
    np.testing.assert_array_equal(arrays["staleness"], np.full(6, 3.0, dtype=np.float32))
    assert run.summary["status"] == "completed" and run.summary["updates_recorded"] == 5
    with pytest.raises(RunError, match="already holds a run"):
        Recorder(path, {"objective": "grpo"})


def test_recorder_without_entropy_or_staleness_writes_neither(tmp_path: Path) -> None:
    batch = random_batch(7)
    batch.entropy = None
    recorder = Recorder(tmp_path / "rec", {"objective": "grpo"})
    recorder.add(batch, get_objective("grpo")(batch))
    recorder.end_step()
    recorder.close()
    arrays = load_samples(next((tmp_path / "rec" / "samples").iterdir()))
    assert "entropy" not in arrays and "batch_entropy" not in arrays
    assert (arrays["staleness"] == -1).all() and "staleness_mean" not in load_run(tmp_path / "rec").metrics


def test_cli_replay_writes_table_and_figure(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = record(tmp_path / "rec", "m2po", {"tau": 0.04}, [[random_batch(s)] for s in range(3)])
    out = tmp_path / "replay"
    assert cli.main(["replay", str(path), "--objectives", "reinforce,grpo,m2po,gspo", "--param", "grpo.eps_high=0.28",
                     "--updates", "1:2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    saved = json.loads((out / "replay.json").read_text())
    assert saved["files"] == 2 and saved["updates"] == [1, 2] and saved["run_objective"] == "m2po"
    assert [row["objective"] for row in saved["rows"]] == ["reinforce", "grpo", "m2po", "gspo"]
    assert saved["rows"][1]["params"] == "eps_high=0.28" and saved["rows"][2]["as_run"] == 1.0
    assert "which tokens each objective silences here" in printed and "gspo" in printed
    assert (out / "replay.png").stat().st_size > 0 and (out / "replay_deciles.csv").is_file()


def test_replay_bad_input_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from offpolicylab import trainer
    from tests.small_runs import mdp_config

    ours = tmp_path / "ours"
    trainer.train(mdp_config(updates=4, sample_every=2), ours)
    for path in (ours / "samples").glob("*.npz"):  # as an older run wrote them: histogram arrays alone
        with np.load(path) as data:
            kept = {key: data[key] for key in data.files if not key.startswith("batch_") and key != "micro_batch"}
        np.savez(path, **kept)
    recorded = record(tmp_path / "rec", "grpo", {}, [[random_batch(1)]])
    cases = {
        "histogram samples only": ([str(ours)], "holds token samples without the whole batch"),
        "no samples": ([str(tmp_path / "ours" / "checkpoint")], "holds no samples/update_XXXXXX.npz file"),
        "missing path": ([str(tmp_path / "absent")], "does not exist"),
        "unknown objective": ([str(recorded), "--objectives", "grpo,nope"], "unknown objective"),
        "repeated objective": ([str(recorded), "--objectives", "grpo,grpo"], "--objectives 'grpo,grpo' is invalid"),
        "param of an unlisted objective": ([str(recorded), "--param", "cispo.eps_high=2"], "--param 'cispo.eps_high=2'"),
        "bad parameter value": ([str(recorded), "--objectives", "m2po", "--param", "m2po.tau=-1"], "tau"),
        "bad update range": ([str(recorded), "--updates", "5:1"], "--updates '5:1' is invalid"),
        "needs rewards": ([str(recorded), "--objectives", "red_drop"], "red_drop cannot be replayed"),
    }
    for case, (args, message) in cases.items():
        out = tmp_path / f"out-{abs(hash(case))}"
        with pytest.raises(SystemExit) as stop:
            cli.main(["replay", *args, "--out", str(out)])
        err = capsys.readouterr().err
        assert stop.value.code == 2 and err.count("\n") == 1 and message in err, (case, err)
        assert not out.exists(), case
    assert RunDir(ours).holds_run()


def test_recorder_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from offpolicylab.integrations import record as record_module

    monkeypatch.delenv(record_module.RECORD_ENV, raising=False)
    assert Recorder.from_env({"objective": "grpo"}) is None
    monkeypatch.setenv(record_module.RECORD_ENV, str(tmp_path / "rec"))
    monkeypatch.setenv(record_module.EVERY_ENV, "x")
    with pytest.raises(ValueError, match="OFFPOLICYLAB_RECORD_EVERY='x' is invalid"):
        Recorder.from_env({"objective": "grpo"})
    monkeypatch.setenv(record_module.EVERY_ENV, "5")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    recorder = Recorder.from_env({"objective": "grpo"})
    assert recorder.run.path == tmp_path / "rec" / "rank=1" and recorder.every == 5
    recorder.close()
    assert not (tmp_path / "rec" / "rank=1" / "summary.json").exists()  # nothing recorded, no summary


def test_our_runs_replay_exactly(tmp_path: Path) -> None:
    """Our sample files carry the whole batch (histogram arrays + ``whole_batch``): a stale token-MDP run of M2PO
    is replayed exactly, rewards and groups included (RED-Drop needs them)."""
    from offpolicylab import trainer
    from tests.small_runs import mdp_config

    run = tmp_path / "run"
    trainer.train(mdp_config(objective="m2po", objective_params={"tau": 0.01}, schedule="stale_k:2", updates=8,
                             sample_every=2, lr=0.5), run)
    objectives, shown, own = replay.parse_objectives("m2po,red_drop", [], replay.run_objective(run))
    assert own == "m2po" and shown["m2po"] == "tau=0.01"
    rows = replay.summary_table(replay.replay(replay.sample_files(run), objectives, own), shown)
    assert rows[0]["as_run"] == 1.0 and rows[0]["silenced"] > 0
    metrics = load_run(run).metrics  # every response has T = 3 tokens: the pooled share is the mean of the rows'
    assert rows[0]["silenced"] == pytest.approx(float(metrics["mask_frac"][[0, 2, 4, 6]].mean()), abs=1e-6)
