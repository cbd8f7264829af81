from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.server import ServerProcess, running_server, server_config


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    """One real server (uvicorn subprocess on an ephemeral loopback port) per test module."""
    with running_server(server_config()) as proc:
        yield proc
