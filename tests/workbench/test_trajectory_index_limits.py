"""The trajectory index under files an attacker (or a broken run) could leave in the runs directory:
its memory is capped per file and in total (the page says where it stopped), it is built off the
event loop (other requests, another file's page included, are answered while it builds), and a
malformed record gets an error mark of its own, never a 500 for the file or a broken page."""

from __future__ import annotations

import concurrent.futures
import gc
import os
import time
import tracemalloc
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from protocol import decode_results
from tests.support.server import ServerProcess, running_server, server_config
from tool_server.workbench.files import TrajectoryIndex

MIB = 1024 * 1024
TIMEOUT = 300  # seconds, for a request on a loaded machine


def tiny_lines(path: Path, count: int, prefix: str = "t") -> Path:
    """``count`` one-field records: the cheapest lines to write, the most rows per byte."""
    path.write_bytes(b"".join(b'{"id":"%s-%d"}\n' % (prefix.encode(), n) for n in range(count)))
    return path


def good(n: int) -> dict:
    return {
        "id": f"good-{n}",
        "index": n,
        "sample": 0,
        "data_source": "env/bank",
        "reward": 1.0,
        "stop_reason": "answer",
        "num_turns": 2,
        "metrics": {"calls": 1, "tool_errors": 0},
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "<answer>1</answer>"},
        ],
        "num_prompt_messages": 1,
        "response_ids": [1, 2, 3],
        "response_mask": [1, 1, 0],
        "segments": [{"text": "ab", "model": True}, {"text": "c", "model": False}],
    }


# Each malformed line: the record, what its error mark says, and whether the listing's cheap
# checks see it (the items of a long list are checked when the record is opened).
MALFORMED = [
    ({**good(1), "id": 12345}, "id is a number", True),
    ({**good(2), "response_mask": "1,1,0"}, "response_mask is a string", True),
    ({**good(3), "metrics": {"calls": "many", "tool_errors": 0}}, "metrics.calls is a string", True),
    ({**good(4), "index": [1, 2]}, "index is a list", True),
    ({**good(5), "messages": "hello"}, "messages is a string", True),
    ({**good(6), "calls": [None]}, "calls has items of the wrong type", True),
    ({**good(7), "response_ids": ["a", "b", "c"]}, "response_ids has items of the wrong type", False),
    ({**good(8), "data_source": {"a": 1}}, "data_source is an object", True),
    ({**good(9), "id": "nul\x00inside", "stop_reason": 7}, "stop_reason is a number", True),
    ({**good(11), "response_mask": [1, None, 0]}, "response_mask has items of the wrong type", True),
]
UNREADABLE = [b'{"id": "raw\x00byte"}', b"[1, 2, 3]", b"not json at all"]


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    runs = tmp_path_factory.mktemp("runs")
    lines = [orjson.dumps(good(0))]
    lines += [orjson.dumps(record) for record, _, _ in MALFORMED]
    lines += [*UNREADABLE, orjson.dumps(good(10))]
    (runs / "malformed.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    (runs / "small.jsonl").write_bytes(b"".join(orjson.dumps(good(n)) + b"\n" for n in range(5)))
    return runs


@pytest.fixture(scope="module")
def server(runs_dir: Path) -> Iterator[ServerProcess]:
    """Default index limits, and a tokenizer (token ids of the wrong type must not reach it)."""
    from trainer_client.backends.models import resolve_model_path

    workbench = {"runs_dir": str(runs_dir), "tokenizer": str(resolve_model_path("smollm2"))}
    with running_server(server_config(workbench=workbench)) as proc:
        yield proc


def page(server: ServerProcess, name: str, **params: str) -> dict:
    answer = httpx.get(server.url + "/ui/api/trajectories", params={"file": name, **params}, timeout=TIMEOUT)
    assert answer.status_code == 200, answer.text
    return answer.json()


# ----------------------------------------------------------------- memory


def test_the_index_holds_a_few_dozen_bytes_a_line_not_a_python_object_each(tmp_path: Path) -> None:
    """Traced from the allocator: a 16 MiB file of tiny lines took 1.2 GB traced (5.6M lines)
    when each line kept a tuple and an int object; now numpy columns, ~110 bytes a line."""
    path = tiny_lines(tmp_path / "tiny.jsonl", 250_000)
    index = TrajectoryIndex()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        first = index.page(path, {}, 0, 50)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert first["total"] == 250_000
    assert held / 250_000 < 160, f"{held / 250_000:.0f} bytes a line"
    # what it says it holds is what it holds (its columns at their capacity, a cached filter)
    assert index.nbytes <= held + 64 * 1024 and held <= index.nbytes + 512 * 1024, (index.nbytes, held)


def test_lines_per_file_are_capped_and_the_page_says_so(tmp_path: Path) -> None:
    path = tiny_lines(tmp_path / "long.jsonl", 30_000)
    index = TrajectoryIndex(max_lines=10_000)
    first = index.page(path, {}, 0, 50)
    assert first["total"] == 10_000
    assert "first 10,000 lines" in first["index"]["truncated"]
    assert "workbench.index_max_lines" in first["index"]["truncated"]
    assert index.nbytes < 10_000 * 160
    # appended lines do not grow it either
    with open(path, "ab") as handle:
        handle.write(b'{"id": "late"}\n' * 1000)
    assert index.page(path, {}, 0, 50)["total"] == 10_000


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    """A server whose trajectory indexes may hold 2 MiB in all."""
    runs = tmp_path_factory.mktemp("capped")
    tiny_lines(runs / "huge.jsonl", 60_000, "huge")
    for name in ("a", "b", "c"):
        tiny_lines(runs / f"{name}.jsonl", 12_000, name)
    workbench = {"runs_dir": str(runs), "index_max_lines": 100_000, "index_max_bytes": 2 * MIB}
    with running_server(server_config(workbench=workbench)) as proc:
        yield proc, runs


def indexes(server: ServerProcess) -> dict[str, dict]:
    listed = httpx.get(server.url + "/ui/api/files", timeout=TIMEOUT).json()["files"]
    return {f["name"]: f["index"] for f in listed if f["index"] is not None}


def test_a_file_that_alone_passes_the_memory_cap_is_indexed_up_to_it(capped) -> None:
    server, _ = capped
    first = page(server, "huge.jsonl")
    assert 0 < first["total"] < 60_000
    assert first["index"]["bytes"] <= 2 * MIB
    assert "workbench.index_max_bytes" in first["index"]["truncated"]
    assert f"first {first['total']:,} lines" in first["index"]["truncated"]
    # the lines it has are all there, filters and the last one included
    last = first["total"] - 1
    assert page(server, "huge.jsonl", q=f"huge-{last}")["rows"][0]["line"] == last
    gone = httpx.get(server.url + "/ui/api/trajectory", params={"file": "huge.jsonl", "line": first["total"]})
    assert gone.status_code == 404 and f"the index has {first['total']}" in gone.json()["error"]["message"]


def test_all_indexes_together_stay_under_the_cap(capped) -> None:
    server, _ = capped
    for name in ("a", "b", "c", "huge", "a"):
        page(server, f"{name}.jsonl")
        held = indexes(server)
        assert sum(i["bytes"] for i in held.values()) <= 2 * MIB, held
    # the least recently used went; the last one opened is whole
    assert "a.jsonl" in held and held["a.jsonl"]["lines"] == 12_000 and held["a.jsonl"]["truncated"] is None
    assert "b.jsonl" not in held
    again = page(server, "b.jsonl", q="b-11999")  # built again on demand
    assert again["total"] == 12_000 and again["rows"][0]["id"] == "b-11999"


def test_the_page_says_where_the_index_stops(capped, open_page) -> None:
    server, _ = capped
    page_, _ = open_page(f"{server.url}/ui/#/trajectories/huge.jsonl")
    page_.wait_for_selector("[data-index-notice]:has-text('workbench.index_max_bytes')")
    assert "later lines are not listed" in page_.inner_text("[data-index-notice]")
    page_.goto(f"{server.url}/ui/#/trajectories/a.jsonl")
    page_.wait_for_selector("[data-count]:has-text('12,000 of 12,000')")
    assert page_.inner_text("[data-index-notice]") == ""


# ----------------------------------------------------------------- the event loop


def opened_by(pid: int, path: Path) -> bool:
    """Whether process ``pid`` has ``path`` open (the index builder reads it while it builds)."""
    fds = Path(f"/proc/{pid}/fd")
    for fd in fds.iterdir():
        try:
            if os.readlink(fd) == str(path):
                return True
        except OSError:
            continue  # closed since the listing
    return False


def test_other_requests_are_answered_while_a_big_index_builds(server, runs_dir) -> None:
    """A million lines take seconds to index. While the builder holds the file open (the
    synchronisation point, read from /proc), /healthz, a calculator call and another file's
    page are all answered, and the build is still going when they are."""
    big = tiny_lines(runs_dir / "million.jsonl", 1_000_000, "m")
    pid = server.proc.pid
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        building = pool.submit(page, server, "million.jsonl")
        deadline = time.monotonic() + TIMEOUT
        while not opened_by(pid, big):
            assert not building.done(), "the index was built before the test saw it start"
            assert time.monotonic() < deadline, "the server never opened the file"
            time.sleep(0.002)
        assert httpx.get(server.url + "/healthz", timeout=TIMEOUT).status_code == 200
        call = {"call_id": uuid.uuid4().hex, "name": "calculator", "arguments": {"expression": "6*7"}}
        answer = httpx.post(server.url + "/v1/calls", json={"calls": [call]}, timeout=TIMEOUT)
        assert decode_results(answer.content)[0].content[0]["text"] == "42"
        other = page(server, "small.jsonl")  # another user's page: its own file, its own lock
        assert other["total"] == 5
        listed = httpx.get(server.url + "/ui/api/files", timeout=TIMEOUT).json()["files"]
        assert opened_by(pid, big) and not building.done(), "those requests waited for the build"
        # the listing, answered during the build, says so
        status = next(f for f in listed if f["name"] == "million.jsonl").get("index")
        assert status is not None and status["building"] and status["lines"] < 1_000_000
        assert building.result(TIMEOUT)["total"] == 1_000_000


# ----------------------------------------------------------------- malformed records


def test_a_malformed_record_gets_an_error_mark_of_its_own(server) -> None:
    listed = page(server, "malformed.jsonl", limit="100")
    rows = listed["rows"]
    assert len(rows) == listed["total"] == 1 + len(MALFORMED) + len(UNREADABLE) + 1
    assert not rows[0]["malformed"] and rows[0]["error"] is None and rows[0]["id"] == "good-0"
    assert not rows[-1]["malformed"] and rows[-1]["id"] == "good-10"
    for row, (record, problem, listed_bad) in zip(rows[1:], MALFORMED, strict=False):
        assert row["malformed"] == listed_bad and (problem in (row["error"] or "")) == listed_bad, (
            row,
            problem,
        )
        assert row["id"] in (record["id"], None) and isinstance(row["tool_calls"], int)
    unreadable = rows[1 + len(MALFORMED) : -1]
    assert all(r["malformed"] and r["stop_reason"] == "unreadable" for r in unreadable)
    assert (
        "not valid JSON" in unreadable[0]["error"]
        and "not a JSON object but a list" in unreadable[1]["error"]
    )
    # filters run over them too
    ids = ["good-0", *(r["id"] for r, _, _ in MALFORMED), "good-10"]
    assert page(server, "malformed.jsonl", q="good")["matching"] == sum(
        isinstance(i, str) and "good" in i for i in ids
    )
    assert page(server, "malformed.jsonl", stop_reason="unreadable")["matching"] == len(UNREADABLE)

    for line, (_, problem, _) in enumerate(MALFORMED, 1):
        one = httpx.get(server.url + "/ui/api/trajectory", params={"file": "malformed.jsonl", "line": line})
        assert one.status_code == 200, one.text
        body = one.json()
        assert any(problem in p for p in body["problems"]), body["problems"]
        field = problem.split()[0].split(".")
        held = body["record"] if len(field) == 1 else body["record"]["metrics"]
        assert field[-1] not in held  # left out, so the view can draw the rest
    for line in range(1 + len(MALFORMED), listed["total"] - 1):
        one = httpx.get(server.url + "/ui/api/trajectory", params={"file": "malformed.jsonl", "line": line})
        assert one.status_code == 200 and one.json()["record"] == {}
        assert "this line holds no trajectory" in one.json()["problems"][0]


def test_file_names_the_kernel_refuses_are_a_clear_400(server) -> None:
    for name, why in (("a\x00b.jsonl", "NUL"), ("x" * 5000, "too long"), ("d/" + "y" * 300, "too long")):
        for route in ("/ui/api/trajectories", "/ui/api/trajectory"):
            answer = httpx.get(server.url + route, params={"file": name}, timeout=TIMEOUT)
            assert answer.status_code == 400, (route, answer.text[:300])
            assert why in answer.json()["error"]["message"]
    # an upload's own name is made safe: printable, short
    body = orjson.dumps(good(0)) + b"\n"
    for name in ("bad\x00name.jsonl", "z" * 5000 + ".jsonl"):
        answer = httpx.post(
            server.url + "/ui/api/upload",
            params={"name": name},
            content=body,
            headers={"Content-Type": "application/x-ndjson"},
            timeout=TIMEOUT,
        )
        assert answer.status_code == 201, answer.text[:300]
        uploaded = answer.json()["file"]
        assert "\x00" not in uploaded and len(uploaded) < 120 and uploaded.endswith(".jsonl")
        assert page(server, uploaded)["rows"][0]["id"] == "good-0"


def test_the_page_draws_a_malformed_file_and_marks_its_bad_records(server, open_page) -> None:
    """No console error (the fixture fails on one): a number for an id, a string for a list."""
    rows = 1 + len(MALFORMED) + len(UNREADABLE) + 1
    page_, _ = open_page(f"{server.url}/ui/#/trajectories/malformed.jsonl")
    page_.wait_for_selector(f"tr[data-line='{rows - 1}']")
    marked = page_.eval_on_selector_all(
        "tr[data-line]", "els => els.map(e => !!e.querySelector('[data-malformed]'))"
    )
    assert marked == [False, *(listed for _, _, listed in MALFORMED), *[True] * len(UNREADABLE), False]
    assert "id is a number" in page_.get_attribute("tr[data-line='1'] [data-malformed]", "title")
    for line in (1, 2, 5, 7, len(MALFORMED) + 2):  # id, mask, messages, token ids, not JSON
        page_.goto(f"{server.url}/ui/#/trajectories/malformed.jsonl/{line}")
        page_.wait_for_selector(f"[data-trajectory] [data-line='{line}'] [data-problems]")
        assert "malformed record" in page_.inner_text(f"[data-line='{line}'] [data-problems]")
    page_.goto(f"{server.url}/ui/#/trajectories/malformed.jsonl/0")
    page_.wait_for_selector("[data-trajectory] [data-line='0'] [data-tokens] .tok")
    assert page_.query_selector("[data-line='0'] [data-problems]") is None
