"""``offpolicylab`` command line (docs/design.md, "Command line").

    offpolicylab list
    offpolicylab demo [--world synthetic_lm|token_mdp] [--out DIR] [--workers N] [--updates N] [--report-to T]
    offpolicylab run --world W --objective O [--param k=v ...] [--world-param k=v ...] [--policy-param k=v ...]
                     [--schedule S] [--updates N] [--seed S | --seeds S,S,...] [--lr X ...] --out DIR
                     [--resume] [--profile]
    offpolicylab sweep GRID_FILE --out DIR [--workers N] [--engine local] [--rerun-changed]
    offpolicylab plot DIR [DIR ...] --out FIG_DIR
    offpolicylab convert-gguf IN.gguf OUT_DIR [--dtype float32]
    offpolicylab calibrate --model PATH_OR_GGUF --data DIR [--n-prompts 64] [--max-new-tokens N] --out PROFILE.json
    offpolicylab profiles list | show NAME_OR_FILE [NAME_OR_FILE ...]
    offpolicylab analyze LOG --out DIR            (a verl / TRL / TensorBoard log or a run directory)
    offpolicylab replay SAMPLES [--objectives m2po,grpo,...] [--param OBJ.K=V] [--updates A:B]
                        [--corrections ENGINE:K=V:...,...] --out DIR

Bad input prints one line on stderr naming what is valid and exits with code 2; nothing is written before the
whole configuration has been validated (docs/bad_input.md lists every case and its message).  A run that fails
while training exits with code 1 (its summary.json says ``failed``), and so does a full disk or a file-size limit
(one line; ``--resume`` continues from the last checkpoint once there is space).  SIGINT / SIGTERM stop the
command and its worker processes with exit code 130 (runs stay resumable).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from offpolicylab import analyze as analyze_command
from offpolicylab import calibrate as calibrate_command
from offpolicylab import demo as demo_command
from offpolicylab import replay as replay_command
from offpolicylab.aliases import CONFIG_ALIASES, PARAM_ALIASES, alias_value, canonical_config, merge_params
from offpolicylab.config import (
    DEFAULTS,
    TrainConfig,
    apply_overrides,
    config_params,
    is_override,
    override_fields,
    override_target,
    parse_assignments,
    read_mapping,
)
from offpolicylab.registry import Registry, given_twice, import_modules

EXIT_BAD_INPUT = 2
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130
_DICT_FLAGS = {"objective_params": "param", "world_params": "world_param", "policy_params": "policy_param"}
LIST_WIDTH = 118  # `list --verbose` wraps descriptions at this width
ALIAS_DEST = "alias_param_"  # argparse dest of the objective-parameter alias flags (--clip-ratio-high, ...)


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit code 2)."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("offpolicylab").strip()
        _fail(f"{command}: {message}" if command else message)


class _Once(argparse.Action):
    """Store a flag's value; a second value for the same setting (the flag again, or its alias: ``--max-steps 3
    --updates 2``) is refused naming both, as a config file refuses it."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        given: dict[str, str] = namespace.__dict__.setdefault("_given_flags", {})
        spelled = f"{option_string} {values}"
        alias = (option_string or "").removeprefix("--").replace("-", "_")
        if alias in CONFIG_ALIASES:  # their spelling of the value too (--scale-rewards false → mean)
            values = alias_value(alias, values)
        if self.dest in given:
            parser.error(given_twice(given[self.dest], spelled, self.dest.removeprefix(ALIAS_DEST)))
        given[self.dest] = spelled
        setattr(namespace, self.dest, values)


def _fail(message: str) -> NoReturn:
    print(f"offpolicylab: error: {' '.join(str(message).split())}", file=sys.stderr)
    raise SystemExit(EXIT_BAD_INPUT)


# ============================================================================================ parser
def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="offpolicylab", description="Off-policy / stale-data RL objectives on toy worlds.")
    parser.add_argument("--version", action="version", version=f"offpolicylab {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    listing = sub.add_parser("list", help="worlds, objectives (with parameters), schedules, policies")
    listing.add_argument("--verbose", "-v", action="store_true", help="each parameter on its own line with its "
                                                                      "documentation and valid values")
    _add_import_flag(listing)

    demo = sub.add_parser("demo", help="staleness demo (no download, a few minutes on 2 cores)")
    demo_command.add_arguments(demo)

    run = sub.add_parser("run", help="train one run into a run directory", usage=RUN_USAGE,
                         description="Train one run into a run directory.  KEY=VALUE arguments override any "
                                     "setting after the flags, Hydra-style: a config field (lr=0.01), a field of "
                                     "a mapping (objective_params.tau=0.04, world_params.family=forking) or a verl "
                                     "/ TRL name (learning_rate=0.01, actor_rollout_ref.actor.clip_ratio_high=0.28; "
                                     "docs/configs.md).")
    groups = {title: run.add_argument_group(title, text) for title, text in RUN_GROUPS.items()}
    for name, param in config_params().items():
        group = groups[RUN_FIELD_GROUPS.get(name, "training")]
        if name == "imports":
            _add_import_flag(group)
        elif name in _DICT_FLAGS:
            flag = "--" + _DICT_FLAGS[name].replace("_", "-")
            group.add_argument(flag, dest=name, action="append", metavar="K=V", help=f"{param.doc} (repeatable)")
        else:
            aliases = [f"--{alias.replace('_', '-')}" for alias, ours in CONFIG_ALIASES.items() if ours == name]
            group.add_argument("--" + name.replace("_", "-"), *aliases, dest=name, default=None, action=_Once,
                               metavar=param.kind.__name__.upper(),
                               help=f"{param.doc} ({_default_help(name, param)})")
    for alias, ours in PARAM_ALIASES.items():
        groups["objective"].add_argument("--" + alias.replace("_", "-"), dest=ALIAS_DEST + alias, default=None,
                                         metavar="VALUE", action=_Once,
                                         help=f"same as --param {ours}=VALUE (verl / TRL name; docs/configs.md)")
    output = groups["output"]
    output.add_argument("--out", default=None, help="run directory to create (or to continue with --resume); "
                                                    "required unless --print-config")
    output.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    output.add_argument("--profile", action="store_true",
                        help="profile the updates: time per section and top functions on stderr, the full profile "
                             "in --out/profile.txt (and profile.pstats for pstats / snakeviz)")
    setup = groups["config"]
    setup.add_argument("--config", default=None, metavar="FILE",
                       help="a YAML (.yaml, .yml) or JSON file of config fields (docs/configs.md); flags override "
                            "it")
    setup.add_argument("--print-config", action="store_true",
                       help="print the resolved config (every field, defaults filled in) as YAML and exit without "
                            "training; --config reads the file back")
    groups["training"].add_argument(
        "--seeds", default=None, metavar="S,S,...",
        help="train one run per seed (e.g. 0,1,2) into --out/seed=S, each the run that --seed S writes; the "
             "tabular, sequence_model and transformer policies train them as one batched computation")
    world = groups["world"]
    world.add_argument("--model", default=None, metavar="PATH",
                       help="LLM worlds: a local model directory, a .gguf file or a hub id (same as --world-param "
                            "model=PATH; selects --policy hf unless another policy is given)")
    world.add_argument("--trust-remote-code", action="store_true",
                       help="let transformers run the Python code a model folder ships (off unless given; never "
                            "stored in config.json, so give it again with --resume)")

    sweep = sub.add_parser("sweep", help="run a grid of runs, one run directory per cell",
                           usage="offpolicylab sweep GRID --out DIR [options] [KEY=VALUE ...]",
                           description="Run a grid of runs.  KEY=VALUE arguments after the grid override its base "
                                       "config for every cell, as for run (updates=50, "
                                       "objective_params.tau=0.04, learning_rate=0.01); a grid axis cannot be "
                                       "overridden.")
    sweep.add_argument("grid", help="grid file, YAML (.yaml, .yml) or JSON: base config + axes (docs/configs.md)")
    sweep.add_argument("--out", required=True, help="output folder (one sub-folder per cell)")
    sweep.add_argument("--workers", type=int, default=1, help="parallel processes")
    sweep.add_argument("--engine", default="local", help="sweep engine: local (or ray when installed)")
    sweep.add_argument("--ray-address", default=None, metavar="ADDR",
                       help="with --engine ray: the cluster to join (default: $RAY_ADDRESS, else a local Ray)")
    sweep.add_argument("--rerun-changed", action="store_true",
                       help="run again the cells in --out that were run with another config (else refused)")
    sweep.add_argument("--report-to", dest="report_to", default=None, metavar="STR",
                       help="experiment trackers for every cell (overrides the grid's report_to): tensorboard, "
                            "wandb, mlflow, trackio or none, comma-separated")
    _add_import_flag(sweep)

    convert = sub.add_parser("convert-gguf", help="write a GGUF model file as a plain model directory (weights "
                                                  "dequantized, tokenizer and chat template included)")
    convert.add_argument("gguf", metavar="IN", help="the .gguf file")
    convert.add_argument("out", metavar="OUT", help="the model directory to create (must not exist or be empty)")
    convert.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                         help="weight dtype of the directory (default float32)")
    calibrate = sub.add_parser("calibrate", help="token-statistics profile of a real LM sampling GSM8k answers")
    calibrate_command.add_arguments(calibrate)
    profiles = sub.add_parser("profiles", help="token profiles: list the packaged ones, show some side by side")
    calibrate_command.add_profiles_arguments(profiles)

    analyze = sub.add_parser("analyze", help="collapse status and figures of a verl / TRL / TensorBoard log or run")
    analyze_command.add_arguments(analyze)
    replay = sub.add_parser("replay", help="what each objective clips, masks and weights on a run's recorded batches")
    replay_command.add_arguments(replay)

    plot = sub.add_parser("plot", help="figures from run directories (DIR [DIR ...] --out FIG_DIR)", add_help=False)
    plot.add_argument("plot_args", nargs=argparse.REMAINDER)
    return parser


def _add_import_flag(parser: Any) -> None:
    parser.add_argument("--import", dest="imports", action="append", metavar="MODULE",
                        help="import MODULE first (a file MODULE.py in the current directory or a module on "
                             "PYTHONPATH) so that the objectives or worlds it registers can be named; repeatable "
                             "(config key import; docs/plugins.md)")


def main(argv: Sequence[str] | None = None) -> int:
    _refuse_in_worker()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["plot"]:  # everything after `plot` belongs to the plots module
        return _plot(argv[1:])
    args, extras = build_parser().parse_known_args(argv)
    args.overrides = [item for item in extras if is_override(item)] if args.command in ("run", "sweep") else []
    rest = [item for item in extras if item not in args.overrides]
    if rest:
        _fail(f"{args.command}: unrecognized arguments: {' '.join(rest)}"
              + ("; valid: flags of `offpolicylab run --help`, or KEY=VALUE overrides" if args.command in
                 ("run", "sweep") else ""))
    previous = signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM stops like Ctrl-C: workers first
    try:
        return {"list": cmd_list, "demo": demo_command.run_command, "run": cmd_run, "sweep": cmd_sweep,
                "convert-gguf": cmd_convert_gguf,
                "calibrate": calibrate_command.run_command,
                "profiles": calibrate_command.run_profiles_command,
                "analyze": analyze_command.run_command, "replay": replay_command.run_command}[args.command](args)
    except ValueError as exc:  # bad input (including RunError): nothing claims success
        _fail(str(exc))
    except OSError as exc:  # a full disk, a file-size limit, a read-only folder ...
        print(f"offpolicylab: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("offpolicylab: interrupted; run the same command again to continue (--resume for run)",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        signal.signal(signal.SIGTERM, previous)


def _refuse_in_worker() -> None:
    """A sweep's worker process (spawned: it imports the parent's main script as ``__mp_main__``) that reaches
    :func:`main` comes from a wrapper script calling it without a ``__main__`` guard: say so instead of starting a
    second sweep."""
    import multiprocessing

    if multiprocessing.parent_process() is not None and "__mp_main__" in sys.modules:
        print("offpolicylab: error: a worker process ran your script's call of offpolicylab.cli.main(); call it "
              'under `if __name__ == "__main__":`, or name your module with --import MODULE instead of a wrapper '
              "script", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


# ============================================================================================ commands
def cmd_list(args: argparse.Namespace) -> int:
    from offpolicylab.objectives import OBJECTIVES
    from offpolicylab.policies import POLICIES
    from offpolicylab.staleness import SCHEDULE_FORMS
    from offpolicylab.worlds import WORLDS

    verbose = getattr(args, "verbose", False)
    if args.imports:
        import_modules(args.imports)
    _print_registry("worlds", WORLDS, verbose=verbose)
    _print_registry("objectives", OBJECTIVES, lambda name: f" (advantage {OBJECTIVES.get(name).builder.advantage})",
                    verbose=verbose)
    print("schedules:\n  " + ", ".join(SCHEDULE_FORMS))
    _print_registry("policies", POLICIES, verbose=verbose)
    return 0


def _print_registry(title: str, registry: Registry[Any], note: Any = lambda name: "", *,
                    verbose: bool = False) -> None:
    """Each part with its parameters' defaults on one line; ``verbose``: its description, then one line per
    parameter with its default, its documentation and what is valid."""
    from offpolicylab.objectives.base import COMMON_PARAMS
    from offpolicylab.progress import readable

    print(f"{title}:")
    for name in registry.names():
        params = registry.params(name)
        if not verbose:
            print(f"  {name}{note(name)}: " + (", ".join(f"{k}={readable(p.default)}" for k, p in params.items())
                                               or "(no parameters)"))
            continue
        doc = registry.get(name).doc
        print(textwrap.fill(f"  {name}{note(name)}" + (f": {doc}" if doc else ""), width=LIST_WIDTH,
                            subsequent_indent="        ", break_long_words=False, break_on_hyphens=False))
        own = {k: p for k, p in params.items() if not (title == "objectives" and k in COMMON_PARAMS)}
        for key, param in own.items():
            print(f"      {key}={readable(param.default)}  {param.doc} [{param.valid_text()}]")
        if len(own) < len(params):
            print(f"      (and the common parameters: {', '.join(k for k in params if k not in own)})")
    if verbose and title == "objectives":
        print("  common parameters of every objective:")
        for key, param in COMMON_PARAMS.items():
            print(f"      {key}={readable(param.default)}  {param.doc} [{param.valid_text()}]")


def cmd_run(args: argparse.Namespace) -> int:
    from offpolicylab.batched import parse_seeds, seed_dir, train_seeds
    from offpolicylab.lifecycle import TrainingFailed
    from offpolicylab.policies.hf_loading import allow_remote_code
    from offpolicylab.run_dir import RunDir
    from offpolicylab.sweep import output_folder
    from offpolicylab.trainer import train

    if args.print_config:
        return print_config(args)
    if args.out is None:
        raise ValueError("run needs --out DIR (the run directory to create), or --print-config")
    output_folder(args.out)
    seeds = parse_seeds(args.seeds) if args.seeds is not None else None
    if seeds is not None and args.seed is not None:
        raise ValueError("--seeds and --seed exclude each other; valid: --seed S for one run or --seeds S,S,... ")
    config = config_from_args(args, seed_dir(args.out, seeds[0]) if seeds else args.out)
    allow_remote_code(args.trust_remote_code)
    progress = "bar" if sys.stderr.isatty() else "lines"
    try:
        if seeds is None:
            summaries = {Path(args.out): train(config, args.out, resume=args.resume, profile=args.profile,
                                               progress=progress)}
        else:
            summaries = dict(zip([seed_dir(args.out, seed) for seed in seeds],
                                 train_seeds(config, seeds, args.out, resume=args.resume, profile=args.profile,
                                             progress=progress), strict=True))
    except TrainingFailed as exc:
        print(f"offpolicylab: {exc}", file=sys.stderr)
        return EXIT_FAILED
    for path, summary in summaries.items():
        print(_summary_line(path.name, summary) + f"  -> {RunDir(path).path}")
    return 0


def print_config(args: argparse.Namespace) -> int:
    """``run --print-config``: the resolved config of the flags (every field, the world's and policy's choices and
    the objective's parameters filled in) as YAML on stdout, which ``run --config FILE`` reads back."""
    import yaml

    from offpolicylab.lifecycle import resolve_config

    config = config_from_args(args, None if args.out is not None else ".", defaults=True)
    sys.stdout.write(yaml.safe_dump(resolve_config(config), sort_keys=False, allow_unicode=True))
    return 0


def config_from_args(args: argparse.Namespace, run_dir: str | Path | None = None, *,
                     defaults: bool = False) -> TrainConfig:
    """Start from --config (or, with --resume, the config.json stored in ``run_dir``, default --out), then apply
    the flags that were given."""
    from offpolicylab.run_dir import RunDir

    data: dict[str, Any] = {}
    stored = RunDir(run_dir if run_dir is not None else args.out)
    if args.resume and args.config:
        raise ValueError("--resume continues the run in --out with its stored config.json; it cannot be combined "
                         "with --config (start a new run with --config instead)")
    if args.resume and stored.config_path.exists():
        data = stored.read_config()
    elif args.config:
        data = without_environment(read_mapping(args.config, f"--config {args.config}", "config fields"),
                                   args.config)
    elif (args.world is None or args.objective is None) and not defaults and not getattr(args, "overrides", None):
        raise ValueError("run needs --world W and --objective O (or --config FILE, or --resume)")
    source = f"--config {args.config}" if args.config else str(stored.config_path)
    for name in _DICT_FLAGS:  # a list or a number where a mapping belongs is named before it is merged
        if data.get(name) is not None and not isinstance(data[name], dict):
            raise ValueError(f"{source}: {name} holds a {type(data[name]).__name__}; valid: a mapping of "
                             f"{name.split('_')[0]} parameters (name: value)")
    data = canonical_config(data)  # the file's verl / TRL names → ours, so that flags override them
    for name in config_params():
        value = getattr(args, name)
        if name == "objective_params":
            value = (value or []) + [f"{alias}={getattr(args, ALIAS_DEST + alias)}" for alias in PARAM_ALIASES
                                     if getattr(args, ALIAS_DEST + alias, None) is not None] or None
        if value is None:
            continue
        if name == "imports":  # --import flags add to the file's modules
            value = ",".join([*_module_names(data.get(name)), *value])
        if name in _DICT_FLAGS:
            given = parse_assignments(value, "--" + _DICT_FLAGS[name].replace("_", "-"))
            if name == "objective_params":  # verl / TRL names → ours, over the file's
                data[name] = merge_params(dict(data.get(name, {})), given)
            else:
                data[name] = {**data.get(name, {}), **given}
        else:
            data[name] = value
    refuse_flag_and_override(args)
    data = apply_overrides(data, getattr(args, "overrides", None) or [])
    if getattr(args, "model", None):
        data["world_params"] = {**data.get("world_params", {}), "model": args.model}
        if args.policy is None:
            data["policy"] = "hf"
    if data.get("world_params"):
        data["world_params"] = absolute_paths(data["world_params"])
    return TrainConfig.from_dict(data)


def refuse_flag_and_override(args: argparse.Namespace) -> None:
    """A flag and a ``KEY=VALUE`` override of the same setting (``--updates 20 updates=10``) are one setting given
    twice on one command line: refused naming both (:func:`~offpolicylab.registry.given_twice`), as two flags are.
    A config file is a base that both override; it is not a second spelling."""
    given: dict[str, str] = getattr(args, "_given_flags", {})
    for item in getattr(args, "overrides", None) or []:
        field_name, sub = override_target(item.partition("=")[0].strip())
        dest = field_name if sub is None else ALIAS_DEST + sub  # an objective parameter: its alias flag
        if dest in given:
            raise ValueError(given_twice(given[dest], item, sub or field_name))


def override_grid(grid: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``grid`` with ``KEY=VALUE`` overrides applied to its base (:func:`~offpolicylab.config.apply_overrides`); a
    setting that is one of the grid's axes is refused (the axis sets it for every cell)."""
    base = grid.get("base", {})
    if not isinstance(base, dict):
        return grid  # expand_grid names the problem
    axes = grid.get("axes", {}) if isinstance(grid.get("axes"), dict) else {}
    touched = override_fields(overrides)
    clash = sorted(touched & set(axes))
    if clash:
        raise ValueError(f"override {clash[0]} is an axis of the grid; valid: overrides of settings the axes do not "
                         f"set (axes: {', '.join(axes)})")
    return {**grid, "base": apply_overrides(canonical_config(base), overrides)}


def _module_names(value: Any) -> list[str]:
    """A config's ``imports`` (a comma-separated string, a list or None) as a list of module names."""
    if value is None:
        return []
    parts = value.split(",") if isinstance(value, str) else list(value)
    return [str(part).strip() for part in parts if str(part).strip()]


PATH_PARAMS = ("model", "data")


def without_environment(data: dict[str, Any], source: str) -> dict[str, Any]:
    """A config file's fields without the ``environment`` record a run's own config.json carries (the package
    versions and git commit it ran with, not settings), said in a note: ``run --config RUN/config.json`` runs that
    run's settings again."""
    from offpolicylab.run_dir import ENVIRONMENT_KEY

    if not isinstance(data.get(ENVIRONMENT_KEY), dict):
        return data
    print(f"offpolicylab: note: --config {source} is a run's config.json; its {ENVIRONMENT_KEY} record (the "
          "versions it ran with) is not a setting and is ignored", file=sys.stderr)
    return {key: value for key, value in data.items() if key != ENVIRONMENT_KEY}


def absolute_paths(params: dict[str, Any]) -> dict[str, Any]:
    """World parameters that name a local file or directory (:data:`PATH_PARAMS`; a hub id stays as given) made
    absolute, so that config.json names the same files from any working directory (a resume from elsewhere)."""
    out = dict(params)
    for key in PATH_PARAMS:
        value = out.get(key)
        if isinstance(value, str) and value and Path(value).expanduser().exists():
            out[key] = str(Path(value).expanduser().resolve())
    return out


def cmd_sweep(args: argparse.Namespace) -> int:
    from offpolicylab.grid import load_grid
    from offpolicylab.progress import print_table
    from offpolicylab.sweep import run_sweep

    if args.ray_address:
        os.environ["RAY_ADDRESS"] = args.ray_address
    if args.imports:  # before the grid is read: its cells may name the modules' parts
        import_modules(args.imports)
    grid = load_grid(args.grid)
    if args.overrides:
        grid = override_grid(grid, args.overrides)
    if args.imports:
        base = grid.get("base", {})
        modules = [*_module_names(base.get("imports", base.get("import"))), *args.imports]
        grid = {**grid, "base": {**{k: v for k, v in base.items() if k != "import"}, "imports": ",".join(modules)}}
    if args.report_to is not None:  # a view of the cells' metrics, not part of their config (resume.py)
        grid = {**grid, "base": {**grid.get("base", {}), "report_to": args.report_to}}
    try:
        rows = run_sweep(grid, args.out, workers=args.workers, engine=args.engine,
                         progress="bar" if sys.stderr.isatty() else "lines", rerun_changed=args.rerun_changed)
    except RuntimeError as exc:  # e.g. a Ray cluster that cannot be started or reached
        print(f"offpolicylab: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print_table(rows, SWEEP_TABLE, SWEEP_HEADERS)
    for row in rows:  # the reason of each failure, which the table has no room for
        if row["status"] == "failed":
            print(f"{row['cell']}: failed: {row.get('error') or 'no reason recorded'}")
    failed = sum(row["status"] == "failed" for row in rows)
    print(f"{len(rows)} cells, {failed} failed -> {Path(args.out) / 'sweep_results.csv'}")
    return EXIT_FAILED if failed else 0


def cmd_convert_gguf(args: argparse.Namespace) -> int:
    from offpolicylab.policies.hf_loading import convert_gguf

    out = convert_gguf(args.gguf, args.out, dtype=args.dtype)
    print(f"{args.gguf} -> {out} (load it with --model {out})")
    return 0


def _plot(argv: list[str]) -> int:
    try:
        from offpolicylab import plots
    except ImportError as exc:
        print(f"offpolicylab: error: plotting is unavailable ({exc})", file=sys.stderr)
        return EXIT_BAD_INPUT
    return int(plots.main(argv) or 0)


# ============================================================================================ helpers
def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("offpolicylab")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _default_help(name: str, param: Any) -> str:
    """The default a ``run`` flag's help names: only defaults that apply (world and objective have none)."""
    from offpolicylab.progress import readable

    if name in ("world", "objective"):
        return "required unless --config or --resume gives it"
    if name == "policy":
        return f"default: the world's choice, else {readable(DEFAULTS[name])}"
    if name in DEFAULTS:
        return f"default: the world's or policy's choice, else {readable(DEFAULTS[name])}"
    return f"default: {readable(param.default)}"


def _summary_line(name: str, summary: dict[str, Any]) -> str:
    """``run``'s last line: status, the summary's exact return and reward (the one reward of docs/metrics.md, the
    number ``analyze`` reports as final), the collapse update."""
    parts = [f"{name}: {summary.get('status')}"]
    for key in ("final_exact_return", "peak_exact_return", "final_reward", "peak_reward"):
        if key in summary:
            parts.append(f"{key}={summary[key]:.4g}")
    if summary.get("collapse_update", -1) not in (-1, None, ""):
        parts.append(f"collapse_update={summary['collapse_update']}")
    return "  ".join(parts)


RUN_USAGE = "offpolicylab run --world W --objective O [options] --out DIR [KEY=VALUE ...]"
#: ``run --help``'s groups (title: description), in order; every flag belongs to one.
RUN_GROUPS: dict[str, str] = {
    "world": "the task: which world, its options, an LLM's model",
    "policy": "the model that samples and trains, and how its behaviour log-probs are taken",
    "objective": "the loss: objective, its parameters (also under verl's / TRL's names), advantage estimator",
    "schedule": "staleness: which policy version generates the data each update consumes",
    "training": "updates, batch, optimizer, seeds, DAPO's sampling and reward options",
    "evaluation": "evaluation, metrics and the collapse detector",
    "output": "the run directory: where, resume, samples, checkpoints, profile",
    "tracking": "experiment trackers (metrics.csv is written either way)",
    "config": "config files, your own modules",
}
#: The group of each config field's flag (others: ``training``).
RUN_FIELD_GROUPS: dict[str, str] = {
    "world": "world", "world_params": "world",
    "policy": "policy", "policy_params": "policy", "temperature": "policy", "behavior_logp": "policy",
    "objective": "objective", "objective_params": "objective", "advantage": "objective",
    "schedule": "schedule",
    "eval_every": "evaluation", "eval_samples": "evaluation", "eval_kl_init": "evaluation",
    "metrics_every": "evaluation", "collapse_margin": "evaluation", "collapse_gain_fraction": "evaluation",
    "collapse_spike": "evaluation", "collapse_window": "evaluation", "collapse_tail": "evaluation",
    "stop_on_collapse": "evaluation",
    "sample_every": "output", "checkpoint_every": "output", "fsync": "output",
    "report_to": "tracking",
    "imports": "config",
}

#: the columns of the table ``sweep`` prints (sweep_results.csv's names; a column no cell has is left out): the
#: exact return and the evaluation's sampled reward first (on the world's evaluation prompts, every eval_every
#: updates), then the reward of the training batches, under a header that says so (one batch is noisy)
SWEEP_TABLE = ("cell", "status", "final_exact_return", "peak_exact_return", "final_eval_reward_sampled",
               "peak_eval_reward_sampled", "final_reward", "peak_reward", "collapse_update")
SWEEP_HEADERS = {"final_eval_reward_sampled": "final_eval_reward", "peak_eval_reward_sampled": "peak_eval_reward",
                 "final_reward": "final_batch_reward", "peak_reward": "peak_batch_reward"}


if __name__ == "__main__":
    raise SystemExit(main())
