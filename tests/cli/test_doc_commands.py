"""Every ``offpolicylab`` command in the fenced ``bash`` blocks of README.md, docs/*.md and examples/**/README.md
runs as written, in document order, in one working folder:

* placeholders are filled with tiny real inputs (:data:`PLACEHOLDERS`: a run recorded with a sampler mismatch for
  ``RUN``, the shipped example logs for a verl / TRL log, ...), and ``...`` with the flags of the block's first
  ``run``;
* a block's ``NAME="..."`` lines are expanded in its later commands (``$NAME``);
* files the docs write out (a fenced block introduced by `` `NAME`: `` or starting with ``# NAME``) are written
  into the folder first;
* commands on the synthetic LM, the demo and Ray are marked ``slow`` and run N / 100 of their ``--updates N`` (at
  least 2; the demo 2 updates); the toy worlds' commands run as written;
* commands that need what no test machine has — a model download, a Ray cluster, a shared file system — are listed
  in :data:`NOT_RUN` with the reason; the test fails when a command is neither run nor listed there.

pip, verl, pytest, benchmark and experiment scripts are not offpolicylab commands, nor is the calibration module
(``python -m offpolicylab.synthetic_lm_calibration``: minutes of distillation); they are not run here."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "examples").rglob("README.md"))]
PROGRAM = re.compile(r"^(?:offpolicylab|python -m offpolicylab(?:\.cli)?)(?:\s|$)")

#: substring of a command → why it is not run here (checked: each still names a documented command).
NOT_RUN = {
    "--model": "an LLM run needs a model download (docs/llm.md: SmolLM2-135M from PyPI, 93 MB) and GSM8k",
    "convert-gguf": "needs the SmolLM2 GGUF download (docs/llm.md)",
    "calibrate": "needs the SmolLM2 GGUF download (docs/llm.md) and GSM8k",
    "--ray-address head-node": "needs a Ray cluster at head-node:6379 and a shared folder",
}
HEAVY = ("synthetic_lm", "demo", "--engine ray", "grid_small.json")


@dataclass
class Command:
    doc: str
    line: int
    text: str
    raw: str  # as the document writes it (``...`` not filled in)

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def fenced_blocks(path: Path) -> list[tuple[str, int, str, str]]:
    """(language, first line number, body, the paragraph line before it) of each fenced block."""
    text = path.read_text()
    blocks = []
    for match in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M):
        start = text.count("\n", 0, match.start()) + 2
        before = [line for line in text[:match.start()].splitlines() if line.strip()]
        blocks.append((match.group(1), start, match.group(2), before[-1] if before else ""))
    return blocks


def doc_commands() -> list[Command]:
    commands = []
    for path in DOCS:
        for language, start, body, _ in fenced_blocks(path):
            if language not in ("bash", "sh"):
                continue
            joined = re.sub(r"\\\n", " ", body)
            numbers = [start + i for i, line in enumerate(body.splitlines()) if not line.rstrip().endswith("\\")]
            first_run: list[str] | None = None
            variables: dict[str, str] = {}  # NAME="..." lines of the block, expanded in later commands
            for number, line in zip(numbers, joined.splitlines(), strict=False):
                line = line.split(" # ")[0].split("  #")[0].strip()
                assigned = re.match(r"^([A-Z_][A-Z0-9_]*)=(\S.*)$", line)
                if assigned and len(shlex.split(line)) == 1:
                    variables[assigned.group(1)] = " ".join(shlex.split(assigned.group(2)))
                    continue
                line = expand(line, variables)
                for part in (p.strip() for p in line.split("&&")):
                    words = part.split()
                    while words and re.match(r"^[A-Z_]+=", words[0]):  # environment assignments
                        words = words[1:]
                    command = raw = " ".join(words)
                    if not PROGRAM.match(command):
                        continue
                    if first_run is None and " run " in f" {command} " and "..." not in command:
                        first_run = shlex.split(command)
                    if "..." in command and first_run is not None:
                        flags = first_run[first_run.index("run") + 1:]
                        if "--out" in flags:
                            flags = flags[:flags.index("--out")]
                        command = command.replace("...", shlex.join(flags))
                    commands.append(Command(str(path.relative_to(REPO)), number, command, raw))
    return commands


def expand(line: str, variables: dict[str, str]) -> str:
    """``$NAME`` / ``${NAME}`` replaced by the block's value of NAME (others left as they are)."""
    return re.sub(r"\$\{?([A-Z_][A-Z0-9_]*)\}?", lambda m: variables.get(m.group(1), m.group(0)), line)


def doc_files() -> dict[str, str]:
    """{file name: content} of the fenced blocks that the docs introduce as a file."""
    files = {}
    for path in DOCS:
        for _, _, body, before in fenced_blocks(path):
            first = body.splitlines()[0] if body.strip() else ""
            named = re.match(r"^#\s*([\w.-]+\.(?:ya?ml|json|py))\b", first)
            introduced = re.search(r"`([\w.-]+\.(?:ya?ml|json|py))`[^`]*:$", before.strip())
            name = named.group(1) if named else introduced.group(1) if introduced else None
            if name and name not in files:
                files[name] = body
    return files


def shrink(command: str) -> str:
    """A heavy command (:data:`HEAVY`) with ``--updates N`` → N // 100 (at least 2); a replay's ``--updates A:B``
    (of a long run's updates) → A // 100 : B // 100, the updates of the small recorded run standing in for it."""
    def updates(match: re.Match[str]) -> str:
        if match.group(2):
            return f"--updates {int(match.group(1)) // 100}:{max(int(match.group(2)) // 100, 2)}"
        if not any(word in command for word in HEAVY):
            return match.group(0)
        return f"--updates {max(int(match.group(1)) // 100, 2)}"
    return re.sub(r"--updates (\d+)(?::(\d+))?", updates, command)


def cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(cwd)]), "OMP_NUM_THREADS": "1",
           "WANDB_MODE": "offline", "MLFLOW_TRACKING_URI": f"file:{cwd / 'mlruns'}"}
    return subprocess.run([sys.executable, "-m", "offpolicylab", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=1200)


def _recorded_run(work: Path) -> None:
    """``RUN``: a run whose samples hold the whole batch with sampler log-probs (a bf16 sampler)."""
    done = cli(["run", "--world", "token_mdp", "--objective", "grpo", "--policy-param", "sampler_precision=bf16",
                "--updates", "4", "--sample-every", "1", "--out", "RUN"], work)
    assert done.returncode == 0, done.stderr


def _tensorboard(folder: Path) -> None:
    """A TRL-style TensorBoard folder (``train/reward``, ``train/grad_norm``)."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(folder))
    for step in range(1, 9):
        writer.add_scalar("train/reward", 0.1 * step, step)
        writer.add_scalar("train/grad_norm", 1.0, step)
    writer.close()


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("docs") / "work"
    work.mkdir()
    shutil.copytree(REPO / "examples", work / "examples")
    logs = REPO / "examples" / "logs"
    (work / "p").mkdir()
    shutil.copyfile(logs / "verl_m2po.jsonl", work / "p" / "e.jsonl")
    shutil.copytree(logs / "trl_m2po", work / "OUTPUT_DIR")
    _tensorboard(work / "OUTPUT_DIR" / "runs")
    for name in ("runs/rec", "runs/trl_m2po"):
        shutil.copytree(logs / "trl_m2po_recorded", work / name)
    _recorded_run(work)
    for name, text in doc_files().items():
        (work / name).write_text(text)
    return work


COMMANDS = doc_commands()


def test_every_command_is_run_or_listed_with_a_reason() -> None:
    assert len(COMMANDS) > 20
    for pattern in NOT_RUN:  # every exclusion still names a documented command
        assert any(pattern in command.text for command in COMMANDS), pattern


def params(commands: list[Command]) -> list[object]:
    """One case per command, in order; ``slow``: a heavy command (:data:`HEAVY`) and every later command that
    names what a slow one wrote."""
    slow_outputs: list[str] = []
    cases = []
    for command in commands:
        words = shlex.split(command.text)
        slow = any(word in command.text for word in HEAVY) or any(out in words for out in slow_outputs)
        if slow and "--out" in words:
            slow_outputs.append(words[words.index("--out") + 1])
        cases.append(pytest.param(command, id=command.id, marks=[pytest.mark.slow] if slow else []))
    return cases


RUN = [command for command in COMMANDS if not any(pattern in command.text for pattern in NOT_RUN)]


@pytest.mark.parametrize("command", params(RUN))
def test_documented_command_runs(command: Command, work: Path) -> None:
    if "--engine ray" in command.text:
        pytest.importorskip("ray", reason="the ray extra is not installed")
    args = shlex.split(shrink(command.text))
    args = args[1:] if args[0] == "offpolicylab" else args[3:]  # offpolicylab / python -m offpolicylab[.cli]
    if args[0] == "demo" and "--updates" not in args:  # the smallest demo: every configuration, 2 updates
        args += ["--updates", "2"]
    stdout = None
    if ">" in args:  # a shell redirection of the printed output
        stdout = work / args[args.index(">") + 1]
        args = args[:args.index(">")]
    if "--resume" in command.raw and "--updates" not in command.raw:  # "after a kill": stopped before its end
        out = Path(work / args[args.index("--out") + 1])
        (out / "summary.json").unlink(missing_ok=True)
    done = cli(args, work)
    assert done.returncode == 0, f"{command.id}: {command.text}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    if stdout is not None:
        stdout.write_text(done.stdout)
