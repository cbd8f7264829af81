"""τ² modules are imported one at a time (tools/envs/tau2/domain.py ``import_tau2``): each import
sets PYTHON_DOTENV_DISABLED and removes it after, and a second import in another thread found it
set, then saw it vanish inside python-dotenv's check (KeyError: a failed verdict in a loaded run).
"""

from __future__ import annotations

import os
import threading
import types

import pytest

from tools.envs.tau2 import domain

SECOND_IMPORT_WAIT_S = 2.0  # how long the second import is given to start beside the first


def test_a_second_import_waits_for_the_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTHON_DOTENV_DISABLED", raising=False)
    inside: list[str] = []
    overlaps: list[str] = []
    without_flag: list[str] = []
    first_inside, second_inside, release = threading.Event(), threading.Event(), threading.Event()

    def slow_import(name: str) -> types.ModuleType:
        if inside:
            overlaps.append(name)
        inside.append(name)
        (first_inside if name == "first" else second_inside).set()
        if name == "first":
            release.wait(60)
        if os.environ.get("PYTHON_DOTENV_DISABLED") != "1":
            without_flag.append(name)
        inside.remove(name)
        return types.ModuleType(name)

    monkeypatch.setattr(domain.importlib, "import_module", slow_import)
    first = threading.Thread(target=domain.import_tau2, args=("first",))
    first.start()
    assert first_inside.wait(60)
    second = threading.Thread(target=domain.import_tau2, args=("second",))
    second.start()
    # with one import at a time the second cannot start while the first is inside: the wait runs out
    second_inside.wait(SECOND_IMPORT_WAIT_S)
    release.set()
    first.join(60)
    second.join(60)
    assert overlaps == [] and without_flag == []
    assert "PYTHON_DOTENV_DISABLED" not in os.environ  # removed after, as it was not set before
