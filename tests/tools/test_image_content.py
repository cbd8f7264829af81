"""Image content end to end: tools that return images, behind a real server on loopback.

Through ``/v1/calls``, the official MCP client and the trainer client the image arrives
byte for byte; an image over a limit (pixels, bytes, count) or one the server cannot read
is an error result the model sees, never a silent drop; a cache hit and an idempotent
replay hand back the identical image without running the tool again.
"""

from __future__ import annotations

import base64
import io
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from protocol import Result, decode_results
from protocol.images import image_block, image_info
from tests.support.image_tools import expected_picture
from tests.support.server import REPO, ServerProcess, running_server, server_config

pytestmark = pytest.mark.timeout(120)
IMAGE_TOOLS = ["picture", "picture_cached", "broken_image", "pictures"]
MAX_PIXELS = 300 * 300
MAX_BYTES = 100_000


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    tools = server_config()["tools"] + [
        {"target": f"tests.support.image_tools:{name}", "toolsets": ["default", "images"]}
        for name in IMAGE_TOOLS
    ]
    limits = {"max_image_pixels": MAX_PIXELS, "max_image_bytes": MAX_BYTES, "max_images_per_result": 3}
    with running_server(server_config(tools=tools, limits=limits)) as srv:
        yield srv


def call(srv: ServerProcess, name: str, arguments: dict[str, Any], call_id: str | None = None) -> Result:
    body = {"calls": [{"call_id": call_id or uuid.uuid4().hex, "name": name, "arguments": arguments}]}
    response = httpx.post(srv.url + "/v1/calls", json=body, timeout=30)
    assert response.status_code == 200, response.text
    return decode_results(response.content)[0]


def image_bytes(block: dict[str, Any]) -> bytes:
    assert block["type"] == "image"
    return base64.b64decode(block["data"], validate=True)


# ----------------------------------------------------------------------------- the header reader


def test_the_header_gives_type_and_size_of_png_and_jpeg_without_decoding() -> None:
    from PIL import Image

    def encoded(fmt: str, **options: Any) -> bytes:
        buffer = io.BytesIO()
        Image.new("RGB", (1234, 567), "teal").save(buffer, fmt, **options)
        return buffer.getvalue()

    big_exif = b"Exif\x00\x00" + bytes(60_000)  # the frame header lies past the first chunk decoded
    for fmt, options in [
        ("PNG", {}),
        ("JPEG", {}),
        ("JPEG", {"progressive": True}),
        ("JPEG", {"exif": big_exif}),
    ]:
        raw = encoded(fmt, **options)
        block = image_block(raw)
        info = image_info(block["data"], block["mimeType"])
        assert (info.width, info.height, info.size) == (1234, 567, len(raw))
        assert info.mime_type == f"image/{fmt.lower()}"


def test_unreadable_images_are_refused_with_the_reason() -> None:
    png = image_block(expected_picture(8, 8, 0))["data"]
    cases = {
        "not valid base64": "ab!d",
        "not a multiple of 4": "abc",
        "neither PNG nor JPEG": base64.b64encode(b"GIF89a" + bytes(20)).decode(),
        "declared as 'image/jpeg' is image/png": png,
        "ends before its frame header": base64.b64encode(b"\xff\xd8\xff\xe0\x00\x10" + bytes(14)).decode(),
    }
    for reason, data in cases.items():
        with pytest.raises(ValueError, match=reason):
            image_info(data, "image/jpeg" if "declared" in reason else None)


# ----------------------------------------------------------------------------- through the server


def test_images_come_back_byte_for_byte_through_v1_calls(server: ServerProcess) -> None:
    both = call(server, "picture", {"width": 120, "height": 80, "seed": 3, "caption": "a picture"})
    assert not both.is_error, both.text
    assert both.content[0] == {"type": "text", "text": "a picture"}
    assert both.content[1]["mimeType"] == "image/png"
    assert image_bytes(both.content[1]) == expected_picture(120, 80, 3)
    assert both.structured == {"width": 120, "height": 80}

    alone = call(server, "picture", {"width": 50, "height": 40, "seed": 4, "fmt": "jpeg"})
    assert [b["type"] for b in alone.content] == ["image"] and alone.content[0]["mimeType"] == "image/jpeg"
    assert image_bytes(alone.content[0]) == expected_picture(50, 40, 4, "jpeg")


def test_images_come_back_byte_for_byte_through_the_official_mcp_client(server: ServerProcess) -> None:
    async def scenario() -> tuple[Any, Any, Any, Any]:
        async with httpx2.AsyncClient() as http:
            transport = streamable_http_client(server.url + "/mcp/images", http_client=http)
            async with Client(transport, mode="2026-07-28") as client:
                good = await client.call_tool(
                    "picture", {"width": 90, "height": 60, "seed": 5, "caption": "hi"}
                )
                too_big = await client.call_tool("picture", {"width": 400, "height": 400})
                first = await client.call_tool("picture_cached", {"seed": 31})
                hit = await client.call_tool("picture_cached", {"seed": 31})
                return good, too_big, first, hit

    good, too_big, first, hit = anyio.run(scenario)
    assert hit.meta["toolfactory"]["cached"] and not first.meta["toolfactory"]["cached"]
    assert hit.content[1].data == first.content[1].data
    assert base64.b64decode(hit.content[1].data) == expected_picture(64, 48, 31)
    assert not good.is_error
    assert good.content[0].type == "text" and good.content[0].text == "hi"
    image = good.content[1]
    assert image.type == "image" and image.mime_type == "image/png"
    assert base64.b64decode(image.data) == expected_picture(90, 60, 5)
    assert too_big.is_error and too_big.meta["toolfactory"]["error_kind"] == "too_large"
    assert "limits.max_image_pixels" in too_big.content[0].text


def test_images_come_back_byte_for_byte_through_the_trainer_client(server: ServerProcess) -> None:
    from trainer_client.client.tool_client import ToolClient

    async def scenario() -> Result:
        async with ToolClient(server.url) as client:
            return await client.call("picture", {"width": 70, "height": 30, "seed": 6, "caption": "c"})

    result = anyio.run(scenario)
    assert not result.is_error and result.text == "c"
    assert image_bytes(result.content[1]) == expected_picture(70, 30, 6)


def test_an_image_over_a_limit_is_an_error_the_model_sees(server: ServerProcess) -> None:
    pixels = call(server, "picture", {"width": 400, "height": 300})  # 120,000 px > 90,000
    assert pixels.is_error and pixels.error is not None and pixels.error.kind == "too_large"
    assert "400x300 px" in pixels.text and f"limit of {MAX_PIXELS} pixels" in pixels.text
    assert not any(b["type"] == "image" for b in pixels.content)  # nothing half-sent

    noise = call(server, "picture", {"width": 250, "height": 250})  # 62,500 px, ~190 kB of noise
    assert noise.is_error and noise.error is not None and noise.error.kind == "too_large"
    assert f"limit of {MAX_BYTES} bytes (limits.max_image_bytes)" in noise.text

    many = call(server, "pictures", {"count": 4})
    assert many.error is not None and many.error.kind == "too_large"
    assert "4 images; the limit is 3" in many.text
    assert not call(server, "pictures", {"count": 3}).is_error


def test_an_image_the_server_cannot_read_is_a_tool_error(server: ServerProcess) -> None:
    for kind, reason in [
        ("garbage", "not valid base64"),
        ("mismatch", "declared as 'image/jpeg'"),
        ("gif", "neither PNG nor JPEG"),
        ("untyped", "the block has no mimeType"),
    ]:
        result = call(server, "broken_image", {"kind": kind})
        assert result.is_error and result.error is not None and result.error.kind == "tool_error", kind
        assert "image 1 of the result is not a PNG or JPEG image" in result.text and reason in result.text


def test_a_cache_hit_and_a_replay_give_the_identical_image_without_running_again(
    server: ServerProcess,
) -> None:
    arguments = {"width": 60, "height": 60, "seed": 11}
    first_id = uuid.uuid4().hex
    first = call(server, "picture_cached", arguments, first_id)
    hit = call(server, "picture_cached", arguments)
    replay = call(server, "picture_cached", arguments, first_id)
    assert not first.cached and hit.cached
    expected = expected_picture(60, 60, 11)
    for result in (first, hit, replay):
        assert result.content[1]["data"] == first.content[1]["data"]
        assert image_bytes(result.content[1]) == expected
    runs = first.structured["runs"]
    assert hit.structured["runs"] == replay.structured["runs"] == runs  # the tool ran once
    other = call(server, "picture_cached", {**arguments, "seed": 12})
    assert other.structured["runs"] == runs + 1 and not other.cached


def test_a_kept_image_counts_once_in_the_stores_byte_budget(server: ServerProcess) -> None:
    def store_bytes(store: str) -> float:
        text = httpx.get(server.url + "/metrics", timeout=30).text
        for line in text.splitlines():
            if line.startswith("toolfactory_store_bytes") and f'store="{store}"' in line:
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError(f"no store_bytes for {store}")

    arguments = {"width": 100, "height": 100, "seed": 21}
    before = store_bytes("cache"), store_bytes("idempotency")
    first = call(server, "picture_cached", arguments)
    data = len(first.content[1]["data"])
    grown = store_bytes("cache") - before[0], store_bytes("idempotency") - before[1]
    for _ in range(3):  # hits are served from the cache entry: nothing more is kept
        assert call(server, "picture_cached", arguments).cached
    after = store_bytes("cache") - before[0], store_bytes("idempotency") - before[1]
    # base64 once (not 1.5x like structured text, not per hit), plus the small record overhead
    assert data <= grown[0] < data + 2_000 and data <= grown[1] < data + 2_000
    assert after == grown


def test_an_upstream_servers_images_pass_through_under_the_same_limits() -> None:
    upstream = str(REPO / "tests" / "support" / "image_upstream.py")
    config = server_config(
        mcpServers={"pics": {"command": sys.executable, "args": [upstream]}},
        limits={"max_image_pixels": MAX_PIXELS},
    )
    with running_server(config) as srv:
        deadline = time.monotonic() + 60
        small = call(srv, "pics__picture", {"width": 64, "height": 32, "seed": 7})
        while small.error is not None and small.error.kind == "unknown_tool" and time.monotonic() < deadline:
            time.sleep(0.2)  # the upstream is still starting
            small = call(srv, "pics__picture", {"width": 64, "height": 32, "seed": 7})
        assert not small.is_error, small.text
        assert small.content[0]["text"] == "64x32"
        assert image_bytes(small.content[1]) == expected_picture(64, 32, 7)
        large = call(srv, "pics__picture", {"width": 400, "height": 300})
        assert large.is_error and large.error is not None and large.error.kind == "too_large"
        assert "limits.max_image_pixels" in large.text
