from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.server import ServerProcess, running_server, server_config


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    """One real server (uvicorn subprocess on an ephemeral loopback port) per test module."""
    config = server_config(limits={"max_output_chars": 1000})
    with running_server(config) as proc:
        yield proc
