"""Every page on a bare server (no runs directory, no environments): a clear message, no console error."""

from __future__ import annotations

from tests.support.server import running_server, server_config

PAGES = {
    "tools": "7 of 7 tools",
    "environments": "serves no environment packs",
    "trajectories": "no runs directory: upload a file",
    "live": "calls (all time)",
    "training": "no runs directory",
}


def test_every_page_says_what_it_has(open_page) -> None:
    with running_server(server_config()) as srv:
        page, _ = open_page(srv.url + "/ui/")
        for number, (name, text) in enumerate(PAGES.items(), 1):
            page.keyboard.press(f"Alt+{number}")
            page.wait_for_function(f"location.hash === '#/{name}'")
            page.wait_for_selector(f"main :text('{text}')", state="attached")
            assert page.get_attribute(f"nav a[data-page={name}]", "aria-current") == ""
        assert page.evaluate("document.title") == "training · toolfactory workbench"
        missing = page.request.get(srv.url + "/ui/nothing.js")
        assert missing.status == 404


def test_a_page_still_loading_never_draws_over_the_next(open_page) -> None:
    with running_server(server_config()) as srv:
        page, _ = open_page(srv.url + "/ui/#/live")
        page.wait_for_selector("[data-metric=calls_total]")
        released = []

        def held(route) -> None:  # the real answer, once the test lets it through
            released.append(route)

        page.route("**/v1/tools*", held)
        page.evaluate("location.hash = '#/tools'")  # Tools mounts: waits for its tool list
        page.wait_for_function("document.title.startsWith('tools')")
        while not released:
            page.wait_for_timeout(50)
        page.evaluate("location.hash = '#/live'")  # the user moves on before the list came
        page.wait_for_selector("[data-metric=calls_total]")
        with page.expect_response("**/v1/tools*"):
            released[0].continue_()
        page.unroute("**/v1/tools*")
        # the Tools page's mount now ends: it must not replace the Live page
        page.wait_for_timeout(500)  # the Tools page's drawing, after its answer
        assert page.query_selector("main [data-metric=calls_total]") is not None
        assert page.query_selector("main [data-filter][aria-label='filter tools']") is None
        assert [h.inner_text() for h in page.query_selector_all("main h2")] == ["Live"]
