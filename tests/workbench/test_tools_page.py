"""The workbench's Tools page in a real browser against a real server: list, form, call, snippets."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from tests.support.server import ServerProcess, running_server, server_config
from tests.workbench.conftest import screenshot

TOKEN = "workbench-test-token-0123456789"
PLAN_TRIP = {"target": "tests.workbench.form_tools:plan_trip", "toolsets": ["test"]}
NOTEBOOK = {"target": "tests.support.stateful_tools:notebook", "toolsets": ["test"]}


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with running_server(server_config(tools=[*server_config()["tools"], PLAN_TRIP, NOTEBOOK])) as proc:
        yield proc


def call_through_form(page, expression: str) -> None:
    page.fill("[data-field=expression]", expression)
    page.click("button:has-text('Call')")


def test_lists_every_tool_offline_and_calls_the_calculator_through_the_form(server, open_page) -> None:
    requests: list[str] = []
    page, _ = open_page(server.url + "/ui")
    page.on("request", lambda r: requests.append(r.url))
    page.reload()
    every = httpx.get(server.url + "/v1/tools", params={"toolset": "*"}).json()["tools"]
    page.wait_for_selector("ul.list button.item")
    listed = page.eval_on_selector_all("ul.list button.item", "els => els.map(e => e.dataset.tool)")
    assert sorted(listed) == sorted(t["name"] for t in every)
    assert page.inner_text(".count") == f"{len(every)} of {len(every)} tools"

    page.click("button[data-tool=calculator]")
    page.wait_for_selector("[data-field=expression]")
    assert "/ui/#/tools/calculator" in page.url
    call_through_form(page, "6*7")
    page.wait_for_selector("[data-result] .badge.good")
    assert page.inner_text("[data-result] [data-content=text]") == "42"
    assert json.loads(page.inner_text("[data-structured]"))["result"] == 42
    assert "ms" in page.inner_text("[data-elapsed]")
    assert page.query_selector("[data-result] [data-cached]") is None
    screenshot(page, "tools")
    call_through_form(page, "6*7")  # calculator is cacheable: the second call is a cache hit
    page.wait_for_selector("[data-result] [data-cached]")

    call_through_form(page, "1/0")
    page.wait_for_selector("[data-result] [data-error-kind]")
    assert page.get_attribute("[data-result] [data-error-kind]", "data-error-kind") in (
        "tool_error",
        "invalid_arguments",
    )
    # offline: everything the page loaded came from this server (no CDN, no fonts)
    assert requests and all(url.startswith(server.url) or url.startswith("data:") for url in requests), (
        requests
    )


def test_snippets_make_the_same_call(server, open_page) -> None:
    page, _ = open_page(server.url + "/ui/#/tools/calculator")
    page.fill("[data-field=expression]", "2**10")
    page.click("button:has-text('Call')")
    page.wait_for_selector("[data-result] .badge.good")
    curl = page.inner_text("[data-snippet='curl /v1/calls'] pre")
    python = page.inner_text("[data-snippet='MCP SDK (python)'] pre")
    block = json.loads(page.inner_text("[data-snippet='mcpServers block'] pre"))
    out = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=30)
    assert json.loads(out.stdout)["results"][0]["structured"]["result"] == 1024, out
    ran = subprocess.run([sys.executable, "-c", python], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert "1024" in ran.stdout
    entry = block["mcpServers"]["toolfactory-default"]
    assert entry["url"] == server.url + "/mcp" and "headers" not in entry


def test_form_from_a_nested_schema(server, open_page) -> None:
    page, _ = open_page(server.url + "/ui/#/tools/plan_trip")
    page.wait_for_selector("[data-field='traveller.name']")
    assert page.input_value("[data-field=budget]") == "1000"  # defaults filled in
    page.fill("[data-field='traveller.name']", "Ada")
    page.select_option("[data-field='traveller.seat']", label='"window"')
    page.click("button:has-text('add legs item')")
    page.click("button:has-text('add legs item')")
    page.fill("[data-field='legs[0].city']", "Lyon")
    page.fill("[data-field='legs[1].city']", "Turin")
    page.fill("[data-field='legs[1].nights']", "3")
    page.select_option("[data-field=mode]", label='"boat"')
    page.click("button:has-text('add tags item')")
    page.fill("[data-field='tags[0]']", "summer")
    page.click("button:has-text('Call')")
    page.wait_for_selector("[data-result] .badge.good")
    assert json.loads(page.inner_text("[data-structured]")) == {
        "traveller": {"name": "Ada", "seat": "window"},
        "legs": [{"city": "Lyon", "nights": 1}, {"city": "Turin", "nights": 3}],
        "budget": 1000.0,
        "mode": "boat",
        "tags": ["summer"],
    }
    # the same arguments, edited as JSON
    page.check("#raw-toggle")
    raw = json.loads(page.input_value("[data-raw]"))
    assert raw["legs"][1] == {"city": "Turin", "nights": 3}
    raw["mode"] = "plane"
    page.fill("[data-raw]", json.dumps(raw))
    page.click("button:has-text('Call')")
    page.wait_for_function("document.querySelector('[data-structured]')?.textContent.includes('plane')")


def test_keyboard_only(server, open_page) -> None:
    page, _ = open_page(server.url + "/ui/")
    page.wait_for_selector("ul.list button.item")
    page.keyboard.press("/")  # focuses the filter
    page.keyboard.type("calc")
    page.keyboard.press("ArrowDown")
    page.keyboard.press("Enter")
    page.wait_for_selector("[data-field=expression]")
    page.focus("[data-field=expression]")
    page.keyboard.type("3+4")
    page.keyboard.press("Control+Enter")
    page.wait_for_selector("[data-result] .badge.good")
    assert page.inner_text("[data-result] [data-content=text]") == "7"
    page.keyboard.press("Alt+4")  # the Live page
    page.wait_for_function("location.hash === '#/live'")


def test_a_thousand_tools_are_paged_and_filtered(open_page) -> None:
    many = [
        {"target": "tools.testing:echo", "name": f"echo_{i:04d}", "toolsets": ["many"]} for i in range(1000)
    ]
    with running_server(server_config(tools=[*server_config()["tools"], *many])) as srv:
        page, _ = open_page(srv.url + "/ui/")
        page.wait_for_selector("ul.list button.item")
        assert page.inner_text(".count") == "1007 of 1007 tools"
        assert len(page.query_selector_all("ul.list button.item")) == 100
        page.click("button:has-text('next')")
        page.wait_for_selector("text=page 2 of 11")
        page.fill("[data-filter]", "echo_0999")
        page.wait_for_selector(".count:has-text('1 of 1007 tools')")
        page.click("button[data-tool=echo_0999]")
        page.fill("[data-field=text]", "hello")
        page.click("button:has-text('Call')")
        page.wait_for_selector("[data-result] .badge.good")
        assert json.loads(page.inner_text("[data-structured]"))["text"] == "hello"


def test_with_tokens_the_page_asks_for_one_and_the_data_needs_it(open_page) -> None:
    scoped = "workbench-math-only-0123456789"
    tokens = f"{TOKEN},{scoped}:math"
    with running_server(server_config(), env={"TOOLFACTORY_TOKENS": tokens}) as srv:
        assert httpx.get(srv.url + "/ui/app.js").status_code == 200  # the page itself is public
        assert httpx.get(srv.url + "/ui/api/files").status_code == 401  # its data is not
        assert httpx.get(srv.url + "/ui/api/live").status_code == 401
        as_scoped = {"Authorization": f"Bearer {scoped}"}
        for path in ("/ui/api/files", "/ui/api/runs", "/ui/api/environments"):  # server files, gold
            assert httpx.get(srv.url + path, headers=as_scoped).status_code == 403, path
        listed = httpx.get(srv.url + "/v1/tools", params={"toolset": "*"}, headers=as_scoped).json()
        assert [t["name"] for t in listed["tools"]] == ["calculator"]
        page, console = open_page(srv.url + "/ui/")
        page.wait_for_selector("#token-dialog[open]")
        console.allowed.append("401")  # the wrong token's answer
        page.fill("#token-input", "not-the-token-but-long-enough")
        page.click("#token-ok")
        page.wait_for_selector("#token-dialog[open]")
        assert "invalid bearer token" in page.inner_text("#token-error")
        page.fill("#token-input", TOKEN)
        page.click("#token-ok")
        page.wait_for_selector("button[data-tool=calculator]")
        assert page.evaluate("sessionStorage.getItem('toolfactory.token')") == TOKEN
        page.click("button[data-tool=calculator]")
        assert '-H "Authorization: Bearer $TOOLFACTORY_TOKEN"' in page.inner_text(
            "[data-snippet='curl /v1/calls'] pre"
        )


def test_a_stateful_tool_in_a_session_opened_chosen_and_released_on_the_page(server, open_page) -> None:
    page, _ = open_page(server.url + "/ui/#/tools/notebook")
    page.wait_for_selector("[data-field=put]")

    def put(line: str) -> dict:
        page.fill("[data-field=put]", line)
        page.click("button:has-text('Call')")
        page.wait_for_function(
            f"document.querySelector('[data-structured]')?.textContent.includes({json.dumps(line)})"
        )
        return json.loads(page.inner_text("[data-structured]"))

    page.click("button:has-text('new session')")
    page.wait_for_function("document.querySelector('select[aria-label=session]').value !== ''")
    session = page.eval_on_selector("select[aria-label=session]", "e => e.value")
    assert put("first") == {"session": session, "lines": ["first"]}
    assert put("second") == {"session": session, "lines": ["first", "second"]}  # the same world
    page.select_option("select[aria-label=session]", "")  # a throwaway session: a fresh notebook
    throwaway = put("alone")
    assert throwaway["lines"] == ["alone"] and throwaway["session"] != session
    page.select_option("select[aria-label=session]", session)
    page.click("button:has-text('release')")
    page.wait_for_function(
        f"![...document.querySelectorAll('select[aria-label=session] option')].some(o => o.value === {json.dumps(session)})"
    )
    late = httpx.post(
        server.url + "/v1/calls",
        json={"calls": [{"call_id": "late-1", "name": "notebook", "arguments": {}, "session": session}]},
    ).json()
    assert late["results"][0]["error"]["kind"] == "unknown_session"  # released on the server too
