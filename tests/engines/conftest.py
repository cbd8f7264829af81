"""One real vLLM server (CPU build, from .venv-vllm) for every test of this package.

It serves the packaged SmolLM2-135M-Instruct as ``trainer-client serve-model`` does (eager,
1 GiB KV cache), in the dtype the project's own local servers choose (``cpu_dtype``: bfloat16
where the CPU computes it natively, else float32, where vLLM's bfloat16 decodes 3-4x slower),
with the weight-sync endpoints and vLLM's hermes tool-call parser on (``test_tau2_dual``: a
request with ``tools`` is answered with parsed ``tool_calls``; one without is unchanged), and is
stopped after the package's last test. Starting it takes 30-50 s on a quiet machine and up to
~3 min on a loaded one (RSS ~3.5 GB), so the tests share it and allow for a slow start. A test
that needs other settings would start its own with ``started_vllm``.

Without .venv-vllm the tests are skipped, saying so, unless ``TOOLFACTORY_REQUIRE_VLLM=1``
(set by ``make test``, which builds .venv-vllm): then a missing or broken vLLM fails them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.require import require_vllm
from trainer_client.backends.models import load_model, load_tokenizer, resolve_model_path
from trainer_client.backends.vllm import VLLMGenerator
from trainer_client.backends.vllm_server import (
    LocalVLLMServer,
    VLLMServerSettings,
    cpu_dtype,
    local_vllm_server,
)

STARTUP_TIMEOUT_S = 1200.0  # a loaded 2-core machine has taken ~3 min; leave room
SERVED_DTYPE = cpu_dtype()  # as the demo's and `rollout --engine vllm`'s own servers
TOOL_CALLS = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")


@contextlib.contextmanager
def started_vllm(**settings: Any) -> Iterator[LocalVLLMServer]:
    """A vLLM server for the packaged SmolLM2 (in ``SERVED_DTYPE`` unless told) with these
    ``VLLMServerSettings`` fields, stopped on exit. Without .venv-vllm the test is skipped, or
    failed under ``TOOLFACTORY_REQUIRE_VLLM=1``."""
    require_vllm()
    config = VLLMServerSettings(resolve_model_path("smollm2"), **{"dtype": SERVED_DTYPE, **settings})
    with local_vllm_server(config, startup_timeout_s=STARTUP_TIMEOUT_S) as server:
        yield server


@pytest.fixture(scope="package")
def vllm_server() -> Iterator[LocalVLLMServer]:
    with started_vllm(weight_sync=True, extra_args=TOOL_CALLS) as server:
        yield server


@pytest.fixture(scope="package")
def smol_tokenizer() -> Any:
    return load_tokenizer("smollm2")


@pytest.fixture(scope="package")
def packaged_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The packaged weights as the trainer writes them for vLLM (``save_for_vllm``), in the
    served dtype (so that the restored server computes exactly what it started with): what a
    test that reloaded other weights reloads to put the shared server back. (Not the original
    directory: vLLM's reload corrupts a tied output head when a checkpoint without
    ``lm_head.weight`` follows one with it; see ``training.vllm_policy``.)"""
    import torch

    from trainer_client.training.vllm_policy import save_for_vllm

    path = tmp_path_factory.mktemp(f"packaged-{SERVED_DTYPE}")
    save_for_vllm(load_model("smollm2")[1], path, dtype=getattr(torch, SERVED_DTYPE))
    return path


def reload_weights(server: LocalVLLMServer, path: Path) -> float:
    """Make the shared server load the checkpoint in ``path``; the seconds it took."""

    async def reload() -> float:
        gen = VLLMGenerator(server.url)
        try:
            return await gen.reload_weights(path)
        finally:
            await gen.aclose()

    return asyncio.run(reload())
