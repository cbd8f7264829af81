"""MCP image content: build a block from bytes, and read an image's type and size from its header.

A tool returns an image as an MCP content block ``{"type": "image", "data": <base64>,
"mimeType": "image/png" | "image/jpeg"}``, alone or beside text blocks. The server checks
every such block against its limits (bytes, pixels) before a result leaves it; that check
must not decode the image, so ``image_info`` reads only the header, the way a decoder does:
the PNG chunks up to the first image data chunk, or the JPEG segments up to the first
start of scan, decoding only the pieces of the base64 text that hold them. Stdlib only,
like the rest of ``protocol``.

The header is untrusted: it is read in bounded work (at most ``MAX_HEADER_SEGMENTS``
chunks or segments within ``MAX_HEADER_BYTES``, at most ``MAX_FILL_BYTES`` fill bytes before
a JPEG marker), and a header that could give two sizes (a second PNG ``IHDR``, a second JPEG
frame header, a JPEG marker decoders read differently) is refused rather than read one way.
"""

from __future__ import annotations

import base64
import binascii
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "IMAGE_TYPES",
    "JPEG",
    "MAX_FILL_BYTES",
    "MAX_HEADER_BYTES",
    "MAX_HEADER_SEGMENTS",
    "PNG",
    "ImageInfo",
    "image_block",
    "image_info",
    "sniff",
]

PNG = "image/png"
JPEG = "image/jpeg"
IMAGE_TYPES = (PNG, JPEG)
# Real headers have a handful (JPEG: APPn, DQT, SOF, DHT; an ICC profile split over APP2
# segments adds a few more): this bounds the work a hostile one of tiny segments can cause.
MAX_HEADER_SEGMENTS = 256
MAX_FILL_BYTES = 64  # 0xFF bytes before a JPEG marker (encoders write none)
# Bytes before the image data: EXIF (at most 64 KiB), XMP and an ICC profile fit many times.
# It bounds what a second reader of the header (the server's Pillow check) has to read.
MAX_HEADER_BYTES = 1024 * 1024
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_IMAGE_DATA = (b"IDAT", b"fdAT")  # where a decoder stops reading the header (fdAT: APNG)
# Start-of-frame markers (baseline, progressive, lossless, arithmetic): they carry the size.
# C4 (Huffman tables), C8 (reserved) and CC (arithmetic conditioning) share the range but do not.
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_JPEG_SOS = 0xDA
# The segments a header may hold besides frame headers: DHT, DAC, DQT, DRI, APPn, COM. Both
# libjpeg and Pillow skip them by their length. Anything else before the scan (JPG, JPGn,
# DHP, EXP, DNL, RSTn, TEM, a second SOI) is refused: decoders read it differently (libjpeg
# stops; Pillow reads JPG and JPGn as having no length and DHP as a frame header), so they
# would find different frame headers in the same bytes.
_JPEG_SKIPPED = frozenset({0xC4, 0xCC, 0xDB, 0xDD, 0xFE, *range(0xE0, 0xF0)})


@dataclass(frozen=True, slots=True)
class ImageInfo:
    """What the header says: the type, the size in pixels, and the image's size in bytes."""

    mime_type: str
    width: int
    height: int
    size: int  # decoded bytes
    header: int = 0  # bytes a decoder reads before the image data (PNG up to IDAT, JPEG through SOS)

    @property
    def pixels(self) -> int:
        return self.width * self.height


Read = Callable[[int, int], bytes]  # read(start, count): up to ``count`` bytes from ``start``


class _Base64Bytes:
    """Random access to the bytes behind base64 text, decoding only the characters read.

    Four base64 characters are three bytes, so bytes ``[a, b)`` come from characters
    ``[a // 3 * 4, ceil(b / 3) * 4)``: a header is walked by its chunks' and segments'
    lengths without decoding what lies between them (EXIF blocks, thumbnails, the pixels).
    """

    __slots__ = ("text", "size")

    def __init__(self, text: str, size: int) -> None:
        self.text = text
        self.size = size

    def read(self, start: int, count: int) -> bytes:
        end = min(start + count, self.size)
        if start >= end:
            return b""
        first, last = start // 3, -(-end // 3)
        try:
            decoded = binascii.a2b_base64(self.text[first * 4 : last * 4], strict_mode=True)
        except binascii.Error as exc:
            raise ValueError(f"image data is not valid base64: {exc}") from None
        return decoded[start - first * 3 : end - first * 3]


def _sniff(read: Read) -> tuple[str, int, int, int]:
    """``(mime type, width, height, header bytes)``, or ValueError saying what is wrong."""
    head = read(0, 8)
    if head == _PNG_SIGNATURE:
        return PNG, *_png_size(read)
    if head.startswith(b"\xff\xd8"):
        return JPEG, *_jpeg_size(read)
    raise ValueError("the data is neither PNG nor JPEG (unknown signature)")


def sniff(raw: bytes) -> tuple[str, int, int]:
    """``(mime type, width, height)`` of encoded image bytes; ValueError if not PNG or JPEG."""
    return _sniff(lambda start, count: raw[start : start + count])[:3]


def _png_size(read: Read) -> tuple[int, int, int]:
    """Walk the chunks from the signature to the first image data chunk.

    The PNG spec wants exactly one IHDR, first; Pillow takes the last one it meets before
    the image data, so a second one (a larger size behind a small one) is refused.
    """
    ihdr = read(8, 8 + 13)
    if ihdr[4:8] != b"IHDR" or len(ihdr) < 21:
        raise ValueError("PNG data does not start with a complete IHDR chunk")
    if ihdr[:4] != b"\x00\x00\x00\x0d":
        raise ValueError(
            f"PNG data is corrupt: its IHDR chunk is {struct.unpack('>I', ihdr[:4])[0]} bytes, not 13"
        )
    width, height = struct.unpack(">II", ihdr[8:16])
    position = 8 + 12 + 13
    for _ in range(MAX_HEADER_SEGMENTS):
        chunk = read(position, 8)
        if len(chunk) < 8:
            raise ValueError("PNG data ends before its image data (no IDAT chunk)")
        (length,), kind = struct.unpack(">I", chunk[:4]), chunk[4:]
        if not kind.isalpha() or length > 0x7FFFFFFF:
            raise ValueError(f"PNG data is corrupt: no chunk at byte {position}")
        if kind in _PNG_IMAGE_DATA:
            return width, height, position + 8
        if kind == b"IHDR":
            raise ValueError("PNG data has a second IHDR chunk (a second size): refused as ambiguous")
        if kind == b"IEND":
            raise ValueError("PNG data ends before its image data (IEND before any IDAT chunk)")
        position += 12 + length
        _check_header_bytes("PNG", position)
    raise ValueError(f"PNG data has more than {MAX_HEADER_SEGMENTS} chunks before its image data: refused")


def _jpeg_size(read: Read) -> tuple[int, int, int]:
    """Walk the segments from the start of the image to the start of scan.

    Exactly one frame header may come first: libjpeg refuses a second one and Pillow takes
    the last, so a small frame header in front of a large one is refused, not believed.
    """
    position = 2
    frame: tuple[int, int] | None = None
    for _ in range(MAX_HEADER_SEGMENTS):
        marker, position = _jpeg_marker(read, position, frame is not None)
        if marker in (_JPEG_SOS, 0xD9) and frame is None:
            raise ValueError("JPEG data has no frame header before its image data")
        if marker != _JPEG_SOS and marker not in _JPEG_SOF and marker not in _JPEG_SKIPPED:
            raise ValueError(
                f"JPEG data has marker 0xFF{marker:02X} before its image data, where decoders differ"
            )
        segment = read(position, 8 if marker in _JPEG_SOF else 2)
        if len(segment) < 2:
            raise ValueError(_jpeg_ends(frame is not None))
        (length,) = struct.unpack(">H", segment[:2])
        if length < 2:
            raise ValueError(f"JPEG data is corrupt: a segment of length {length} at byte {position}")
        if marker == _JPEG_SOS and frame is not None:  # (without a frame: refused above)
            return *frame, position + length
        if marker in _JPEG_SOF:
            if frame is not None:
                raise ValueError("JPEG data has a second frame header (a second size): refused as ambiguous")
            if len(segment) < 8:
                raise ValueError(_jpeg_ends(False))
            height, width, components = struct.unpack(">HHB", segment[3:8])
            if length != 8 + 3 * components:
                raise ValueError(
                    f"JPEG data is corrupt: a frame header of {length} bytes for {components} components"
                )
            frame = width, height
        position += length
        _check_header_bytes("JPEG", position)
    raise ValueError(f"JPEG data has more than {MAX_HEADER_SEGMENTS} segments before its image data: refused")


def _jpeg_marker(read: Read, position: int, framed: bool) -> tuple[int, int]:
    """The marker at ``position`` (after at most ``MAX_FILL_BYTES`` fill bytes), and where its segment starts."""
    chunk = read(position, MAX_FILL_BYTES + 2)
    if not chunk:
        raise ValueError(_jpeg_ends(framed))
    if chunk[0] != 0xFF:
        raise ValueError(f"JPEG data is corrupt: no marker at byte {position}")
    rest = chunk.lstrip(b"\xff")
    if not rest:
        if len(chunk) < MAX_FILL_BYTES + 2:
            raise ValueError(_jpeg_ends(framed))
        raise ValueError(f"JPEG data has more than {MAX_FILL_BYTES} fill bytes at byte {position}: refused")
    return rest[0], position + len(chunk) - len(rest) + 1


def _check_header_bytes(kind: str, position: int) -> None:
    if position > MAX_HEADER_BYTES:
        raise ValueError(
            f"{kind} data has more than {MAX_HEADER_BYTES} bytes before its image data (metadata such "
            "as EXIF, XMP, text or an ICC profile): refused; strip the metadata"
        )


def _jpeg_ends(framed: bool) -> str:
    if framed:
        return "JPEG data ends before its image data (no start of scan)"
    return "JPEG data ends before its frame header"


def _decoded_size(data: str) -> int:
    if len(data) % 4:
        raise ValueError(f"the base64 text has {len(data)} characters, not a multiple of 4")
    return len(data) // 4 * 3 - (data[-2:].count("=") if data else 0)


def image_info(data: str, mime_type: str | None = None) -> ImageInfo:
    """Type and size of a base64 image, reading its header only; ValueError says what is wrong.

    Only the base64 characters that hold the header's structure are decoded: the few bytes
    at each chunk's or segment's start up to the image data, at most
    ``MAX_HEADER_SEGMENTS`` of them. ``mime_type``, when given, must match what the header
    is (a PNG sent as image/jpeg is refused: a client would hand it to the wrong decoder).
    """
    if not isinstance(data, str) or not data:
        raise ValueError("image data must be a non-empty base64 string")
    size = _decoded_size(data)
    kind, width, height, header = _sniff(_Base64Bytes(data, size).read)
    if mime_type is not None and mime_type != kind:
        raise ValueError(f"image declared as {mime_type!r} is {kind}")
    if width == 0 or height == 0:
        raise ValueError(f"image has no pixels ({width}x{height})")
    return ImageInfo(kind, width, height, size, header)


def image_block(raw: bytes, mime_type: str | None = None) -> dict[str, Any]:
    """An MCP image content block for encoded image bytes (the type read from them when not given)."""
    if mime_type is None:
        mime_type = sniff(raw)[0]
    if mime_type not in IMAGE_TYPES:
        raise ValueError(f"image type {mime_type!r} is not one of {', '.join(IMAGE_TYPES)}")
    return {"type": "image", "data": base64.b64encode(raw).decode("ascii"), "mimeType": mime_type}
