"""``trainer-client``: the command line of the trainer client.

* ``command``: the parser and ``main`` (subcommands from plug-ins too);
* ``subcommands``: ``Subcommand``, ``register_subcommand``, ``CliError``;
* ``rollout`` (with ``generators``: what generates its turns), ``train``, ``sft``, ``show``
  (``show`` and ``summary``): one subcommand each; ``verl-config`` lives in
  ``trainer_client.verl.config``;
* ``flags``: flags derived from a config dataclass (names, types, defaults, help).
"""

from trainer_client.cli.command import (
    SUBCOMMANDS,
    CliError,
    Subcommand,
    build_parser,
    main,
    register_subcommand,
)

__all__ = ["SUBCOMMANDS", "CliError", "Subcommand", "build_parser", "main", "register_subcommand"]
