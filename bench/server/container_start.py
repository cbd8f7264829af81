"""The tool server's image: its size, and how long a container takes from start to ready.

Builds the image as ``make image`` does (compose/image.sh: docker or podman; layers reused),
then ``--runs`` times starts one container the way compose/docker-compose.yml runs each
replica (its user, capabilities, security options, init, environment and config mount;
published on a loopback port) and times ``run -d`` until ``/readyz`` answers 200, then the
``stop`` of the idle container; and once, a plain unprivileged ``run`` until it exits with
its refusal (python on 0.0.0.0 with the weak sandbox). Prints a markdown table.

    python bench/server/container_start.py [--runs 3] [--no-build] [--record]

``--record`` writes bench/results/container_start.json (bench/README.md's current figures:
bench/figures.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

REPO = Path(__file__).resolve().parents[2]
IMAGE_SH = REPO / "compose" / "image.sh"
COMPOSE = REPO / "compose" / "docker-compose.yml"
TOKEN = "container-start-bench-0123456789abcdef"


def output(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


def interpolate(value: object) -> str:
    """``${VAR:-default}`` as compose reads it (the only form the file's environment uses)."""
    return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: os.environ.get(m[1]) or m[2], str(value or ""))


def compose_run_args(claims: str) -> list[str]:
    """`run` options for one replica as compose/docker-compose.yml declares it."""
    service = yaml.safe_load(COMPOSE.read_text())["services"]["tool-server"]
    args = ["--user", str(service["user"]), *(f"--cap-drop={c}" for c in service["cap_drop"])]
    args += [f"--cap-add={c}" for c in service["cap_add"]]
    args += [f"--security-opt={o}" for o in service["security_opt"]]
    args += ["--init"] if service.get("init") else []
    env = {**service["environment"], "TOOLFACTORY_TOKENS": TOKEN}
    args += [f"--env={k}={interpolate(v)}" for k, v in env.items()]
    args += ["-v", f"{COMPOSE.parent / 'config.yaml'}:/config/config.yaml:ro"]
    args += ["-v", f"{claims}:{env['TOOLFACTORY__SANDBOX__CLAIMS_DIR']}"]
    return [*args, "-p", "127.0.0.1::8000"]


def start_to_ready(engine: str, image: str) -> tuple[float, float]:
    """Seconds from `run -d` to /readyz 200, and for the idle container's `stop`."""
    with tempfile.TemporaryDirectory() as claims:
        began = time.perf_counter()
        name = output(engine, "run", "-d", *compose_run_args(claims), image)
        try:
            url = "http://" + output(engine, "port", name, "8000").split()[0]
            while True:
                try:
                    if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if output(engine, "inspect", "--format", "{{.State.Running}}", name) != "true":
                    sys.exit(f"{name} stopped while starting:\n{output(engine, 'logs', name)}")
                time.sleep(0.1)
            ready = time.perf_counter() - began
            began = time.perf_counter()
            output(engine, "stop", "-t", "30", name)
            return ready, time.perf_counter() - began
        finally:
            subprocess.run([engine, "rm", "-f", "-v", name], capture_output=True)


def refusal(engine: str, image: str) -> tuple[float, int]:
    began = time.perf_counter()
    ran = subprocess.run(
        [engine, "run", "--rm", "-e", f"TOOLFACTORY_TOKENS={TOKEN}", image], capture_output=True
    )
    return time.perf_counter() - began, ran.returncode


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-build", action="store_true", help="use the image as it is")
    parser.add_argument("--record", action="store_true", help="write bench/results/container_start.json")
    options = parser.parse_args()
    engine = output(str(IMAGE_SH), "engine")
    image = "toolfactory/tool-server:latest"
    if not options.no_build:
        began = time.perf_counter()
        image = output(str(IMAGE_SH), "build").splitlines()[-1]
        print(f"build (layers reused where they can be): {time.perf_counter() - began:.1f} s")
    size = int(output(engine, "image", "inspect", "--format", "{{.Size}}", image))
    load_start = os.getloadavg()[0]
    print(f"load average at start: {load_start:.1f}")
    runs = [start_to_ready(engine, image) for _ in range(options.runs)]
    refused_s, code = refusal(engine, image)
    ready = sorted(r for r, _ in runs)
    stops = sorted(s for _, s in runs)
    print(f"\n| {engine} | figure |\n|---|---|")
    print(f"| image size | {size / 1e6:.0f} MB |")
    print(
        f"| start to ready, compose's grants ({options.runs} runs) | median {statistics.median(ready):.1f} s ({ready[0]:.1f}–{ready[-1]:.1f}) |"
    )
    print(f"| stop, idle | median {statistics.median(stops):.1f} s ({stops[0]:.1f}–{stops[-1]:.1f}) |")
    print(f"| unprivileged run until it refuses (exit {code}) | {refused_s:.1f} s |")
    load_end = os.getloadavg()[0]
    print(f"load average at end: {load_end:.1f}")
    if options.record:
        record = {
            "order": 9,
            "script": "server/container_start.py",
            "command": f"server/container_start.py --runs {options.runs}",
            "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
            "load_average": f"{min(load_start, load_end):.0f}–{max(load_start, load_end):.0f}",
            "figures": [
                {
                    "what": f"the tool server's image ({engine})",
                    "figure": f"{size / 1e6:.0f} MB; start to ready {statistics.median(ready):.1f} s median "
                    f"({ready[0]:.1f}–{ready[-1]:.1f})",
                    "ratio": None,
                    "conditions": "one container with compose's grants on a loopback port, /readyz 200; "
                    "the image's layers built already",
                    "section": "The container image",
                }
            ],
        }
        path = REPO / "bench" / "results" / "container_start.json"
        path.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
