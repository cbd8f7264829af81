"""How ``make test`` runs the suite: pytest-xdist groups and pytest-timeout limits scaled to the load.

A fresh-clone ``make test`` at load 6-19 failed a 120 s CLI test on its timeout (issue 41): the
limits are there to stop hangs, so on a busy machine they grow with the load
(tests/support/timeouts.py). On several workers, tests that share an expensive fixture must run
on one worker, or each worker builds its own (tests/support/xdist_groups.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support import xdist_groups
from tests.support.timeouts import FLOOR, timeout_scale
from tests.support.xdist_groups import GB_PER_WORKER, auto_workers, longest_first, unit_of

REPO = Path(__file__).resolve().parent.parent

INNER_CONFTEST = """
import pytest
from tests.support.timeouts import scale_timeout

@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item):
    scale_timeout(item)
    yield
"""

INNER_TESTS = """
import pytest

def limit(request):
    marker = request.node.get_closest_marker("timeout")
    return marker.args[0] if marker else None

@pytest.mark.timeout(120)
def test_marked(request):
    print("marked", limit(request), request.node.get_closest_marker("timeout").kwargs)

@pytest.mark.timeout(10, method="thread")
def test_method_kept(request):
    print("method", limit(request), request.node.get_closest_marker("timeout").kwargs)

def test_default(request):
    print("default", limit(request))

@pytest.mark.timeout(0)
def test_unlimited(request):
    print("unlimited", limit(request))
"""


def inner_limits(tmp_path: Path, scale: str) -> dict[str, str]:
    """Run the inner tests under TOOLFACTORY_TIMEOUT_SCALE=scale; what each saw as its limit."""
    (tmp_path / "conftest.py").write_text(INNER_CONFTEST)
    (tmp_path / "test_inner.py").write_text(INNER_TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\ntimeout = 300\n")
    env = {**os.environ, "TOOLFACTORY_TIMEOUT_SCALE": scale, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "test_inner.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return dict(re.findall(r"(marked|method|default|unlimited) ([^\n]*)", done.stdout))


def test_every_timeout_is_multiplied_by_the_scale_and_keeps_its_method(tmp_path: Path) -> None:
    seen = inner_limits(tmp_path, "3")
    assert seen["marked"] == "360.0 {}"
    assert seen["method"] == "30.0 {'method': 'thread'}"
    assert seen["default"] == "900.0"  # the ini's 300 s
    assert seen["unlimited"] == "0"  # no limit stays no limit


def test_the_scale_follows_the_load_and_never_goes_below_the_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TOOLFACTORY_TIMEOUT_SCALE", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (16.0, 6.0, 3.0))
    assert timeout_scale() == 8.0
    monkeypatch.setattr(os, "getloadavg", lambda: (0.5, 9.0, 3.0))  # a burst that just ended
    assert timeout_scale() == 4.5
    monkeypatch.setattr(os, "getloadavg", lambda: (0.1, 0.1, 0.1))
    assert timeout_scale() == FLOOR
    monkeypatch.setenv("TOOLFACTORY_TIMEOUT_SCALE", "1.5")
    assert timeout_scale() == 1.5
    monkeypatch.setenv("TOOLFACTORY_TIMEOUT_SCALE", "0")
    with pytest.raises(ValueError, match="positive"):
        timeout_scale()


def item(nodeid: str, *fixtures: str) -> SimpleNamespace:
    return SimpleNamespace(nodeid=nodeid, fixturenames=list(fixtures))


def test_tests_sharing_an_expensive_fixture_share_a_unit_of_work() -> None:
    vllm = {
        unit_of("tests/engines/test_vllm_backend.py::test_a"),
        unit_of("tests/engines/test_tau2_dual.py::test_b"),  # starts its own: never two at once
    }
    assert vllm == {"vllm-server"}
    # veRL's runs bring their own Ray cluster and replica: never two at once, but beside the server
    verl = {
        unit_of("tests/engines/test_verl_trainer_cpu.py::test_a"),
        unit_of("tests/engines/test_verl_replica.py::b"),
    }
    assert verl == {"verl-ray"}
    demo = {
        unit_of("tests/trainer/test_demo.py::test_quick_demo_end_to_end"),
        unit_of("tests/workbench/test_demo_rollout.py::test_c"),
    }
    assert demo == {"quick-demo"}
    # any other test goes with its module, whose module-scoped server then starts once
    assert unit_of("tests/server/test_schema.py::Case::test_d[a@b]") == "tests/server/test_schema.py"
    assert unit_of("tests/deploy/test_image.py::test_e@container-image") == "container-image"
    # a test that uses a shared fixture outside its group's paths is named (collection stops)
    assert xdist_groups.misplaced(
        [
            item("tests/engines/test_vllm_backend.py::test_a", "vllm_server", "tmp_path"),
            item("tests/workbench/test_demo_rollout.py::test_c", "open_page", "quick_demo"),
            item("tests/trainer/test_new.py::test_f", "vllm_server"),
        ]
    ) == ["tests/trainer/test_new.py::test_f uses vllm_server"]


INNER_SCHEDULING_CONFTEST = """
import os
from tests.support import xdist_groups

xdist_groups.LONG_UNITS = {os.environ["LONG"]: 100} if os.environ.get("LONG") else {}
xdist_groups.SHARED_PATHS = {"test_g": "g"}  # test_g1.py and test_g2.py

def pytest_xdist_make_scheduler(config, log):
    return xdist_groups.ModuleOrGroupScheduling(config, log)
"""


def inner_order(tmp_path: Path, long: str) -> list[str]:
    """The modules one xdist worker ran, in order, with ``long`` (if any) the one long unit."""
    (tmp_path / "conftest.py").write_text(INNER_SCHEDULING_CONFTEST)
    (tmp_path / "test_many.py").write_text("".join(f"def test_{i}():\n    pass\n" for i in range(5)))
    (tmp_path / "test_long.py").write_text("def test_long():\n    pass\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "LONG": long}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-n", "1", "--dist", "loadgroup"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    ran = re.findall(r"PASSED (test_\w+)\.py", done.stdout)
    return list(dict.fromkeys(ran))


def test_a_long_unit_starts_first_whatever_its_test_count(tmp_path: Path) -> None:
    assert inner_order(tmp_path, long="") == ["test_many", "test_long"]  # xdist's own: most tests first
    assert inner_order(tmp_path, long="test_long.py") == ["test_long", "test_many"]
    assert longest_first(["a.py", "vllm-server", "tests/test_gpu_check.py", "b.py"]) == [
        "vllm-server", "tests/test_gpu_check.py", "a.py", "b.py",
    ]  # fmt: skip


def test_a_groups_modules_run_on_one_worker(tmp_path: Path) -> None:
    """The two largest modules, one group by path: on two workers both run on one (as modules,
    the first two units, they would go one to each worker)."""
    (tmp_path / "conftest.py").write_text(INNER_SCHEDULING_CONFTEST)
    for name, count in (("test_g1", 5), ("test_g2", 5), ("test_x1", 1), ("test_x2", 1)):
        (tmp_path / f"{name}.py").write_text("".join(f"def test_{i}():\n    pass\n" for i in range(count)))
    env = {**os.environ, "PYTHONPATH": str(REPO), "LONG": ""}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    workers = set(re.findall(r"\[(gw\d)\] \[ *\d+%\] PASSED test_g\d\.py", done.stdout))
    assert len(workers) == 1, done.stdout


def test_auto_starts_a_worker_more_than_the_cores_where_memory_allows() -> None:
    assert auto_workers(2, available_gb=3 * GB_PER_WORKER) == 3
    assert auto_workers(2, available_gb=3 * GB_PER_WORKER - 1) == 2  # no more than xdist's own
    assert auto_workers(1, available_gb=64) == 2
