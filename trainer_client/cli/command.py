"""``trainer-client``: roll out a model against a tool server, and inspect the results.

Subcommands live in ``SUBCOMMANDS`` (name -> ``Subcommand``, see ``subcommands``). Each
one adds its own arguments and runs on its own; heavy imports (torch, transformers,
pandas) happen inside ``run`` so that ``--help`` stays instant. ``rollout`` is
``rollout``'s; other modules add subcommands with ``register_subcommand`` (``show``,
``summary``, ``train``, ``verl-config``) and are listed in ``PLUGIN_MODULES``, which
``main`` imports before parsing.

    trainer-client rollout --server http://127.0.0.1:8000 --data arithmetic/test.parquet \\
        --format hermes --verifier math_equal --limit 8 --n 2 --out runs/arith.jsonl
    trainer-client show runs/arith.jsonl --index 3

``rollout --script turns.jsonl`` replays scripted assistant turns instead of a model, so a
toolset and its verifier can be tested end to end without one (see
``rollout_backends.load_script``).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from trainer_client.cli import rollout as _rollout_cli  # noqa: F401  (registers "rollout" first)
from trainer_client.cli.subcommands import SUBCOMMANDS, CliError, Subcommand, register_subcommand
from trainer_client.rollout.dataset import DatasetError

# Command modules import the registry from here, as they always have.
__all__ = ["SUBCOMMANDS", "CliError", "Subcommand", "build_parser", "main", "register_subcommand"]

# Modules that register more subcommands when imported (``show``, ``summary``, ``train``, ``sft``, ``verl-config``): each
# calls ``register_subcommand(Subcommand(...))`` at module level and keeps its heavy
# imports inside ``run``, so that ``trainer-client --help`` stays fast.
PLUGIN_MODULES: tuple[str, ...] = (
    "trainer_client.cli.show",
    "trainer_client.cli.train",
    "trainer_client.cli.sft",
    "trainer_client.cli.serve_model",
    "trainer_client.verl.config",
)


def _load_plugins() -> None:
    for module in PLUGIN_MODULES:
        importlib.import_module(module)


def build_parser() -> argparse.ArgumentParser:
    _load_plugins()
    parser = argparse.ArgumentParser(
        prog="trainer-client",
        description="Roll out and train LLMs on multi-turn tool use against a toolfactory tool server.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in SUBCOMMANDS.values():
        sub = commands.add_parser(
            command.name,
            help=command.help,
            description=command.description or command.help,
        )
        command.configure(sub)
        sub.set_defaults(_run=command.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except (CliError, DatasetError) as exc:
        print(f"trainer-client: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("trainer-client: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
