"""bench/engines/gpu_check.sh, the check meant for a lent GPU machine, run here on the CPU (``--tiny``)
as a real subprocess, so that it keeps working between the days a GPU is lent: a real tool
server, the HF backend, rollouts and a GRPO step, and a JSON summary whose figures are checked
(present and positive; never their speed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support.require import require
from tests.support.server import REPO

SCRIPT = REPO / "bench" / "engines" / "gpu_check.sh"


def run_check(args: list[str], out: Path, timeout_s: float, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args, "--out", str(out)],
        cwd=REPO,
        env={**os.environ, "PYTHON": sys.executable, **env},
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


@pytest.mark.timeout(2400)
def test_the_gpu_check_runs_on_the_cpu(tmp_path: Path) -> None:
    require("verl")
    from trainer_client.backends.models import resolve_model_path

    out = tmp_path / "gpu_check.json"
    args = ["--device", "cpu", "--tiny", "--threads", "1", "--prompts", "2", "--group", "8", "--steps", "1"]
    args += ["--deadline-s", "2000", "--tokenizer", str(resolve_model_path("smollm2"))]
    done = run_check(args, out, timeout_s=2200)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-6000:]
    assert "gpu_check on cpu: OK" in done.stdout
    report = json.loads(out.read_text())
    assert report["ok"] is True and report["problems"] == []
    phases = report["phases"]

    assert phases["decode"]["tokens"] > 0 and phases["decode"]["tokens_per_s"] > 0
    imprint = phases["imprint"]
    assert imprint["loss_last"] < imprint["loss_first"]

    rollout = phases["rollout"]
    assert rollout["trajectories"] == 16 and rollout["errors"] == []
    assert rollout["model_tokens"] > 0 and rollout["tokens_per_s"] > 0 and rollout["trajectories_per_min"] > 0
    assert rollout["sum_generate_s"] > 0 and rollout["sum_tool_s"] > 0 and rollout["sum_verify_s"] > 0
    assert 0 < rollout["calls_answered"] <= rollout["calls"], "tool calls answered by the server"
    assert rollout["rewarded"] == 16, "every trajectory scored by the server's verifier"
    # the server's own count of calculator calls (run or answered from its cache)
    assert sum(report["server_calls"].values()) >= rollout["calls_answered"]

    assert phases["seeded_sampling"]["same_tokens"] is True
    step = phases["grpo_step_1"]
    assert step["time/step_s"] > 0 and step["time/rollout_s"] > 0 and step["time/update_s"] > 0
    assert step["trained_rows"] > 0 and step["groups_with_signal"] > 0
    assert step["changed_fraction"] > 0 and step["relative_change"] > 0, "the GRPO step changed the weights"
    assert step["update_kept"] > 0.9, "float32 weights keep AdamW's update"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_a_gpu_fails_loudly(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.json"
    done = run_check(["--device", "cuda"], out, timeout_s=600)
    assert done.returncode == 1
    assert "torch sees no GPU" in done.stdout + done.stderr
    report = json.loads(out.read_text())
    assert report["ok"] is False and "use --device cpu --tiny" in report["problems"][0]
    assert "rollouts" not in report and "grpo" not in report, "no figure it did not measure"


def test_missing_packages_without_wheels_fail_loudly(tmp_path: Path) -> None:
    """An interpreter without the server's packages and no carried wheels: a message that says
    what to run, before anything starts."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=300)
    done = run_check(
        ["--device", "cpu"],
        tmp_path / "gpu_check.json",
        timeout_s=300,
        PYTHON=str(bare / "bin" / "python"),
        GPU_CHECK_WHEELS=str(tmp_path / "no-wheels"),
    )
    assert done.returncode == 1
    assert "run bench/engines/gpu_wheels.sh" in done.stderr


def _step_report(tmp_path: Path, dtype: str, kept: float) -> Any:
    from bench.engines.gpu_check import Report

    report = Report(tmp_path / "gpu_check.json", "cuda")
    report.data["phases"] = {
        "decode": {"tokens_per_s": 100.0},
        "grpo_step_1": {
            "trained_rows": 8,
            "groups_with_signal": 1,
            "changed_fraction": 0.19,
            "update_kept": kept,
        },
    }
    report.data["grpo"] = ["grpo_step_1"]
    report.data["model"] = {"dtype": dtype, "lr": 1e-5}
    return report


def test_a_step_that_keeps_under_half_of_the_update_is_a_failure(tmp_path: Path) -> None:
    """A CUDA bfloat16 step whose weights rounded most of AdamW's update away did not train:
    the check fails with what to do (it was only a note, and the run said OK)."""
    from bench.engines.gpu_check import check

    lost = _step_report(tmp_path, "bfloat16", 0.31)
    check(lost)
    assert len(lost.data["problems"]) == 1, lost.data
    problem = lost.data["problems"][0]
    assert problem.startswith("grpo_step_1: the bfloat16 weights kept 31 % of AdamW's update at lr 1e-05")
    assert "did not train" in problem and "float32" in problem and "--lr" in problem

    kept = _step_report(tmp_path, "float32", 0.98)
    check(kept)
    assert kept.data["problems"] == [] and kept.data["notes"] == []
