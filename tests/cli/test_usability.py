"""The command line as a new user meets it: YAML (and JSON) configs equal to the same flags, flags overriding the
file, YAML sweep grids, ``--help`` naming only defaults that apply, ``--version``, ``list --verbose``, and the
console while training: the bar's diagnostics on a terminal, at most one line per few seconds off one."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from offpolicylab import cli
from offpolicylab.config import read_mapping
from offpolicylab.progress import LINE_SECONDS, Progress, SweepProgress, readable
from offpolicylab.run_dir import RunDir
from tests.small_runs import read_rows

FLAGS = ["--world", "token_mdp", "--world-param", "vocab_size=3", "--world-param", "length=3",
         "--world-param", "num_prompts=2", "--objective", "grpo", "--param", "eps_high=0.28", "--updates", "4",
         "--prompts-per-update", "2", "--group-size", "4", "--eval-every", "2", "--lr", "0.1"]
YAML = """\
world: token_mdp
world_params: {vocab_size: 3, length: 3, num_prompts: 2}
objective: grpo
objective_params:
  eps_high: 0.28
updates: 4
prompts_per_update: 2
group_size: 4
eval_every: 2
lr: 0.1
"""


def strip_time(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    return [{k: v for k, v in row.items() if not k.startswith("time_")} for row in rows]


def test_a_yaml_run_equals_the_same_run_from_flags(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(YAML)
    assert cli.main(["run", *FLAGS, "--out", str(tmp_path / "flags")]) == 0
    assert cli.main(["run", "--config", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "yaml")]) == 0
    assert RunDir(tmp_path / "yaml").read_config() == RunDir(tmp_path / "flags").read_config()
    assert strip_time(read_rows(tmp_path / "yaml")) == strip_time(read_rows(tmp_path / "flags"))


def test_flags_override_the_config_file(tmp_path: Path) -> None:
    (tmp_path / "c.yml").write_text(YAML)
    assert cli.main(["run", "--config", str(tmp_path / "c.yml"), "--updates", "2", "--param", "eps_low=0.1",
                     "--out", str(tmp_path / "r")]) == 0
    stored = RunDir(tmp_path / "r").read_config()
    assert stored["updates"] == 2 and stored["objective_params"]["eps_low"] == 0.1
    assert stored["objective_params"]["eps_high"] == 0.28  # the file's, merged with the flag's


def test_config_file_errors_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("world: [token_mdp\n")
    with pytest.raises(ValueError, match=r"^--config c is not valid YAML \(.* at line \d+\)$"):
        read_mapping(tmp_path / "bad.yaml", "--config c", "config fields")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ValueError, match="holds a YAML list; valid: a YAML mapping of config fields"):
        read_mapping(tmp_path / "list.yaml", "--config list.yaml", "config fields")
    (tmp_path / "c.txt").write_text(YAML)
    with pytest.raises(ValueError, match="not valid JSON .*; valid: JSON, or YAML in a file named .yaml / .yml"):
        read_mapping(tmp_path / "c.txt", "--config c.txt", "config fields")


def test_a_yaml_grid_runs_like_its_json_twin(tmp_path: Path) -> None:
    grid = {"base": {"world": "bandit", "updates": 3, "eval_every": 3, "sample_every": 0},
            "axes": {"objective": ["grpo", {"label": "no_tr", "objective": "grpo",
                                            "objective_params": {"eps_low": "inf", "eps_high": "inf"}}]}}
    (tmp_path / "g.json").write_text(json.dumps(grid))
    (tmp_path / "g.yaml").write_text("""\
base: {world: bandit, updates: 3, eval_every: 3, sample_every: 0}
axes:
  objective:
    - grpo
    - label: no_tr
      objective: grpo
      objective_params: {eps_low: inf, eps_high: inf}
""")
    assert cli.main(["sweep", str(tmp_path / "g.json"), "--out", str(tmp_path / "json")]) == 0
    assert cli.main(["sweep", str(tmp_path / "g.yaml"), "--out", str(tmp_path / "yaml")]) == 0
    for cell in ("objective=grpo", "objective=no_tr"):
        assert strip_time(read_rows(tmp_path / "yaml" / cell)) == strip_time(read_rows(tmp_path / "json" / cell))


def test_help_names_only_defaults_that_apply(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(required unless --config or --resume gives it)" in text
    assert "default: token_mdp" not in text and "default: grpo" not in text and "default: None" not in text
    assert "the world's or policy's choice, else adam" in text


def test_version_and_verbose_list(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("offpolicylab ")
    assert cli.main(["list", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "      tau=0.04  " in out  # m2po's τ with its doc
    assert "kl_coef=0  β of the KL penalty" in out and "[a float in [0, inf]]" in out
    assert "0.0001999800026662447" not in out
    assert readable(0.0001999800026662447) == "0.0002" and readable((0.5, 1.0)) == "0.5,1" and readable(None) == "none"


def test_lines_off_a_terminal_are_throttled(capsys: pytest.CaptureFixture[str]) -> None:
    now = [0.0]
    lines: list[str] = []
    view = Progress("lines", total=100, start=0, write=lines.append, clock=lambda: now[0])
    for update in range(100):
        now[0] += 0.1  # 10 s of updates
        row = {"update": update, "reward_mean": 0.5, "loss": 0.1, "grad_norm": 1.0, "ess": 0.9}
        if update == 50:
            row["eval_reward_sampled"] = 0.75
        warnings = ["collapse detected"] if update == 70 else [None]
        view.update([row], [""], warnings)
    updates = [line for line in lines if line.startswith("update ")]
    assert len(updates) <= 10 / LINE_SECONDS + 2
    assert updates[0].startswith("update 0 (1/100 done)") and updates[-1].startswith("update 99 (100/100 done)")
    assert "  eval update 50  eval_reward_sampled 0.75" in lines
    assert "warning: update 70: collapse detected" in lines


def test_bar_on_a_terminal_shows_the_diagnostics() -> None:
    stream = io.StringIO()
    view = Progress("bar", total=3, start=0, stream=stream)
    row = {"update": 0, "reward_mean": 0.25, "clip_frac": 0.125, "ratio_p999": 1.5, "ess": 0.875, "entropy": 1.25,
           "loss": 0.5, "grad_norm": 1.0, "eval_reward_sampled": 0.5}
    view.update([row], [""], [None])
    view.close()
    text = stream.getvalue()
    for part in ("reward=0.25", "clip=0.125", "r_p99.9=1.5", "ess=0.875", "entropy=1.25", "update 0",
                 "eval update 0  eval_reward_sampled 0.5"):
        assert part in text


def test_sweep_lines_count_cells() -> None:
    lines: list[str] = []
    now = [0.0]
    view = SweepProgress(3, "lines", write=lines.append, clock=lambda: now[0])
    view.finished([{"status": "completed"}], running=2)
    now[0] += 1.0  # within LINE_SECONDS: no line
    view.finished([{"status": "failed"}], running=1)
    view.finished([{"status": "completed"}], running=0)  # the last: always
    assert lines == ["sweep: 1/3 cells done, 2 running, 0 failed", "sweep: 3/3 cells done, 0 running, 1 failed"]


def test_run_off_a_terminal_prints_the_start_line_and_few_lines(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    flags = [flag for index, flag in enumerate(FLAGS) if "--updates" not in FLAGS[index - 1:index + 1]
             and "--eval-every" not in FLAGS[index - 1:index + 1]]  # each flag once (a repeat is refused)
    assert cli.main(["run", *flags, "--updates", "30", "--eval-every", "10", "--out", str(tmp_path / "r")]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("offpolicylab: token_mdp / tabular / grpo / on_policy, 30 updates (0..29); ")
    assert sum(line.startswith("update ") for line in err) < 10  # not one line per update
    assert any(line.startswith("update 29 (30/30 done)") for line in err)
    assert sum(line.startswith("  eval update") for line in err) == 4  # updates 0, 10, 20, 29


def test_hub_data_without_datasets_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """``hub=NAME`` needs ``datasets`` (in the llm extra): without it, one line naming the package and the extra."""
    import builtins

    from offpolicylab.worlds.gsm8k import load_hub_problems

    real_import = builtins.__import__

    def no_datasets(name, *args, **kwargs):
        if name == "datasets":
            raise ImportError("No module named 'datasets'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_datasets)
    with pytest.raises(ValueError, match=r"hub=NAME needs the datasets package \(the llm extra"):
        load_hub_problems("openai/gsm8k", "test")


def test_the_llm_extra_installs_datasets() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]
    assert any(req.startswith("datasets") for req in project["optional-dependencies"]["llm"])
    tracking = project["optional-dependencies"]["tracking"]
    assert {req.split(">")[0] for req in tracking} == {"tensorboard", "wandb", "mlflow-skinny", "trackio"}
    assert "tracking" in project["optional-dependencies"]["dev"][0]
