"""veRL's "cpu" platform (trainer_client/verl/cpu_platform.py) and its import-time patches
(cpu_patches.py), each checked in a fresh interpreter with ``VERL_PLATFORM=cpu`` on the veRL
function it stands in for, and shown needed: with ``TOOLFACTORY_VERL_CPU_PATCHES=0`` each
check fails as veRL fails on the CPU (docs/engines.md lists veRL's file:line). The whole
trainer on the CPU is tests/engines/test_verl_trainer_cpu.py; the Ray-side patches (resource
check, accelerator ids) are exercised there."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.require import require

require("verl")

PLATFORM = """
import torch, verl
from verl.plugin.platform import get_platform
from verl.utils.device import get_device_id, get_nccl_backend, get_torch_device, is_support_ipc
assert type(get_platform()).__name__ == "PlatformCPU", type(get_platform())
assert get_nccl_backend() == "gloo" and not is_support_ipc()
assert torch.zeros(1).to(get_device_id()).device.type == "cpu"  # veRL's .to(get_device_id())
get_torch_device().empty_cache(); get_torch_device().synchronize()
assert get_platform().ray_resource_options(0.5) == {"num_cpus": 0.5}
"""
PATCHES = {
    # utils/distributed.py:89 asks for "cpu:gloo,cpu:gloo"
    "process_group": """
import os, socket, torch, verl
from verl.utils.distributed import initialize_global_process_group_ray
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
initialize_global_process_group_ray()
assert torch.distributed.get_backend() == "gloo"
""",
    # workers/engine/base.py:398-429: no engine registered for device "cpu"
    "engine": """
import verl
from verl.workers.engine.base import EngineRegistry
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
assert EngineRegistry.get_engine_cls("language_model", "fsdp2") is FSDPEngineWithLMHead
""",
    # workers/engine/fsdp/transformer_impl.py:462: pinned host memory needs an accelerator
    "offload": """
import torch, verl
from verl.workers.engine.fsdp import transformer_impl
torch.zeros(1).pin_memory() if transformer_impl.CPUOffloadPolicy(pin_memory=True).pin_memory else None
""",
}


def run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VERL_PLATFORM": "cpu", "OMP_NUM_THREADS": "1", **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)


def test_the_cpu_platform_is_chosen_by_verl_platform() -> None:
    done = run(PLATFORM)
    assert done.returncode == 0, done.stderr[-4000:]
    assert run(PLATFORM, VERL_PLATFORM="").returncode != 0  # veRL's own choice here: CUDA


@pytest.mark.parametrize("name", sorted(PATCHES))
def test_each_patch_is_needed_and_works(name: str) -> None:
    done = run(PATCHES[name])
    assert done.returncode == 0, done.stderr[-4000:]
    unpatched = run(PATCHES[name], TOOLFACTORY_VERL_CPU_PATCHES="0")
    assert unpatched.returncode != 0, unpatched.stdout
