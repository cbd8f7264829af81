"""GRPO rollouts on vLLM while the update stays on the HF policy: the weight sync between the two.

vLLM serves the policy (its own server, from ``.venv-vllm``, or one at ``engine_url``); the
trainer updates the HF model in this process; before each step's rollouts the new weights
are written as a safetensors checkpoint and the server reloads them in place
(``/collective_rpc`` -> ``reload_weights(weights_path=...)``, then its prefix cache is
reset), so every step samples from the policy it updates. That is the simplest sound way
on a CPU: veRL's own in-memory push (``vLLMColocateWorkerExtension``) needs CUDA IPC.

``VLLMPolicyEngine`` is a ``Generator`` (it forwards ``generate`` to a ``VLLMGenerator``), so
the trainer's rollout cores use it as they use the HF generator.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import Any

import torch

from trainer_client.backends.base import TokenOutput
from trainer_client.backends.models import DEFAULT_MODEL, SMOLLM2_DIRNAME, resolve_model_path
from trainer_client.backends.vllm import VLLMGenerator
from trainer_client.backends.vllm_server import VLLMServerSettings, cpu_dtype, local_vllm_server

__all__ = ["SYNC_DIRNAME", "VLLMPolicyEngine", "save_for_vllm"]

logger = logging.getLogger(__name__)

SYNC_DIRNAME = "vllm_weights"
# The checkpoint vLLM reloads is written in the dtype it serves (no conversion on its side; in
# float32 no update smaller than bfloat16's rounding is lost); bfloat16 for a server we did not start.
SYNC_DTYPE = torch.bfloat16


def save_for_vllm(model: Any, path: Path, dtype: torch.dtype = SYNC_DTYPE) -> None:
    """Write ``model``'s weights (and config) as an HF checkpoint in ``dtype`` under ``path``.

    Every parameter is written under its own name, tied ones too: vLLM 0.32's in-place reload
    leaves the output head of a model with tied embeddings (SmolLM2, Qwen2.5-0.5B) at its
    start-up weights unless the checkpoint has ``lm_head.weight`` (measured: log-probs then
    match the old head, not the new one); converting each tensor on its own keeps them apart,
    so ``save_pretrained`` writes both. (A later reload from a checkpoint without that key,
    e.g. the original model directory, was seen to corrupt the head: reload only from these.)
    """
    path.mkdir(parents=True, exist_ok=True)
    state = {name: tensor.detach().to(dtype, copy=True) for name, tensor in model.state_dict().items()}
    model.save_pretrained(path, state_dict=state)


class VLLMPolicyEngine:
    """Generation on vLLM for ``GRPOTrainer``; ``sync_weights`` pushes the policy before a rollout."""

    def __init__(
        self,
        model_name: str,
        out_dir: Path,
        *,
        url: str | None = None,
        max_concurrency: int = 64,
        default_max_tokens: int = 256,
    ) -> None:
        self._stack = contextlib.ExitStack()
        self.sync_dtype = SYNC_DTYPE
        if url is None:
            model_dir = resolve_model_path(model_name)
            name = DEFAULT_MODEL if model_dir.name == SMOLLM2_DIRNAME else model_dir.name
            # bf16 where the CPU computes it, else float32 (3-4x faster than emulated bf16 on AVX2)
            dtype = cpu_dtype()
            logger.info("starting a vLLM server for %s in %s", model_dir, dtype)
            server = self._stack.enter_context(
                local_vllm_server(
                    VLLMServerSettings(
                        model_dir,
                        served_model_name=name,
                        dtype=dtype,
                        weight_sync=True,
                        # the update waits for the rollouts and vLLM idles during the update, so
                        # vLLM gets every core while it generates (2 cores: 1.5x the tokens/s of
                        # vLLM's own binding to one, bench/README.md)
                        omp_threads_bind="all",
                    )
                )
            )
            self.sync_dtype = getattr(torch, dtype)
            logger.info("vLLM ready at %s after %.0f s", server.url, server.started_s)
            url = server.url
        self.url = url
        self.generator = VLLMGenerator(
            url, max_concurrency=max_concurrency, default_max_tokens=default_max_tokens
        )
        self.weights_dir = out_dir / SYNC_DIRNAME
        self.synced_step: int | None = None
        self.last_sync: dict[str, float] = {}

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kwargs: Any
    ) -> TokenOutput:
        return await self.generator.generate(
            request_id, prompt_ids=prompt_ids, sampling_params=sampling_params, **kwargs
        )

    def clear_prefix_cache(self) -> None:
        """Nothing to do here: vLLM's prefix cache is reset with every weight reload."""

    async def sync_weights(self, model: Any, step: int) -> float:
        """Make vLLM serve ``model``'s current weights (once per ``step``); the seconds it took."""
        if self.synced_step == step:
            return 0.0
        started = time.perf_counter()
        await asyncio.to_thread(save_for_vllm, model, self.weights_dir, self.sync_dtype)
        saved = time.perf_counter()
        await self.generator.reload_weights(self.weights_dir)
        self.synced_step = step
        self.last_sync = {"save_s": saved - started, "reload_s": time.perf_counter() - saved}
        return time.perf_counter() - started

    async def aclose(self) -> None:
        try:
            await self.generator.aclose()
        finally:
            self._stack.close()
