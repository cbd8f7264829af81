"""pytest-timeout limits scaled to the machine's load, so a busy machine slows tests, never fails them.

A test's ``timeout`` (its mark, else ``timeout`` in pyproject.toml) is what it needs on a quiet
2-core machine with margin; it only exists to stop a hang. On a machine shared with other work a
CPU-bound test runs about ``load / cores`` times slower (a fresh-clone run at load 6-19 failed a
120 s CLI test), so each test's limit is multiplied, when it starts, by
``max(FLOOR, load / cores)`` (the larger of the 1- and 5-minute load averages), or by
``TOOLFACTORY_TIMEOUT_SCALE`` when set (e.g. on a CI runner whose load says nothing).
"""

from __future__ import annotations

import os

import pytest

FLOOR = 2.0  # a test's own xdist neighbour shares the cores with it


def timeout_scale() -> float:
    """The factor every pytest-timeout limit is multiplied by now."""
    fixed = os.environ.get("TOOLFACTORY_TIMEOUT_SCALE")
    if fixed:
        scale = float(fixed)
        if scale <= 0:
            raise ValueError(f"TOOLFACTORY_TIMEOUT_SCALE must be a positive number, got {fixed!r}")
        return scale
    load = max(os.getloadavg()[:2])
    return max(FLOOR, load / (os.cpu_count() or 1))


def scale_timeout(item: pytest.Item) -> None:
    """Put a scaled ``timeout`` mark first on ``item`` (pytest-timeout reads the closest one)."""
    marker = item.get_closest_marker("timeout")
    base = None
    kwargs = {}
    if marker is not None:
        base = marker.args[0] if marker.args else marker.kwargs.get("timeout")
        kwargs = {k: v for k, v in marker.kwargs.items() if k != "timeout"}
        kwargs.update(zip(("method", "func_only"), marker.args[1:], strict=False))
    if base is None:  # pytest-timeout's own default: --timeout, else PYTEST_TIMEOUT, else the ini
        base = getattr(item.config, "_env_timeout", None) or item.config.getini("timeout")
    if not base or float(base) <= 0:  # no limit (0) stays no limit
        return
    item.add_marker(pytest.mark.timeout(float(base) * timeout_scale(), **kwargs), append=False)
