"""A minimal OpenAI-compatible chat endpoint backed by a real small model, for tests.

``POST /v1/chat/completions`` renders the messages with the model's chat template and
generates with transformers (greedy at temperature 0, sampled otherwise). ``Faults``
makes the endpoint fail or hang on purpose, so the ``llm`` tool's retry, timeout and
``unavailable`` paths are exercised against a real HTTP server rather than a mock.

``serve_in_thread`` runs any ASGI app under a real uvicorn on an ephemeral loopback
port in a background thread; the upstream MCP tests reuse it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


@dataclass
class Faults:
    """What the endpoint does wrong, set by a test and read per request.

    ``fail_next``: answer that many requests with ``fail_status`` before behaving.
    ``hang``: hold every request open (until the server stops) without answering.
    """

    fail_next: int = 0
    fail_status: int = 503
    retry_after: float | None = None
    hang: bool = False
    requests: int = 0  # requests seen, including failed ones
    in_flight: int = 0
    max_in_flight: int = 0  # the most requests open at once: shows a client's concurrency bound
    bodies: list[dict[str, Any]] = field(default_factory=list)

    def reset(self) -> None:
        self.fail_next, self.fail_status, self.retry_after, self.hang = 0, 503, None, False
        self.requests = self.in_flight = self.max_in_flight = 0
        self.bodies.clear()


class ChatModel:
    """A causal LM plus tokenizer, generating one chat completion at a time."""

    def __init__(self, tokenizer: Any, model: Any, name: str = "smollm2-135m-instruct") -> None:
        self.tokenizer = tokenizer
        self.model = model
        self.name = name
        self._lock = threading.Lock()  # one generate() at a time: torch on 2 cores gains nothing from more

    def generate(
        self,
        messages: list[dict[str, Any]],
        max_tokens: int,
        temperature: float,
        stop: list[str] | None = None,
        seed: int | None = None,
    ) -> dict[str, Any]:
        import torch

        inputs = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        prompt_len = int(inputs["input_ids"].shape[1])
        sampling: dict[str, Any] = {"do_sample": temperature > 0}
        if temperature > 0:
            sampling.update(temperature=temperature, top_k=0, top_p=1.0)
        with self._lock, torch.no_grad():
            if seed is not None:
                torch.manual_seed(seed)
            out = self.model.generate(
                **inputs,
                max_new_tokens=max_tokens,
                pad_token_id=self.tokenizer.pad_token_id,
                eos_token_id=self.tokenizer.eos_token_id,
                **sampling,
            )
        new_ids = out[0, prompt_len:].tolist()
        hit_eos = bool(new_ids) and new_ids[-1] == self.tokenizer.eos_token_id
        text = self.tokenizer.decode(new_ids, skip_special_tokens=True)
        finish = "stop" if hit_eos else "length"
        for marker in stop or []:
            cut = text.find(marker)
            if cut >= 0:
                text, finish = text[:cut], "stop"
        return {
            "text": text,
            "prompt_tokens": prompt_len,
            "completion_tokens": len(new_ids),
            "finish": finish,
        }


@functools.cache
def shared_chat_model(name: str = "smollm2") -> ChatModel:
    """The packaged SmolLM2-135M-Instruct, loaded once per test process."""
    from trainer_client.backends.models import load_model

    tokenizer, model = load_model(name, device="cpu")
    return ChatModel(tokenizer, model)


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status)


def create_app(model: ChatModel, faults: Faults | None = None, api_key: str | None = None) -> Starlette:
    """The ASGI app: ``/v1/chat/completions`` and ``/v1/models``."""
    faults = faults if faults is not None else Faults()
    stopping = asyncio.Event()

    async def completions(request: Request) -> Response:
        faults.requests += 1
        faults.in_flight += 1
        faults.max_in_flight = max(faults.max_in_flight, faults.in_flight)
        try:
            return await answer(request)
        finally:
            faults.in_flight -= 1

    async def answer(request: Request) -> Response:
        if api_key is not None and request.headers.get("authorization") != f"Bearer {api_key}":
            return _error(401, "invalid API key", "authentication_error")
        if faults.hang:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), timeout=300)
            return _error(503, "server shutting down", "server_error")
        if faults.fail_next > 0:
            faults.fail_next -= 1
            headers = {"retry-after": str(faults.retry_after)} if faults.retry_after is not None else None
            response = _error(faults.fail_status, "injected failure", "server_error")
            if headers:
                response.headers.update(headers)
            return response
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "body is not valid JSON")
        faults.bodies.append(body)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return _error(400, "'messages' must be a non-empty list")
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        temperature = float(body.get("temperature") if body.get("temperature") is not None else 1.0)
        stop = body.get("stop")
        stop = [stop] if isinstance(stop, str) else stop
        out = await run_in_threadpool(
            model.generate, messages, max_tokens, temperature, stop, body.get("seed")
        )
        return JSONResponse(
            {
                "id": "chatcmpl-" + uuid.uuid4().hex[:12],
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model") or model.name,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": out["text"]},
                        "finish_reason": out["finish"],
                    }
                ],
                "usage": {
                    "prompt_tokens": out["prompt_tokens"],
                    "completion_tokens": out["completion_tokens"],
                    "total_tokens": out["prompt_tokens"] + out["completion_tokens"],
                },
            }
        )

    async def models(_: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": model.name, "object": "model"}]})

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> Any:
        try:
            yield
        finally:
            stopping.set()  # release hung requests so the server can stop

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
        ],
        lifespan=lifespan,
    )
    app.state.faults = faults
    app.state.release_hung = stopping
    return app


@contextlib.contextmanager
def serve_in_thread(app: Any, *, port: int = 0, startup_timeout_s: float = 30.0) -> Iterator[str]:
    """Serve ``app`` with uvicorn on 127.0.0.1 in a thread; yields the base URL.

    ``port=0`` picks a free port; pass a port again to bring a server back on the same URL.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2, ws="none")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def dead_url() -> str:
    """A loopback URL nothing listens on (the port was just free)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"
