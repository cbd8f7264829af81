"""Settings of the veRL agent loop, the agent-loop YAML, and ``trainer-client verl-config``.

veRL finds custom agent loops through ``actor_rollout_ref.rollout.agent.agent_loop_config_path``:
a YAML list of ``{name, _target_, **kwargs}`` that ``hydra.utils.instantiate`` turns into
one loop per trajectory (the kwargs become constructor arguments). This module writes
that file for the toolfactory loop and prints the Hydra overrides that select it, and
holds :class:`LoopSettings` (the kwargs, validated), without importing veRL or torch,
so that the CLI stays fast and configs can be checked anywhere.

    trainer-client verl-config --server http://tools:8000 --format search_r1 \\
        --toolset search --verifier exact_match --out agent_loop.yaml
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from trainer_client.cli.command import Subcommand, register_subcommand
from trainer_client.shared import plain

AGENT_NAME = "toolfactory"
TARGET = "trainer_client.verl.agent_loop.ToolFactoryAgentLoop"

# Settings a dataset row may override through ``extra_info`` (per sample), either as
# top-level keys or inside ``extra_info["toolfactory"]``.
OVERRIDABLE = frozenset(
    {
        "format",
        "parser_options",
        "toolset",
        "max_turns",
        "max_calls_per_turn",
        "max_obs_tokens",
        "max_tokens_per_turn",
        "tool_result_template",
        "verifier",
        "verifier_arguments",
        "tools",
    }
)


@dataclass(frozen=True)
class LoopSettings:
    """The kwargs of the toolfactory agent loop (its entry in the agent-loop YAML).

    - ``server_urls``: the tool server, or a list of replicas (required);
    - ``format``/``parser_options``: tool-call format (``hermes``, ``search_r1``, ...);
    - ``toolset``: the server toolset, also used for ``tool_schemas: server``;
    - ``max_turns``, ``max_calls_per_turn``, ``max_obs_tokens``: budgets per trajectory;
      ``response_length`` (default veRL's ``rollout.response_length``) and
      ``max_tokens_per_turn`` (default: whatever budget is left);
    - ``tool_result_template``: None renders results as ``tool`` messages with the chat
      template; ``search_r1`` (or any text with ``{content}``) puts them in the assistant turn;
    - ``verifier``/``verifier_arguments``: the server verifier that gives ``reward_score``;
    - ``compute_reward``: false leaves the reward to veRL's reward path (see
      :mod:`trainer_client.verl.reward_bridge`); ``reward_on_error``: reward when verification
      fails (a number keeps the whole batch on the in-loop path: veRL needs all or none);
    - ``tools``: JSON tool schemas for the chat template; ``tool_schemas: server`` fetches
      them from the server's toolset once per process instead;
    - ``client_options``: keyword arguments of ``ToolClient`` (timeouts, batching);
    - ``user_tool``, ``max_user_turns``: the server tool playing the simulated user of rows
      with a user scenario (``extra_info.user_sim``), and how many messages it may send.
    """

    server_urls: tuple[str, ...]
    format: str = "hermes"
    parser_options: Mapping[str, Any] = field(default_factory=dict)
    toolset: str | None = None
    max_turns: int = 4
    max_calls_per_turn: int = 4
    max_obs_tokens: int = 512
    response_length: int | None = None
    max_tokens_per_turn: int | None = None
    tool_result_template: str | None = None
    verifier: str | None = "exact_match"
    verifier_arguments: Mapping[str, Any] = field(default_factory=dict)
    compute_reward: bool = True
    reward_on_error: float | None = 0.0
    tools: tuple[Any, ...] | None = None
    tool_schemas: str = "none"
    client_options: Mapping[str, Any] = field(default_factory=dict)
    user_tool: str = "llm"
    max_user_turns: int = 10

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_calls_per_turn", "max_obs_tokens", "max_user_turns"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"toolfactory agent loop: {name} must be a positive integer, got {value!r}")
        for name in ("response_length", "max_tokens_per_turn"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(
                    f"toolfactory agent loop: {name} must be a positive integer or null, got {value!r}"
                )
        if self.tool_schemas not in ("none", "server"):
            raise ValueError(
                f"toolfactory agent loop: tool_schemas must be 'none' or 'server', got {self.tool_schemas!r}"
            )
        for url in self.server_urls:  # dns://NAME:PORT: every address of NAME is a replica
            if not str(url).startswith(("http://", "https://", "dns://", "dns+http://", "dns+https://")):
                raise ValueError(
                    "toolfactory agent loop: server URL must start with http(s):// or dns:// "
                    f"(replicas discovered from DNS), got {url!r}"
                )

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any]) -> LoopSettings:
        """Validate YAML kwargs; unknown keys are an error that lists the known ones."""
        values = {k: plain(v) for k, v in kwargs.items()}
        urls = values.pop("server_urls", None) or values.pop("server_url", None)
        if isinstance(urls, str):
            urls = [u.strip() for u in urls.split(",") if u.strip()]
        if not urls:
            raise ValueError(
                "the toolfactory agent loop needs server_urls (the tool server's URL, or a list of replicas) "
                "in its agent-loop YAML entry"
            )
        known = {f.name for f in fields(cls)} - {"server_urls"}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown toolfactory agent-loop settings {unknown}; known: {sorted(known)}")
        if values.get("tools") is not None:
            values["tools"] = tuple(values["tools"])
        return cls(server_urls=tuple(urls), **values)

    def with_overrides(self, extra_info: Mapping[str, Any] | None) -> LoopSettings:
        """This sample's settings: the :data:`OVERRIDABLE` keys of ``extra_info`` win."""
        if not extra_info:
            return self
        extra = plain(dict(extra_info))
        nested = extra.get(AGENT_NAME)
        merged = {**extra, **(nested if isinstance(nested, dict) else {})}
        changes = {k: v for k, v in merged.items() if k in OVERRIDABLE and v is not None}
        if "tools" in changes:
            changes["tools"] = tuple(changes["tools"])
        return replace(self, **changes) if changes else self

    def to_yaml_entry(self, name: str = AGENT_NAME) -> dict[str, Any]:
        """The agent-loop YAML entry: ``name``, ``_target_`` and the non-default settings."""
        entry: dict[str, Any] = {"name": name, "_target_": TARGET, "server_urls": list(self.server_urls)}
        defaults = LoopSettings(server_urls=self.server_urls)
        for f in fields(self):
            value = plain(getattr(self, f.name))
            if f.name != "server_urls" and value != plain(getattr(defaults, f.name)):
                entry[f.name] = value
        return entry


def write_agent_loop_yaml(
    path: str | Path, settings: Sequence[LoopSettings] | LoopSettings, names: Sequence[str] | None = None
) -> Path:
    """Write the agent-loop YAML (one entry per settings object) and return its path."""
    import yaml

    items = [settings] if isinstance(settings, LoopSettings) else list(settings)
    names = (
        list(names)
        if names is not None
        else [AGENT_NAME] + [f"{AGENT_NAME}_{i}" for i in range(1, len(items))]
    )
    entries = [s.to_yaml_entry(n) for s, n in zip(items, names, strict=True)]
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "# toolfactory agent loop for veRL (written by `trainer-client verl-config`).\n"
        "# Select it with actor_rollout_ref.rollout.agent.default_agent_loop=<name>.\n"
        + yaml.safe_dump(entries, sort_keys=False)
    )
    return path


def load_agent_loop_yaml(path: str | Path) -> dict[str, LoopSettings]:
    """Read and validate an agent-loop YAML: name -> settings of every toolfactory entry.

    Read with OmegaConf, as veRL does, so interpolations such as
    ``${oc.env:TOOLFACTORY_URL,http://127.0.0.1:8000}`` resolve the same way.
    """
    from omegaconf import OmegaConf

    entries = OmegaConf.to_container(OmegaConf.load(Path(path).expanduser()), resolve=True)
    if not isinstance(entries, list):
        raise ValueError(f"{path}: an agent-loop YAML is a list of {{name, _target_, ...}} entries")
    found: dict[str, LoopSettings] = {}
    for entry in entries:
        if not isinstance(entry, dict) or "name" not in entry or "_target_" not in entry:
            raise ValueError(f"{path}: every entry needs 'name' and '_target_', got {entry!r}")
        if entry["_target_"] != TARGET:
            continue
        kwargs = {k: v for k, v in entry.items() if k not in ("name", "_target_")}
        found[entry["name"]] = LoopSettings.from_kwargs(kwargs)
    return found


def hydra_overrides(agent_loop_yaml: str | Path, *, name: str = AGENT_NAME) -> list[str]:
    """The veRL overrides that load the YAML and make the toolfactory loop the default one."""
    return [
        "actor_rollout_ref.rollout.mode=async",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={Path(agent_loop_yaml).expanduser().resolve()}",
        f"actor_rollout_ref.rollout.agent.default_agent_loop={name}",
        "data.return_raw_chat=True",
    ]


# --------------------------------------------------------------------------- CLI


def configure(parser: argparse.ArgumentParser) -> None:
    from trainer_client.parsers.registry import parser_names

    parser.add_argument(
        "--server", action="append", required=True, help="tool server URL; repeat for replicas"
    )
    parser.add_argument("--out", default="agent_loop.yaml", help="YAML to write (default agent_loop.yaml)")
    parser.add_argument("--name", default=AGENT_NAME, help=f"agent-loop name (default {AGENT_NAME})")
    parser.add_argument(
        "--format", default="hermes", choices=parser_names(), help="tool-call format (default hermes)"
    )
    parser.add_argument("--toolset", default=None, help="server toolset")
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--max-calls-per-turn", type=int, default=4)
    parser.add_argument("--max-obs-tokens", type=int, default=512)
    parser.add_argument("--max-tokens-per-turn", type=int, default=None)
    parser.add_argument("--user-tool", default="llm", help="server tool playing a simulated user")
    parser.add_argument(
        "--max-user-turns", type=int, default=10, help="simulated user messages per trajectory"
    )
    parser.add_argument("--tool-result-template", default=None, help="'search_r1' or a text with {content}")
    parser.add_argument("--verifier", default="exact_match", help="server verifier giving the reward")
    parser.add_argument("--verifier-args", default=None, help="verifier arguments as JSON")
    parser.add_argument("--tool-schemas", choices=("none", "server"), default="none")
    parser.add_argument(
        "--no-reward",
        action="store_true",
        help="leave the reward to veRL's reward function (compute_reward: false)",
    )


def run(args: argparse.Namespace) -> int:
    try:
        verifier_args = json.loads(args.verifier_args) if args.verifier_args else {}
        settings = LoopSettings(
            server_urls=tuple(args.server),
            format=args.format,
            toolset=args.toolset,
            max_turns=args.max_turns,
            max_calls_per_turn=args.max_calls_per_turn,
            max_obs_tokens=args.max_obs_tokens,
            user_tool=args.user_tool,
            max_user_turns=args.max_user_turns,
            max_tokens_per_turn=args.max_tokens_per_turn,
            tool_result_template=args.tool_result_template,
            verifier=args.verifier,
            verifier_arguments=verifier_args,
            compute_reward=not args.no_reward,
            tool_schemas=args.tool_schemas,
        )
    except (ValueError, json.JSONDecodeError) as exc:
        print(f"trainer-client verl-config: error: {exc}", file=sys.stderr)
        return 2
    path = write_agent_loop_yaml(args.out, [settings], [args.name])
    print(f"# wrote {path}; add these overrides to your veRL command (python3 -m verl.trainer.main_ppo ...):")
    for override in hydra_overrides(path, name=args.name):
        print(f"    {override} \\")
    if args.no_reward:
        from trainer_client.verl import reward_bridge as reward_bridge

        print(f"    reward.custom_reward_function.path={Path(reward_bridge.__file__).resolve()} \\")
        print("    reward.custom_reward_function.name=compute_score \\")
        print(f"    +reward.custom_reward_function.reward_kwargs.server_urls=[{','.join(args.server)}] \\")
        print(f"    +reward.custom_reward_function.reward_kwargs.verifier={args.verifier} \\")
    return 0


COMMAND = register_subcommand(
    Subcommand(
        "verl-config",
        "write the veRL agent-loop YAML for the toolfactory loop and print the Hydra overrides",
        configure,
        run,
        description="Writes the agent-loop YAML (name, _target_, settings) that veRL loads through "
        "actor_rollout_ref.rollout.agent.agent_loop_config_path, and prints the overrides that use it.",
    )
)

# ``trainer-client train`` lives in train_cli; cli.PLUGIN_MODULES names this module, so
# importing it here registers ``train`` too (until PLUGIN_MODULES lists train_cli itself).
from trainer_client.cli import train as _train_cli  # noqa: E402,F401
