"""``trainer-client serve-model`` picks the dtype the CPU computes fast: bfloat16 only where the
CPU has it natively (AVX512-BF16, AMX), else float32 (emulated bf16 decoded 3-4x slower). A
stand-in for vLLM's python records the arguments it was started with, then exits."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.server import REPO
from trainer_client.backends.vllm_server import cpu_dtype


def started_with(tmp_path: Path, *flags: str) -> list[str]:
    recorded = tmp_path / "argv"
    fake = tmp_path / "venv" / "bin" / "python"
    fake.parent.mkdir(parents=True)
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {recorded}\nexit 1\n')
    fake.chmod(0o755)
    done = subprocess.run(
        [sys.executable, "-m", "trainer_client.cli.command", "serve-model", "--python", str(fake), *flags],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode != 0, done.stderr  # the stand-in exits: serve-model says vLLM did not start
    assert recorded.is_file(), done.stderr
    return recorded.read_text().split("\n")


@pytest.mark.parametrize("flags", [(), ("--dtype", "bfloat16")], ids=["default", "explicit"])
def test_the_dtype_is_the_cpus_unless_given(tmp_path: Path, flags: tuple[str, ...]) -> None:
    argv = started_with(tmp_path, *flags)
    expected = flags[1] if flags else cpu_dtype()
    assert argv[argv.index("--dtype") + 1] == expected, argv


def test_cpu_dtype_reads_the_cpu_flags(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("flags\t\t: fpu sse avx2 fma\n")
    assert cpu_dtype(cpuinfo) == "float32"
    cpuinfo.write_text("flags\t\t: fpu avx2 avx512f avx512_bf16\n")
    assert cpu_dtype(cpuinfo) == "bfloat16"
    assert cpu_dtype(tmp_path / "missing") == "bfloat16"  # unknown CPU: vLLM's own default


def test_omp_threads_bind_names_the_cores_unless_the_environment_does() -> None:
    from trainer_client.backends.vllm_server import VLLMServerSettings, cpu_list, server_env

    assert cpu_list({5, 0, 1, 2}) == "0-2,5" and cpu_list([3]) == "3"
    settings = VLLMServerSettings(Path("m"), omp_threads_bind="all")
    assert server_env(settings, base={})["VLLM_CPU_OMP_THREADS_BIND"] == cpu_list(os.sched_getaffinity(0))
    # the environment's own choice wins; None leaves vLLM's auto
    assert server_env(settings, base={"VLLM_CPU_OMP_THREADS_BIND": "1"})["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in server_env(VLLMServerSettings(Path("m")), base={})
