"""Import-time patches for veRL 0.9.1 on the CPU platform, where veRL hard-codes CUDA past its
platform layer (``verl.plugin.platform``). Each replaces one function, is applied once and only
under ``VERL_PLATFORM=cpu`` (``cpu_platform`` calls ``apply``), and is listed in
docs/engines.md with veRL's file:line, why, and the upstream fix it stands in for.
"""

from __future__ import annotations

from typing import Any

_applied = False


def _check_resource_available(self: Any) -> None:
    """``ResourcePoolManager._check_resource_available`` (single_controller/ray/base.py:227-242)
    counts only Ray's ``GPU``/``NPU`` resources; count the platform's Ray resource instead."""
    import ray
    from verl.plugin.platform import get_platform

    resource = get_platform().ray_resource_name()
    available = sum(
        node.get(resource, 0) for node in ray._private.state.available_resources_per_node().values()
    )
    required = sum(n for process_on_nodes in self.resource_pool_spec.values() for n in process_on_nodes)
    if available < required:
        raise ValueError(f"Total available {resource} {available} is less than total desired {required}")


def _engine_cls(original: Any) -> Any:
    """``EngineRegistry.get_engine_cls`` (workers/engine/base.py:398-429) finds an engine only
    for a device it was registered for, and the FSDP engines register ``cuda``/``npu``
    (fsdp/transformer_impl.py:1143, :1594) although their code is device-agnostic (it goes
    through the platform). On the CPU, take the CUDA registration of the same class."""

    def get_engine_cls(cls: Any, model_type: str, backend: str) -> Any:
        registry = cls._engines.get(model_type, {}).get(backend, {})
        if "cpu" not in registry:
            cuda = registry.get("cuda") or registry.get(("cuda", "nvidia"))
            if cuda is not None:
                registry["cpu"] = cuda
        return original.__func__(cls, model_type, backend)

    return classmethod(get_engine_cls)


def _accelerator_ids(original: Any) -> Any:
    """vLLM replica launch (workers/rollout/vllm_rollout/vllm_async_server.py:1348) indexes
    ``get_accelerator_ids()[platform.ray_resource_name()][0]``; Ray lists no ids for ``CPU``
    (not an accelerator). Report the one CPU "device" as id ``"0"``."""

    def get_accelerator_ids(self: Any) -> dict[str, list[str]]:
        ids = original(self)
        ids.setdefault("CPU", ["0"])
        return ids

    return get_accelerator_ids


def _unpinned_offload_policy(original: Any) -> Any:
    """The FSDP2 engine gives the reference policy ``CPUOffloadPolicy(pin_memory=True)``
    (workers/engine/fsdp/transformer_impl.py:462); pinning host memory needs an accelerator
    ("Cannot access accelerator device when none is available"). On the CPU nothing is copied
    to a device, so the same policy without pinning."""

    def policy(*args: Any, **kwargs: Any) -> Any:
        kwargs["pin_memory"] = False
        return original(*args, **kwargs)

    return policy


def apply() -> None:
    """Install the patches (idempotent)."""
    global _applied
    if _applied:
        return
    _applied = True
    from verl.single_controller.ray import base
    from verl.utils import distributed

    base.ResourcePoolManager._check_resource_available = _check_resource_available
    # utils/distributed.py:89 builds "cpu:gloo,{device}:{backend}", i.e. "cpu:gloo,cpu:gloo" on the
    # CPU, which torch refuses (duplicate device type). A default backend of plain "gloo" on the
    # function object itself reaches every module that imported it by name (engine_workers.py).
    distributed.initialize_global_process_group_ray.__defaults__ = (None, "gloo")

    from ray.runtime_context import RuntimeContext
    from verl.workers.engine.base import EngineRegistry

    EngineRegistry.get_engine_cls = _engine_cls(EngineRegistry.get_engine_cls)
    RuntimeContext.get_accelerator_ids = _accelerator_ids(RuntimeContext.get_accelerator_ids)

    from verl.workers.engine.fsdp import transformer_impl

    transformer_impl.CPUOffloadPolicy = _unpinned_offload_policy(transformer_impl.CPUOffloadPolicy)
