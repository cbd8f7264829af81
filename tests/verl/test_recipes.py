"""The veRL recipes in examples/: every launch script's Hydra overrides compose against
veRL's own config schema and pass veRL's ``validate_config``; the agent-loop YAMLs and
the tool-server configs they point at load and validate. (The runs themselves need GPUs
and vLLM; the reward bridge's loading through veRL is in test_reward_bridge.py.)
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.require import require

require("verl")

from tests.support.server import REPO  # noqa: E402

EXAMPLES = REPO / "examples"
SCRIPTS = sorted(EXAMPLES.glob("*/train_grpo_*.sh"))


def dry_run(script: Path, **env: str) -> list[str]:
    """The overrides a launch script passes to veRL (DRY_RUN=1 prints them, one per line)."""
    done = subprocess.run(
        ["bash", str(script)],
        env={**os.environ, "DRY_RUN": "1", "DATA_DIR": "/data/toolfactory", **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.splitlines() if line.strip()]


def compose(overrides: list[str]) -> Any:
    import verl
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return hydra_compose("ppo_trainer", overrides=overrides)


def test_there_are_recipes_for_search_and_math() -> None:
    names = {f"{p.parent.name}/{p.name}" for p in SCRIPTS}
    assert {
        "search_r1/train_grpo_qwen2.5-3b_8gpu.sh",
        "search_r1/train_grpo_qwen3-4b_8gpu.sh",
        "search_r1/train_grpo_1gpu_small.sh",
        "math/train_grpo_1gpu.sh",
        "math/train_grpo_8gpu.sh",
        "image_env/train_grpo_qwen2.5-vl-3b_8gpu.sh",
    } <= names


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_launch_script_config_is_valid_for_verl(script: Path) -> None:
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config
    from verl.workers.config import RolloutConfig

    from trainer_client.verl.config import AGENT_NAME, load_agent_loop_yaml

    overrides = dry_run(script)
    assert all("=" in o for o in overrides), overrides
    config = compose(overrides)  # unknown keys or bad types fail here
    validate_config(
        config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config)
    )
    rollout = omega_conf_to_dataclass(config.actor_rollout_ref.rollout)  # as AgentLoopWorker does
    assert isinstance(rollout, RolloutConfig)
    assert rollout.name == "vllm" and rollout.mode == "async"
    assert config.algorithm.adv_estimator == "grpo"
    assert rollout.agent.default_agent_loop == AGENT_NAME
    # the agent loop it names exists, validates, and fits the rollout budgets
    loops = load_agent_loop_yaml(rollout.agent.agent_loop_config_path)
    settings = loops[AGENT_NAME]
    assert settings.server_urls == ("http://127.0.0.1:8000",)
    assert (settings.max_tokens_per_turn or 0) <= rollout.response_length
    assert rollout.prompt_length >= config.data.max_prompt_length
    # the data it trains on comes from the task-data builder
    assert str(config.data.train_files).startswith("/data/toolfactory/")


def test_agent_loop_yaml_reads_the_server_url_from_the_environment() -> None:
    from trainer_client.verl.config import load_agent_loop_yaml

    os.environ["TOOLFACTORY_URL"] = "http://tools.internal:9000"
    try:
        loops = load_agent_loop_yaml(EXAMPLES / "search_r1" / "agent_loop.yaml")
    finally:
        del os.environ["TOOLFACTORY_URL"]
    settings = loops["toolfactory"]
    assert settings.server_urls == ("http://tools.internal:9000",)
    assert (settings.format, settings.tool_result_template, settings.toolset) == (
        "search_r1",
        "search_r1",
        "search",
    )
    assert settings.verifier == "exact_match" and settings.verifier_arguments == {"require_answer_tag": True}


@pytest.mark.parametrize("recipe", ["search_r1", "math"])
def test_recipe_server_config_loads_and_its_targets_import(recipe: str) -> None:
    from tool_server.config import load_config

    config = load_config(EXAMPLES / recipe / "server.yaml", environ={})
    names = {spec.target for spec in config.tools} | {spec.target for spec in config.verifiers}
    for target in names:
        module, _, attr = target.partition(":")
        assert hasattr(importlib.import_module(module), attr), target
    loops = __import__("trainer_client.verl.config", fromlist=["x"]).load_agent_loop_yaml(
        EXAMPLES / recipe / "agent_loop.yaml"
    )
    settings = loops["toolfactory"]
    assert any(settings.toolset in spec.toolsets for spec in config.tools), "the loop's toolset is served"
    verifiers = {spec.target.rsplit(":", 1)[1] for spec in config.verifiers}
    wanted = {settings.verifier} | set(settings.verifier_arguments.get("verifiers", {}))
    assert wanted <= verifiers | {"format"} and ("format" not in wanted or "format_check" in verifiers)


def test_image_env_recipe_serves_the_pack_its_rows_name_and_fits_its_views(tmp_path: Path) -> None:
    """The VLM recipe: the server builds the pack the data was built from (same arguments),
    prepare_data.sh writes what the launch script trains on, the loop plays its toolset,
    two views of Qwen2-VL's default image processor fit max_obs_tokens (a view that did not
    fit would be replaced by a note), and vLLM's image limit covers every view a trajectory
    can get."""
    import re

    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from tool_server.config import load_config
    from tools.envs.image_env import VIEW_SIDE
    from trainer_client.verl.config import load_agent_loop_yaml

    recipe = EXAMPLES / "image_env"
    (env,) = load_config(recipe / "server.yaml", environ={}).environments
    module, _, name = str(env.source).partition(":")
    pack = getattr(importlib.import_module(module), name)(**{**env.arguments, "tasks": 1})
    settings = load_agent_loop_yaml(recipe / "agent_loop.yaml")["toolfactory"]
    assert settings.toolset == pack.id and settings.verifier == "tool_use"
    data_args = dict(re.findall(r"--env-arg (\w+)=(\w+)", (recipe / "prepare_data.sh").read_text()))
    assert data_args == {k: str(v) for k, v in env.arguments.items()}
    images = Qwen2VLImageProcessorPil()  # Qwen2.5-VL's processor settings are its defaults
    grid = images(images=[Image.new("RGB", (VIEW_SIDE, VIEW_SIDE))])["image_grid_thw"][0]
    view_tokens = int(grid.prod()) // images.merge_size**2 + 2  # pads + vision start/end
    assert settings.max_calls_per_turn * (view_tokens + 40) <= settings.max_obs_tokens
    (script,) = recipe.glob("train_grpo_*.sh")
    overrides = dict(o.lstrip("+").split("=", 1) for o in dry_run(script))
    assert (
        int(overrides["actor_rollout_ref.rollout.limit_images"])
        >= settings.max_turns * settings.max_calls_per_turn
    )
    assert "VL" in overrides["actor_rollout_ref.model.path"]
    assert_prepared_data_is_what_training_reads(script, tmp_path)


def test_scripts_are_valid_bash() -> None:
    for script in [*SCRIPTS, *EXAMPLES.glob("*/prepare_data.sh")]:
        done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
        assert done.returncode == 0, f"{script}: {done.stderr}"


def test_a_misspelt_override_is_caught() -> None:
    """The check above is not vacuous: veRL's schema rejects a key that does not exist."""
    from hydra.errors import ConfigCompositionException

    overrides = dry_run(EXAMPLES / "math" / "train_grpo_1gpu.sh")
    overrides.append("actor_rollout_ref.rollout.agent.agent_loop_config_pth=/x.yaml")
    with pytest.raises(ConfigCompositionException):
        compose(overrides)


def test_verl_config_command_writes_a_loadable_yaml(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainer_client.cli.command import main
    from trainer_client.verl.config import load_agent_loop_yaml

    out = tmp_path / "agent_loop.yaml"
    code = main(
        [
            "verl-config",
            "--server", "http://tools-a:8000",
            "--server", "http://tools-b:8000",
            "--format", "search_r1",
            "--tool-result-template", "search_r1",
            "--toolset", "search",
            "--max-turns", "3",
            "--verifier", "f1",
            "--verifier-args", '{"require_answer_tag": true}',
            "--out", str(out),
        ]
    )  # fmt: skip
    assert code == 0
    settings = load_agent_loop_yaml(out)["toolfactory"]
    assert settings.server_urls == ("http://tools-a:8000", "http://tools-b:8000")
    assert (settings.format, settings.toolset, settings.max_turns, settings.verifier) == (
        "search_r1",
        "search",
        3,
        "f1",
    )
    printed = capsys.readouterr().out
    assert f"actor_rollout_ref.rollout.agent.agent_loop_config_path={out.resolve()}" in printed
    overrides = [
        line.strip().rstrip(" \\")
        for line in printed.splitlines()
        if "=" in line and not line.startswith("#")
    ]
    config = compose(overrides)  # the printed overrides are valid veRL keys
    assert config.actor_rollout_ref.rollout.agent.default_agent_loop == "toolfactory"


def test_bad_agent_loop_settings_are_rejected_with_the_reason() -> None:
    from trainer_client.verl.config import LoopSettings

    with pytest.raises(ValueError, match="server_urls"):
        LoopSettings.from_kwargs({"format": "hermes"})
    with pytest.raises(ValueError, match=r"unknown toolfactory agent-loop settings \['max_turn'\]"):
        LoopSettings.from_kwargs({"server_urls": ["http://x:1"], "max_turn": 3})
    with pytest.raises(ValueError, match="max_turns"):
        LoopSettings.from_kwargs({"server_urls": "http://x:1", "max_turns": 0})
    with pytest.raises(ValueError, match="must start with"):
        LoopSettings.from_kwargs({"server_urls": "ftp://x:1"})
    # replicas discovered from DNS (a headless Service's name) are a server URL too
    assert LoopSettings.from_kwargs({"server_urls": "dns://tools.svc:8000"}).server_urls == (
        "dns://tools.svc:8000",
    )
    settings = LoopSettings.from_kwargs({"server_urls": "http://a:1,http://b:2"})
    assert settings.server_urls == ("http://a:1", "http://b:2")
    sample = settings.with_overrides({"index": 4, "verifier": "f1", "toolfactory": {"max_turns": 2}})
    assert (sample.verifier, sample.max_turns, sample.server_urls) == ("f1", 2, settings.server_urls)


def test_the_environment_recipe_serves_the_pack_its_loop_and_data_name(tmp_path: Path) -> None:
    """τ²-bench retail: the server config's pack is the toolset the agent loop names, its
    verifier is the one environments register, and prepare_data.sh writes the files the
    launch script trains on."""
    from tool_server.config import load_config
    from tool_server.environments import TOOL_USE, load_environment
    from trainer_client.verl.config import load_agent_loop_yaml

    recipe = EXAMPLES / "tau2_retail"
    config = load_config(recipe / "server.yaml", environ={})
    (spec,) = config.environments
    pack = load_environment(spec)
    settings = load_agent_loop_yaml(recipe / "agent_loop.yaml")["toolfactory"]
    assert settings.toolset == (spec.toolset or pack.id) == "tau2-retail"
    assert settings.verifier == TOOL_USE and settings.verifier_arguments == {"mode": "train"}
    assert config.tools == [] and config.verifiers == []  # the pack's tools only

    assert_prepared_data_is_what_training_reads(recipe / "train_grpo_8gpu.sh", tmp_path)


def assert_prepared_data_is_what_training_reads(script: Path, data_dir: Path) -> None:
    """The recipe's prepare_data.sh writes the files its launch ``script`` trains on."""
    done = subprocess.run(
        ["bash", str(script.parent / "prepare_data.sh")],
        # the script runs `python` as a user's activated environment has it: this one's
        env={
            **os.environ,
            "DATA_DIR": str(data_dir),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        },
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    overrides = dict(o.split("=", 1) for o in dry_run(script, DATA_DIR=str(data_dir)))
    for key in ("data.train_files", "data.val_files"):
        assert Path(overrides[key]).is_file(), overrides[key]
