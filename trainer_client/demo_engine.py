"""Which engine the demo generates with, and on how many torch threads: the fastest that is here.

vLLM (``.venv-vllm``, made by ``make vllm``) ran the full demo in 66 s on a machine at load
10-17 where the HF backend on torch's default two threads had done 8 of 36 trajectories after
33 min: two compute threads on two busy cores wait on each other at every layer (7-30 model
tokens/s against 150-211 on one thread, FACTS.md). So: vLLM when its environment is installed,
else HF on one thread where the cores are few or busy.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from trainer_client.backends.vllm_server import DEFAULT_VENV, PYTHON_ENV

__all__ = ["EngineChoice", "choose_engine", "torch_threads", "vllm_installed"]

# `make vllm` writes this last, once vLLM imports: a half-made environment does not count.
VLLM_READY_FILE = ".installed"


@dataclass(frozen=True)
class EngineChoice:
    engine: str  # "hf" or "vllm"
    why: str  # one line for the user: what runs and how to get the faster one
    automatic: bool = False  # chosen by "auto": a vLLM that does not start falls back to HF


def vllm_installed(venv: Path = DEFAULT_VENV) -> bool:
    """``make vllm`` finished (or ``$TOOLFACTORY_VLLM_PYTHON`` names a python to run vLLM with)."""
    return (venv / VLLM_READY_FILE).is_file() or bool(os.environ.get(PYTHON_ENV))


def torch_threads(cores: int | None, load_1min: float | None) -> int:
    """One thread on two cores or fewer, or when the machine is already busy (load >= cores);
    else torch's own default (0: leave it)."""
    cores = cores or 1
    if cores <= 2 or (load_1min is not None and load_1min >= cores):
        return 1
    return 0


def choose_engine(requested: str, engine_url: str | None, *, installed: bool) -> EngineChoice:
    """``auto``: vLLM when a server is given or its environment is installed, else HF."""
    if requested == "vllm" or (requested == "auto" and (engine_url or installed)):
        where = f"the server at {engine_url}" if engine_url else "a local server from .venv-vllm"
        return EngineChoice(
            "vllm",
            f"engine: vLLM ({where}); --engine hf for transformers in this process",
            automatic=requested == "auto",
        )
    hint = (
        ""
        if installed
        else "; `make vllm` once (~5.5 min, ~3.4 GB) and the demo uses vLLM, several times faster"
    )
    return EngineChoice("hf", f"engine: HF transformers in this process{hint}")
