"""The Live page follows the server's own metrics while it is under load, without reloading."""

from __future__ import annotations

import os
import shutil
import sys
import threading
import uuid
from pathlib import Path

import httpx

from tests.support.server import running_server, server_config
from tests.workbench.conftest import screenshot


def load(url: str, stop: threading.Event) -> None:
    """Batches of echo, sleep and failing calls until ``stop``."""
    with httpx.Client(timeout=30) as client:
        while not stop.is_set():
            calls = [
                {"call_id": uuid.uuid4().hex, "name": "echo", "arguments": {"text": "x"}} for _ in range(20)
            ]
            calls += [
                {"call_id": uuid.uuid4().hex, "name": "sleep", "arguments": {"seconds": 0.02}}
                for _ in range(5)
            ]
            calls.append({"call_id": uuid.uuid4().hex, "name": "fail", "arguments": {}})
            client.post(url + "/v1/calls", json={"calls": calls}).raise_for_status()


def metric(page, key: str) -> str:
    return page.inner_text(f"[data-metric={key}] .value")


def test_live_page_updates_under_load(open_page) -> None:
    with running_server(server_config()) as srv:
        page, _ = open_page(srv.url + "/ui/#/live")
        page.wait_for_selector("[data-metric=calls_total]")
        assert metric(page, "calls_total") == "0"
        page.evaluate("window.loadedOnce = true")  # gone if the page reloads
        stop = threading.Event()
        worker = threading.Thread(target=load, args=(srv.url, stop), daemon=True)
        worker.start()
        try:
            page.wait_for_function(
                "Number(document.querySelector('[data-tool-row=echo] [data-calls]')?.dataset.calls) >= 100"
            )
            page.wait_for_function(
                "parseFloat(document.querySelector('[data-metric=calls_per_s] .value').textContent.replace(/,/g, '')) > 0"
            )
            first = int(page.get_attribute("[data-tool-row=echo] [data-calls]", "data-calls"))
            page.wait_for_function(
                f"Number(document.querySelector('[data-tool-row=echo] [data-calls]').dataset.calls) > {first}"
            )
            if os.environ.get("TOOLFACTORY_SCREENSHOTS") == "1":  # the docs' picture: a few seconds of curve
                page.wait_for_function(
                    "document.querySelector('main svg polyline')?.getAttribute('points').split(' ').length >= 6"
                )
            screenshot(page, "live")
        finally:
            stop.set()
            worker.join(30)
        assert page.evaluate("window.loadedOnce") is True
        assert page.query_selector("[data-error-kind=tool_error]") is not None  # the failing tool
        sleep_row = page.inner_text("[data-tool-row=sleep]").split("\t")
        assert float(sleep_row[4]) >= 15  # p50 of sleep(0.02) in ms, from the histogram
        total = httpx.get(srv.url + "/metrics").text
        assert "toolfactory_calls_total" in total
        page.close()  # before the server stops: the page polls it


def test_each_upstreams_health_and_why_it_is_down(open_page) -> None:
    time_server = shutil.which("mcp-server-time") or str(Path(sys.executable).parent / "mcp-server-time")
    upstreams = {"gone": {"url": "http://127.0.0.1:9/mcp"}}  # nothing listens on port 9
    if Path(time_server).exists():
        upstreams["clock"] = {"command": time_server}
    with running_server(server_config(mcpServers=upstreams)) as srv:
        page, _ = open_page(srv.url + "/ui/#/live")
        page.wait_for_selector("tr[data-upstream=gone]")
        assert page.get_attribute("tr[data-upstream=gone]", "data-healthy") == "0"
        gone = page.inner_text("tr[data-upstream=gone]")
        last_error = httpx.get(srv.url + "/readyz").json()["checks"]["upstream:gone"]["last_error"]
        assert last_error and last_error in gone  # why it is down, as the server says it
        if "clock" in upstreams:
            page.wait_for_selector("tr[data-upstream=clock][data-healthy='1']")
            assert "2 tools" in page.inner_text("tr[data-upstream=clock]")
        page.close()
