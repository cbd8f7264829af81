"""OpenAPI 3.1 description of the HTTP API (the MCP endpoint is described by MCP itself)."""

from __future__ import annotations

from functools import cache
from typing import Any

from protocol import ErrorKind

ERROR = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {"kind": {"type": "string"}, "message": {"type": "string"}},
            "required": ["kind", "message"],
        }
    },
    "required": ["error"],
}
ID = {"type": "string", "minLength": 1, "maxLength": 256}
# The environment task a session plays: its world starts from the task's state (docs/environments.md).
ENVIRONMENT = {
    "type": "object",
    "properties": {"pack": {"type": "string"}, "task": {"type": "string"}},
    "required": ["pack", "task"],
    "additionalProperties": False,
}
CALL = {
    "type": "object",
    "properties": {
        "call_id": {**ID, "description": "Client-chosen unique id; the idempotency key."},
        "name": {"type": "string", "minLength": 1, "description": "Tool name."},
        "arguments": {"type": "object", "description": "Tool arguments, per the tool's inputSchema."},
        "session": {**ID, "description": "Trajectory session id, for stateful tools."},
    },
    "required": ["call_id", "name"],
}
RESULT = {
    "type": "object",
    "properties": {
        "call_id": {"type": "string"},
        "content": {"type": "array", "items": {"type": "object"}, "description": "MCP content blocks."},
        "structured": {"description": "Structured output, if the tool has any."},
        "is_error": {"type": "boolean"},
        "error": {
            "type": ["object", "null"],
            "properties": {
                "kind": {
                    "enum": [kind.value for kind in ErrorKind],
                },
                "message": {"type": "string"},
            },
        },
        "elapsed_ms": {"type": "number"},
        "cached": {"type": "boolean"},
    },
    "required": ["call_id", "content", "is_error"],
}
VERIFY_REQUEST = {
    "type": "object",
    "properties": {
        "verifier": {"type": "string", "minLength": 1},
        "response": {"type": "string", "description": "Final model output."},
        "messages": {"type": "array", "items": {"type": "object"}},
        "ground_truth": {},
        "arguments": {"type": "object"},
        "session": ID,
        "request_id": ID,
        "response_start": {
            "type": "integer",
            "minimum": 0,
            "description": "Index in messages of the first message of the rollout; earlier ones are the"
            " prompt (worked examples included) and never count as the model's answers or calls.",
        },
    },
    "required": ["verifier"],
}
VERIFY_RESULT = {
    "type": "object",
    "properties": {
        "score": {"type": "number"},
        "components": {"type": "object"},
        "details": {"type": "object"},
        "request_id": {"type": ["string", "null"]},
        "is_error": {"type": "boolean"},
        "error": {"type": ["object", "null"]},
    },
    "required": ["score"],
}


# OpenAPI has no words for WebSocket frames: the stream's are described here (api/stream.py).
STREAM_DESCRIPTION = (
    "GET /v1/stream opens a WebSocket for callers that make one call at a time (an agent "
    "framework, an environment step loop). The handshake's bearer token and X-Toolfactory-Instance "
    "header hold for every frame. Client frames (text or binary JSON): a POST /v1/calls body "
    '{"calls": [call, ...]}, or {"release": "<session id>"}. For each calls frame the server sends '
    '{"results": [...]}, byte for byte what POST /v1/calls answers, when the calls of that frame are done: '
    "frames run concurrently, so match results by call_id. Where the POST would answer 429 or 413, "
    "each call gets a failure result of kind overloaded (retry it with the same call_id) or too_large. "
    'A release is answered {"released": id} or {"error": {...}, "release": id}; a frame that does '
    'not decode {"error": {"kind": "bad_request", ...}}. A frame over limits.max_request_bytes closes '
    "the connection with code 1009; at most limits.max_calls_per_batch frames are in flight per "
    "connection (the server stops reading beyond). Refusals (401, 403, 421) come at the handshake."
)


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": schema}}}


# A restarted replica refuses the sessions of the process a client names (docs/scaling.md).
INSTANCE_PARAMETER = {
    "name": "X-Toolfactory-Instance",
    "in": "header",
    "required": False,
    "description": "The server process the client expects its sessions on (from an earlier answer's "
    "header): sessions this process does not hold then get unknown_session instead of starting empty",
    "schema": {"type": "string"},
}
INSTANCE_ANSWER = {
    "X-Toolfactory-Instance": {
        "description": "This server process's instance id",
        "schema": {"type": "string"},
    }
}


def _errors(*codes: int) -> dict[str, Any]:
    text = {
        400: "Malformed body",
        401: "Missing or bad token",
        403: "The token is scoped to some toolsets; this needs a token for every toolset",
        404: "Not found",
        409: "Conflict: the session id is taken, or the session already plays another task",
        413: "Body or batch too large",
        429: "Overloaded; retry after Retry-After seconds",
        421: "The Host is not a name this server answers to (DNS rebinding guard)",
        426: "Not a WebSocket handshake",
        503: "Not ready",
    }
    return {str(c): {"description": text[c], **_json(ERROR)} for c in codes}


@cache
def openapi_spec() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {"title": "toolfactory tool server", "version": "1", "description": STREAM_DESCRIPTION},
        "paths": {
            "/v1/calls": {
                "post": {
                    "summary": "Run a batch of tool calls; one result per call, in order",
                    "parameters": [INSTANCE_PARAMETER],
                    "requestBody": {
                        "required": True,
                        **_json(
                            {
                                "type": "object",
                                "properties": {"calls": {"type": "array", "items": CALL}},
                                "required": ["calls"],
                            }
                        ),
                    },
                    "responses": {
                        "200": {
                            "description": "Results",
                            "headers": INSTANCE_ANSWER,
                            **_json(
                                {
                                    "type": "object",
                                    "properties": {"results": {"type": "array", "items": RESULT}},
                                    "required": ["results"],
                                }
                            ),
                        },
                        **_errors(400, 401, 413, 429),
                    },
                }
            },
            "/v1/stream": {
                "get": {
                    "summary": "A WebSocket carrying /v1/calls bodies as frames, answered as they finish "
                    "(frames: see info.description)",
                    "parameters": [INSTANCE_PARAMETER],
                    "responses": {
                        "101": {
                            "description": "Switching Protocols: the WebSocket is open",
                            "headers": INSTANCE_ANSWER,
                        },
                        **_errors(401, 421, 426),
                    },
                }
            },
            "/v1/verify": {
                "post": {
                    "summary": "Score a batch of trajectories with named verifiers",
                    "parameters": [INSTANCE_PARAMETER],
                    "requestBody": {
                        "required": True,
                        **_json(
                            {
                                "type": "object",
                                "properties": {"requests": {"type": "array", "items": VERIFY_REQUEST}},
                                "required": ["requests"],
                            }
                        ),
                    },
                    "responses": {
                        "200": {
                            "description": "Scores",
                            "headers": INSTANCE_ANSWER,
                            **_json(
                                {
                                    "type": "object",
                                    "properties": {"results": {"type": "array", "items": VERIFY_RESULT}},
                                    "required": ["results"],
                                }
                            ),
                        },
                        **_errors(400, 401, 413, 429),
                    },
                }
            },
            "/v1/tools": {
                "get": {
                    "summary": "Tool descriptors (MCP Tool objects with _meta.toolfactory)",
                    "parameters": [
                        {"name": "toolset", "in": "query", "required": False, "schema": {"type": "string"}}
                    ],
                    "responses": {
                        "200": {
                            "description": "Tools",
                            **_json(
                                {
                                    "type": "object",
                                    "properties": {"tools": {"type": "array", "items": {"type": "object"}}},
                                    "required": ["tools"],
                                }
                            ),
                        },
                        **_errors(401, 404),
                    },
                }
            },
            "/v1/sessions": {
                "post": {
                    "summary": "Open a session (optional: choose its id, bind it to an environment task)",
                    "requestBody": {
                        "required": False,
                        **_json(
                            {"type": "object", "properties": {"session": ID, "environment": ENVIRONMENT}}
                        ),
                    },
                    "responses": {
                        "201": {
                            "description": "Session",
                            **_json(
                                {
                                    "type": "object",
                                    "properties": {
                                        "session": {"type": "string"},
                                        "ttl_s": {"type": "number"},
                                        "environment": ENVIRONMENT,
                                    },
                                    "required": ["session"],
                                }
                            ),
                        },
                        **_errors(400, 401, 404, 409, 429),
                    },
                }
            },
            "/v1/sessions/renew": {
                "post": {
                    "summary": "Keep sessions alive: restart the TTL of the caller's open sessions among the ids "
                    "(the trainer client sends this for live trajectories every ttl_s / 3); never opens one",
                    "requestBody": {
                        "required": True,
                        **_json(
                            {
                                "type": "object",
                                "properties": {"sessions": {"type": "array", "items": ID}},
                                "required": ["sessions"],
                            }
                        ),
                    },
                    "responses": {
                        "200": {
                            "description": "How many were renewed; the ids the caller holds no open session of, "
                            "and among them those it held that were released or expired (closed: gone for good)",
                            "headers": INSTANCE_ANSWER,
                            **_json(
                                {
                                    "type": "object",
                                    "properties": {
                                        "renewed": {"type": "integer"},
                                        "unknown": {"type": "array", "items": {"type": "string"}},
                                        "closed": {"type": "array", "items": {"type": "string"}},
                                        "ttl_s": {"type": "number"},
                                    },
                                    "required": ["renewed", "unknown", "closed", "ttl_s"],
                                }
                            ),
                        },
                        **_errors(400, 401, 413),
                    },
                }
            },
            "/v1/sessions/{session_id}": {
                "delete": {
                    "summary": "Release a session and everything it holds",
                    "parameters": [
                        {"name": "session_id", "in": "path", "required": True, "schema": {"type": "string"}}
                    ],
                    "responses": {
                        "200": {"description": "Released", **_json({"type": "object"})},
                        **_errors(401, 404),
                    },
                }
            },
            "/retrieve": {
                "post": {
                    "summary": "Search-R1 compatible retrieval",
                    "requestBody": {
                        "required": True,
                        **_json(
                            {
                                "type": "object",
                                "properties": {
                                    "queries": {"type": "array", "items": {"type": "string"}},
                                    "topk": {"type": "integer", "minimum": 1, "maximum": 100},
                                    "return_scores": {"type": "boolean"},
                                },
                                "required": ["queries"],
                            }
                        ),
                    },
                    "responses": {
                        "200": {
                            "description": "Documents per query",
                            **_json(
                                {
                                    "type": "object",
                                    "properties": {"result": {"type": "array"}},
                                    "required": ["result"],
                                }
                            ),
                        },
                        **_errors(400, 401, 404, 413, 429),
                    },
                }
            },
            "/healthz": {"get": {"summary": "Liveness", "responses": {"200": {"description": "Alive"}}}},
            "/readyz": {
                "get": {
                    "summary": "Readiness (tools started, upstreams healthy); each check's findings only "
                    "with a token for every toolset, or on a server without tokens",
                    "responses": {"200": {"description": "Ready"}, **_errors(503)},
                }
            },
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics (they name every tool: a token for every toolset)",
                    "responses": {"200": {"description": "Metrics"}, **_errors(401, 403)},
                }
            },
        },
    }
