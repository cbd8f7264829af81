"""The image environment: seeded scenes, zoom/rotate/measure tools, and its reward, behind a real server.

The gold trajectory (zoom on the right frame, rotate a turned label, answer) scores 1.0;
the right answer without the zoom does not, nor a zoom on the wrong place or from too far
away. Views come back as PNG images through /v1/calls and the official MCP client, equal
byte for byte to what the pack draws in process.
"""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from protocol import Result, VerifyRequest, VerifyResult, decode_results, decode_verify_results
from tests.envs.test_serving import played as played_calls
from tests.support.server import REPO, ServerProcess, running_server, server_config
from tools.envs.image_env import LEGIBLE_PX, TOOLS, VIEW_SIDE, pack
from tools.envs.pack import dump_pack, load_pack
from tools.images import Renderer, render
from tools.verifiers.tool_use.reward import score

pytestmark = pytest.mark.timeout(180)
ARGS = {"seed": 3, "tasks": 9}
PACK = pack(**ARGS)
PACK_ID = PACK.id


def task_of(level: int, nth: int = 0) -> Any:
    return [t for t in PACK.tasks if t.metadata["level"] == level][nth]


def played(calls: list[tuple[str, dict[str, Any]]], answer: str) -> list[dict[str, Any]]:
    """A trajectory: the prompt, one assistant turn per call and its tool message, then the answer."""
    return [*played_calls(calls)[:-1], {"role": "assistant", "content": f"<answer>{answer}</answer>"}]


def decoded(result: Result) -> Any:
    from PIL import Image

    (block,) = [b for b in result.content if b["type"] == "image"]
    assert block["mimeType"] == "image/png"
    return Image.open(io.BytesIO(base64.b64decode(block["data"])))


# ----------------------------------------------------------------------------- the pack itself


def test_the_same_seed_gives_the_same_tasks_and_pixels() -> None:
    again, other = pack(**ARGS), pack(seed=4, tasks=9)
    assert [t.to_dict() for t in again.tasks] == [t.to_dict() for t in PACK.tasks]
    assert [t.gold.answer for t in other.tasks] != [t.gold.answer for t in PACK.tasks]
    scene = PACK.base_state(PACK.tasks[0])["scene"]["image"]
    assert render(scene).tobytes() == render(json.loads(json.dumps(scene))).tobytes()
    assert {t.metadata["level"] for t in PACK.tasks} == {1, 2, 3}
    assert [t.complexity.level for t in PACK.tasks[:3]] == [1, 2, 3]  # one zoom, two zooms, zoom then rotate
    scene_2 = PACK.base_state(task_of(2))["scene"]["image"]
    assert task_of(2).gold.answer == str(sum(int(label["text"]) for label in scene_2["labels"][:2]))


@pytest.mark.parametrize("level", [1, 2, 3])
def test_the_gold_trajectory_scores_one_and_a_guess_without_zoom_does_not(level: int) -> None:
    task = task_of(level)
    gold = [(c.name, c.arguments) for c in task.gold.calls]
    request = VerifyRequest(
        "tool_use",
        {"pack": PACK_ID, "task": task.id},
        messages=played(gold, task.gold.answer),
        response_start=1,
    )
    replayed = PACK.replay(task)
    for mode in ("eval", "train"):
        assert score(PACK, task, replayed, request, mode=mode).score == 1.0
    guess = VerifyRequest(
        "tool_use",
        {"pack": PACK_ID, "task": task.id},
        messages=played([], task.gold.answer),
        response_start=1,
    )
    untouched = score(PACK, task, PACK.new_world(task), guess, mode="eval")
    assert (
        untouched.score == 0.0
        and untouched.components["answer"] == 1.0
        and untouched.components["state"] == 0.0
    )
    assert score(PACK, task, PACK.new_world(task), guess, mode="train").score < 0.5


def test_looking_around_after_reading_costs_nothing_and_an_exported_pack_scores_the_same(
    tmp_path: Path,
) -> None:
    task = task_of(3)
    exported = load_pack(dump_pack(PACK, tmp_path, tools_module="tools.envs.image_env"))
    calls = [(c.name, c.arguments) for c in task.gold.calls] + [
        ("view_image", {}),
        ("zoom", {"x0": 0, "y0": 0, "x1": 50, "y1": 50}),
    ]
    request = VerifyRequest(
        "tool_use",
        {"pack": PACK_ID, "task": task.id},
        messages=played(calls, task.gold.answer),
        response_start=1,
    )
    for environment in (PACK, exported):
        world = environment.new_world(environment.task(task.id))
        for name, arguments in calls:
            environment.call(world, name, arguments)
        result = score(environment, environment.task(task.id), world, request, mode="eval")
        assert result.score == 1.0 and result.components["state"] == 1.0, result.details


def test_concurrent_first_views_of_a_scene_draw_it_once() -> None:
    scene = pack(seed=99, tasks=1).base_state(pack(seed=99, tasks=1).tasks[0])["scene"]["image"]
    fresh = Renderer(2)
    with ThreadPoolExecutor(8) as pool:
        images = list(pool.map(lambda _: fresh(scene), range(16)))
    assert fresh.rendered == 1 and all(image is images[0] for image in images)


def test_only_a_close_upright_view_of_the_target_reveals_it() -> None:
    task = task_of(3)  # a turned label: zoom, then rotate
    scene = PACK.base_state(task)["scene"]["image"]
    target = scene["labels"][0]
    zoom = task.gold.calls[0].arguments
    upright = task.gold.calls[1].arguments["degrees"]

    def revealed(calls: list[tuple[str, dict[str, Any]]]) -> bool:
        world = PACK.new_world(task)
        for name, arguments in calls:
            PACK.call(world, name, arguments)
        return bool(world["targets"].peek(target["id"])["revealed"])

    assert not revealed([("view_image", {})])  # the whole image: text far too small
    assert not revealed([("zoom", zoom)])  # close, but still turned
    assert revealed([("zoom", zoom), ("rotate", {"degrees": upright})])
    wrong = (upright + 90) % 360 or 90
    assert not revealed([("zoom", zoom), ("rotate", {"degrees": wrong})])
    other = scene["labels"][1]["box"]  # another frame, however close
    assert not revealed([("zoom", dict(zip(("x0", "y0", "x1", "y1"), other, strict=True)))])
    # Around the target but so wide that its text stays under LEGIBLE_PX pixels
    x0, y0, x1, y1 = target["text_box"]
    side = int(VIEW_SIDE * target["size"] / LEGIBLE_PX) + 40
    cx, cy = (x0 + x1) // 2, (y0 + y1) // 2
    wide = {"x0": cx - side // 2, "y0": cy - side // 2, "x1": cx + side // 2, "y1": cy + side // 2}
    assert not revealed([("zoom", wide), ("rotate", {"degrees": upright})])


def test_measuring_tools_find_frames_and_text_without_reading() -> None:
    task = task_of(1)
    scene = PACK.base_state(task)["scene"]["image"]
    target = scene["labels"][0]
    world = PACK.new_world(task)
    found = PACK.call(world, "find_color", {"colour": target["colour"]})
    assert found["box"] == [target["box"][0], target["box"][1], target["box"][2] + 1, target["box"][3] + 1]
    edge = PACK.call(world, "pixel_color", {"x": target["box"][0], "y": target["box"][1]})
    assert edge["frame_colour"] == target["colour"] and edge["hex"].startswith("#")
    PACK.call(world, "zoom", dict(zip(("x0", "y0", "x1", "y1"), target["box"], strict=True)))
    grid = PACK.call(world, "ink_grid", {"rows": 1, "cols": 1})
    assert grid["box"] == target["box"] and grid["cells"][0]["ink"] > 0.02  # the text is in there
    blank = PACK.call(world, "zoom", {"x0": 0, "y0": 0, "x1": 30, "y1": 30})
    assert blank.structured["scale"] == 8.0
    assert PACK.call(world, "ink_grid", {})["cells"][0]["ink"] == 0.0
    with pytest.raises(Exception, match="outside the 2000x1500 image"):
        PACK.call(world, "pixel_color", {"x": 5000, "y": 1})
    with pytest.raises(Exception, match="less than 4x4 pixels"):
        PACK.call(world, "zoom", {"x0": 10, "y0": 10, "x1": 12, "y1": 300})


def test_the_server_does_not_import_pillow_unless_an_image_tool_is_served() -> None:
    probe = (
        "import sys\n"
        "from tool_server.app import build_registry\n"
        "from tool_server.config import config_from_dict, load_config\n"
        "build_registry(load_config())\n"
        "print('PIL' in sys.modules)\n"
        "build_registry(config_from_dict({'environments': [{'source': 'tools.envs.image_env:pack',"
        " 'arguments': {'tasks': 1}}]}))\n"
        "print('PIL' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"]


# ----------------------------------------------------------------------------- behind a real server


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    config = server_config(environments=[{"source": "tools.envs.image_env:pack", "arguments": ARGS}])
    with running_server(config) as srv:
        yield srv


def bound(srv: ServerProcess, task: str) -> str:
    session = f"s-{uuid.uuid4().hex}"
    opened = httpx.post(
        srv.url + "/v1/sessions",
        json={"session": session, "environment": {"pack": PACK_ID, "task": task}},
        timeout=30,
    )
    assert opened.status_code == 201, opened.text
    return session


def call(srv: ServerProcess, name: str, arguments: dict[str, Any], session: str) -> Result:
    body = {
        "calls": [{"call_id": uuid.uuid4().hex, "name": name, "arguments": arguments, "session": session}]
    }
    response = httpx.post(srv.url + "/v1/calls", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return decode_results(response.content)[0]


def verify(srv: ServerProcess, request: dict[str, Any]) -> VerifyResult:
    body = {"requests": [{"verifier": "tool_use", **request}]}
    response = httpx.post(srv.url + "/v1/verify", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return decode_verify_results(response.content)[0]


def test_the_gold_trajectory_through_the_server_scores_one_and_shows_pngs(server: ServerProcess) -> None:
    task = task_of(3)
    session, guesser = bound(server, task.id), bound(server, task.id)
    overview = call(server, "view_image", {}, session)
    assert not overview.is_error, overview.text
    assert decoded(overview).size == (VIEW_SIDE, VIEW_SIDE * 3 // 4)
    local = PACK.new_world(task)
    for gold in task.gold.calls:
        result = call(server, gold.name, gold.arguments, session)
        assert not result.is_error, result.text
        assert result.content[0]["type"] == "text" and "View of" in result.content[0]["text"]
        expected = PACK.call(local, gold.name, gold.arguments)  # drawn in process: the same bytes
        assert result.content[1]["data"] == expected.content[1]["data"]
        assert result.structured == expected.structured
    assert decoded(result).size == tuple(result.structured["size"])
    truth = {"pack": PACK_ID, "task": task.id}
    calls = [(c.name, c.arguments) for c in task.gold.calls]
    request = {"ground_truth": truth, "response_start": 1, "arguments": {"mode": "eval"}}
    solved = verify(server, {**request, "session": session, "messages": played(calls, task.gold.answer)})
    assert not solved.is_error, solved.error
    assert solved.score == 1.0 and solved.components["state"] == 1.0 and solved.components["answer"] == 1.0
    guessed = verify(server, {**request, "session": guesser, "messages": played([], task.gold.answer)})
    assert guessed.score == 0.0 and guessed.components["state"] == 0.0


def test_views_through_the_official_mcp_client(server: ServerProcess) -> None:
    task = task_of(1)
    session = f"s-{uuid.uuid4().hex}"
    zoom = task.gold.calls[0].arguments

    async def scenario() -> tuple[Any, Any, Any]:
        async with httpx2.AsyncClient() as http:
            transport = streamable_http_client(server.url + f"/mcp/{PACK_ID}", http_client=http)
            async with Client(transport, mode="2026-07-28") as client:
                tools = (await client.list_tools()).tools
                meta = {
                    "toolfactory/session": session,
                    "toolfactory/environment": {"pack": PACK_ID, "task": task.id},
                }
                view = await client.call_tool("zoom", zoom, meta=meta)
                bad = await client.call_tool("rotate", {"degrees": 45}, meta=meta)
                return tools, view, bad

    tools, view, bad = anyio.run(scenario)
    assert {t.name for t in tools} == {t.name for t in TOOLS}
    assert not view.is_error and [b.type for b in view.content] == ["text", "image"]
    expected = PACK.call(PACK.new_world(task), "zoom", zoom)
    assert base64.b64decode(view.content[1].data) == base64.b64decode(expected.content[1]["data"])
    assert bad.is_error and bad.meta["toolfactory"]["error_kind"] == "invalid_arguments"
