"""Output shaping: whatever a tool returns, as a ``Result`` within the server's output limits.

Text is cut at ``limits.max_output_chars`` with a visible marker; structured output over
``limits.max_structured_bytes`` is dropped with a note; images cannot be cut, so one over
a limit (count, pixels, bytes) fails the call with a message saying which limit.
"""

from __future__ import annotations

import binascii
import dataclasses
import functools
import io
import operator
import struct
from collections.abc import Callable, Iterable
from typing import Any

import orjson
import pydantic

from protocol import ErrorKind, Result, ToolOutput, VerifyResult
from protocol.images import JPEG, PNG, ImageInfo, image_info
from protocol.messages import ErrorInfo

__all__ = ["TRUNCATION_MARKER", "OutputShaper"]

TRUNCATION_MARKER = "\n…[output truncated: {dropped} of {total} characters omitted]"
NOT_JSON = "structured output was not JSON-serialisable and was dropped"
TOO_LARGE = "structured output of {size} bytes exceeded the limit and was dropped"


class OutputShaper:
    """Turns tool outputs into results under one set of limits (``config.limits``)."""

    __slots__ = (
        "max_output_chars",
        "max_structured_bytes",
        "max_image_bytes",
        "max_image_pixels",
        "max_images",
    )

    def __init__(self, limits: Any) -> None:
        self.max_output_chars = limits.max_output_chars
        self.max_structured_bytes = limits.max_structured_bytes
        self.max_image_bytes = limits.max_image_bytes
        self.max_image_pixels = limits.max_image_pixels
        self.max_images = limits.max_images_per_result

    def to_result(self, call_id: str, output: Any) -> Result:
        if type(output) is dict:  # the common case first, in one step
            try:
                encoded = orjson.dumps(output)
            except TypeError:
                encoded = None
            if encoded is not None and len(encoded) <= self.max_structured_bytes:
                text = encoded.decode()
                if len(text) > self.max_output_chars:
                    text = self._cap(text)
                return Result(call_id, [{"type": "text", "text": text}], output)
            structured, text = self._structured(output)
            return Result(call_id, [{"type": "text", "text": self._cap(text)}], structured)
        if isinstance(output, str):
            return Result(call_id, [{"type": "text", "text": self._cap(output)}])
        if isinstance(output, ToolOutput):
            content = [self._cap_block(b) for b in output.content]
            refused = self._image_problem(content)
            if refused is not None:
                return Result.failure(call_id, *refused)
            structured, text = self._structured(output.structured)
            if not content and structured is not None:
                content = [{"type": "text", "text": self._cap(text)}]
            error = ErrorInfo(ErrorKind.TOOL_ERROR, _text_of(content)) if output.is_error else None
            return Result(call_id, content, structured, output.is_error, error)
        if isinstance(output, Result):  # already shaped; a copy: the tool may return it again
            return self.checked(dataclasses.replace(output, call_id=call_id))
        if output is None:
            return Result(call_id, [{"type": "text", "text": ""}])
        if isinstance(output, VerifyResult):
            output = {"score": output.score, "components": output.components, "details": output.details}
        elif isinstance(output, int | float | bool | list):
            output = {"result": output}  # MCP structured content must be an object
        elif dataclasses.is_dataclass(output) and not isinstance(output, type):
            output = dataclasses.asdict(output)
        elif isinstance(output, pydantic.BaseModel):
            output = output.model_dump(mode="json")
        structured, text = self._structured(output)
        return Result(call_id, [{"type": "text", "text": self._cap(text)}], structured)

    def checked(self, result: Result) -> Result:
        """A shaped result (an upstream server's, a tool's own) under the same limits as any
        output: long text cut, structured output over its limit (or not JSON) dropped with a
        note, or a failure saying why its images may not go out."""
        content = [self._cap_block(b) for b in result.content]
        refused = self._image_problem(content)
        if refused is not None:
            return Result.failure(result.call_id, *refused)
        structured = result.structured
        if structured is not None:
            structured, encoded = _as_json(structured, self.max_structured_bytes)
            if encoded is None:
                structured = {"note": NOT_JSON}
            elif len(encoded) > self.max_structured_bytes:
                structured = {"note": TOO_LARGE.format(size=len(encoded))}
        if structured is result.structured and all(map(operator.is_, content, result.content)):
            return result
        return dataclasses.replace(result, content=content, structured=structured)

    def _structured(self, value: Any) -> tuple[Any, str]:
        """The structured output (or a note if it is too large) and its JSON text."""
        if value is None:
            return None, ""
        value, encoded = _as_json(value, self.max_structured_bytes)
        if encoded is None:
            return {"note": NOT_JSON}, str(value)
        if len(encoded) > self.max_structured_bytes:
            # the whole text: _cap cuts it, and its marker tells the true length
            return {"note": TOO_LARGE.format(size=len(encoded))}, encoded.decode()
        return value, encoded.decode()

    def _cap(self, text: str) -> str:
        limit = self.max_output_chars
        if len(text) <= limit:
            return text
        marker = TRUNCATION_MARKER.format(dropped=len(text) - limit, total=len(text))
        return text[:limit] + marker

    def _cap_block(self, block: dict[str, Any]) -> dict[str, Any]:
        if block.get("type") == "text" and len(block.get("text", "")) > self.max_output_chars:
            return {**block, "text": self._cap(block["text"])}
        return block

    def _image_problem(self, content: list[dict[str, Any]]) -> tuple[ErrorKind, str] | None:
        """Why the result's images may not leave the server (None: they may, or there are none).

        Sizes come from each image's header (``protocol.images.image_info``, bounded work, a
        header that could give two sizes refused), and where Pillow is installed it must read
        the same size: no pixel is decoded. An image cannot be cut like text, so one over a
        limit fails the whole call.
        """
        images = [block for block in content if block.get("type") == "image"]
        if not images:
            return None
        if len(images) > self.max_images:
            return ErrorKind.TOO_LARGE, (
                f"the tool returned {len(images)} images; the limit is {self.max_images} per result "
                "(limits.max_images_per_result)"
            )
        for number, block in enumerate(images, 1):
            try:
                mime_type = block.get("mimeType")
                if not isinstance(mime_type, str):  # MCP requires it: clients pick the decoder by it
                    raise ValueError("the block has no mimeType")
                data: str = block.get("data")  # type: ignore[assignment]
                info = image_info(data, mime_type)
            except ValueError as exc:
                return ErrorKind.TOOL_ERROR, f"image {number} of the result is not a PNG or JPEG image: {exc}"
            what = f"image {number} of the result ({info.mime_type}, {info.width}x{info.height} px, {info.size} bytes)"
            if info.pixels > self.max_image_pixels:
                return ErrorKind.TOO_LARGE, (
                    f"{what} is over the limit of {self.max_image_pixels} pixels (limits.max_image_pixels); "
                    "return a smaller image or a crop"
                )
            if info.size > self.max_image_bytes:
                return ErrorKind.TOO_LARGE, (
                    f"{what} is over the limit of {self.max_image_bytes} bytes (limits.max_image_bytes); "
                    "return a smaller image or a crop"
                )
            disagreement = _decoder_disagrees(data, info)  # last: an image refused anyway is not read twice
            if disagreement is not None:
                return ErrorKind.TOOL_ERROR, (
                    f"image {number} of the result is not a PNG or JPEG image every decoder reads alike: "
                    f"{disagreement}; return an image written by a standard encoder"
                )
        return None


# PNG chunks Pillow inflates (up to 1 MiB each) while reading a header: none carries a size,
# so they are left out of what Pillow is shown, or a few KiB of them would stall the loop.
_INFLATED_PNG_CHUNKS = (b"iCCP", b"zTXt", b"iTXt")


@functools.cache
def _pillow_readers() -> dict[str, Callable[[io.BytesIO], Any]] | None:
    """Pillow's PNG and JPEG header readers, or None without Pillow (the ``images`` extra)."""
    try:
        from PIL import JpegImagePlugin, PngImagePlugin
    except ImportError:
        return None
    return {PNG: PngImagePlugin.PngImageFile, JPEG: JpegImagePlugin.JpegImageFile}


def _decoder_disagrees(data: str, info: ImageInfo) -> str | None:
    """Why Pillow, reading the same header, would not decode a ``info.width`` x ``info.height``
    image (None: it agrees, or Pillow is not installed).

    A second opinion on ``image_info``'s: the size that counts is the one a decoder
    allocates. Pillow is shown only the header (up to the PNG IDAT chunk, through the JPEG
    start of scan), read without decoding pixels.
    """
    readers = _pillow_readers()
    if readers is None:
        return None
    try:
        header = binascii.a2b_base64(data[: -(-info.header // 3) * 4], strict_mode=True)[: info.header]
    except binascii.Error as exc:  # image_info decoded only the windows holding markers
        return f"its header is not valid base64 ({exc})"
    if info.mime_type == PNG:
        header = _without_inflated_chunks(header)
    try:
        with readers[info.mime_type](io.BytesIO(header)) as image:
            width, height = image.size
    except Exception as exc:  # noqa: BLE001 (untrusted bytes in a third-party parser: any failure is a refusal)
        return f"Pillow cannot read its header ({type(exc).__name__}: {exc})"
    if (width, height) != (info.width, info.height):
        return f"its header gives {info.width}x{info.height} px, Pillow reads {width}x{height} px"
    return None


def _without_inflated_chunks(header: bytes) -> bytes:
    """A PNG header (as ``image_info`` walked it, ending at the IDAT chunk's own header)
    without the chunks Pillow would inflate."""
    parts = [header[:8]]
    position = 8
    while position < len(header):
        (length,) = struct.unpack(">I", header[position : position + 4])
        end = position + 12 + length
        if header[position + 4 : position + 8] not in _INFLATED_PNG_CHUNKS:
            parts.append(header[position:end])
        position = end
    return b"".join(parts)


def _as_json(value: Any, limit: int) -> tuple[Any, bytes | None]:
    """The value as JSON's own types, and its JSON (None: JSON cannot hold it).

    numpy values (model code returns them) are written by orjson, but not by the MCP
    SDK's serialiser: they are read back as plain numbers and lists. Other values are
    kept as they are, so the common case costs one encoding. Output over ``limit`` bytes,
    which the caller drops, is not read back.
    """
    try:
        return value, orjson.dumps(value)
    except TypeError:
        pass
    try:
        encoded = orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError:
        return value, None
    return (orjson.loads(encoded) if len(encoded) <= limit else value), encoded


def _text_of(content: Iterable[dict[str, Any]]) -> str:
    return "\n".join(b.get("text", "") for b in content if b.get("type") == "text")
