"""The ``trainer-client`` subcommand registry: ``Subcommand``, ``register_subcommand``, ``CliError``.

Every command module registers its subcommands here at import time (``rollout``,
``show``, ``train``, ``trainer_client.verl.config``); ``cli.build_parser`` turns them into
argparse subparsers, in the order they were registered.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from trainer_client.shared import CliError

__all__ = ["SUBCOMMANDS", "CliError", "Subcommand", "register_subcommand"]


@dataclass(frozen=True)
class Subcommand:
    """One ``trainer-client`` subcommand: its help, its arguments and what it runs."""

    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    description: str | None = None


SUBCOMMANDS: dict[str, Subcommand] = {}


def register_subcommand(command: Subcommand) -> Subcommand:
    """Add (or replace) a subcommand; returns it, so it can be used at module level."""
    SUBCOMMANDS[command.name] = command
    return command
