"""``import trainer_client``: the public names, without importing torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

import trainer_client


def test_import_is_light_and_every_public_name_resolves_lazily() -> None:
    code = (
        "import sys, trainer_client\n"
        "assert 'torch' not in sys.modules, 'import trainer_client imported torch'\n"
        "from trainer_client import RolloutCore, Task, ToolClient, get_parser\n"
        "assert 'torch' not in sys.modules, 'a light name imported torch'\n"
        "trainer_client.GRPOConfig  # a plain dataclass: the train command's flags come from it\n"
        "assert 'torch' not in sys.modules, 'GRPOConfig imported torch'\n"
        "trainer_client.GRPOTrainer\n"
        "assert 'torch' in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_all_lists_what_a_user_needs() -> None:
    needed = {
        "ToolClient", "SyncToolClient", "RolloutCore", "RolloutConfig", "Task", "Trajectory",
        "get_parser", "register_parser", "ParsedCall", "GRPOConfig", "GRPOTrainer", "ScriptedGenerator",
    }  # fmt: skip
    assert needed <= set(trainer_client.__all__)
    assert len(set(trainer_client.__all__)) == len(trainer_client.__all__)
    for name in trainer_client.__all__:
        value = getattr(trainer_client, name)
        assert getattr(value, "__name__", name) == name, name
    assert set(trainer_client.__all__) <= set(dir(trainer_client))


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchThing'"):
        trainer_client.NoSuchThing  # noqa: B018
