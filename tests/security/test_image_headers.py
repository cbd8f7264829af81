"""Image headers are read in bounded work and cannot lie about the size a decoder produces.

The server checks every image of a result against ``limits.max_image_pixels`` and
``limits.max_image_bytes`` from its header, on the event loop. The hostile images here are
built in code: a JPEG of a million tiny segments (or of megabytes of fill bytes), a PNG of
a million tiny chunks, and megabytes of metadata before the image data are refused after a
bounded walk; a PNG with a second, larger IHDR, a
JPEG with a small frame header in front of the real one, and a JPEG hiding its frame header
in a segment decoders walk differently are refused, not read as 8x8. Ordinary images
(written by Pillow in many variants) still pass, with the size Pillow reads.
"""

from __future__ import annotations

import base64
import io
import struct
import subprocess
import sys
import uuid
import zlib
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Annotated, Any

import httpx
import orjson
import pytest

from protocol import Result, ToolOutput, decode_results, tool
from protocol.images import (
    MAX_FILL_BYTES,
    MAX_HEADER_BYTES,
    MAX_HEADER_SEGMENTS,
    ImageInfo,
    image_info,
    sniff,
)
from tests.support.server import REPO, ServerProcess, running_server, server_config
from tool_server.executor.output import OutputShaper, _decoder_disagrees

pytestmark = pytest.mark.timeout(180)
LARGE = 3000  # what a decoder allocates for the lying images: 3000x3000
MAX_PIXELS = 300 * 300


# ----------------------------------------------------------------------------- building images


def encoded(width: int, height: int, fmt: str, mode: str = "RGB", **options: Any) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new(mode, (width, height), "teal" if mode == "RGB" else 0).save(buffer, fmt, **options)
    return buffer.getvalue()


def png_chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def ihdr(width: int, height: int) -> bytes:
    return png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))


def jpeg_segment(marker: int, payload: bytes) -> bytes:
    return bytes([0xFF, marker]) + struct.pack(">H", len(payload) + 2) + payload


def frame_header(width: int, height: int) -> bytes:
    """A baseline SOF0 segment of three components, as Pillow writes one."""
    components = b"\x01\x22\x00\x02\x11\x01\x03\x11\x01"
    return jpeg_segment(0xC0, struct.pack(">BHHB", 8, height, width, 3) + components)


def split_jpeg(raw: bytes) -> tuple[bytes, bytes, bytes]:
    """(the segments before the frame header, the frame header, everything after it)."""
    start = raw.index(b"\xff\xc0")
    end = start + 2 + struct.unpack(">H", raw[start + 2 : start + 4])[0]
    return raw[:start], raw[start:end], raw[end:]


def png_second_ihdr() -> bytes:
    """A small IHDR in front of the real one: Pillow takes the last one before IDAT."""
    real = encoded(LARGE, LARGE, "PNG")
    return real[:8] + ihdr(8, 8) + real[8:]


def jpeg_two_frames() -> bytes:
    """A small fake frame header in front of the real one: Pillow takes the last."""
    real = encoded(LARGE, LARGE, "JPEG")
    return real[:2] + frame_header(8, 8) + real[2:]


def jpeg_hidden_frame() -> bytes:
    """The real frame header inside a JPG (0xFFC8) segment, after a small one: a walker that
    skips JPG by its length sees only 8x8; Pillow (JPG has no length for it) finds 3000x3000."""
    before, real_frame, after = split_jpeg(encoded(LARGE, LARGE, "JPEG"))
    return before + frame_header(8, 8) + jpeg_segment(0xC8, real_frame) + after


def jpeg_many_segments(count: int = 1_000_000) -> bytes:
    """``count`` empty comment segments (4 bytes each) before an 8x8 frame: 4 MB."""
    before, frame, after = split_jpeg(encoded(8, 8, "JPEG"))
    return before + b"\xff\xfe\x00\x02" * count + frame + after


def jpeg_fill_bytes(count: int = 4_000_000) -> bytes:
    """Megabytes of 0xFF fill bytes in front of a marker."""
    before, frame, after = split_jpeg(encoded(8, 8, "JPEG"))
    return before + b"\xff" * count + frame + after


def png_many_chunks(count: int = 400_000) -> bytes:
    """``count`` empty ancillary chunks (12 bytes each) before the image data: 4.8 MB."""
    real = encoded(8, 8, "PNG")
    return real[:33] + png_chunk(b"teXt", b"") * count + real[33:]


def jpeg_large_metadata() -> bytes:
    """20 APP segments of 64 KiB (1.3 MB of metadata) before the frame header."""
    raw = encoded(8, 8, "JPEG")
    return raw[:2] + jpeg_segment(0xE5, bytes(65_000)) * 20 + raw[2:]


def png_large_metadata() -> bytes:
    """One 1.2 MB text chunk before the image data."""
    real = encoded(8, 8, "PNG")
    return real[:33] + png_chunk(b"tEXt", b"k\x00" + b"v" * 1_200_000) + real[33:]


def png_bad_ihdr_crc() -> bytes:
    """A well-formed walk but a header no decoder accepts (its IHDR's checksum is wrong)."""
    real = bytearray(encoded(8, 8, "PNG"))
    real[29] ^= 0xFF
    return bytes(real)


def jpeg_12_bit() -> bytes:
    """A frame header of 12-bit samples: Pillow cannot decode it."""
    raw = bytearray(encoded(8, 8, "JPEG"))
    raw[raw.index(b"\xff\xc0") + 4] = 12
    return bytes(raw)


def png_inflating_chunks() -> bytes:
    """An ordinary 8x8 PNG with 70 zTXt chunks of 1 MiB each once inflated (1 KiB each here)."""
    real = encoded(8, 8, "PNG")
    bomb = png_chunk(b"zTXt", b"k\x00\x00" + zlib.compress(bytes(1024 * 1024 - 1), 9))
    return real[:33] + bomb * 70 + real[33:]


HOSTILE: dict[str, tuple[Callable[[], bytes], str, str]] = {
    # name: (builder, mime type, what the refusal says)
    "png_second_ihdr": (png_second_ihdr, "image/png", "a second IHDR chunk"),
    "jpeg_two_frames": (jpeg_two_frames, "image/jpeg", "a second frame header"),
    "jpeg_hidden_frame": (jpeg_hidden_frame, "image/jpeg", "marker 0xFFC8 before its image data"),
    "jpeg_many_segments": (jpeg_many_segments, "image/jpeg", f"more than {MAX_HEADER_SEGMENTS} segments"),
    "jpeg_fill_bytes": (jpeg_fill_bytes, "image/jpeg", f"more than {MAX_FILL_BYTES} fill bytes"),
    "png_many_chunks": (png_many_chunks, "image/png", f"more than {MAX_HEADER_SEGMENTS} chunks"),
    "jpeg_large_metadata": (jpeg_large_metadata, "image/jpeg", f"more than {MAX_HEADER_BYTES} bytes before"),
    "png_large_metadata": (png_large_metadata, "image/png", f"more than {MAX_HEADER_BYTES} bytes before"),
}


@tool(name="hostile_image", timeout_s=60)
def hostile_image(kind: Annotated[str, "Which hostile image of this module."]) -> ToolOutput:
    """The named image as an image block, with its data unchecked (as a tool or upstream may send it)."""
    builder, mime_type, _ = {**HOSTILE, **DECODER_REFUSES}[kind]
    block = {"type": "image", "data": base64.b64encode(builder()).decode(), "mimeType": mime_type}
    return ToolOutput([{"type": "text", "text": kind}, block])


DECODER_REFUSES: dict[str, tuple[Callable[[], bytes], str, str]] = {
    "png_bad_ihdr_crc": (png_bad_ihdr_crc, "image/png", "Pillow cannot read its header"),
    "jpeg_12_bit": (jpeg_12_bit, "image/jpeg", "Pillow cannot read its header"),
}


class CountingBytes(bytes):
    """Bytes that count the reads a header parser makes of them (``sniff`` slices its input)."""

    def __getitem__(self, key: Any) -> Any:
        self.reads = getattr(self, "reads", 0) + 1
        part = super().__getitem__(key)
        self.bytes_read = getattr(self, "bytes_read", 0) + (len(part) if isinstance(part, bytes) else 1)
        return part


def shaper() -> OutputShaper:
    limits = SimpleNamespace(
        max_output_chars=10_000,
        max_structured_bytes=100_000,
        max_image_bytes=8 * 1024 * 1024,
        max_image_pixels=MAX_PIXELS,
        max_images_per_result=8,
    )
    return OutputShaper(limits)


def shaped(raw: bytes, mime_type: str) -> Result:
    block = {"type": "image", "data": base64.b64encode(raw).decode(), "mimeType": mime_type}
    return shaper().to_result("c1", ToolOutput([block]))


# ----------------------------------------------------------------------------- the header reader


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_a_hostile_header_is_refused_with_the_reason(kind: str) -> None:
    builder, mime_type, reason = HOSTILE[kind]
    with pytest.raises(ValueError, match=reason):
        image_info(base64.b64encode(builder()).decode(), mime_type)


@pytest.mark.parametrize("kind", ["jpeg_many_segments", "jpeg_fill_bytes", "png_many_chunks"])
def test_a_header_of_a_million_pieces_is_walked_in_bounded_work(kind: str) -> None:
    raw = CountingBytes(HOSTILE[kind][0]())
    with pytest.raises(ValueError, match="refused"):
        sniff(raw)
    # one read per segment or chunk (two for a JPEG: marker, then length), whatever the size
    assert raw.reads <= 2 * MAX_HEADER_SEGMENTS + 4, raw.reads
    assert raw.bytes_read <= (MAX_HEADER_SEGMENTS + 2) * (MAX_FILL_BYTES + 10), raw.bytes_read


def test_the_lying_images_really_decode_larger() -> None:
    """The attack is real: Pillow reads 3000x3000 where the first header said 8x8."""
    from PIL import Image

    for builder in (png_second_ihdr, jpeg_two_frames, jpeg_hidden_frame):
        with Image.open(io.BytesIO(builder())) as image:
            assert image.size == (LARGE, LARGE), builder.__name__


ORDINARY: list[tuple[str, str, dict[str, Any]]] = [
    ("PNG", "RGB", {}),
    ("PNG", "RGBA", {}),
    ("PNG", "P", {"transparency": 0}),
    ("PNG", "L", {}),
    ("PNG", "I;16", {}),
    ("PNG", "1", {}),
    ("PNG", "RGB", {"optimize": True}),
    ("PNG", "RGB", {"icc_profile": b"\x00" * 3000}),
    ("PNG", "RGB", {"exif": b"Exif\x00\x00" + bytes(2000)}),
    ("JPEG", "RGB", {}),
    ("JPEG", "RGB", {"progressive": True}),
    ("JPEG", "RGB", {"optimize": True}),
    ("JPEG", "RGB", {"subsampling": 0}),
    ("JPEG", "L", {}),
    ("JPEG", "CMYK", {}),
    ("JPEG", "RGB", {"icc_profile": bytes(300_000)}),  # split over five APP2 segments
    ("JPEG", "RGB", {"exif": b"Exif\x00\x00" + bytes(60_000)}),
    ("JPEG", "RGB", {"comment": b"a comment", "dpi": (300, 300)}),
    ("JPEG", "RGB", {"restart_marker_blocks": 2}),
]


@pytest.mark.parametrize(("fmt", "mode", "options"), ORDINARY)
def test_ordinary_images_pass_with_the_size_pillow_reads(
    fmt: str, mode: str, options: dict[str, Any]
) -> None:
    from PIL import Image

    raw = encoded(321, 123, fmt, mode, **options)
    mime_type = f"image/{fmt.lower()}"
    info = image_info(base64.b64encode(raw).decode(), mime_type)
    with Image.open(io.BytesIO(raw)) as image:
        assert (info.width, info.height) == image.size == (321, 123)
    assert info.size == len(raw) and 0 < info.header < len(raw)
    result = shaped(raw, mime_type)
    assert not result.is_error, result.text


def test_an_animated_png_passes() -> None:
    from PIL import Image

    frames = [Image.new("RGB", (64, 48), colour) for colour in ("red", "green", "blue")]
    buffer = io.BytesIO()
    frames[0].save(buffer, "PNG", save_all=True, append_images=frames[1:], duration=100)
    assert not shaped(buffer.getvalue(), "image/png").is_error


# ----------------------------------------------------------------------------- Pillow's second opinion


@pytest.mark.parametrize("kind", sorted(DECODER_REFUSES))
def test_an_image_pillow_cannot_read_is_refused(kind: str) -> None:
    builder, mime_type, reason = DECODER_REFUSES[kind]
    raw = builder()
    info = image_info(base64.b64encode(raw).decode(), mime_type)  # the walk alone accepts it
    assert (info.width, info.height) == (8, 8)
    result = shaped(raw, mime_type)
    assert result.is_error and result.error is not None and result.error.kind == "tool_error"
    assert reason in result.text and "return an image written by a standard encoder" in result.text


def test_a_size_pillow_disagrees_with_is_named() -> None:
    data = base64.b64encode(encoded(40, 30, "PNG")).decode()
    info = image_info(data, "image/png")
    assert _decoder_disagrees(data, info) is None
    lie = ImageInfo(info.mime_type, 8, 8, info.size, info.header)
    assert _decoder_disagrees(data, lie) == "its header gives 8x8 px, Pillow reads 40x30 px"


def test_pillow_is_not_made_to_inflate_text_chunks() -> None:
    """70 MiB of zTXt text (Pillow gives up past 64 MiB, after inflating it all) is not shown to
    Pillow: no size is in it, and inflating it would hold the event loop."""
    result = shaped(png_inflating_chunks(), "image/png")
    assert not result.is_error, result.text


WITHOUT_PILLOW = """
import base64, json, sys
from types import SimpleNamespace
sys.modules["PIL"] = None  # as on a server installed without the images extra
from protocol import ToolOutput
from tool_server.executor.output import OutputShaper
limits = SimpleNamespace(max_output_chars=10_000, max_structured_bytes=100_000,
    max_image_bytes=8 * 1024 * 1024, max_image_pixels=300 * 300, max_images_per_result=8)
out = {}
for name, (mime_type, data) in json.load(sys.stdin).items():
    result = OutputShaper(limits).to_result("c", ToolOutput([{"type": "image", "data": data, "mimeType": mime_type}]))
    out[name] = result.text if result.is_error else "ok"
print(json.dumps(out))
"""


def test_the_header_walk_alone_refuses_the_lies_without_pillow() -> None:
    images = {kind: (mime, base64.b64encode(build()).decode()) for kind, (build, mime, _) in HOSTILE.items()}
    images["ordinary"] = ("image/jpeg", base64.b64encode(encoded(64, 48, "JPEG")).decode())
    run = subprocess.run(
        [sys.executable, "-c", WITHOUT_PILLOW],
        input=orjson.dumps(images),
        capture_output=True,
        cwd=REPO,
        timeout=120,
        check=True,
    )
    verdicts = orjson.loads(run.stdout)
    assert verdicts.pop("ordinary") == "ok"
    for kind, text in verdicts.items():
        assert HOSTILE[kind][2] in text, (kind, text)


# ----------------------------------------------------------------------------- through the server


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    tools = [*server_config()["tools"], {"target": f"{__name__}:hostile_image", "toolsets": ["default"]}]
    limits = {"max_image_pixels": MAX_PIXELS, "max_image_bytes": 8 * 1024 * 1024}
    with running_server(server_config(tools=tools, limits=limits)) as srv:
        yield srv


def call(srv: ServerProcess, name: str, arguments: dict[str, Any]) -> Result:
    body = {"calls": [{"call_id": uuid.uuid4().hex, "name": name, "arguments": arguments}]}
    response = httpx.post(srv.url + "/v1/calls", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return decode_results(response.content)[0]


@pytest.mark.parametrize("kind", sorted({**HOSTILE, **DECODER_REFUSES}))
def test_the_server_refuses_a_hostile_image_and_keeps_serving(server: ServerProcess, kind: str) -> None:
    reason = {**HOSTILE, **DECODER_REFUSES}[kind][2]
    result = call(server, "hostile_image", {"kind": kind})
    assert result.is_error and result.error is not None and result.error.kind == "tool_error", result.text
    assert "image 1 of the result is not a PNG or JPEG image" in result.text and reason in result.text
    assert not any(block["type"] == "image" for block in result.content)  # nothing half-sent
    assert call(server, "calculator", {"expression": "6*7"}).text == "42"
    assert httpx.get(server.url + "/healthz", timeout=30).status_code == 200
