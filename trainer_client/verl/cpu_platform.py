"""A CPU platform for veRL 0.9.1, registered through veRL's hardware plug-in point.

veRL reaches the device only through ``verl.plugin.platform.get_platform()`` (device name,
``torch.<device>`` module, collective backend, Ray resource), chosen by ``VERL_PLATFORM``.
This module registers ``cpu`` there: device ``"cpu"``, collective backend ``gloo``, Ray
resource ``CPU``, no CUDA IPC (so veRL's weight push into vLLM takes its shared-memory path).
It is imported by the ``verl.plugins`` entry point in every veRL process (veRL's
``__init__`` loads them before anything asks for the platform); with ``VERL_PLATFORM=cpu``
it also applies the few import-time patches in ``cpu_patches`` where veRL hard-codes CUDA
past the platform layer (listed in docs/engines.md with veRL's file:line).
"""

from __future__ import annotations

import contextlib
import os
import types
from collections.abc import Iterator
from typing import Any

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

PLATFORM_NAME = "cpu"


def _no_op(*_args: Any, **_kwargs: Any) -> None:
    return None


def _zero(*_args: Any, **_kwargs: Any) -> int:
    return 0


def _cpu(*_args: Any, **_kwargs: Any) -> str:
    return "cpu"


def _mem_get_info(*_args: Any, **_kwargs: Any) -> tuple[int, int]:
    """(free, total) bytes of host memory: veRL logs it and sizes caches from it."""
    pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    free = os.sysconf("SC_AVPHYS_PAGES") * size
    return free, pages * size


def _device_module() -> types.ModuleType:
    """``torch.cpu`` plus the ``torch.cuda`` names veRL calls on its device module.

    Memory statistics read 0 (veRL only logs them), caches and IPC have nothing to free,
    RNG state is the CPU generator's (the one every CPU op uses).
    """
    module = types.ModuleType("toolfactory_cpu_device", "torch.cpu with torch.cuda's names veRL calls")
    for name in (
        "Event",
        "Stream",
        "StreamContext",
        "current_stream",
        "stream",
        "synchronize",
        "is_available",
    ):
        setattr(module, name, getattr(torch.cpu, name))
    module.device_count = lambda: 1
    module.current_device = _cpu
    module.set_device = _no_op
    module.empty_cache = _no_op
    module.ipc_collect = _no_op
    module.set_per_process_memory_fraction = _no_op
    module.reset_peak_memory_stats = _no_op
    module.memory_allocated = _zero
    module.memory_reserved = _zero
    module.max_memory_allocated = _zero
    module.max_memory_reserved = _zero
    module.mem_get_info = _mem_get_info
    module.get_rng_state = lambda *_a, **_k: torch.get_rng_state()
    module.set_rng_state = lambda state, *_a, **_k: torch.set_rng_state(state)
    module.manual_seed = torch.manual_seed
    module.manual_seed_all = torch.manual_seed
    module.get_device_name = lambda *_a, **_k: "cpu"
    module.is_initialized = lambda: True
    return module


_DEVICE_MODULE = _device_module()


@PlatformRegistry.register(platform=PLATFORM_NAME)
class PlatformCPU(PlatformBase):
    """veRL on the host CPU: gloo collectives, Ray's CPU resource, shared-memory weight push."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return _DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Never auto-detected: a GPU host must keep CUDA unless VERL_PLATFORM=cpu says otherwise.
        return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM_NAME

    def current_device(self) -> str:  # type: ignore[override]
        # veRL uses this as a device (``.to(get_device_id())``, FSDP's ``device_id``); an int
        # means an accelerator's index to torch, so answer as torch.cpu.current_device() does.
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray sets no such variable for CPUs; a name nothing else reads keeps veRL's bookkeeping inert.
        return "TOOLFACTORY_CPU_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "CPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        # "CPU" is Ray's own resource: it is asked for with num_cpus, never in resources={}.
        return {"num_cpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False  # no CUDA IPC handles: veRL's bucketed weight push uses shared memory

    def rollout_env_vars(self) -> dict[str, str]:
        return {"VLLM_TARGET_DEVICE": "cpu"}

    def cudart(self) -> None:
        return None


# TOOLFACTORY_VERL_CPU_PATCHES=0 leaves veRL unpatched (tests/verl/test_cpu_platform.py shows each
# patch is needed).
if os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM_NAME and (
    os.environ.get("TOOLFACTORY_VERL_CPU_PATCHES", "1") != "0"
):
    from trainer_client.verl import cpu_patches

    cpu_patches.apply()

if os.environ.get("TOOLFACTORY_VERL_PROBE", "").strip():
    from trainer_client.verl import trainer_probe

    trainer_probe.install()
