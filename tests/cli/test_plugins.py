"""Your own objective and world from the command line, as Python packaging does plugins: a package that declares
entry points in the groups ``offpolicylab.objectives`` / ``offpolicylab.worlds`` (here a folder with a
``dist-info`` on PYTHONPATH, which ``importlib.metadata`` reads as an installed distribution), and ``--import
MODULE`` (or the config key ``import``) for a module in the current directory.  Each is used by ``run``, ``list``
and a 2-worker ``sweep``, whose spawned workers must find the same parts; the command runs as the installed
console script runs (``sys.path[0]`` is the script's folder, not the current directory)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

OBJECTIVE_MODULE = '''
import torch
from offpolicylab.objectives import Objective, Param, TokenBatch, register


@register("{name}")
class ClippedReinforce(Objective):
    """l_t = -sg(min(r_t, c)) A_t log pi(y_t): REINFORCE with truncated IS (a test plugin)."""

    params = {{"cap": Param(2.0, float, low=0.0, low_open=True, doc="largest importance weight c")}}

    def token_loss(self, batch: TokenBatch):
        weight = torch.exp(batch.log_ratio).clamp(max=self.cap).detach()
        return -weight * batch.advantages * batch.logp, torch.ones_like(batch.mask), {{}}
'''

WORLD_MODULE = '''
from offpolicylab.registry import Param
from offpolicylab.worlds import WORLDS, SoftmaxBandit

WORLDS.register("coin_bandit", lambda p: SoftmaxBandit((0.0, p)), {"p": Param(0.7, float, low=0.0, high=1.0)},
                doc="two arms, rewards 0 and p (a test plugin)")
'''

TINY = ["--updates", "4", "--eval-every", "2", "--prompts-per-update", "2", "--group-size", "4"]


def make_plugin(root: Path, broken: bool = False) -> Path:
    """A distribution ``labplug`` in ``root``: the package and its dist-info (METADATA, entry_points.txt)."""
    package = root / "labplug"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "objectives.py").write_text(OBJECTIVE_MODULE.format(name="clipped_reinforce"))
    (package / "worlds.py").write_text(WORLD_MODULE)
    (package / "broken.py").write_text("raise RuntimeError('plugin bug')\n")
    info = root / "labplug-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: labplug\nVersion: 0.1\n")
    points = ["[offpolicylab.objectives]", "clipped_reinforce = labplug.objectives",
              "[offpolicylab.worlds]", "coin_bandit = labplug.worlds"]
    if broken:
        points.insert(2, "broken_objective = labplug.broken")
    (info / "entry_points.txt").write_text("\n".join(points) + "\n")
    return root


def cli(args: list[str], cwd: Path, plugin_path: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``offpolicylab ARGS`` as the console script runs it: a script in another folder, so that the current
    directory is not on sys.path by itself."""
    script = cwd.parent / "bin" / "offpolicylab_script.py"
    script.parent.mkdir(exist_ok=True)
    script.write_text("import sys\nfrom offpolicylab.cli import main\nif __name__ == '__main__':\n"
                      "    sys.exit(main())\n")
    paths = [str(REPO_ROOT)] + ([str(plugin_path)] if plugin_path else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    return subprocess.run([sys.executable, str(script), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    work = tmp_path / "work"
    work.mkdir()
    return work, make_plugin(tmp_path / "site")


def test_entry_point_objective_and_world_run_from_the_cli(dirs: tuple[Path, Path]) -> None:
    work, site = dirs
    listed = cli(["list"], work, site)
    assert listed.returncode == 0, listed.stderr
    assert "clipped_reinforce (advantage std): cap=2" in listed.stdout
    assert "coin_bandit: p=0.7" in listed.stdout
    done = cli(["run", "--world", "coin_bandit", "--world-param", "p=0.5", "--objective", "clipped_reinforce",
                "--param", "cap=3", *TINY, "--out", "run"], work, site)
    assert done.returncode == 0, done.stderr
    config = json.loads((work / "run" / "config.json").read_text())
    assert (config["world"], config["world_params"], config["objective"]) == ("coin_bandit", {"p": 0.5},
                                                                              "clipped_reinforce")
    assert config["objective_params"]["cap"] == 3.0
    assert summary(work / "run")["status"] == "completed"
    # the optimum of the two-arm world is p = 0.5: the exact return can only lie in [0, 0.5]
    assert 0.0 <= summary(work / "run")["final_exact_return"] <= 0.5


def test_entry_point_objective_in_a_two_worker_sweep(dirs: tuple[Path, Path]) -> None:
    work, site = dirs
    (work / "grid.yaml").write_text(textwrap.dedent("""\
        base: {world: coin_bandit, updates: 4, eval_every: 2, prompts_per_update: 2, group_size: 4}
        axes: {objective: [clipped_reinforce, grpo], schedule: [on_policy, stale_k:2]}
        """))
    done = cli(["sweep", "grid.yaml", "--out", "sweep", "--workers", "2"], work, site)
    assert done.returncode == 0, done.stdout + done.stderr
    cells = sorted(path.name for path in (work / "sweep").iterdir() if path.is_dir())
    assert len(cells) == 4  # two tasks (one per schedule), one per worker
    assert all(summary(work / "sweep" / name)["status"] == "completed" for name in cells)


def test_import_flag_and_config_key_reach_run_resume_and_sweep_workers(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "my_objectives.py").write_text(OBJECTIVE_MODULE.format(name="my_clip"))
    refused = cli(["run", "--world", "bandit", "--objective", "my_clip", *TINY, "--out", "r"], work)
    assert refused.returncode == 2
    assert "unknown objective 'my_clip'" in refused.stderr and "--import" in refused.stderr
    assert not (work / "r").exists()
    done = cli(["run", "--import", "my_objectives", "--world", "bandit", "--objective", "my_clip", *TINY,
                "--out", "r"], work)
    assert done.returncode == 0, done.stderr
    assert json.loads((work / "r" / "config.json").read_text())["imports"] == "my_objectives"
    extended = cli(["run", "--out", "r", "--resume", "--updates", "6"], work)  # imports from config.json
    assert extended.returncode == 0, extended.stderr
    assert summary(work / "r")["updates_done"] == 6

    (work / "grid.yaml").write_text(textwrap.dedent("""\
        base: {world: bandit, updates: 4, eval_every: 2, prompts_per_update: 2, group_size: 4,
               import: my_objectives}
        axes: {objective: [my_clip, grpo], schedule: [on_policy, stale_k:2]}
        """))
    swept = cli(["sweep", "grid.yaml", "--out", "sweep", "--workers", "2"], work)
    assert swept.returncode == 0, swept.stdout + swept.stderr
    assert summary(work / "sweep" / "objective=my_clip__schedule=stale_k-2")["status"] == "completed"

    (work / "grid2.yaml").write_text((work / "grid.yaml").read_text().replace(", import: my_objectives", ""))
    flagged = cli(["sweep", "grid2.yaml", "--import", "my_objectives", "--out", "sweep2", "--workers", "2"], work)
    assert flagged.returncode == 0, flagged.stdout + flagged.stderr
    assert summary(work / "sweep2" / "objective=my_clip__schedule=stale_k-2")["status"] == "completed"


def test_bad_imports_and_broken_plugins_are_named(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    missing = cli(["run", "--import", "no_such_module", "--world", "bandit", "--objective", "grpo", *TINY,
                   "--out", "r"], work)
    assert missing.returncode == 2
    assert missing.stderr.strip() == ("offpolicylab: error: import no_such_module: the module cannot be imported "
                                      "(ModuleNotFoundError: No module named 'no_such_module'); valid: a module on "
                                      "the path (the current directory or PYTHONPATH) that imports")
    assert not (work / "r").exists()
    site = make_plugin(tmp_path / "site", broken=True)
    broken = cli(["run", "--world", "bandit", "--objective", "broken_objective", *TINY, "--out", "r"], work, site)
    assert broken.returncode == 2
    assert ("objective plugin 'broken_objective' (labplug.broken, entry point of labplug 0.1) failed to load: "
            "RuntimeError: plugin bug") in broken.stderr
    listed = cli(["list"], work, site)  # a broken plugin does not hide the others
    assert listed.returncode == 0 and "clipped_reinforce" in listed.stdout
