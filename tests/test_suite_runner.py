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

from tests.support.timeouts import FLOOR, timeout_scale
from tests.support.xdist_groups import group_of, module_or_group

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


def test_tests_sharing_an_expensive_fixture_share_a_worker() -> None:
    vllm = {
        group_of(item("tests/engines/test_vllm_backend.py::test_a", "vllm_server")),
        group_of(item("tests/engines/test_tau2_dual.py::test_b")),  # starts its own: never two at once
    }
    assert vllm == {"vllm-server"}
    demo = {
        group_of(item("tests/trainer/test_demo.py::test_quick_demo_end_to_end", "quick_demo")),
        group_of(item("tests/workbench/test_demo_rollout.py::test_c", "open_page", "quick_demo")),
    }
    assert demo == {"quick-demo"}
    # any other test is left unmarked (its id stays as it is) and the scheduler keeps it with its
    # module, whose module-scoped server then starts once
    assert group_of(item("tests/server/test_schema.py::test_d[1]", "server")) is None
    assert module_or_group("tests/server/test_schema.py::Case::test_d[a@b]") == "tests/server/test_schema.py"
    assert module_or_group("tests/engines/test_tau2_dual.py::test_b@vllm-server") == "vllm-server"
