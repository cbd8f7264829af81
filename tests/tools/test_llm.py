"""The ``llm`` tool against a real small model behind a real OpenAI-compatible HTTP server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest

from protocol import ErrorKind, ToolError, ToolOutput, get_tool_meta
from tests.support.openai_server import Faults, create_app, dead_url, serve_in_thread, shared_chat_model
from tools.llm import ENV_BASE_URL, ENV_MODEL, LlmTool

API_KEY = "sk-test-123"


@pytest.fixture(scope="module")
def endpoint() -> Iterator[tuple[str, Faults]]:
    faults = Faults()
    app = create_app(shared_chat_model(), faults)
    with serve_in_thread(app) as url:
        yield url + "/v1", faults


@pytest.fixture
def faults(endpoint: tuple[str, Faults]) -> Iterator[Faults]:
    endpoint[1].reset()
    yield endpoint[1]
    endpoint[1].reset()


@pytest.fixture
async def llm(endpoint: tuple[str, Faults], faults: Faults) -> AsyncIterator[LlmTool]:
    tool = LlmTool(base_url=endpoint[0], model="smollm2", max_tokens=16, backoff_s=0.01, timeout_s=60)
    await tool.startup()
    yield tool
    await tool.shutdown()


def test_metadata_marks_a_model_tool() -> None:
    meta = get_tool_meta(LlmTool)
    assert (meta.name, meta.kind) == ("llm", "model")


def test_schema_exposes_call_arguments_only() -> None:
    from tool_server.schema import derive_signature

    sig = derive_signature(LlmTool(base_url="http://127.0.0.1:1/v1"), "llm", None)
    props = sig.input_schema["properties"]
    assert set(props) == {"messages", "prompt", "max_tokens", "temperature", "stop", "tools"}
    assert sig.input_schema.get("required", []) == []
    assert "language model" in sig.description


async def test_prompt_gets_a_real_greedy_completion(llm: LlmTool, faults: Faults) -> None:
    out = await llm(prompt="What is the capital of France?", temperature=0.0)
    assert isinstance(out, ToolOutput)
    text = out.content[0]["text"]
    assert "Paris" in text
    assert out.structured["content"] == text
    assert out.structured["model"] == "smollm2"
    usage = out.structured["usage"]
    assert usage["prompt_tokens"] > 5 and 0 < usage["completion_tokens"] <= 16
    assert faults.bodies[-1]["messages"] == [{"role": "user", "content": "What is the capital of France?"}]


async def test_messages_and_limits_are_forwarded(llm: LlmTool, faults: Faults) -> None:
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Write a long story about a dragon."},
    ]
    out = await llm(messages=messages, max_tokens=4, temperature=0.0)
    assert out.structured["finish_reason"] == "length"
    assert out.structured["usage"]["completion_tokens"] == 4
    body = faults.bodies[-1]
    assert body["messages"] == messages and body["max_tokens"] == 4 and body["temperature"] == 0.0


async def test_retries_transient_failures_then_succeeds(llm: LlmTool, faults: Faults) -> None:
    faults.fail_next, faults.fail_status = 2, 503
    out = await llm(prompt="Say hi.", max_tokens=3)
    assert out.structured["usage"]["completion_tokens"] > 0
    assert faults.requests == 3


async def test_rate_limit_honours_retry_after(llm: LlmTool, faults: Faults) -> None:
    faults.fail_next, faults.fail_status, faults.retry_after = 1, 429, 0.2
    loop = asyncio.get_running_loop()
    started = loop.time()
    await llm(prompt="Say hi.", max_tokens=2)
    assert faults.requests == 2
    assert loop.time() - started >= 0.2  # waited at least what the server asked for


async def test_client_errors_are_not_retried(llm: LlmTool, faults: Faults) -> None:
    faults.fail_next, faults.fail_status = 1, 400
    with pytest.raises(ToolError) as err:
        await llm(prompt="Say hi.")
    assert err.value.kind == ErrorKind.TOOL_ERROR
    assert "HTTP 400" in err.value.message and "injected failure" in err.value.message
    assert faults.requests == 1


async def test_retries_exhausted_is_unavailable(llm: LlmTool, faults: Faults) -> None:
    faults.fail_next = 10
    with pytest.raises(ToolError) as err:
        await llm(prompt="Say hi.")
    assert err.value.kind == ErrorKind.UNAVAILABLE
    assert "after 3 attempt(s)" in err.value.message and "HTTP 503" in err.value.message
    assert faults.requests == 3


async def test_dead_endpoint_is_unavailable_and_names_the_url() -> None:
    url = dead_url() + "/v1"
    tool = LlmTool(base_url=url, model="m", max_retries=1, backoff_s=0.01)
    try:
        with pytest.raises(ToolError) as err:
            await tool(prompt="hello")
    finally:
        await tool.shutdown()
    assert err.value.kind == ErrorKind.UNAVAILABLE
    assert f"{url}/chat/completions" in err.value.message
    assert "ConnectError" in err.value.message


async def test_hanging_endpoint_times_out_as_unavailable(
    endpoint: tuple[str, Faults], faults: Faults
) -> None:
    faults.hang = True
    tool = LlmTool(base_url=endpoint[0], model="m", timeout_s=0.3, max_retries=1, backoff_s=0.01)
    try:
        with pytest.raises(ToolError) as err:
            await tool(prompt="hello")
    finally:
        await tool.shutdown()
    assert err.value.kind == ErrorKind.UNAVAILABLE
    assert "no answer within 0.3 s" in err.value.message
    assert faults.requests == 2


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({}, "exactly one of 'prompt'"),
        ({"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, "exactly one of 'prompt'"),
        ({"messages": []}, "non-empty list"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role must be one of"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content must be a string"),
        ({"prompt": "a", "max_tokens": 0}, "max_tokens must be > 0"),
    ],
)
async def test_bad_arguments_say_what_is_wrong(
    llm: LlmTool, faults: Faults, kwargs: dict, needle: str
) -> None:
    with pytest.raises(ToolError) as err:
        await llm(**kwargs)
    assert err.value.kind == ErrorKind.INVALID_ARGUMENTS
    assert needle in err.value.message
    assert faults.requests == 0


async def test_unconfigured_tool_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_BASE_URL, raising=False)
    tool = LlmTool()
    with pytest.raises(ToolError) as err:
        await tool(prompt="hello")
    assert err.value.kind == ErrorKind.UNAVAILABLE
    assert ENV_BASE_URL in err.value.message


async def test_environment_configures_endpoint_and_model_is_discovered(
    endpoint: tuple[str, Faults], faults: Faults, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_BASE_URL, endpoint[0] + "/")
    monkeypatch.delenv(ENV_MODEL, raising=False)
    tool = LlmTool(max_tokens=2)
    try:
        out = await tool(prompt="Hi")
    finally:
        await tool.shutdown()
    assert tool.base_url == endpoint[0]
    assert faults.bodies[-1]["model"] == "smollm2-135m-instruct"  # from GET /models
    assert out.structured["model"] == "smollm2-135m-instruct"


async def test_api_key_is_sent_and_a_wrong_one_is_reported() -> None:
    faults = Faults()
    with serve_in_thread(create_app(shared_chat_model(), faults, api_key=API_KEY)) as url:
        good = LlmTool(base_url=url + "/v1", model="m", api_key=API_KEY, max_tokens=2)
        bad = LlmTool(base_url=url + "/v1", model="m", api_key="wrong", max_tokens=2)
        try:
            out = await good(prompt="Hi")
            with pytest.raises(ToolError) as err:
                await bad(prompt="Hi")
        finally:
            await good.shutdown()
            await bad.shutdown()
    assert out.structured["usage"]["completion_tokens"] > 0
    assert err.value.kind == ErrorKind.UNAVAILABLE and "credentials" in err.value.message
    assert faults.requests == 2  # a credential error is not retried


async def test_concurrency_is_bounded(endpoint: tuple[str, Faults], faults: Faults) -> None:
    tool = LlmTool(base_url=endpoint[0], model="m", max_concurrency=2, max_tokens=2)
    try:
        outs = await asyncio.gather(*(tool(prompt=f"Count to {i}.") for i in range(5)))
    finally:
        await tool.shutdown()
    assert len(outs) == 5 and all(o.structured["usage"]["completion_tokens"] > 0 for o in outs)
    assert faults.requests == 5
    assert faults.max_in_flight == 2


def test_bad_configuration_is_rejected() -> None:
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        LlmTool(base_url="http://x/v1", timeout_s=0)
    with pytest.raises(ValueError, match="max_retries"):
        LlmTool(base_url="http://x/v1", max_retries=-1)
