"""Output shaping: whatever a tool returns, as a ``Result`` within the server's output limits.

Text is cut at ``limits.max_output_chars`` with a visible marker; structured output over
``limits.max_structured_bytes`` is dropped with a note; images cannot be cut, so one over
a limit (count, pixels, bytes) fails the call with a message saying which limit.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Iterable
from typing import Any

import orjson
import pydantic

from protocol import ErrorKind, Result, ToolOutput, VerifyResult
from protocol.images import image_info
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
        if type(output) is dict:  # the common case first
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

        Sizes come from each image's header (``protocol.images.image_info``): nothing is
        decoded. An image cannot be cut like text, so one over a limit fails the whole call.
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
                info = image_info(block.get("data"), mime_type)  # type: ignore[arg-type]
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
        return None


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
