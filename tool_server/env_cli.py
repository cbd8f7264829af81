"""``tool-server env``: list, show, validate, export and build environment packs; score rollouts.

A pack is named by its id in the config's ``environments``, or given directly as a pack
directory or a ``module:callable`` source (with ``--arg key=value`` for its arguments).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter, defaultdict
from dataclasses import asdict
from pathlib import Path
from typing import Any

import orjson

from tool_server.config import Config, ConfigError
from tool_server.environments import load_environment
from tools.envs.builder.cli import configure as configure_build
from tools.envs.builder.cli import run as run_build
from tools.envs.host import open_pack, parse_arguments
from tools.envs.pack import Complexity, EnvTask, Pack, dump_pack

__all__ = ["add_env_parser", "run_env", "task_problems"]

_COMPLEXITY_FIELDS = ("scenario", "gold_calls", "depth", "width", "level")

_DESCRIPTION = """\
Environment packs: worlds of tools over a state, with tasks and their gold calls.
The server serves each pack in its config's `environments:` as a toolset named after
the pack (/v1/tools?toolset=<id>, /mcp/<id>). These commands read the same config
(--config), or take a pack directly: a pack directory, or a 'module:callable' source
whose keyword arguments are given with --arg key=value (values are YAML: 3, true, [a, b]).

  list      the packs of the config: id, toolset, tools, tasks
  show      one pack: description, policy, tools, tasks per complexity level
  validate  every task: its tools exist, its gold calls replay without error in a fresh
            world of the task, its complexity is what its gold calls' dependency graph
            gives (Complexity.from_calls); exit 1 when a task fails
  export    write a pack as a directory (pack.yaml, state.json, tasks.jsonl)
  build     build a new pack from a scenario with a model behind an OpenAI-compatible
            endpoint (--scenario TEXT --model URL --out DIR); see docs/environments.md
  score     the benchmark's own metrics over rollout files of imported packs, as its
            leaderboard shows them: τ²-bench's average reward and pass^k (k samples per
            task), BFCL's accuracy per multi-turn category; the trajectories must have been
            verified with tool_use in eval mode (its reward is the benchmark's verdict)
"""

SCORE_HINT = (
    "score rollouts of an imported pack with its benchmark's verdict: trainer-client rollout ... "
    '--verifier tool_use --verifier-args \'{"mode": "eval"}\''
)


def add_env_parser(sub: Any, add_config_arg: Any) -> None:
    env = sub.add_parser(
        "env",
        help="list, show, validate, export or build environment packs",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = env.add_subparsers(dest="env_command", required=True)
    listing = commands.add_parser("list", help="the packs of the config")
    add_config_arg(listing)
    listing.add_argument("--json", action="store_true", help="print JSON")
    for name, text in (
        ("show", "one pack's description, policy, tools and task counts per level"),
        ("validate", "replay every task's gold calls; check tools and complexity (exit 1 on a problem)"),
        ("export", "write one pack as a directory"),
    ):
        command = commands.add_parser(name, help=text, description=text)
        add_config_arg(command)
        command.add_argument(
            "pack",
            help="a pack id of the config's environments, a pack directory, or a 'module:callable' source",
        )
        command.add_argument(
            "--arg",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="an argument of a 'module:callable' source (repeatable; YAML values)",
        )
        if name == "show":
            command.add_argument("--json", action="store_true", help="print JSON")
        if name == "validate":
            command.add_argument("--quiet", action="store_true", help="no progress bar")
            command.add_argument(
                "--allow-failing-gold",
                action="store_true",
                help="a gold call that fails in the replay is not a problem (tau2's gold includes lookups "
                "that are meant to fail); the summary still counts them",
            )
        if name == "export":
            command.add_argument("--out", required=True, type=Path, help="the directory to write")
            command.add_argument(
                "--tools-module",
                default=None,
                help="the module whose TOOLS the directory's pack.yaml names (default: the module "
                "that defines the pack's tools, if it exports TOOLS)",
            )
    score = commands.add_parser(
        "score",
        help="the benchmark's own metrics over rollout files (τ²: pass^k; BFCL: accuracy per category)",
        description="The benchmark's own metrics over trajectories of imported packs (trainer-client "
        "rollout JSONL, verified with tool_use in eval mode), as its leaderboard shows them: τ²-bench "
        "reports the average reward and pass^k for k = 1 .. the fewest samples of any task; BFCL the "
        "accuracy per multi-turn category and their unweighted mean.",
    )
    add_config_arg(score)
    score.add_argument("rollouts", nargs="+", type=Path, help="trainer-client rollout JSONL files")
    score.add_argument(
        "--pack", default=None, help="only the trajectories of this pack id (e.g. tau2-retail)"
    )
    score.add_argument("--json", action="store_true", help="print JSON")
    build = commands.add_parser(
        "build",
        help="build a new pack from a scenario with a model (five checked stages)",
        description="Build a pack from a scenario through an OpenAI-compatible endpoint: decomposition, "
        "documents, functions, tasks, deployment; every stage's output is validated, generated tool "
        "code runs only in the sandbox, and a gate replays every task before the pack is written.",
    )
    add_config_arg(build)
    configure_build(build)


def run_env(args: argparse.Namespace, config: Config) -> int:
    if args.env_command == "build":
        return run_build(args)
    if args.env_command == "list":
        return _list(config, args.json)
    if args.env_command == "score":
        return _score(args.rollouts, args.pack, args.json)
    pack = _pack(config, args.pack, args.arg)
    if args.env_command == "show":
        return _show(pack, args.json)
    if args.env_command == "validate":
        return _validate(pack, quiet=args.quiet, allow_failing_gold=args.allow_failing_gold)
    return _export(pack, args.out, args.tools_module)


def _pack(config: Config, name: str, pairs: list[str]) -> Pack:
    try:
        arguments = parse_arguments(pairs)
    except ValueError as exc:
        raise ConfigError(f"--arg: {exc}") from None
    for spec in config.environments:
        if not spec.enabled or arguments:
            continue
        pack = load_environment(spec)
        if name in (pack.id, spec.toolset):
            return pack
    try:
        return open_pack(name, arguments)
    except ValueError as exc:
        known = ", ".join(_config_ids(config)) or "none"
        raise ConfigError(f"{exc} (the config's packs: {known})") from None


def _config_ids(config: Config) -> list[str]:
    return [load_environment(spec).id for spec in config.environments if spec.enabled]


def _list(config: Config, as_json: bool) -> int:
    rows = []
    for spec in config.environments:
        if not spec.enabled:
            continue
        pack = load_environment(spec)
        rows.append(
            {
                "id": pack.id,
                "toolset": spec.toolset or pack.id,
                "origin": pack.info.origin,
                "tools": len(pack.tools),
                "tasks": len(pack.tasks),
                "from": spec.ref(),
            }
        )
    if as_json:
        print(orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode())
    elif not rows:
        print("no environments in this config (add an `environments:` list; see docs/environments.md)")
    else:
        _table(rows, ("id", "toolset", "origin", "tools", "tasks", "from"))
    return 0


def pack_summary(pack: Pack) -> dict[str, Any]:
    """What ``env show`` prints: info, tools, and task counts per level and scenario."""
    return {
        **vars(pack.info),
        "policy": pack.policy,
        "tables": {name: len(records) for name, records in pack.initial_state.items()},
        "tools": [
            {
                "name": t.name,
                "writes": t.writes,
                "description": t.description.splitlines()[0] if t.description else "",
            }
            for t in pack.tools
        ],
        "tasks": len(pack.tasks),
        "tasks_per_level": {
            str(k): v for k, v in sorted(Counter(t.complexity.level for t in pack.tasks).items())
        },
        "tasks_per_scenario": dict(Counter(t.complexity.scenario for t in pack.tasks)),
    }


def _show(pack: Pack, as_json: bool) -> int:
    summary = pack_summary(pack)
    if as_json:
        print(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode())
        return 0
    print(
        f"{pack.id} (version {pack.info.version}, origin {pack.info.origin}, domain {pack.info.domain or '-'})"
    )
    if pack.info.description:
        print(f"  {pack.info.description}")
    tables = ", ".join(f"{name} ({count})" for name, count in summary["tables"].items())
    print(f"state: {tables or 'empty'}")
    if pack.policy:
        first = pack.policy.strip().splitlines()[0]
        print(f"policy: {len(pack.policy)} characters: {first[:100]}")
    print(f"tools ({len(pack.tools)}):")
    for tool in summary["tools"]:
        print(f"  {tool['name']}{' (writes)' if tool['writes'] else ''}: {tool['description']}")
    print(f"tasks: {summary['tasks']}")
    for level, count in summary["tasks_per_level"].items():
        print(f"  level {level}: {count}")
    return 0


def task_problems(pack: Pack, task: EnvTask, *, failing_gold: list[str] | None = None) -> list[str]:
    """What is wrong with one task (empty: nothing): tools, gold replay, complexity.

    With a ``failing_gold`` list, gold calls that fail in the replay go there instead of
    being problems (for packs whose gold includes calls meant to fail).
    """
    problems = []
    names = {t.name for t in pack.tools}
    exposed = set(task.tools) if task.tools is not None else names
    unknown = sorted((exposed | set(task.distractors)) - names)
    if unknown:
        problems.append(f"names tools the pack lacks: {', '.join(unknown)}")
    gold_names = {c.name for c in task.gold.calls}
    if gold_names - names:
        problems.append(f"gold calls use tools the pack lacks: {', '.join(sorted(gold_names - names))}")
    not_exposed = sorted((gold_names & names) - exposed)
    if not_exposed:
        problems.append(f"gold calls use tools the task does not expose: {', '.join(not_exposed)}")
    if not (set(task.distractors) <= exposed):
        problems.append("distractors must be among the task's tools")
    try:
        world = pack.replay(task)
    except Exception as exc:  # a tool's bug: the task is what is reported, not a traceback
        problems.append(f"replay failed: {type(exc).__name__}: {exc}")
    else:
        for record in world.calls:
            if record.error is not None:
                finding = f"gold call {record.name}({_short(record.arguments)}) failed: {record.error}"
                (problems if failing_gold is None else failing_gold).append(finding)
    try:
        expected = Complexity.from_calls(
            task.gold.calls, distractors=task.complexity.distractors, scaling=task.complexity.scaling
        )
    except ValueError as exc:
        problems.append(f"complexity: {exc}")
    else:
        wrong = [
            f"{field} {getattr(task.complexity, field)!r} (gold calls give {getattr(expected, field)!r})"
            for field in _COMPLEXITY_FIELDS
            if getattr(task.complexity, field) != getattr(expected, field)
        ]
        if wrong:
            problems.append("complexity: " + ", ".join(wrong))
    return problems


def _validate(pack: Pack, *, quiet: bool, allow_failing_gold: bool) -> int:
    from tqdm import tqdm

    failed: dict[str, list[str]] = {}
    failing_gold: list[str] | None = [] if allow_failing_gold else None
    for task in tqdm(
        pack.tasks, desc=f"validate {pack.id}", unit="task", disable=quiet or None, file=sys.stderr
    ):
        problems = task_problems(pack, task, failing_gold=failing_gold)
        if problems:
            failed[task.id] = problems
    for task_id, problems in failed.items():
        for problem in problems:
            print(f"{pack.id}/{task_id}: {problem}")
    good = len(pack.tasks) - len(failed)
    print(
        f"{pack.id}: {good} of {len(pack.tasks)} tasks valid"
        + (f", {len(failed)} with problems" if failed else "")
        + (f"; {len(failing_gold)} gold calls fail in the replay (allowed)" if failing_gold else "")
    )
    return 1 if failed else 0


def _score(paths: list[Path], only: str | None, as_json: bool) -> int:
    """Print the benchmarks' metrics of the trajectories in ``paths`` (see ``score --help``)."""
    verdicts: dict[str, list[tuple[str, float]]] = defaultdict(list)  # pack -> (task, reward)
    failed: Counter[str] = Counter()
    for path in paths:
        for where, record in _records(path):
            truth = record.get("ground_truth")
            if not isinstance(truth, dict) or not isinstance(truth.get("pack"), str) or "task" not in truth:
                raise ConfigError(f"{where}: its ground_truth names no environment task ({{pack, task}})")
            pack = truth["pack"]
            if only is not None and pack != only:
                continue
            components = record.get("reward_components") or {}
            if "benchmark" in components:
                reward = float(components["benchmark"])
            elif record.get("reward") is None:  # verification failed: a failed sample scores 0 (τ², BFCL)
                reward = 0.0
                failed[pack] += 1
            else:
                raise ConfigError(
                    f"{where}: its reward is not a benchmark's verdict (no 'benchmark' component); {SCORE_HINT}"
                )
            verdicts[pack].append((str(truth["task"]), reward))
    if not verdicts:
        raise ConfigError(f"no trajectories{f' of {only}' if only else ''} in {', '.join(map(str, paths))}")
    tau2 = {pack: pairs for pack, pairs in verdicts.items() if pack.startswith("tau2-")}
    others = sorted(set(verdicts) - set(tau2))
    bfcl = _bfcl_leaderboard({pack: verdicts[pack] for pack in others}) if others else None
    scores = [_tau2_score(pack, pairs) for pack, pairs in sorted(tau2.items())]
    if as_json:
        out: dict[str, Any] = {"tau2": [asdict(s) for s in scores], "failed_samples": dict(failed)}
        if bfcl is not None:
            out["bfcl"] = {
                "overall": bfcl.overall,
                "categories": {c: {**asdict(s), "accuracy": s.accuracy} for c, s in bfcl.categories.items()},
            }
        print(orjson.dumps(out, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode())
        return 0
    if scores:
        print("τ²-bench: average reward and pass^k (k of each task's trials all succeed)")
        for score in scores:
            print(score.table())
    if bfcl is not None:
        print("BFCL multi-turn: accuracy per category (the leaderboard's columns)")
        print(bfcl.table())
    for pack, count in sorted(failed.items()):
        print(
            f"{pack}: {count} trajectories were not verified; they score 0 (a failed sample, as the benchmark counts it)"
        )
    return 0


def _records(path: Path) -> Any:
    """(where, record) of each line of a rollout JSONL."""
    try:
        handle = open(path.expanduser(), "rb")  # noqa: SIM115 - closed below, after the generator's use
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    with handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                try:
                    record = orjson.loads(line)
                except orjson.JSONDecodeError as exc:
                    raise ConfigError(f"{path}:{number} is not valid JSON: {exc}") from None
                if not isinstance(record, dict):
                    raise ConfigError(f"{path}:{number} is not a trajectory record (a JSON object)")
                yield f"{path}:{number}", record


def _tau2_score(pack: str, pairs: list[tuple[str, float]]) -> Any:
    from tools.envs.tau2.metrics import tau2_score
    from tools.envs.tau2.packs import task_ids

    domain, _, split = pack.removeprefix("tau2-").partition("-")
    try:
        total: int | None = len(task_ids(domain, split or None))
    except ValueError:  # not a domain or split τ² knows (a renamed pack): no total to show
        total = None
    return tau2_score(pack, pairs, total)


def _bfcl_leaderboard(verdicts: dict[str, list[tuple[str, float]]]) -> Any:
    try:
        from tools.envs.bfcl.leaderboard import leaderboard
    except ModuleNotFoundError as exc:
        raise ConfigError(f"{exc}: BFCL's scores need bfcl-eval (make setup)") from None
    try:
        return leaderboard((pack, task, reward) for pack, pairs in verdicts.items() for task, reward in pairs)
    except ValueError as exc:
        raise ConfigError(f"{exc}; `env score` knows τ²-bench (tau2-*) and BFCL (bfcl_*) packs") from None


def _export(pack: Pack, out: Path, tools_module: str | None) -> int:
    module = tools_module or _tools_module(pack)
    path = dump_pack(pack, out, tools_module=module)
    print(f"wrote {pack.id} ({len(pack.tools)} tools, {len(pack.tasks)} tasks) to {path} (tools: {module})")
    return 0


def _tools_module(pack: Pack) -> str:
    """The one module, among those defining the pack's tools, that exports all of them as
    TOOLS (what load_pack imports): e.g. a typed procedural world's module, which re-exports
    the plain world's tools beside its own."""
    import importlib

    modules = {getattr(t.func, "__module__", None) for t in pack.tools}
    needed = {t.name for t in pack.tools}
    covering = [
        name
        for name in sorted(m for m in modules if m)
        if needed
        <= {getattr(t, "name", None) for t in getattr(importlib.import_module(name), "TOOLS", None) or []}
    ]
    if len(covering) == 1:
        return covering[0]
    raise ConfigError(
        f"cannot tell which module exports the tools of {pack.id!r} as TOOLS (their functions come from "
        f"{sorted(m or '?' for m in modules)}); pass --tools-module"
    )


def _short(arguments: dict[str, Any]) -> str:
    text = orjson.dumps(arguments, default=str).decode()
    return text if len(text) <= 80 else text[:77] + "..."


def _table(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> None:
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns))
    for row in rows:
        print("  ".join(str(row[c]).ljust(widths[c]) for c in columns))
