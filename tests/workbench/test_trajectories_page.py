"""The Trajectories page on a real rollout file: paging and filters on the server, the loss mask in colour."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from tests.support.server import ServerProcess, running_server, server_config
from tests.workbench.conftest import screenshot
from tests.workbench.rollouts import image_record, scripted_rollout


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    runs = tmp_path_factory.mktemp("runs")
    rollout = scripted_rollout(tmp_path_factory.mktemp("rollout"))
    (runs / "scripted.jsonl").write_bytes(rollout.read_bytes())
    # the same trajectories 120 times over: 720 lines, more than a page
    (runs / "big").mkdir()
    (runs / "big" / "many.jsonl").write_bytes(rollout.read_bytes() * 120)
    # as written before the rollout recorded each call and the verifier's details
    old = [{k: v for k, v in r.items() if k not in ("calls", "reward_details")} for r in records(rollout)]
    (runs / "old.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in old))
    (runs / "images.jsonl").write_bytes(orjson.dumps(image_record()) + b"\n")
    return runs


def records(path: Path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def server(runs_dir: Path) -> Iterator[ServerProcess]:
    from trainer_client.backends.models import resolve_model_path

    workbench = {"runs_dir": str(runs_dir), "tokenizer": str(resolve_model_path("smollm2"))}
    with running_server(server_config(workbench=workbench)) as proc:
        yield proc


def test_every_token_is_coloured_by_its_response_mask(server, runs_dir, open_page) -> None:
    written = records(runs_dir / "scripted.jsonl")
    line = next(n for n, r in enumerate(written) if r["metrics"]["calls"] and not r["metrics"]["tool_errors"])
    page, _ = open_page(f"{server.url}/ui/#/trajectories/scripted.jsonl/{line}")
    page.wait_for_selector("[data-tokens=per-token] .tok")
    mask = page.eval_on_selector_all(
        "[data-tokens=per-token] .tok", "els => els.map(e => Number(e.dataset.mask))"
    )
    classes = page.eval_on_selector_all(
        "[data-tokens=per-token] .tok", "els => els.map(e => e.classList.contains('model') ? 1 : 0)"
    )
    record = written[line]
    assert mask == record["response_mask"] and classes == record["response_mask"]
    assert 0 in mask and 1 in mask  # a tool call: both kinds
    colours = page.eval_on_selector_all(
        "[data-tokens=per-token] .tok", "els => els.map(e => getComputedStyle(e).backgroundColor)"
    )
    model_colours = {c for c, m in zip(colours, mask, strict=True) if m}
    obs_colours = {c for c, m in zip(colours, mask, strict=True) if not m}
    assert len(model_colours) == 1 and len(obs_colours) == 1 and model_colours != obs_colours
    texts = page.eval_on_selector_all("[data-tokens=per-token] .tok", "els => els.map(e => e.textContent)")
    assert "".join(texts) == "".join(s["text"] for s in record["segments"])
    title = page.get_attribute("[data-tokens=per-token] .tok[data-i='0']", "title")
    assert f"id {record['response_ids'][0]}" in title and "logprob" in title  # the boundary on hover
    # the tool call and its result, the reward and its components
    roles = page.eval_on_selector_all("[data-line] > .turn", "els => els.map(e => e.dataset.role)")
    assert roles == [m["role"] for m in record["messages"][record["num_prompt_messages"] :]]
    assert "math_equal" in page.inner_text("[data-components]")
    page.eval_on_selector("[data-trajectory]", "e => e.scrollIntoView()")
    screenshot(page, "trajectories")


def shown_calls(page) -> list[dict]:
    return page.eval_on_selector_all(
        "[data-trajectory] .turn [data-call]",
        """els => els.map(e => ({turn: Number(e.dataset.call), elapsed_ms: Number(e.dataset.elapsed),
            cached: e.dataset.cached === '1', error: e.dataset.error || null,
            role: e.closest('.turn').dataset.role, text: e.textContent}))""",
    )


def test_each_call_has_its_latency_cache_hit_and_error_beside_its_result(server, runs_dir, open_page) -> None:
    written = records(runs_dir / "scripted.jsonl")
    # the real rollout has all three: a fresh call, the same call answered from the cache, a failed one
    cases = {
        "fresh": next(
            n
            for n, r in enumerate(written)
            if r["calls"] and not r["calls"][0]["cached"] and not r["calls"][0]["error"]
        ),
        "cached": next(n for n, r in enumerate(written) if r["calls"] and r["calls"][0]["cached"]),
        "failed": next(n for n, r in enumerate(written) if r["calls"] and r["calls"][0]["error"]),
    }
    page, _ = open_page(f"{server.url}/ui/#/trajectories/scripted.jsonl/{cases['fresh']}")
    for case, line in cases.items():
        page.goto(f"{server.url}/ui/#/trajectories/scripted.jsonl/{line}")
        page.wait_for_selector(f"[data-trajectory] [data-line='{line}'] [data-call]")
        record = written[line]
        shown = shown_calls(page)
        assert [(c["turn"], c["cached"], c["error"]) for c in shown] == [
            (c["turn"], c["cached"], c["error"]) for c in record["calls"]
        ], case
        assert [c["elapsed_ms"] for c in shown] == pytest.approx([c["elapsed_ms"] for c in record["calls"]])
        assert all(c["role"] == "tool" for c in shown)
        # the call sits on the turn of its result (the message it indexes)
        turns = page.eval_on_selector_all(
            "[data-line] > .turn", "els => els.map(e => !!e.querySelector('[data-call]'))"
        )
        start = record["num_prompt_messages"]
        assert [n + start for n, has in enumerate(turns) if has] == [c["message"] for c in record["calls"]]
        assert ("cache hit" in shown[0]["text"]) == (case == "cached")
        assert (f"error: {record['calls'][0]['error']}" in shown[0]["text"]) == (case == "failed")
        failed = page.eval_on_selector_all("[data-line] > .turn.failed", "els => els.length")
        assert failed == (1 if case == "failed" else 0)
        # the verifier's details beside the reward components
        details = page.eval_on_selector_all(
            "[data-details] tr[data-detail]", "els => els.map(e => e.dataset.detail)"
        )
        assert details == list(record["reward_details"]) and details
        assert (
            page.inner_text("[data-details] tr[data-detail='answer'] td:last-child")
            == record["reward_details"]["answer"]
        )
        assert "golds" in page.inner_text("[data-details]") and record["reward_details"]["golds"][
            0
        ] in page.inner_text("[data-details]")


def test_a_file_from_before_calls_and_details_were_recorded_still_opens(server, runs_dir, open_page) -> None:
    written = records(runs_dir / "old.jsonl")
    line = next(n for n, r in enumerate(written) if r["metrics"]["tool_errors"])
    page, _ = open_page(f"{server.url}/ui/#/trajectories/old.jsonl/{line}")
    page.wait_for_selector("[data-trajectory] [data-tokens] .tok")
    assert shown_calls(page) == []
    assert page.query_selector("[data-line] > .turn.failed") is not None  # told from the result's text
    assert "no verifier details in this record" in page.inner_text("[data-trajectory]")
    assert "math_equal" in page.inner_text("[data-components]")


def test_images_are_shown_inline(server, runs_dir, open_page) -> None:
    record = records(runs_dir / "images.jsonl")[0]
    page, _ = open_page(f"{server.url}/ui/#/trajectories/images.jsonl/0")
    page.wait_for_selector("[data-trajectory] figure.image img[data-size]")
    page.wait_for_function(
        "document.querySelectorAll('[data-trajectory] figure.image img[data-size]').length === 2"
    )
    images = page.eval_on_selector_all(
        "[data-trajectory] .turn figure.image",
        """els => els.map(f => { const img = f.querySelector('img'); const box = img.getBoundingClientRect();
            return {size: img.dataset.size, src: img.src, caption: f.querySelector('figcaption').textContent,
                    width: box.width, height: box.height}; })""",
    )
    blocks = [b for b in record["messages"][2]["content"] if b["type"] == "image"]
    assert [i["src"] for i in images] == [f"data:{b['mimeType']};base64,{b['data']}" for b in blocks]
    assert [i["size"] for i in images] == ["640x480", "32x16"]  # decoded by the browser
    assert images[0]["caption"].startswith("image 1: image/png 640x480, ") and images[0]["caption"].endswith(
        " KB"
    )
    assert images[1]["caption"] == "image 2: image/jpeg 32x16, 1 KB"
    assert images[0]["height"] <= 480 and images[0]["width"] <= 640  # sized to the page, never beyond
    assert images[1]["width"] == 32  # a small one is not blown up
    # the text block beside them, the calls' figures, the cut call in the calls table
    assert "Zoom on (0, 0)-(64, 48), 10x." in page.inner_text("[data-role=tool]")
    assert [(c["cached"], c["error"]) for c in shown_calls(page)] == [
        (True, None),
        (False, "invalid_arguments"),
    ]
    page.click("[data-calls-table] summary")
    assert "not shown: the response budget ended first" in page.inner_text("[data-calls-table]")


def test_filters_and_paging_happen_on_the_server(server, runs_dir, open_page) -> None:
    written = records(runs_dir / "big" / "many.jsonl")
    page, _ = open_page(f"{server.url}/ui/#/trajectories/big%2Fmany.jsonl")
    page.wait_for_selector("tr[data-line]")
    assert page.inner_text("[data-count]") == "720 of 720 trajectories"
    assert len(page.query_selector_all("tr[data-line]")) == 50
    page.click("button:has-text('next')")
    page.wait_for_selector("tr[data-line='50']")
    page.select_option("select[aria-label='tool errors']", "yes")
    with_errors = sum(1 for r in written if r["metrics"]["tool_errors"])
    page.wait_for_selector(f"[data-count]:has-text('{with_errors} of 720')")
    page.select_option("select[aria-label='tool errors']", "")
    page.fill("input[aria-label='min reward']", "1")
    page.press("input[aria-label='min reward']", "Tab")  # leaving the field: its change event
    solved = sum(1 for r in written if (r["reward"] or 0) >= 1)
    page.wait_for_selector(f"[data-count]:has-text('{solved} of 720')")
    # keyboard: into the table, down a row, Enter opens it
    page.focus("tr[data-line]")
    page.keyboard.press("ArrowDown")
    page.keyboard.press("Enter")
    page.wait_for_selector("[data-trajectory] [data-line]")
    # a GRPO group: the other sample of the same prompt, side by side
    page.select_option("[data-compare]", index=1)
    page.wait_for_function("document.querySelectorAll('[data-trajectory] .tokens').length === 2")
    # the server never sends more than a page
    big = httpx.get(server.url + "/ui/api/trajectories", params={"file": "big/many.jsonl", "limit": 100000})
    assert len(big.json()["rows"]) == 500


def test_the_index_follows_a_growing_file(server, runs_dir) -> None:
    path = runs_dir / "growing.jsonl"
    first = (runs_dir / "scripted.jsonl").read_bytes()
    path.write_bytes(first)
    url = server.url + "/ui/api/trajectories"
    written = records(runs_dir / "scripted.jsonl")
    stop = written[0]["stop_reason"]
    stopped = sum(1 for r in written if r["stop_reason"] == stop)
    before = httpx.get(url, params={"file": "growing.jsonl", "stop_reason": stop}).json()
    assert (before["total"], before["matching"]) == (6, stopped)
    with open(path, "ab") as handle:
        handle.write(first + b'{"id": "half-writ')  # a line still being written is not indexed yet
    # the same filters again: their cached matches are extended by the appended lines
    after = httpx.get(url, params={"file": "growing.jsonl", "stop_reason": stop}).json()
    assert (after["total"], after["matching"]) == (12, 2 * stopped)
    assert [row["line"] for row in after["rows"]][stopped:] == [
        6 + n for n, r in enumerate(written) if r["stop_reason"] == stop
    ]
    assert after["facets"]["stop_reason"][stop] == 2 * stopped
    one = httpx.get(server.url + "/ui/api/trajectory", params={"file": "growing.jsonl", "line": 11}).json()
    assert one["record"]["id"] == written[5]["id"]
    # its GRPO group takes in the appended copy of the same prompt
    same_prompt = [
        n
        for n, r in enumerate(written * 2)
        if n != 11 and (r["data_source"], r["index"]) == (written[5]["data_source"], written[5]["index"])
    ]
    assert one["siblings"] == same_prompt


def test_a_file_rewritten_in_place_is_indexed_anew(server, runs_dir) -> None:
    """A rerun writing the same path again, longer: the old lines' summaries must not survive."""
    path = runs_dir / "rerun.jsonl"
    written = records(runs_dir / "scripted.jsonl")
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in written[:3]))
    url = server.url + "/ui/api/trajectories"
    assert [r["id"] for r in httpx.get(url, params={"file": "rerun.jsonl"}).json()["rows"]] == [
        r["id"] for r in written[:3]
    ]
    rerun = [{**r, "id": f"rerun-{n}", "data_source": "rerun"} for n, r in enumerate(written)]
    with open(path, "r+b") as handle:  # in place: the same inode, now longer
        handle.write(b"".join(orjson.dumps(r) + b"\n" for r in rerun))
    page = httpx.get(url, params={"file": "rerun.jsonl"}).json()
    assert [r["id"] for r in page["rows"]] == [r["id"] for r in rerun]
    assert page["facets"]["data_source"] == {"rerun": len(rerun)}
    one = httpx.get(server.url + "/ui/api/trajectory", params={"file": "rerun.jsonl", "line": 4}).json()
    assert one["record"]["id"] == "rerun-4"


def test_paths_outside_the_runs_directory_are_refused(server, runs_dir) -> None:
    url = server.url + "/ui/api/trajectories"
    (runs_dir.parent / "secret.jsonl").write_text('{"id": "x"}\n')
    for name in ("../secret.jsonl", str(runs_dir.parent / "secret.jsonl"), "/etc/passwd"):
        answer = httpx.get(url, params={"file": name})
        assert answer.status_code == 403, (name, answer.text)
    assert httpx.get(url, params={"file": "missing.jsonl"}).status_code == 404
    assert httpx.get(url, params={"file": "scripted.jsonl", "min_reward": "high"}).status_code == 400
    listed = httpx.get(server.url + "/ui/api/files").json()
    assert {"scripted.jsonl", "big/many.jsonl"} <= {f["name"] for f in listed["files"]}


def test_an_uploaded_file_without_a_tokenizer(runs_dir, open_page) -> None:
    written = records(runs_dir / "scripted.jsonl")
    with running_server(server_config()) as srv:  # no runs directory, no tokenizer
        page, _ = open_page(srv.url + "/ui/#/trajectories")
        page.wait_for_selector("[data-file-select]")
        page.set_input_files("input[type=file]", str(runs_dir / "scripted.jsonl"))
        page.wait_for_selector("tr[data-line]")
        line = next(n for n, r in enumerate(written) if r["metrics"]["calls"])
        page.click(f"tr[data-line='{line}']")
        page.wait_for_selector("[data-tokens=per-segment] .tok")
        spans = page.eval_on_selector_all(
            "[data-tokens=per-segment] .tok",
            "els => els.map(e => [Number(e.dataset.start), Number(e.dataset.end), Number(e.dataset.mask)])",
        )
        mask = written[line]["response_mask"]
        rebuilt = [m for start, end, m in spans for _ in range(start, end)]
        assert rebuilt == mask
        assert [bool(m) for _, _, m in spans] == [s["model"] for s in written[line]["segments"]]
