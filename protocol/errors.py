"""The closed set of error kinds a call result can carry."""

from __future__ import annotations

from enum import StrEnum


class ErrorKind(StrEnum):
    """Why a call did not produce a normal result. A closed set: clients switch on it."""

    UNKNOWN_TOOL = "unknown_tool"  # no tool of that name (in the caller's toolsets)
    INVALID_ARGUMENTS = "invalid_arguments"  # arguments do not match the input schema
    TIMEOUT = "timeout"  # the call ran past its deadline and was cancelled
    TOOL_ERROR = "tool_error"  # the tool ran and failed (exception, sandbox violation)
    OVERLOADED = "overloaded"  # queue full; retry later with the same call_id
    CANCELLED = "cancelled"  # cancelled by the client or by server shutdown
    UNAUTHORIZED = "unauthorized"  # token missing, wrong, or not allowed this toolset
    TOO_LARGE = "too_large"  # request or output over a configured limit
    BAD_REQUEST = "bad_request"  # the call itself is malformed (missing name, bad id)
    UNAVAILABLE = "unavailable"  # an upstream server or model endpoint is down
    # The session's state is not there: released, expired, or its replica died or restarted.
    UNKNOWN_SESSION = "unknown_session"
    # The replica died with the call in flight; it may or may not have run (never retried elsewhere).
    OUTCOME_UNKNOWN = "outcome_unknown"


class ToolError(Exception):
    """Raise from a tool to return an error result of a specific kind.

    Any other exception raised by a tool becomes ``tool_error`` with its message.
    """

    def __init__(self, message: str, kind: ErrorKind = ErrorKind.TOOL_ERROR) -> None:
        super().__init__(message)
        self.kind = ErrorKind(kind)
        self.message = message


class ProtocolError(ValueError):
    """A request or response body does not follow the contract.

    ``message`` says what was wrong and where, so it can go straight to the user.
    """

    def __init__(self, message: str, kind: ErrorKind = ErrorKind.BAD_REQUEST) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
