"""A bug of ours met while answering: logged once under a fresh request id, which the answer names.

The client sees no traceback (it could tell internals), only the id; the operator finds the
traceback in the log under it. ``POST`` handlers (app.py) and stream frames (stream.py) both
come here, so the id and the wording are the same on every path.
"""

from __future__ import annotations

import logging
import uuid

__all__ = ["internal_error_message", "log_internal_error"]


def log_internal_error(log: logging.Logger, where: str, exc: BaseException | None = None) -> str:
    """Log the error being handled (or ``exc``) as met on ``where``; the request id it is under."""
    request_id = uuid.uuid4().hex[:12]
    log.error(
        "unhandled error on %s (request %s)", where, request_id, exc_info=exc if exc is not None else True
    )
    return request_id


def internal_error_message(request_id: str, doing: str = "") -> str:
    """What the client is told: a bug of ours (``doing``: what it interrupted), and the id."""
    return f"internal server error (a bug in toolfactory){doing}; the server log has it under request {request_id}"
