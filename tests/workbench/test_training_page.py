"""The Training page draws reward and success curves from runs' metrics.jsonl (the trainer's RunLog) and TensorBoard event files."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from tests.support.require import require
from tests.support.server import running_server, server_config
from tests.workbench.conftest import screenshot
from trainer_client.rollout.summary import RunLog


def write_run(directory: Path, steps: int, slope: float) -> None:
    directory.mkdir(parents=True)
    log = RunLog(directory, tensorboard=False)
    for step in range(1, steps + 1):
        log.write(
            {"split": "train", "step": step, "reward": min(1.0, 0.1 + slope * step), "elapsed_min": step / 10}
        )
        if step % 5 == 0 or step == 1:
            success = min(1.0, 0.2 + slope * step)
            log.write(
                {
                    "split": "eval",
                    "step": step,
                    "success": success,
                    "success/arithmetic": success,
                    "success/level_2": success / 2,
                }
            )
    (directory / "metrics.jsonl").open("a").write('{"split": "train", "step": 9')  # a line being written


def test_runs_compared_on_one_chart(tmp_path: Path, open_page) -> None:
    write_run(tmp_path / "runs" / "grpo-a", 20, 0.03)
    write_run(tmp_path / "runs" / "nested" / "grpo-b", 10, 0.05)
    with running_server(server_config(workbench={"runs_dir": str(tmp_path / "runs")})) as srv:
        runs = httpx.get(srv.url + "/ui/api/runs").json()["runs"]
        assert {r["name"] for r in runs} == {"grpo-a", "nested/grpo-b"}
        assert all(r["unreadable_lines"] == 1 for r in runs)
        page, _ = open_page(srv.url + "/ui/#/training")
        page.wait_for_selector("svg.chart polyline")
        curve = page.get_attribute("polyline[data-series='grpo-a batch']", "points")
        assert len(curve.split()) == 20  # one point per training step
        held_out = page.get_attribute("polyline[data-series='nested/grpo-b held-out']", "points")
        assert len(held_out.split()) == 3  # steps 1, 5, 10
        assert page.query_selector("polyline[data-series='level_2']") is not None  # per kind or level
        row = page.inner_text("[data-runs-table] tr[data-run='grpo-a']").split("\t")
        assert row[1] == "20" and row[2] == "0.230" and row[3] == "0.800"
        screenshot(page, "training")
        page.uncheck("input[data-run='grpo-a']")
        page.wait_for_function("!document.querySelector(\"polyline[data-series='grpo-a batch']\")")


def write_tensorboard_runs(runs: Path) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """Two real event files: the trainer's RunLog (torch's SummaryWriter: simple_value) beside its
    metrics.jsonl, and a veRL-style tensorboard_log/<project>/<experiment> written by TensorBoard's
    own writer (scalars as tensors). What each run's tags should read back."""
    require("torch.utils.tensorboard", reason="torch's SummaryWriter (trainer extra)")
    tb_summary = require("tensorboard.summary", reason="tensorboard (trainer extra)")
    (runs / "local").mkdir(parents=True)
    log = RunLog(runs / "local", tensorboard=True)
    for step in range(1, 13):
        log.write({"split": "train", "step": step, "reward": step / 12})
    log.close()
    writer = tb_summary.Writer(str(runs / "tensorboard_log" / "proj" / "exp"))
    verl: dict[str, list[tuple[int, float]]] = {"critic/score/mean": [], "actor/entropy": []}
    for step in range(0, 30):
        for tag, value in (("critic/score/mean", 0.5 + step / 100), ("actor/entropy", 2.0 - step / 20)):
            writer.add_scalar(tag, value, step=step)
            verl[tag].append((step, value))
    writer.close()
    return {
        "local": {"train/reward": [(s, s / 12) for s in range(1, 13)]},
        "tensorboard_log/proj/exp": verl,
    }


def test_tensorboard_event_files_are_read(tmp_path: Path, open_page) -> None:
    runs = tmp_path / "runs"
    expected = write_tensorboard_runs(runs)
    with running_server(server_config(workbench={"runs_dir": str(runs)})) as srv:
        listed = {r["name"]: r for r in httpx.get(srv.url + "/ui/api/runs").json()["runs"]}
        assert set(listed) == set(expected)
        assert len(listed["local"]["records"]) == 12  # the metrics.jsonl and its event file: one run
        for name, tags in expected.items():
            assert listed[name]["tensorboard"]["tags"] == {t: len(p) for t, p in tags.items()}
            for tag, points in tags.items():
                answer = httpx.get(srv.url + "/ui/api/scalars", params={"run": name, "tag": tag}).json()
                assert [p[0] for p in answer["points"]] == [s for s, _ in points]
                assert [p[1] for p in answer["points"]] == pytest.approx([v for _, v in points], rel=1e-6)
        missing = httpx.get(srv.url + "/ui/api/scalars", params={"run": "local", "tag": "nope"})
        assert missing.status_code == 404 and "nope" in missing.json()["error"]["message"]
        page, _ = open_page(srv.url + "/ui/#/training")
        # the metrics.jsonl charts and table: only runs that have one (no empty legend entry)
        page.wait_for_selector("polyline[data-series='local (5-step mean)']")
        assert page.query_selector("polyline[data-series^='tensorboard_log/proj/exp (']") is None
        assert page.query_selector("[data-runs-table] tr[data-run='tensorboard_log/proj/exp']") is None
        # the tags whose names say reward or score are drawn first, a line per run that has them
        page.wait_for_selector("svg.chart[data-tag='critic/score/mean'] polyline")
        page.wait_for_selector("svg.chart[data-tag='train/reward'] polyline")
        line = page.get_attribute("svg.chart[data-tag='critic/score/mean'] polyline", "points")
        assert len(line.split()) == 30
        assert page.query_selector("svg.chart[data-tag='actor/entropy']") is None
        page.fill("[data-tag-filter]", "entropy")
        page.wait_for_function("document.querySelectorAll('[data-tensorboard] input[data-tag]').length === 1")
        page.check("input[data-tag='actor/entropy']")
        page.wait_for_selector(
            "svg.chart[data-tag='actor/entropy'] polyline[data-series='tensorboard_log/proj/exp']"
        )
        screenshot(page, "training-tensorboard")


def test_without_tensorboard_installed_the_page_says_so(tmp_path: Path, open_page) -> None:
    runs = tmp_path / "runs"
    write_tensorboard_runs(runs)
    shadow = tmp_path / "shadow" / "tensorboard"  # a server where `import tensorboard` fails
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text('raise ImportError("tensorboard is not installed here")\n')
    env = {"PYTHONPATH": f"{shadow.parent}:{os.environ.get('PYTHONPATH', '')}"}
    with running_server(server_config(workbench={"runs_dir": str(runs)}), env=env) as srv:
        listed = {r["name"]: r for r in httpx.get(srv.url + "/ui/api/runs").json()["runs"]}
        assert "pip install tensorboard" in listed["local"]["tensorboard"]["error"]
        assert len(listed["local"]["records"]) == 12  # the metrics.jsonl still reads
        answer = httpx.get(srv.url + "/ui/api/scalars", params={"run": "local", "tag": "train/reward"})
        assert answer.status_code == 501 and "tensorboard" in answer.json()["error"]["message"]
        page, _ = open_page(srv.url + "/ui/#/training")
        page.wait_for_selector("[data-tensorboard-error]")
        assert "pip install tensorboard" in page.inner_text("[data-tensorboard]")
        page.wait_for_selector("polyline[data-series='local batch']")  # the metrics curves as before
