"""The wire contract between trainers, the tool server and the tools.

Tiny on purpose: stdlib + orjson only, so the trainer client and the tools can
depend on it without pulling in the server.
"""

from protocol.errors import ErrorKind, ProtocolError, ToolError
from protocol.messages import (
    Call,
    ErrorInfo,
    Result,
    VerifyRequest,
    VerifyResult,
    decode_calls,
    decode_results,
    decode_verify_requests,
    decode_verify_results,
    encode,
    new_call_id,
    new_session_id,
)
from protocol.tool import (
    CALL_ID_META_KEY,
    ENV_META_KEY,
    INSTANCE_META_KEY,
    META_KEY,
    SESSION_META_KEY,
    SessionState,
    ToolContext,
    ToolMeta,
    ToolOutput,
    get_tool_meta,
    tool,
    verifier,
)

__all__ = [
    "CALL_ID_META_KEY",
    "ENV_META_KEY",
    "INSTANCE_META_KEY",
    "META_KEY",
    "SESSION_META_KEY",
    "Call",
    "ErrorInfo",
    "ErrorKind",
    "ProtocolError",
    "Result",
    "SessionState",
    "ToolContext",
    "ToolError",
    "ToolMeta",
    "ToolOutput",
    "VerifyRequest",
    "VerifyResult",
    "decode_calls",
    "decode_results",
    "decode_verify_requests",
    "decode_verify_results",
    "encode",
    "get_tool_meta",
    "new_call_id",
    "new_session_id",
    "tool",
    "verifier",
]
